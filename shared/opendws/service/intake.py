"""Intake: one message from a request topic in, at most one stored request out, and every
outcome announced on ``capacity-events``.

Exactly-once effect over at-least-once delivery:

1. A valid submission is created with a create-if-absent precondition, together with its first
   event (PENDING). The same message again (a redelivery, or a client publishing twice) finds it
   already there and changes nothing; another request under the same id is refused.
2. The first event is then published and the record marked as announced — an outbox: if the
   process dies between the two, the redelivered message finds the record unannounced and
   publishes it. A duplicate that arrives while the first delivery may still be announcing is
   handed back to Pub/Sub (:class:`AnnouncementPending`) rather than announced twice.

Who a message speaks for is the topic it arrived on, never its body (Pub/Sub does not tell a
subscriber who published; a topic's publisher IAM says who may): on ``capacity-requests-{tenant}``
it acts as that tenant only, and a body claiming another tenant is refused
(``TENANT_MISMATCH``) with nothing stored; on ``capacity-admin-requests`` it acts for any
tenant, as an admin; on the shared ``capacity-requests`` only when the configuration trusts
every publisher (``shared_requests_topic``; off by default: ``UNTRUSTED_TOPIC``); on any other
topic it is refused (``UNKNOWN_TOPIC``).

Bad input never raises: it is acknowledged and answered with a REJECTED event whose message
names the field and the rule (a run's secrets are checked against its tenant's configured
``secret_prefix`` here, where the configuration is known). Transient faults (the store or the
bus unavailable) do raise, so that Pub/Sub redelivers; a dead-letter topic catches what keeps
failing.

A submission naming a calendar block (``block``) is a job into it: checked here against the
stored block (same tenant, a calendar block not ended, keeping its VMs for jobs) and stored
with the block's gang and window; the reconciler runs it on the block's VMs in turn
(:mod:`opendws.domain.block_jobs`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from opendws.domain.model import CapacityRequest
from opendws.domain.run import secret_prefix_problem
from opendws.domain.states import RequestState
from opendws.ports import (
    SHARED_REQUESTS_TOPIC,
    AnnouncedRequests,
    Change,
    Clock,
    ConfigStore,
    Configuration,
    CreateOutcome,
    EventBus,
    Identity,
    Nudger,
    RequestRecord,
    Speaker,
    StaleWrite,
    StatusEvent,
    TimerQueue,
    accepted,
    finished_first,
    identity_of_topic,
    order_name,
    requests_topic,
    vm_order,
)
from opendws.ports.runs import RankStore
from opendws.schema.request import (
    BlockSubmit,
    CiJob,
    MessageError,
    Release,
    Submit,
    parse_message,
    to_block_job,
    to_capacity_request,
)
from opendws.service.release import EndOutcome, EndService
from opendws.service.timers import expiry_timer

log = logging.getLogger(__name__)

# How long a duplicate waits for the first delivery to announce before announcing itself.
ANNOUNCE_GRACE = timedelta(seconds=30)
# Reasons on intake's events (the planner adds its own later).
INVALID_REQUEST = "INVALID_REQUEST"
ID_IN_USE = "ID_IN_USE"
UNSUPPORTED_ACTION = "UNSUPPORTED_ACTION"
TENANT_MISMATCH = "TENANT_MISMATCH"  # the body claims another tenant than its topic's
UNTRUSTED_TOPIC = "UNTRUSTED_TOPIC"  # the shared topic, while the configuration trusts it not
UNKNOWN_TOPIC = "UNKNOWN_TOPIC"  # a topic of no configured tenant
UNKNOWN_TENANT = "UNKNOWN_TENANT"  # a submission for a tenant the configuration lacks
# How long intake keeps the configuration between messages (a topic of a tenant it does not
# know yet makes it look again at once).
CONFIG_TTL = timedelta(seconds=30)


class IntakeOutcome(StrEnum):
    """What intake did with one message."""

    ACCEPTED = "ACCEPTED"  # stored as a new PENDING request and announced
    DUPLICATE = "DUPLICATE"  # the same request was already stored: nothing changed
    REFUSED = "REFUSED"  # bad input or a conflicting id: a REJECTED event says why
    APPLIED = "APPLIED"  # a cancel or release was carried out (or had been, for a repeat)


class CiJobReason(StrEnum):
    """Reasons of the events a running CI request gets when its runner takes or ends a job."""

    CI_JOB_RUNNING = "CI_JOB_RUNNING"  # its runner took a CI job
    CI_JOB_COMPLETED = "CI_JOB_COMPLETED"  # that job completed (its conclusion is said)


class AnnouncementPending(RuntimeError):
    """A duplicate found its request stored but not yet announced, recently: the first delivery
    is probably announcing it right now. Raised so that Pub/Sub redelivers later."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One Pub/Sub message as the function received it."""

    data: bytes
    message_id: str
    published_at: datetime
    attributes: dict[str, str]
    topic: str | None = None  # the topic's short name it arrived on (None: not known)


@dataclass(frozen=True, slots=True)
class IntakeResult:
    """The outcome for one message, and the request it concerned."""

    outcome: IntakeOutcome
    request_id: str
    message: str


class IntakeService:
    """Turns request messages into stored requests and events (see the module docstring)."""

    def __init__(
        self, store: AnnouncedRequests, bus: EventBus, clock: Clock, *, config: ConfigStore,
        ending: Callable[[], EndService] | None = None, timers: TimerQueue | None = None,
        nudger: Nudger | None = None, ranks: RankStore | None = None,
    ) -> None:  # fmt: skip
        self._store = store
        self._ranks = ranks  # where a CI runner's VM is found by name (None: running ones)
        self._bus = bus
        self._clock = clock
        self._config = config
        self._configuration: tuple[datetime, Configuration] | None = None
        # Built on first use (submissions never need it); None: cancel and release are refused.
        self._ending = ending
        self._timers = timers  # None: no expiry timers (the reconciler times requests out)
        self._nudger = nudger  # None: admission waits for the reconciler's next tick

    def handle(self, delivery: Delivery) -> IntakeResult:
        """Take one delivery; raises only for transient faults (redelivery helps)."""
        identity = self._identity(delivery.topic)
        if identity.speaker is Speaker.UNKNOWN:
            return self._refuse(
                delivery, UNKNOWN_TOPIC,
                f"topic: {delivery.topic!r} is the topic of no configured tenant; nothing was "
                "taken from it",
            )  # fmt: skip
        if identity.speaker is Speaker.UNTRUSTED:
            return self._refuse(
                delivery, UNTRUSTED_TOPIC,
                f"topic: {SHARED_REQUESTS_TOPIC!r} trusts every publisher and is off in this "
                "deployment (shared_requests_topic); publish on your tenant's topic, "
                f"{requests_topic('TENANT')!r}",
            )  # fmt: skip
        try:
            message = parse_message(delivery.data)
            if identity.tenant is not None and message.tenant != identity.tenant:
                return self._refuse(
                    delivery, TENANT_MISMATCH,
                    f"tenant: {message.tenant!r} is not the tenant of topic "
                    f"{delivery.topic!r} ({identity.tenant!r}); a topic speaks for its own "
                    "tenant only, so nothing was done",
                    tenant=identity.tenant,
                )  # fmt: skip
            if isinstance(message, CiJob):
                return self._ci_job(message)
            if not isinstance(message, Submit | BlockSubmit):
                if self._ending is None:
                    return self._refuse(
                        delivery,
                        UNSUPPORTED_ACTION,
                        f"action: {message.action!r} is not taken by this intake; only submit is",
                    )
                if isinstance(message, Release) and message.if_absent is not None:
                    recorded = self._record_finished(delivery, message.if_absent, message)
                    if recorded is not None:
                        return recorded
                if isinstance(message, Release) and message.unless_running:
                    kept = self._kept_for_another_job(message)
                    if kept is not None:
                        return IntakeResult(IntakeOutcome.APPLIED, message.request_id, kept)
                ending = self._ending()
                act = ending.cancel if message.action == "cancel" else ending.release
                admin = identity.speaker is Speaker.ADMIN
                ended = act(message.request_id, message.tenant, admin=admin)
                applied = (
                    IntakeOutcome.REFUSED
                    if ended.outcome is EndOutcome.REFUSED
                    else IntakeOutcome.APPLIED
                )
                return IntakeResult(applied, message.request_id, ended.message)
            known = self._tenants(message.tenant)
            if message.tenant not in known:
                return self._refuse(
                    delivery, UNKNOWN_TENANT,
                    f"tenant: {message.tenant!r} is not a configured tenant; the tenants are "
                    f"{', '.join(sorted(known)) or 'none yet'}",
                )  # fmt: skip
            request = (
                self._block_job(message, delivery)
                if isinstance(message, BlockSubmit)
                else to_capacity_request(
                    message,
                    default_request_id=delivery.message_id,
                    submitted_at=delivery.published_at,
                )
            )
            problem = self._secrets_problem(request)
            if problem is not None:
                raise MessageError([problem])
        except MessageError as error:
            return self._refuse(delivery, INVALID_REQUEST, str(error))
        record, event = accepted(request, delivery.published_at)
        outcome = self._store.create(record, event)
        if outcome is CreateOutcome.CONFLICT:
            return self._refuse(
                delivery,
                ID_IN_USE,
                f"request_id: {request.request_id!r} is already used by a different request; "
                "this message was refused and the existing request is unchanged",
                request_id=request.request_id,
                tenant=request.tenant,
            )
        if outcome is CreateOutcome.CREATED:
            self._announce(request.request_id, event)
            self._arm_expiry(record)
            self._nudge(request.request_id)
            return IntakeResult(IntakeOutcome.ACCEPTED, request.request_id, event.message)
        stored = self._announce_if_abandoned(request.request_id)
        if stored is not None and stored.state.is_final:
            # Ended already (possibly before it was submitted: finished_first): nothing to arm.
            return IntakeResult(
                IntakeOutcome.DUPLICATE, request.request_id, f"already ended ({stored.state})"
            )
        self._arm_expiry(record)  # again: the first delivery may have died before arming
        return IntakeResult(IntakeOutcome.DUPLICATE, request.request_id, "already accepted")

    def _block_job(self, message: BlockSubmit, delivery: Delivery) -> CapacityRequest:
        """The request of a job into a calendar block (schema.request.to_block_job), or
        MessageError naming ``block`` when the block cannot take it: unknown, another
        tenant's, not a calendar block, keeping no VMs for jobs, or ended already (unless
        the job is stored already: this is then a redelivery, a duplicate)."""
        block = self._store.get(message.block)
        request = to_block_job(
            message, None if block is None else block.request,
            default_request_id=delivery.message_id, submitted_at=delivery.published_at,
        )  # fmt: skip
        assert block is not None  # to_block_job refuses an unknown block
        if block.state.is_final and self._store.get(request.request_id) is None:
            raise MessageError([("block", (
                f"block {message.block!r} has ended ({block.state}): no job can run on its VMs"
            ))])  # fmt: skip
        return request

    def _kept_for_another_job(self, release: Release) -> str | None:
        """Why a finished CI job's request stays (None: release it): it runs (its runner's
        exit ends it), or the job ran on another running request's runner — whose own job
        this request's VM will serve, since a one-job runner takes any job its labels
        match. A job no runner of ours took (cancelled while queued, or run elsewhere)
        leaves one VM too many: its own request goes."""
        current = self._store.get(release.request_id)
        if current is not None and current.state is RequestState.ACTIVE:
            return "running: its runner's exit ends it (it may run another job)"
        host = self._runner_host(release.tenant, release.ran_on)
        if host is not None and host.request_id != release.request_id:
            return (
                f"its job ran on {host.request_id}'s runner: kept for the job that request "
                "was made for"
            )
        return None

    def _ci_job(self, message: CiJob) -> IntakeResult:
        """A CI job a runner took or finished: the running request whose VM the runner is
        records it (once: a redelivered hook adds nothing)."""
        host = self._runner_host(message.tenant, message.runner_name, message.request_id)
        said = "no running request of this deployment has that runner"
        if host is not None:
            said = self._note_job(host, message)
        return IntakeResult(IntakeOutcome.APPLIED, message.request_id, said)

    def _runner_host(
        self, tenant: str, runner_name: str | None, own: str | None = None
    ) -> RequestRecord | None:
        """The request of ``tenant`` whose VM the runner is named after, in any state (its
        runner's exit may have ended it before the CI system's word of the job came): the
        one its agent registered for, else ``own`` (the job's own request), else a running
        one."""
        if not runner_name:
            return None
        report = None if self._ranks is None else self._ranks.of_vm(runner_name)
        registered = None if report is None else self._store.get(report.request_id)
        if registered is not None and registered.tenant == tenant:
            return registered
        order = vm_order(runner_name)

        def hosts(record: RequestRecord) -> bool:
            return any(order_name(record.request_id, lane.attempt) == order
                       for lane in record.orders)  # fmt: skip

        mine = None if own is None else self._store.get(own)
        if mine is not None and mine.tenant == tenant and hosts(mine):
            return mine
        for record in self._store.in_states(RequestState.ACTIVE):
            if record.tenant == tenant and hosts(record):
                return record
        return None

    def _note_job(self, host: RequestRecord, message: CiJob) -> str:
        """Record on ``host`` that its runner took (or finished) the message's job: an event
        of its own; the request's state, reason and message stay as they are (a run that
        ended stays ended)."""
        job, runner = message.request_id, message.runner_name
        reason, said = CiJobReason.CI_JOB_RUNNING, f"its runner {runner} runs CI job {job}"
        if message.status == "completed":
            outcome = message.conclusion or "unknown"
            reason = CiJobReason.CI_JOB_COMPLETED
            said = f"CI job {job} on its runner {runner} completed: {outcome}"
        for _ in range(3):
            record = self._store.get(host.request_id)
            if record is None or not (record.state.is_final or record.state is RequestState.ACTIVE):
                return f"{host.request_id} does not run"
            if any(event.message == said for event in self._store.events(host.request_id)):
                return said  # a redelivered hook
            event = StatusEvent(
                request_id=record.request_id, tenant=record.tenant, state=record.state,
                previous_state=record.state, at=self._clock.now(), reason=reason.value,
                message=said, pool=record.pool,
            )  # fmt: skip
            try:
                changed = self._store.change(
                    record.request_id,
                    Change(expected_version=record.version, state=record.state, event=event,
                           reason=record.reason, message=record.message, pool=record.pool,
                           eta=record.eta, position=record.position),
                )  # fmt: skip
            except StaleWrite:
                continue  # the reconciler wrote it meanwhile: read it again
            self._bus.publish(event)
            self._store.mark_announced(record.request_id, changed.events)
            return said
        raise StaleWrite(f"{host.request_id} kept changing; the job's hook is redelivered")

    def _record_finished(
        self, delivery: Delivery, submission: Submit, release: Release
    ) -> IntakeResult | None:
        """A release whose request does not exist yet (its job finished before the queued
        webhook came): store the request already ended, so that its submission is a duplicate
        when it arrives. None when the request exists (or was just created by its submission,
        a race): it is released like any other."""
        if self._store.get(release.request_id) is not None:
            return None
        request = to_capacity_request(
            submission.model_copy(update={"request_id": release.request_id}),
            default_request_id=release.request_id,
            submitted_at=delivery.published_at,
        )
        record, event = finished_first(request, delivery.published_at)
        if self._store.create(record, event) is not CreateOutcome.CREATED:
            return None  # stored meanwhile: release what is there
        self._announce(request.request_id, event)
        return IntakeResult(IntakeOutcome.APPLIED, request.request_id, event.message)

    def _identity(self, topic: str | None) -> Identity:
        """Whom ``topic`` speaks for, by the configuration (a tenant topic it does not know
        yet makes it read the configuration again, so a tenant just added is not refused)."""
        known = self._configuration_where(
            lambda configuration: _identity(topic, configuration).speaker is not Speaker.UNKNOWN
        )
        return _identity(topic, known)

    def _tenants(self, tenant: str) -> frozenset[str]:
        """The configured tenants' names (read again at once when ``tenant`` is not among
        them: it may have just been added)."""
        known = self._configuration_where(lambda configuration: tenant in _names(configuration))
        return _names(known)

    def _secrets_problem(self, request: CapacityRequest) -> tuple[str, str] | None:
        """The ``(field, rule)`` of a secret of ``request``'s run outside its tenant's
        configured secret prefix (or of any, for a tenant configured with none); None if
        all lie within it. A tenant's prefix just configured is read again at once."""
        run, tenant = request.run, request.tenant
        if run is None or not run.secrets:
            return None
        configuration = self._configuration_where(
            lambda known: secret_prefix_problem(run, known.secret_prefix(tenant), tenant) is None
        )
        return secret_prefix_problem(run, configuration.secret_prefix(tenant), tenant)

    def _configuration_where(self, found: Callable[[Configuration], bool]) -> Configuration:
        """The configuration, kept CONFIG_TTL between messages; a kept one in which ``found``
        fails is read again at once (what is missing may have just been added)."""
        now = self._clock.now()
        cached = self._configuration
        if cached is None or now - cached[0] >= CONFIG_TTL:
            return self._load(now)
        return cached[1] if found(cached[1]) else self._load(now)

    def _load(self, now: datetime) -> Configuration:
        configuration = self._config.load()
        self._configuration = (now, configuration)
        return configuration

    def _nudge(self, request_id: str) -> None:
        """Ask for a reconcile pass now, so admission does not wait for the tick. Best effort:
        a lost nudge only costs the wait until the next tick."""
        if self._nudger is None:
            return
        try:
            self._nudger.nudge(f"{request_id} accepted")
        except Exception as error:
            log.warning("nudge for %s not sent; the next tick admits it: %s", request_id, error)

    def _arm_expiry(self, record: RequestRecord) -> None:
        """A flex request's max_wait timer (arming it again is harmless)."""
        if self._timers is not None and record.request.deadline is not None:
            self._timers.arm(expiry_timer(record), self._clock.now())

    def _announce(self, request_id: str, event: StatusEvent) -> None:
        self._bus.publish(event)
        self._store.mark_announced(request_id, 1)

    def _announce_if_abandoned(self, request_id: str) -> RequestRecord | None:
        """A duplicate: publish the first event only if no delivery did, and the one that
        created the request has had time to. Returns the stored record."""
        stored = self._store.get(request_id)
        if stored is None or stored.announced >= 1:
            return stored
        if self._clock.now() - stored.updated_at < ANNOUNCE_GRACE:
            raise AnnouncementPending(f"{request_id} is stored but not announced yet; retry")
        self._announce(request_id, self._store.events(request_id)[0])
        return stored

    def _refuse(
        self,
        delivery: Delivery,
        reason: str,
        message: str,
        *,
        request_id: str | None = None,
        tenant: str | None = None,
    ) -> IntakeResult:
        """Announce that a message was refused; the store is not touched."""
        claimed_id, claimed_tenant = _claims(delivery.data)
        request_id = request_id or claimed_id or delivery.message_id
        self._bus.publish(
            StatusEvent(
                request_id=request_id,
                tenant=tenant or claimed_tenant or "",
                state=RequestState.REJECTED,
                previous_state=None,
                at=delivery.published_at,
                reason=reason,
                message=message,
            )
        )
        return IntakeResult(IntakeOutcome.REFUSED, request_id, message)


def _names(configuration: Configuration) -> frozenset[str]:
    return frozenset(tenant.name for tenant in configuration.tenants)


def _identity(topic: str | None, configuration: Configuration) -> Identity:
    return identity_of_topic(
        topic, [tenant.name for tenant in configuration.tenants],
        shared_trusted=configuration.shared_requests_topic,
    )  # fmt: skip


def _claims(data: bytes) -> tuple[str | None, str | None]:
    """The request_id and tenant a message claims, if it is JSON enough to tell."""
    try:
        decoded = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None, None
    if not isinstance(decoded, dict):
        return None, None
    request_id, tenant = decoded.get("request_id"), decoded.get("tenant")
    return (
        request_id if isinstance(request_id, str) and request_id else None,
        tenant if isinstance(tenant, str) and tenant else None,
    )
