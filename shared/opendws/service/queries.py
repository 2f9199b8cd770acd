"""What users look at: the queue (pending requests with their positions, ETAs, ready ETAs and
reasons), the timeline of each pool (what holds it when: running grants, provisioning ones,
orders waiting in Google's queue, calendar blocks, and the planned starts of pending requests,
against the pool's configured capacity) and each tenant's quota in use. Read from the stored
records, as the last reconcile pass left them, and the configuration; the CLI and the API show
these."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from opendws.domain.model import Mode, Pool
from opendws.domain.quotas import QuotaBook
from opendws.domain.readiness import Readiness, expected_wait, readiness_by_pool, ready_etas
from opendws.domain.states import RequestState
from opendws.domain.sweep import SweepReason
from opendws.ports import ConfigStore, PoolStatus, RequestRecord, Requests, hold_end
from opendws.service.reconcile import ReconcileReason

S = RequestState
# The records that hold capacity now, and so count against their tenant's quota.
HOLDING = (S.PROVISIONING, S.ACTIVE)
# A provisioning order whose last word from Google is that it waits in Google's queue.
_AT_GOOGLE = frozenset({SweepReason.WAITING_FOR_CAPACITY.value, ReconcileReason.RACING.value})


class SpanKind(StrEnum):
    """What a span on a pool's timeline is, as the dashboard stacks it."""

    RUNNING = "running"  # a flex run: the whole gang is up
    PROVISIONING = "provisioning"  # admitted; the cloud is creating it
    WAITING = "waiting"  # ordered, waiting in Google's queue for capacity
    BLOCK = "block"  # a calendar block: under Google's review, booked, or under way
    PLANNED = "planned"  # a pending flex request's committed start (the slot held for it)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueEntry:
    """One pending request."""

    request_id: str
    tenant: str
    mode: str
    units: int  # pool units its gang needs
    accelerator: str
    pool: str | None  # where a slot is held for it (None: no slot yet)
    position: int | None  # place in line for that pool
    eta: datetime | None  # the held slot's start: when opendws admits it, as things stand
    # When its capacity is expected to run: eta + the pool's recent admission → ACTIVE median
    # and 90th percentile (a calendar block: its start); None while the pool has no history.
    ready_eta: datetime | None
    ready_eta_p90: datetime | None
    reason: str | None  # why it is not running yet
    waited: timedelta  # since it was submitted


@dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """One request's hold on a pool over ``[start, end)``, or its planned one."""

    request_id: str
    tenant: str
    state: str  # ACTIVE, PROVISIONING, BOOKED, or PENDING (a planned start)
    kind: SpanKind
    units: int
    start: datetime
    end: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaUse:
    """One tenant's use of one accelerator now against its quota: ``in_use`` accelerators of
    its provisioning and running requests; ``nominal`` and ``borrowing_limit`` as configured
    (None: no limit of its own beyond its cohort's); ``ceiling`` the most it could hold at once
    (:meth:`QuotaBook.ceiling`: its cohort's and its own limits)."""

    tenant: str
    accelerator: str
    cohort: str | None
    in_use: int
    nominal: int
    borrowing_limit: int | None
    ceiling: int


class QueryService:
    """Queue and timeline views over the request store."""

    def __init__(self, store: Requests, pools: PoolStatus, config: ConfigStore) -> None:
        self._store = store
        self._pools = pools
        self._config = config

    def pools(self) -> tuple[Pool, ...]:
        """The configured pools (their capacity is the line the timeline is drawn against)."""
        return self._config.load().pools

    def readiness(self, now: datetime) -> dict[str, Readiness | None]:
        """Per pool with a history: what Google took lately from admission to ACTIVE."""
        return readiness_by_pool(self._pools.ready_samples(), now)

    def ready_etas(
        self, record: RequestRecord, now: datetime
    ) -> tuple[datetime | None, datetime | None]:
        """``(ready_eta, ready_eta_p90)`` of one pending request (see :class:`QueueEntry`)."""
        return _ready(record, self.readiness(now))

    def queue(self, now: datetime, *, tenant: str | None = None) -> list[QueueEntry]:
        """Pending requests, by pool then position (those without a slot last), then age."""
        known = self.readiness(now)
        entries = [
            _entry(record, now, known)
            for record in self._store.in_states(S.PENDING)
            if tenant is None or record.tenant == tenant
        ]
        far = datetime.max.replace(tzinfo=now.tzinfo)
        return sorted(
            entries,
            key=lambda e: (
                e.pool is None,
                e.pool or "",
                e.position or 0,
                e.eta or far,
                -e.waited,
                e.request_id,
            ),
        )

    def timeline(
        self, now: datetime, *, pool: str | None = None, until: datetime | None = None
    ) -> dict[str, list[Span]]:
        """Per pool, every hold and planned start, by start time; with ``until``, only those
        starting before it."""
        spans: dict[str, list[Span]] = {}
        live = self._store.in_states(S.ACTIVE, S.PROVISIONING, S.BOOKED, S.PENDING)
        known = self.readiness(now) if any(r.state is S.PROVISIONING for r in live) else {}
        for record in live:
            span = _span(record, now, known)
            if span is None or record.pool is None or (pool and record.pool != pool):
                continue
            if until is not None and span.start >= until:
                continue
            spans.setdefault(record.pool, []).append(span)
        return {
            name: sorted(items, key=lambda s: (s.start, s.request_id))
            for name, items in sorted(spans.items())
        }

    def quota(self, *, tenant: str | None = None) -> list[QuotaUse]:
        """Each configured tenant's (or only ``tenant``'s) use now of every accelerator it has a
        quota for or holds, by tenant then accelerator."""
        tenants = self._config.load().tenants
        book = QuotaBook(tenants)
        in_use: dict[tuple[str, str], int] = {}
        for record in self._store.in_states(*HOLDING):
            request = record.request
            if tenant is None or request.tenant == tenant:
                key = (request.tenant, request.gang.accelerator)
                in_use[key] = in_use.get(key, 0) + request.accelerator_units
        rows: list[QuotaUse] = []
        for configured in sorted(tenants, key=lambda t: t.name):
            if tenant is not None and configured.name != tenant:
                continue
            held = {acc for (name, acc) in in_use if name == configured.name}
            for accelerator in sorted({q.accelerator for q in configured.quotas} | held):
                quota = configured.quota(accelerator)
                rows.append(QuotaUse(
                    tenant=configured.name, accelerator=accelerator, cohort=configured.cohort,
                    in_use=in_use.get((configured.name, accelerator), 0), nominal=quota.nominal,
                    borrowing_limit=quota.borrowing_limit,
                    ceiling=book.ceiling(configured.name, accelerator),
                ))  # fmt: skip
        return rows


def _ready(
    record: RequestRecord, known: dict[str, Readiness | None]
) -> tuple[datetime | None, datetime | None]:
    if record.state is not S.PENDING or record.pool is None:
        return None, None
    calendar = record.request.mode is Mode.CALENDAR
    return ready_etas(record.eta, known.get(record.pool), reserved=calendar)


def _entry(record: RequestRecord, now: datetime, known: dict[str, Readiness | None]) -> QueueEntry:
    request = record.request
    ready, ready_p90 = _ready(record, known)
    return QueueEntry(
        request_id=request.request_id,
        tenant=request.tenant,
        mode=request.mode.value,
        units=request.units,
        accelerator=request.gang.accelerator,
        pool=record.pool,
        position=record.position,
        eta=record.eta,
        ready_eta=ready,
        ready_eta_p90=ready_p90,
        reason=record.reason,
        waited=max(now - request.submitted_at, timedelta(0)),
    )


def span_kind(record: RequestRecord) -> SpanKind:
    """What ``record``'s hold (or planned start) is on its pool's timeline."""
    if record.request.mode is Mode.CALENDAR:
        return SpanKind.BLOCK
    if record.state is S.ACTIVE:
        return SpanKind.RUNNING
    if record.state is S.PROVISIONING:
        return SpanKind.WAITING if record.reason in _AT_GOOGLE else SpanKind.PROVISIONING
    return SpanKind.PLANNED


def _span(record: RequestRecord, now: datetime, known: dict[str, Readiness | None]) -> Span | None:
    """``record``'s hold on its pool's timeline, or its planned start; a run in Google's
    queue as the planner holds it (see :func:`~opendws.ports.records.hold_end`)."""
    request = record.request
    kind = span_kind(record)
    if request.start_at is not None:  # a calendar block: its window
        start = request.start_at
    elif record.state is S.PENDING:
        if record.eta is None:
            return None  # no slot held: nothing planned yet
        start = record.eta
    else:
        wait = expected_wait(known.get(record.pool)) if record.pool else timedelta(0)
        end = hold_end(record, now, wait)
        return Span(
            request_id=request.request_id, tenant=request.tenant, state=record.state.value,
            kind=kind, units=request.units, start=end - request.run_duration, end=end,
        )  # fmt: skip
    return Span(
        request_id=request.request_id,
        tenant=request.tenant,
        state=record.state.value,
        kind=kind,
        units=request.units,
        start=start,
        end=start + request.run_duration,
    )
