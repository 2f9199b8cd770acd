"""Every metric after a scripted run on the memory adapters: names, labels and values, through
the real OpenTelemetry meter, its export into snapshots and the Prometheus text the api serves.

The run: ``train`` (vision, 2 × a3-highgpu-8g) is admitted in zone a, where Google has no
capacity (a stockout), races zone b and runs there (a failover); ``wait`` (speech, 4 VMs, zone b
only) waits behind it with an ETA, is admitted early when ``train`` is released after 30 min,
and runs; ``late`` times out."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData
from prometheus_client.parser import text_string_to_metric_families

from opendws.adapters.logs import CloudLoggingFormatter, Trace, trace_of, traced
from opendws.adapters.telemetry import (
    MemoryMetricSnapshots,
    OtelMetrics,
    SnapshotExporter,
    combined,
    prometheus_text,
)
from opendws.domain.states import RequestState
from opendws.ports import Changes, Configuration, Price, RequestRecord, StatusEvent, Watermark
from opendws.ports import telemetry as m
from opendws.ports.telemetry import METRICS, MetricSnapshot, labels_of_mapping
from opendws.service.telemetry import cloud_error_code, log_cloud_call, log_event
from tests.builders import A3, H100, NOW, flex, pool, quota, tenant
from tests.world import World, memory_world, submit

S = RequestState
ZA, ZB = "us-central1-a", "us-central1-b"
PA, PB = pool(zone=ZA, capacity=4), pool(zone=ZB, capacity=4)
LATENCY = timedelta(seconds=20)


def _world() -> tuple[World, MemoryMetricSnapshots, OtelMetrics]:
    snapshots = MemoryMetricSnapshots()
    metrics = OtelMetrics(
        service="test", instance="test-1", exporters=[SnapshotExporter(snapshots, "test-1")],
        min_interval=timedelta(0),
    )  # fmt: skip
    configuration = Configuration(
        pools=(PA, PB),
        tenants=(
            tenant("vision", quota(H100, 32, 16), cohort="research"),
            tenant("speech", quota(H100, 32)),
        ),
        prices=(Price(accelerator=H100, per_hour=10.0, flex_factor=0.5),),
    )
    world, cloud = memory_world((), (), configuration=configuration, timers=True, latency=LATENCY)
    world.metrics = metrics
    cloud.set_stock(ZA, A3, 0)
    cloud.set_stock(ZB, A3, 4)
    return world, snapshots, metrics


def _settle(world: World) -> None:
    world.clock.advance(LATENCY)
    world.run()


@pytest.fixture(scope="module")
def scripted() -> Iterator[MetricSnapshot]:
    world, snapshots, metrics = _world()
    submit(world.store, flex("train", tenant="vision", vm_count=2, locations=(ZA, ZB)))
    world.run()  # admitted in a
    _settle(world)  # a is short: b joins the race
    _settle(world)  # b serves it
    assert (world.state("train"), world.record("train").pool) == (S.ACTIVE, PB.pool_id)
    now = world.clock.now()
    submit(world.store, flex("wait", tenant="speech", vm_count=4, locations=(ZB,),
                             submitted_at=now, max_wait=timedelta(hours=3)))  # fmt: skip
    submit(world.store, flex("late", tenant="speech", vm_count=4, locations=(ZB,),
                             submitted_at=now, max_wait=timedelta(minutes=10)))  # fmt: skip
    world.run()
    waiting = world.record("wait")
    assert (waiting.state, waiting.reason) == (S.PENDING, "NO_CAPACITY_UNTIL")
    assert waiting.first_eta is not None
    metrics.flush()
    snapshots_while_waiting = snapshots.all()
    world.clock.advance(timedelta(minutes=30))
    assert world.ending().release("train", "vision").state is S.RELEASED
    world.run()  # wait admitted; late timed out
    _settle(world)
    assert world.state("wait") is S.ACTIVE
    assert world.state("late") is S.TIMED_OUT
    metrics.flush()
    (snapshot,) = snapshots.all()
    yield snapshot
    assert snapshots_while_waiting  # exported at the first flush too


def value(snapshot: MetricSnapshot, metric: m.Metric, **labels: str) -> float:
    return combined([snapshot])[0][metric.name][labels_of_mapping(labels)]


def buckets(snapshot: MetricSnapshot, metric: m.Metric, **labels: str) -> m.Buckets:
    return combined([snapshot])[1][metric.name][labels_of_mapping(labels)]


def test_admissions_count_per_tenant_and_pool(scripted: MetricSnapshot) -> None:
    assert value(scripted, m.ADMITTED, tenant="vision", pool=PA.pool_id) == 1
    assert value(scripted, m.ADMITTED, tenant="speech", pool=PB.pool_id) == 1


def test_admission_wait_is_measured_from_publication(scripted: MetricSnapshot) -> None:
    assert buckets(scripted, m.ADMISSION_WAIT, tenant="vision", pool=PA.pool_id).sum == 0
    waited = buckets(scripted, m.ADMISSION_WAIT, tenant="speech", pool=PB.pool_id)
    assert (waited.count, waited.sum) == (1, 1800.0)  # released 30 min after it arrived


def test_admission_to_active_is_googles_queue_per_pool(scripted: MetricSnapshot) -> None:
    served = buckets(scripted, m.READY_WAIT, pool=PB.pool_id)
    # train: admitted, then 2 × latency (a stockout in a, then b); wait: one latency.
    assert (served.count, served.sum) == (2, 60.0)
    assert sum(served.counts) == served.count


def test_a_stockout_is_counted_once_per_shortage_and_the_race_won_elsewhere_is_a_failover(
    scripted: MetricSnapshot,
) -> None:
    assert value(scripted, m.STOCKOUTS, pool=PA.pool_id) == 1
    labels = {"tenant": "vision", "from_pool": PA.pool_id, "to_pool": PB.pool_id}
    assert value(scripted, m.FAILOVERS, **labels) == 1


def test_eta_error_against_the_first_eta(scripted: MetricSnapshot) -> None:
    """wait was told 01:01 (train's end, on the whole minute) and admitted at 00:30:40."""
    early = buckets(scripted, m.ETA_ERROR, pool=PB.pool_id, direction="early")
    assert (early.count, early.sum) == (1, 1820.0)


def test_time_outs_and_ends(scripted: MetricSnapshot) -> None:
    assert value(scripted, m.TIMED_OUT, tenant="speech") == 1
    assert value(scripted, m.ENDED, tenant="speech", state="TIMED_OUT") == 1
    assert value(scripted, m.ENDED, tenant="vision", state="RELEASED") == 1


def test_accelerator_hours_and_cost_per_tenant(scripted: MetricSnapshot) -> None:
    """16 H100s for 30 min = 8 accelerator-hours; at 10 an hour, flex at half price: 40."""
    assert value(scripted, m.ACCELERATOR_HOURS, tenant="vision", accelerator=H100) == 8.0
    assert value(scripted, m.COST, tenant="vision", accelerator=H100) == 40.0


def test_gauges_show_the_state_after_the_last_pass(scripted: MetricSnapshot) -> None:
    # Nothing pends any more: the series set while wait pended reads 0, not its last 1.
    pending = {"tenant": "speech", "pool": PB.pool_id, "reason": "NO_CAPACITY_UNTIL"}
    assert value(scripted, m.PENDING, **pending) == 0
    assert value(scripted, m.ACTIVE, tenant="speech", pool=PB.pool_id, state="ACTIVE") == 1
    assert value(scripted, m.ACTIVE, tenant="vision", pool=PB.pool_id, state="ACTIVE") == 0
    held = {"tenant": "speech", "cohort": "", "accelerator": H100}
    assert value(scripted, m.QUOTA_USAGE, **held) == 32
    research = {"tenant": "vision", "cohort": "research", "accelerator": H100}
    assert value(scripted, m.QUOTA_NOMINAL, **research) == 32
    assert value(scripted, m.QUOTA_BORROWING, **research) == 16
    assert value(scripted, m.COHORT_USAGE, cohort="research", accelerator=H100) == 0


def test_every_configured_quota_has_a_usage_series_from_the_first_pass() -> None:
    """An idle tenant's usage reads 0, not absent (Kueue reports every resource of a cluster
    queue), so a dashboard's usage / nominal has a value for every quota."""
    world, snapshots, metrics = _world()
    world.run()
    metrics.flush()
    (snapshot,) = snapshots.all()
    assert value(snapshot, m.QUOTA_USAGE, tenant="vision", cohort="research", accelerator=H100) == 0
    assert value(snapshot, m.QUOTA_USAGE, tenant="speech", cohort="", accelerator=H100) == 0
    assert value(snapshot, m.COHORT_USAGE, cohort="research", accelerator=H100) == 0


def test_passes_are_counted_and_timed(scripted: MetricSnapshot) -> None:
    passes = value(scripted, m.PASSES, outcome="COMPLETED")
    assert passes == 6
    assert buckets(scripted, m.PASS_DURATION, outcome="COMPLETED").count == passes


def test_pending_gauges_while_waiting() -> None:
    world, snapshots, metrics = _world()
    cloud_b_only = flex("big", tenant="speech", vm_count=4, locations=(ZB,))
    submit(world.store, flex("first", tenant="vision", vm_count=2, locations=(ZB,)))
    submit(world.store, cloud_b_only)
    world.run()
    world.clock.advance(timedelta(minutes=5))
    world.run()
    metrics.flush()
    (snapshot,) = snapshots.all()
    pending = {"tenant": "speech", "pool": PB.pool_id, "reason": "NO_CAPACITY_UNTIL"}
    assert value(snapshot, m.PENDING, **pending) == 1
    assert value(snapshot, m.LONGEST_WAIT, tenant="speech", pool=PB.pool_id) == 300


def test_the_prometheus_text_has_every_metric_with_its_kind() -> None:
    """Scraped as Prometheus parses it: one family per catalog entry, of its kind."""
    world, snapshots, metrics = _world()
    submit(world.store, flex("train", tenant="vision", vm_count=2, locations=(ZB,)))
    world.run()
    _settle(world)
    metrics.flush()
    families = {f.name: f for f in text_string_to_metric_families(prometheus_text(snapshots.all()))}
    for metric in METRICS:
        name = metric.name.removesuffix("_total") if metric.kind is m.Kind.COUNTER else metric.name
        assert families[name].type == metric.kind.value, metric.name
    admitted = families["opendws_admitted_requests"].samples
    assert [(s.labels, s.value) for s in admitted] == [
        ({"tenant": "vision", "pool": PB.pool_id}, 1.0)
    ]


def test_counters_and_histograms_add_up_over_processes_and_gauges_come_from_the_newest() -> None:
    snapshots = MemoryMetricSnapshots()
    first = OtelMetrics(service="a", instance="a", exporters=[SnapshotExporter(snapshots, "a")],
                        min_interval=timedelta(0))  # fmt: skip
    second = OtelMetrics(service="b", instance="b", exporters=[SnapshotExporter(snapshots, "b")],
                         min_interval=timedelta(0))  # fmt: skip
    labels = {"tenant": "t", "pool": "p"}
    first.add(m.ADMITTED, 2, labels)
    first.gauge(m.PENDING, [({"tenant": "t", "pool": "p", "reason": "QUOTA"}, 5)])
    first.observe(m.ADMISSION_WAIT, 3, labels)
    first.flush()
    second.add(m.ADMITTED, 1, labels)
    second.gauge(m.PENDING, [({"tenant": "t", "pool": "p", "reason": "QUOTA"}, 7)])
    second.observe(m.ADMISSION_WAIT, 5, labels)
    second.flush()
    values, histograms = combined(snapshots.all())
    key = labels_of_mapping(labels)
    assert values[m.ADMITTED.name][key] == 3
    assert values[m.PENDING.name] == {labels_of_mapping({**labels, "reason": "QUOTA"}): 7}
    assert (histograms[m.ADMISSION_WAIT.name][key].count,
            histograms[m.ADMISSION_WAIT.name][key].sum) == (2, 8)  # fmt: skip


def test_wrong_labels_and_negative_counts_are_refused_with_the_metric_named() -> None:
    metrics = OtelMetrics(service="t", instance="t")
    with pytest.raises(ValueError, match="opendws_admitted_requests_total takes the labels"):
        metrics.add(m.ADMITTED, 1, {"tenant": "t"})
    with pytest.raises(ValueError, match="is a counter"):
        metrics.add(m.ADMITTED, -1, {"tenant": "t", "pool": "p"})


def test_a_process_that_measured_nothing_writes_no_snapshot() -> None:
    snapshots = MemoryMetricSnapshots()
    OtelMetrics(service="api", instance="api", exporters=[SnapshotExporter(snapshots, "api")],
                min_interval=timedelta(0)).flush()  # fmt: skip
    assert snapshots.all() == []


# Logs ---------------------------------------------------------------------------------------


def _lines(run: object) -> list[dict[str, object]]:
    """The JSON lines the structured formatter writes while ``run()`` runs."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(CloudLoggingFormatter("demo-opendws"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        run()  # type: ignore[operator]
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_one_json_line_per_state_change_in_cloud_loggings_format() -> None:
    """Cloud Logging's structured JSON (https://cloud.google.com/logging/docs/structured-
    logging): ``severity`` and ``message`` become the entry's own, ``logging.googleapis.com/
    trace`` (``projects/P/traces/ID``) ties it to its trace; the rest is the payload."""
    from opendws.service.telemetry import LoggedEvents

    world, _, _ = _world()
    world.bus = LoggedEvents(world.bus)  # type: ignore[assignment]  # as bootstrap wires it
    submit(world.store, flex("train", tenant="vision", vm_count=2, locations=(ZB,)))

    def run() -> None:
        with traced(Trace("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", True)):
            world.run()
            _settle(world)

    lines = [line for line in _lines(run) if line["logger"] == "opendws.events"]
    assert [(line["previous_state"], line["state"], line["reason"]) for line in lines] == [
        ("PENDING", "PROVISIONING", "ADMITTED"),
        ("PROVISIONING", "ACTIVE", "READY"),
    ]
    first = lines[0]
    assert first["severity"] == "INFO"
    assert first["message"] == "train: PENDING → PROVISIONING (ADMITTED)"
    assert (first["request_id"], first["tenant"], first["pool"]) == ("train", "vision", PB.pool_id)
    assert first["logging.googleapis.com/trace"] == (
        "projects/demo-opendws/traces/4bf92f3577b34da6a3ce929d0e0e4736"
    )
    assert first["logging.googleapis.com/spanId"] == "00f067aa0ba902b7"
    assert first["logging.googleapis.com/trace_sampled"] is True


def test_a_requests_first_event_is_logged_as_new_and_a_revision_as_revised() -> None:
    """A first event has no previous state: it is the request's arrival (or its refusal at
    intake), not a revision of a state it was in."""
    first = StatusEvent(request_id="train", tenant="vision", state=S.PENDING,
                        previous_state=None, at=NOW, message="accepted")  # fmt: skip
    later = StatusEvent(request_id="train", tenant="vision", state=S.PENDING,
                        previous_state=S.PENDING, at=NOW, reason="NO_CAPACITY_UNTIL")  # fmt: skip
    refused = StatusEvent(request_id="bad", tenant="vision", state=S.REJECTED,
                          previous_state=None, at=NOW, reason="INVALID")  # fmt: skip

    def run() -> None:
        for event in (first, later, refused):
            log_event(event)

    lines = _lines(run)
    assert [(line["message"], line["severity"]) for line in lines] == [
        ("train: new → PENDING", "INFO"),
        ("train: PENDING (revised) (NO_CAPACITY_UNTIL)", "INFO"),
        ("bad: new → REJECTED (INVALID)", "WARNING"),
    ]


def test_a_cloud_call_is_logged_with_the_clouds_error_code() -> None:
    """google-api-core's exceptions carry the HTTP status (``code``) and the gRPC status
    (``grpc_status_code``) of the failed call (google/api_core/exceptions.py)."""
    from google.api_core.exceptions import ServiceUnavailable

    error = ServiceUnavailable("the zone is busy")

    def run() -> None:
        log_cloud_call("provision", "odws-train-1", PA.pool_id, request_id="train",
                       tenant="vision", error=error)  # fmt: skip

    (line,) = _lines(run)
    assert line["severity"] == "WARNING"
    assert (line["request_id"], line["tenant"], line["pool"]) == ("train", "vision", PA.pool_id)
    assert line["error_code"] == cloud_error_code(error) == "UNAVAILABLE"
    assert "logging.googleapis.com/trace" not in line  # no trace outside an invocation


def test_the_trace_is_read_from_traceparent_or_x_cloud_trace_context() -> None:
    """W3C Trace Context's ``traceparent`` (version-traceid-parentid-flags), else
    ``X-Cloud-Trace-Context: TRACE_ID/SPAN_ID;o=1`` with a decimal span id, which Cloud
    Logging wants as 16 hex digits (cloud.google.com/trace/docs/trace-context)."""
    parent = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    assert trace_of(parent) == Trace("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", True)
    cloud = {"X-Cloud-Trace-Context": "105445aa7843bc8bf206b12000100000/1;o=1"}
    assert trace_of(cloud) == Trace("105445aa7843bc8bf206b12000100000", f"{1:016x}", True)
    assert trace_of({"traceparent": "garbage"}) is None
    assert trace_of({}) is None


def test_documents_read_per_pass_where_the_store_counts_them() -> None:
    """Firestore's stores count the documents they read (billed per document); a pass
    records how many it read, as the difference of the count around it."""
    from opendws.adapters.memory import MemoryRequestStore

    class CountingStore(MemoryRequestStore):
        """The memory store, counting as Firestore's does: one per record a query returns."""

        def __init__(self) -> None:
            super().__init__()
            self.documents_read = 0

        def in_states(self, *states: RequestState) -> list[RequestRecord]:
            found = super().in_states(*states)
            self.documents_read += len(found)
            return found

        def changes(self, since: Watermark | None) -> Changes:
            found = super().changes(since)
            self.documents_read += len(found.records)
            return found

    world, snapshots, metrics = _world()
    store = CountingStore()
    world.store = store
    for index in range(3):
        submit(world.store, flex(f"r{index}", tenant="vision", locations=(ZB,)))
    world.run()  # a cold reconciler reads the three
    world.run()  # then only what changed: nothing
    metrics.flush()
    (snapshot,) = snapshots.all()
    reads = buckets(snapshot, m.PASS_READS)
    assert reads.count == 2
    assert reads.sum == store.documents_read >= 3


# Wiring -------------------------------------------------------------------------------------


def _container(snapshots: MemoryMetricSnapshots, exports: tuple[str, ...] = ("snapshots",)):  # type: ignore[no-untyped-def]
    from opendws.adapters.memory import (
        MemoryConfigStore,
        MemoryEventBus,
        MemoryNudger,
        MemoryRequestPublisher,
        MemoryRequestStore,
    )
    from opendws.bootstrap import Adapters, Container, Settings
    from opendws.clock import ManualClock
    from tests.builders import NOW

    adapters = Adapters(
        store=MemoryRequestStore(), config=MemoryConfigStore(Configuration()),
        events=MemoryEventBus(), nudger=MemoryNudger(), publisher=MemoryRequestPublisher(),
        clock=ManualClock(NOW), snapshots=snapshots,
    )  # fmt: skip
    from opendws.service.api import key_digest

    keys = {key_digest("admin-key"): "admin", key_digest("vision-key"): "vision"}
    settings = Settings(project="p", metrics_export=exports, api_keys=keys)
    return Container(settings, adapters=adapters)


def test_the_api_serves_every_process_and_forgets_one_silent_for_a_day() -> None:
    from opendws.bootstrap import METRICS_RETENTION
    from tests.builders import NOW

    snapshots = MemoryMetricSnapshots()
    labels = labels_of_mapping({"tenant": "vision", "pool": "p"})
    for instance, age, admitted in (("gone", METRICS_RETENTION + timedelta(minutes=1), 5.0),
                                    ("live", timedelta(minutes=1), 2.0)):  # fmt: skip
        snapshots.put(MetricSnapshot(
            instance=instance, at=NOW - age, values={m.ADMITTED.name: {labels: admitted}},
        ))  # fmt: skip
    container = _container(snapshots)
    assert container.api.handle("GET", "/metrics", {"Authorization": "Bearer nobody"}).status == 401
    as_tenant = container.api.handle("GET", "/metrics", {"Authorization": "Bearer vision-key"})
    assert as_tenant.status == 403
    answer = container.api.handle("GET", "/metrics", {"Authorization": "Bearer admin-key"})
    assert (answer.status, answer.content_type) == (200, "text/plain; version=0.0.4; charset=utf-8")
    assert isinstance(answer.body, str)
    assert 'opendws_admitted_requests_total{pool="p",tenant="vision"} 2.0' in answer.body
    assert [s.instance for s in snapshots.all()] == ["live"]


def test_exports_of_a_process_are_spaced_as_cloud_monitoring_requires() -> None:
    """Cloud Monitoring requires the end times of points written to one time series to be at
    least 10 s apart (cloud.google.com/monitoring/quotas, "Rate at which data can be written
    to a single time series"). Each invocation's end asks for an export and the periodic
    reader asks every minute; each exporter sends at most every 15 s, whoever asks."""
    from opendws.adapters.telemetry import MIN_INTERVAL, SpacedExporter

    assert timedelta(seconds=10) < MIN_INTERVAL
    snapshots = MemoryMetricSnapshots()
    metrics = _container(snapshots).metrics
    metrics.add(m.ADMITTED, 1, {"tenant": "t", "pool": "p"})
    metrics.flush()
    (first,) = snapshots.all()
    metrics.add(m.ADMITTED, 1, {"tenant": "t", "pool": "p"})
    metrics.flush()  # a second invocation ending at once: not exported again yet
    assert snapshots.all() == [first]

    class Counting(SnapshotExporter):
        sent = 0

        def export(self, *args: object, **kwargs: object) -> MetricExportResult:
            Counting.sent += 1
            return MetricExportResult.SUCCESS

    spaced = SpacedExporter(Counting(snapshots, "x"), MIN_INTERVAL)
    data = MetricsData(resource_metrics=[])
    assert spaced.export(data) is spaced.export(data) is MetricExportResult.SUCCESS
    assert Counting.sent == 1  # the second ask, from whichever reader, was skipped


def test_exports_are_chosen_by_the_settings() -> None:
    from opendws.bootstrap import Settings

    assert Settings.from_environment({}).metrics_export == ("snapshots",)
    assert Settings.from_environment({"OPENDWS_METRICS_EXPORT": "none"}).metrics_export == ()
    with pytest.raises(ValueError, match="metrics export prometheus is not one of"):
        Settings.from_environment({"OPENDWS_METRICS_EXPORT": "snapshots,prometheus"})
    snapshots = MemoryMetricSnapshots()
    nowhere = _container(snapshots, exports=()).metrics
    nowhere.add(m.ADMITTED, 1, {"tenant": "t", "pool": "p"})
    nowhere.flush()
    assert snapshots.all() == []
