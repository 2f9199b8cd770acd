"""Google's own queue, for a replay: how long Google takes to serve an order opendws created.

opendws's ``eta`` is when opendws admits a request. A flex-start resize request or queued
resource then waits in Google's queue: "the MIG schedules Flex-start VM creation as soon as
resources are available", Dynamic Workload Scheduler ordering the requests "based on requested
durations and resource availability" (cloud.google.com/compute/docs/instance-groups/
about-resize-requests-mig). Google publishes no distribution of that wait, so a replay that
shows ``ready_eta`` (``eta`` plus the pool's learned admission → ACTIVE time) needs an assumed
one: :class:`GoogleQueue` draws each order's wait from a log-normal distribution with the
median and 90th percentile given, deterministically from the order's name (the same replay
gives the same waits in any process, on any machine).

The simulated cloud (:class:`~opendws.adapters.memory.MemoryCapacityProvider`) applies it as
each order's provisioning latency: the order is CREATING for that long, then served.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import timedelta
from statistics import NormalDist

# The standard normal's 90th percentile: a log-normal's p90 is its median × exp(σ × this).
_Z90 = NormalDist().inv_cdf(0.9)
_SPAN = 1 << 64  # the draws' resolution: 64 bits of each order's hash


@dataclass(frozen=True, slots=True)
class GoogleQueue:
    """Each order's wait in Google's queue: log-normal with ``median`` and ``p90``, drawn from
    the order's name and ``seed``. ``p90 == median`` gives every order the same wait."""

    median: timedelta
    p90: timedelta
    seed: int = 0

    def __post_init__(self) -> None:
        if self.median <= timedelta(0):
            raise ValueError(f"Google's queue: the median wait must be positive, not {self.median}")
        if self.p90 < self.median:
            raise ValueError(
                f"Google's queue: the 90th percentile ({self.p90}) is below the median "
                f"({self.median})"
            )

    def wait(self, order_name: str) -> timedelta:
        """How long Google takes to serve the order ``order_name`` (whole seconds, at least
        one)."""
        digest = hashlib.sha256(f"{self.seed}:{order_name}".encode()).digest()
        # The middle of one of 2**64 equal slices of (0, 1): never 0 or 1 exactly.
        share = (int.from_bytes(digest[:8], "big") + 0.5) / _SPAN
        sigma = math.log(self.p90 / self.median) / _Z90
        seconds = self.median.total_seconds() * math.exp(sigma * NormalDist().inv_cdf(share))
        return timedelta(seconds=max(1, round(seconds)))

    def describe(self) -> str:
        """One line for a report: the distribution in minutes."""
        median, p90 = self.median / timedelta(minutes=1), self.p90 / timedelta(minutes=1)
        return f"Google's queue: log-normal, median {median:g} min, p90 {p90:g} min"
