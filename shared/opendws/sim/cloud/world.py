"""The shared world under every simulated resource: the clock, the event heap, the free stock per
zone and shape with the optional seeded process that moves it, Google's queue of waiting requests
per zone and shape, injected failures, Compute operations, ids and counters.

Invariants:
- Stock is physical: it is shared by all projects, keyed by zone and shape. A shape is a machine
  type name for Compute (units are VMs) or a TPU AcceleratorConfig type name (units are chips).
  Every unit is either free (in ``stock``) or held by exactly one instance, future reservation or
  queued resource; releasing a holder returns its units exactly once, and every return makes the
  queue of that key look again for requests to serve.
- The world is settled lazily and deterministically: every call first runs the scheduled events
  that are due at ``clock.now()``, in time order (ties in scheduling order), each at its own
  scheduled moment. Moving the clock is all it takes to make things happen.
- The clock is an :class:`opendws.clock.ManualClock`, running (wall time plus an offset) unless
  the caller passes a frozen one; it never goes backwards, so events already settled cannot be
  undone.
- The serving rule (``serving_key``), one for resize requests, flex-start VMs and TPU queued
  resources alike: per (zone, shape), the requests whose provisioning latency has passed are
  ordered by ``created_at + SHORTER_FIRST × requested run duration`` (no duration counts as the
  7-day maximum), ties by arrival. The head is served when its units are free; a head that does
  not fit blocks the requests behind it (no overtaking, so nothing starves), and every waiting
  request records the attempt's temporary ``ZONE_RESOURCE_POOL_EXHAUSTED``.
- Calendar blocks are not queued: a future reservation is reviewed ``review_delay`` after its
  insert from the same stock (``reservations`` has the capacity model), and its auto-created
  reservation, while live, is consumed by VMs and queued resources that name it; every consumer
  goes when the reservation does. ``review_delay`` and ``cancellation_rule`` are configuration,
  like the provisioning latency: ``reset`` keeps them.
- Compute operations take time (``operation_latency``, configuration kept by ``reset``): each
  goes PENDING → RUNNING → DONE over it, ``progress`` rising from 0 to 100. An insert makes its
  resource visible at once; what a delete or cancel does lands when its operation is DONE (the
  resource stays visible until then). While a resource's own operation runs, a mutation of it,
  or one that names it (a group's template), is refused with 400 ``resourceNotReady``. A
  flex-start VM's insert keeps its own RUNNING operation while it waits in Google's queue.
- Rate quotas (``quotas``), off unless set: ``charge`` counts one call of a kind against its
  project's quota for the current minute of the simulated clock, or refuses it.
- One re-entrant lock guards everything, so the emulator may serve requests from many threads.
"""

from __future__ import annotations

import functools
import heapq
import ipaddress
import itertools
import random
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Concatenate, ParamSpec, TypeVar

from opendws.clock import ManualClock
from opendws.domain.calendar import CancellationRule
from opendws.sim.cloud.errors import CloudError
from opendws.sim.cloud.parsing import JSON, last, nonempty, scope_path, scope_url, stamp
from opendws.sim.cloud.quotas import CallKind, RateQuotas, quota_message, window

FAILURE_KINDS = ("stockout", "hang", "error")
CREATED_KINDS = ("resizeRequests", "queuedResources", "futureReservations", "instances")
STOCKOUT = "ZONE_RESOURCE_POOL_EXHAUSTED"
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
RATE_EXCEEDED = "RESOURCE_OPERATION_RATE_EXCEEDED"
# A requested run duration of 1 day serves as if the request had come 1 hour later: shorter
# requests tend to be served sooner ("shorter requests are typically fulfilled more quickly").
SHORTER_FIRST = 1 / 24
MAX_RUN = timedelta(days=7)
# How soon Google tries a waiting request again after an attempt that an injected stockout
# failed (a real shortage needs no timer: every change of stock makes the queue look again).
RETRY_AFTER = timedelta(minutes=1)
# How long Google takes to review a submitted calendar block: not documented; a setting.
REVIEW_DELAY = timedelta(minutes=2)
# Where the VMs' internal addresses come from: the range of auto mode VPC networks' subnets
# (vpc/docs/subnets: 10.128.0.0/9, us-central1's 10.128.0.0/20). A setting, so that a local
# cloud whose VMs really run gives each one a loopback address of its own (127.0.0.0/8).
INTERNAL_RANGE = "10.128.0.0/9"
# How long a Compute operation takes from insert to DONE. Google publishes no duration: an
# operation is "PENDING, RUNNING, or DONE" (Operation.status) and clients poll it, or call
# zoneOperations.wait, which "waits for no more than the 2 minute deadline"
# (compute/docs/reference/rest/v1/zoneOperations/wait); the real client's .result() polls from
# 1 s on (google.api_core.future.polling.DEFAULT_POLLING). A few seconds, as mutations of
# groups, templates and resize requests take on Google; tests that need instant operations set
# it to zero.
OPERATION_LATENCY = timedelta(seconds=3)
# The part of an operation's latency it spends PENDING before it is RUNNING.
PENDING_SHARE = 0.2

_FIRST_ID = 1_000_000_000_000_000_001
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_HTTP_MESSAGES = {400: "BAD REQUEST", 409: "CONFLICT", 503: "SERVICE UNAVAILABLE"}

Key = tuple[str, str]


@dataclass(eq=False)
class Record:
    """What every simulated resource has; ``alive`` turns false when it is deleted, so events
    scheduled for it do nothing."""

    project: str
    zone: str
    name: str
    id: int
    created_at: datetime
    body: JSON
    alive: bool = field(default=True, init=False)
    # The name of its own operation while that runs (a mutation of it is then refused).
    busy: str | None = field(default=None, init=False)


@dataclass(eq=False)
class Template(Record):
    machine_type: str = ""


@dataclass(eq=False)
class Mig(Record):
    template: str = ""
    base_name: str = ""
    mode: str = "INDIVIDUAL"


@dataclass(eq=False)
class ResizeRequest(Record):
    mig: str = ""
    shape: str = ""
    count: int = 0
    names: list[str] = field(default_factory=list)
    run_duration: timedelta | None = None
    state: str = "ACCEPTED"
    errors: list[JSON] = field(default_factory=list)  # status.error: final, behind FAILED
    last_attempt: list[JSON] = field(default_factory=list)  # temporary, cleared when final


@dataclass(eq=False)
class Instance(Record):
    shape: str = ""
    status: str = "PROVISIONING"
    mig: str | None = None
    block: FutureReservation | None = None  # the calendar block whose reservation it consumes
    holds_stock: bool = False
    ends_at: datetime | None = None  # when it gives its unit back by itself (None: never)
    flex: bool = False
    operation: JSON | None = None  # a flex-start VM's insert operation, RUNNING while it waits
    # Its first interface's addresses, given at its creation and kept for its life: the
    # internal one (networkIP) and, with an access config, the external one (natIP).
    internal_ip: str = ""
    external_ip: str | None = None


@dataclass(eq=False)
class FutureReservation(Record):
    """A calendar block: ``count`` units of ``shape`` (VMs of a machine type, or chips of a TPU
    API type when ``tpu``) over [``start``, ``end``), delivered as the reservation
    ``reservation_name`` (live while ``reservation_id`` is set; its units usable once
    ``filled``)."""

    shape: str = ""
    count: int = 0
    tpu: bool = False
    start: datetime = EPOCH
    end: datetime = EPOCH
    reservation_name: str = ""
    procurement: str = "PENDING_APPROVAL"
    approved_at: datetime | None = None
    lock_time: datetime | None = None
    reservation_id: int | None = None
    holds_stock: bool = False
    # Whether Google has delivered the block's units into its reservation: the reservation
    # exists from approval, empty, and is filled from the block's start (possibly later).
    filled: bool = False

    @property
    def reservation_live(self) -> bool:
        return self.reservation_id is not None

    @property
    def usable(self) -> int:
        """Units of its reservation that consumers may take now."""
        return self.count if self.reservation_live and self.filled else 0


@dataclass(eq=False)
class TpuNode:
    """A TPU node (one slice) that a queued resource made when it became ``ACTIVE``: its name
    (the node spec's ``nodeId``, or ``{nodeIdPrefix}-{i}``), its own id, its place among its
    queued resource's nodes, the node spec's ``node`` as sent, its TPU type (AcceleratorConfig
    type name, ``acceleratorType`` and topology) and its workers' internal addresses, one per
    TPU VM, in worker order."""

    name: str
    id: int
    index: int
    spec: JSON
    shape: str
    accelerator_type: str
    topology: str
    addresses: list[str]
    created_at: datetime


@dataclass(eq=False)
class QueuedResource(Record):
    shape: str = ""
    chips: int = 0
    state: str = "WAITING_FOR_RESOURCES"
    valid_until: datetime | None = None
    failed: JSON | None = None
    holds_stock: bool = False
    block: FutureReservation | None = None  # the calendar block whose reservation it consumes
    ends_at: datetime | None = None  # when it gives its chips back by itself (None: never)
    api_version: str = "v2"
    flex: bool = False
    run_duration: timedelta | None = None
    termination_time: datetime | None = None
    initiator: str | None = None
    # Its nodes while it is ACTIVE (made when it becomes ACTIVE, gone when it stops being so).
    nodes: list[TpuNode] = field(default_factory=list)


@dataclass
class Project:
    """One project's resources and operations, keyed as their URLs name them."""

    templates: dict[str, Template] = field(default_factory=dict)
    migs: dict[tuple[str, str], Mig] = field(default_factory=dict)
    resize_requests: dict[tuple[str, str, str], ResizeRequest] = field(default_factory=dict)
    instances: dict[tuple[str, str], Instance] = field(default_factory=dict)
    future_reservations: dict[tuple[str, str], FutureReservation] = field(default_factory=dict)
    queued_resources: dict[tuple[str, str], QueuedResource] = field(default_factory=dict)
    operations: dict[tuple[str, str], JSON] = field(default_factory=dict)
    tpu_operations: dict[tuple[str, str], JSON] = field(default_factory=dict)


@dataclass(eq=False)
class Waiting:
    """One request in Google's queue of its (zone, shape).

    ``on_served`` is called once its units have been taken from stock; ``on_attempt`` with the
    (code, message) of an attempt that found no capacity; ``on_fatal`` with an injected fatal
    failure (the entry has left the queue, no units are taken)."""

    record: Record
    kind: str
    key: Key
    units: int
    eligible_at: datetime
    run_duration: timedelta | None
    sequence: int
    on_served: Callable[[datetime], None]
    on_attempt: Callable[[str, str], None]
    on_fatal: Callable[[datetime], None]

    @property
    def serving_key(self) -> tuple[datetime, int]:
        """The serving order: creation time plus the shorter-first allowance, then arrival."""
        run = self.run_duration if self.run_duration is not None else MAX_RUN
        return (self.record.created_at + run * SHORTER_FIRST, self.sequence)


@dataclass(eq=False)
class StockProcess:
    """Other customers taking and freeing capacity of one (zone, shape): every ``every``, the
    free units move by a uniform whole step in ``[-step, step]``, kept within ``[low, high]``.
    Seeded per key, so the walk is the same for a seed whatever the clock moves."""

    low: int
    high: int
    step: int
    every: timedelta
    seed: int
    rng: random.Random
    next_at: datetime

    def view(self) -> JSON:
        return {
            "low": self.low,
            "high": self.high,
            "step": self.step,
            "every_seconds": self.every.total_seconds(),
            "seed": self.seed,
            "next_at": stamp(self.next_at),
        }


_W = TypeVar("_W", bound="World")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def settled(
    method: Callable[Concatenate[_W, _P], _R],
) -> Callable[Concatenate[_W, _P], _R]:
    """Run ``method`` under the world's lock, after settling it up to ``clock.now()``."""

    @functools.wraps(method)
    def wrapper(self: _W, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._lock:
            self._settle()
            return method(self, *args, **kwargs)

    return wrapper


class World:
    """Clock, events, stock, queue, injections, operations: the state every resource kind
    shares, and the steering calls on it. See the module docstring for the invariants."""

    def __init__(
        self,
        clock: ManualClock | None = None,
        *,
        provisioning_latency: timedelta = timedelta(seconds=20),
        review_delay: timedelta = REVIEW_DELAY,
        fill_delay: timedelta = timedelta(0),
        cancellation_rule: CancellationRule = CancellationRule.WINDOWS,
        internal_range: str = INTERNAL_RANGE,
        operation_latency: timedelta = OPERATION_LATENCY,
    ) -> None:
        """``internal_range``: the IPv4 range (a /24 or larger) the VMs' internal addresses are
        taken from, one /24 after another, each from its .2 (configuration: ``reset`` keeps
        it). ``operation_latency``: how long a Compute operation takes to be DONE (the module
        docstring; ``timedelta(0)``: at once)."""
        if provisioning_latency < timedelta(0):
            raise ValueError("the provisioning latency cannot be negative")
        if review_delay < timedelta(0):
            raise ValueError("the review delay cannot be negative")
        if fill_delay < timedelta(0):
            raise ValueError("the fill delay cannot be negative")
        if operation_latency < timedelta(0):
            raise ValueError("the operation latency cannot be negative")
        self.clock = clock if clock is not None else ManualClock(running=True)
        self._lock = threading.RLock()
        self._latency = provisioning_latency
        self._review_delay = review_delay
        self._fill_delay = fill_delay
        self._cancellation_rule = CancellationRule(cancellation_rule)
        self._internal_range = _internal_range(internal_range)
        self._operation_latency = operation_latency
        self._rate_quotas: RateQuotas | None = None
        self._ids = itertools.count(_FIRST_ID)
        self._clear()

    def _clear(self) -> None:
        self._projects: dict[str, Project] = {}
        self._stock: dict[Key, int] = {}
        self._processes: dict[Key, StockProcess] = {}
        self._queues: dict[Key, list[Waiting]] = {}
        self._passes: set[tuple[Key, datetime]] = set()
        self._injections: dict[Key, deque[str]] = {}
        self._events: list[tuple[datetime, int, Callable[[datetime], None]]] = []
        self._sequence = itertools.count()
        # A seeded generator keeps generated VM names the same from run to run.
        self._random = random.Random(0)
        self._created: dict[str, Counter[str]] = {kind: Counter() for kind in CREATED_KINDS}
        self._counters: Counter[str] = Counter()
        self._addresses = itertools.count()  # the VMs' addresses, one after another
        # Operations not yet DONE: name → (when RUNNING, when DONE), for their progress.
        self._timing: dict[str, tuple[datetime, datetime]] = {}
        # Calls counted against rate quotas: (project, location, kind) → (minute, calls).
        self._calls: dict[tuple[str, str, CallKind], tuple[datetime, int]] = {}

    # ------------------------------------------------------------------ steering

    @settled
    def set_stock(self, zone: str, shape: str, units: int) -> None:
        """Set the free units of ``shape`` in ``zone`` (units held by resources are not counted).
        An explicit stock stays as set: it stops that key's stock process."""
        if isinstance(units, bool) or not isinstance(units, int) or units < 0:
            raise ValueError(f"units must be a whole number ≥ 0, not {units!r}")
        key = (nonempty(zone, "zone"), nonempty(shape, "shape"))
        self._processes.pop(key, None)
        self._stock[key] = units
        self._look_again(key)

    @settled
    def stock(self, zone: str, shape: str) -> int:
        """The free units of ``shape`` in ``zone`` now."""
        return self._stock.get((zone, shape), 0)

    @settled
    def set_stock_process(
        self,
        zone: str,
        shape: str,
        *,
        low: int,
        high: int,
        step: int = 1,
        every: timedelta = timedelta(minutes=5),
        seed: int = 0,
    ) -> None:
        """Let other customers move the free units of ``shape`` in ``zone``: every ``every`` of
        sim time, from now, the free units change by a uniform whole number in ``[-step, step]``
        and are then kept within ``[low, high]`` (0 ≤ low ≤ high). Only free units change: units
        our resources hold are never taken. The walk is seeded by ``seed`` and the key, so it is
        the same for a seed whatever the clock moves. ``set_stock`` on the key stops it."""
        for what, value in (("low", low), ("high", high), ("step", step), ("seed", seed)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{what} must be a whole number, not {value!r}")
        if not 0 <= low <= high:
            raise ValueError(f"the bounds must satisfy 0 ≤ low ≤ high, not {low}..{high}")
        if step < 1:
            raise ValueError(f"step must be ≥ 1, not {step}")
        if every <= timedelta(0):
            raise ValueError(f"every must be positive, not {every}")
        key = (nonempty(zone, "zone"), nonempty(shape, "shape"))
        now = self.clock.now()
        process = StockProcess(
            low, high, step, every, seed, random.Random(f"{seed}/{zone}/{shape}"), now + every
        )
        self._processes[key] = process
        self._at(process.next_at, functools.partial(self._step_stock, key, process))

    @settled
    def inject(self, zone: str, shape: str, kind: str, count: int = 1) -> None:
        """Make the next ``count`` attempts to provision ``shape`` in ``zone`` go as ``kind``:
        ``stockout`` (the attempt sees no capacity: a waiting request records the temporary
        error and is tried again; an immediate create fails), ``hang`` (the request is never
        served; it waits until cancelled, deleted or its deadline) or ``error`` (a fatal
        failure: a resize request is FAILED and rolls back its VMs, a queued resource FAILED).
        A calendar block's attempt is its review (``reservations``): ``stockout`` or ``error``
        declines it, ``hang`` leaves it pending; an ``error`` next at its insert fails that."""
        if kind not in FAILURE_KINDS:
            raise ValueError(f"kind must be one of {', '.join(FAILURE_KINDS)}, not {kind!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be a whole number ≥ 1, not {count!r}")
        key = (nonempty(zone, "zone"), nonempty(shape, "shape"))
        self._injections.setdefault(key, deque()).extend([kind] * count)

    @settled
    def set_latency(self, latency: timedelta) -> None:
        """Set the provisioning latency of resources created from now on."""
        if latency < timedelta(0):
            raise ValueError(f"the latency cannot be negative, not {latency}")
        self._latency = latency

    @settled
    def set_operation_latency(self, latency: timedelta) -> None:
        """Set how long Compute operations created from now on take to be DONE."""
        if latency < timedelta(0):
            raise ValueError(f"the operation latency cannot be negative, not {latency}")
        self._operation_latency = latency

    @property
    def operation_latency(self) -> timedelta:
        return self._operation_latency

    @settled
    def set_rate_quotas(self, quotas: RateQuotas | None) -> None:
        """Enforce ``quotas`` (``RateQuotas.google_defaults()`` for Google's) on the calls
        ``charge`` counts, from now on; ``None`` turns them off."""
        if quotas is not None and not isinstance(quotas, RateQuotas):
            raise ValueError(f"quotas must be RateQuotas or None, not {quotas!r}")
        self._rate_quotas = quotas
        self._calls.clear()

    @property
    def rate_quotas(self) -> RateQuotas | None:
        return self._rate_quotas

    @settled
    def charge(self, project: str, location: str, kind: CallKind) -> None:
        """Count one Compute Engine API call of ``kind`` by ``project`` in ``location`` (a
        region, or ``global``) against its quota for the current minute; a call over it is
        refused (403 ``rateLimitExceeded``) and not counted. Nothing is counted while rate
        quotas are off."""
        if self._rate_quotas is None:
            return
        minute = window(self.clock.now())
        key = (project, location, CallKind(kind))
        start, calls = self._calls.get(key, (minute, 0))
        if start != minute:
            calls = 0
        if calls >= self._rate_quotas.limit(key[2]):
            self._counters["rate_limited"] += 1
            raise CloudError.rate_limited(quota_message(key[2], location, project))
        self._calls[key] = (minute, calls + 1)

    def advance(self, delta: timedelta) -> None:
        """Move the clock forward by ``delta`` and settle everything that became due."""
        with self._lock:
            self.clock.advance(delta)
            self._settle()

    def reset(self) -> None:
        """Forget all resources, operations, stock, stock processes, queues, injections and
        counters. The clock, the provisioning and operation latencies, the rate quotas, the
        review and fill delays and the cancellation rule (configuration, not state) are
        kept."""
        with self._lock:
            self._clear()

    @settled
    def created(self, kind: str) -> dict[str, int]:
        """For ``kind`` in ``CREATED_KINDS``: name → how many times a create of that name was
        accepted (a resource came into being). Instances count whether inserted directly or made
        by a resize request."""
        if kind not in self._created:
            raise ValueError(f"kind must be one of {', '.join(CREATED_KINDS)}, not {kind!r}")
        return dict(self._created[kind])

    def _world_state(self) -> dict[str, object]:
        """The world's part of ``state()``: time, latency, stock, processes, queues,
        injections, ``created`` and event counters."""
        return {
            "now": stamp(self.clock.now()),
            "latency_seconds": self._latency.total_seconds(),
            "operation_latency_seconds": self._operation_latency.total_seconds(),
            "rate_quotas": None if self._rate_quotas is None else self._rate_quotas.view(),
            "review_delay_seconds": self._review_delay.total_seconds(),
            "fill_delay_seconds": self._fill_delay.total_seconds(),
            "cancellation_rule": self._cancellation_rule.value,
            "stock": [
                {"zone": zone, "shape": shape, "units": units}
                for (zone, shape), units in sorted(self._stock.items())
            ],
            "stock_processes": [
                {"zone": zone, "shape": shape, **process.view()}
                for (zone, shape), process in sorted(self._processes.items())
            ],
            "queues": [
                {
                    "zone": zone,
                    "shape": shape,
                    "waiting": [
                        {
                            "kind": entry.kind,
                            "project": entry.record.project,
                            "name": entry.record.name,
                            "units": entry.units,
                            "eligible_at": stamp(entry.eligible_at),
                        }
                        for entry in sorted(queue, key=lambda e: e.serving_key)
                    ],
                }
                for (zone, shape), queue in sorted(self._queues.items())
                if queue
            ],
            "injections": [
                {"zone": zone, "shape": shape, "kinds": list(kinds)}
                for (zone, shape), kinds in sorted(self._injections.items())
                if kinds
            ],
            "created": {kind: dict(names) for kind, names in self._created.items()},
            "counters": dict(self._counters),
        }

    # ------------------------------------------------------------------ events

    def _settle(self) -> None:
        now = self.clock.now()
        while self._events and self._events[0][0] <= now:
            when, _, action = heapq.heappop(self._events)
            action(when)

    def _at(self, when: datetime, action: Callable[[datetime], None]) -> None:
        heapq.heappush(self._events, (when, next(self._sequence), action))

    def _step_stock(self, key: Key, process: StockProcess, when: datetime) -> None:
        if self._processes.get(key) is not process:
            return  # stopped or replaced
        moved = self._stock.get(key, 0) + process.rng.randint(-process.step, process.step)
        self._stock[key] = min(process.high, max(process.low, moved))
        process.next_at = when + process.every
        self._at(process.next_at, functools.partial(self._step_stock, key, process))
        self._serve(key, when)

    # ------------------------------------------------------------------ stock

    def _provision(self, zone: str, shape: str, units: int) -> str:
        """Decide one immediate provisioning (no queue): ``ok`` (the units are taken), or a
        failure kind. A pending injection is consumed first; otherwise it is a stockout when
        too few units are free."""
        pending = self._injections.get((zone, shape))
        if pending:
            outcome = pending.popleft()
        elif self._stock.get((zone, shape), 0) < units:
            outcome = "stockout"
        else:
            self._stock[(zone, shape)] = self._stock.get((zone, shape), 0) - units
            outcome = "ok"
        self._counters[{"ok": "provisioned"}.get(outcome, outcome)] += 1
        return outcome

    def _give_back(self, zone: str, shape: str, units: int) -> None:
        """Return units a resource held; the queue of that key looks again."""
        self._stock[(zone, shape)] = self._stock.get((zone, shape), 0) + units
        self._look_again((zone, shape))

    # ------------------------------------------------------------------ Google's queue

    def _enqueue(
        self,
        record: Record,
        kind: str,
        shape: str,
        units: int,
        eligible_at: datetime,
        run_duration: timedelta | None,
        *,
        on_served: Callable[[datetime], None],
        on_attempt: Callable[[str, str], None],
        on_fatal: Callable[[datetime], None],
    ) -> None:
        """Put a request in the queue of (its zone, ``shape``); it is first tried at
        ``eligible_at`` (never before creation + the provisioning latency)."""
        key = (record.zone, shape)
        entry = Waiting(
            record, kind, key, units, eligible_at, run_duration, next(self._sequence),
            on_served, on_attempt, on_fatal,
        )  # fmt: skip
        self._queues.setdefault(key, []).append(entry)
        self._at(eligible_at, functools.partial(self._serve, key))

    def _dequeue(self, record: Record) -> None:
        """Take a request out of the queue (cancelled, deleted, past its deadline, hung)."""
        for queue in self._queues.values():
            queue[:] = [entry for entry in queue if entry.record is not record]

    def _queued(self, record: Record) -> bool:
        return any(entry.record is record for queue in self._queues.values() for entry in queue)

    def _look_again(self, key: Key) -> None:
        """Schedule a serving pass of ``key`` now (once per moment): run at the next settle,
        so a caller never sees its own mutation interleaved with serving."""
        now = self.clock.now()
        if (key, now) not in self._passes and self._queues.get(key):
            self._passes.add((key, now))
            self._at(now, functools.partial(self._serve, key))

    def _serve(self, key: Key, when: datetime) -> None:
        """One serving pass over the queue of ``key`` at ``when`` (see the module docstring)."""
        self._passes.discard((key, when))
        queue = self._queues.get(key, [])
        while True:
            ready = sorted((e for e in queue if e.eligible_at <= when), key=lambda e: e.serving_key)
            if not ready:
                return
            head = ready[0]
            pending = self._injections.get(key)
            kind = pending.popleft() if pending else None
            if kind == "hang":
                self._counters["hang"] += 1
                queue.remove(head)  # it stays waiting but is never served
                continue
            if kind == "error":
                self._counters["error"] += 1
                queue.remove(head)
                head.on_fatal(when)
                continue
            if kind is None and self._stock.get(key, 0) >= head.units:
                self._counters["provisioned"] += 1
                self._stock[key] = self._stock.get(key, 0) - head.units
                queue.remove(head)
                head.on_served(when)
                continue
            self._counters["stockout"] += 1
            message = (
                f"The zone 'projects/{head.record.project}/zones/{key[0]}' does not have enough "
                "resources available to fulfill the request.  Try a different zone, or try "
                "again later."
            )
            for entry in ready:
                entry.on_attempt(STOCKOUT, message)
            if kind == "stockout":
                self._at(when + RETRY_AFTER, functools.partial(self._serve, key))
            return

    # ------------------------------------------------------------------ shared records

    def _project(self, project: str) -> Project:
        return self._projects.setdefault(project, Project())

    def _new_id(self) -> int:
        return next(self._ids)

    def _add_instance(
        self,
        project: str,
        zone: str,
        name: str,
        shape: str,
        when: datetime,
        body: JSON,
        *,
        mig: str | None = None,
    ) -> Instance:
        instance = Instance(project, zone, name, self._new_id(), when, body, shape=shape, mig=mig)
        instance.internal_ip, instance.external_ip = self._new_addresses(body)
        self._project(project).instances[(zone, name)] = instance
        self._created["instances"][name] += 1
        return instance

    def _new_addresses(self, body: JSON) -> tuple[str, str | None]:
        """A new VM's addresses: the internal one its first interface asks for
        (``networkIP``), else the next free one of the cloud's internal range; an external one
        when that interface has an access config (its ``natIP``, else an ephemeral one).
        compute/docs/reference/rest/v1/instances, ``NetworkInterface.networkIP``: "If not
        specified by the user, an unused internal IP is assigned by the system"; it is the
        VM's until the VM is deleted. Addresses start at .2: a subnet's first two are
        Google's own (vpc/docs/subnets, reserved addresses)."""
        nics = body.get("networkInterfaces")
        nic = nics[0] if isinstance(nics, list) and nics and isinstance(nics[0], dict) else {}
        number = next(self._addresses)
        host, network = number % 252 + 2, number // 252
        subnets = self._internal_range.num_addresses // 256
        address = int(self._internal_range.network_address) + network % subnets * 256 + host
        internal = nic.get("networkIP") or ipaddress.IPv4Address(address)
        configs = nic.get("accessConfigs")
        if not isinstance(configs, list) or not configs or not isinstance(configs[0], dict):
            return str(internal), None
        external = configs[0].get("natIP") or f"34.{network // 256 % 256}.{network % 256}.{host}"
        return str(internal), str(external)

    def _remove_instance(self, instance: Instance) -> None:
        """Delete a VM: out of its project (and Google's queue), its unit back to stock."""
        if not instance.alive:
            return
        instance.alive = False
        self._dequeue(instance)
        del self._project(instance.project).instances[(instance.zone, instance.name)]
        if instance.holds_stock:
            instance.holds_stock = False
            self._give_back(instance.zone, instance.shape, 1)

    def _remove_queued_resource(self, record: QueuedResource) -> None:
        """Delete a queued resource: out of its project (and Google's queue), its nodes gone,
        chips it took from stock back (chips of a reservation it consumed go back to that
        reservation)."""
        if not record.alive:
            return
        record.alive = False
        record.nodes = []
        self._dequeue(record)
        del self._project(record.project).queued_resources[(record.zone, record.name)]
        if record.holds_stock:
            record.holds_stock = False
            self._give_back(record.zone, record.shape, record.chips)

    # ------------------------------------------------------------------ reservations consumed

    def _live_block(self, project: str, zone: str, reservation: str) -> FutureReservation | None:
        """The calendar block whose auto-created reservation ``reservation`` is live in
        ``zone`` of ``project`` (None: no such reservation now)."""
        for record in self._project(project).future_reservations.values():
            same = (record.zone, record.reservation_name) == (zone, reservation)
            if same and record.reservation_live:
                return record
        return None

    def _vm_consumers(self, record: FutureReservation) -> list[Instance]:
        instances = self._project(record.project).instances.values()
        return [i for i in instances if i.block is record]

    def _queued_on(self, record: FutureReservation) -> list[QueuedResource]:
        """Queued resources, of any project, that were placed on the block's reservation."""
        return [
            queued
            for state in self._projects.values()
            for queued in state.queued_resources.values()
            if queued.block is record
        ]

    def _tpu_consumers(self, record: FutureReservation) -> list[QueuedResource]:
        """Queued resources consuming the block's chips: provisioning or active on it."""
        return [q for q in self._queued_on(record) if q.state in ("PROVISIONING", "ACTIVE")]

    def _in_use(self, record: FutureReservation) -> int:
        """Units of the block's reservation in use: its VMs, or its queued resources' chips."""
        if record.tpu:
            return sum(q.chips for q in self._tpu_consumers(record))
        return len(self._vm_consumers(record))

    def _expire(self, instance: Instance, when: datetime) -> None:
        """The end of a VM's run time (flex-start ``instanceTerminationAction=DELETE``)."""
        if instance.alive:
            self._counters["auto_deleted"] += 1
            self._remove_instance(instance)

    # ------------------------------------------------------------------ operations

    def _operation(
        self,
        record: Record,
        operation_type: str,
        target: str,
        *,
        scope: str | None = None,
        error: tuple[int, str, str] | None = None,
        running: bool = False,
        on_done: Callable[[datetime], None] | None = None,
        holds: bool = True,
    ) -> JSON:
        """Record a Compute Operation on ``target`` (a selfLink) and return a copy of it.
        ``running``: it stays RUNNING until the caller finishes it (a flex-start VM's insert,
        ``_stored``). Otherwise it is DONE after the operation latency (at once when that is
        zero), PENDING then RUNNING until then, with ``record`` busy (unless not ``holds``:
        an operation many of which may run on it at once); ``on_done`` runs when it
        is DONE (what a delete or cancel does), and ``error`` ((HTTP status, error code,
        message): the mutation failed) is its outcome."""
        now = self.clock.now()
        operation_id = self._new_id()
        name = f"operation-{int(now.timestamp() * 1000)}-{operation_id:x}"
        where = scope if scope is not None else record.zone
        base = scope_url(record.project, where)
        operation: JSON = {
            "kind": "compute#operation",
            "id": str(operation_id),
            "name": name,
            "operationType": operation_type,
            "targetLink": target,
            "targetId": str(record.id),
            "status": "RUNNING",
            "progress": 0,
            "user": "opendws-emulator",
            "insertTime": stamp(now),
            "startTime": stamp(now),
            "selfLink": f"{base}/operations/{name}",
        }
        if where != "global":
            operation["zone"] = base
        self._project(record.project).operations[(where, name)] = operation
        if running:
            return dict(operation)
        done = functools.partial(self._complete, operation, record, error, on_done)
        if self._operation_latency <= timedelta(0):
            done(now)
            return dict(operation)
        running_at = now + self._operation_latency * PENDING_SHARE
        done_at = now + self._operation_latency
        operation["status"] = "PENDING"
        del operation["startTime"]
        self._timing[name] = (running_at, done_at)
        if holds:
            record.busy = name
        self._at(running_at, functools.partial(_start_operation, operation))
        self._at(done_at, done)
        return dict(operation)

    def _complete(
        self,
        operation: JSON,
        record: Record,
        error: tuple[int, str, str] | None,
        on_done: Callable[[datetime], None] | None,
        when: datetime,
    ) -> None:
        """An operation the latency timed reaches DONE: its effect lands, the record is free."""
        self._timing.pop(operation["name"], None)
        if record.busy == operation["name"]:
            record.busy = None
        if on_done is not None:
            on_done(when)
        if error is not None:
            self._fail_operation(operation, when, *error)
        else:
            self._finish_operation(operation, when)

    def _stored(self, project: str, operation: JSON) -> JSON:
        """The recorded operation a copy returned by ``_operation`` stands for."""
        where = last(operation.get("zone", "")) or "global"
        return self._project(project).operations[(where, operation["name"])]

    def _ready(self, record: Record, resource: str) -> None:
        """Refuse a mutation of (or with) ``record`` while its own operation runs."""
        if record.busy is not None:
            raise CloudError.resource_not_ready(resource)

    def _finish_operation(self, operation: JSON, when: datetime) -> None:
        """A running operation ends (in place: a client polling it sees the change)."""
        operation.setdefault("startTime", stamp(when))
        operation.update(status="DONE", progress=100, endTime=stamp(when))

    def _fail_operation(
        self, operation: JSON, when: datetime, status: int, code: str, message: str
    ) -> None:
        self._finish_operation(operation, when)
        operation["error"] = {"errors": [{"code": code, "message": message}]}
        operation["httpErrorStatusCode"] = status
        operation["httpErrorMessage"] = _HTTP_MESSAGES.get(status, "ERROR")

    @settled
    def get_operation(self, project: str, scope: str, name: str) -> JSON:
        """A Compute operation; ``scope`` is a zone name or ``global``. A RUNNING one's
        ``progress`` is the share of its latency gone by."""
        operation = self._project(project).operations.get((scope, name))
        if operation is None:
            raise CloudError.not_found(f"projects/{project}/{scope_path(scope)}/operations/{name}")
        timing = self._timing.get(name)
        if timing is not None and operation["status"] == "RUNNING":
            running_at, done_at = timing
            share = (self.clock.now() - running_at) / (done_at - running_at)
            operation["progress"] = max(0, min(99, int(share * 100)))
        return dict(operation)


def _start_operation(operation: JSON, when: datetime) -> None:
    """A PENDING operation starts RUNNING."""
    if operation["status"] == "PENDING":
        operation.update(status="RUNNING", startTime=stamp(when))


def compute_failure(outcome: str, project: str, zone: str) -> tuple[str, str]:
    """The Compute error (code, message) of a failed immediate provisioning outcome."""
    if outcome == "stockout":
        return (
            STOCKOUT,
            f"The zone 'projects/{project}/zones/{zone}' does not have enough resources "
            "available to fulfill the request.  Try a different zone, or try again later.",
        )
    return RATE_EXCEEDED, "Operation rate exceeded for resource; try again later."


def by_name(record: Record) -> str:
    return record.name


def _internal_range(text: str) -> ipaddress.IPv4Network:
    """The VMs' internal address range: an IPv4 network of at least one /24."""
    try:
        network = ipaddress.IPv4Network(text)
    except ValueError as error:
        raise ValueError(f"internal_range {text!r}: not an IPv4 network ({error})") from None
    if network.prefixlen > 24:
        raise ValueError(f"internal_range {text!r}: a /24 or larger")
    return network
