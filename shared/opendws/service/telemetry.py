"""What the services measure, and the structured log line of every state change.

Pure rules from records to metric values (the catalog is :mod:`opendws.ports.telemetry`):

- :func:`record_write` — a request written from ``before`` to ``after`` at ``now``: an
  admission (count, wait since publication, ETA error against its first ETA), Google serving it
  (admission → ACTIVE, a failover when it runs in another pool than it was admitted to first), a
  time-out, an end (with its accelerator-hours and cost);
- :func:`record_gauges` — after a pass, the state of everything not final: pending by tenant,
  pool and reason, the longest wait, admitted requests, quota in use against nominal and
  borrowing limit per tenant and cohort;
- :func:`record_pass` — a pass's outcome, duration and documents read.

:func:`log_event` writes one log record per status event (a transition or a revision) with
the fields Cloud Logging indexes (``request_id``, ``tenant``, ``pool``); :func:`log_cloud_call`
one per provider call, with the cloud's error code when it failed. The JSON format is the
adapters' (:mod:`opendws.adapters.logs`).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from opendws.domain.states import RequestState
from opendws.ports import Configuration, EventBus, RequestRecord, StatusEvent, UsageEntry
from opendws.ports import telemetry as m

S = RequestState
log = logging.getLogger("opendws.events")
cloud_log = logging.getLogger("opendws.cloud")
# Admitted and not ended: what opendws_admitted_active_requests counts.
ADMITTED_STATES = (S.PROVISIONING, S.BOOKED, S.ACTIVE)
# Holding quota now: what opendws_tenant_resource_usage counts.
HOLDING_STATES = (S.PROVISIONING, S.ACTIVE)


def record_write(
    metrics: m.Metrics, before: RequestRecord, after: RequestRecord, now: datetime,
    usage: UsageEntry | None = None,
) -> None:  # fmt: skip
    """The metrics of one stored change (nothing for a revision in the same state)."""
    if before.state is after.state:
        return
    tenant, pool = after.tenant, after.pool or ""
    if before.state is S.PENDING and after.state in ADMITTED_STATES:
        m_labels = {"tenant": tenant, "pool": pool}
        metrics.add(m.ADMITTED, 1, m_labels)
        waited = now - after.request.submitted_at
        metrics.observe(m.ADMISSION_WAIT, max(waited, timedelta(0)).total_seconds(), m_labels)
        if before.first_eta is not None and after.request.start_at is None:
            error = (now - before.first_eta).total_seconds()
            direction = "late" if error > 0 else "early"
            metrics.observe(m.ETA_ERROR, abs(error), {"pool": pool, "direction": direction})
    if before.state is S.PROVISIONING and after.state is S.ACTIVE:
        admitted = before.since or before.updated_at
        took = max(now - admitted, timedelta(0)).total_seconds()
        metrics.observe(m.READY_WAIT, took, {"pool": pool})
        if before.pool is not None and after.pool is not None and before.pool != after.pool:
            labels = {"tenant": tenant, "from_pool": before.pool, "to_pool": after.pool}
            metrics.add(m.FAILOVERS, 1, labels)
    if after.state is S.TIMED_OUT:
        metrics.add(m.TIMED_OUT, 1, {"tenant": tenant})
    if after.state.is_final:
        metrics.add(m.ENDED, 1, {"tenant": tenant, "state": after.state.value})
        if usage is not None:
            record_usage(metrics, usage)


def record_usage(metrics: m.Metrics, usage: UsageEntry) -> None:
    """A finished request's accelerator-hours and cost."""
    labels = {"tenant": usage.tenant, "accelerator": usage.accelerator}
    metrics.add(m.ACCELERATOR_HOURS, usage.used_hours, labels)
    if usage.cost is not None:
        metrics.add(m.COST, usage.cost, labels)


def record_stockout(metrics: m.Metrics, pool: str) -> None:
    metrics.add(m.STOCKOUTS, 1, {"pool": pool})


def record_pass(
    metrics: m.Metrics, outcome: str, took: timedelta, documents_read: int | None
) -> None:
    """One reconcile pass: its outcome, duration and (where the store counts them) reads."""
    labels = {"outcome": outcome}
    metrics.add(m.PASSES, 1, labels)
    metrics.observe(m.PASS_DURATION, took.total_seconds(), labels)
    if documents_read is not None:
        metrics.observe(m.PASS_READS, documents_read, {})


def record_gauges(
    metrics: m.Metrics, records: Iterable[RequestRecord], configuration: Configuration,
    now: datetime,
) -> None:  # fmt: skip
    """The gauges, from every request not final and the configuration."""
    pending: Counter[tuple[str, str, str]] = Counter()
    longest: dict[tuple[str, str], float] = {}
    admitted: Counter[tuple[str, str, str]] = Counter()
    holding: Counter[tuple[str, str]] = Counter()  # (tenant, accelerator) → units
    for record in records:
        tenant, pool = record.tenant, record.pool or ""
        if record.state is S.PENDING:
            pending[tenant, pool, record.reason or ""] += 1
            waited = max((now - record.request.submitted_at).total_seconds(), 0.0)
            longest[tenant, pool] = max(longest.get((tenant, pool), 0.0), waited)
        elif record.state in ADMITTED_STATES:
            admitted[tenant, pool, record.state.value] += 1
        if record.state in HOLDING_STATES:
            holding[tenant, record.request.gang.accelerator] += record.request.accelerator_units
    metrics.gauge(
        m.PENDING,
        [({"tenant": t, "pool": p, "reason": r}, n) for (t, p, r), n in sorted(pending.items())],
    )
    metrics.gauge(
        m.LONGEST_WAIT,
        [({"tenant": t, "pool": p}, s) for (t, p), s in sorted(longest.items())],
    )
    metrics.gauge(
        m.ACTIVE,
        [({"tenant": t, "pool": p, "state": s}, n) for (t, p, s), n in sorted(admitted.items())],
    )
    _quota_gauges(metrics, holding, configuration)


def _quota_gauges(
    metrics: m.Metrics, holding: Mapping[tuple[str, str], int], configuration: Configuration
) -> None:
    cohorts = {tenant.name: tenant.cohort or "" for tenant in configuration.tenants}
    # Every configured quota has its series, 0 while unused (as Kueue reports every resource
    # of a cluster queue), so that usage / nominal is 0, not absent, for an idle tenant.
    held: dict[tuple[str, str], float] = {
        (tenant.name, quota.accelerator): 0 for tenant in configuration.tenants
        for quota in tenant.quotas
    }  # fmt: skip
    held.update(holding)
    usage: list[tuple[Mapping[str, str], float]] = []
    by_cohort: dict[tuple[str, str], float] = defaultdict(float)
    for (name, accelerator), units in sorted(held.items()):
        cohort = cohorts.get(name, "")
        usage.append(({"tenant": name, "cohort": cohort, "accelerator": accelerator}, units))
        if cohort:
            by_cohort[cohort, accelerator] += units
    nominal: list[tuple[Mapping[str, str], float]] = []
    borrowing: list[tuple[Mapping[str, str], float]] = []
    for tenant in configuration.tenants:
        for quota in tenant.quotas:
            labels = {
                "tenant": tenant.name, "cohort": tenant.cohort or "",
                "accelerator": quota.accelerator,
            }  # fmt: skip
            nominal.append((labels, quota.nominal))
            if quota.borrowing_limit is not None:
                borrowing.append((labels, quota.borrowing_limit))
    metrics.gauge(m.QUOTA_USAGE, usage)
    metrics.gauge(m.QUOTA_NOMINAL, nominal)
    metrics.gauge(m.QUOTA_BORROWING, borrowing)
    metrics.gauge(
        m.COHORT_USAGE,
        [({"cohort": c, "accelerator": a}, u) for (c, a), u in sorted(by_cohort.items())],
    )


# Logs ---------------------------------------------------------------------------------------


def log_event(event: StatusEvent) -> None:
    """One structured log line for a status event: a request's first (``new → PENDING``, or
    a refusal at intake), a transition (``previous_state`` → ``state``) or a revision in the
    same state (a new ETA, reason or position)."""
    severity = logging.WARNING if event.state in (S.REJECTED, S.TIMED_OUT) else logging.INFO
    if event.previous_state is None:
        what = f"new → {event.state}"
    elif event.previous_state is not event.state:
        what = f"{event.previous_state} → {event.state}"
    else:
        what = f"{event.state} (revised)"
    fields = {
        "request_id": event.request_id, "tenant": event.tenant, "pool": event.pool,
        "state": event.state.value,
        "previous_state": None if event.previous_state is None else event.previous_state.value,
        "reason": event.reason, "eta": None if event.eta is None else event.eta.isoformat(),
        "position": event.position,
    }  # fmt: skip
    text = f"{event.request_id}: {what}" + (f" ({event.reason})" if event.reason else "")
    log.log(severity, text, extra={"fields": fields})


def cloud_error_code(error: BaseException) -> str | None:
    """The cloud's own error code for a failed call: google-api-core's exceptions carry the
    HTTP status as ``code`` and the gRPC status as ``grpc_status_code``; Compute Engine's
    long-running operations put theirs in ``errors[].code`` (read duck-typed: the services do
    not import the client libraries)."""
    grpc = getattr(error, "grpc_status_code", None)
    if grpc is not None:
        return str(getattr(grpc, "name", grpc))
    code = getattr(error, "code", None)
    if isinstance(code, int | str) and code:
        return str(code)
    reason = getattr(error, "reason", None)
    return str(reason) if reason else None


def log_cloud_call(
    call: str, order: str, pool: str, *, request_id: str, tenant: str,
    error: BaseException | None = None,
) -> None:  # fmt: skip
    """One structured log line for a provider call (provision, reserve, release)."""
    fields: dict[str, object] = {
        "request_id": request_id, "tenant": tenant, "pool": pool, "call": call, "order": order,
    }  # fmt: skip
    if error is None:
        cloud_log.info("%s %s in %s", call, order, pool, extra={"fields": fields})
        return
    fields["error_code"] = cloud_error_code(error)
    fields["error"] = str(error)
    cloud_log.warning(
        "%s %s in %s failed (%s): %s", call, order, pool, fields["error_code"], error,
        extra={"fields": fields},
    )  # fmt: skip


class LoggedEvents:
    """An event bus that also logs each event it publishes as one structured line
    (:func:`log_event`), once the bus has accepted it."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus

    def publish(self, event: StatusEvent) -> None:
        self._bus.publish(event)
        log_event(event)
