"""What users look at: the queue (pending requests with their positions, ETAs and reasons) and
the timeline of each pool (what holds it when: running grants, provisioning ones, booked
blocks, and the planned starts of pending requests). Read from the stored records, as the last
reconcile pass left them; the CLI and the API show these."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from opendws.domain.states import RequestState
from opendws.ports import RequestRecord, Requests, hold_end

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
    eta: datetime | None  # the held slot's start: an upper bound as things stand
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

    def __init__(self, store: Requests) -> None:
        self._store = store

    def queue(self, now: datetime, *, tenant: str | None = None) -> list[QueueEntry]:
        """Pending requests, by pool then position (those without a slot last), then age."""
        entries = [
            _entry(record, now)
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


def _entry(record: RequestRecord, now: datetime) -> QueueEntry:
    request = record.request
    return QueueEntry(
        request_id=request.request_id,
        tenant=request.tenant,
        mode=request.mode.value,
        units=request.units,
        accelerator=request.gang.accelerator,
        pool=record.pool,
        position=record.position,
        eta=record.eta,
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
