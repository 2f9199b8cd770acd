"""Calendar blocks: each decided on exact step profiles of committed usage
(:class:`ExactLedger`), confirmed in its most preferred pool where it fits as asked or refused
with the nearest starts that would fit (:func:`decide_block`); and the starts a refused or
declined block is offered (:func:`calendar_alternatives`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime

from opendws.domain.calendar import lead_of
from opendws.domain.model import CapacityRequest, Grant, Pool, Provider, Snapshot
from opendws.domain.planner.shapes import Candidate, PoolIndex
from opendws.domain.planner.verdicts import Alternative, Decision, Outcome, Reason
from opendws.domain.quotas import LimitKey, QuotaBook
from opendws.domain.timeline import MICROSECOND, StepProfile, feasible_starts

# How many alternative start times a refused calendar block is offered.
ALTERNATIVES = 3


class ExactLedger:
    """Committed usage as exact step profiles (microseconds from now), for calendar blocks."""

    def __init__(
        self,
        now: datetime,
        pools: Sequence[Pool],
        pool_row: dict[str, int],
        quotas: QuotaBook,
        grants: Iterable[Grant],
        blocks: Iterable[Candidate] = (),
    ) -> None:
        """Profiles of ``grants``, with the start and end of each of ``blocks`` (the blocks
        that may be committed later) already breakpoints wherever it could be committed."""
        self.now = now
        self.pools = pools
        self.quotas = quotas
        self.pool_row = pool_row
        per_pool: list[list[tuple[int, int, int]]] = [[] for _ in pools]
        per_limit: dict[LimitKey, list[tuple[int, int, int]]] = defaultdict(list)
        for grant in grants:
            start, end = self.micros(grant.start_at), self.micros(grant.end_at)
            row = pool_row.get(grant.pool_id)
            if row is not None:
                per_pool[row].append((start, end, grant.units))
            for limit in quotas.limits(grant.tenant, grant.accelerator):
                per_limit[limit.key].append((start, end, grant.accelerator_units))
        pool_times: list[list[int]] = [[] for _ in pools]
        limit_times: dict[LimitKey, list[int]] = defaultdict(list)
        for block in blocks:
            request = block.request
            assert request.start_at is not None  # a calendar request always has one
            start = self.micros(request.start_at)
            edges = (start, start + request.run_duration // MICROSECOND)
            for row in block.pools:
                pool_times[row] += edges
            for limit in block.limits:
                limit_times[limit.key] += edges
        self.pool_usage = [
            StepProfile(intervals, times)
            for intervals, times in zip(per_pool, pool_times, strict=True)
        ]
        self.limit_usage: dict[LimitKey, StepProfile] = {
            key: StepProfile(per_limit.get(key, ()), limit_times.get(key, ()))
            for key in (*per_limit, *(key for key in limit_times if key not in per_limit))
        }

    def micros(self, at: datetime) -> int:
        """``at`` as integer microseconds from now."""
        return (at - self.now) // MICROSECOND

    def _limit_profile(self, key: LimitKey) -> StepProfile:
        profile = self.limit_usage.get(key)
        if profile is None:
            profile = self.limit_usage[key] = StepProfile()
        return profile

    def _window(self, request: CapacityRequest) -> tuple[int, int]:
        """The part of the block still ahead: [max(start, now), end)."""
        assert request.start_at is not None
        start = self.micros(request.start_at)
        return max(start, 0), start + request.run_duration // MICROSECOND

    def quota_fits(self, candidate: Candidate) -> bool:
        """True if the tenant's and cohort's quota hold over the block."""
        return self._quota_fits(candidate, *self._window(candidate.request))

    def _quota_fits(self, candidate: Candidate, start: int, end: int) -> bool:
        amount = candidate.request.gang.accelerator_units
        for limit in candidate.limits:
            if self._limit_profile(limit.key).peak(start, end) + amount > limit.amount:
                return False
        return True

    def first_fit(self, candidate: Candidate) -> int | None:
        """The most preferred pool row where the block fits exactly as asked."""
        start, end = self._window(candidate.request)
        if not self._quota_fits(candidate, start, end):
            return None
        units = candidate.request.gang.units
        for row in candidate.pools:
            pool = self.pools[row]
            if pool.short_until is not None and self.micros(pool.short_until) > start:
                continue
            if self.pool_usage[row].peak(start, end) + units <= pool.capacity:
                return row
        return None

    def commit(self, grant: Grant) -> None:
        """Add a confirmed block to the profiles."""
        start, end = self.micros(grant.start_at), self.micros(grant.end_at)
        row = self.pool_row.get(grant.pool_id)
        if row is not None:
            self.pool_usage[row].add(start, end, grant.units)
        for limit in self.quotas.limits(grant.tenant, grant.accelerator):
            self._limit_profile(limit.key).add(start, end, grant.accelerator_units)

    def alternatives(self, candidate: Candidate, spare: int = 0) -> tuple[Alternative, ...]:
        """The nearest start times (before or after the one asked) at which the whole block
        fits in some allowed pool, one per gap of feasible starts, at most ALTERNATIVES
        (``spare`` more, for a caller that filters some out)."""
        request = candidate.request
        assert request.start_at is not None
        wanted = self.micros(request.start_at)
        duration = request.run_duration // MICROSECOND
        lead = lead_of(request.gang.provider is Provider.TPU)
        latest = lead.latest // MICROSECOND
        amount = request.accelerator_units
        quota_blocked = [
            span
            for limit in candidate.limits
            for span in self._limit_profile(limit.key).above(limit.amount - amount)
        ]
        points: list[tuple[int, int, int, str]] = []
        for preference, row in enumerate(candidate.pools):
            pool = self.pools[row]
            earliest = (
                0
                if pool.short_until is None
                else max(0, -(-(pool.short_until - self.now) // MICROSECOND))
            )
            earliest = max(earliest, lead.earliest // MICROSECOND)
            blocked = self.pool_usage[row].above(pool.capacity - request.units) + quota_blocked
            for low, high in feasible_starts(blocked, duration, earliest, latest):
                nearest = min(max(wanted, low), high)
                points.append((abs(nearest - wanted), nearest, preference, pool.pool_id))
        points.sort()
        chosen: list[Alternative] = []
        seen: set[int] = set()
        for _, start, _, pool_id in points:
            if start in seen:
                continue
            seen.add(start)
            chosen.append(Alternative(start_at=self.now + start * MICROSECOND, pool_id=pool_id))
            if len(chosen) == ALTERNATIVES + spare:
                break
        return tuple(chosen)


def decide_block(
    ledger: ExactLedger, candidate: Candidate, decisions: dict[str, Decision]
) -> Grant | None:
    """Decide one calendar block on ``ledger`` (the grants and the blocks confirmed before
    it, in calendar order) and record the decision in ``decisions``; the grant it books if
    confirmed (the caller commits it)."""
    request = candidate.request
    assert request.start_at is not None  # a calendar request always has one
    row = ledger.first_fit(candidate)
    if row is not None:
        grant = Grant.of(request, ledger.pools[row].pool_id, request.start_at)
        decisions[request.request_id] = Decision(
            request_id=request.request_id,
            outcome=Outcome.CONFIRM,
            pool_id=grant.pool_id,
            start_at=grant.start_at,
            end_at=grant.end_at,
        )
        return grant
    quota_bound = not ledger.quota_fits(candidate)
    alternatives = ledger.alternatives(candidate)
    binding = "the tenant's quota is" if quota_bound else "the capacity is"
    decisions[request.request_id] = Decision(
        request_id=request.request_id,
        outcome=Outcome.REFUSE,
        reason=Reason.QUOTA if quota_bound else Reason.NO_CAPACITY,
        alternatives=alternatives,
        detail=(f"{binding} committed during the block from {request.start_at.isoformat()}"),
    )
    return None


def calendar_alternatives(
    snapshot: Snapshot, request: CapacityRequest, now: datetime,
    advised: Sequence[Alternative] = (), *, refused_in: str | None = None,
) -> tuple[Alternative, ...]:  # fmt: skip
    """The starts a refused or declined calendar block is offered: the ones Google's Advice
    API recommends (``advised``) at which our own timeline fits the block too, then our
    timeline's nearest feasible starts; at most ALTERNATIVES, earliest first, no start twice,
    and never the start asked in ``refused_in``, the pool where Google refused it.
    ``snapshot`` must not hold the block itself (its grants are everyone else's)."""
    index = PoolIndex(snapshot.pools)
    quotas = QuotaBook(sorted(snapshot.tenants, key=lambda t: t.name))
    allowed = index.allowed(request)
    if not allowed.pools or not quotas.knows(request.tenant):
        return ()
    limits = quotas.limits(request.tenant, request.gang.accelerator)
    # Every grant, in any order: a profile sums them (StepProfile).
    ledger = ExactLedger(now, index.pools, index.pool_row, quotas, snapshot.grants)
    chosen: dict[datetime, Alternative] = {}

    def refused(alternative: Alternative) -> bool:
        return (alternative.start_at, alternative.pool_id) == (request.start_at, refused_in)

    if refused_in is not None and request.start_at is not None:
        # The start asked, in another pool our plan fits it in: the nearest there is.
        others = tuple(row for row in allowed.pools if index.pools[row].pool_id != refused_in)
        row = ledger.first_fit(Candidate(request, others, limits, False)) if others else None
        if row is not None:
            pool_id = index.pools[row].pool_id
            google = any((a.start_at, a.pool_id) == (request.start_at, pool_id) for a in advised)
            chosen[request.start_at] = Alternative(
                start_at=request.start_at, pool_id=pool_id, advised=google
            )
    for alternative in sorted(advised, key=lambda a: (a.start_at, a.pool_id)):
        row = index.pool_row.get(alternative.pool_id)
        if row is None or row not in allowed.pools or alternative.start_at in chosen:
            continue
        if refused(alternative):
            continue
        moved = replace(request, start_at=alternative.start_at)
        if ledger.first_fit(Candidate(moved, (row,), limits, False)) is not None:
            chosen[alternative.start_at] = replace(alternative, advised=True)
        if len(chosen) == ALTERNATIVES:
            break
    for ours in ledger.alternatives(Candidate(request, allowed.pools, limits, False), spare=1):
        if len(chosen) == ALTERNATIVES:
            break
        if not refused(ours):
            chosen.setdefault(ours.start_at, ours)
    return tuple(sorted(chosen.values(), key=lambda a: a.start_at))
