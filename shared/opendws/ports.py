"""Ports: what the services need from the outside world, as narrow Protocols, and the records
that cross them.

Adapters implement these for Google Cloud (``opendws.adapters``) and in memory (fakes for fast
tests); one contract suite per port runs on both, so a fake cannot drift from the real thing.
Every record is a frozen value; timestamps are timezone-aware UTC.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from opendws.domain.model import CapacityRequest, GangShape, Mode, PolicySettings, Pool, Tenant
from opendws.domain.provisioning import Lane, ProvisionPhase
from opendws.domain.states import RequestState

__all__ = ["Lane", "ProvisionPhase"]  # re-exported: adapters and services name them here

EVENT_SCHEMA = "opendws.event/v1"


class CreateOutcome(StrEnum):
    """What :meth:`RequestStore.create` did."""

    CREATED = "CREATED"  # the request is new and is now stored, with its first event
    DUPLICATE = "DUPLICATE"  # the same request (same content) was already stored: nothing changed
    CONFLICT = "CONFLICT"  # another request with this id but different content exists: refused


class StaleWrite(RuntimeError):
    """A guarded write found the record at another version than expected: someone else wrote
    first, so this writer's view is stale and its change is dropped."""


class UnknownRequest(KeyError):
    """No request with this id is stored."""


class Fenced(StaleWrite):
    """A write guarded by a fencing token found the lease held under a newer token: another
    reconciler has taken over, so this one's view is stale and its change is dropped."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fence:
    """Proof of holding the reconciler lease: every write made under it is refused once another
    holder has taken the lease (its token is then higher)."""

    holder: str  # who holds it (one reconciler process)
    token: int  # grows by one each time the lease changes hands
    expires_at: datetime  # the lease is free for others after this


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusEvent:
    """One state change (or ETA change) of a request, as stored and as published on
    ``capacity-events`` (``opendws.event/v1``)."""

    request_id: str
    tenant: str
    state: RequestState
    previous_state: RequestState | None
    at: datetime
    reason: str | None = None  # machine-readable: a domain Reason or an intake rule
    message: str = ""  # one line a person can act on
    eta: datetime | None = None
    position: int | None = None
    pool: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The event as the public JSON object."""
        return {
            "schema": EVENT_SCHEMA,
            "request_id": self.request_id,
            "tenant": self.tenant,
            "state": self.state.value,
            "previous_state": None if self.previous_state is None else self.previous_state.value,
            "at": _iso(self.at),
            "reason": self.reason,
            "message": self.message,
            "eta": None if self.eta is None else _iso(self.eta),
            "position": self.position,
            "pool": self.pool,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StatusEvent:
        """Read back what :meth:`to_json` wrote."""
        previous = data.get("previous_state")
        eta = data.get("eta")
        return cls(
            request_id=data["request_id"],
            tenant=data["tenant"],
            state=RequestState(data["state"]),
            previous_state=None if previous is None else RequestState(previous),
            at=datetime.fromisoformat(data["at"]),
            reason=data.get("reason"),
            message=data.get("message", ""),
            eta=None if eta is None else datetime.fromisoformat(eta),
            position=data.get("position"),
            pool=data.get("pool"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """A stored request: what was asked, where it is in its life cycle, and a version that
    every guarded write checks and increments."""

    request: CapacityRequest
    state: RequestState
    version: int  # 1 when created; +1 on every change
    digest: str  # content fingerprint: tells a redelivery from a conflicting reuse of the id
    updated_at: datetime
    reason: str | None = None
    message: str = ""
    pool: str | None = None
    eta: datetime | None = None
    announced: int = 0  # how many of its events have been published (an outbox cursor)
    events: int = 1  # how many events are recorded for it
    attempt: int = 0  # provisioning attempts so far; the current one names its cloud resources
    since: datetime | None = None  # when it entered its current state (None: at creation)
    position: int | None = None  # PENDING: place in line for its pool, as last announced
    # PROVISIONING: every order open at once (one per raced pool; ``pool`` is the first);
    # ACTIVE: the order that won. Empty: the single order (pool, attempt), if any.
    lanes: tuple[Lane, ...] = ()

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def orders(self) -> tuple[Lane, ...]:
        """The orders this record stands for: its lanes, or its one order (pool, attempt)."""
        if self.lanes:
            return self.lanes
        if self.pool is not None and self.attempt > 0:
            return (Lane(self.pool, self.attempt),)
        return ()

    @property
    def tenant(self) -> str:
        return self.request.tenant


def lanes_after(
    current: tuple[Lane, ...], state: RequestState, lanes: tuple[Lane, ...] | None
) -> tuple[Lane, ...]:
    """The lanes a change leaves on a record (the rule of :meth:`RequestStore.change`, kept
    here once so that every adapter applies it alike): back in line (PENDING) a request has
    none; otherwise ``lanes`` replaces them, and None keeps the current ones."""
    if state is RequestState.PENDING:
        return ()
    return current if lanes is None else tuple(lanes)


def lanes_to_document(lanes: tuple[Lane, ...]) -> list[dict[str, Any]]:
    return [{"pool": lane.pool, "attempt": lane.attempt} for lane in lanes]


def lanes_from_document(data: object) -> tuple[Lane, ...]:
    if not isinstance(data, list):
        return ()
    return tuple(Lane(str(item["pool"]), int(item["attempt"])) for item in data)


class RequestStore(Protocol):
    """Where requests and their event records live (Firestore ``requests/{id}`` and
    ``requests/{id}/events/{seq}``)."""

    def create(self, record: RequestRecord, event: StatusEvent) -> CreateOutcome:
        """Store a new request and its first event together, only if no request with its id
        exists (create-if-absent). A second create of the same content changes nothing
        (DUPLICATE); of other content is refused (CONFLICT). Safe to repeat."""
        ...

    def get(self, request_id: str) -> RequestRecord | None:
        """The stored request, or None."""
        ...

    def change(
        self, request_id: str, *, expected_version: int, state: RequestState, event: StatusEvent,
        reason: str | None = None, message: str = "", pool: str | None = None,
        eta: datetime | None = None, position: int | None = None, attempt: int | None = None,
        fence: Fence | None = None, usage: UsageEntry | None = None,
        lanes: tuple[Lane, ...] | None = None,
    ) -> RequestRecord:  # fmt: skip
        """Move the request to ``state`` and append ``event``, in one atomic write guarded by
        ``expected_version`` (and by ``fence``, when given); ``usage``, for a final state, is
        stored in the same write (under the request's id). ``state`` equal to the current
        state is a revision (a new ETA, reason or attempt), not a transition; ``since`` becomes
        ``event.at`` only when the state changes; ``attempt`` None keeps it; ``lanes`` None
        keeps them, except back in line (PENDING), where a request has no orders. Raises StaleWrite
        if the stored version differs, Fenced if the fence's lease was taken over,
        UnknownRequest if there is none, and IllegalTransition if the life cycle forbids it."""
        ...

    def events(self, request_id: str) -> list[StatusEvent]:
        """Every event recorded for the request, oldest first."""
        ...

    def mark_announced(self, request_id: str, count: int) -> None:
        """Record that the request's first ``count`` events have been published (never moves
        back). Raises UnknownRequest if there is no such request."""
        ...

    def unannounced(self) -> list[RequestRecord]:
        """Every request with a change whose event is not yet marked published (an outbox a
        restarted reconciler drains), oldest submission first."""
        ...

    def in_states(self, *states: RequestState) -> list[RequestRecord]:
        """Every request currently in one of ``states``, oldest submission first."""
        ...

    def usage(self, tenant: str | None = None) -> list[UsageEntry]:
        """Every usage entry (of one tenant, if given), oldest end first."""
        ...

    def acquire_lease(self, holder: str, now: datetime, ttl: timedelta) -> Fence | None:
        """Take or renew the reconciler lease for ``ttl``: granted if it is free, expired, or
        already ``holder``'s (renewal keeps the token; a new holder gets the next token).
        None if another holder's lease is still running. Atomic."""
        ...

    def release_lease(self, fence: Fence) -> None:
        """Give the lease up at once if ``fence`` still holds it (else do nothing)."""
        ...

    def mark_pool_short(self, pool_id: str, until: datetime, fence: Fence | None = None) -> None:
        """Record that ``pool_id`` stocked out: nothing new starts there before ``until``.
        Never shortens a cool-down already recorded. Raises Fenced as :meth:`change` does."""
        ...

    def pool_shortages(self) -> dict[str, datetime]:
        """Every recorded cool-down, by pool id (past ones included; callers compare)."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Price:
    """What one accelerator-hour of a type costs, and the discount factors of the two modes
    (flex-start and calendar capacity are billed below on-demand)."""

    accelerator: str
    per_hour: float  # on-demand price of one accelerator for one hour
    flex_factor: float = 1.0  # multiplier for flex_start runs
    calendar_factor: float = 1.0  # multiplier for calendar blocks

    def cost(self, mode: Mode, accelerator_hours: float) -> float:
        """The estimated cost of ``accelerator_hours`` used in ``mode``."""
        factor = self.calendar_factor if mode is Mode.CALENDAR else self.flex_factor
        return accelerator_hours * self.per_hour * factor


@dataclass(frozen=True, slots=True, kw_only=True)
class CiMapping:
    """Which CI jobs get capacity, and what they ask for: a job of ``provider`` whose labels
    (GitHub ``runs-on``, GitLab tags) include every one of ``labels`` is submitted as
    ``template`` (the fields of a submit message but its id, which comes from the job)."""

    provider: str  # github, gitlab or generic
    labels: frozenset[str]
    template: dict[str, Any] = field(hash=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Configuration:
    """What the operators configure: pools, tenants with their quotas, policy knobs, and the
    price table usage is costed with."""

    pools: tuple[Pool, ...] = ()
    tenants: tuple[Tenant, ...] = ()
    policy: PolicySettings = field(default_factory=PolicySettings)
    prices: tuple[Price, ...] = ()
    ci: tuple[CiMapping, ...] = ()  # CI jobs that get capacity
    # Take request messages from the shared ``capacity-requests`` topic, trusting every
    # publisher's claimed tenant (small single-team installs). Off: only tenants' own topics
    # and the admins' are heard.
    shared_requests_topic: bool = False

    def price(self, accelerator: str) -> Price | None:
        """The price of ``accelerator``, if configured."""
        return next((p for p in self.prices if p.accelerator == accelerator), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class UsageEntry:
    """What one finished request used: written with its final state, in the same write, so
    that usage is neither lost nor counted twice."""

    request_id: str
    tenant: str
    accelerator: str
    mode: Mode
    outcome: RequestState  # the final state
    granted_hours: float  # accelerator-hours granted: units × run_duration, if it ever ran
    used_hours: float  # accelerator-hours actually held: units × (end - start)
    started_at: datetime | None  # when it became ACTIVE (None: it never ran)
    ended_at: datetime  # when it reached its final state
    cost: float | None  # estimated, from the price table (None: no price configured)


class ConfigStore(Protocol):
    """Where the configuration lives (Firestore ``config/``)."""

    def load(self) -> Configuration:
        """The current configuration (empty if none was saved)."""
        ...

    def save(self, configuration: Configuration) -> None:
        """Replace the configuration, atomically."""
        ...


# Order names are cloud resource names: RFC 1035, at most 63 characters, and each VM of the
# gang is named after its order plus ``-{index}``.
_NAME_UNSAFE = re.compile(r"[^a-z0-9]+")
ORDER_PREFIX = "odws-"


@functools.lru_cache(maxsize=65_536)  # a pure function, asked every pass for every live request
def order_name(request_id: str, attempt: int) -> str:
    """The deterministic name of ``request_id``'s ``attempt``-th provisioning: a retried call
    always names the same resource, so the cloud refuses a second creation. A readable slug of
    the id keeps it recognisable; a hash of the exact id keeps distinct ids apart."""
    slug = _NAME_UNSAFE.sub("-", request_id.lower()).strip("-")[:28].strip("-")
    digest = hashlib.sha256(request_id.encode()).hexdigest()[:10]
    return f"{ORDER_PREFIX}{slug + '-' if slug else ''}{digest}-{attempt}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Order:
    """One attempt to provision one request's gang in one pool."""

    request: CapacityRequest
    pool: Pool
    attempt: int  # 1-based

    @property
    def name(self) -> str:
        """The cloud name of everything this order creates (see :func:`order_name`)."""
        return order_name(self.request.request_id, self.attempt)


@dataclass(frozen=True, slots=True, kw_only=True)
class Observed:
    """One order's resources as a provider sees them now. Providers report every owned
    resource they find by name — a request, or VMs and queued resources left without one — so
    that nothing opendws made can run unseen."""

    name: str  # the order name
    pool_id: str
    phase: ProvisionPhase
    error_code: str | None = None  # FAILED: the cloud's final code (status.error)
    message: str = ""  # what the cloud said, for events
    # WAITING: the temporary error of Google's latest attempt (status.lastAttempt), e.g.
    # ZONE_RESOURCE_POOL_EXHAUSTED; None while no attempt failed yet.
    last_attempt: str | None = None
    # Calendar blocks: the last instant Google still lets it be cancelled (status.lockTime;
    # None: not approved yet, or never cancellable) and the end of its time window.
    locked_at: datetime | None = None
    ends_at: datetime | None = None


class CapacityProvider(Protocol):
    """A kind of cloud capacity (MIG flex-start, TPU queued resources, calendar reservations).

    Implementers guarantee: every call is safe to repeat (creating what already exists, or
    releasing what is gone, succeeds without a second resource); no call waits for the cloud to
    finish — progress is read with :meth:`observe` on a later pass; only resources whose names
    start with :data:`ORDER_PREFIX` are ever touched.
    """

    def observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        """Every order of this provider's kind in ``pools``, by order name."""
        ...

    def reserve(self, order: Order) -> None:
        """Calendar: submit the block (a calendar-mode future reservation) for Google's review
        ahead of its start. Others: nothing to do."""
        ...

    def provision(self, order: Order) -> None:
        """Start creating the order's gang (for a calendar block: its VMs, in the reservation)."""
        ...

    def release(self, name: str, pool: Pool) -> None:
        """Cancel and delete everything the order ``name`` created in ``pool``."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Advised:
    """One start Google's Advice API recommends for a calendar block (advice.calendarMode):
    ``units`` free in ``zone`` from ``start_at`` to ``end_at``."""

    start_at: datetime
    end_at: datetime
    zone: str


class Withdrawal(StrEnum):
    """What asking Google to cancel a submitted calendar block did."""

    WITHDRAWN = "WITHDRAWN"  # cancelled now, or there was nothing to cancel (gone, declined)
    REFUSED = "REFUSED"  # Google keeps it: past its cancellation window (billed in full)


class CalendarBlocks(Protocol):
    """What calendar blocks need of the cloud beyond a CapacityProvider: Google's advice
    before booking and a cancellation Google may refuse. Implemented by the providers of
    calendar blocks (GPU VMs, TPU chips) and by the memory fake."""

    def advise(
        self, request: CapacityRequest, pools: Sequence[Pool], *, earliest: datetime,
        latest: datetime,
    ) -> tuple[Advised, ...]:  # fmt: skip
        """Starts in ``[earliest, latest]`` at which the request's block would fit, in the
        zones of ``pools``, earliest first (advice.calendarMode); () when none."""
        ...

    def withdraw(self, name: str, pool: Pool) -> Withdrawal:
        """Cancel the submitted block ``name`` at Google. Safe to repeat; never deletes a
        block Google keeps (see :class:`Withdrawal`)."""
        ...


class BlockProvider(CapacityProvider, CalendarBlocks, Protocol):
    """A provider of calendar blocks: a CapacityProvider whose ``reserve`` submits a
    calendar-mode future reservation for Google's review, and whose ``release`` deletes the
    block's VMs and then withdraws and deletes the reservation where Google allows it (a
    block Google keeps is left to its end: it is billed in full either way)."""


class TimerKind(StrEnum):
    """What a timer ends or starts."""

    RELEASE = "release"  # the run time of an ACTIVE request is up
    EXPIRY = "expiry"  # a PENDING flex request's max_wait has passed
    START = "start"  # a BOOKED calendar block starts


# Cloud Tasks schedules at most 30 days ahead; a later timer is armed as a chain of hops.
TIMER_HORIZON = timedelta(days=29)
_TASK_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True, slots=True, kw_only=True)
class Timer:
    """A timer for one request: fires at ``fire_at`` (or, for one beyond the horizon, at an
    intermediate ``hop`` that re-arms the next one)."""

    request_id: str
    kind: TimerKind
    generation: int  # which run (the record's attempt) it belongs to: an older one is ignored
    fire_at: datetime  # when the timer is meant to act
    hop: int = 0  # 0 for the first task of a chain; each re-arm adds one

    @property
    def name(self) -> str:
        """The deterministic task name: the same timer armed twice is one task."""
        slug = _TASK_UNSAFE.sub("-", self.request_id)[:60]
        digest = hashlib.sha256(self.request_id.encode()).hexdigest()[:12]
        return f"{slug}-{digest}-{self.kind.value}-g{self.generation}-h{self.hop}"

    def due_at(self, armed_at: datetime) -> datetime:
        """When this hop's task is scheduled: ``fire_at``, or the horizon if that is sooner."""
        return min(self.fire_at, armed_at + TIMER_HORIZON)

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "kind": self.kind.value,
            "generation": self.generation,
            "fire_at": _iso(self.fire_at),
            "hop": self.hop,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timer:
        """Read back what :meth:`to_json` wrote; ValueError/KeyError/TypeError if malformed."""
        fire_at = datetime.fromisoformat(str(data["fire_at"]))
        if fire_at.tzinfo is None:
            raise ValueError("fire_at: needs a time zone")
        return cls(
            request_id=str(data["request_id"]),
            kind=TimerKind(data["kind"]),
            generation=int(data["generation"]),
            fire_at=fire_at,
            hop=int(data.get("hop", 0)),
        )


class TimerQueue(Protocol):
    """Where timers wait (Cloud Tasks): each calls the ``timer`` function when due."""

    def arm(self, timer: Timer, now: datetime) -> None:
        """Schedule ``timer`` (its hop, if it lies beyond the horizon). Arming the same timer
        again changes nothing."""
        ...

    def disarm(self, timer: Timer) -> None:
        """Delete ``timer``'s task so it never fires; nothing to do if it is gone."""
        ...


# Who a request message speaks for is the topic it was published on, never its body: Pub/Sub
# does not tell a subscriber who published a message, but a topic's publisher IAM says who may
# (infra/: each tenant's principals publish on their own topic only).
TENANT_REQUESTS_PREFIX = "capacity-requests-"  # + the tenant: that tenant's own topic
ADMIN_REQUESTS_TOPIC = "capacity-admin-requests"  # the admins'; acts for any tenant
SHARED_REQUESTS_TOPIC = "capacity-requests"  # trusts every publisher; off unless configured
EVENTS_TOPIC = "capacity-events"


def requests_topic(tenant: str) -> str:
    """The topic a tenant's request messages are published on."""
    return f"{TENANT_REQUESTS_PREFIX}{tenant}"


class Speaker(StrEnum):
    """Whom a request topic speaks for."""

    TENANT = "TENANT"  # a tenant's own topic: it acts as that tenant only
    ADMIN = "ADMIN"  # the admins' topic: it acts for any tenant
    SHARED = "SHARED"  # the shared topic, when configured: every publisher is trusted
    UNTRUSTED = "UNTRUSTED"  # the shared topic while it is off
    UNKNOWN = "UNKNOWN"  # no topic of this deployment (no configured tenant has it)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a message speaks for, from its topic; ``tenant`` for a tenant's topic."""

    speaker: Speaker
    tenant: str | None = None


def identity_of_topic(
    topic: str | None, tenants: Sequence[str], *, shared_trusted: bool
) -> Identity:
    """Who a message on ``topic`` (its short name; None: not known, as for a shared topic)
    speaks for, given the configured tenants and whether the shared topic is trusted."""
    if topic is None or topic == SHARED_REQUESTS_TOPIC:
        return Identity(Speaker.SHARED if shared_trusted else Speaker.UNTRUSTED)
    if topic == ADMIN_REQUESTS_TOPIC:
        return Identity(Speaker.ADMIN)
    if topic.startswith(TENANT_REQUESTS_PREFIX):
        tenant = topic.removeprefix(TENANT_REQUESTS_PREFIX)
        if tenant in tenants:
            return Identity(Speaker.TENANT, tenant)
    return Identity(Speaker.UNKNOWN)


def topic_of_source(source: str) -> str | None:
    """The topic's short name in a Pub/Sub CloudEvent ``source``
    (``//pubsub.googleapis.com/projects/P/topics/T``), or in any path naming
    ``projects/P/topics/T``; None when there is none."""
    match = re.search(r"projects/[^/?]+/topics/([^/?]+)", source or "")
    return None if match is None else match.group(1)


def event_filter(tenant: str) -> str:
    """The Pub/Sub subscription filter of a tenant's events (pubsub/docs/subscription-message-
    filter): only messages whose ``tenant`` attribute is the tenant's."""
    return f'attributes.tenant = "{tenant}"'


def passes_event_filter(tenant: str, attributes: dict[str, str]) -> bool:
    """What :func:`event_filter` lets through, applied where Pub/Sub cannot (the official
    emulator ignores subscription filters)."""
    return attributes.get("tenant") == tenant


class RequestPublisher(Protocol):
    """Where request messages go: each on its tenant's topic (:func:`requests_topic`), as
    that tenant's publishers send them."""

    def publish(self, message: dict[str, object]) -> str:
        """Publish one ``opendws.request/v1`` message on the topic of its ``tenant``; returns
        its message id."""
        ...


class Nudger(Protocol):
    """Asks the reconciler for a pass now (a message on ``reconcile-ticks``)."""

    def nudge(self, reason: str) -> None: ...


class EventBus(Protocol):
    """Where state changes are announced (Pub/Sub ``capacity-events``)."""

    def publish(self, event: StatusEvent) -> None:
        """Publish one event, with ``request_id``, ``tenant`` and ``state`` as attributes.
        Returns once the bus has accepted it; raises if it could not."""
        ...


class Clock(Protocol):
    """The only source of "now" outside tests."""

    def now(self) -> datetime:
        """The current instant, timezone-aware UTC."""
        ...


def request_to_document(request: CapacityRequest) -> dict[str, Any]:
    """The request as plain JSON-friendly values (durations in seconds, instants in ISO 8601)."""
    gang = request.gang
    return {
        "request_id": request.request_id,
        "tenant": request.tenant,
        "mode": request.mode.value,
        "gang": {
            "vm_count": gang.vm_count,
            "accelerator": gang.accelerator,
            "machine_type": gang.machine_type,
            "accelerators_per_vm": gang.accelerators_per_vm,
            "topology": gang.topology,
        },
        "locations": list(request.locations),
        "run_duration_s": request.run_duration.total_seconds(),
        "max_wait_s": None if request.max_wait is None else request.max_wait.total_seconds(),
        "start_at": None if request.start_at is None else _iso(request.start_at),
        "submitted_at": _iso(request.submitted_at),
        "priority": request.priority,
        "labels": dict(request.labels),
    }


def request_from_document(data: dict[str, Any]) -> CapacityRequest:
    """Read back what :func:`request_to_document` wrote."""
    gang = data["gang"]
    max_wait = data.get("max_wait_s")
    start_at = data.get("start_at")
    return CapacityRequest(
        request_id=data["request_id"],
        tenant=data["tenant"],
        mode=Mode(data["mode"]),
        gang=GangShape(
            vm_count=gang["vm_count"],
            accelerator=gang["accelerator"],
            machine_type=gang.get("machine_type"),
            accelerators_per_vm=gang.get("accelerators_per_vm"),
            topology=gang.get("topology"),
        ),
        locations=tuple(data["locations"]),
        run_duration=timedelta(seconds=data["run_duration_s"]),
        max_wait=None if max_wait is None else timedelta(seconds=max_wait),
        start_at=None if start_at is None else datetime.fromisoformat(start_at),
        submitted_at=datetime.fromisoformat(data["submitted_at"]),
        priority=data.get("priority", 0),
        labels=tuple(sorted(data.get("labels", {}).items())),
    )


def accepted(request: CapacityRequest, at: datetime) -> tuple[RequestRecord, StatusEvent]:
    """A request as intake stores it when it accepts it at ``at``: PENDING, version 1, with its
    first event."""
    event = StatusEvent(
        request_id=request.request_id,
        tenant=request.tenant,
        state=RequestState.PENDING,
        previous_state=None,
        at=at,
        message="accepted; waiting for admission",
    )
    record = RequestRecord(
        request=request,
        state=RequestState.PENDING,
        version=1,
        digest=content_digest(request),
        updated_at=at,
        message=event.message,
    )
    return record, event


def content_digest(request: CapacityRequest) -> str:
    """A fingerprint of what the request asks for — not of when it arrived — so that the same
    message delivered twice matches and a different request reusing the id does not."""
    document = request_to_document(request)
    del document["submitted_at"]
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _iso(at: datetime) -> str:
    return at.isoformat()
