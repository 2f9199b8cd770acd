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
   one where the changes allow (``opendws.domain.planner.incremental``).
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
import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from operator import attrgetter, itemgetter

from opendws.domain.calendar import lead_of
from opendws.domain.model import Grant, Mode, Pool, Provider, Racer, Snapshot
from opendws.domain.planner.blocks import calendar_alternatives
from opendws.domain.planner.verdicts import Alternative, Decision, Outcome, Plan, Race, offered
from opendws.domain.provisioning import Lane
from opendws.domain.states import RequestState
from opendws.domain.sweep import Call
from opendws.ports import (
    BlockProvider,
    Clock,
    ConfigStore,
    EventBus,
    Fence,
    Fenced,
    Order,
    Providers,
    ReconcilerStore,
    RequestRecord,
    StaleWrite,
    TimerQueue,
    hold_end,
)
from opendws.ports.telemetry import Metrics
from opendws.service import telemetry
from opendws.service.ci_cap import within_caps
from opendws.service.cloud_calls import CloudCalls
from opendws.service.ordered import OrderedByKey
from opendws.service.parts import moves_with_clock, racing
from opendws.service.pass_chain import BROKEN, Kept, PassChain, forget_gone
from opendws.service.pass_report import PassOutcome, PassReport
from opendws.service.pass_sweep import SweepStep
from opendws.service.pass_writes import ReconcileReason
from opendws.service.reconcile_settings import ORDERED_THREADS, ReconcileSettings

__all__ = [
    "GOOGLE_LATE",
    "PassOutcome",
    "PassReport",
    "ReconcileReason",
    "ReconcileService",
    "ReconcileSettings",
]

log = logging.getLogger(__name__)

S = RequestState


# The clause an event's message carries when an ETA moved later because Google has not served
# runs admitted ahead of it by the pool's usual time (a cause outside the plan).
GOOGLE_LATE = "later than told because of Google's queue"


# The outcomes that leave a request PENDING, told its ETA and pool (see _due and _news).
_WAITING = frozenset((Outcome.HOLD, Outcome.WAIT))


class ReconcileService:
    """Runs reconcile passes (see the module docstring), one at a time: the deployed reconcile
    function serves one invocation at a time per instance (``concurrency = 1`` in infra/main.tf),
    so what the service keeps between passes (:class:`~opendws.service.pass_chain.Kept`) has
    one reader and writer, and no lock guards it. :meth:`run_pass` holds a lock of its own all
    the same, so that a second call made meanwhile (a local server serving requests on several
    threads) waits for the pass to end instead of sharing its state; a call from within a
    pass, which would wait forever, is refused. Passes of different instances exclude each
    other through the lease."""

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
        self._one_at_a_time = threading.Lock()  # held by run_pass
        self._running_on: int | None = None  # the thread a pass runs on (None: none runs)
        # The pool of this instance's cloud calls (service.cloud_calls: it has its own lock, for
        # its threads), and the threads a pass publishes its events and sets its timers on,
        # each request's in order (service.ordered).
        self._calls = CloudCalls(self._settings.call_limits)
        self._ordered = OrderedByKey(ORDERED_THREADS, "per-request")
        self.kept = Kept()  # what it keeps between passes, and when each is trusted

    def run_pass(self) -> PassReport:
        """One pass. Returns at once if another reconciler holds the lease; waits first for a
        pass of this service that is still running (one pass at a time, see the class).

        Each pass takes the lease under a name of its own (the service's, plus a pass count),
        as a new holder: a token of its own, which fences any write of the pass before, and
        the asks for another pass cleared, which it serves. The pass gives the lease up when
        it ends, however it ends (completed, stopped on a stale view, or raising), unless
        another reconciler took it over meanwhile."""
        if self._running_on == threading.get_ident():
            raise RuntimeError("run_pass was called from within a pass of the same service")
        with self._one_at_a_time:
            self._running_on = threading.get_ident()
            try:
                return self._measured_pass()
            finally:
                self._running_on = None

    def _measured_pass(self) -> PassReport:
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


class _Cycle(SweepStep):
    """One pass: the steps of the module docstring (2 and 3 in :class:`SweepStep`, the pass's
    writes in :class:`~opendws.service.pass_writes.PassWrites`); lives only inside
    :meth:`ReconcileService.run_pass`."""

    def run(self) -> None:
        """The cycle of the module docstring; the calls it submitted are gathered however it
        ends (a stopped pass's writes licensed them all the same)."""
        try:
            self._run()
        finally:
            self._gather()

    def _run(self) -> None:
        # What the last pass left this one; broken until this one ends (see PassChain).
        self.chain, self.kept.chain = self.kept.chain, BROKEN
        # 1. The lease is held (run_pass took it).
        # What changed since the last pass, on top of what it left (every request not final).
        held = self.mirror.refresh(self.store)
        self.records = held.records
        # Kept up to date by each write (see _keep), rather than counted again at the end.
        self.in_flight = held.in_flight
        self._announce_backlog()
        # 2 and 3. Observe, sweep, release what nobody wants; step the jobs into blocks.
        if not self._observe_and_sweep(held):
            return
        # 4. Snapshot and admission.
        snapshot = self._snapshot()
        planner = self.kept.planner
        plan = planner.plan(snapshot, self.now)
        plans, changed = planner.plans, planner.changed
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
        due, watched = self._due(plan, plans, changed)
        for decision in sorted(due, key=lambda d: _apply_order(d, plan, order)):
            if self._out_of_time():
                break
            with self._one_request(decision.request_id):
                self._apply(decision)
        self._record_ready()
        slots = self.kept.held = self._held_slots(plan, plans, changed)
        self.kept.serve_waits = {key: pool.serve_wait for key, pool in self.pools.items()}
        look, configured = self.swept or (None, frozenset[str]())
        self.kept.chain = PassChain(
            look=look, configured=configured, plans=plans, policy=self.config.policy,
            due=frozenset(d.request_id for d in due), watched=frozenset(watched),
        )  # fmt: skip
        self.report.next_start = min(map(_START, slots.values()), default=None)
        self.report.in_flight = self.in_flight

    def _held_slots(
        self, plan: Plan, plans: int, changed: set[str] | None
    ) -> dict[str, tuple[str, datetime]]:
        """Where ``plan`` (the planner's plan number ``plans``) holds each held request:
        right after the pass that carried out the planner's previous plan, the last pass's
        slots with those of the decisions the planner set anew (``changed``) put right (a new
        place in line is no new slot); otherwise read from every decision."""
        if changed is None or not self.chain.plan_follows(plans, self.config.policy):
            slots = {d.request_id: slot for d in plan.decisions if (slot := _slot(d)) is not None}
        else:
            slots = dict(self.kept.held)
            for key in changed:
                decision = _decision_of(plan, key)
                slot = None if decision is None else _slot(decision)
                if slot is None:
                    slots.pop(key, None)
                else:
                    slots[key] = slot
        return slots

    # Step 4: the snapshot ---------------------------------------------------------------

    def _snapshot(self, without: str | None = None) -> Snapshot:
        """What admission reads; ``without`` leaves one request out (to plan around it).

        Built from the parts kept between passes (:mod:`opendws.service.parts`), brought up
        to date for the requests the mirror saw change; only the grants that move with the
        clock are worked out again (a run being created, a race's lanes)."""
        mirror = self.mirror
        parts = self.kept.parts.update(
            mirror.take_changed("parts"),
            mirror.current,
            mirror.get,
            self._grant_of,
            self.kept.held,
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
        # Drop what no live request needs any more.
        forget_gone(self.kept.grants, self.records)
        self.kept.quiet.forget_gone(self.records)
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
        cached = self.kept.grants.get(record.request_id)
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
        self.kept.grants[record.request_id] = (record.version, grant, moving)
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
        before = self.kept.serve_waits.get(pool_id)
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

    def _due(
        self, plan: Plan, plans: int, changed: set[str] | None
    ) -> tuple[list[Decision], set[str]]:
        """The plan's decisions to carry out: every one that changes a request's state, and a
        waiting one with news (:meth:`_news`); and the waiting ones whose news may come with
        the clock alone (a later ETA, told within the commitment horizon once the clock brings
        it there), for the next pass's chain.

        Right after the pass that carried out the planner's previous plan
        (:meth:`PassChain.plan_follows`), only some can be due: those the planner set anew
        other than for a place in line, which is no news (``changed``, of plan number
        ``plans``), those whose record changed since (the mirror says which), those due then
        (one whose write was refused is due still) and those watched then. Any other is the
        same decision for the same record, found without news then. Otherwise (a full plan,
        a plan this service did not see, a pass that stopped before its end) every one is
        looked at."""
        records_changed = self.mirror.take_changed("due")
        chain = self.chain
        if (
            changed is None
            or records_changed is None
            or not chain.plan_follows(plans, self.config.policy)
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
        return due, watched

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


def _documents_read(store: object) -> int | None:
    """Documents the store has read so far, where it counts them (Firestore's stores do)."""
    count = getattr(store, "documents_read", None)
    return count if isinstance(count, int) else None


def _runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


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
