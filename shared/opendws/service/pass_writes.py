"""One reconcile pass's working state and its way out: the fenced write of a record and its
event, the timers of its new state, and the cloud calls that write licenses
(:class:`PassWrites`, which the sweep and the cycle of :mod:`opendws.service.reconcile` build
on).

Every write happens before the cloud call it licenses. The calls run in the pool of the
service's cloud calls (:mod:`opendws.service.cloud_calls`), the events and timers on its
per-request threads (:mod:`opendws.service.ordered`); those threads touch none of the pass's
state nor the service's: the pass gathers their outcomes on its own thread (:meth:`_gather`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING

from opendws.domain.model import CapacityRequest, Mode, Pool
from opendws.domain.provisioning import Lane
from opendws.domain.readiness import (
    Readiness,
    ReadySample,
    expected_wait,
    readiness_by_pool,
    ready_etas,
    samples_after,
)
from opendws.domain.states import RequestState
from opendws.domain.sweep import Call
from opendws.ports import (
    Change,
    Fence,
    Fenced,
    Host,
    Order,
    RequestRecord,
    StaleWrite,
    StatusEvent,
    hosts_after,
)
from opendws.service import telemetry
from opendws.service.cloud_calls import Call as CloudCall
from opendws.service.cloud_calls import CallBatch, OutOfTime
from opendws.service.cloud_calls import Outcome as CallOutcome
from opendws.service.mirror import in_flight
from opendws.service.pass_report import PassReport
from opendws.service.reconcile_settings import APPLY_SHARE, SWEEP_SHARE
from opendws.service.timers import release_timer, start_timer, timers_to_disarm
from opendws.service.usage import usage_of

if TYPE_CHECKING:
    from opendws.service.reconcile import ReconcileService

log = logging.getLogger(__name__)

S = RequestState


class _Keep:
    """The default of :meth:`PassWrites._write`'s ``pool``: keep the record's own."""


KEEP = _Keep()


class ReconcileReason(StrEnum):
    """Why the reconciler moved a request when it applied a plan (the admission core's and
    the sweep's reasons cover the rest: :class:`opendws.domain.planner.verdicts.Reason`,
    :class:`opendws.domain.sweep.SweepReason`)."""

    ADMITTED = "ADMITTED"  # the plan admitted it; provisioning starts
    # The plan fits the calendar block: submitted to Google, which reviews it (PENDING until
    # Google approves: then BOOKED, see SweepReason.APPROVED).
    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    # Google's Advice API has no capacity for the block as asked: refused before submitting.
    NO_CAPACITY_AT_GOOGLE = "NO_CAPACITY_AT_GOOGLE"
    RACING = "RACING"  # waiting at Google in short pools: offered to more pools at once


@dataclass(frozen=True, slots=True)
class _Announcing:
    """A record's events on their way out: ``events`` of them, after which its outbox
    cursor is at ``count``."""

    request_id: str
    count: int
    events: int
    future: Future[None]


@dataclass(frozen=True, slots=True)
class CallLabel:
    """What one cloud call of a pass is, for its report and log line: ``request`` None for
    the release of a leak (no live request wants it)."""

    action: Call
    name: str
    pool_id: str
    request: CapacityRequest | None

    def __str__(self) -> str:
        return f"{self.action} {self.name} in {self.pool_id}"


class PassWrites:
    """One pass's working state, and its writes, events, timers and cloud calls; lives only
    inside :meth:`~opendws.service.reconcile.ReconcileService.run_pass`."""

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
        self.service = service
        # What the service keeps between passes (one pass at a time reads and writes it).
        self.kept = service.kept
        self.mirror = service.kept.mirror
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
            pool.pool_id: with_learned(
                pool, shortages.get(pool.pool_id), expected_wait(self._ready_of(pool.pool_id))
            )
            for pool in self.config.pools
        }

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
        kept, every = self.kept.samples, self.settings.readiness_every
        if kept is None or not kept[0] <= self.now < kept[0] + every:
            kept = self.kept.samples = (self.now, dict(self.store.ready_samples()))
        return kept[1]

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
                self.kept.watched.pools.add(order.pool.pool_id)
                self.released_in.add(order.pool.pool_id)
            label = CallLabel(action, order.name, order.pool.pool_id, order.request)
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
        assert isinstance(label, CallLabel)
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


def with_learned(pool: Pool, short_until: datetime | None, serve_wait: timedelta) -> Pool:
    """``pool`` with what the reconciler learned of it: a stockout's cool-down (never
    shortened) and how long Google takes to serve an order there (see Pool.serve_wait)."""
    if short_until is not None and pool.short_until is not None:
        short_until = max(short_until, pool.short_until)
    short_until = short_until or pool.short_until
    if short_until == pool.short_until and serve_wait == pool.serve_wait:
        return pool
    return replace(pool, short_until=short_until, serve_wait=serve_wait)
