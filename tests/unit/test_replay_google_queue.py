"""The replay behind Google's queue: each admitted order is served after a wait drawn from an
assumed distribution (Google publishes none: "the MIG schedules Flex-start VM creation as soon
as resources are available", cloud.google.com/compute/docs/instance-groups/
about-resize-requests-mig), so a job's capacity runs after its admission, and the replay can
measure ``ready_eta`` against it."""

from __future__ import annotations

import statistics
from datetime import timedelta

import pytest

from opendws.adapters.memory import MemoryCapacityProvider
from opendws.clock import ManualClock
from opendws.ports import Order, order_name
from opendws.replay.baselines import Announced, JobOutcome
from opendws.replay.google_queue import GoogleQueue
from opendws.replay.metrics import broken_promises, eta_accuracy, ready_accuracy
from opendws.replay.runner import replay_opendws
from opendws.replay.traces import TRACE_EPOCH, PoolsFile, PoolSpec, TraceJob
from tests.builders import A3, NOW, ZONE, flex, pool

T0 = TRACE_EPOCH
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)


def test_the_waits_are_log_normal_with_the_median_and_p90_given() -> None:
    queue = GoogleQueue(median=10 * MINUTE, p90=HOUR)
    waits = sorted(queue.wait(f"order-{index}").total_seconds() for index in range(4000))
    assert statistics.median(waits) == pytest.approx(600, rel=0.06)
    assert waits[int(0.9 * len(waits))] == pytest.approx(3600, rel=0.08)
    assert min(waits) >= 1


def test_an_orders_wait_follows_from_its_name_and_the_seed_alone() -> None:
    queue = GoogleQueue(median=10 * MINUTE, p90=HOUR)
    assert queue.wait("a-1") == GoogleQueue(median=10 * MINUTE, p90=HOUR).wait("a-1")
    seeded = GoogleQueue(median=10 * MINUTE, p90=HOUR, seed=1)
    assert [queue.wait(f"o{i}") for i in range(20)] != [seeded.wait(f"o{i}") for i in range(20)]
    constant = GoogleQueue(median=7 * MINUTE, p90=7 * MINUTE)
    assert {constant.wait(f"o{i}") for i in range(50)} == {7 * MINUTE}


@pytest.mark.parametrize(
    ("median", "p90", "message"),
    [
        (timedelta(0), HOUR, "median wait must be positive"),
        (HOUR, MINUTE, "90th percentile .* is below the median"),
    ],
)
def test_a_queue_that_cannot_be_is_refused(median: timedelta, p90: timedelta, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GoogleQueue(median=median, p90=p90)


def test_the_simulated_cloud_serves_each_order_after_its_own_latency() -> None:
    """latency_of replaces the one latency per order; next_eligible says when the next order
    still provisioning is served (nothing else tells a replay to look then)."""
    clock = ManualClock(NOW)
    waits = {"slow": 30 * MINUTE, "quick": 5 * MINUTE}
    by_order = {order_name(name, 1): wait for name, wait in waits.items()}
    cloud = MemoryCapacityProvider(clock, latency_of=by_order.__getitem__)
    cloud.set_stock(ZONE, A3, 8)
    assert cloud.next_eligible() is None
    target = pool(capacity=8)
    for name in ("slow", "quick"):
        cloud.provision(Order(request=flex(name, vm_count=1), pool=target, attempt=1))
    names = {name: order_name(name, 1) for name in waits}
    assert cloud.next_eligible() == NOW + 5 * MINUTE
    clock.advance(5 * MINUTE)
    seen = cloud.observe([target])
    assert seen[names["quick"]].phase.value == "READY"
    assert seen[names["slow"]].phase.value == "CREATING"
    assert cloud.next_eligible() == NOW + 30 * MINUTE
    clock.advance(25 * MINUTE)
    assert cloud.observe([target])[names["slow"]].phase.value == "READY"
    assert cloud.next_eligible() is None


def _job(job_id: str, at: timedelta, gpus: int, runs: timedelta) -> TraceJob:
    return TraceJob(job_id=job_id, submitted_at=T0 + at, gpus=gpus, duration=runs, tenant="t")


def test_behind_googles_queue_a_job_runs_once_served_and_ready_eta_is_measured() -> None:
    """Every order waits 10 minutes in Google's queue. Four whole-pool jobs of an hour each,
    submitted together, go one after another: each is admitted when the one before ends and
    runs from 10 minutes later (0:10–1:10, 1:20–2:20, 2:30–3:30, 3:40–4:40). The pool learns
    its wait from three served orders, so only the last (told once the third runs) hears a
    ready_eta: its eta 3:30 (the third's end) plus 10 minutes — exactly when it ran."""
    jobs = [_job(name, timedelta(0), 4, HOUR) for name in "abcd"]
    on = PoolsFile(pools=(PoolSpec(name="p", capacity=4),), tenants=())
    queue = GoogleQueue(median=10 * MINUTE, p90=10 * MINUTE)
    outcomes = replay_opendws(jobs, on, google_queue=queue)
    order = sorted(outcomes, key=lambda o: o.admitted_at or T0)
    step = HOUR + 10 * MINUTE
    assert [o.admitted_at for o in order] == [T0 + index * step for index in range(4)]
    assert [o.started_at for o in order] == [T0 + index * step + 10 * MINUTE for index in range(4)]
    told = [a for a in order[-1].etas if a.ready_eta is not None]
    assert [(a.eta, a.ready_eta) for a in told][:1] == [
        (T0 + 3 * step, T0 + 3 * step + 10 * MINUTE)
    ]
    assert not any(a.ready_eta for o in order[:-1] for a in o.etas)
    ready = ready_accuracy(outcomes)
    assert (ready.jobs, ready.ready.kept_share, ready.ready.median_error_s) == (1, 1.0, 0.0)
    assert ready.eta_alone.median_error_s == 600.0  # eta alone is 10 minutes early
    # An ETA promises admission. Told before the pool had three samples, they assumed no
    # wait in Google's queue and moved later as Google took its 10 minutes; the last each
    # job was told is when it was admitted.
    assert [o.etas[-1].eta for o in order[1:]] == [o.admitted_at for o in order[1:]]
    assert eta_accuracy(outcomes).moved_later > 0


def test_ready_accuracy_counts_the_first_announcement_that_carried_a_ready_eta() -> None:
    job = _job("j", timedelta(0), 1, HOUR)
    etas = (
        Announced(at=T0, eta=T0 + HOUR, reason="NO_CAPACITY_UNTIL"),
        Announced(
            at=T0 + MINUTE, eta=T0 + HOUR, reason="NO_CAPACITY_UNTIL",
            ready_eta=T0 + HOUR + 5 * MINUTE, ready_eta_p90=T0 + HOUR + 20 * MINUTE,
        ),
        Announced(
            at=T0 + 2 * MINUTE, eta=T0 + 2 * HOUR, reason="NO_CAPACITY_UNTIL",
            ready_eta=T0 + 2 * HOUR, ready_eta_p90=T0 + 2 * HOUR,
        ),
    )  # fmt: skip
    outcome = JobOutcome(
        job=job, started_at=T0 + HOUR + 10 * MINUTE, pool="p", etas=etas, admitted_at=T0 + HOUR
    )
    ready = ready_accuracy([outcome])
    assert ready.jobs == 1
    assert (ready.ready.kept_share, ready.ready.median_error_s) == (0.0, 300.0)
    assert (ready.ready_p90.kept_share, ready.ready_p90.median_error_s) == (1.0, -600.0)
    assert ready.eta_alone.median_error_s == 600.0
    assert ready.to_json()["p90_kept_share"] == 1.0
    # The ETA is judged against the admission, not the run.
    assert eta_accuracy([outcome]).kept_share == 1.0


def test_promises_moved_later_are_counted_by_the_cause_their_event_named() -> None:
    """A promise is an ETA told less than the horizon ahead; a later one moving it later is
    counted by whether its event named Google's queue. An estimate beyond the horizon moving
    later is no broken promise; the moves are also counted by reason and cause."""
    job = _job("j", timedelta(0), 1, HOUR)
    etas = (
        Announced(at=T0, eta=T0 + 5 * HOUR, reason="NO_CAPACITY_UNTIL"),  # an estimate
        Announced(at=T0 + MINUTE, eta=T0 + 6 * HOUR, reason="NO_CAPACITY_UNTIL"),
        Announced(at=T0 + 5 * HOUR, eta=T0 + 6 * HOUR, reason="NO_CAPACITY_UNTIL"),
        Announced(
            at=T0 + 5 * HOUR + MINUTE, eta=T0 + 6 * HOUR + 10 * MINUTE,
            reason="NO_CAPACITY_UNTIL", google_late=True,
        ),
        Announced(at=T0 + 5 * HOUR + 2 * MINUTE, eta=T0 + 7 * HOUR, reason="QUOTA"),
    )  # fmt: skip
    outcome = JobOutcome(job=job, started_at=T0 + 7 * HOUR, pool="p", etas=etas)
    assert broken_promises([outcome], 2 * HOUR) == {"google_late": 1, "none named": 1}
    assert eta_accuracy([outcome]).moved_later_by_reason == {
        "NO_CAPACITY_UNTIL": 1, "NO_CAPACITY_UNTIL (Google late)": 1, "QUOTA": 1,
    }  # fmt: skip
