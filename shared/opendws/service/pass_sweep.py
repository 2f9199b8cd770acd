"""Steps 2 and 3 of a reconcile pass (:class:`SweepStep`): observe the providers where something
may have changed, and sweep the live requests against what was observed through the pure table
of :mod:`opendws.domain.sweep`, releasing what no live request wants; then step the jobs into
calendar blocks (:mod:`opendws.domain.block_jobs`). :meth:`SweepStep._carry_out` is the sweep's
one writer.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime

from opendws.domain.block_jobs import BlockView, JobView, block_jobs
from opendws.domain.model import Pool
from opendws.domain.planner.verdicts import Alternative, offered
from opendws.domain.provisioning import Lane, ProvisionPhase
from opendws.domain.states import RequestState
from opendws.domain.sweep import (
    Call,
    LaneView,
    Step,
    SweepReason,
    SweepView,
    steady_until,
    sweep,
)
from opendws.ports import (
    CapacityProvider,
    CloudRateLimited,
    Host,
    Observed,
    Order,
    RequestRecord,
    Sighting,
    hold_end,
    order_name,
    submitted,
)
from opendws.service import telemetry
from opendws.service.cloud_calls import Call as CloudCall
from opendws.service.mirror import Held
from opendws.service.pass_chain import BROKEN, PassChain, Quiet, SweepInputs
from opendws.service.pass_writes import KEEP, CallLabel, PassWrites, ReconcileReason, with_learned
from opendws.service.release import block_run_on

log = logging.getLogger(__name__)

S = RequestState


class SweepStep(PassWrites):
    """A pass's steps 2 and 3 (see :meth:`_observe_and_sweep`)."""

    # The providers' look after which this pass's sweep ran to its end, and the pools
    # configured then (None: it did not): the next pass's chain (see PassChain.sweep_follows).
    swept: tuple[int, frozenset[str]] | None = None
    chain: PassChain = BROKEN  # what the last pass left this one (taken when it starts)

    def _observe_and_sweep(self, held: Held) -> bool:
        """Steps 2 and 3 for the requests ``held`` (the mirror's refresh); False if the pass
        ends before its look (the cloud's rate quota is spent: the next pass looks once it
        refills)."""
        # 2. Observe the providers where something may have changed (every pool, at times).
        live = held.live
        looked, whole = self._pools_to_observe(live.values())
        observed = self._observe(looked)
        if observed is None:
            return False
        this_look = (self.providers.looks, self.providers.changed)  # taken at once
        self.report.observed_pools, self.report.observed_all = len(looked), whole
        # What no live request wants: leaks, and blocks Google keeps.
        unwanted = {name: observed[name] for name in observed.keys() - held.wanted}
        # 3. Sweep the live requests against it; release what nobody wants.
        configured = frozenset(self.pools)
        again = self._sweep_again(configured, *this_look)
        quiet_of, look, now = self.kept.quiet.get, observed.get, self.now
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
            self.swept = (this_look[0], configured)
        self._watch({pool.pool_id for pool in looked}, unwanted, whole)
        for name in sorted(unwanted):
            self._release_leak(unwanted[name])
        # Jobs into calendar blocks: each runs on its block's VMs in turn, or ends with it
        # (no cloud call: the block holds the capacity).
        self._block_jobs(held.jobs)
        return True

    def _alternatives(
        self, record: RequestRecord, *, refused_in: str | None = None
    ) -> tuple[Alternative, ...]:
        """The starts a refused or declined block is offered (the cycle's: it plans them)."""
        raise NotImplementedError

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

    def _sweep_again(
        self, configured: frozenset[str], looks: int, looked_changed: set[str]
    ) -> set[str] | None:
        """The quiet requests this pass sweeps again (None: every one it finds quiet is
        checked): those whose record changed, those whose steady time came, and those an
        order of which the providers' look shows changed since the last pass's. That holds
        only if the last pass's sweep ran to its end right after the look before this one,
        with the same pools configured (PassChain.sweep_follows): otherwise every one is
        checked, as its Quiet says. A quiet request in none of these reads what its last
        sweep read. ``looks`` and ``looked_changed``: this pass's look's number and the order
        names it saw change."""
        changed = self.mirror.take_changed("sweep")
        if changed is None or not self.chain.sweep_follows(looks, configured):
            return None
        return self.kept.quiet.again(changed, looked_changed, self.now)

    def _pools_to_observe(self, live: Iterable[RequestRecord]) -> tuple[list[Pool], bool]:
        """The pools this pass observes, and whether they are all of them: every configured
        pool on the instance's first pass and once observe_all_every has passed since the
        last such pass; else those of live orders and those watched (see WatchedPools).
        Every order a live request has is in them, so the sweep never mistakes an order it
        did not look for for one Google lost."""
        watched = self.kept.watched
        watched.pools |= self.mirror.take_ended_pools()
        if watched.whole(self.now, self.settings.observe_all_every):
            return list(self.pools.values()), True
        # Configured pools no reason to look at has been found for yet: once none is left,
        # the other live requests cannot add one.
        unseen = self.pools.keys() - watched.pools
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
        self.kept.watched.after_look(
            looked, dirty, self.released_in, whole, set(self.pools), self.now
        )

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

    def _inputs(self, record: RequestRecord, seen: dict[Lane, Sighting | None]) -> SweepInputs:
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
        self, record: RequestRecord, seen: dict[Lane, Sighting | None], inputs: SweepInputs
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
            self.kept.quiet.drop(record.request_id)
        else:
            quiet = Quiet(
                inputs=inputs,
                until=steady_until(view, self.now, self.settings.sweep),
                pools=tuple(lane.pool for lane in lanes),
                names=tuple(order_name(record.request_id, lane.attempt) for lane in record.orders),
            )
            self.kept.quiet.note(record.request_id, quiet)
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
            self.pools[pool_id] = with_learned(
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
        label = CallLabel(Call.RELEASE, leak.name, leak.pool_id, None)
        self.calls.submit(
            [CloudCall(label, functools.partial(sighting.provider.release, leak.name, pool))]
        )


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


def _release(provider: CapacityProvider, order: Order) -> None:
    provider.release(order.name, order.pool)
