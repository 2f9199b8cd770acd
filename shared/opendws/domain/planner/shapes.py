"""The planner's shared value types: a screened request (:class:`Candidate`) and the pools it
may use (:class:`Allowed`, found by :class:`PoolIndex`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

from opendws.domain.model import CapacityRequest, Pool, region_of
from opendws.domain.quotas import Limit


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
