"""The planner's shared value types: a screened request (:class:`Candidate`) and the pools it
may use (:class:`Allowed`, found by :class:`PoolIndex`); and the bookkeeping rules the full and
the incremental planner both follow, written once: which tenants queue strict FIFO, what a
request could put on each grid row (:func:`count_demand`), and when a row can bind at all
(:func:`binds`). (The other shared rules are :class:`admission._Pass`'s: screening, an entry's
cells, a grant's rows, a placement's decision; and ``timeline.covering``, a grant's cells.)"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from operator import itemgetter
from typing import NamedTuple

from opendws.domain.model import CapacityRequest, Pool, QueueingStrategy, Snapshot, region_of
from opendws.domain.quotas import Limit, LimitKey

# A sort key: a tuple's first field (a policy key, a slot's start).
by_first = itemgetter(0)


class Candidate(NamedTuple):
    """A screened request with the pools it may use (most preferred first) and its limits.
    (A named tuple: the planner makes one per pending request, so it must be cheap.)"""

    request: CapacityRequest
    pools: tuple[int, ...]  # indices into PoolIndex.pools
    limits: tuple[Limit, ...]
    strict: bool  # its tenant queues strict FIFO


class Allowed(NamedTuple):
    """The pools one (shape, locations) combination may use, and the largest one's capacity."""

    pools: tuple[int, ...]
    largest: int


class PoolIndex:
    """A snapshot's pools as rows (by pool_id), and which of them serve a request."""

    def __init__(self, pools: Iterable[Pool]) -> None:
        self.pools: tuple[Pool, ...] = tuple(sorted(pools, key=lambda p: p.pool_id))
        self.pool_row = {pool.pool_id: row for row, pool in enumerate(self.pools)}
        self.pool_ids = tuple(pool.pool_id for pool in self.pools)
        # (provider, shape, accelerator) → location (zone or region) → pool rows, ascending.
        self._pools_by_location: dict[tuple[str, str, str], dict[str, list[int]]] = {}
        for row, pool in enumerate(self.pools):
            by_location = self._pools_by_location.setdefault(
                (pool.provider, pool.shape, pool.accelerator), defaultdict(list)
            )
            by_location[pool.zone].append(row)
            by_location[region_of(pool.zone)].append(row)
        self._allowed_cache: dict[tuple[str | None, str, tuple[str, ...]], Allowed] = {}

    def allowed(self, request: CapacityRequest) -> Allowed:
        """Pools that serve the request, most preferred location first, then by pool_id."""
        gang = request.gang
        # The machine type (None for TPU gangs) and accelerator determine the pool shape.
        key = (gang.machine_type, gang.accelerator, request.locations)
        cached = self._allowed_cache.get(key)
        if cached is None:
            by_location = self._pools_by_location.get(
                (gang.provider, gang.shape, gang.accelerator), {}
            )
            allowed = list(
                dict.fromkeys(
                    row for location in request.locations for row in by_location.get(location, ())
                )
            )
            largest = max((self.pools[row].capacity for row in allowed), default=0)
            cached = self._allowed_cache[key] = Allowed(tuple(allowed), largest)
        return cached


def strict_tenants(snapshot: Snapshot) -> frozenset[str]:
    """The tenants whose requests queue strict FIFO."""
    return frozenset(
        tenant.name
        for tenant in snapshot.tenants
        if tenant.queueing is QueueingStrategy.STRICT_FIFO
    )


def count_demand(
    demand: list[int],
    candidate: Candidate,
    limit_row: Mapping[LimitKey, int],
    race_width: int,
    sign: int = 1,
) -> None:
    """Add (``sign`` 1) or take away (-1) what ``candidate`` could put on each grid row: its
    gang on each of its pools, and on each of its quota limits its accelerators once per lane
    it may race in (one per pool, up to ``race_width``)."""
    gang = candidate.request.gang
    for row in candidate.pools:
        demand[row] += sign * gang.units
    lanes = min(race_width, len(candidate.pools))
    for limit in candidate.limits:
        demand[limit_row[limit.key]] += sign * gang.accelerator_units * lanes


def binds(demand: int, lowest: int) -> bool:
    """Whether a grid row can bind at all: some request could land on it (``demand``) and its
    ``lowest`` free amount anywhere is less than all of them together. A row that cannot is
    neither searched nor updated (an exact shortcut, not a heuristic)."""
    return demand > 0 and lowest < demand
