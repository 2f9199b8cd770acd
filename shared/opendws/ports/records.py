"""The records that cross the store ports, and the rules of every write, each written once.

Every record is a frozen value; timestamps are timezone-aware UTC. The rules an adapter must
apply when it persists — how a :class:`Change` moves a :class:`RequestRecord`, who may take the
reconciler lease (:func:`next_lease`), whether a fenced write is still admitted
(:meth:`Fence.admits`), that a pool's cool-down never shortens (:func:`cooldown_after`) — are
pure functions here, which the Firestore adapter and the memory fake both call, so that an
adapter only reads and persists and the two cannot disagree.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from opendws.domain.model import CapacityRequest, GangShape, Mode
from opendws.domain.provisioning import Lane
from opendws.domain.run import RunSpec
from opendws.domain.states import RequestState, transition
from opendws.ports.cloud import Host, hosts_from_json, hosts_to_json

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


# The states a request can still leave: what a first read of changes returns, and what the
# reconciler's mirror holds.
NOT_FINAL = tuple(state for state in RequestState if not state.is_final)

# A released lease expires at the beginning of time: anyone may take it at once.
LEASE_FREE = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fence:
    """Proof of holding the reconciler lease: every write made under it is refused once another
    holder has taken the lease (its token is then higher)."""

    holder: str  # who holds it (one reconciler process)
    token: int  # grows by one each time the lease changes hands
    expires_at: datetime  # the lease is free for others after this

    def admits(self, lease: Fence | None) -> bool:
        """Whether a write under this fence may still land, given the ``lease`` as stored now:
        only while the same holder holds it under the same token (an expired lease that nobody
        took over still admits its holder's writes)."""
        return lease is not None and (lease.holder, lease.token) == (self.holder, self.token)

    def check(self, lease: Fence | None) -> None:
        """Raise :class:`Fenced` unless this fence :meth:`admits` a write under ``lease``."""
        if not self.admits(lease):
            current = "nobody" if lease is None else f"{lease.holder} (token {lease.token})"
            raise Fenced(
                f"the reconciler lease is held by {current}; {self.holder} "
                f"(token {self.token}) may no longer write"
            )


def check_fence(fence: Fence | None, lease: Fence | None) -> None:
    """An unfenced write (None) always lands; a fenced one as :meth:`Fence.check` says."""
    if fence is not None:
        fence.check(lease)


def next_lease(current: Fence | None, holder: str, now: datetime, ttl: timedelta) -> Fence | None:
    """The lease ``holder`` gets when it asks at ``now`` for ``ttl``, given the ``current``
    one: granted if it is free, expired, or already the holder's (a renewal keeps the token; a
    new holder gets the next token, which fences every write of the one before); None while
    another holder's lease still runs."""
    if current is not None and current.holder != holder and current.expires_at > now:
        return None
    token = 1 if current is None else current.token + (current.holder != holder)
    return Fence(holder=holder, token=token, expires_at=now + ttl)


def lease_released(current: Fence | None, fence: Fence) -> Fence | None:
    """The lease after ``fence`` gives it up: free at once (:data:`LEASE_FREE`) if ``fence``
    still holds it; None when there is nothing to write (someone else holds it, or nobody)."""
    if current is None or not fence.admits(current):
        return None
    return replace(current, expires_at=LEASE_FREE)


def asked_again(asked: bool, current: Fence | None, granted: Fence | None, *, ask: bool) -> bool:
    r"""Whether another pass is asked for after an acquire: a refused acquire that ``ask``\s
    sets the flag (the holder runs one more pass when it ends: nudges that arrive during a
    pass are coalesced into one, never dropped); a new holder clears it (the pass it is about
    to run serves every ask before it); a renewal keeps it."""
    if granted is None:
        return asked or ask
    if current is None or current.holder != granted.holder:
        return False
    return asked


# How far apart two clocks may be: Pub/Sub's, which stamps a message's publish time, and a
# reconciler's, which stamps when its pass took the lease (both kept to Google's time).
CLOCK_MARGIN = timedelta(seconds=1)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseView:
    """The reconciler lease as one read finds it (:meth:`ReconcilerLease.lease_view`)."""

    fence: Fence | None  # who holds it and until when (None: never taken)
    again: bool = False  # another pass was asked for while it was held
    # When the pass of its holder started: the ``now`` of the acquire that gave it the lease,
    # before that pass read the requests.
    started_at: datetime | None = None
    # When the last pass that gave the lease up having read the requests started.
    served_from: datetime | None = None


def pass_started(
    started: datetime | None, current: Fence | None, granted: Fence | None, now: datetime
) -> datetime | None:
    """When the pass holding the lease started, after an acquire at ``now``: a new holder's
    pass starts ``now`` (each pass holds the lease under a name of its own, and reads the
    requests after its acquire); a renewal or a refused acquire keeps what was stored."""
    if granted is not None and (current is None or current.holder != granted.holder):
        return now
    return started


def served_after_release(
    view: LeaseView, released: Fence | None, *, served: bool
) -> datetime | None:
    """What :attr:`LeaseView.served_from` says once ``released`` (None: nothing released, see
    :func:`lease_released`) is written: the start of the pass that gave the lease up, if that
    pass read the requests (``served``); otherwise what it said before."""
    if released is not None and served and view.started_at is not None:
        return view.started_at
    return view.served_from


def nudge_served(
    view: LeaseView, published_at: datetime, now: datetime, margin: timedelta = CLOCK_MARGIN
) -> bool:
    """Whether a nudge published at ``published_at`` (its message's publish time) needs no
    pass of its own, judged at ``now`` from one read of the lease. A nudge is published after
    the change it announces is stored, and every pass reads the requests after it takes the
    lease, so a pass that took the lease later than the publish time (by more than ``margin``,
    for the two clocks) sees that change. Served, then:

    - while the lease is held (until it expires) by a pass asked for one more
      (:func:`asked_again`: that one starts after this read). A running pass that started
      after the publish is not enough: its holder is still asked, as before (the pass's
      outcome is not known yet, and the pass it owes then carries the nudge on);
    - once the lease was given up by a pass that read the requests and started after the
      publish (:attr:`LeaseView.served_from`).

    Never when the lease expired without being given up (its holder may have died before it
    read anything) or was never taken: the nudge then runs a pass as before."""
    fence = view.fence
    if fence is None:
        return False
    after = published_at + margin
    if fence.expires_at > now:
        return view.again
    if fence.expires_at == LEASE_FREE:
        return view.served_from is not None and view.served_from > after
    return False


def cooldown_after(current: datetime | None, until: datetime) -> datetime | None:
    """A pool's cool-down after a stockout asks for one ``until``: the later of the two (a
    recorded cool-down never shortens); None when the recorded one already lasts as long."""
    return until if current is None or until > current else None


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
    # When its capacity is expected to run: eta + its pool's recent admission → ACTIVE
    # median (and 90th percentile); None until the pool has a history (domain.readiness).
    ready_eta: datetime | None = None
    ready_eta_p90: datetime | None = None
    position: int | None = None
    pool: str | None = None
    # ACTIVE: where its capacity is, one host per VM in rank order (see :class:`Host`).
    hosts: tuple[Host, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The event as the public JSON object; ``hosts`` only on an event that has them
        (an ACTIVE one), so every other event reads as it always did."""
        data: dict[str, Any] = {
            "schema": EVENT_SCHEMA,
            "request_id": self.request_id,
            "tenant": self.tenant,
            "state": self.state.value,
            "previous_state": None if self.previous_state is None else self.previous_state.value,
            "at": _iso(self.at),
            "reason": self.reason,
            "message": self.message,
            "eta": None if self.eta is None else _iso(self.eta),
            "ready_eta": None if self.ready_eta is None else _iso(self.ready_eta),
            "ready_eta_p90": None if self.ready_eta_p90 is None else _iso(self.ready_eta_p90),
            "position": self.position,
            "pool": self.pool,
        }
        if self.hosts:
            data["hosts"] = hosts_to_json(self.hosts)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StatusEvent:
        """Read back what :meth:`to_json` wrote."""
        previous = data.get("previous_state")
        return cls(
            request_id=data["request_id"],
            tenant=data["tenant"],
            state=RequestState(data["state"]),
            previous_state=None if previous is None else RequestState(previous),
            at=datetime.fromisoformat(data["at"]),
            reason=data.get("reason"),
            message=data.get("message", ""),
            eta=_instant(data.get("eta")),
            ready_eta=_instant(data.get("ready_eta")),
            ready_eta_p90=_instant(data.get("ready_eta_p90")),
            position=data.get("position"),
            pool=data.get("pool"),
            hosts=hosts_from_json(data.get("hosts")),
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
    # The first ETA it was told (kept once set): what its ETA error is measured against.
    first_eta: datetime | None = None
    # ACTIVE: where its capacity is, one host per VM in rank order; () in every other state.
    hosts: tuple[Host, ...] = ()

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


def hold_end(
    record: RequestRecord, now: datetime, expected_wait: timedelta = timedelta(0)
) -> datetime:
    """When a live request's hold on its pool ends: a block at its end; a flex run its run
    duration after it became ACTIVE. While still being created (in Google's queue), its run
    duration after Google is expected to serve it (:func:`expected_serve`, from its admission
    and ``expected_wait``, the pool's recent 90th percentile:
    :func:`opendws.domain.readiness.expected_wait`)."""
    request = record.request
    if request.start_at is not None:
        return request.start_at + request.run_duration
    start = record.since or record.updated_at
    if record.state is RequestState.PROVISIONING:
        # Still being created: once ready it runs its whole duration.
        start = expected_serve(start, now, expected_wait)
    return start + request.run_duration


def expected_serve(admitted: datetime, now: datetime, wait: timedelta) -> datetime:
    """When an order admitted at ``admitted`` and not yet served at ``now`` is expected to be:
    ``wait`` after its admission; once that has passed, a further ``wait`` later, and so on.
    The estimate steps rather than following the clock, so what waits behind a late run is
    told a later ETA once per ``wait``, not on every pass. With no wait known (zero): now."""
    if wait <= timedelta(0):
        return max(admitted, now)
    if now <= admitted + wait:
        return admitted + wait
    return admitted + -(-(now - admitted) // wait) * wait


def submitted(record: RequestRecord) -> bool:
    """A calendar block submitted to Google and under its review: PENDING with its order."""
    return (
        record.state is RequestState.PENDING
        and record.request.mode is Mode.CALENDAR
        and record.pool is not None
        and record.attempt > 0
    )


def hosts_after(
    current: tuple[Host, ...], state: RequestState, hosts: tuple[Host, ...] | None
) -> tuple[Host, ...]:
    """The hosts a change leaves on a record (a rule of :meth:`Change.apply`): only an ACTIVE
    request has any — ``hosts`` replaces them, None keeps them; every other state has none
    (its VMs are not, or no longer, its own)."""
    if state is not RequestState.ACTIVE:
        return ()
    return current if hosts is None else tuple(sorted(hosts, key=lambda host: host.rank))


def lanes_after(
    current: tuple[Lane, ...], state: RequestState, lanes: tuple[Lane, ...] | None
) -> tuple[Lane, ...]:
    """The lanes a change leaves on a record (a rule of :meth:`Change.apply`): back in line
    (PENDING) a request has none; otherwise ``lanes`` replaces them, and None keeps them."""
    if state is RequestState.PENDING:
        return ()
    return current if lanes is None else tuple(lanes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One guarded write of a request: move it to ``state`` (or revise it in its state) and
    append ``event``, if it is still at ``expected_version``. ``usage``, for a final state, is
    stored in the same atomic write. The rules of the write are :meth:`apply`, which every
    adapter calls: it only persists what comes out."""

    expected_version: int
    state: RequestState
    event: StatusEvent
    reason: str | None = None
    message: str = ""
    pool: str | None = None
    eta: datetime | None = None
    position: int | None = None
    attempt: int | None = None  # None keeps the record's own
    lanes: tuple[Lane, ...] | None = None  # None keeps them (back in line there are none)
    usage: UsageEntry | None = None
    hosts: tuple[Host, ...] | None = None  # None keeps them (only ACTIVE has any)

    def revises(self, record: RequestRecord) -> bool:
        """True when the change keeps the record's state (a new ETA, reason or attempt): a
        revision, not a transition."""
        return self.state is record.state

    def apply(self, record: RequestRecord) -> RequestRecord:
        """The record after this change: the version grows by one; ``since`` becomes the
        event's time only when the state changes; ``attempt`` None keeps the old one; the first
        ETA given is kept as ``first_eta``;
        ``lanes`` as :func:`lanes_after` says, ``hosts`` as :func:`hosts_after`; one more event
        is recorded. Raises StaleWrite
        if ``record`` is at another version, IllegalTransition if the life cycle forbids the
        move."""
        if record.version != self.expected_version:
            raise StaleWrite(
                f"{record.request_id} is at version {record.version}, not {self.expected_version}"
            )
        revision = self.revises(record)
        return replace(
            record,
            state=self.state
            if revision
            else transition(record.state, self.state, block_job=record.request.block is not None),
            version=record.version + 1,
            updated_at=self.event.at,
            reason=self.reason,
            message=self.message,
            pool=self.pool,
            eta=self.eta,
            first_eta=record.first_eta or self.eta,
            position=self.position,
            attempt=record.attempt if self.attempt is None else self.attempt,
            lanes=lanes_after(record.lanes, self.state, self.lanes),
            hosts=hosts_after(record.hosts, self.state, self.hosts),
            since=record.since if revision else self.event.at,
            events=record.events + 1,
        )


def lanes_to_document(lanes: tuple[Lane, ...]) -> list[dict[str, Any]]:
    return [{"pool": lane.pool, "attempt": lane.attempt} for lane in lanes]


def lanes_from_document(data: object) -> tuple[Lane, ...]:
    if not isinstance(data, list):
        return ()
    return tuple(Lane(str(item["pool"]), int(item["attempt"])) for item in data)


@dataclass(frozen=True, slots=True)
class Watermark:
    """How far a reader of changes has read (:meth:`~opendws.ports.store.Requests.changes`):
    opaque to services, each store's own (a commit time in Firestore, a write count in
    memory)."""

    position: object


@dataclass(frozen=True, slots=True)
class Changes:
    """What a read of changes returned: every request written since the watermark given (in
    any state, final ones included, so a reader drops them) — or, for a first read, every
    request not yet final — and the watermark to read from next time."""

    records: tuple[RequestRecord, ...]
    watermark: Watermark


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


def request_to_document(request: CapacityRequest) -> dict[str, Any]:
    """The request as plain JSON-friendly values (durations in seconds, instants in ISO 8601).
    ``run`` only when it carries one (its secrets as version names, never values), and ``block``
    only for a job into a block, so a request without them reads, and fingerprints, as it
    always did."""
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
        **({} if request.run is None else {"run": request.run.to_json()}),
        **({} if request.block is None else {"block": request.block}),
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
        run=None if data.get("run") is None else RunSpec.from_json(data["run"]),
        block=data.get("block"),
    )


def accepted(request: CapacityRequest, at: datetime) -> tuple[RequestRecord, StatusEvent]:
    """A request as intake stores it when it accepts it at ``at``: PENDING, version 1, with its
    first event."""
    return _created(request, at, RequestState.PENDING, "accepted; waiting for admission")


FINISHED_FIRST = "FINISHED_BEFORE_QUEUED"  # the reason of a request recorded already ended


def finished_first(request: CapacityRequest, at: datetime) -> tuple[RequestRecord, StatusEvent]:
    """A request whose job finished before it was submitted (a CI job's finished webhook that
    arrived before its queued one), as intake stores it: already CANCELLED, version 1, with
    that one event. Its digest is the submission's, so the late submission is a duplicate of
    it and starts nothing."""
    message = (
        "its job finished before it was submitted (webhooks arrive out of order): recorded "
        "as ended, so its submission, when it comes, starts nothing"
    )
    return _created(request, at, RequestState.CANCELLED, message, reason=FINISHED_FIRST)


def _created(
    request: CapacityRequest, at: datetime, state: RequestState, message: str,
    reason: str | None = None,
) -> tuple[RequestRecord, StatusEvent]:  # fmt: skip
    """A new record at version 1 in ``state``, and its first event saying so."""
    event = StatusEvent(
        request_id=request.request_id, tenant=request.tenant, state=state, previous_state=None,
        at=at, reason=reason, message=message,
    )  # fmt: skip
    record = RequestRecord(
        request=request, state=state, version=1, digest=content_digest(request),
        updated_at=at, reason=reason, message=message,
    )  # fmt: skip
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


def _instant(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)
