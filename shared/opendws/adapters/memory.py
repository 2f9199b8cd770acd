"""In-memory implementations of the ports, for fast tests and simulations. They keep the same
contract as the real adapters (the contract suites run on both)."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from operator import attrgetter

from opendws.catalog import TPU_CALENDAR_ZONES, tpu_calendar_workload
from opendws.domain.calendar import CancellationRule, cancel_deadline, may_cancel
from opendws.domain.model import CapacityRequest, Mode, Pool, Provider
from opendws.domain.readiness import ReadySample, samples_after
from opendws.domain.states import RequestState
from opendws.ports import (
    NOT_FINAL,
    Advised,
    Change,
    Changes,
    Clock,
    Configuration,
    CreateOutcome,
    Fence,
    Host,
    Observed,
    Order,
    ProvisionPhase,
    RequestRecord,
    StatusEvent,
    Timer,
    UnknownRequest,
    UnknownTopic,
    UsageEntry,
    Watermark,
    Withdrawal,
    asked_again,
    check_fence,
    cooldown_after,
    lease_released,
    next_lease,
    requests_topic,
)
from opendws.ports.records import LeaseView, pass_started, served_after_release
from opendws.ports.runs import workers_per_node

# A record's place in submission order (then id): the order every listing of records is in.
_SUBMISSION = attrgetter("request.submitted_at", "request.request_id")


class MemoryRequestStore:
    """A RequestStore (every narrow store port) in a dict, safe to share between threads. It
    only persists: each write's rules are the pure ones of :mod:`opendws.ports.records`. Ids
    are also indexed by state and by unpublished events, so that the reconciler's queries cost
    what they return rather than every request ever stored (a trace replay stores tens of
    thousands); a write log makes :meth:`changes` cost what changed."""

    def __init__(self) -> None:
        self._records: dict[str, RequestRecord] = {}
        self._events: dict[str, list[StatusEvent]] = {}
        self._by_state: dict[RequestState, set[str]] = {state: set() for state in RequestState}
        self._outbox: set[str] = set()  # ids with unpublished events after their first
        self._lease = LeaseView(fence=None)  # its fence, the ask, when its passes started
        # The write log, one entry per request: id → the number of its latest write, in the
        # order of those writes (a write moves its id to the end). A watermark is the number
        # of the last write it saw; the log stays as large as the store, however many writes.
        self._log: dict[str, int] = {}
        self._writes = 0
        self._shortages: dict[str, datetime] = {}
        self._ready: dict[str, tuple[ReadySample, ...]] = {}
        self._usage: dict[str, UsageEntry] = {}
        self._lock = threading.Lock()

    def create(self, record: RequestRecord, event: StatusEvent) -> CreateOutcome:
        with self._lock:
            existing = self._records.get(record.request_id)
            if existing is not None:
                same = existing.digest == record.digest
                return CreateOutcome.DUPLICATE if same else CreateOutcome.CONFLICT
            self._put(record)
            self._events[record.request_id] = [event]
            return CreateOutcome.CREATED

    def get(self, request_id: str) -> RequestRecord | None:
        with self._lock:
            return self._records.get(request_id)

    def change(
        self, request_id: str, change: Change, *, fence: Fence | None = None
    ) -> RequestRecord:
        with self._lock:
            check_fence(fence, self._lease.fence)
            record = self._records.get(request_id)
            if record is None:
                raise UnknownRequest(request_id)
            changed = change.apply(record)
            self._put(changed)
            self._events[request_id].append(change.event)
            if change.usage is not None:
                self._usage[request_id] = change.usage
            return changed

    def events(self, request_id: str) -> list[StatusEvent]:
        with self._lock:
            return list(self._events.get(request_id, []))

    def mark_announced(self, request_id: str, count: int) -> None:
        with self._lock:
            record = self._records.get(request_id)
            if record is None:
                raise UnknownRequest(request_id)
            if count > record.announced:
                self._put(replace(record, announced=count))

    def in_states(self, *states: RequestState) -> list[RequestRecord]:
        return sorted(self.in_states_unordered(*states), key=_SUBMISSION)

    def in_states_unordered(self, *states: RequestState) -> list[RequestRecord]:
        """:meth:`in_states` in no particular order (not a port method: for a caller of this
        store that needs no order, such as the trace replay's loop, and need not pay a sort)."""
        with self._lock:
            return [self._records[i] for state in set(states) for i in self._by_state[state]]

    def count_in(self, *states: RequestState) -> int:
        """How many requests are in ``states`` (not a port method: it costs one look per
        state, for the trace replay's loop)."""
        with self._lock:
            return sum(len(self._by_state[state]) for state in set(states))

    def changes(self, since: Watermark | None) -> Changes:
        with self._lock:
            if since is None:
                ids: Iterable[str] = (i for state in NOT_FINAL for i in self._by_state[state])
            else:
                position = since.position
                if not isinstance(position, int):
                    raise TypeError(f"not a watermark of this store: {since!r}")
                newer: list[str] = []
                for request_id in reversed(self._log):  # newest first, until what it saw
                    if self._log[request_id] <= position:
                        break
                    newer.append(request_id)
                ids = reversed(newer)  # each once, in write order
            found = [self._records[i] for i in ids]
            return Changes(tuple(found), Watermark(self._writes))

    def unannounced(self) -> list[RequestRecord]:
        with self._lock:
            found = [self._records[request_id] for request_id in self._outbox]
        return sorted(found, key=_SUBMISSION)

    def _put(self, record: RequestRecord) -> None:
        """Store ``record`` and keep the indexes true (the lock is held)."""
        request_id = record.request_id
        previous = self._records.get(request_id)
        if previous is not None:
            self._by_state[previous.state].discard(request_id)
        self._records[request_id] = record
        self._by_state[record.state].add(request_id)
        self._writes += 1
        self._log.pop(request_id, None)
        self._log[request_id] = self._writes
        if record.events > record.announced and record.version > 1:
            self._outbox.add(request_id)
        else:
            self._outbox.discard(request_id)

    def usage(self, tenant: str | None = None) -> list[UsageEntry]:
        with self._lock:
            entries = [u for u in self._usage.values() if tenant is None or u.tenant == tenant]
        return sorted(entries, key=lambda u: (u.ended_at, u.request_id))

    def acquire_lease(
        self, holder: str, now: datetime, ttl: timedelta, *, ask_again: bool = False
    ) -> Fence | None:
        with self._lock:
            view = self._lease
            lease = next_lease(view.fence, holder, now, ttl)
            self._lease = replace(
                view,
                fence=view.fence if lease is None else lease,
                again=asked_again(view.again, view.fence, lease, ask=ask_again),
                started_at=pass_started(view.started_at, view.fence, lease, now),
            )
            return lease

    def release_lease(self, fence: Fence, *, served: bool = False) -> bool:
        with self._lock:
            view = self._lease
            released = lease_released(view.fence, fence)
            if released is None:
                return False
            self._lease = replace(
                view,
                fence=released,
                served_from=served_after_release(view, released, served=served),
            )
            return view.again

    def lease_view(self) -> LeaseView:
        with self._lock:
            return self._lease

    def mark_pool_short(self, pool_id: str, until: datetime, fence: Fence | None = None) -> None:
        with self._lock:
            check_fence(fence, self._lease.fence)
            cooldown = cooldown_after(self._shortages.get(pool_id), until)
            if cooldown is not None:
                self._shortages[pool_id] = cooldown

    def pool_shortages(self) -> dict[str, datetime]:
        with self._lock:
            return dict(self._shortages)

    def record_ready(self, pool_id: str, *samples: ReadySample, fence: Fence | None = None) -> None:
        with self._lock:
            check_fence(fence, self._lease.fence)
            kept = samples_after(self._ready.get(pool_id, ()), *samples)
            if kept is not None:
                self._ready[pool_id] = kept

    def ready_samples(self) -> dict[str, tuple[ReadySample, ...]]:
        with self._lock:
            return dict(self._ready)


class MemoryConfigStore:
    """A ConfigStore in memory."""

    def __init__(self, configuration: Configuration | None = None) -> None:
        self._configuration = configuration or Configuration()
        self._lock = threading.Lock()

    def load(self) -> Configuration:
        with self._lock:
            return self._configuration

    def save(self, configuration: Configuration) -> None:
        with self._lock:
            self._configuration = configuration


class MemoryEventBus:
    """An EventBus that keeps what was published, in order."""

    def __init__(self) -> None:
        self.published: list[StatusEvent] = []
        self._lock = threading.Lock()

    def publish(self, event: StatusEvent) -> None:
        with self._lock:
            self.published.append(event)


LONG_AGO = datetime.min.replace(tzinfo=UTC)
NEVER = datetime.max.replace(tzinfo=UTC)
# The error code a stockout carries, as Compute Engine reports it.
STOCKOUT = "ZONE_RESOURCE_POOL_EXHAUSTED"
# What a TPU queued resource in Google's queue says (its state, WAITING_FOR_RESOURCES, from its
# acceptance on; the API reports no per-attempt error for it).
_TPU_WAITING = "waiting for resources in Google's queue"
FAILURE_KINDS = ("stockout", "hang", "error")
# The serving rule of the simulated cloud (opendws.sim): a requested run duration of a day
# serves as if the request had come an hour later; no duration counts as the 7-day maximum.
SHORTER_FIRST = 1 / 24
MAX_RUN = timedelta(days=7)
# How soon a waiting order is tried again after an attempt an injected stockout failed (a real
# shortage needs no timer: every change of stock makes its queue look again).
RETRY_AFTER = timedelta(minutes=1)
# How long Google takes to review a submitted calendar block, unless set otherwise (the
# simulated cloud's default; compute/docs/instances/create-future-reservations-calendar-mode:
# a request is PENDING_APPROVAL until Google approves or declines it).
REVIEW_DELAY = timedelta(minutes=2)
# The error codes of a calendar block Google will not deliver (Observed.error_code).
DECLINED = "DECLINED"  # its review found no capacity over its window
CANCELLED = "CANCELLED"  # withdrawn while Google still allowed it
BLOCK_FAILED = "FAILED"  # approved, but its units were gone at its start
# How many starts Google's Advice API recommends at most (advice.calendarMode).
ADVICE_LIMIT = 3
# Phases of a block that has started: its reservation is live (with or without VMs).
_LIVE = (ProvisionPhase.RESERVED, ProvisionPhase.CREATING, ProvisionPhase.READY)

_Key = tuple[str, str]


# The fields of an order that a look at it shows (see _FakeOrder.report).
_SHOWN = frozenset({"phase", "error_code", "message", "last_attempt", "locked_at", "addresses"})


@dataclass(slots=True)
class _FakeOrder:
    """One order in the fake cloud: a flex-start resize request or queued resource, or a
    calendar block (its future reservation, its reservation once live, and its VMs).

    Setting a field a look shows notes the order in ``touched`` (its provider's, by name, with
    its pool), wherever in the fake cloud that happens: the next look reports again only
    those (see MemoryCapacityProvider.observe)."""

    # The provider's orders whose report may have changed → their pool id.
    touched: dict[str, str] = field(repr=False, compare=False)
    name: str
    pool: Pool
    units: int
    vms: int  # VMs in its gang (a TPU order: slices)
    run_duration: timedelta
    calendar_end: datetime | None  # calendar blocks end here; flex runs end after run_duration
    phase: ProvisionPhase
    created_at: datetime
    sequence: int  # arrival order: breaks ties of the serving rule
    eligible_at: datetime  # first tried at creation + the provisioning latency
    holds_stock: bool = False
    workers: int = 1  # VMs of each of its ``vms`` (a TPU slice's workers)
    ends_by_itself: bool = False  # flex-start VMs and slices are deleted when their time is up
    starts_at: datetime | None = None  # a calendar block takes its units at its start
    hung: bool = False  # a "hang" injection: it waits for ever, never served (or reviewed)
    queued: bool = False  # in Google's queue of its key (pending or eligible)
    ready_at: datetime | None = None
    error_code: str | None = None
    last_attempt: str | None = None
    message: str = ""
    review_at: datetime | None = None  # a block: when Google reviews it
    filled_at: datetime | None = None  # a started block: when its reservation is filled
    approved_at: datetime | None = None  # a block: when Google approved it (None: not yet)
    locked_at: datetime | None = None  # a block: the last instant it may be cancelled
    # Its VMs' internal addresses, by rank, given when they come up (READY): each VM its own.
    addresses: tuple[str, ...] = ()
    # What observe last reported of it, and the fields it was built from: one report object
    # per change, not per look (a replay looks at every order on every pass).
    seen: tuple[object, ...] = ()
    observed: Observed | None = None

    def __setattr__(self, field: str, value: object) -> None:
        object.__setattr__(self, field, value)
        if field in _SHOWN:
            self.touched[self.name] = self.pool.pool_id

    def report(self, pool_id: str) -> Observed:
        """What a look at it finds now (the same object while nothing it shows changed)."""
        shown = (
            self.phase, self.error_code, self.message, self.last_attempt, self.locked_at,
            self.addresses,
        )  # fmt: skip
        if self.observed is None or shown != self.seen:
            self.seen = shown
            self.observed = Observed(
                name=self.name,
                pool_id=pool_id,
                phase=self.phase,
                error_code=self.error_code,
                message=self.message,
                last_attempt=self.last_attempt,
                locked_at=self.locked_at,
                ends_at=self.calendar_end,
                hosts=self.hosts(),
            )
        return self.observed

    def hosts(self) -> tuple[Host, ...]:
        """READY: its VMs ``{name}-{i}`` in rank order, with the addresses they came up with;
        a TPU order's are its slices' workers, as the TPU API names them (the node ``{name}``,
        or ``{name}-{i}`` of several, and the worker's number), ranked node, then worker."""
        if self.phase is not ProvisionPhase.READY:
            return ()
        zone = self.pool.zone
        if self.pool.provider is not Provider.TPU:
            return tuple(
                Host(rank=rank, name=f"{self.name}-{rank}", zone=zone, internal_ip=address)
                for rank, address in enumerate(self.addresses)
            )
        hosts = []
        for rank, address in enumerate(self.addresses):
            node, worker = divmod(rank, self.workers)
            name = self.name if self.vms == 1 else f"{self.name}-{node}"
            host = Host(rank=rank, name=name, zone=zone, internal_ip=address, worker=worker)
            hosts.append(host)
        return tuple(hosts)

    @property
    def key(self) -> _Key:
        return (self.pool.zone, self.pool.shape)

    @property
    def block(self) -> bool:
        """True for a calendar block."""
        return self.calendar_end is not None

    @property
    def serving_key(self) -> tuple[datetime, int]:
        """The serving order: creation time plus the shorter-first allowance, then arrival."""
        return (self.created_at + self.run_duration * SHORTER_FIRST, self.sequence)

    def end(self) -> datetime | None:
        """When it ends by itself, once it holds its capacity (None: never)."""
        if self.calendar_end is not None:
            return self.calendar_end
        if self.ready_at is not None and self.ends_by_itself:
            return self.ready_at + self.run_duration
        return None

    def promised(self, key: _Key, start: datetime, end: datetime) -> int:
        """The units this order is promised over ``[start, end)`` of ``key`` beyond the stock:
        an approved block not yet started, whose window overlaps (0 for anything else)."""
        if self.phase is not ProvisionPhase.APPROVED or self.key != key:
            return 0
        assert self.starts_at is not None  # a block
        assert self.calendar_end is not None
        return self.units if self.starts_at < end and start < self.calendar_end else 0


class MemoryCapacityProvider:
    """A CapacityProvider (and CalendarBlocks) over a tiny simulated cloud in memory that does
    what Google does (and what the simulated cloud behind the emulator does: the contract suite
    checks both alike).

    - Free stock per (zone, shape); an order is CREATING until ``latency`` has passed, then
      joins Google's queue of its (zone, shape). The queue is served first come first served,
      shorter run durations favoured (the simulated cloud's rule: ordered by creation time +
      run duration / 24, then arrival); the head is served when its units are free, and a head
      that does not fit blocks those behind it (nothing starves). An order short of stock is
      never failed: it WAITS, with the attempt's temporary error as ``last_attempt``
      (ZONE_RESOURCE_POOL_EXHAUSTED for a MIG resize request; a TPU queued resource is
      WAITING_FOR_RESOURCES from its acceptance and reports no attempt) and is served as stock
      frees (a release, the end of a run, more stock set).
    - Injections, taken one per serving attempt of the queue's head: "stockout" — that attempt
      finds no capacity (the order waits; tried again a minute later); "hang" — the order is
      never served (it waits until released); "error" — a final failure (FAILED,
      RESOURCE_OPERATION_FAILED).
    - Flex-start VMs and TPU slices END by themselves after their run duration (flex-start
      VMs are deleted; a flex-start queued resource is SUSPENDED), giving their stock back.
    - A calendar order is a calendar-mode future reservation
      (compute/docs/instances/future-reservations-calendar-mode-overview). :meth:`reserve`
      submits it: REVIEW (PENDING_APPROVAL) until ``review_delay`` has passed, then Google
      reviews it: APPROVED if the stock of its (zone, shape) minus the units of the approved
      blocks not yet started whose windows overlap its own covers its units, with ``locked_at``
      = :func:`~opendws.domain.calendar.cancel_deadline` under ``cancellation``; else FAILED,
      DECLINED. Injections: "error" at the submission — the insert fails, nothing is created;
      at the review, "stockout" (or "error") — DECLINED, "hang" — it stays in REVIEW. At its
      start it takes its units (FAILED, FAILED, if they are gone); its reservation is filled
      ``fill_delay`` later (Google: up to 24 h), APPROVED until then, then RESERVED;
      :meth:`provision` then creates its VMs on the block's own units (CREATING,
      READY after ``latency``) — before that it does nothing. At its end: ENDED, VMs gone,
      units back. :meth:`withdraw` cancels it while
      :func:`~opendws.domain.calendar.may_cancel` allows (never once started): FAILED,
      CANCELLED; otherwise Google refuses and nothing changes. :meth:`release` deletes its VMs
      but the block only if it may be withdrawn (or is over: ended, declined, failed,
      cancelled); a block Google keeps is billed to its end and stays observed until then
      (delete-future-reservations-calendar-mode). :meth:`advise` answers as Google's Advice
      API does, by the same capacity model as the review.

    Settling is event driven: every change that will happen by itself (a serving attempt, a
    review, a block's start and end, a run's end) is a timed event on a heap, so a call when
    nothing is due costs nothing, whatever the number of orders.
    """

    def __init__(
        self, clock: Clock, *, latency: timedelta = timedelta(seconds=20),
        review_delay: timedelta = REVIEW_DELAY, fill_delay: timedelta = timedelta(0),
        cancellation: CancellationRule = CancellationRule.WINDOWS,
        latency_of: Callable[[str], timedelta] | None = None,
    ) -> None:  # fmt: skip
        """``latency``: how long every order takes to provision; ``latency_of``, if given,
        replaces it per order (by order name): Google's queue takes longer for some orders
        than others (a replay's :class:`~opendws.replay.google_queue.GoogleQueue`)."""
        self._clock = clock
        self._latency = latency
        self._latency_of = latency_of
        self._review_delay = review_delay
        self._fill_delay = fill_delay
        self._cancellation = cancellation
        self._offset = timedelta(0)
        self._stock: dict[_Key, int] = {}
        self._injected: dict[_Key, list[str]] = {}
        self._orders: dict[str, _FakeOrder] = {}
        self._by_pool: dict[str, dict[str, _FakeOrder]] = {}
        # What a look at each pool finds (order name → report), kept between looks: a look
        # reports again only the orders touched since (created, changed in a field a look
        # shows, or gone), as a replay looks at every order on every pass.
        self._views: dict[str, dict[str, Observed]] = {}
        self._touched: dict[str, str] = {}  # order name → its pool id
        self._blocks: dict[_Key, dict[str, _FakeOrder]] = {}  # calendar blocks per key
        # The orders holding stock now, per key (holds_stock): what a review or an advice
        # reads of its key, without looking at every order.
        self._holding: dict[_Key, dict[str, _FakeOrder]] = {}
        # Google's queue per key: orders not yet eligible (a heap by eligible time), eligible
        # ones (a heap by the serving rule), and eligible ones not yet told of a failed attempt.
        self._pending: dict[_Key, list[tuple[datetime, int, _FakeOrder]]] = {}
        self._eligible: dict[_Key, list[tuple[tuple[datetime, int], int, _FakeOrder]]] = {}
        self._unattempted: dict[_Key, list[_FakeOrder]] = {}
        self._created: dict[str, int] = {}
        # Timed events: (when, sequence, order name or None, key to serve or None).
        self._events: list[tuple[datetime, int, str | None, _Key | None]] = []
        self._sequence = itertools.count()
        self._addresses = itertools.count()  # the VMs' internal addresses, one after another
        self._lock = threading.Lock()

    # Steering (the same methods the emulator's admin client has) ----------------------------

    def set_stock(self, zone: str, shape: str, units: int) -> None:
        """Free units of ``shape`` in ``zone`` (waiting orders are served from them)."""
        with self._lock:
            self._settle()
            self._stock[(zone, shape)] = units
            self._serve_soon((zone, shape), self._now())

    def stock(self, zone: str, shape: str) -> int:
        """Free units of ``shape`` in ``zone`` now."""
        with self._lock:
            self._settle()
            return self._stock.get((zone, shape), 0)

    def inject(self, zone: str, shape: str, kind: str, count: int = 1) -> None:
        """The next ``count`` serving attempts (or calendar submissions and reviews) of
        ``shape`` in ``zone`` go as ``kind``."""
        if kind not in FAILURE_KINDS:
            raise ValueError(f"kind: {kind!r} is not one of {', '.join(FAILURE_KINDS)}")
        with self._lock:
            self._injected.setdefault((zone, shape), []).extend([kind] * count)

    def set_latency(self, latency: timedelta) -> None:
        """How long provisioning takes, for orders created from now on."""
        with self._lock:
            self._latency = latency

    def set_review_delay(self, delay: timedelta) -> None:
        """How long Google takes to review a calendar block, for blocks submitted from now on."""
        with self._lock:
            self._review_delay = delay

    def set_fill_delay(self, delay: timedelta) -> None:
        """How long after a block's start Google takes to fill its reservation, for blocks
        that start from now on."""
        with self._lock:
            self._fill_delay = delay

    def set_cancellation(self, rule: CancellationRule) -> None:
        """Which of Google's cancellation rules holds, from now on (for approvals, withdrawals
        and releases)."""
        with self._lock:
            self._cancellation = rule

    def advance(self, delta: timedelta) -> None:
        """Move the fake cloud's own time forward (on top of the injected clock)."""
        with self._lock:
            self._offset += delta
            self._settle()

    def next_eligible(self) -> datetime | None:
        """When the next order still provisioning has its latency over and is served (or
        tried, if its stock is short), on the injected clock; None if none is provisioning.
        A replay wakes then: nothing else tells it that Google is about to serve an order."""
        with self._lock:
            self._settle()
            due = [
                eligible_at
                for heap in self._pending.values()
                for eligible_at, _, order in heap
                if order.queued
            ]
            return min(due) - self._offset if due else None

    def created(self) -> dict[str, int]:
        """How many times each order name was created (a retry must never make it 2)."""
        with self._lock:
            return dict(self._created)

    # The port ---------------------------------------------------------------------------

    def observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        with self._lock:
            self._settle()
            self._refresh_views()
            observed: dict[str, Observed] = {}
            for pool_id in {pool.pool_id for pool in pools}:
                observed.update(self._views.get(pool_id, {}))
            return observed

    def _refresh_views(self) -> None:
        """Bring every pool's view up to date with the orders touched since the last look (the
        lock is held). A view lists its orders in the order they were created, as the pool's
        orders are."""
        # Every order holds this very dict: copy what it says, then empty it in place.
        touched = dict(self._touched)
        self._touched.clear()
        for name, pool_id in touched.items():
            view = self._views.setdefault(pool_id, {})
            order = self._by_pool.get(pool_id, {}).get(name)
            if order is None:
                view.pop(name, None)
            else:
                view[name] = order.report(pool_id)

    def reserve(self, order: Order) -> None:
        """Submit the calendar block (a future reservation insert): REVIEW until Google has
        reviewed it. An "error" injection fails the insert: nothing is created."""
        if order.request.mode is not Mode.CALENDAR:
            return
        with self._lock:
            self._settle()
            if order.name in self._orders:
                return
            key = (order.pool.zone, order.pool.shape)
            injected = self._injected.get(key)
            if injected and injected[0] == "error":
                injected.pop(0)
                return  # the insert operation failed: nothing is created
            request = order.request
            assert request.start_at is not None  # a calendar block
            _refuse_tpu_block_zone(order.pool)
            fake = self._new(order, ProvisionPhase.REVIEW)
            fake.starts_at = request.start_at
            fake.review_at = fake.created_at + self._review_delay
            fake.message = "submitted; Google is reviewing it (PENDING_APPROVAL)"
            self._blocks.setdefault(key, {})[fake.name] = fake
            self._at(fake.review_at, fake)
            self._at(request.start_at, fake)
            self._at(request.start_at + request.run_duration, fake)

    def provision(self, order: Order) -> None:
        with self._lock:
            self._settle()
            existing = self._orders.get(order.name)
            if existing is not None and existing.block:
                if existing.phase is ProvisionPhase.RESERVED:  # its reservation is live
                    existing.phase = ProvisionPhase.CREATING
                    existing.eligible_at = self._now() + self._latency_for(existing.name)
                    existing.message = ""
                    self._at(existing.eligible_at, existing)  # its VMs: the block's own units
                return  # not live yet (or over): asked again on a later pass
            if existing is not None or order.request.mode is Mode.CALENDAR:
                return  # a calendar order without its block has no reservation to consume
            # A queued resource is WAITING_FOR_RESOURCES from its acceptance; a resize
            # request is ACCEPTED and tried once the provisioning latency has passed.
            tpu = order.pool.provider is Provider.TPU
            fake = self._new(order, ProvisionPhase.WAITING if tpu else ProvisionPhase.CREATING)
            if tpu:
                fake.message = _TPU_WAITING
            fake.queued = True
            entry = (fake.eligible_at, fake.sequence, fake)
            heapq.heappush(self._pending.setdefault(fake.key, []), entry)
            self._serve_soon(fake.key, fake.eligible_at)

    def release(self, name: str, pool: Pool) -> None:
        """Delete the order. A calendar block's VMs always go; the block itself only if Google
        lets it go (it may be withdrawn, or it is over) — otherwise Google keeps it, billed to
        its end, and it stays observed until then."""
        with self._lock:
            self._settle()
            order = self._orders.get(name)
            if order is None:
                return
            now = self._now()
            if order.block:
                if order.phase in (ProvisionPhase.CREATING, ProvisionPhase.READY):
                    order.phase, order.ready_at = ProvisionPhase.RESERVED, None  # VMs deleted
                if not self._deletable(order, now):
                    return  # kept by Google until its end
                self._blocks.get(order.key, {}).pop(name, None)
            self._orders.pop(name)
            self._by_pool.get(order.pool.pool_id, {}).pop(name, None)
            self._touched[name] = order.pool.pool_id  # gone: the next look drops it
            order.queued = False  # out of Google's queue (its heap entry is skipped)
            if order.holds_stock:
                self._give_back(order, now)

    # Calendar blocks (CalendarBlocks) -----------------------------------------------------

    def withdraw(self, name: str, pool: Pool) -> Withdrawal:
        """Cancel the block ``name`` if Google allows it now (FAILED, CANCELLED; units back if
        held); REFUSED, nothing changed, if not. Nothing to cancel (unknown, declined, failed,
        cancelled already): WITHDRAWN."""
        with self._lock:
            self._settle()
            order = self._orders.get(name)
            if order is None or not order.block or order.phase is ProvisionPhase.FAILED:
                return Withdrawal.WITHDRAWN
            if not self._cancellable(order, self._now()):
                return Withdrawal.REFUSED
            order.phase, order.error_code = ProvisionPhase.FAILED, CANCELLED
            order.message = "the block was cancelled before its start"
            if order.holds_stock:
                self._give_back(order, self._now())
            return Withdrawal.WITHDRAWN

    def advise(
        self, request: CapacityRequest, pools: Sequence[Pool], *, earliest: datetime,
        latest: datetime,
    ) -> tuple[Advised, ...]:  # fmt: skip
        """Up to three starts in ``[earliest, latest]``, earliest first, at which the
        request's units are free for its run duration in the zones of ``pools`` (those of its
        shape), by the review's capacity model; one :class:`Advised` per (start, zone).
        Candidate starts: ``earliest`` and the ends of approved blocks in between."""
        with self._lock:
            self._settle()
            keys = list(
                dict.fromkeys((p.zone, p.shape) for p in pools if p.shape == request.gang.shape)
            )
            candidates = {earliest}
            for key in keys:
                for block in self._blocks.get(key, {}).values():
                    end = block.calendar_end
                    approved = block.phase is ProvisionPhase.APPROVED
                    if approved and end is not None and earliest <= end <= latest:
                        candidates.add(end)
            advised: list[Advised] = []
            starts = 0
            for start in sorted(candidates):
                if starts == ADVICE_LIMIT or start > latest:
                    break
                end = start + request.run_duration
                fits = [k for k in keys if self._free(k, start, end) >= request.units]
                advised.extend(Advised(start_at=start, end_at=end, zone=k[0]) for k in fits)
                starts += bool(fits)
            return tuple(advised)

    # Inside -----------------------------------------------------------------------------

    def _now(self) -> datetime:
        return self._clock.now() + self._offset

    def _latency_for(self, name: str) -> timedelta:
        return self._latency if self._latency_of is None else self._latency_of(name)

    def _new(self, order: Order, phase: ProvisionPhase) -> _FakeOrder:
        request = order.request
        calendar_end = None
        if request.mode is Mode.CALENDAR and request.start_at is not None:
            calendar_end = request.start_at + request.run_duration
        now = self._now()
        fake = _FakeOrder(
            touched=self._touched,
            name=order.name,
            pool=order.pool,
            units=request.units,
            vms=request.gang.vm_count,
            workers=workers_per_node(request.gang),
            run_duration=request.run_duration,
            calendar_end=calendar_end,
            phase=phase,
            created_at=now,
            sequence=next(self._sequence),
            eligible_at=now + self._latency_for(order.name),
            ends_by_itself=calendar_end is None,
        )
        self._orders[order.name] = fake
        self._by_pool.setdefault(order.pool.pool_id, {})[order.name] = fake
        self._created[order.name] = self._created.get(order.name, 0) + 1
        return fake

    def _at(self, when: datetime, order: _FakeOrder) -> None:
        """Look at ``order`` again at ``when``."""
        heapq.heappush(self._events, (when, next(self._sequence), order.name, None))

    def _serve_soon(self, key: _Key, when: datetime) -> None:
        """Serve the queue of ``key`` at ``when`` (at once if that has passed)."""
        if self._pending.get(key) or self._eligible.get(key):
            heapq.heappush(self._events, (when, next(self._sequence), None, key))

    def _bring_up(self, order: _FakeOrder) -> None:
        """Its VMs (a TPU order: its slices' workers) come up, each with an internal address
        of its own, stable for its life."""
        count = order.vms * order.workers
        order.addresses = tuple(_internal_ip(next(self._addresses)) for _ in range(count))

    def _take_stock(self, order: _FakeOrder) -> None:
        self._stock[order.key] = self._stock.get(order.key, 0) - order.units
        order.holds_stock = True
        self._holding.setdefault(order.key, {})[order.name] = order

    def _give_back(self, order: _FakeOrder, when: datetime) -> None:
        self._stock[order.key] = self._stock.get(order.key, 0) + order.units
        order.holds_stock = False
        self._holding.get(order.key, {}).pop(order.name, None)
        self._serve_soon(order.key, when)

    def _settle(self) -> None:
        """Run every event due by now, in time order, each at its own moment (the lock is
        held). Nothing is due: nothing to do."""
        now = self._now()
        events = self._events
        while events and events[0][0] <= now:
            when, _, name, key = heapq.heappop(events)
            if key is not None:
                self._serve(key, when)
                continue
            order = self._orders.get(name or "")
            if order is not None:
                self._look_at(order, when)

    def _look_at(self, order: _FakeOrder, when: datetime) -> None:
        """What happens to ``order`` by itself at ``when``."""
        if order.block:
            self._look_at_block(order, when)
            return
        end = order.end()
        if order.phase is ProvisionPhase.READY and end is not None and end <= when:
            order.phase = ProvisionPhase.ENDED
            if order.holds_stock:
                self._give_back(order, when)

    def _look_at_block(self, block: _FakeOrder, when: datetime) -> None:
        """What happens to a calendar block by itself at ``when``: its review, its start, its
        VMs becoming ready, its end (each event checks them all, so one due late still runs
        them in order)."""
        assert block.starts_at is not None
        assert block.calendar_end is not None
        review = block.review_at
        due = review is not None and review <= when
        if block.phase is ProvisionPhase.REVIEW and not block.hung and due:
            self._review(block, when)
        if block.phase is ProvisionPhase.APPROVED and block.starts_at <= when:
            if not block.holds_stock:
                self._take_block(block, when)
            if block.filled_at is not None and block.filled_at <= when:
                block.phase = ProvisionPhase.RESERVED
                block.message = "the block's reservation is filled"
        if block.phase is ProvisionPhase.CREATING and block.eligible_at <= when:
            self._bring_up(block)
            block.phase, block.ready_at = ProvisionPhase.READY, block.eligible_at
        started = block.phase in _LIVE or block.holds_stock
        if started and block.calendar_end <= when:
            block.phase, block.ready_at = ProvisionPhase.ENDED, None  # its VMs are deleted
            block.message = "the block's time window has ended"
            if block.holds_stock:
                self._give_back(block, when)

    def _review(self, block: _FakeOrder, when: datetime) -> None:
        """Google reviews a submitted block at ``when``: approved if its units are free over
        its window beyond what overlapping approved blocks were promised (an injection taken
        first: "hang" leaves it in review, "stockout" or "error" declines it)."""
        assert block.starts_at is not None
        assert block.calendar_end is not None
        injected = self._injected.get(block.key)
        kind = injected.pop(0) if injected else None
        if kind == "hang":
            block.hung = True  # never reviewed: PENDING_APPROVAL until withdrawn or deleted
            return
        free = self._free(block.key, block.starts_at, block.calendar_end)
        if kind is not None or free < block.units:
            block.phase, block.error_code = ProvisionPhase.FAILED, DECLINED
            block.message = (
                f"{block.units} × {block.pool.shape} are not "
                f"available in {block.pool.zone} from {block.starts_at.isoformat()} to "
                f"{block.calendar_end.isoformat()}"
            )
            return
        block.phase, block.approved_at = ProvisionPhase.APPROVED, when
        block.locked_at = cancel_deadline(
            self._cancellation, start=block.starts_at, approved_at=when
        )
        block.message = "approved by Google; its reservation is filled from its start"

    def _free(self, key: _Key, start: datetime, end: datetime) -> int:
        """Units of ``key`` Google would still promise over ``[start, end)``: the stock, plus
        the units held now by runs and blocks that end by ``start`` (back by then), minus the
        units of approved blocks not yet started whose windows overlap."""
        promised = sum(b.promised(key, start, end) for b in self._blocks.get(key, {}).values())
        back = sum(
            order.units
            for order in self._holding.get(key, {}).values()
            if (ends := order.end()) is not None and ends <= start
        )
        return self._stock.get(key, 0) + back - promised

    def _cancellable(self, block: _FakeOrder, now: datetime) -> bool:
        """Whether Google lets ``block`` be cancelled at ``now`` (never once started)."""
        assert block.starts_at is not None
        if block.phase not in (ProvisionPhase.REVIEW, ProvisionPhase.APPROVED):
            return False
        return may_cancel(
            self._cancellation, start=block.starts_at, approved_at=block.approved_at, now=now
        )

    def _deletable(self, block: _FakeOrder, now: datetime) -> bool:
        """Whether Google lets ``block`` be deleted at ``now``: it is over, or it may still be
        cancelled."""
        over = block.phase in (ProvisionPhase.ENDED, ProvisionPhase.FAILED)
        return over or self._cancellable(block, now)

    def _serve(self, key: _Key, when: datetime) -> None:
        """One serving attempt of the queue of ``key`` at ``when`` (see the class docstring):
        the head of the eligible orders by the serving rule is served while it fits; one that
        does not fit blocks the rest, and every eligible order records the failed attempt.
        Each order is moved, served and told of a failure once: O(log n) per change."""
        pending = self._pending.get(key, [])
        eligible = self._eligible.setdefault(key, [])
        fresh = self._unattempted.setdefault(key, [])
        while pending and pending[0][0] <= when:
            _, _, order = heapq.heappop(pending)
            if order.queued:
                heapq.heappush(eligible, (order.serving_key, order.sequence, order))
                fresh.append(order)
        while eligible:
            head = eligible[0][2]
            if not head.queued:
                heapq.heappop(eligible)
                continue
            injected = self._injected.get(key)
            kind = injected.pop(0) if injected else None
            if kind == "hang":
                heapq.heappop(eligible)
                head.queued, head.hung = False, True  # it waits for ever: never served
                continue
            if kind == "error":
                heapq.heappop(eligible)
                head.queued = False
                head.phase, head.error_code = ProvisionPhase.FAILED, "RESOURCE_OPERATION_FAILED"
                head.last_attempt, head.message = None, "the operation failed (injected)"
                continue
            if kind is None and self._stock.get(key, 0) >= head.units:
                heapq.heappop(eligible)
                head.queued = False
                self._take_stock(head)
                self._bring_up(head)
                head.phase, head.ready_at = ProvisionPhase.READY, when
                head.last_attempt, head.message = None, ""
                end = head.end()
                if end is not None:
                    self._at(end, head)
                continue
            for order in fresh:
                if order.queued:
                    self._attempt_failed(order, key)
            fresh.clear()
            if kind == "stockout":
                self._attempt_failed(head, key)
                self._serve_soon(key, when + RETRY_AFTER)
            return

    def _attempt_failed(self, order: _FakeOrder, key: _Key) -> None:
        """An attempt found no capacity for ``order``: it waits, and says why."""
        order.phase = ProvisionPhase.WAITING
        if order.pool.provider is Provider.TPU:
            order.message = _TPU_WAITING  # no per-attempt error: its state says it
            return
        order.last_attempt = STOCKOUT
        order.message = (
            f"the zone {key[0]} does not have enough resources available to fulfill the "
            f"request ({order.units} × {key[1]})"
        )

    def _take_block(self, block: _FakeOrder, when: datetime) -> None:
        """A block's start: its units are taken, and its reservation (there, empty, since the
        approval) is filled ``fill_delay`` later (RESERVED; APPROVED until then), or it fails
        if they are gone."""
        if self._stock.get(block.key, 0) < block.units:
            block.phase, block.error_code = ProvisionPhase.FAILED, BLOCK_FAILED
            block.message = (
                f"Google could not deliver the block: {block.units} × {block.pool.shape} were "
                f"gone from {block.pool.zone} at its start"
            )
            return
        self._take_stock(block)
        block.filled_at = when + self._fill_delay
        if block.filled_at > when:
            block.message = "Google Cloud is filling the block's reservation"
            self._at(block.filled_at, block)
            return
        block.phase = ProvisionPhase.RESERVED
        block.message = "the block's reservation is filled"


def _internal_ip(number: int) -> str:
    """The ``number``-th VM's internal address: 10.128.0.2, 10.128.0.3, … (a VPC subnet's
    first two addresses and its last two are Google's own: vpc/docs/subnets, "Reserved IP
    addresses in IPv4 subnets")."""
    host, network = number % 252 + 2, number // 252
    return f"10.{128 + network // 256 % 128}.{network % 256}.{host}"


def _refuse_tpu_block_zone(pool: Pool) -> None:
    """As Google refuses a calendar-mode TPU reservation outside the zones it reserves that
    generation in (catalog.TPU_CALENDAR_ZONES): ValueError, nothing created."""
    if pool.provider is Provider.TPU and tpu_calendar_workload(pool.accelerator, pool.zone) is None:
        zones = ", ".join(sorted(TPU_CALENDAR_ZONES.get(pool.accelerator, {})))
        raise ValueError(
            f"calendar mode reserves {pool.accelerator} only in {zones or 'no zone'}, not in "
            f"{pool.zone}"
        )


class MemoryTimerQueue:
    """A TimerQueue in memory: what is armed, what was ever armed (a task name is never
    reused), and a way for tests to take the timers that are due."""

    def __init__(self) -> None:
        self._armed: dict[str, tuple[Timer, datetime]] = {}  # name → (timer, scheduled at)
        self.used: set[str] = set()
        self._lock = threading.Lock()

    def arm(self, timer: Timer, now: datetime) -> None:
        with self._lock:
            if timer.name in self.used:
                return  # the same timer again: one task (Cloud Tasks: ALREADY_EXISTS)
            self.used.add(timer.name)
            self._armed[timer.name] = (timer, timer.due_at(now))

    def disarm(self, timer: Timer) -> None:
        with self._lock:
            self._armed.pop(timer.name, None)

    def armed(self) -> list[tuple[Timer, datetime]]:
        """Every armed timer and when its task is scheduled, soonest first."""
        with self._lock:
            return sorted(self._armed.values(), key=lambda pair: (pair[1], pair[0].name))

    def take_due(self, now: datetime) -> list[Timer]:
        """Remove and return the timers whose tasks are due at ``now`` (as dispatching does)."""
        with self._lock:
            due = [(t, at) for t, at in self._armed.values() if at <= now]
            for timer, _ in due:
                del self._armed[timer.name]
        return [timer for timer, _ in sorted(due, key=lambda pair: (pair[1], pair[0].name))]


class MemoryNudger:
    """A Nudger that counts."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def nudge(self, reason: str) -> None:
        self.reasons.append(reason)


class MemoryRequestPublisher:
    """A RequestPublisher that keeps what was published, and on which topic (its tenant's, as
    the Pub/Sub publisher routes it); ids count up. Given ``existing`` topics, a message for
    any other raises :class:`~opendws.ports.UnknownTopic`, as Pub/Sub answers NOT_FOUND;
    without, every topic exists."""

    def __init__(self, existing: Iterable[str] | None = None) -> None:
        self.messages: list[dict[str, object]] = []
        self.topics: list[str] = []
        self._existing = None if existing is None else frozenset(existing)
        self._lock = threading.Lock()

    def publish(self, message: dict[str, object]) -> str:
        tenant = message.get("tenant")
        if not isinstance(tenant, str) or not tenant:
            raise ValueError("tenant: a request message names its tenant, whose topic it goes on")
        if self._existing is not None and requests_topic(tenant) not in self._existing:
            raise UnknownTopic(requests_topic(tenant))
        with self._lock:
            self.messages.append(message)
            self.topics.append(requests_topic(tenant))
            return str(len(self.messages))
