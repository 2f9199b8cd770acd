"""Baseline schedulers for trace replay, on the same jobs and pools as opendws: greedy list
scheduling with no reservations and no preemption.

- ``fifo``: best-effort FIFO. At every event, every queued job that fits starts, in arrival
  order; a job that does not fit is passed over.
- ``strict_fifo``: head-of-line FIFO. A job that does not fit blocks every later job that could
  use one of its pools.
- ``sjf``: the greedy list scheduling of ``fifo``, ordered by the jobs' real durations (an
  oracle no real scheduler has).
- ``sjf_asked``: the same, ordered by the durations users ask for (:attr:`TraceJob.asked`,
  the real one rounded up to the hour): what a scheduler that knows only the request can do,
  and what opendws knows.

Every policy runs a job for its real duration, capped at a flex-start run's 7 days, places it
in the first of its pools with room, counts a tenant's quota (if the pools file gives one) as
a hard cap on the GPUs it holds at once, and gives a job up when it has waited 7 days.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from opendws.replay.traces import MAX_WAIT, PoolsFile, TraceJob


class Policy(StrEnum):
    """Who decides which job starts."""

    OPENDWS = "opendws"  # the real admission core and reconciler (opendws.replay.runner)
    FIFO = "fifo"
    STRICT_FIFO = "strict_fifo"
    SJF = "sjf"
    SJF_ASKED = "sjf_asked"


@dataclass(frozen=True, slots=True)
class Announced:
    """One ETA opendws announced for a waiting job: when, the start it promised, and the
    reason the event gave."""

    at: datetime
    eta: datetime
    reason: str | None
    # When its capacity was expected to run (eta + the pool's learned admission → ACTIVE
    # median, and 90th percentile); None while the pool had too few samples.
    ready_eta: datetime | None = None
    ready_eta_p90: datetime | None = None
    # The event named Google's lateness as why the ETA moved later (runs admitted ahead of it
    # not served by the pool's usual time: a cause outside the plan).
    google_late: bool = False


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What became of one job under one policy."""

    job: TraceJob
    started_at: datetime | None  # None: it never started; else when its capacity ran
    pool: str | None
    timed_out: bool = False
    # opendws: every ETA announced while it waited, in order (the baselines announce none).
    etas: tuple[Announced, ...] = ()
    # opendws behind Google's queue (GoogleQueue): when it was admitted, before Google served
    # it; None where admission is the start (no queue, and every baseline).
    admitted_at: datetime | None = None

    @property
    def admitted(self) -> datetime | None:
        """When the scheduler let it go: what an ``eta`` promises."""
        return self.started_at if self.admitted_at is None else self.admitted_at

    @property
    def finished_at(self) -> datetime | None:
        return None if self.started_at is None else self.started_at + self.job.runs


_Key = Callable[[TraceJob], tuple[object, ...]]
_ORDER: dict[Policy, _Key] = {
    Policy.FIFO: lambda job: (job.submitted_at, job.job_id),
    Policy.STRICT_FIFO: lambda job: (job.submitted_at, job.job_id),
    Policy.SJF: lambda job: (job.runs, job.submitted_at, job.job_id),
    Policy.SJF_ASKED: lambda job: (job.asked, job.submitted_at, job.job_id),
}

# Event kinds, in the order they are handled at one instant: what ends frees its GPUs before
# anything new is looked at; a job due to time out may still start at its last moment.
_FINISH, _ARRIVE, _TIMEOUT = 0, 1, 2


def list_schedule(jobs: Sequence[TraceJob], pools: PoolsFile, policy: Policy) -> list[JobOutcome]:
    """Replay ``jobs`` on ``pools`` under a baseline ``policy``; one outcome per job, in the
    jobs' order."""
    if policy is Policy.OPENDWS:
        raise ValueError("opendws is replayed by opendws.replay, not by list scheduling")
    key = _ORDER[policy]
    strict = policy is Policy.STRICT_FIFO
    free = pools.capacity()
    all_pools = tuple(free)
    caps = {tenant.name: tenant.quota for tenant in pools.tenants}
    held: dict[str, int] = dict.fromkeys(caps, 0)
    counter = itertools.count()
    events: list[tuple[datetime, int, int, int]] = []  # (time, kind, seq, job index)
    for index, job in enumerate(jobs):
        heapq.heappush(events, (job.submitted_at, _ARRIVE, next(counter), index))
    queue: list[tuple[tuple[object, ...], int]] = []  # sorted by key
    waiting: set[int] = set()
    started: dict[int, tuple[datetime, str]] = {}
    timed_out: set[int] = set()

    while events:
        now = events[0][0]
        expired = False
        while events and events[0][0] == now:
            _, kind, _, index = heapq.heappop(events)
            job = jobs[index]
            if kind == _FINISH:
                pool = started[index][1]
                free[pool] += job.gpus
                if job.tenant in held:
                    held[job.tenant] -= job.gpus
            elif kind == _ARRIVE:
                waiting.add(index)
                bisect.insort(queue, (key(job), index))
                heapq.heappush(events, (now + MAX_WAIT, _TIMEOUT, next(counter), index))
            elif index in waiting:  # _TIMEOUT of a job still waiting
                waiting.discard(index)
                timed_out.add(index)
                expired = True
        if expired:
            queue = [(order, index) for order, index in queue if index in waiting]
        # Start what fits, in policy order.
        blocked: set[str] = set()
        remaining: list[tuple[tuple[object, ...], int]] = []
        most_free = max(free.values())
        for position, (order, index) in enumerate(queue):
            if most_free <= 0:  # nothing can start: keep the rest as it is
                remaining.extend(queue[position:])
                break
            job = jobs[index]
            allowed = job.pools or all_pools
            if strict and blocked.intersection(allowed):
                remaining.append((order, index))
                continue
            chosen = _first_fit(job, allowed, free, caps, held)
            if chosen is None:
                remaining.append((order, index))
                if strict:
                    blocked.update(allowed)
                continue
            free[chosen] -= job.gpus
            most_free = max(free.values())
            if job.tenant in held:
                held[job.tenant] += job.gpus
            waiting.discard(index)
            started[index] = (now, chosen)
            heapq.heappush(events, (now + job.runs, _FINISH, next(counter), index))
        queue = remaining

    return [
        JobOutcome(
            job=job,
            started_at=started[index][0] if index in started else None,
            pool=started[index][1] if index in started else None,
            timed_out=index in timed_out,
        )
        for index, job in enumerate(jobs)
    ]


def _first_fit(
    job: TraceJob,
    allowed: Iterable[str],
    free: dict[str, int],
    caps: dict[str, int],
    held: dict[str, int],
) -> str | None:
    if job.tenant in caps and held[job.tenant] + job.gpus > caps[job.tenant]:
        return None
    for pool in allowed:
        if free[pool] >= job.gpus:
            return pool
    return None
