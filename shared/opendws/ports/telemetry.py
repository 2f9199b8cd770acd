"""Metrics: the catalog of what opendws measures, the port the services record through, and
the snapshots that carry each process's metrics to the ``/metrics`` endpoint.

Every metric is defined once, in :data:`METRICS`, with its kind, unit, labels and (for a
histogram) bucket bounds. Names follow Kueue's own where the meaning is the same
(kubernetes-sigs/kueue ``pkg/metrics/metrics.go``: ``pending_workloads``,
``admitted_workloads_total``, ``admission_wait_time_seconds``,
``admitted_until_ready_wait_time_seconds``, ``admission_attempts_total``,
``admission_attempt_duration_seconds``, ``cluster_queue_resource_usage``,
``cluster_queue_nominal_quota``, ``cluster_queue_borrowing_limit``), with ``opendws_`` for
``kueue_``, a request for a workload and a tenant for a cluster queue.

Each function process records into its own OpenTelemetry meter (``opendws.adapters.
telemetry``). Its cumulative values are exported at the end of each invocation: to Cloud
Monitoring in Google Cloud, and as a :class:`MetricSnapshot` into :class:`MetricSnapshots`
(Firestore, or memory), from which the api function serves every process's metrics in
Prometheus text. Processes differ in what they record: the reconciler records passes, admissions
and gauges; the end service (timer, intake's release and cancel) records usage as it ends runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol


class Kind(StrEnum):
    COUNTER = "counter"
    HISTOGRAM = "histogram"
    GAUGE = "gauge"


def _exponential(first: float, factor: float, count: int) -> tuple[float, ...]:
    return tuple(first * factor**i for i in range(count))


# 1 s … 2^20 s (12 days): a flex request waits up to 7 days (Kueue: 1 s … 2^13 s).
WAIT_BUCKETS = _exponential(1.0, 2.0, 21)
# 0, then 1 min … 2^12 min (about 2.8 days): how far an admission was from its first ETA.
ETA_ERROR_BUCKETS = (0.0, *_exponential(60.0, 2.0, 13))
# 1 ms … 2^16 ms (65 s): a pass over a large backlog takes seconds.
PASS_BUCKETS = _exponential(0.001, 2.0, 17)
# 1 … 2^17 documents.
READ_BUCKETS = _exponential(1.0, 2.0, 18)


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric: its full name (as Prometheus shows it; a counter's ends in ``_total``),
    kind, unit (UCUM, as OpenTelemetry takes it), description and label names."""

    name: str
    kind: Kind
    unit: str
    description: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()

    def check(self, labels: Mapping[str, str]) -> None:
        """Raise ValueError unless ``labels`` are exactly this metric's label names."""
        if set(labels) != set(self.labels):
            given = ", ".join(sorted(labels)) or "none"
            raise ValueError(
                f"{self.name} takes the labels {', '.join(self.labels) or 'none'}, not {given}"
            )


PENDING = Metric(
    "opendws_pending_requests", Kind.GAUGE, "{request}",
    "Requests waiting for admission, per tenant, pool (of the held slot; empty when none) and "
    "reason (Kueue: pending_workloads).",
    ("tenant", "pool", "reason"),
)  # fmt: skip
LONGEST_WAIT = Metric(
    "opendws_pending_longest_wait_seconds", Kind.GAUGE, "s",
    "How long the longest-waiting pending request has waited, per tenant and pool.",
    ("tenant", "pool"),
)  # fmt: skip
ACTIVE = Metric(
    "opendws_admitted_active_requests", Kind.GAUGE, "{request}",
    "Requests admitted and not yet ended (provisioning, booked or active), per tenant, pool "
    "and state (Kueue: admitted_active_workloads).",
    ("tenant", "pool", "state"),
)  # fmt: skip
ADMITTED = Metric(
    "opendws_admitted_requests_total", Kind.COUNTER, "{request}",
    "Requests admitted, per tenant and pool (Kueue: admitted_workloads_total).",
    ("tenant", "pool"),
)  # fmt: skip
ADMISSION_WAIT = Metric(
    "opendws_admission_wait_time_seconds", Kind.HISTOGRAM, "s",
    "From publication (the message's publish time) to admission, per tenant and pool "
    "(Kueue: admission_wait_time_seconds).",
    ("tenant", "pool"), WAIT_BUCKETS,
)  # fmt: skip
READY_WAIT = Metric(
    "opendws_admitted_until_ready_wait_time_seconds", Kind.HISTOGRAM, "s",
    "From admission to ACTIVE, the time Google took to serve the request, per pool "
    "(Kueue: admitted_until_ready_wait_time_seconds).",
    ("pool",), WAIT_BUCKETS,
)  # fmt: skip
ETA_ERROR = Metric(
    "opendws_eta_error_seconds", Kind.HISTOGRAM, "s",
    "How far a flex request's admission was from the first ETA it was told, per pool and "
    "direction (early: admitted at or before it; late: after it). OpenTelemetry histograms "
    "take no negative values, so the sign is the label.",
    ("pool", "direction"), ETA_ERROR_BUCKETS,
)  # fmt: skip
TIMED_OUT = Metric(
    "opendws_timed_out_requests_total", Kind.COUNTER, "{request}",
    "Flex requests whose max_wait passed before they could be admitted, per tenant.",
    ("tenant",),
)  # fmt: skip
ENDED = Metric(
    "opendws_finished_requests_total", Kind.COUNTER, "{request}",
    "Requests that reached a final state, per tenant and state (Kueue: "
    "finished_workloads_total).",
    ("tenant", "state"),
)  # fmt: skip
STOCKOUTS = Metric(
    "opendws_stockouts_total", Kind.COUNTER, "{stockout}",
    "Times a pool went short: Google reported an order short of capacity while the pool was "
    "not already in its stockout cool-down, per pool.",
    ("pool",),
)  # fmt: skip
FAILOVERS = Metric(
    "opendws_failovers_total", Kind.COUNTER, "{request}",
    "Requests served in another pool than the one first asked (a race won elsewhere), per "
    "tenant, the pool first asked and the pool that served it.",
    ("tenant", "from_pool", "to_pool"),
)  # fmt: skip
PASSES = Metric(
    "opendws_reconcile_passes_total", Kind.COUNTER, "{pass}",
    "Reconcile passes, per outcome (Kueue: admission_attempts_total).",
    ("outcome",),
)  # fmt: skip
PASS_DURATION = Metric(
    "opendws_reconcile_pass_duration_seconds", Kind.HISTOGRAM, "s",
    "How long a reconcile pass took, per outcome (Kueue: admission_attempt_duration_seconds).",
    ("outcome",), PASS_BUCKETS,
)  # fmt: skip
PASS_READS = Metric(
    "opendws_reconcile_documents_read", Kind.HISTOGRAM, "{document}",
    "Firestore documents one reconcile pass read (billed per document).",
    (), READ_BUCKETS,
)  # fmt: skip
QUOTA_USAGE = Metric(
    "opendws_tenant_resource_usage", Kind.GAUGE, "{accelerator}",
    "Accelerators a tenant holds (admitted, booked or running), per cohort (empty: none) "
    "and accelerator (Kueue: cluster_queue_resource_usage).",
    ("tenant", "cohort", "accelerator"),
)  # fmt: skip
QUOTA_NOMINAL = Metric(
    "opendws_tenant_nominal_quota", Kind.GAUGE, "{accelerator}",
    "A tenant's nominal quota, per cohort and accelerator (Kueue: cluster_queue_nominal_quota).",
    ("tenant", "cohort", "accelerator"),
)  # fmt: skip
QUOTA_BORROWING = Metric(
    "opendws_tenant_borrowing_limit", Kind.GAUGE, "{accelerator}",
    "How much a tenant may borrow from its cohort beyond its nominal quota, per accelerator "
    "(Kueue: cluster_queue_borrowing_limit). Absent: no limit.",
    ("tenant", "cohort", "accelerator"),
)  # fmt: skip
COHORT_USAGE = Metric(
    "opendws_cohort_resource_usage", Kind.GAUGE, "{accelerator}",
    "Accelerators a cohort's tenants hold, per accelerator.",
    ("cohort", "accelerator"),
)  # fmt: skip
ACCELERATOR_HOURS = Metric(
    "opendws_accelerator_hours_total", Kind.COUNTER, "h",
    "Accelerator-hours used by finished requests, per tenant and accelerator.",
    ("tenant", "accelerator"),
)  # fmt: skip
COST = Metric(
    "opendws_cost_total", Kind.COUNTER, "{currency}",
    "Estimated cost of finished requests, from the configured price table, per tenant and "
    "accelerator.",
    ("tenant", "accelerator"),
)  # fmt: skip

METRICS: tuple[Metric, ...] = (
    PENDING, LONGEST_WAIT, ACTIVE, ADMITTED, ADMISSION_WAIT, READY_WAIT, ETA_ERROR, TIMED_OUT,
    ENDED, STOCKOUTS, FAILOVERS, PASSES, PASS_DURATION, PASS_READS, QUOTA_USAGE,
    QUOTA_NOMINAL, QUOTA_BORROWING, COHORT_USAGE, ACCELERATOR_HOURS, COST,
)  # fmt: skip
BY_NAME: Mapping[str, Metric] = {metric.name: metric for metric in METRICS}

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs


def labels_of_mapping(labels: Mapping[str, object]) -> Labels:
    """Label values as sorted (name, text) pairs: one series' identity."""
    return tuple(sorted((str(name), str(value)) for name, value in labels.items()))


class Metrics(Protocol):
    """Where services record what they measure. ``labels`` must be exactly the metric's."""

    def add(self, metric: Metric, amount: float, labels: Mapping[str, str]) -> None:
        """Add ``amount`` (≥ 0) to a counter."""
        ...

    def observe(self, metric: Metric, value: float, labels: Mapping[str, str]) -> None:
        """Record one value of a histogram."""
        ...

    def gauge(self, metric: Metric, series: Sequence[tuple[Mapping[str, str], float]]) -> None:
        """Set a gauge's whole state: each given series to its value, and every series set
        before but not given now to 0 (a tenant with nothing pending reads 0, not its last
        count)."""
        ...

    def flush(self) -> None:
        """Export what was recorded (called at the end of each invocation)."""
        ...


@dataclass(frozen=True, slots=True)
class Buckets:
    """One histogram series: cumulative count and sum, and the count in each bucket (one more
    than the bounds: the last is above every bound)."""

    count: int
    sum: float
    counts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MetricSnapshot:
    """What one process has recorded since it started (cumulative), as of ``at``: per metric
    name, per label set, a value (counter, gauge) or buckets (histogram)."""

    instance: str  # the process: unique per process, never reused
    at: datetime
    values: Mapping[str, Mapping[Labels, float]] = field(default_factory=dict)
    histograms: Mapping[str, Mapping[Labels, Buckets]] = field(default_factory=dict)


class MetricSnapshots(Protocol):
    """Where processes leave their latest snapshot and the api reads them all."""

    def put(self, snapshot: MetricSnapshot) -> None:
        """Replace the snapshot of ``snapshot.instance``."""
        ...

    def all(self) -> list[MetricSnapshot]:
        """Every process's latest snapshot."""
        ...

    def forget_before(self, cutoff: datetime) -> int:
        """Drop snapshots taken before ``cutoff`` (processes long gone); returns how many."""
        ...
