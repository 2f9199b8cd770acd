"""What users look at: the queue (pending requests with their positions, ETAs, ready ETAs and
reasons) and
the timeline of each pool (what holds it when: running grants, provisioning ones, booked
blocks, and the planned starts of pending requests). Read from the stored records, as the last
reconcile pass left them; the CLI and the API show these."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from opendws.domain.model import Mode
from opendws.domain.readiness import Readiness, readiness_by_pool, ready_etas
from opendws.domain.states import RequestState
from opendws.ports import PoolStatus, RequestRecord, Requests, hold_end

S = RequestState


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
    units: int
    start: datetime
    end: datetime


class QueryService:
    """Queue and timeline views over the request store."""

    def __init__(self, store: Requests, pools: PoolStatus) -> None:
        self._store = store
        self._pools = pools

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

    def timeline(self, now: datetime, *, pool: str | None = None) -> dict[str, list[Span]]:
        """Per pool, every hold and planned start, by start time."""
        spans: dict[str, list[Span]] = {}
        live = self._store.in_states(S.ACTIVE, S.PROVISIONING, S.BOOKED, S.PENDING)
        for record in live:
            span = _span(record, now)
            if span is None or record.pool is None or (pool and record.pool != pool):
                continue
            spans.setdefault(record.pool, []).append(span)
        return {
            name: sorted(items, key=lambda s: (s.start, s.request_id))
            for name, items in sorted(spans.items())
        }


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


def _span(record: RequestRecord, now: datetime) -> Span | None:
    request = record.request
    if request.start_at is not None:  # a calendar block: its window
        start = request.start_at
    elif record.state is S.PENDING:
        if record.eta is None:
            return None  # no slot held: nothing planned yet
        start = record.eta
    else:
        end = hold_end(record, now)
        return Span(
            request_id=request.request_id, tenant=request.tenant, state=record.state.value,
            units=request.units, start=end - request.run_duration, end=end,
        )  # fmt: skip
    return Span(
        request_id=request.request_id,
        tenant=request.tenant,
        state=record.state.value,
        units=request.units,
        start=start,
        end=start + request.run_duration,
    )
