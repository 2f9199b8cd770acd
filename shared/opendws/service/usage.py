"""Usage accounting: what each finished request was granted and used, and the totals per
tenant and accelerator that the CLI and API show.

An entry is made by whoever moves a request to a final state, from the record it ends and
written in the same transaction (see ``Requests.change``), so a retried or repeated ending
cannot count a request twice and a crash cannot lose it.

- **granted** accelerator-hours: the gang's accelerators × its run duration, for a request
  that ran (became ACTIVE); 0 otherwise.
- **used** accelerator-hours: the gang's accelerators × (end − start of its run), start being
  when it became ACTIVE; an early release uses less than it was granted.
- **cost**: used hours × the configured price × the mode's factor (flex-start and calendar
  capacity are discounted); None where no price is configured.
- A **calendar block** that reached its start counts in full, from its start to its end,
  whether it was used or released early: Google bills it so. The totals say how each such
  block ended (:data:`KEPT_TO_END`: its VMs stayed until its end, as they do by default when
  its job ends early; :data:`RELEASED_EARLY`: deleted before it, by ``run.release_on_end`` or
  a release) — billed in full either way.
- **per day** (:meth:`UsageService.daily`, the dashboard's chart): an entry's used hours and
  cost are spread over the UTC days its run covered, in proportion to the time in each (an
  entry that never ran counts on the day it ended); only finished requests are in the ledger.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

from opendws.domain.model import Mode
from opendws.domain.states import RequestState
from opendws.ports import Configuration, RequestRecord, UsageEntry, UsageLedger

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
MAX_DAYS = 120  # the longest daily series asked for at once
# A calendar block that reached its start is billed in full, released early or not.
_BLOCK_STARTED = (RequestState.PROVISIONING, RequestState.ACTIVE)
# How a started calendar block ended (UsageRow.blocks): its VMs kept until its end, or
# deleted before it (run.release_on_end, or a release).
KEPT_TO_END = "kept_to_end"
RELEASED_EARLY = "released_early"


def usage_of(
    record: RequestRecord, outcome: RequestState, at: datetime, configuration: Configuration
) -> UsageEntry:
    """The entry for ``record`` ending in ``outcome`` at ``at``."""
    request = record.request
    started = record.since if record.state is RequestState.ACTIVE else None
    used = granted = 0.0
    if request.block is not None:
        pass  # a job into a block: the block holds (and bills) the capacity it ran on
    elif request.mode is Mode.CALENDAR and record.state in _BLOCK_STARTED:
        # Google bills a block from its start to its end whether it was used or not
        # (compute/docs/instances/delete-future-reservations-calendar-mode).
        used = granted = request.accelerator_units * request.run_duration / HOUR
    elif started is not None:
        used = request.accelerator_units * max(at - started, timedelta(0)) / HOUR
        granted = request.accelerator_units * request.run_duration / HOUR
    price = configuration.price(request.gang.accelerator)
    return UsageEntry(
        request_id=request.request_id,
        tenant=request.tenant,
        accelerator=request.gang.accelerator,
        mode=request.mode,
        outcome=outcome,
        granted_hours=granted,
        used_hours=used,
        started_at=started,
        ended_at=at,
        cost=None if price is None else price.cost(request.mode, used),
    )


def block_ending(entry: UsageEntry) -> str | None:
    """How a calendar block that reached its start ended: :data:`RELEASED_EARLY` when it was
    released (its VMs deleted before its end), :data:`KEPT_TO_END` when it ran out its window;
    None for any other entry (a flex request, a block that never started)."""
    if entry.mode is not Mode.CALENDAR or entry.granted_hours <= 0:
        return None
    return RELEASED_EARLY if entry.outcome is RequestState.RELEASED else KEPT_TO_END


@dataclass(slots=True)
class UsageRow:
    """The totals of one tenant for one accelerator."""

    tenant: str
    accelerator: str
    granted_hours: float = 0.0
    used_hours: float = 0.0
    cost: float | None = None  # None while no entry of the row has a price
    outcomes: Counter[str] = field(default_factory=Counter)  # final state → requests
    # Started calendar blocks by how they ended (KEPT_TO_END, RELEASED_EARLY): billed in full
    # either way.
    blocks: Counter[str] = field(default_factory=Counter)


class UsageService:
    """Answers usage questions from the stored entries."""

    def __init__(self, store: UsageLedger) -> None:
        self._store = store

    def summary(
        self, *, tenant: str | None = None, since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[UsageRow]:  # fmt: skip
        """Totals per (tenant, accelerator) over requests that ended in ``[since, until)``,
        sorted by tenant then accelerator."""
        rows: dict[tuple[str, str], UsageRow] = {}
        for entry in self._store.usage(tenant):
            if since is not None and entry.ended_at < since:
                continue
            if until is not None and entry.ended_at >= until:
                continue
            key = (entry.tenant, entry.accelerator)
            row = rows.setdefault(key, UsageRow(tenant=entry.tenant, accelerator=entry.accelerator))
            row.granted_hours += entry.granted_hours
            row.used_hours += entry.used_hours
            row.outcomes[entry.outcome.value] += 1
            ending = block_ending(entry)
            if ending is not None:
                row.blocks[ending] += 1
            if entry.cost is not None:
                row.cost = (row.cost or 0.0) + entry.cost
        return [rows[key] for key in sorted(rows)]

    def daily(self, today: date, days: int, *, tenant: str | None = None) -> list[DailySeries]:
        """Per tenant with usage in the ``days`` UTC days ending with ``today`` (or only
        ``tenant``'s), its used hours and cost per day (see the module docstring), sorted by
        tenant. ``days`` runs from 1 to :data:`MAX_DAYS`."""
        if not 1 <= days <= MAX_DAYS:
            raise ValueError(f"days must be between 1 and {MAX_DAYS}, not {days}")
        first = today - (days - 1) * DAY
        series = tuple(first + n * DAY for n in range(days))
        used: dict[str, list[float]] = {}
        cost: dict[str, list[float | None]] = {}
        for entry in self._store.usage(tenant):
            for day, share in day_shares(entry):
                if not first <= day <= today:
                    continue
                index = (day - first).days
                hours = used.setdefault(entry.tenant, [0.0] * days)
                costs = cost.setdefault(entry.tenant, [None] * days)
                hours[index] += entry.used_hours * share
                if entry.cost is not None:
                    costs[index] = (costs[index] or 0.0) + entry.cost * share
        return [
            DailySeries(name, series, tuple(used[name]), tuple(cost[name])) for name in sorted(used)
        ]


@dataclass(frozen=True, slots=True)
class DailySeries:
    """One tenant's used accelerator-hours and cost per UTC day, oldest first, one value per
    day of the series (``cost`` None on a day none of its entries has a price)."""

    tenant: str
    days: tuple[date, ...]
    used_hours: tuple[float, ...]
    cost: tuple[float | None, ...]


def day_shares(entry: UsageEntry) -> Iterator[tuple[date, float]]:
    """The UTC days ``entry``'s run covered and the share of it in each (the shares add up to
    1): the run's time from ``started_at`` to ``ended_at``; one that never ran (or took no
    time) wholly on the day it ended."""
    start, end = entry.started_at, entry.ended_at
    if start is None or start >= end:
        yield entry.ended_at.astimezone(UTC).date(), 1.0
        return
    whole = end - start
    day = start.astimezone(UTC).date()
    while True:
        midnight = datetime.combine(day, time(), UTC)
        covered = min(end, midnight + DAY) - max(start, midnight)
        if covered > timedelta(0):
            yield day, covered / whole
        if midnight + DAY >= end:
            return
        day += DAY
