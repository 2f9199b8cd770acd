"""Metrics on OpenTelemetry, and the Prometheus text the api serves.

:class:`OtelMetrics` implements the :class:`~opendws.ports.telemetry.Metrics` port with an
OpenTelemetry SDK meter: one instrument per catalog entry, histograms with the catalog's
bucket bounds (views), cumulative temporality. Its readers export on :meth:`~OtelMetrics.flush`
(the end of each function invocation: Cloud Run gives an instance CPU only while it serves,
so a periodic export alone may never run). Each exporter sends at most every ``min_interval``,
whoever asks (the end of an invocation or the periodic reader): Cloud Monitoring requires the
end times of the points written to one time series to be at least 10 s apart
(cloud.google.com/monitoring/quotas). An export skipped is lost to no one: every export is
cumulative, so the next one carries it. Exporters:

- :class:`SnapshotExporter`: the process's cumulative values as a
  :class:`~opendws.ports.telemetry.MetricSnapshot` into a
  :class:`~opendws.ports.telemetry.MetricSnapshots` (Firestore's ``metrics`` collection, or
  memory), read by the api's ``/metrics``;
- in Google Cloud, OpenTelemetry's Cloud Monitoring exporter (metric types
  ``workload.googleapis.com/<name>``), built in :mod:`opendws.adapters.clients`.

:func:`prometheus_text` renders every process's snapshot in Prometheus' text format
(prometheus-client): counters and histograms summed over processes (a process that ended keeps
its last values, so sums never go down until its snapshot is forgotten, which Prometheus'
``rate`` reads as a counter reset), gauges from the newest snapshot that has them (only the
lease-holding reconciler sets gauges).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics import _Gauge as SdkGauge
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.export import (
    Gauge as GaugeData,
)
from opentelemetry.sdk.metrics.export import (
    Histogram as HistogramData,
)
from opentelemetry.sdk.metrics.export import (
    Sum as SumData,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.core import (
    Metric as PrometheusFamily,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from opendws.ports.telemetry import (
    BY_NAME,
    METRICS,
    Buckets,
    Kind,
    Labels,
    Metric,
    MetricSnapshot,
    MetricSnapshots,
)
from opendws.ports.telemetry import labels_of_mapping as labels_of

# Every instrument cumulative: a snapshot is what the process recorded since it started.
CUMULATIVE: dict[type, AggregationTemporality] = dict.fromkeys(
    (Counter, Histogram, SdkGauge), AggregationTemporality.CUMULATIVE
)
# Cloud Monitoring: points of one series at least 10 s apart; 15 s leaves room for the time
# between a collection and its export.
MIN_INTERVAL = timedelta(seconds=15)
# Between exports while a process is idle but has CPU (a local function server).
EXPORT_EVERY = timedelta(seconds=60)


class OtelMetrics:
    """The Metrics port on an OpenTelemetry meter (see the module docstring). ``readers``:
    the meter's readers (tests give an InMemoryMetricReader); ``exporters`` get a periodic
    reader each."""

    def __init__(
        self, *, service: str, instance: str, exporters: Sequence[MetricExporter] = (),
        readers: Sequence[MetricReader] = (), min_interval: timedelta = MIN_INTERVAL,
        resource: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        periodic = [
            PeriodicExportingMetricReader(
                SpacedExporter(exporter, min_interval),
                export_interval_millis=EXPORT_EVERY.total_seconds() * 1000,
            )
            for exporter in exporters
        ]
        views = [
            View(
                instrument_name=metric.name,
                aggregation=ExplicitBucketHistogramAggregation(list(metric.buckets)),
            )
            for metric in METRICS
            if metric.kind is Kind.HISTOGRAM
        ]
        attributes = {**(resource or {}), "service.name": service, "service.instance.id": instance}
        self._provider = MeterProvider(
            metric_readers=[*periodic, *readers], resource=Resource.create(attributes),
            views=views,
            shutdown_on_exit=False,
        )  # fmt: skip
        meter = self._provider.get_meter("opendws")
        self._counters = {}
        self._histograms = {}
        self._gauges = {}
        for metric in METRICS:
            match metric.kind:
                case Kind.COUNTER:
                    self._counters[metric.name] = meter.create_counter(
                        metric.name, unit=metric.unit, description=metric.description
                    )
                case Kind.HISTOGRAM:
                    self._histograms[metric.name] = meter.create_histogram(
                        metric.name, unit=metric.unit, description=metric.description
                    )
                case Kind.GAUGE:
                    self._gauges[metric.name] = meter.create_gauge(
                        metric.name, unit=metric.unit, description=metric.description
                    )
        self._lock = threading.Lock()
        self._set: dict[str, set[Labels]] = defaultdict(set)  # gauge series set so far

    def add(self, metric: Metric, amount: float, labels: Mapping[str, str]) -> None:
        metric.check(labels)
        if amount < 0:
            raise ValueError(f"{metric.name} is a counter: {amount} cannot be added")
        self._counters[metric.name].add(amount, dict(labels))

    def observe(self, metric: Metric, value: float, labels: Mapping[str, str]) -> None:
        metric.check(labels)
        self._histograms[metric.name].record(value, dict(labels))

    def gauge(self, metric: Metric, series: Sequence[tuple[Mapping[str, str], float]]) -> None:
        gauge = self._gauges[metric.name]
        given: set[Labels] = set()
        for labels, value in series:
            metric.check(labels)
            given.add(labels_of(labels))
            gauge.set(value, dict(labels))
        with self._lock:
            for gone in self._set[metric.name] - given:
                gauge.set(0, dict(gone))
            self._set[metric.name] |= given

    def flush(self) -> None:
        """Export now (each exporter skips it if it sent less than ``min_interval`` ago; the
        periodic readers then send within a minute)."""
        self._provider.force_flush()


class SpacedExporter(MetricExporter):
    """``inner``, sending at most every ``min_interval``: an export asked for sooner is
    skipped (and reported a success: the next, cumulative, export carries what it had)."""

    def __init__(self, inner: MetricExporter, min_interval: timedelta) -> None:
        super().__init__(preferred_temporality=CUMULATIVE)
        self._inner = inner
        self._min_interval = min_interval.total_seconds()
        self._lock = threading.Lock()
        self._sent_at: float | None = None

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        with self._lock:
            now = time.monotonic()
            if self._sent_at is not None and now - self._sent_at < self._min_interval:
                return MetricExportResult.SUCCESS
            self._sent_at = now
        return self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


class SnapshotExporter(MetricExporter):
    """Exports a process's cumulative metrics as its snapshot (one write per export)."""

    def __init__(self, snapshots: MetricSnapshots, instance: str) -> None:
        super().__init__(preferred_temporality=CUMULATIVE)
        self._snapshots = snapshots
        self._instance = instance

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        snapshot = snapshot_of(metrics_data, self._instance, datetime.now(UTC))
        if snapshot.values or snapshot.histograms:  # a process that measured nothing: no write
            self._snapshots.put(snapshot)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def snapshot_of(data: MetricsData, instance: str, at: datetime) -> MetricSnapshot:
    """OpenTelemetry's cumulative metrics data as a snapshot of the catalog's metrics."""
    values: dict[str, dict[Labels, float]] = {}
    histograms: dict[str, dict[Labels, Buckets]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name not in BY_NAME:
                    continue
                points = metric.data
                if isinstance(points, HistogramData):
                    histograms[metric.name] = {
                        labels_of(point.attributes or {}): Buckets(
                            count=point.count, sum=point.sum, counts=tuple(point.bucket_counts)
                        )
                        for point in points.data_points
                    }
                elif isinstance(points, SumData | GaugeData):
                    values[metric.name] = {
                        labels_of(point.attributes or {}): float(point.value)
                        for point in points.data_points
                    }
    return MetricSnapshot(instance=instance, at=at, values=values, histograms=histograms)


class MemoryMetricSnapshots:
    """The MetricSnapshots port in memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshots: dict[str, MetricSnapshot] = {}

    def put(self, snapshot: MetricSnapshot) -> None:
        with self._lock:
            self._snapshots[snapshot.instance] = snapshot

    def all(self) -> list[MetricSnapshot]:
        with self._lock:
            return sorted(self._snapshots.values(), key=lambda s: (s.at, s.instance))

    def forget_before(self, cutoff: datetime) -> int:
        with self._lock:
            gone = [name for name, s in self._snapshots.items() if s.at < cutoff]
            for name in gone:
                del self._snapshots[name]
            return len(gone)


# Prometheus ---------------------------------------------------------------------------------


def combined(
    snapshots: Iterable[MetricSnapshot],
) -> tuple[dict[str, dict[Labels, float]], dict[str, dict[Labels, Buckets]]]:
    """Every process's snapshot as one: counters and histograms summed, each gauge from the
    newest snapshot that has it."""
    values: dict[str, dict[Labels, float]] = defaultdict(dict)
    histograms: dict[str, dict[Labels, Buckets]] = defaultdict(dict)
    for snapshot in sorted(snapshots, key=lambda s: s.at):  # newest last: its gauges win
        for name, series in snapshot.values.items():
            metric = BY_NAME.get(name)
            if metric is None:
                continue
            if metric.kind is Kind.GAUGE:
                values[name] = dict(series)
                continue
            for labels, value in series.items():
                values[name][labels] = values[name].get(labels, 0.0) + value
        for name, buckets in snapshot.histograms.items():
            for labels, one in buckets.items():
                seen = histograms[name].get(labels)
                histograms[name][labels] = one if seen is None else _sum(seen, one)
    return values, histograms


def _sum(a: Buckets, b: Buckets) -> Buckets:
    return Buckets(
        count=a.count + b.count,
        sum=a.sum + b.sum,
        counts=tuple(x + y for x, y in zip(a.counts, b.counts, strict=True)),
    )


class _SnapshotCollector(Collector):
    def __init__(self, snapshots: Iterable[MetricSnapshot]) -> None:
        self._values, self._histograms = combined(snapshots)

    def collect(self) -> Iterator[PrometheusFamily]:
        for metric in METRICS:
            yield self._family(metric)

    def _family(self, metric: Metric) -> PrometheusFamily:
        names = list(metric.labels)
        help_text = metric.description
        if metric.kind is Kind.HISTOGRAM:
            histogram = HistogramMetricFamily(metric.name, help_text, labels=names)
            for labels, buckets in sorted(self._histograms.get(metric.name, {}).items()):
                histogram.add_metric(
                    _values(labels, names), _cumulative(metric.buckets, buckets), buckets.sum
                )
            return histogram
        family: CounterMetricFamily | GaugeMetricFamily
        if metric.kind is Kind.COUNTER:
            family = CounterMetricFamily(metric.name, help_text, labels=names)
        else:
            family = GaugeMetricFamily(metric.name, help_text, labels=names)
        for labels, value in sorted(self._values.get(metric.name, {}).items()):
            family.add_metric(_values(labels, names), value)
        return family


def _values(labels: Labels, names: list[str]) -> list[str]:
    given = dict(labels)
    return [given.get(name, "") for name in names]


def _cumulative(bounds: tuple[float, ...], buckets: Buckets) -> list[tuple[str, float]]:
    """OpenTelemetry's per-bucket counts as Prometheus' cumulative ``le`` buckets."""
    running = 0
    out: list[tuple[str, float]] = []
    for bound, count in zip((*bounds, float("inf")), buckets.counts, strict=True):
        running += count
        out.append(("+Inf" if bound == float("inf") else _bound(bound), float(running)))
    return out


def _bound(bound: float) -> str:
    return repr(float(bound))


def prometheus_text(snapshots: Iterable[MetricSnapshot]) -> str:
    """Every process's metrics in Prometheus' text exposition format (version 0.0.4)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snapshots))
    return generate_latest(registry).decode()
