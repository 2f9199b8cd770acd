"""The end of a request: release (early or on time), cancel, and the timers that end runs.

- ``release``: the tenant is done. An ACTIVE run is released (RELEASED); one still
  provisioning, pending or booked has not run, so it is cancelled (CANCELLED).
- ``cancel``: withdraw a request that is not running yet (PENDING, BOOKED or PROVISIONING);
  a running one is refused with a message saying to release it.
- ``fire``: a timer is due. A release timer ends its run (EXPIRED); an expiry timer times out
  a flex request still waiting (TIMED_OUT); a start timer asks the reconciler to start a
  calendar block. A timer for a request already ended, or for an older run (generation), is
  acknowledged and ignored; a hop of a long timer re-arms the next hop.

Only the request's tenant (or an admin) may release or cancel it; anyone else gets a refusal
event and nothing changes. Every ending is one version-guarded write with the request's usage
entry, then the cloud resources are released, its timers deleted, its event published and the
reconciler nudged so that the freed capacity is admitted at once. A crash after the write
leaves resources no live request wants — the reconciler releases them — and an event in the
outbox the reconciler drains; repeating a release or a timer changes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from opendws.domain.calendar import may_cancel, why_not_cancellable
from opendws.domain.model import Mode
from opendws.domain.reasons import Expiry
from opendws.domain.states import RequestState
from opendws.ports import (
    AnnouncedRequests,
    Change,
    Clock,
    ConfigStore,
    Configuration,
    EventBus,
    Nudger,
    Order,
    Providers,
    RequestRecord,
    StaleWrite,
    StatusEvent,
    Timer,
    TimerKind,
    TimerQueue,
    Withdrawal,
    submitted,
)
from opendws.ports.telemetry import Metrics
from opendws.service import telemetry
from opendws.service.timers import timers_to_disarm
from opendws.service.usage import HOUR, usage_of

log = logging.getLogger(__name__)

S = RequestState
# A timer firing earlier than this before its time is a hop of a long timer, not the timer.
EARLY = timedelta(minutes=1)
# Version conflicts (the reconciler wrote meanwhile) are retried this many times.
ATTEMPTS = 5


class EndOutcome(StrEnum):
    """What a release, cancel or timer did."""

    ENDED = "ENDED"  # the request reached a final state now
    ALREADY_ENDED = "ALREADY_ENDED"  # it had already ended: nothing changed (a repeat)
    REFUSED = "REFUSED"  # not allowed (another tenant, unknown request, not cancellable)
    IGNORED = "IGNORED"  # a timer that no longer applies
    REARMED = "REARMED"  # a hop of a long timer: the next hop is armed
    NUDGED = "NUDGED"  # a start timer: the reconciler was asked to start the block
    KEPT = "KEPT"  # a calendar block's job ended: its VMs are kept until the block ends


class EndReason(StrEnum):
    """Reasons on the events of this service."""

    RELEASED = "RELEASED"  # the tenant released it
    CANCELLED = "CANCELLED"  # the tenant cancelled it
    NOT_YOUR_REQUEST = "NOT_YOUR_REQUEST"  # refused: another tenant's request
    UNKNOWN_REQUEST = "UNKNOWN_REQUEST"  # refused: no such request
    NOT_CANCELLABLE = "NOT_CANCELLABLE"  # refused: running, or a block Google keeps
    CLOUD_UNAVAILABLE = "CLOUD_UNAVAILABLE"  # refused for now: Google could not be asked
    # A request's run ended (service.agents): its job succeeded or failed on every rank, or
    # its agents were lost; released as a tenant's release would be.
    JOB_SUCCEEDED = "JOB_SUCCEEDED"
    JOB_FAILED = "JOB_FAILED"
    AGENT_LOST = "AGENT_LOST"
    # A CI run's runner took no job within its mapping's idle time: deleted, and released.
    RUNNER_IDLE = "RUNNER_IDLE"


# The reasons a run ends with (service.agents): the job's verdict, or its agents lost.
JOB_ENDINGS = frozenset({EndReason.JOB_SUCCEEDED, EndReason.JOB_FAILED, EndReason.AGENT_LOST})
# What an event says of a calendar block's bill (compute/docs/instances/
# delete-future-reservations-calendar-mode: an approved block is billed in full).
BILLED_IN_FULL = "Google Cloud bills the block in full to its end either way"


def block_job_over(record: RequestRecord) -> bool:
    """Whether ``record`` is a running calendar block whose own job has ended while its VMs
    are kept until the block ends (``run.release_on_end`` false): the request stays ACTIVE
    with the job's verdict as its reason."""
    return (
        record.request.mode is Mode.CALENDAR
        and record.request.block is None
        and record.state is S.ACTIVE
        and record.reason in {reason.value for reason in JOB_ENDINGS}
    )


def block_run_on(record: RequestRecord) -> bool:
    """Whether the running calendar block ``record`` has its own run on its VMs now (not
    over, and not capacity only): jobs into it wait until it is over."""
    return (
        record.state is S.ACTIVE and record.request.run is not None and not block_job_over(record)
    )


def runs_attempt(record: RequestRecord, attempt: int) -> bool:
    """Whether ``attempt`` is a run of ``record``: one of its orders', or for a job into a
    block (which has no order of its own) its one attempt on the block's VMs."""
    if record.request.block is not None:
        return record.attempt == attempt
    return attempt in {lane.attempt for lane in record.orders}


def keeps_vms(record: RequestRecord) -> bool:
    """Whether the end of ``record``'s job leaves its VMs running: a calendar block whose run
    does not say ``release_on_end`` (Google bills the block in full whatever is done, so its
    capacity stays the tenant's until the block ends)."""
    run = record.request.run
    return (
        record.request.mode is Mode.CALENDAR
        and record.request.block is None  # a job into a block leaves the VMs to the block
        and run is not None
        and not run.release_on_end
    )


@dataclass(frozen=True, slots=True)
class EndResult:
    """The outcome, and the state the request is in afterwards (None if unknown)."""

    outcome: EndOutcome
    state: RequestState | None
    message: str


def block_cancel_refusal(
    record: RequestRecord, configuration: Configuration, now: datetime
) -> str | None:
    """Why Google would refuse to cancel this calendar block now (None: it would not, or the
    record is no booked block): the configured rule (``policy.calendar_cancellation``) applied
    to its start and its approval (when opendws saw it BOOKED). The end service checks it
    before asking Google; ``dws cancel`` before publishing."""
    request = record.request
    if request.start_at is None or record.state is not S.BOOKED or record.since is None:
        return None
    rule = configuration.policy.calendar_cancellation
    if may_cancel(rule, start=request.start_at, approved_at=record.since, now=now):
        return None
    return _not_cancellable(record, configuration, record.since, now)


def _not_cancellable(
    record: RequestRecord, configuration: Configuration, approved_at: datetime, now: datetime
) -> str:
    """The refusal of a cancel Google keeps a block for: the rule, its end, its whole cost."""
    request = record.request
    assert request.start_at is not None
    price = configuration.price(request.gang.accelerator)
    hours = request.accelerator_units * request.run_duration / HOUR
    return f"{record.request_id!r} can no longer be cancelled: " + why_not_cancellable(
        configuration.policy.calendar_cancellation, start=request.start_at,
        end=request.start_at + request.run_duration, approved_at=approved_at, now=now,
        cost=None if price is None else price.cost(request.mode, hours),
    )  # fmt: skip


class EndService:
    """Release, cancel and timers (see the module docstring)."""

    def __init__(
        self, store: AnnouncedRequests, config: ConfigStore, providers: Providers,
        timers: TimerQueue | None, bus: EventBus, nudger: Nudger, clock: Clock,
        metrics: Metrics | None = None,
    ) -> None:  # fmt: skip
        self._metrics = metrics  # None: nothing is measured
        self._store = store
        self._config = config
        self._providers = providers
        self._timers = timers  # None: no timers are armed, so none to delete or re-arm
        self._bus = bus
        self._nudger = nudger
        self._clock = clock

    # Release and cancel -----------------------------------------------------------------

    def release(self, request_id: str, tenant: str, *, admin: bool = False) -> EndResult:
        """The tenant is done with ``request_id``: give its capacity back now."""
        return self._by_tenant(request_id, tenant, admin=admin, cancel=False)

    def cancel(self, request_id: str, tenant: str, *, admin: bool = False) -> EndResult:
        """Withdraw ``request_id`` before it runs."""
        return self._by_tenant(request_id, tenant, admin=admin, cancel=True)

    def _by_tenant(self, request_id: str, tenant: str, *, admin: bool, cancel: bool) -> EndResult:
        action = "cancel" if cancel else "release"
        for _ in range(ATTEMPTS):
            record = self._store.get(request_id)
            if record is None:
                return self._refuse(
                    request_id, tenant, None, EndReason.UNKNOWN_REQUEST,
                    f"request_id: no request {request_id!r} to {action}",
                )  # fmt: skip
            if record.tenant != tenant and not admin:
                return self._refuse(
                    request_id, tenant, record.state, EndReason.NOT_YOUR_REQUEST,
                    f"tenant: {request_id!r} belongs to another tenant; only its own tenant "
                    f"(or an admin) may {action} it",
                )  # fmt: skip
            if record.state.is_final:
                return EndResult(EndOutcome.ALREADY_ENDED, record.state, f"already {record.state}")
            if cancel and record.state is S.ACTIVE:
                return self._refuse(
                    request_id, tenant, record.state, EndReason.NOT_CANCELLABLE,
                    f"{request_id!r} is running; release it to give its capacity back",
                )  # fmt: skip
            if record.request.mode is Mode.CALENDAR and record.state in (S.PENDING, S.BOOKED):
                refused = self._withdraw(record, tenant)
                if refused is not None:
                    return refused
            elif cancel and record.request.mode is Mode.CALENDAR and record.state is S.PROVISIONING:
                return self._refuse(
                    request_id, tenant, record.state, EndReason.NOT_CANCELLABLE,
                    f"{request_id!r} is a calendar block that has started: Google Cloud bills "
                    "it in full to its end; release it to delete its VMs",
                )  # fmt: skip
            running = record.state is S.ACTIVE
            state = S.RELEASED if running else S.CANCELLED
            reason = EndReason.RELEASED if running else EndReason.CANCELLED
            who = "an admin" if admin and record.tenant != tenant else "its tenant"
            message = f"{'released' if running else 'cancelled'} by {who}"
            try:
                return self._end(record, state, reason, message)
            except StaleWrite:
                continue  # the reconciler moved it meanwhile: look again
        raise StaleWrite(f"{request_id} kept changing while being ended; try again")

    def finish_run(
        self, request_id: str, attempt: int, reason: EndReason, message: str
    ) -> EndResult:
        """The job of ``request_id``'s ``attempt`` is over (``reason``: JOB_SUCCEEDED,
        JOB_FAILED, AGENT_LOST or RUNNER_IDLE): release its capacity now, as a tenant's
        release would (RELEASED, with the reason and ``message``). A run of another attempt,
        or a request not running, is left as it is (IGNORED); one already ended is
        ALREADY_ENDED. Safe to repeat.

        A calendar block is billed in full whatever is done (:data:`BILLED_IN_FULL`): unless
        its run says ``release_on_end``, its VMs are kept until the block ends — the request
        stays ACTIVE, its reason the job's, and the event says until when — and with it they
        are deleted as for any run, the event saying the block is still billed in full.

        A job into a block (``request.block``) has no order of its own: it is RELEASED and
        the block's VMs are left as they are (its attempt is its record's)."""
        for _ in range(ATTEMPTS):
            record = self._store.get(request_id)
            if record is None:
                return EndResult(EndOutcome.IGNORED, None, f"no request {request_id!r}")
            if record.state.is_final:
                return EndResult(EndOutcome.ALREADY_ENDED, record.state, f"already {record.state}")
            if block_job_over(record):
                return EndResult(
                    EndOutcome.ALREADY_ENDED, record.state,
                    f"the job of block {request_id!r} already ended ({record.reason})",
                )  # fmt: skip
            if record.state is not S.ACTIVE or not runs_attempt(record, attempt):
                return EndResult(
                    EndOutcome.IGNORED, record.state,
                    f"{request_id!r} does not run attempt {attempt} (it is {record.state})",
                )  # fmt: skip
            try:
                if reason in JOB_ENDINGS and keeps_vms(record):
                    return self._keep_block(record, reason, message)
                if record.request.mode is Mode.CALENDAR and record.request.block is None:
                    message += (
                        f"; the block's VMs are deleted now (release_on_end); "
                        f"{BILLED_IN_FULL} at {_block_end(record)}"
                    )
                return self._end(record, S.RELEASED, reason, message)
            except StaleWrite:
                continue  # the reconciler moved it meanwhile: look again
        raise StaleWrite(f"{request_id} kept changing while its run was being ended; try again")

    def _keep_block(self, record: RequestRecord, reason: EndReason, said: str) -> EndResult:
        """A calendar block's job ended (``reason``, ``said``: each rank's exit): the request
        stays ACTIVE with its VMs until the block ends (a revision, announced)."""
        now = self._clock.now()
        verdict = reason.value.removeprefix("JOB_").lower().replace("_", " ")
        message = (
            f"job ended ({verdict}: {said}); the block's VMs are kept until its end at "
            f"{_block_end(record)} (release_on_end is false); {BILLED_IN_FULL}. Release the "
            "block to delete them now"
        )
        event = StatusEvent(
            request_id=record.request_id, tenant=record.tenant, state=S.ACTIVE,
            previous_state=S.ACTIVE, at=now, reason=reason.value, message=message,
            pool=record.pool,
        )  # fmt: skip
        changed = self._store.change(
            record.request_id,
            Change(
                expected_version=record.version, state=S.ACTIVE, event=event,
                reason=reason.value, message=message, pool=record.pool,
            ),
        )  # fmt: skip
        self._bus.publish(event)
        self._store.mark_announced(record.request_id, changed.events)
        self._nudge_freed(record.request_id, S.ACTIVE)  # a job into the block may start now
        return EndResult(EndOutcome.KEPT, S.ACTIVE, message)

    def _withdraw(self, record: RequestRecord, tenant: str) -> EndResult | None:
        """Cancel a calendar block at Google before it is written CANCELLED (None: done, or
        nothing to cancel there), or the refusal: Google's rule (the configured one, see
        ``domain.calendar``) checked first so that a cancel Google would refuse is refused at
        once, then Google's own verdict. Either way a refusal changes nothing."""
        request = record.request
        assert request.start_at is not None  # a calendar block
        configuration = self._config.load()
        approved_at = record.since if record.state is S.BOOKED else None
        now = self._clock.now()
        refusal = block_cancel_refusal(record, configuration, now)
        if refusal is not None:
            return self._refuse(
                record.request_id, tenant, record.state, EndReason.NOT_CANCELLABLE, refusal
            )
        pool = {p.pool_id: p for p in configuration.pools}.get(record.pool or "")
        if pool is None or record.attempt == 0:
            return None  # never submitted, or its pool is gone: nothing to cancel at Google
        order = Order(request=request, pool=pool, attempt=record.attempt)
        try:
            outcome = self._providers.blocks(pool).withdraw(order.name, pool)
        except Exception as error:
            return self._refuse(
                record.request_id, tenant, record.state, EndReason.CLOUD_UNAVAILABLE,
                f"Google Cloud could not be asked to cancel the block now ({error}); nothing "
                "changed, try again",
            )  # fmt: skip
        if outcome is Withdrawal.REFUSED:  # Google's own verdict
            return self._refuse(
                record.request_id, tenant, record.state, EndReason.NOT_CANCELLABLE,
                _not_cancellable(record, configuration, approved_at or now, now),
            )  # fmt: skip
        return None

    # Timers -----------------------------------------------------------------------------

    def fire(self, timer: Timer) -> EndResult:
        """A timer is due (see the module docstring). Safe to repeat."""
        now = self._clock.now()
        if now < timer.fire_at - EARLY:
            if self._timers is None:
                return EndResult(EndOutcome.IGNORED, None, "early, and no timers to re-arm")
            self._timers.arm(replace(timer, hop=timer.hop + 1), now)
            return EndResult(EndOutcome.REARMED, None, f"re-armed for {timer.fire_at}")
        for _ in range(ATTEMPTS):
            record = self._store.get(timer.request_id)
            if record is None:
                return EndResult(EndOutcome.IGNORED, None, "no such request")
            try:
                return self._fire(timer, record, now)
            except StaleWrite:
                continue
        raise StaleWrite(f"{timer.request_id} kept changing while its timer fired; try again")

    def _fire(self, timer: Timer, record: RequestRecord, now: datetime) -> EndResult:
        request = record.request
        if timer.kind is TimerKind.RELEASE:
            if record.state is S.ACTIVE and record.attempt == timer.generation:
                return self._end(record, S.EXPIRED, Expiry.RUN_TIME_UP, "run time is up; released")
        elif timer.kind is TimerKind.EXPIRY:
            deadline = request.deadline
            if record.state is S.PENDING and deadline is not None and now >= deadline:
                return self._end(
                    record, S.TIMED_OUT, Expiry.MAX_WAIT_PASSED,
                    "max_wait passed before capacity could be admitted",
                )  # fmt: skip
        elif record.state is S.BOOKED:
            self._nudger.nudge(f"block {record.request_id} starts")
            return EndResult(EndOutcome.NUDGED, record.state, "the reconciler starts the block")
        return EndResult(EndOutcome.IGNORED, record.state, f"{timer.kind} timer no longer applies")

    # Ending -----------------------------------------------------------------------------

    def _end(
        self, record: RequestRecord, state: RequestState, reason: EndReason | Expiry, message: str
    ) -> EndResult:
        """Write the final state with its usage; then release, disarm, announce, nudge."""
        now = self._clock.now()
        configuration = self._config.load()
        event = StatusEvent(
            request_id=record.request_id, tenant=record.tenant, state=state,
            previous_state=record.state, at=now, reason=reason.value, message=message,
            pool=record.pool,
        )  # fmt: skip
        usage = usage_of(record, state, now, configuration)
        changed = self._store.change(
            record.request_id,
            Change(
                expected_version=record.version, state=state, event=event,
                reason=reason.value, message=message, pool=record.pool, usage=usage,
            ),
        )  # fmt: skip
        if self._metrics is not None:
            telemetry.record_write(self._metrics, record, changed, now, usage)
        pools = {p.pool_id: p for p in configuration.pools}
        if record.state in (S.PROVISIONING, S.ACTIVE, S.BOOKED) or submitted(record):
            # Every order it has open: one per raced pool while it provisions.
            for lane in record.orders:
                pool = pools.get(lane.pool)
                if pool is None:
                    continue
                order = Order(request=record.request, pool=pool, attempt=lane.attempt)
                provider = self._providers.for_order(pool, record.request.mode)
                try:
                    provider.release(order.name, pool)
                except Exception as error:  # the reconciler releases it as a leak
                    telemetry.log_cloud_call(
                        "release", order.name, pool.pool_id, request_id=record.request_id,
                        tenant=record.tenant, error=error,
                    )  # fmt: skip
                else:
                    telemetry.log_cloud_call(
                        "release", order.name, pool.pool_id, request_id=record.request_id,
                        tenant=record.tenant,
                    )  # fmt: skip
        self._disarm(record)
        self._bus.publish(event)
        self._store.mark_announced(record.request_id, changed.events)
        self._nudge_freed(record.request_id, state)
        return EndResult(EndOutcome.ENDED, state, message)

    def _nudge_freed(self, request_id: str, state: RequestState) -> None:
        """Ask for a pass now, so the freed capacity is admitted at once. Best effort: the
        request has ended whatever happens here, and a lost nudge only costs the wait until
        the next tick."""
        try:
            self._nudger.nudge(f"{request_id} {state.lower()}")
        except Exception as error:
            log.warning("nudge after %s not sent; the next tick admits: %s", request_id, error)

    def _disarm(self, record: RequestRecord) -> None:
        """Delete the ended request's timers (one that fires anyway finds it ended)."""
        if self._timers is None:
            return
        for timer in timers_to_disarm(record):
            try:
                self._timers.disarm(timer)
            except Exception as error:
                log.warning("timer %s not deleted: %s", timer.name, error)

    def _refuse(
        self, request_id: str, tenant: str, state: RequestState | None, reason: EndReason,
        message: str,
    ) -> EndResult:  # fmt: skip
        """Announce a refusal to the asking tenant; nothing is stored or changed."""
        shown = state or S.REJECTED
        self._bus.publish(
            StatusEvent(
                request_id=request_id,
                tenant=tenant,
                state=shown,
                previous_state=state,
                at=self._clock.now(),
                reason=reason.value,
                message=message,
            )
        )
        return EndResult(EndOutcome.REFUSED, state, message)


def _block_end(record: RequestRecord) -> str:
    """When ``record``'s calendar block ends, as events write instants (ISO 8601)."""
    request = record.request
    assert request.start_at is not None  # a calendar block
    return (request.start_at + request.run_duration).isoformat()
