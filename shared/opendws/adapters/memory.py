"""In-memory implementations of the ports, for fast tests and simulations. They keep the same
contract as the real adapters (the contract suites run on both)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from opendws.domain.model import Mode, Pool, Provider
from opendws.domain.states import RequestState, transition
from opendws.ports import (
    Clock,
    Configuration,
    CreateOutcome,
    Fence,
    Fenced,
    Lane,
    Observed,
    Order,
    ProvisionPhase,
    RequestRecord,
    StaleWrite,
    StatusEvent,
    Timer,
    UnknownRequest,
    UsageEntry,
    lanes_after,
)

# A released lease expires at the beginning of time: anyone may take it at once.
LEASE_FREE = datetime.min.replace(tzinfo=UTC)


class MemoryRequestStore:
    """A RequestStore in a dict, safe to share between threads. Ids are also indexed by state
    and by unpublished events, so that the reconciler's queries cost what they return rather
    than every request ever stored (a trace replay stores tens of thousands)."""

    def __init__(self) -> None:
        self._records: dict[str, RequestRecord] = {}
        self._events: dict[str, list[StatusEvent]] = {}
        self._by_state: dict[RequestState, set[str]] = {state: set() for state in RequestState}
        self._outbox: set[str] = set()  # ids with unpublished events after their first
        self._lease: Fence | None = None
        self._shortages: dict[str, datetime] = {}
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
        self, request_id: str, *, expected_version: int, state: RequestState, event: StatusEvent,
        reason: str | None = None, message: str = "", pool: str | None = None,
        eta: datetime | None = None, position: int | None = None, attempt: int | None = None,
        fence: Fence | None = None, usage: UsageEntry | None = None,
        lanes: tuple[Lane, ...] | None = None,
    ) -> RequestRecord:  # fmt: skip
        with self._lock:
            self._check_fence(fence)
            record = self._records.get(request_id)
            if record is None:
                raise UnknownRequest(request_id)
            if record.version != expected_version:
                raise StaleWrite(
                    f"{request_id} is at version {record.version}, not {expected_version}"
                )
            revision = state is record.state
            changed = replace(
                record,
                state=state if revision else transition(record.state, state),
                version=record.version + 1,
                updated_at=event.at,
                reason=reason,
                message=message,
                pool=pool,
                eta=eta,
                position=position,
                attempt=record.attempt if attempt is None else attempt,
                lanes=lanes_after(record.lanes, state, lanes),
                since=record.since if revision else event.at,
                events=record.events + 1,
            )
            self._put(changed)
            self._events[request_id].append(event)
            if usage is not None:
                self._usage[request_id] = usage
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
        with self._lock:
            found = [self._records[i] for state in set(states) for i in self._by_state[state]]
        return sorted(found, key=lambda r: (r.request.submitted_at, r.request_id))

    def unannounced(self) -> list[RequestRecord]:
        with self._lock:
            found = [self._records[request_id] for request_id in self._outbox]
        return sorted(found, key=lambda r: (r.request.submitted_at, r.request_id))

    def _put(self, record: RequestRecord) -> None:
        """Store ``record`` and keep the indexes true (the lock is held)."""
        request_id = record.request_id
        previous = self._records.get(request_id)
        if previous is not None:
            self._by_state[previous.state].discard(request_id)
        self._records[request_id] = record
        self._by_state[record.state].add(request_id)
        if record.events > record.announced and record.version > 1:
            self._outbox.add(request_id)
        else:
            self._outbox.discard(request_id)

    def usage(self, tenant: str | None = None) -> list[UsageEntry]:
        with self._lock:
            entries = [u for u in self._usage.values() if tenant is None or u.tenant == tenant]
        return sorted(entries, key=lambda u: (u.ended_at, u.request_id))

    def acquire_lease(self, holder: str, now: datetime, ttl: timedelta) -> Fence | None:
        with self._lock:
            lease = self._lease
            if lease is not None and lease.holder != holder and lease.expires_at > now:
                return None
            token = 1 if lease is None else lease.token + (lease.holder != holder)
            self._lease = Fence(holder=holder, token=token, expires_at=now + ttl)
            return self._lease

    def release_lease(self, fence: Fence) -> None:
        with self._lock:
            lease = self._lease
            if lease is not None and (lease.holder, lease.token) == (fence.holder, fence.token):
                self._lease = replace(lease, expires_at=LEASE_FREE)

    def mark_pool_short(self, pool_id: str, until: datetime, fence: Fence | None = None) -> None:
        with self._lock:
            self._check_fence(fence)
            current = self._shortages.get(pool_id)
            if current is None or until > current:
                self._shortages[pool_id] = until

    def pool_shortages(self) -> dict[str, datetime]:
        with self._lock:
            return dict(self._shortages)

    def _check_fence(self, fence: Fence | None) -> None:
        """Refuse a fenced write once the lease has changed hands (the lock is held)."""
        if fence is None:
            return
        lease = self._lease
        if lease is None or lease.token != fence.token or lease.holder != fence.holder:
            current = "nobody" if lease is None else f"{lease.holder} (token {lease.token})"
            raise Fenced(
                f"the reconciler lease is held by {current}; {fence.holder} "
                f"(token {fence.token}) may no longer write"
            )


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
FAILURE_KINDS = ("stockout", "hang", "error")


@dataclass(slots=True)
class _FakeOrder:
    """One order in the fake cloud."""

    name: str
    pool: Pool
    units: int
    run_duration: timedelta
    calendar_end: datetime | None  # calendar blocks end here; flex runs end after run_duration
    phase: ProvisionPhase
    created_at: datetime
    holds_stock: bool = False
    ends_by_itself: bool = False  # flex-start VMs are deleted when their run time is up
    starts_at: datetime | None = None  # a calendar block takes its units at its start
    hung: bool = False  # a "hang" injection: it never leaves CREATING
    ready_at: datetime | None = None
    error_code: str | None = None
    message: str = ""


class MemoryCapacityProvider:
    """A CapacityProvider over a tiny simulated cloud in memory: free stock per (zone, shape),
    a provisioning latency, injected failures, and a clock the test moves.

    It behaves as the emulated cloud does (and the contract suite checks both the same way): an
    order is CREATING until ``latency`` has passed, then READY if the stock was there — taking
    it — or FAILED with ZONE_RESOURCE_POOL_EXHAUSTED if not; a "hang" injection keeps it
    CREATING for ever, an "error" injection fails it with another code. A MIG flex run ENDS
    by itself after its run duration (flex-start VMs are deleted); a TPU one runs until
    released; a calendar order is RESERVED from :meth:`reserve` — which creates nothing, as
    the cloud refuses the reservation, when the units are not free beyond those promised to
    overlapping blocks — takes its units at the block's start (or FAILS if they are gone),
    and ENDS at the block's end.
    """

    def __init__(self, clock: Clock, *, latency: timedelta = timedelta(seconds=20)) -> None:
        self._clock = clock
        self._latency = latency
        self._offset = timedelta(0)
        self._stock: dict[tuple[str, str], int] = {}
        self._injected: dict[tuple[str, str], list[str]] = {}
        self._orders: dict[str, _FakeOrder] = {}
        self._created: dict[str, int] = {}
        self._next_due = LONG_AGO  # the earliest time an order changes by itself
        self._lock = threading.Lock()

    # Steering (the same methods the emulator's admin client has) ----------------------------

    def set_stock(self, zone: str, shape: str, units: int) -> None:
        """Free units of ``shape`` in ``zone``."""
        with self._lock:
            self._stock[(zone, shape)] = units

    def stock(self, zone: str, shape: str) -> int:
        """Free units of ``shape`` in ``zone`` now."""
        with self._lock:
            self._settle()
            return self._stock.get((zone, shape), 0)

    def inject(self, zone: str, shape: str, kind: str, count: int = 1) -> None:
        """The next ``count`` provisionings of ``shape`` in ``zone`` fail as ``kind``."""
        if kind not in FAILURE_KINDS:
            raise ValueError(f"kind: {kind!r} is not one of {', '.join(FAILURE_KINDS)}")
        with self._lock:
            self._injected.setdefault((zone, shape), []).extend([kind] * count)

    def set_latency(self, latency: timedelta) -> None:
        """How long provisioning takes from now on."""
        with self._lock:
            self._latency = latency
            self._next_due = LONG_AGO  # every due time moved: look again

    def advance(self, delta: timedelta) -> None:
        """Move the fake cloud's own time forward (on top of the injected clock)."""
        with self._lock:
            self._offset += delta
            self._settle()

    def created(self) -> dict[str, int]:
        """How many times each order name was created (a retry must never make it 2)."""
        with self._lock:
            return dict(self._created)

    # The port ---------------------------------------------------------------------------

    def observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        wanted = {pool.pool_id for pool in pools}
        with self._lock:
            self._settle()
            return {
                order.name: Observed(
                    name=order.name,
                    pool_id=order.pool.pool_id,
                    phase=order.phase,
                    error_code=order.error_code,
                    message=order.message,
                )
                for order in self._orders.values()
                if order.pool.pool_id in wanted
            }

    def reserve(self, order: Order) -> None:
        if order.request.mode is not Mode.CALENDAR:
            return
        with self._lock:
            self._settle()
            if order.name in self._orders:
                return
            key = (order.pool.zone, order.pool.shape)
            request = order.request
            assert request.start_at is not None  # a calendar block
            end = request.start_at + request.run_duration
            promised = sum(
                other.units
                for other in self._orders.values()
                if other.phase is ProvisionPhase.RESERVED and not other.holds_stock
                and (other.pool.zone, other.pool.shape) == key
                and other.starts_at is not None and other.calendar_end is not None
                and other.starts_at < end and request.start_at < other.calendar_end
            )  # fmt: skip
            if self._stock.get(key, 0) - promised < request.units:
                return  # refused, as the cloud refuses the reservation: nothing is created
            fake = self._new(order, ProvisionPhase.RESERVED)
            fake.starts_at = request.start_at
            self._expect(fake)
            if request.start_at <= self._now():
                self._take_block(fake)

    def provision(self, order: Order) -> None:
        with self._lock:
            self._settle()
            existing = self._orders.get(order.name)
            if existing is None:
                self._new(order, ProvisionPhase.CREATING)
            elif existing.phase is ProvisionPhase.RESERVED:
                existing.phase = ProvisionPhase.CREATING
                existing.created_at = self._now()
                self._expect(existing)

    def release(self, name: str, pool: Pool) -> None:
        with self._lock:
            order = self._orders.pop(name, None)
            if order is not None and order.holds_stock:
                self._give_back(order)

    # Inside -----------------------------------------------------------------------------

    def _now(self) -> datetime:
        return self._clock.now() + self._offset

    def _new(self, order: Order, phase: ProvisionPhase) -> _FakeOrder:
        request = order.request
        calendar_end = None
        if request.mode is Mode.CALENDAR and request.start_at is not None:
            calendar_end = request.start_at + request.run_duration
        fake = _FakeOrder(
            name=order.name,
            pool=order.pool,
            units=request.units,
            run_duration=request.run_duration,
            calendar_end=calendar_end,
            phase=phase,
            created_at=self._now(),
            ends_by_itself=order.pool.provider is Provider.MIG and calendar_end is None,
        )
        self._orders[order.name] = fake
        self._created[order.name] = self._created.get(order.name, 0) + 1
        self._expect(fake)
        return fake

    def _give_back(self, order: _FakeOrder) -> None:
        key = (order.pool.zone, order.pool.shape)
        self._stock[key] = self._stock.get(key, 0) + order.units
        order.holds_stock = False

    def _due(self, order: _FakeOrder) -> datetime | None:
        """When ``order`` next changes by itself, if ever."""
        if order.phase is ProvisionPhase.CREATING and not order.hung:
            return order.created_at + self._latency
        if order.phase is ProvisionPhase.RESERVED and not order.holds_stock:
            return order.starts_at
        if order.phase in (ProvisionPhase.READY, ProvisionPhase.RESERVED):
            if order.calendar_end is not None:
                return order.calendar_end
            if order.ready_at is not None and order.ends_by_itself:
                return order.ready_at + order.run_duration
        return None

    def _expect(self, order: _FakeOrder) -> None:
        """Note ``order``'s next change, so that settling can skip until something is due."""
        due = self._due(order)
        if due is not None and due < self._next_due:
            self._next_due = due

    def _settle(self) -> None:
        """Bring every order up to the current time (the lock is held). Nothing to do until
        the earliest change is due, so most calls return at once."""
        now = self._now()
        if now < self._next_due:
            return
        self._next_due = NEVER
        for order in sorted(self._orders.values(), key=lambda o: (o.created_at, o.name)):
            due = order.created_at + self._latency
            if order.phase is ProvisionPhase.CREATING and not order.hung and now >= due:
                self._finish_creating(order)
            starts = order.starts_at
            waiting = order.phase is ProvisionPhase.RESERVED and not order.holds_stock
            if waiting and starts is not None and now >= starts:
                self._take_block(order)
            if order.phase in (ProvisionPhase.READY, ProvisionPhase.RESERVED):
                end = order.calendar_end
                if end is None and order.ready_at is not None and order.ends_by_itself:
                    end = order.ready_at + order.run_duration
                if end is not None and now >= end:
                    order.phase = ProvisionPhase.ENDED
                    if order.holds_stock:
                        self._give_back(order)
            self._expect(order)

    def _take_block(self, order: _FakeOrder) -> None:
        """A block's start: take its units, or fail if they are gone."""
        key = (order.pool.zone, order.pool.shape)
        if self._stock.get(key, 0) < order.units:
            order.phase, order.error_code = ProvisionPhase.FAILED, STOCKOUT
            order.message = "the block's units were gone at its start"
            return
        self._stock[key] = self._stock.get(key, 0) - order.units
        order.holds_stock = True

    def _finish_creating(self, order: _FakeOrder) -> None:
        key = (order.pool.zone, order.pool.shape)
        injected = self._injected.get(key) or []
        kind = injected.pop(0) if injected else None
        if kind == "hang":
            order.hung = True
            return
        if kind == "error":
            order.phase, order.error_code = ProvisionPhase.FAILED, "RESOURCE_OPERATION_FAILED"
            order.message = "the operation failed (injected)"
            return
        if not order.holds_stock:
            if kind == "stockout" or self._stock.get(key, 0) < order.units:
                order.phase, order.error_code = ProvisionPhase.FAILED, STOCKOUT
                order.message = (
                    f"the zone {order.pool.zone} does not have enough resources available "
                    f"to fulfill the request ({order.units} × {order.pool.shape})"
                )
                return
            self._stock[key] = self._stock.get(key, 0) - order.units
            order.holds_stock = True
        order.phase = ProvisionPhase.READY
        order.ready_at = order.created_at + self._latency


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
    """A RequestPublisher that keeps what was published; ids count up."""

    def __init__(self) -> None:
        self.messages: list[dict[str, object]] = []
        self._lock = threading.Lock()

    def publish(self, message: dict[str, object]) -> str:
        with self._lock:
            self.messages.append(message)
            return str(len(self.messages))
