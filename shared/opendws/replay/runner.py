"""Trace replay: the real scheduler on a workload trace, on a virtual clock (a frozen
:class:`~opendws.clock.ManualClock` that the replay moves from event to event, never backwards),
side by side with the baselines of :mod:`opendws.replay.baselines` on the same input.

The ``opendws`` policy is not a model of opendws: each job is stored as a flex_start request
(one VM of one GPU per traced GPU, all in one pool; run duration as its user would ask, see
:attr:`TraceJob.asked`; max_wait 7 days), and the real :class:`ReconcileService` — snapshot,
the admission core, fenced writes, provisioning, timers — runs its passes over in-memory
adapters and an in-memory cloud whose VMs are ready at once. A job releases its capacity
through the real :class:`EndService` when its real duration ends; one that runs into its asked
duration is ended by its release timer, and one still waiting after max_wait is timed out by
the admission core.

Behind Google's queue (``google_queue``, a :class:`~opendws.replay.google_queue.GoogleQueue`)
the cloud serves each order after its own wait instead: a job is admitted at PROVISIONING
(:attr:`JobOutcome.admitted_at`, what an ETA promises) and its real duration runs from ACTIVE
(:attr:`JobOutcome.started_at`), and the replay also wakes when the cloud serves an order.

Passes run when something happens: a job arrives or ends, a timer is due, or a held start time
comes (the last plan's earliest, :attr:`PassReport.next_start`, or a pending request's
announced ETA). Pools that no job and no tenant quota connect are replayed
apart: nothing one of them does can change another.
"""

from __future__ import annotations

import functools
import gc
import heapq
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from queue import Queue
from typing import Any

from opendws.adapters.memory import (
    MemoryCapacityProvider,
    MemoryConfigStore,
    MemoryEventBus,
    MemoryNudger,
    MemoryRequestStore,
)
from opendws.clock import ManualClock
from opendws.domain.model import (
    CapacityRequest,
    GangShape,
    Mode,
    PolicySettings,
    Pool,
    Provider,
    QueueingStrategy,
    Quota,
    Tenant,
)
from opendws.domain.states import RequestState
from opendws.ports import Configuration, Providers, StatusEvent, Timer, accepted
from opendws.replay.baselines import Announced, JobOutcome, Policy, list_schedule
from opendws.replay.google_queue import GoogleQueue
from opendws.replay.metrics import PolicyReport, summarize
from opendws.replay.traces import MAX_WAIT, PoolsFile, TraceJob, check_jobs_fit
from opendws.service.reconcile import GOOGLE_LATE, ReconcileService
from opendws.service.reconcile_settings import ReconcileSettings
from opendws.service.release import EndService
from opendws.service.timers import expiry_timer

# Every traced GPU is one VM of a one-GPU machine type, so a pool's units are its GPUs.
MACHINE_TYPE = "a2-highgpu-1g"
ACCELERATOR = "nvidia-tesla-a100"
HOLDER = "replay"
S = RequestState


class HeapTimerQueue:
    """A TimerQueue for replay: armed timers in a heap (deletion is lazy), so the next due
    time and the due timers come without looking at every armed one."""

    def __init__(self) -> None:
        self._heap: list[tuple[datetime, str, Timer]] = []
        self._armed: dict[str, datetime] = {}
        self._used: set[str] = set()

    def arm(self, timer: Timer, now: datetime) -> None:
        if timer.name in self._used:
            return  # the same timer again: one task, as Cloud Tasks does
        self._used.add(timer.name)
        due = timer.due_at(now)
        self._armed[timer.name] = due
        heapq.heappush(self._heap, (due, timer.name, timer))

    def disarm(self, timer: Timer) -> None:
        self._armed.pop(timer.name, None)

    def next_due(self) -> datetime | None:
        self._drop_disarmed()
        return self._heap[0][0] if self._heap else None

    def take_due(self, now: datetime) -> list[Timer]:
        due: list[Timer] = []
        self._drop_disarmed()
        while self._heap and self._heap[0][0] <= now:
            _, name, timer = heapq.heappop(self._heap)
            if self._armed.pop(name, None) is not None:
                due.append(timer)
            self._drop_disarmed()
        return due

    def _drop_disarmed(self) -> None:
        while self._heap and self._heap[0][1] not in self._armed:
            heapq.heappop(self._heap)


@dataclass(frozen=True, slots=True)
class Replayed:
    """One policy's outcomes and how long the replay took."""

    policy: Policy
    outcomes: list[JobOutcome]
    wall_s: float

    def report(self, capacity: int) -> PolicyReport:
        return summarize(self.policy.value, self.outcomes, capacity, self.wall_s)


# The opendws policy ----------------------------------------------------------------------------


def zones_of(pools: PoolsFile) -> dict[str, str]:
    """A zone of its own for every pool (pool order), so a job's pools are its locations."""
    return {pool.name: f"replay-pool{index}-a" for index, pool in enumerate(pools.pools, 1)}


def configuration(
    pools: PoolsFile, tenants: Sequence[str], policy: PolicySettings | None = None
) -> Configuration:
    """The scheduler's configuration for a replay: one MIG pool per pool, and every tenant —
    with its quota from the pools file, else room for all the GPUs there are; ``policy``, or
    the default admission order."""
    zones = zones_of(pools)
    domain_pools = tuple(
        Pool(
            pool_id=pool.name,
            zone=zones[pool.name],
            shape=MACHINE_TYPE,
            accelerator=ACCELERATOR,
            provider=Provider.MIG,
            capacity=pool.capacity,
        )
        for pool in pools.pools
    )
    total = sum(pool.capacity for pool in pools.pools)
    given = {tenant.name: tenant for tenant in pools.tenants}
    domain_tenants = []
    for name in sorted(set(tenants) | set(given)):
        spec = given.get(name)
        quota = Quota(
            accelerator=ACCELERATOR,
            nominal=total if spec is None else spec.quota,
            borrowing_limit=None if spec is None else spec.borrowing_limit,
        )
        domain_tenants.append(
            Tenant(
                name=name,
                quotas=(quota,),
                cohort=None if spec is None else spec.cohort,
                queueing=QueueingStrategy.STRICT_FIFO
                if spec is not None and spec.strict_fifo
                else QueueingStrategy.BEST_EFFORT,
            )
        )
    return Configuration(
        pools=domain_pools, tenants=tuple(domain_tenants), policy=policy or PolicySettings()
    )


def as_request(job: TraceJob, zones: dict[str, str]) -> CapacityRequest:
    """The flex_start request a traced job's user makes."""
    allowed = job.pools or tuple(zones)
    return CapacityRequest(
        request_id=job.job_id,
        tenant=job.tenant,
        mode=Mode.FLEX_START,
        gang=GangShape(
            vm_count=job.gpus,
            machine_type=MACHINE_TYPE,
            accelerator=ACCELERATOR,
            accelerators_per_vm=1,
        ),
        locations=tuple(zones[name] for name in allowed),
        run_duration=job.asked,
        submitted_at=job.submitted_at,
        max_wait=MAX_WAIT,
    )


# How a replay tells its progress: (jobs that reached a final state since the last call,
# the virtual clock's instant then). Called from the replaying process only.
Progress = Callable[[int, datetime], None]
PROGRESS_EVERY = 500  # jobs between two progress calls of one part (and at its end)
FREEZE_EVERY = 1_000  # jobs ended between two freezes of the replay's history (_kept_history)


def replay_opendws(
    jobs: Sequence[TraceJob],
    pools: PoolsFile,
    *,
    workers: int = 1,
    policy: PolicySettings | None = None,
    progress: Progress | None = None,
    google_queue: GoogleQueue | None = None,
) -> list[JobOutcome]:
    """Replay ``jobs`` through the real reconciler (see the module docstring), under
    ``policy`` (default: the default admission order); with ``workers`` > 1, independent
    parts run in that many processes, largest first. ``progress`` hears of every
    :data:`PROGRESS_EVERY` jobs done, in this process. ``google_queue``: Google serves each
    order after that wait, not at once."""
    parts = sorted(components(jobs, pools), key=lambda part: -len(part[0]))
    outcomes: dict[str, JobOutcome] = {}
    if workers <= 1 or len(parts) == 1:
        for part_jobs, part_pools in parts:
            outcomes.update(
                _replay_component(part_jobs, part_pools, policy, progress, google_queue)
            )
    else:
        with multiprocessing.Manager() as manager, ProcessPoolExecutor(workers) as executor:
            # The parts report through a queue; a thread here passes it on.
            heard = manager.Queue() if progress is not None else None
            relay = _relay(heard, progress)
            told = None if heard is None else functools.partial(_put, heard)
            futures = [
                executor.submit(_replay_component, *part, policy, told, google_queue)
                for part in parts
            ]
            try:
                for future in futures:
                    outcomes.update(future.result())
            finally:
                if heard is not None and relay is not None:
                    heard.put(None)
                    relay.join()
    return [outcomes[job.job_id] for job in jobs]


def _put(heard: Queue[Any], done: int, at: datetime) -> None:
    """A part's progress, from its process to the replaying one."""
    heard.put((done, at))


def _relay(heard: Queue[Any] | None, progress: Progress | None) -> threading.Thread | None:
    """A thread that calls ``progress`` with what the parts put on ``heard`` (None ends it)."""
    if heard is None or progress is None:
        return None

    def run() -> None:
        while (item := heard.get()) is not None:
            progress(*item)

    thread = threading.Thread(target=run, name="replay-progress", daemon=True)
    thread.start()
    return thread


def _replay_component(
    jobs: Sequence[TraceJob],
    pools: PoolsFile,
    policy: PolicySettings | None,
    progress: Progress | None = None,
    google_queue: GoogleQueue | None = None,
) -> dict[str, JobOutcome]:
    ordered = sorted(jobs, key=lambda job: (job.submitted_at, job.job_id))
    clock = ManualClock(ordered[0].submitted_at)
    store = MemoryRequestStore()
    config = MemoryConfigStore(configuration(pools, [job.tenant for job in ordered], policy))
    cloud = MemoryCapacityProvider(
        clock,
        latency=timedelta(0),
        latency_of=None if google_queue is None else google_queue.wait,
    )
    zones = zones_of(pools)
    for pool in pools.pools:
        cloud.set_stock(zones[pool.name], MACHINE_TYPE, pool.capacity)
    providers = Providers(mig_flex=cloud, tpu=cloud, calendar=cloud)
    bus = MemoryEventBus()
    timers = HeapTimerQueue()
    # The cloud here is in memory and the clock virtual: no budget of calls per (wall-clock)
    # minute, which is there for Google's rate quotas and would stall a replay's bursts.
    reconciler = ReconcileService(
        store, config, providers, bus, clock, holder=HOLDER, timers=timers,
        settings=ReconcileSettings(cloud_calls_per_minute=None),
    )  # fmt: skip
    ending = EndService(store, config, providers, timers, bus, MemoryNudger(), clock)

    by_id = {job.job_id: job for job in ordered}
    started: dict[str, tuple[datetime, str]] = {}  # job id → (its capacity ran, pool)
    admitted: dict[str, datetime] = {}  # behind Google's queue: job id → admitted at
    timed_out: set[str] = set()
    etas: dict[str, list[Announced]] = {}  # job id → the ETAs announced while it waited
    finishes: list[tuple[datetime, str]] = []  # (real end, job id)
    cursor = 0  # events of the bus already read
    arrivals = iter(ordered)
    upcoming: TraceJob | None = next(arrivals, None)
    live = 0  # requests not yet in a final state
    done = 0  # jobs that reached a final state since progress was last told
    next_start: datetime | None = None  # the last pass's earliest held start

    settled = 0  # jobs that reached a final state since the history was last frozen
    with _kept_history() as freeze:
        while upcoming is not None or live:
            candidates = [
                moment
                for moment in (
                    upcoming.submitted_at if upcoming is not None else None,
                    finishes[0][0] if finishes else None,
                    timers.next_due(),
                    next_start if next_start is not None and next_start > clock.now() else None,
                    _next_held_start(store, clock.now()),
                    # Behind Google's queue: when it serves the next order (a pass then sees it).
                    None if google_queue is None else cloud.next_eligible(),
                )
                if moment is not None
            ]
            now = clock.set_at_least(min(candidates))
            while upcoming is not None and upcoming.submitted_at <= now:
                _submit(store, timers, as_request(upcoming, zones))
                live += 1
                upcoming = next(arrivals, None)
            while finishes and finishes[0][0] <= now:
                _, job_id = heapq.heappop(finishes)
                ending.release(job_id, by_id[job_id].tenant)
            for timer in timers.take_due(now):
                ending.fire(timer)
            # With nothing waiting and nothing being created, a pass could only sweep runs that
            # their timers end anyway: skip it (most of a quiet pool's events).
            if store.count_in(S.PENDING, S.PROVISIONING):
                report = reconciler.run_pass()
                while report.ran and report.in_flight and not report.stale and google_queue is None:
                    report = reconciler.run_pass()  # the cloud is ready at once: see them through
                next_start = report.next_start
            for event in bus.published[cursor:]:
                if event.state is S.PENDING and event.eta is not None:
                    etas.setdefault(event.request_id, []).append(
                        Announced(
                            at=event.at,
                            eta=event.eta,
                            reason=event.reason,
                            ready_eta=event.ready_eta,
                            ready_eta_p90=event.ready_eta_p90,
                            google_late=GOOGLE_LATE in event.message,
                        )
                    )
                if google_queue is None:
                    ended = _account(event, now, by_id, started, timed_out, finishes)
                else:
                    ended = _account_queued(
                        event, now, by_id, started, admitted, timed_out, finishes
                    )
                live -= ended
                done += ended
                settled += ended
            if settled >= FREEZE_EVERY:
                freeze()
                settled = 0
            cursor = len(bus.published)
            if progress is not None and (done >= PROGRESS_EVERY or not (live or upcoming)):
                progress(done, now)
                done = 0

    return {
        job.job_id: JobOutcome(
            job=job,
            started_at=started[job.job_id][0] if job.job_id in started else None,
            pool=started[job.job_id][1] if job.job_id in started else None,
            timed_out=job.job_id in timed_out,
            etas=tuple(etas.get(job.job_id, ())),
            admitted_at=admitted.get(job.job_id),
        )
        for job in ordered
    }


@contextmanager
def _kept_history() -> Iterator[Callable[[], None]]:
    """What keeps a replay's history out of the cyclic collector's way: a replay keeps all of
    it in memory to its end (the memory store's records and events, the bus, the outcomes),
    and every full collection would scan it again as it grows. Yields a function that
    freezes what is alive now (``gc.freeze``: refcounting still frees it; only the cyclic
    collector no longer looks at it), called every :data:`FREEZE_EVERY` jobs ended; at the
    end, what was frozen goes back to the collector. If objects were frozen already, by
    whoever runs the replay, it freezes nothing (unfreezing would hand theirs back too)."""
    if gc.get_freeze_count():
        yield lambda: None
        return
    try:
        yield gc.freeze
    finally:
        gc.unfreeze()


def _account(
    event: StatusEvent,
    now: datetime,
    jobs: dict[str, TraceJob],
    started: dict[str, tuple[datetime, str]],
    timed_out: set[str],
    finishes: list[tuple[datetime, str]],
) -> int:
    """Record what ``event`` says about its job; 1 if the job reached a final state."""
    job_id = event.request_id
    if event.state is S.PROVISIONING and job_id not in started:
        started[job_id] = (event.at, event.pool or "")
        heapq.heappush(finishes, (event.at + jobs[job_id].runs, job_id))
    elif event.state is S.TIMED_OUT:
        timed_out.add(job_id)
    if event.state.is_final:
        if event.state is S.REJECTED:
            raise ValueError(f"opendws rejected job {job_id} at {now}: {event.message}")
        return 1
    return 0


def _account_queued(
    event: StatusEvent,
    now: datetime,
    jobs: dict[str, TraceJob],
    started: dict[str, tuple[datetime, str]],
    admitted: dict[str, datetime],
    timed_out: set[str],
    finishes: list[tuple[datetime, str]],
) -> int:
    """:func:`_account` behind Google's queue: a job is admitted at PROVISIONING and its
    capacity runs — its real duration counted — from ACTIVE, when Google served it."""
    job_id = event.request_id
    if event.state is S.PROVISIONING:
        admitted.setdefault(job_id, event.at)
        return 0
    if event.state is S.ACTIVE and job_id not in started:
        started[job_id] = (event.at, event.pool or "")
        heapq.heappush(finishes, (event.at + jobs[job_id].runs, job_id))
        return 0
    return _account(event, now, jobs, started, timed_out, finishes)


def _next_held_start(store: MemoryRequestStore, now: datetime) -> datetime | None:
    """The soonest ETA of a pending request that lies ahead: when a held start comes due."""
    ahead = [
        record.eta
        for record in store.in_states_unordered(S.PENDING)
        if record.eta is not None and record.eta > now
    ]
    return min(ahead) if ahead else None


def _submit(store: MemoryRequestStore, timers: HeapTimerQueue, request: CapacityRequest) -> None:
    """Store ``request`` as intake does, its first event announced and its expiry timer armed
    (which wakes the replay at its deadline even when nothing else happens)."""
    record, event = accepted(request, request.submitted_at)
    store.create(record, event)
    store.mark_announced(request.request_id, 1)
    timers.arm(expiry_timer(record), request.submitted_at)


# Partitions and the comparison -----------------------------------------------------------------


def components(
    jobs: Sequence[TraceJob], pools: PoolsFile
) -> list[tuple[list[TraceJob], PoolsFile]]:
    """Split a replay into parts that cannot affect each other: pools joined by a job that may
    use several of them, or by a tenant whose quota spans them, stay together."""
    parent = {pool.name: pool.name for pool in pools.pools}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    def join(names: Sequence[str]) -> None:
        for name in names[1:]:
            parent[root(name)] = root(names[0])

    everything = [pool.name for pool in pools.pools]
    quota_pools: dict[str, set[str]] = {}
    limited = {tenant.name for tenant in pools.tenants}
    for job in jobs:
        allowed = list(job.pools) or everything
        join(allowed)
        if job.tenant in limited:
            quota_pools.setdefault(job.tenant, set()).update(allowed)
    for spanned in quota_pools.values():
        join(sorted(spanned))
    groups: dict[str, list[TraceJob]] = {}
    for job in jobs:
        groups.setdefault(root((job.pools or tuple(everything))[0]), []).append(job)
    parts = []
    for key in sorted(groups):
        names = {name for name in everything if root(name) == key}
        part_pools = PoolsFile(
            pools=tuple(pool for pool in pools.pools if pool.name in names),
            tenants=tuple(
                tenant for tenant in pools.tenants
                if tenant.name in {job.tenant for job in groups[key]}
            ),
        )  # fmt: skip
        parts.append((groups[key], part_pools))
    return parts


def replay(
    jobs: Sequence[TraceJob],
    pools: PoolsFile,
    policy: Policy,
    *,
    workers: int = 1,
    settings: PolicySettings | None = None,
    progress: Progress | None = None,
) -> Replayed:
    """Replay ``jobs`` on ``pools`` under ``policy``, timed (``workers``: processes for the
    opendws replay's independent parts; ``settings``: opendws's admission order;
    ``progress``: told of the jobs done as they are — a baseline's all at its end)."""
    check_jobs_fit(jobs, pools)
    started = time.perf_counter()
    if policy is Policy.OPENDWS:
        outcomes = replay_opendws(jobs, pools, workers=workers, policy=settings, progress=progress)
    else:
        outcomes = list_schedule(jobs, pools, policy)
        if progress is not None and jobs:
            progress(len(jobs), max(job.submitted_at for job in jobs))
    return Replayed(policy=policy, outcomes=outcomes, wall_s=time.perf_counter() - started)


def replay_many(
    jobs: Sequence[TraceJob],
    pools: PoolsFile,
    policies: Sequence[Policy],
    *,
    workers: int = 1,
    settings: PolicySettings | None = None,
    progress: Callable[[Policy], Progress] | None = None,
) -> dict[Policy, Replayed]:
    """Replay under each policy, one after the other; ``workers`` processes share the opendws
    replay's independent parts (the baselines take seconds); ``settings``: opendws's
    admission order (default: the default one); ``progress``: each policy's reporter."""
    check_jobs_fit(jobs, pools)
    return {
        policy: replay(
            jobs,
            pools,
            policy,
            workers=workers,
            settings=settings,
            progress=None if progress is None else progress(policy),
        )
        for policy in policies
    }
