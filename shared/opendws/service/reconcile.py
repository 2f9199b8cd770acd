"""Reconcile: turn admission decisions into cloud capacity, safely under retries, crashes and
concurrent runs. One pass reads as the numbered cycle of the design:

1. Take the reconciler lease (holder, expiry, fencing token). Without it, ask its holder for one
   more pass when its own ends (nudges during a pass are coalesced, never dropped) and do
   nothing; with it, every write of this pass carries the token and is refused once another
   reconciler takes over. Then bring the mirror of the requests not yet final up to date,
   reading only what changed since the last pass (:mod:`opendws.service.mirror`).
2. Observe the providers: every resource opendws owns in the pools where something may have
   changed — those with a live order, those where a request ended or a release was asked
   since, and those where the last look found something no live request wanted — and in
   every configured pool on an instance's first pass and every ``observe_all_every`` after.
3. Sweep the live requests against what was observed, through the pure table of
   ``opendws.domain.sweep``: provisioning that Google served (ACTIVE; a race's other orders
   cancelled), that waits in Google's queue (kept there until max_wait, its pool marked short),
   that failed for good (back in line for its other pools); runs past their end; calendar
   blocks under Google's review (approved: BOOKED; declined: REJECTED with alternatives),
   that start or end; provider calls a crash interrupted, issued again; and anything owned
   that no live request wants, released (a leak) — except a released block Google keeps,
   and bills, to its end. A request whose last sweep did nothing is swept again only once
   its record or what was observed of it changes, or its next deadline comes
   (``steady_until``); right after a pass whose sweep ran to its end, only the requests the
   mirror or the look names as changed, or whose deadline came, are looked at
   (``_sweep_again``).
4. Build an immutable snapshot from parts kept between passes, built again only for the
   requests that changed (:mod:`opendws.service.parts`), and call the pure admission core,
   through the service's incremental planner: the same plan as ``admit``, made from the last
   one where the changes allow (``opendws.domain.incremental``).
5. Apply the plan: each transition in one short fenced write, then the provider call with the
   order's deterministic name (a repeat finds the resource already there), then its event. A
   calendar block the plan fits is first checked with Google's Advice API, then submitted.
   Right after the pass that carried out the planner's previous plan, only the decisions it
   set anew, or whose record changed, can have news (``_due``).

Cloud calls never run inside a transaction and never wait for the cloud: the next pass observes
how they went. Every write happens before the cloud call it licenses, so a crash between the two
leaves a record that the next pass completes (re-issuing the call) or a resource that no record
wants (released as a leak) — never a request lost, a resource created twice or a pool overfull.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import heapq
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from operator import attrgetter, itemgetter
from typing import Any

from opendws.domain.admission import (
    Alternative,
    Decision,
    Outcome,
    Plan,
    Race,
    calendar_alternatives,
    offered,
)
from opendws.domain.block_jobs import BlockView, JobView, block_jobs
from opendws.domain.calendar import lead_of
from opendws.domain.incremental import IncrementalPlanner
from opendws.domain.model import (
    CapacityRequest,
    Grant,
    Mode,
    PolicySettings,
    Pool,
    Provider,
    Racer,
    Snapshot,
)
from opendws.domain.provisioning import Lane, ProvisionPhase
from opendws.domain.readiness import (
    Readiness,
    ReadySample,
    expected_wait,
    readiness_by_pool,
    ready_etas,
    samples_after,
)
from opendws.domain.states import RequestState
from opendws.domain.sweep import (
    Call,
    LaneView,
    Step,
    SweepReason,
    SweepSettings,
    SweepView,
    steady_until,
    sweep,
)
from opendws.ports import (
    BlockProvider,
    CapacityProvider,
    Change,
    Clock,
    CloudRateLimited,
    ConfigStore,
    EventBus,
    Fence,
    Fenced,
    Host,
    Observed,
    Order,
    Providers,
    ReconcilerStore,
    RequestRecord,
    Sighting,
    StaleWrite,
    StatusEvent,
    TimerQueue,
    hold_end,
    hosts_after,
    order_name,
    submitted,
)
from opendws.ports.telemetry import Metrics
from opendws.service import telemetry
from opendws.service.ci_cap import within_caps
from opendws.service.cloud_calls import Call as CloudCall
from opendws.service.cloud_calls import CallBatch, CallLimits, CloudCalls, OutOfTime
from opendws.service.cloud_calls import Outcome as CallOutcome
from opendws.service.mirror import RequestMirror, in_flight
from opendws.service.ordered import OrderedByKey
from opendws.service.parts import SnapshotParts, moves_with_clock, racing
from opendws.service.release import block_run_on
from opendws.service.timers import release_timer, start_timer, timers_to_disarm
from opendws.service.usage import usage_of

log = logging.getLogger(__name__)

S = RequestState


class _Keep:
    """The default of :meth:`_Cycle._write`'s ``pool``: keep the record's own."""


KEEP = _Keep()


class ReconcileReason(StrEnum):
    """Why the reconciler moved a request when it applied a plan (the admission core's and
    the sweep's reasons cover the rest: :class:`opendws.domain.admission.Reason`,
    :class:`opendws.domain.sweep.SweepReason`)."""

    ADMITTED = "ADMITTED"  # the plan admitted it; provisioning starts
    # The plan fits the calendar block: submitted to Google, which reviews it (PENDING until
    # Google approves: then BOOKED, see SweepReason.APPROVED).
    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    # Google's Advice API has no capacity for the block as asked: refused before submitting.
    NO_CAPACITY_AT_GOOGLE = "NO_CAPACITY_AT_GOOGLE"
    RACING = "RACING"  # waiting at Google in short pools: offered to more pools at once


# The clause an event's message carries when an ETA moved later because Google has not served
# runs admitted ahead of it by the pool's usual time (a cause outside the plan).
GOOGLE_LATE = "later than told because of Google's queue"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcileSettings:
    """Knobs of the reconciler. There is no provisioning timeout: an order waits in Google's
    queue until the request's own max_wait, since cancelling it to ask elsewhere would give up
    its place (Google serves first come first served); racing several pools is the way to
    take whichever Google serves first."""

    lease_ttl: timedelta = timedelta(minutes=2)  # a crashed holder blocks others this long
    # A pool whose orders wait with a stockout in Google's last attempt is short: nothing new
    # starts there until this long after the last pass that saw it so.
    stockout_cooldown: timedelta = timedelta(minutes=10)
    overdue_grace: timedelta = timedelta(minutes=1)  # the sweep ends runs this long past due
    eta_tolerance: timedelta = timedelta(minutes=5)  # smaller ETA moves are not announced
    renew_every: int = 50  # writes between lease renewals within a long pass
    # The old cancel-and-retry: give up on orders Google has not served after this long and
    # try the request's other pools. None (the default) waits until max_wait, keeping the
    # place in Google's queue; bench/obtain.py compares the two.
    give_up_after: timedelta | None = None
    # A create call the cloud kept refusing this long after admission drops that order.
    not_taken_after: timedelta = timedelta(minutes=15)
    # A pass observes the pools where something may have changed: those with a live order,
    # those where a request ended since the last pass or a release was asked, and those
    # where the last look found something no live request wanted. Every pool is observed on
    # an instance's first pass and then at least this often, so that a resource left behind
    # where nothing points (a release Google accepted and then failed) is still found.
    # timedelta(0): every pool, every pass.
    observe_all_every: timedelta = timedelta(minutes=5)
    # What Google took to serve each pool's orders (pool_status samples, what ready_eta and
    # a pool's serve wait are learned from) is read again at least this often; in between an
    # instance keeps the samples it read and those it recorded. timedelta(0): every pass.
    readiness_every: timedelta = timedelta(minutes=5)
    # A pass's cloud calls run in a pool (service.cloud_calls): this many at once, and no more
    # than this many started per minute (None: no budget). Compute Engine's rate quotas are
    # per project and per minute (https://cloud.google.com/compute/api-quota); a call refused
    # all the same pauses the pool until the quota refills.
    cloud_calls_in_flight: int = 8
    cloud_calls_per_minute: int | None = 1200
    # How long a pass may run: once this much has passed it carries out no more of its plan,
    # gathers its calls and ends, asking for the next pass at once (the coalesced "again"), so
    # the first requests of a burst go on without waiting for the last. At most half the
    # lease's TTL (see budget).
    pass_budget: timedelta = timedelta(seconds=10)

    @property
    def budget(self) -> timedelta:
        """A pass's time: ``pass_budget``, and never more than half the lease's TTL (the
        lease is renewed every ``renew_every`` writes, but a pass must not live on renewals).
        A lease of no time at all (passes that overlap on purpose) leaves ``pass_budget``."""
        if self.lease_ttl <= timedelta(0):
            return self.pass_budget
        return min(self.pass_budget, self.lease_ttl / 2)

    @property
    def call_limits(self) -> CallLimits:
        return CallLimits(
            in_flight=self.cloud_calls_in_flight, per_minute=self.cloud_calls_per_minute
        )

    @property
    def sweep(self) -> SweepSettings:
        return SweepSettings(
            grace=self.overdue_grace, not_taken_after=self.not_taken_after,
            give_up_after=self.give_up_after,
        )  # fmt: skip


# The share of a pass's time (ReconcileSettings.budget) for carrying out its plan; the rest is
# for gathering the calls it submitted.
APPLY_SHARE = 0.75
# The share of it for the sweep: a burst's requests going ACTIVE share each pass with those
# being admitted, rather than one pass sweeping hundreds before it admits any.
SWEEP_SHARE = 0.5


# Threads a pass publishes its events and sets its timers on (each request's in order).
ORDERED_THREADS = 4


@dataclass(frozen=True, slots=True)
class _Announcing:
    """A record's events on their way out: ``events`` of them, after which its outbox
    cursor is at ``count``."""

    request_id: str
    count: int
    events: int
    future: Future[None]


@dataclass(frozen=True, slots=True)
class _CallLabel:
    """What one cloud call of a pass is, for its report and log line: ``request`` None for
    the release of a leak (no live request wants it)."""

    action: Call
    name: str
    pool_id: str
    request: CapacityRequest | None

    def __str__(self) -> str:
        return f"{self.action} {self.name} in {self.pool_id}"


# The reasons of a held slot: a pending request with one of these was told its ETA and pool.
_WAITING = frozenset((Outcome.HOLD, Outcome.WAIT))  # decisions that leave a request PENDING

# What one live request's sweep reads besides the time (see _Cycle._inputs).
_SweepInputs = tuple[int, tuple[tuple[bool, Observed | None], ...]]


@dataclass(frozen=True, slots=True)
class _DueChain:
    """What a pass's look at the plan left for the next one (see _Cycle._due): the plan it
    carried out (by the planner's count) under which policy, the requests it found due, and
    those whose news may come with the clock alone."""

    plans: int
    policy: PolicySettings
    due: frozenset[str]
    watched: set[str]


@dataclass(frozen=True, slots=True)
class _Quiet:
    """A live request whose last sweep did nothing: what that sweep read besides the time,
    and until when it stays so. Its lanes' pools and order names are kept with it, so a
    pass that finds the record at the same version (so with the same lanes) checks what was
    observed of each order without naming the orders again."""

    inputs: _SweepInputs
    until: datetime | None  # the first instant its sweep may differ (None: never, by time)
    pools: tuple[str, ...]  # per lane (see _lanes), its pool
    names: tuple[str, ...]  # per order the record has, its name

    def holds(self, sightings: Sequence[Sighting | None], pools: Mapping[str, Pool]) -> bool:
        """Whether a sweep that sees ``sightings`` (per order, as ``names``) with ``pools``
        configured reads what the quiet one read (its record's version is checked apart)."""
        pools_of, count = self.pools, len(sightings)
        for index, (configured, observed) in enumerate(self.inputs[1]):
            if configured is not (pools_of[index] in pools):
                return False
            sighting = sightings[index] if index < count else None
            seen = None if sighting is None else sighting.observed
            # The same report object, most passes: no fields to compare.
            if observed is not seen and observed != seen:
                return False
        return True


class PassOutcome(StrEnum):
    """How a pass ended."""

    SKIPPED = "SKIPPED"  # another reconciler holds the lease: nothing was done
    COMPLETED = "COMPLETED"  # the whole cycle ran
    FENCED = "FENCED"  # the lease was lost mid-pass; the rest was left to the new holder
    STALE = "STALE"  # stopped early: a record changed under the pass (the next one retries)


@dataclass(slots=True)
class PassReport:
    """What one pass did."""

    outcome: PassOutcome = PassOutcome.SKIPPED
    # (from, to) → how many requests moved so, e.g. (PENDING, PROVISIONING): 3.
    transitions: Counter[tuple[RequestState, RequestState]] = field(default_factory=Counter)
    double_wins: list[str] = field(default_factory=list)  # orders served beside a race's winner
    revisions: int = 0  # same-state updates (new ETA, reason, attempt)
    provisioned: list[str] = field(default_factory=list)  # order names whose creation was asked
    reserved: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)  # owned resources no live request wanted
    # Released or ended calendar blocks Google keeps (and bills) to their end: left alone.
    kept: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # provider calls that failed (retried later)
    # Provider calls the pass's time ran out for: written, not made (the next pass makes them).
    deferred: list[str] = field(default_factory=list)
    # The pass's time ran out before it had carried out all of its plan (the rest is the next
    # pass's, which it asks for at once).
    cut_short: bool = False
    skipped: list[str] = field(default_factory=list)  # changed by others meanwhile (next pass)
    # Requests left PROVISIONING or under Google's review: a pass soon will see them through.
    in_flight: int = 0
    published: int = 0
    observed_pools: int = 0  # pools whose resources were listed (see observe_all_every)
    observed_all: bool = False  # every configured pool was
    # Another pass was asked for while this one held the lease: the caller runs one more.
    again: bool = False
    # The plan's earliest held start: a pass then admits it on time (an ETA that moved by
    # less than eta_tolerance is not announced, so the records' ETAs may say later).
    next_start: datetime | None = None

    @property
    def ran(self) -> bool:
        """False when another reconciler held the lease."""
        return self.outcome is not PassOutcome.SKIPPED

    @property
    def fenced(self) -> bool:
        """True when the lease was lost mid-pass."""
        return self.outcome is PassOutcome.FENCED

    @property
    def stale(self) -> bool:
        """True when the pass stopped early on a stale view (fenced, or a conflict)."""
        return self.outcome in (PassOutcome.FENCED, PassOutcome.STALE)

    def transition_counts(self) -> dict[str, int]:
        """The transitions as ``{"PENDING→PROVISIONING": n}``, for logs and JSON."""
        return {f"{source}→{target}": n for (source, target), n in self.transitions.items()}

    def calls(self, call: Call) -> list[str]:
        """The order names for which a ``call`` was made this pass."""
        match call:
            case Call.PROVISION:
                return self.provisioned
            case Call.RESERVE:
                return self.reserved
            case Call.RELEASE:
                return self.released


class ReconcileService:
    """Runs reconcile passes (see the module docstring)."""

    def __init__(
        self, store: ReconcilerStore, config: ConfigStore, providers: Providers, bus: EventBus,
        clock: Clock, *, holder: str, settings: ReconcileSettings | None = None,
        timers: TimerQueue | None = None, metrics: Metrics | None = None,
    ) -> None:  # fmt: skip
        self._store = store
        self._config = config
        self._metrics = metrics  # None: nothing is measured
        self._providers = providers
        self._bus = bus
        self._clock = clock
        self._holder = holder
        self._settings = settings or ReconcileSettings()
        self._timers = timers  # None: no timers; the sweep alone ends runs and starts blocks
        self._passes = itertools.count(1)
        self._lock = threading.Lock()
        # The pool of this instance's cloud calls, shared by its passes (service.cloud_calls),
        # and the threads its passes publish their events and set their timers on, each request's
        # in order (service.ordered).
        self._calls = CloudCalls(self._settings.call_limits)
        self._ordered = OrderedByKey(ORDERED_THREADS, "per-request")
        # request id → (record version, grant, whether it may move with the clock: see
        # _Cycle._grant_of) of live runs and blocks, across passes.
        self._grants: dict[str, tuple[int, Grant, bool]] = {}
        # request id → (the inputs of its last sweep, when that sweep may first differ) for
        # live requests whose last sweep did nothing: record version, and per lane whether its
        # pool is configured and what was observed under its order's name.
        self._quiet: dict[str, _Quiet] = {}
        # What tells a pass which quiet requests to look at again (_Cycle._sweep_again): the
        # request of each quiet order name, the steady times of quiet requests (a heap), and
        # (the providers' look, the pools configured) when the last sweep ran to its end.
        self._quiet_names: dict[str, str] = {}
        self._quiet_until: list[tuple[datetime, str]] = []
        self._swept: tuple[int, frozenset[str]] | None = None
        # Per pool: the serve wait the last pass planned with (see _Cycle._why_later).
        self._serve_waits: dict[str, timedelta] = {}
        # Every pool's ready samples and when they were read (see _Cycle._samples).
        self._samples: dict[str, tuple[ReadySample, ...]] | None = None
        self._samples_read_at: datetime | None = None
        # The requests not yet final, kept between passes (service.mirror).
        self._mirror = RequestMirror()
        # The plan of the last pass, kept to plan the next one from (it gives exactly what
        # admit would, see opendws.domain.incremental); one pass at a time uses it.
        self._planner = IncrementalPlanner()
        self._planner_lock = threading.Lock()
        # request id → (pool, start) of the last plan's held slots: with commitments on, the
        # slot a request holds, which may be earlier than the ETA it was told (a move under
        # eta_tolerance is not announced). A cold instance starts from the announced ones.
        self._held: dict[str, tuple[str, datetime]] = {}
        self._held_plan: int | None = None  # the planner's plan number _held was read from
        # The snapshot's parts, kept between passes (service.parts).
        self._parts = SnapshotParts()
        # What the last look at a plan left for the next one (see _Cycle._due).
        self._due_chain: _DueChain | None = None
        # Pools to observe next pass although no live order is there (observe_all_every):
        # a request ended there, a release was asked there, or the last look there found
        # something no live request wanted. Guarded by _lock.
        self._watched: set[str] = set()
        self._observed_all_at: datetime | None = None  # None: never yet, on this instance

    def _note_quiet(self, request_id: str, quiet: _Quiet) -> None:
        """Index a quiet request by its order names and its steady time (see _sweep_again);
        the indexes are rebuilt from the quiet requests once stale entries outgrow them."""
        with self._lock:
            names, due = self._quiet_names, self._quiet_until
            for name in quiet.names:
                names[name] = request_id
            if quiet.until is not None:
                heapq.heappush(due, (quiet.until, request_id))
            limit = 4 * len(self._quiet) + 64
            if len(names) > limit:
                self._quiet_names = {n: key for key, q in self._quiet.items() for n in q.names}
            if len(due) > limit:
                self._quiet_until = [(q.until, key) for key, q in self._quiet.items() if q.until]
                heapq.heapify(self._quiet_until)

    def run_pass(self) -> PassReport:
        """One pass. Returns at once if another reconciler holds the lease.

        Each pass holds the lease under a name of its own (the service's, plus a pass count),
        so two passes of one process — concurrent requests on one instance — exclude each
        other as two processes do. The pass gives the lease up when it ends, however it ends
        (completed, stopped on a stale view, or raising), unless another reconciler took it
        over meanwhile."""
        started = time.perf_counter()
        reads_before = _documents_read(self._store)
        report = self._run_pass()
        if self._metrics is not None:
            reads_after = _documents_read(self._store)
            reads = (
                None if reads_before is None or reads_after is None else reads_after - reads_before
            )
            took = timedelta(seconds=time.perf_counter() - started)
            telemetry.record_pass(self._metrics, report.outcome.value, took, reads)
        return report

    def _run_pass(self) -> PassReport:
        now = self._clock.now()
        with self._lock:
            holder = f"{self._holder}#{next(self._passes)}"
        # A pass that finds the lease held asks its holder for one more (coalesced): the
        # change that caused this call is then seen by a pass that starts after it.
        fence = self._store.acquire_lease(holder, now, self._settings.lease_ttl, ask_again=True)
        report = PassReport()
        if fence is None:
            return report
        report.outcome = PassOutcome.COMPLETED
        # The lease is given up on every way out but one (fenced: it is another's now), so
        # the pass after a stopped or failed one runs at once, not after the lease's TTL.
        try:
            cycle = _Cycle(self, fence, now, report)
            cycle.run()
            if self._metrics is not None:
                live = (r for r in cycle.records.values() if not r.state.is_final)
                telemetry.record_gauges(self._metrics, live, cycle.config, now)
        except Fenced as error:
            # Another reconciler took over: the rest is its own, and so is the lease.
            log.warning("reconcile pass stopped: %s", error)
            report.outcome = PassOutcome.FENCED
            return report
        except StaleWrite as error:
            # A record changed under us: this pass's view is stale. Stop; the next pass
            # starts from a fresh one.
            log.warning("reconcile pass stopped: %s", error)
            report.outcome = PassOutcome.STALE
        except Exception:
            # A transient fault (Firestore, a provider): the caller sees it, the next pass
            # retries.
            self._give_up_after_fault(fence)
            raise
        # A pass that ran its whole cycle and carried out all of its plan has served every
        # nudge published before it started (functions/main.py drops those unrun); one that
        # stopped or left work to the next pass has not.
        unfinished = report.cut_short or bool(report.deferred)
        served = report.outcome is PassOutcome.COMPLETED and not unfinished
        asked = self._store.release_lease(fence, served=served)
        report.again = asked or unfinished
        return report

    def _give_up_after_fault(self, fence: Fence) -> None:
        """Give the lease up after a pass that raised; if that fails too (the store is what
        failed, most likely), the lease frees itself when it expires."""
        try:
            self._store.release_lease(fence)
        except Exception as error:
            log.warning(
                "reconciler lease not given up (it frees itself when it expires): %s", error
            )


class _Cycle:
    """One pass's working state; lives only inside :meth:`ReconcileService.run_pass`."""

    def __init__(
        self, service: ReconcileService, fence: Fence, now: datetime, report: PassReport
    ) -> None:
        self.store = service._store
        self.providers = service._providers
        self.bus = service._bus
        self.settings = service._settings
        self.metrics = service._metrics
        self.config = service._config.load()
        self.fence = fence
        self.now = now
        self.report = report
        self.records: dict[str, RequestRecord] = {}
        self.in_flight = 0  # records Google is still to serve (see mirror.in_flight)
        self.readiness: dict[str, Readiness | None] | None = None  # by pool; read when needed
        self.clock = service._clock
        self.timers = service._timers
        self.writes = 0
        self.grant_cache = service._grants
        self.quiet = service._quiet
        self.planner = service._planner
        self.planner_lock = service._planner_lock
        self.service = service
        self.mirror = service._mirror
        self.grants_lock = service._lock
        self.released_in: set[str] = set()  # pools where this pass asked for a release
        # The pass's time (ReconcileSettings.budget): its plan is carried out until
        # APPLY_SHARE of it has passed (its sweep until SWEEP_SHARE), and its calls are
        # gathered by its end.
        budget = self.settings.budget.total_seconds()
        started = time.monotonic()
        self.apply_until = started + APPLY_SHARE * budget
        self.sweep_until = started + SWEEP_SHARE * budget
        self.calls: CallBatch = service._calls.batch(started + budget)
        self.announcing: list[_Announcing] = []  # events being published (see _announce)
        self.learned: dict[str, list[ReadySample]] = {}  # by pool, to write (_record_ready)
        self.timing: list[tuple[str, Future[None]]] = []  # timers being set (_set_timers)
        # Per pool: runs Google has not served by the pool's serve wait, and runs it served
        # later than that in this pass (see _why_later).
        self.late: Counter[str] | None = None
        self.served_late: Counter[str] = Counter()
        shortages = self.store.pool_shortages()
        self.pools: dict[str, Pool] = {
            pool.pool_id: _learned(
                pool, shortages.get(pool.pool_id), expected_wait(self._ready_of(pool.pool_id))
            )
            for pool in self.config.pools
        }

    def run(self) -> None:
        """The cycle of the module docstring; the calls it submitted are gathered however it
        ends (a stopped pass's writes licensed them all the same)."""
        try:
            self._run()
        finally:
            self._gather()

    def _run(self) -> None:
        # 1. The lease is held (run_pass took it).
        # What changed since the last pass, on top of what it left (every request not final).
        held = self.mirror.refresh(self.store)
        self.records = held.records
        # The live requests, and calendar blocks at Google's review: swept.
        live = held.live
        # Kept up to date by each write (see _keep), rather than counted again at the end.
        self.in_flight = held.in_flight
        self._announce_backlog()
        # 2. Observe the providers where something may have changed (every pool, at times).
        looked, whole = self._pools_to_observe(live.values())
        observed = self._observe(looked)
        if observed is None:
            return  # the cloud's rate quota is spent: the next pass looks once it refills
        this_look = (self.providers.looks, self.providers.changed)  # taken at once
        self.report.observed_pools, self.report.observed_all = len(looked), whole
        # What no live request wants: leaks, and blocks Google keeps.
        unwanted = {name: observed[name] for name in observed.keys() - held.wanted}
        # 3. Sweep the live requests against it; release what nobody wants.
        configured = frozenset(self.pools)
        again = self._sweep_again(configured, *this_look)
        quiet_of, look, now = self.quiet.get, observed.get, self.now
        for request_id, record in live.items():
            quiet = quiet_of(request_id)
            if quiet is not None and again is not None and request_id not in again:
                continue  # quiet, and nothing it reads changed since the last sweep
            if (
                quiet is not None
                and quiet.inputs[0] == record.version  # the same version: the same lanes
                and (quiet.until is None or now < quiet.until)
            ):
                sightings = [look(name) for name in quiet.names]
                if quiet.holds(sightings, self.pools):
                    continue  # its last sweep did nothing, and nothing it reads changed since
                seen = dict(zip(record.orders, sightings, strict=True))
            else:
                seen = {lane: look(order_name(request_id, lane.attempt)) for lane in record.orders}
            if time.monotonic() >= self.sweep_until:
                # Out of the sweep's share of the pass: the rest is swept by the next pass,
                # asked for at once, which then looks at every request again (_sweep_again).
                self.report.cut_short = True
                break
            with self._one_request(request_id):
                self._sweep(record, seen, self._inputs(record, seen))
        else:
            self.service._swept = (this_look[0], configured)
        self._watch({pool.pool_id for pool in looked}, unwanted, whole)
        for name in sorted(unwanted):
            self._release_leak(unwanted[name])
        # Jobs into calendar blocks: each runs on its block's VMs in turn, or ends with it
        # (no cloud call: the block holds the capacity).
        self._block_jobs(held.jobs)
        # 4. Snapshot and admission.
        snapshot = self._snapshot()
        with self.planner_lock:  # a pass whose lease expired may still be planning
            plan = self.planner.plan(snapshot, self.now)
            planned = (self.planner.plans, self.planner.changed)
        # 5. Apply: starts first, so capacity is asked for as early as possible.
        order = {Outcome.ADMIT: 0, Outcome.CONFIRM: 1}
        for race in plan.races:
            if self._out_of_time():
                break
            with self._one_request(race.request_id):
                self._grow_race(race)
        # Held and waiting requests without news are left as they are (most of them, most
        # passes): only the rest is ordered and applied. A pass out of time leaves the rest to
        # the next one: what it did not carry out is still due then (see _due).
        due = self._due(plan, *planned)
        for decision in sorted(due, key=lambda d: _apply_order(d, plan, order)):
            if self._out_of_time():
                break
            with self._one_request(decision.request_id):
                self._apply(decision)
        self._record_ready()
        slots = self.service._held = self._held_slots(plan, *planned)
        self.service._serve_waits = {key: pool.serve_wait for key, pool in self.pools.items()}
        self.report.next_start = min(map(_START, slots.values()), default=None)
        self.report.in_flight = self.in_flight

    def _observe(self, pools: list[Pool]) -> dict[str, Sighting] | None:
        """What the providers show in ``pools``, once the cloud's rate quota allows a look
        (a pause the pool of calls keeps, see service.cloud_calls). None when it does not
        within the pass's time, or the look itself is refused for it: without a look nothing
        can be swept or planned safely, so the pass ends there and asks for the next one."""
        calls = self.service._calls
        if calls.quota_refilled(self.calls.deadline):
            try:
                return self.providers.observe(pools)
            except CloudRateLimited as refusal:
                calls.refused(refusal)
        log.warning("reconcile pass ends before its look: the cloud's rate quota is spent")
        self.report.deferred.append("observe: the cloud's rate quota is spent")
        return None

    def _held_slots(
        self, plan: Plan, plans: int, changed: set[str] | None
    ) -> dict[str, tuple[str, datetime]]:
        """Where ``plan`` (the planner's plan number ``plans``) holds each held request:
        right after the pass that carried out the planner's previous plan, the last pass's
        slots with those of the decisions the planner set anew (``changed``) put right (a new
        place in line is no new slot); otherwise read from every decision."""
        service = self.service
        if changed is None or service._held_plan != plans - 1:
            slots = {d.request_id: slot for d in plan.decisions if (slot := _slot(d)) is not None}
        else:
            slots = dict(service._held)
            for key in changed:
                decision = _decision_of(plan, key)
                slot = None if decision is None else _slot(decision)
                if slot is None:
                    slots.pop(key, None)
                else:
                    slots[key] = slot
        service._held_plan = plans
        return slots

    def _sweep_again(
        self, configured: frozenset[str], looks: int, looked_changed: set[str]
    ) -> set[str] | None:
        """The quiet requests this pass sweeps again (None: every one it finds quiet is
        checked): those whose record changed, those whose steady time came, and those an
        order of which the providers' look shows changed since the last pass's. That holds
        only if the last pass's sweep ran to its end right after the look before this one,
        with the same pools configured: otherwise every one is checked, as its _Quiet says.
        A quiet request in none of these reads what its last sweep read. ``looks`` and
        ``looked_changed``: this pass's look's number and the order names it saw change."""
        service = self.service
        changed = self.mirror.take_changed("sweep")
        swept, service._swept = service._swept, None  # set again once this sweep is done
        if changed is None or swept is None or swept != (looks - 1, configured):
            return None
        again = changed
        names = service._quiet_names
        again.update(names[name] for name in looked_changed if name in names)
        due = service._quiet_until
        while due and due[0][0] <= self.now:
            again.add(heapq.heappop(due)[1])
        return again

    def _pools_to_observe(self, live: Iterable[RequestRecord]) -> tuple[list[Pool], bool]:
        """The pools this pass observes, and whether they are all of them: every configured
        pool on the instance's first pass and once observe_all_every has passed since the
        last such pass; else those of live orders and those watched (see ReconcileService).
        Every order a live request has is in them, so the sweep never mistakes an order it
        did not look for for one Google lost."""
        service = self.service
        with self.grants_lock:
            service._watched |= self.mirror.take_ended_pools()
            last = service._observed_all_at
            whole = last is None or self.now - last >= self.settings.observe_all_every
            wanted = set(service._watched)
        if whole:
            return list(self.pools.values()), True
        # Configured pools no reason to look at has been found for yet: once none is left,
        # the other live requests cannot add one.
        unseen = self.pools.keys() - wanted
        for record in live:
            if not unseen:
                break
            for lane in record.orders:
                unseen.discard(lane.pool)
            if record.pool is not None:
                unseen.discard(record.pool)  # the sweep also looks under (pool, attempt)
        return [pool for pool_id, pool in self.pools.items() if pool_id not in unseen], False

    def _watch(self, looked: set[str], unwanted: dict[str, Sighting], whole: bool) -> None:
        """After the sweep: a pool looked at and found clean leaves the watch, unless this
        pass asked for a release there; one with something no live request wanted stays."""
        dirty = {sighting.observed.pool_id for sighting in unwanted.values()}
        with self.grants_lock:
            watched = self.service._watched
            watched -= looked - dirty - self.released_in
            watched |= dirty
            if whole:
                watched &= set(self.pools)  # forget pools no longer configured
                self.service._observed_all_at = self.now

    @contextlib.contextmanager
    def _one_request(self, request_id: str) -> Iterator[None]:
        """Work on one request. If someone else changed it meanwhile (a release, a cancel, a
        timer: its version moved), leave it to the next pass, which sees the change; the rest
        of this pass goes on. Losing the lease (Fenced) still stops the whole pass."""
        try:
            yield
        except Fenced:
            raise
        except StaleWrite as error:
            log.info("%s changed meanwhile; left to the next pass: %s", request_id, error)
            self.report.skipped.append(request_id)

    # Step 3: the sweep ------------------------------------------------------------------

    def _block_jobs(self, jobs: Sequence[RequestRecord]) -> None:
        """Step the jobs into calendar blocks (``jobs``, oldest submission first) by the pure
        rule of :mod:`opendws.domain.block_jobs`, against their blocks as this pass left them
        (a block no longer in the mirror has ended: read once). A job that starts takes its
        block's hosts and attempt 1 of its own, and no pool or order: nothing the reconciler
        or a release does to it touches the block's VMs."""
        on: dict[str, list[RequestRecord]] = {}
        for job in jobs:
            current = self.records.get(job.request_id, job)
            if not current.state.is_final and current.request.block is not None:
                on.setdefault(current.request.block, []).append(current)
        for block_id, its_jobs in on.items():
            if self._out_of_time():
                return  # the next pass, asked for at once, steps the rest
            block = self.records.get(block_id) or self.store.get(block_id)
            steps = block_jobs(
                _block_view(block_id, block),
                [
                    JobView(request_id=job.request_id, state=job.state, reason=job.reason,
                            message=job.message)
                    for job in its_jobs
                ],
            )  # fmt: skip
            by_id = {job.request_id: job for job in its_jobs}
            for step in steps:
                job = by_id[step.request_id]
                with self._one_request(job.request_id):
                    if step.starts:
                        assert block is not None  # a job starts on a running block only
                        self._write(
                            job, S.ACTIVE, step.reason, step.message, pool=None, attempt=1,
                            hosts=block.hosts,
                        )  # fmt: skip
                    else:
                        self._write(job, step.target or job.state, step.reason, step.message)

    def _inputs(self, record: RequestRecord, seen: dict[Lane, Sighting | None]) -> _SweepInputs:
        """What the record's sweep reads besides the time: its record (by version) and, per
        lane, whether its pool is configured and what was observed of its order."""
        lanes = _lanes(record)
        return (
            record.version,
            tuple(
                (
                    lane.pool in self.pools,
                    None if (sighting := seen.get(lane)) is None else sighting.observed,
                )
                for lane in lanes
            ),
        )

    def _sweep(
        self, record: RequestRecord, seen: dict[Lane, Sighting | None], inputs: _SweepInputs
    ) -> None:
        """Compute the record's step from the table (pure), then carry it out; remember a
        step that does nothing, with the instant until which it stays so."""
        request = record.request
        lanes = _lanes(record)
        views = []
        for lane in lanes:
            sighting = seen.get(lane)
            observed = None if sighting is None else sighting.observed
            views.append(
                LaneView(
                    lane=lane,
                    configured=lane.pool in self.pools,
                    phase=None if observed is None else observed.phase,
                    error_code=None if observed is None else observed.error_code,
                    last_attempt=None if observed is None else observed.last_attempt,
                    message="" if observed is None else observed.message,
                )
            )
        block_start = request.start_at
        view = SweepView(
            state=record.state,
            mode=request.mode,
            lanes=tuple(views),
            units=request.units,
            # A block under review: since its submission (the write that licensed it).
            since=record.updated_at if submitted(record) else record.since or record.updated_at,
            reason=record.reason,
            waiting_told=record.reason
            in (SweepReason.WAITING_FOR_CAPACITY, ReconcileReason.RACING),
            deadline=request.deadline,
            run_end=hold_end(record, self.now) if record.state is S.ACTIVE else None,
            block_start=block_start,
            block_end=None if block_start is None else block_start + request.run_duration,
        )
        step = sweep(view, self.now, self.settings.sweep)
        if step.writes or step.calls or step.short or step.double_wins:
            self.quiet.pop(record.request_id, None)
        else:
            quiet = self.quiet[record.request_id] = _Quiet(
                inputs=inputs,
                until=steady_until(view, self.now, self.settings.sweep),
                pools=tuple(lane.pool for lane in lanes),
                names=tuple(order_name(record.request_id, lane.attempt) for lane in record.orders),
            )
            self.service._note_quiet(record.request_id, quiet)
        self._carry_out(record, step, _served_hosts(record, step, seen))

    def _carry_out(
        self, record: RequestRecord, step: Step, hosts: tuple[Host, ...] | None = None
    ) -> None:
        """The one writer of the sweep: pools marked short, the record's write (before the
        calls it licenses, so a crash between them leaves a record the next pass completes or
        a resource nobody wants, released as a leak), then the provider calls in order.
        ``hosts``: a request going ACTIVE, where its capacity is (on its record and event)."""
        for pool_id in step.short:
            until = self.now + self.settings.stockout_cooldown
            already = self.pools[pool_id].short_until
            self.store.mark_pool_short(pool_id, until, self.fence)
            if self.metrics is not None and (already is None or already <= self.now):
                telemetry.record_stockout(self.metrics, pool_id)  # the pool goes short now
            self.pools[pool_id] = _learned(
                self.pools[pool_id], until, self.pools[pool_id].serve_wait
            )
        if step.double_wins:
            self.report.double_wins.extend(
                order_name(record.request_id, lane.attempt) for lane in step.double_wins
            )
        if step.writes:
            state = step.target or record.state
            primary = step.lanes[0].pool if step.lanes else None
            message = step.message or record.message
            if step.reason is SweepReason.DECLINED:
                message += offered(self._alternatives(record, refused_in=record.pool))
            changed = self._write(
                record, state, step.reason or "", message,
                pool=primary if step.lanes else KEEP, lanes=step.lanes,
                attempt=record.attempt if submitted(record) else None, hosts=hosts,
            )  # fmt: skip
            self._learn_ready(record, changed)
        calls: list[tuple[Call, Order, Callable[[Order], None]]] = []
        for call, lane in step.calls:
            pool = self.pools.get(lane.pool)
            if pool is None:
                continue  # a pool no longer configured: nothing of it can be reached
            order = Order(request=record.request, pool=pool, attempt=lane.attempt)
            provider = self.providers.for_order(pool, record.request.mode)
            match call:
                case Call.RELEASE:
                    calls.append((call, order, functools.partial(_release, provider)))
                case Call.RESERVE:
                    calls.append((call, order, provider.reserve))
                case Call.PROVISION:
                    calls.append((call, order, provider.provision))
        self._submit(calls)

    def _learn_ready(self, before: RequestRecord, after: RequestRecord) -> None:
        """A flex-start order Google served: one sample of its pool's admission → ACTIVE
        time (what ``ready_eta`` is learned from), kept at once and written with the pass's
        other samples of its pool in one write at the pass's end (_record_ready): a pool's
        status is one document, which Firestore sustains about one write a second to, and a
        burst serves dozens a second. A crash before that write loses samples, never a state;
        a collision with another writer loses them too, rather than the rest of the pass."""
        served = before.state is S.PROVISIONING and after.state is S.ACTIVE
        if not served or before.request.mode is not Mode.FLEX_START or after.pool is None:
            return
        admitted = before.since or before.updated_at
        sample = ReadySample(
            request_id=after.request_id, at=self.now, took=max(self.now - admitted, timedelta(0))
        )
        pool = self.pools.get(after.pool)
        if pool is not None and sample.took > pool.serve_wait:
            self.served_late[after.pool] += 1  # a cause a later ETA names (see _why_later)
        self.learned.setdefault(after.pool, []).append(sample)
        # Kept as the store keeps it (the same rule), so no read is needed to see it.
        samples = self._samples()
        kept = samples_after(samples.get(after.pool, ()), sample)
        if kept is not None:
            with self.grants_lock:
                samples[after.pool] = kept
        self.readiness = None  # worked out again when next needed

    def _record_ready(self) -> None:
        """Write the samples the pass learned, one write per pool (see _learn_ready)."""
        learned, self.learned = self.learned, {}
        for pool_id, samples in sorted(learned.items()):
            try:
                self.store.record_ready(pool_id, *samples, fence=self.fence)
            except Fenced:
                raise
            except StaleWrite as error:
                log.warning("%d ready samples of %s not recorded: %s", len(samples), pool_id, error)

    def _samples(self) -> dict[str, tuple[ReadySample, ...]]:
        """Every pool's ready samples: read from the store on an instance's first pass and
        then at least every ``readiness_every``; in between, what this instance read and
        recorded (another instance's samples show within that period)."""
        service = self.service
        with self.grants_lock:
            kept, read_at = service._samples, service._samples_read_at
        every = self.settings.readiness_every
        if kept is None or read_at is None or not read_at <= self.now < read_at + every:
            kept = dict(self.store.ready_samples())
            with self.grants_lock:
                service._samples, service._samples_read_at = kept, self.now
        return kept

    def _ready_of(self, pool_id: str) -> Readiness | None:
        """What Google took lately to serve an admitted request in ``pool_id`` (worked out
        once per pass from :meth:`_samples`)."""
        if self.readiness is None:
            self.readiness = readiness_by_pool(self._samples(), self.now)
        return self.readiness.get(pool_id)

    def _expected_wait(self, pool_id: str) -> timedelta:
        """How long an admitted flex order in ``pool_id`` is planned to wait in Google's
        queue: the pool's serve wait this pass (:func:`~opendws.domain.readiness.expected_wait`,
        the same the planner places flex runs with)."""
        pool = self.pools.get(pool_id)
        return pool.serve_wait if pool is not None else expected_wait(self._ready_of(pool_id))

    def _release_leak(self, sighting: Sighting) -> None:
        leak = sighting.observed
        pool = self.pools[leak.pool_id]  # observed in a configured pool
        if _kept_by_google(leak, self.now):
            # A released block Google no longer lets anyone cancel: it is billed to its end
            # whatever we do, and deleted after it (delete-future-reservations-calendar-mode).
            self.report.kept.append(leak.name)
            return
        log.warning("releasing %s in %s: no live request wants it", leak.name, leak.pool_id)
        # A failure: the next pass sees it again and retries.
        label = _CallLabel(Call.RELEASE, leak.name, leak.pool_id, None)
        self.calls.submit(
            [CloudCall(label, functools.partial(sighting.provider.release, leak.name, pool))]
        )

    def _call(self, action: Call, order: Order, call: Callable[[Order], None]) -> None:
        """One provider call for one order (see :meth:`_calls_of`)."""
        self._submit([(action, order, call)])

    def _submit(self, calls: Sequence[tuple[Call, Order, Callable[[Order], None]]]) -> None:
        """Submit one request's provider calls (its write is stored: it licenses them) to
        the pool, to run one after the other while other requests' calls run beside them. A
        failure is logged and left for the next pass, which issues the call again (it is safe
        to repeat), so one bad order never holds up the others."""
        chain = []
        for action, order, call in calls:
            if action is Call.RELEASE:
                # Watched until a pass sees the pool clean (what Google deletes takes a while).
                with self.grants_lock:
                    self.service._watched.add(order.pool.pool_id)
                self.released_in.add(order.pool.pool_id)
            label = _CallLabel(action, order.name, order.pool.pool_id, order.request)
            chain.append(CloudCall(label, functools.partial(call, order)))
        self.calls.submit(chain)

    def _gather(self) -> None:
        """The outcomes of the pass's calls and announcements, reported and logged on the
        pass's thread. An announcement not done by the pass's end is left to finish (or to a
        later pass's backlog, if it fails); one that failed, to a later pass's backlog."""
        for outcome in self.calls.gather():
            self._report_call(outcome)
        announcing, self.announcing = self.announcing, []
        timing, self.timing = self.timing, []
        remaining = max(self.calls.deadline - time.monotonic(), 0.0)
        wait_for([item.future for item in announcing] + [f for _, f in timing], timeout=remaining)
        for request_id, future in timing:
            error = future.exception() if future.done() else None
            if error is not None and not isinstance(error, Exception):
                raise error
            if error is not None:
                log.warning("timers of %s not set; the sweep covers: %s", request_id, error)
                self.report.errors.append(f"timers {request_id}: {error}")
        for item in announcing:
            if not item.future.done():
                continue
            error = item.future.exception()
            if error is not None and not isinstance(error, Exception):
                raise error  # the process is going down: nothing more of this pass
            if error is not None:
                log.warning(
                    "events of %s not published; a later pass does: %s", item.request_id, error
                )
                self.report.errors.append(f"announce {item.request_id}: {error}")
                continue
            self.report.published += item.events
            current = self.records.get(item.request_id)
            if current is not None and current.announced < item.count:
                self._keep(replace(current, announced=item.count))

    def _report_call(self, outcome: CallOutcome) -> None:
        label, error = outcome.label, outcome.error
        assert isinstance(label, _CallLabel)
        text = f"{label.action} {label.name}"
        if isinstance(error, OutOfTime):
            self.report.deferred.append(text)
            return
        if label.request is None:  # a leak's release
            if error is None:
                self.report.leaks.append(label.name)
            else:
                self._provider_failed(label.action, label.name, error)
            return
        request = label.request
        telemetry.log_cloud_call(
            label.action.value, label.name, label.pool_id, request_id=request.request_id,
            tenant=request.tenant, error=error,
        )  # fmt: skip
        if error is None:
            self.report.calls(label.action).append(label.name)
        else:
            self.report.errors.append(f"{text}: {error}")

    def _out_of_time(self) -> bool:
        """Whether the pass has used the share of its time for carrying out its plan."""
        if time.monotonic() < self.apply_until:
            return False
        self.report.cut_short = True
        return True

    def _provider_failed(self, action: Call, name: str, error: Exception) -> None:
        log.warning("%s %s failed; the next pass tries again: %s", action, name, error)
        self.report.errors.append(f"{action} {name}: {error}")

    # Step 4: the snapshot ---------------------------------------------------------------

    def _snapshot(self, without: str | None = None) -> Snapshot:
        """What admission reads; ``without`` leaves one request out (to plan around it).

        Built from the parts kept between passes (:mod:`opendws.service.parts`), brought up
        to date for the requests the mirror saw change; only the grants that move with the
        clock are worked out again (a run being created, a race's lanes)."""
        mirror = self.mirror
        parts = self.service._parts.update(
            mirror.take_changed("parts"),
            mirror.current,
            mirror.get,
            self._grant_of,
            self.service._held,
            committing=self.config.policy.commit_within is not None,
        )
        grants = parts.fixed
        if parts.moving:
            grants = (*grants, *self._moving_grants(parts.moving))
        pending, commitments = parts.pending, parts.commitments
        pending = within_caps(pending, self.records.values(), self.config.ci)
        if without is not None:
            pending = tuple(r for r in pending if r.request_id != without)
            grants = tuple(g for g in grants if g.request_id != without)
            commitments = tuple(c for c in commitments if c.request_id != without)
        with self.grants_lock:  # drop what no live request needs any more
            _forget_gone(self.grant_cache, self.records)
            _forget_gone(self.quiet, self.records)
        return Snapshot(
            pools=tuple(self.pools.values()),
            tenants=self.config.tenants,
            grants=grants,
            pending=pending,
            policy=self.config.policy,
            racing=tuple(self._racers()),
            commitments=commitments,
        )

    def _moving_grants(self, records: Sequence[RequestRecord]) -> Iterator[Grant]:
        """The grants of records whose grants move with the clock, worked out at this pass's
        now; a racing one's every lane holds its own grant until one wins (PolicySettings)."""
        for record in records:
            if racing(record):
                for lane in record.lanes:
                    grant = _grant(record, self.now, self._expected_wait(lane.pool))
                    yield replace(grant, pool_id=lane.pool)
            else:
                yield self._grant_of(record)

    def _racers(self) -> Iterator[Racer]:
        """Flex requests whose every order waits in a pool Google reported short."""
        if not any(self._short(pool_id) for pool_id in self.pools):
            return  # none is short: nothing to look through
        for record in self.records.values():
            if record.state is not S.PROVISIONING or record.request.mode is not Mode.FLEX_START:
                continue
            pools = tuple(lane.pool for lane in record.orders)
            if pools and all(self._short(pool_id) for pool_id in pools):
                yield Racer(request=record.request, pools=pools)

    def _short(self, pool_id: str) -> bool:
        pool = self.pools.get(pool_id)
        return pool is not None and pool.short_until is not None and pool.short_until > self.now

    def _grant_of(self, record: RequestRecord) -> Grant:
        """The record's grant. A running run's or a booked block's grant depends only on the
        record, so it is kept per version across passes: with hundreds of runs, rebuilding
        every one every pass would be most of a quiet pass's work. One still being created,
        or held from now on, may move with the clock: it is kept while its start and end
        stay where they were (the same object pass after pass is what lets the planner see
        at once that nothing changed)."""
        # A lookup needs no lock (one dict read is atomic); storing a new grant takes it.
        cached = self.grant_cache.get(record.request_id)
        kept = None
        if cached is not None and cached[0] == record.version:
            kept = cached[1]
            if not cached[2]:
                return kept  # it does not move with the clock (most of them)
        wait = timedelta(0)
        if record.state is S.PROVISIONING and record.request.start_at is None:
            # In Google's queue: held from admission to where Google should have served it
            # (the pool's recent p90), then its run; past that, a further wait at a time
            # (see hold_end and expected_serve).
            assert record.pool is not None
            wait = self._expected_wait(record.pool)
        start, end = _span(record, self.now, wait)
        if kept is not None and (kept.start_at, kept.end_at) == (start, end):
            return kept
        moving = moves_with_clock(record)  # held from now on, or until Google serves it
        assert record.pool is not None
        grant = Grant.of(record.request, record.pool, start, end_at=end)
        with self.grants_lock:
            self.grant_cache[record.request_id] = (record.version, grant, moving)
        return grant

    # Step 5: apply ----------------------------------------------------------------------

    def _apply(self, decision: Decision) -> None:
        """Carry out one decision. A held or waiting request comes here only with news (see
        :meth:`_news`): the pass leaves the others as they are."""
        record = self.records[decision.request_id]
        match decision.outcome:
            case Outcome.ADMIT:
                assert decision.pool_id is not None
                # One order per raced pool, each under an attempt number of its own.
                raced = (decision.pool_id, *decision.lanes)
                lanes = tuple(
                    Lane(pool_id, record.attempt + index)
                    for index, pool_id in enumerate(raced, start=1)
                )
                first = lanes[0]
                text = f"admitted in {first.pool} (attempt {first.attempt}); provisioning"
                if len(lanes) > 1:
                    text = (
                        f"admitted; racing {', '.join(raced)} (attempts {first.attempt}.."
                        f"{lanes[-1].attempt}): the first Google serves wins"
                    )
                self._write(
                    record, S.PROVISIONING, ReconcileReason.ADMITTED, text, pool=first.pool,
                    attempt=lanes[-1].attempt, eta=self.now,
                    lanes=lanes if len(lanes) > 1 else (),
                )  # fmt: skip
                self._provision_lanes(record, lanes)
            case Outcome.CONFIRM:
                assert decision.pool_id is not None
                self._submit_block(record, self.pools[decision.pool_id])
            case Outcome.REFUSE:
                alternatives = self._alternatives(record)
                self._write(
                    record, S.REJECTED, decision.reason or "",
                    replace(decision, alternatives=alternatives).message,
                )  # fmt: skip
            case Outcome.REJECT:
                self._write(record, S.REJECTED, decision.reason or "", decision.message)
            case Outcome.TIME_OUT:
                self._write(record, S.TIMED_OUT, decision.reason or "", decision.message)
            case Outcome.HOLD | Outcome.WAIT:
                message = decision.message
                told, eta, pool_id = record.eta, decision.eta, decision.pool_id
                if told is not None and eta is not None and eta > told and pool_id is not None:
                    message += self._why_later(pool_id)
                self._write(
                    record, S.PENDING, decision.reason or "", message,
                    pool=decision.pool_id, eta=decision.eta, position=decision.position,
                )  # fmt: skip

    def _why_later(self, pool_id: str) -> str:
        """The cause outside the plan an ETA in ``pool_id`` moved later for, as a clause of
        its event's message ("" if none is seen), all of them Google's queue taking longer
        than the pool's serve wait: runs admitted there that Google has not served by then
        (expected a further wait later, see expected_serve), runs it served later than that
        in this pass, or the wait itself grown since the last pass."""
        if self.late is None:
            late: Counter[str] = Counter()
            for other in self.records.values():
                if other.state is not S.PROVISIONING or other.request.mode is not Mode.FLEX_START:
                    continue
                admitted = other.since or other.updated_at
                for lane in other.orders:
                    pool = self.pools.get(lane.pool)
                    if pool is not None and admitted + pool.serve_wait < self.now:
                        late[lane.pool] += 1
            self.late = late
        pool = self.pools.get(pool_id)
        planned = f"the {timedelta(0) if pool is None else pool.serve_wait} planned"
        causes = []
        if count := self.late.get(pool_id, 0):
            causes.append(f"{_runs(count)} admitted there not yet served within {planned}")
        if count := self.served_late.get(pool_id, 0):
            causes.append(f"{_runs(count)} served later than {planned}")
        before = self.service._serve_waits.get(pool_id)
        if pool is not None and before is not None and pool.serve_wait > before:
            causes.append(f"the wait planned there grew from {before} to {pool.serve_wait}")
        if not causes:
            return ""
        return f"; {GOOGLE_LATE} in {pool_id}: " + "; ".join(causes)

    def _submit_block(self, record: RequestRecord, pool: Pool) -> None:
        """A block our plan fits: ask Google's Advice API whether it has the capacity as
        asked; if it does (or cannot say), submit the block for Google's review — written
        first (PENDING, awaiting approval, holding its slot), then created; if it does not,
        refuse it now with the starts Google and our plan both have room for."""
        request = record.request
        assert request.start_at is not None  # a calendar block
        end = request.start_at + request.run_duration
        blocks = self.providers.blocks(pool)
        try:
            advised = blocks.advise(
                request, [pool], earliest=request.start_at, latest=request.start_at
            )
        except Exception as error:  # advice is advice: Google's review decides anyway
            log.warning("advice for %s failed; submitting anyway: %s", request.request_id, error)
        else:
            if not any(a.start_at == request.start_at and a.zone == pool.zone for a in advised):
                self._write(
                    record, S.REJECTED, ReconcileReason.NO_CAPACITY_AT_GOOGLE,
                    f"Google Cloud's Advice API has no capacity for {request.units} × "
                    f"{pool.shape} in {pool.zone} from {request.start_at.isoformat()} to "
                    f"{end.isoformat()}"
                    + offered(self._alternatives(record, refused_in=pool.pool_id)),
                )  # fmt: skip
                return
        self._write(
            record, S.PENDING, ReconcileReason.AWAITING_APPROVAL,
            f"submitted to Google Cloud for approval: {request.units} × {pool.shape} in "
            f"{pool.zone} "
            f"from {request.start_at.isoformat()} to {end.isoformat()}; waiting for Google's "
            "review (booked once approved)",
            pool=pool.pool_id, attempt=1, eta=request.start_at,
        )  # fmt: skip
        order = Order(request=request, pool=pool, attempt=1)
        self._call(Call.RESERVE, order, blocks.reserve)

    def _alternatives(
        self, record: RequestRecord, *, refused_in: str | None = None
    ) -> tuple[Alternative, ...]:
        """The starts a refused or declined block is offered: Google's Advice API's
        recommendations in the request's pools where our timeline fits too, then our own
        nearest feasible starts; never the start Google refused in ``refused_in``."""
        request = record.request
        tpu = request.gang.provider is Provider.TPU
        lead = lead_of(tpu)
        shape = [
            pool for pool in self.pools.values()
            if (pool.provider, pool.shape, pool.accelerator)
            == (request.gang.provider, request.gang.shape, request.gang.accelerator)
        ]  # fmt: skip
        advised: list[Alternative] = []
        by_provider: dict[int, tuple[BlockProvider, list[Pool]]] = {}
        for pool in shape:
            blocks = self.providers.blocks(pool)
            by_provider.setdefault(id(blocks), (blocks, []))[1].append(pool)
        # The start asked (in the other pools), then the nearest others Google has.
        windows = [(self.now + lead.earliest, self.now + lead.latest)]
        if refused_in is not None and request.start_at is not None:
            windows.insert(0, (request.start_at, request.start_at))
        try:
            for (blocks, pools), (earliest, latest) in itertools.product(
                by_provider.values(), windows
            ):
                for advice in blocks.advise(request, pools, earliest=earliest, latest=latest):
                    advised.extend(
                        Alternative(start_at=advice.start_at, pool_id=pool.pool_id)
                        for pool in pools
                        if pool.zone == advice.zone
                    )
        except Exception as error:  # our own timeline still has its answer
            log.warning("advice for %s failed: %s", request.request_id, error)
            advised = []
        snapshot = self._snapshot(without=record.request_id)
        return calendar_alternatives(snapshot, request, self.now, advised, refused_in=refused_in)

    def _grow_race(self, race: Race) -> None:
        """Offer a request waiting at Google in short pools to more of its pools: the new
        orders are written first (each under an attempt number of its own), then created."""
        record = self.records[race.request_id]
        kept = record.orders
        added = tuple(
            Lane(pool_id, record.attempt + index) for index, pool_id in enumerate(race.pools, 1)
        )
        lanes = (*kept, *added)
        self._write(
            record, S.PROVISIONING, ReconcileReason.RACING,
            f"Google Cloud is short in {', '.join(lane.pool for lane in kept)}; also offered "
            f"to {', '.join(race.pools)}: the first Google serves wins",
            pool=kept[0].pool, attempt=added[-1].attempt, eta=record.eta, lanes=lanes,
        )  # fmt: skip
        self._provision_lanes(record, added)

    def _provision_lanes(self, record: RequestRecord, lanes: tuple[Lane, ...]) -> None:
        """Ask for each new lane's order, once its write is stored."""
        calls: list[tuple[Call, Order, Callable[[Order], None]]] = []
        for lane in lanes:
            pool = self.pools[lane.pool]
            order = Order(request=record.request, pool=pool, attempt=lane.attempt)
            calls.append(
                (
                    Call.PROVISION,
                    order,
                    self.providers.for_order(pool, record.request.mode).provision,
                )
            )
        self._submit(calls)

    def _due(self, plan: Plan, plans: int, changed: set[str] | None) -> list[Decision]:
        """The plan's decisions to carry out: every one that changes a request's state, and a
        waiting one with news (:meth:`_news`).

        Right after the pass that carried out the planner's previous plan, only some can be
        due: those the planner set anew other than for a place in line, which is no news
        (``changed``, of plan number ``plans``), those whose
        record changed since (the mirror says which), those due then (one whose write was
        refused is due still), and those whose news may come with the clock alone (a later
        ETA, told within the commitment horizon once the clock brings it there). Any other
        is the same decision for the same record, found without news then. Otherwise (a
        full plan, a plan this service did not see, a pass cut short) every one is looked
        at."""
        service = self.service
        records_changed = self.mirror.take_changed("due")
        chain, service._due_chain = service._due_chain, None  # set again once done
        if (
            chain is None
            or changed is None
            or records_changed is None
            or chain.plans != plans - 1
            or chain.policy is not self.config.policy
        ):
            decisions: Iterable[Decision] = plan.decisions
        else:
            ids = changed | records_changed | chain.due | chain.watched
            decisions = [d for d in (_decision_of(plan, key) for key in ids) if d is not None]
        records = self.records
        horizon = self.config.policy.commit_within
        due: list[Decision] = []
        watched: set[str] = set()
        for decision in decisions:
            if decision.outcome not in _WAITING:
                due.append(decision)
                continue
            record = records[decision.request_id]
            if self._news(record, decision):
                due.append(decision)
            elif horizon is not None and record.eta and decision.eta and decision.eta > record.eta:
                watched.add(decision.request_id)  # within the horizon, it will be news
        service._due_chain = _DueChain(
            plans, self.config.policy, frozenset(d.request_id for d in due), watched
        )
        return due

    def _news(self, record: RequestRecord, decision: Decision) -> bool:
        """Whether a waiting request's new estimate is worth a write and an event: another
        reason or pool, an ETA appearing or vanishing, or one that moved by more than the
        tolerance (ETAs behind a provisioning grant drift with the clock; a shifted queue
        position alone is not news) — or, within the commitment horizon, any later one."""
        if record.reason != decision.reason or record.pool != decision.pool_id:
            return True
        told, eta = record.eta, decision.eta
        if told is None or eta is None:
            return told != eta
        horizon = self.config.policy.commit_within
        if horizon is not None and eta > told and eta - self.now < horizon:
            return True  # within the horizon an ETA is a promise: a later one is always told
        return abs(eta - told) > self.settings.eta_tolerance

    # Writes and events ------------------------------------------------------------------

    def _write(
        self, record: RequestRecord, state: RequestState, reason: str, message: str, *,
        pool: str | _Keep | None = KEEP, attempt: int | None = None,
        eta: datetime | None = None, position: int | None = None,
        lanes: tuple[Lane, ...] | None = None, hosts: tuple[Host, ...] | None = None,
    ) -> RequestRecord:  # fmt: skip
        """One fenced write, then its event on the bus (and the outbox cursor moved).
        ``pool`` defaults to the record's own, except back in line (PENDING), where a request
        has no pool until it is admitted again. ``hosts`` (a request going ACTIVE) are stored
        on the record and carried by the event."""
        current = self.records.get(record.request_id, record)
        if isinstance(pool, _Keep):
            keep_pool = None if state is S.PENDING else current.pool
        else:
            keep_pool = pool
        ready, ready_p90 = None, None
        if state is S.PENDING and keep_pool is not None and eta is not None:
            calendar = current.request.mode is Mode.CALENDAR
            known = None if calendar else self._ready_of(keep_pool)
            ready, ready_p90 = ready_etas(eta, known, reserved=calendar)
        event = StatusEvent(
            request_id=current.request_id,
            tenant=current.tenant,
            state=state,
            previous_state=current.state,
            at=self.now,
            reason=reason or None,
            message=message,
            eta=eta,
            ready_eta=ready,
            ready_eta_p90=ready_p90,
            position=position,
            pool=keep_pool,
            hosts=hosts_after(current.hosts, state, hosts),
        )
        self._renew_lease()
        final = state.is_final
        change = Change(
            expected_version=current.version, state=state, event=event, reason=reason or None,
            message=message, pool=keep_pool, eta=eta, position=position, attempt=attempt,
            lanes=lanes, usage=usage_of(current, state, self.now, self.config) if final else None,
            hosts=hosts,
        )  # fmt: skip
        changed = self.store.change(current.request_id, change, fence=self.fence)
        if self.metrics is not None:
            telemetry.record_write(self.metrics, current, changed, self.now, change.usage)
        self.mirror.record(changed)
        if state is not current.state:
            self._set_timers(current, changed)
        self._keep(changed)
        if state is current.state:
            self.report.revisions += 1
        else:
            self.report.transitions[current.state, state] += 1
        self._announce(changed, [event])
        return changed

    def _set_timers(self, before: RequestRecord, after: RequestRecord) -> None:
        """Arm the timer of the new state (a run's end, a block's start); delete every timer
        of a request that ended — on the request's lane, after its write, off the pass's
        thread (Cloud Tasks calls). A failure only costs promptness: the sweep is the net."""
        timers, now = self.timers, self.now
        if timers is None:
            return
        if after.state.is_final:
            disarm = timers_to_disarm(before)

            def work() -> None:
                for timer in disarm:
                    timers.disarm(timer)
        elif after.state is S.ACTIVE and after.since is not None:
            timer = release_timer(after, after.since)

            def work() -> None:
                timers.arm(timer, now)
        elif after.state is S.BOOKED:
            timer = start_timer(after)

            def work() -> None:
                timers.arm(timer, now)
        else:
            return
        self.timing.append((after.request_id, self.service._ordered.submit(after.request_id, work)))

    def _renew_lease(self) -> None:
        """Keep the lease through a long pass; stop (Fenced) if it was lost meanwhile."""
        self.writes += 1
        if self.writes % self.settings.renew_every:
            return
        fence = self.store.acquire_lease(
            self.fence.holder, self.clock.now(), self.settings.lease_ttl
        )
        if fence is None or fence.token != self.fence.token:
            raise Fenced(f"{self.fence.holder} lost the reconciler lease during its pass")
        self.fence = fence

    def _announce(self, record: RequestRecord, events: list[StatusEvent]) -> None:
        """Publish ``events`` and then move the record's outbox cursor past them, in the
        record's own order (service.ordered), off the pass's thread. The pass's copy of the
        record counts them announced once they are (see _gather)."""
        bus, store = self.bus, self.store
        request_id, count = record.request_id, record.events

        def announce() -> None:
            for event in events:
                bus.publish(event)
            store.mark_announced(request_id, count)

        future = self.service._ordered.submit(request_id, announce)
        self.announcing.append(_Announcing(request_id, count, len(events), future))

    def _keep(self, record: RequestRecord) -> None:
        """Hold ``record`` as the pass's copy, counting what Google is still to serve."""
        before = self.records.get(record.request_id)
        self.records[record.request_id] = record
        self.in_flight += in_flight(record) - (before is not None and in_flight(before))

    def _announce_backlog(self) -> None:
        """Publish events an earlier pass recorded but did not get to publish (it crashed)."""
        for stored in self.store.unannounced():
            record = self.records.get(stored.request_id, stored)
            if record.announced < record.events:
                missing = self.store.events(record.request_id)[record.announced :]
                self._announce(record, missing)


def _block_view(block_id: str, block: RequestRecord | None) -> BlockView:
    """What the rule of jobs into blocks reads of ``block`` (None: no longer stored, long
    ended)."""
    if block is None:
        return BlockView(
            request_id=block_id, state=S.EXPIRED, message="the block is no longer stored"
        )
    return BlockView(
        request_id=block_id, state=block.state, own_run=block_run_on(block),
        units=block.request.units, pool=block.pool, message=block.message,
    )  # fmt: skip


def _forget_gone(cache: dict[str, Any], records: Mapping[str, RequestRecord]) -> None:
    """Drop the entries of requests no longer live from a per-request cache once it holds
    more than twice as many entries as there are live requests, plus 64 (an entry is checked
    against its record's version before use, so a stale one only takes room; sweeping it
    every pass would cost every pass a look at every live request)."""
    if len(cache) > 2 * len(records) + 64:
        for request_id in [key for key in cache if key not in records]:
            del cache[request_id]


def _slot(decision: Decision) -> tuple[str, datetime] | None:
    """Where a held request's decision holds it: (pool, start); None for any other."""
    if decision.outcome is Outcome.HOLD and decision.pool_id and decision.start_at:
        return decision.pool_id, decision.start_at
    return None


_START = itemgetter(1)


def _decision_of(plan: Plan, request_id: str) -> Decision | None:
    """The plan's decision for ``request_id``, if it has one: found by halving (the plan's
    decisions are sorted by id), not through an index of all of them."""
    decisions = plan.decisions
    index = bisect.bisect_left(decisions, request_id, key=_REQUEST_ID)
    if index < len(decisions) and decisions[index].request_id == request_id:
        return decisions[index]
    return None


_REQUEST_ID = attrgetter("request_id")


def _apply_order(decision: Decision, plan: Plan, first: dict[Outcome, int]) -> tuple[int, int, str]:
    """Starts first, then confirmations, then the rest; within each, the plan's rank (calendar
    and screened decisions have none), then the id."""
    rank = plan.rank(decision.request_id) or 0
    return first.get(decision.outcome, 2), rank, decision.request_id


def _served_hosts(
    record: RequestRecord, step: Step, seen: Mapping[Lane, Sighting | None]
) -> tuple[Host, ...] | None:
    """Where the capacity of a request the step makes ACTIVE is: the hosts its serving order
    was observed with (the step's lane, or the record's one order); None for any other step
    (the record keeps what it has)."""
    if step.target is not RequestState.ACTIVE or step.target is record.state:
        return None
    lanes = step.lanes or _lanes(record)
    sighting = seen.get(lanes[0]) if lanes else None
    return () if sighting is None else sighting.observed.hosts


def _lanes(record: RequestRecord) -> tuple[Lane, ...]:
    """The lanes a sweep looks at: the record's orders, or the one it is about to have."""
    return record.orders or (Lane(record.pool or "", record.attempt),)


def _documents_read(store: object) -> int | None:
    """Documents the store has read so far, where it counts them (Firestore's stores do)."""
    count = getattr(store, "documents_read", None)
    return count if isinstance(count, int) else None


def _release(provider: CapacityProvider, order: Order) -> None:
    provider.release(order.name, order.pool)


def _runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


def _learned(pool: Pool, short_until: datetime | None, serve_wait: timedelta) -> Pool:
    """``pool`` with what the reconciler learned of it: a stockout's cool-down (never
    shortened) and how long Google takes to serve an order there (see Pool.serve_wait)."""
    if short_until is not None and pool.short_until is not None:
        short_until = max(short_until, pool.short_until)
    short_until = short_until or pool.short_until
    if short_until == pool.short_until and serve_wait == pool.serve_wait:
        return pool
    return replace(pool, short_until=short_until, serve_wait=serve_wait)


def _grant(record: RequestRecord, now: datetime, expected_wait: timedelta = timedelta(0)) -> Grant:
    """The request's committed hold: a block over its window; a flex run from its admission
    to its (projected) end (see :func:`~opendws.ports.records.hold_end`)."""
    assert record.pool is not None
    start, end = _span(record, now, expected_wait)
    return Grant.of(record.request, record.pool, start, end_at=end)


def _span(
    record: RequestRecord, now: datetime, expected_wait: timedelta
) -> tuple[datetime, datetime]:
    """Where :func:`_grant`'s hold starts and ends."""
    request = record.request
    start = request.start_at if request.start_at is not None else record.since or now
    return start, hold_end(record, now, expected_wait)


def _kept_by_google(observed: Observed, now: datetime) -> bool:
    """A block with nothing running in it that Google no longer lets anyone cancel (its
    lockTime passed, or it never had one: not cancellable since its approval): it stays
    (billed) until its end."""
    return (
        observed.phase in (ProvisionPhase.APPROVED, ProvisionPhase.RESERVED)
        and observed.ends_at is not None
        and now < observed.ends_at
        and (observed.locked_at is None or observed.locked_at < now)
    )
