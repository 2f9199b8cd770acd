"""The domain model: requests, pools, tenants, grants and the snapshot the admission core reads.

Everything here is a frozen value. Constructors check the invariants a value must hold and raise
:class:`InvalidModel` naming the field and the rule, so a value that exists is a valid one.
Timestamps are timezone-aware UTC and end in ``_at``; durations are ``timedelta``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING

from opendws.domain.calendar import TPU_MAX_LEAD, CancellationRule, count_problem, lead_of

if TYPE_CHECKING:
    from opendws.domain.run import RunSpec  # which imports InvalidModel from here

_HOUR = timedelta(hours=1)  # unit_hours divides by it (one object, not one per call)
# Limits of the two modes, as in Google's Dynamic Workload Scheduler.
FLEX_MIN_RUN = timedelta(minutes=10)
FLEX_MAX_RUN = timedelta(days=7)
FLEX_MAX_WAIT = timedelta(days=7)
CALENDAR_MIN_RUN = timedelta(days=1)
CALENDAR_MAX_RUN = timedelta(days=90)
CALENDAR_MAX_LEAD = TPU_MAX_LEAD  # the farthest any block starts (per kind: domain.calendar)


def _days(span: timedelta) -> str:
    days = span / timedelta(days=1)
    return f"{days:g} day" + ("" if days == 1 else "s")


_ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")
_REGION = re.compile(r"[a-z]+-[a-z]+[0-9]+")
_TOPOLOGY = re.compile(r"[1-9][0-9]*(x[1-9][0-9]*){1,2}")


class InvalidModel(ValueError):
    """A domain value was built with a field that breaks one of its rules."""

    def __init__(self, field_name: str, rule: str) -> None:
        super().__init__(f"{field_name}: {rule}")
        self.field = field_name
        self.rule = rule


class Mode(StrEnum):
    """How a request wants its capacity."""

    FLEX_START = "flex_start"  # as soon as all of it can be had, waiting up to max_wait
    CALENDAR = "calendar"  # a fixed block from start_at, confirmed or refused at once


class Provider(StrEnum):
    """Which kind of cloud resource backs a pool."""

    MIG = "mig"  # Compute Engine managed instance group, flex-start resize requests
    TPU = "tpu"  # Cloud TPU queued resources


class QueueingStrategy(StrEnum):
    """How a tenant's own requests are ordered among themselves."""

    BEST_EFFORT = "best_effort"  # policy order; a later request may start first where it fits
    STRICT_FIFO = "strict_fifo"  # the tenant's requests start in submission order


def require_utc(field_name: str, value: datetime) -> None:
    """Refuse naive timestamps: every instant in opendws is timezone-aware."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidModel(field_name, "must be a timezone-aware timestamp (UTC)")


def region_of(zone: str) -> str:
    """``us-central1-a`` → ``us-central1``."""
    return zone.rsplit("-", 1)[0]


def is_zone(location: str) -> bool:
    """True for a zone name such as ``europe-west4-b``."""
    return _ZONE.fullmatch(location) is not None


def is_region(location: str) -> bool:
    """True for a region name such as ``europe-west4``."""
    return _REGION.fullmatch(location) is not None


def topology_chips(topology: str) -> int:
    """Chips in a TPU slice topology: ``4x4`` → 16, ``2x2x4`` → 16."""
    if _TOPOLOGY.fullmatch(topology) is None:
        raise InvalidModel("gang.topology", f"{topology!r} is not a topology such as 2x4 or 2x2x4")
    return math.prod(int(part) for part in topology.split("x"))


@dataclass(frozen=True, slots=True, kw_only=True)
class GangShape:
    """What one request needs all at once: ``vm_count`` VMs of one machine type, or
    ``vm_count`` TPU slices of one topology. A gang is always placed in a single pool."""

    vm_count: int  # VMs (GPU gangs) or slices (TPU gangs); at least 1
    accelerator: str  # e.g. nvidia-h100-80gb or tpu-v5e; quotas are counted in these
    machine_type: str | None = None  # GPU gangs: e.g. a3-highgpu-8g
    accelerators_per_vm: int | None = None  # GPU gangs: accelerators attached to each VM
    topology: str | None = None  # TPU gangs: slice topology, e.g. 4x4
    # Derived once: pool units the gang occupies (VMs in a MIG pool, chips in a TPU pool) and
    # accelerators it counts against its tenant's quota.
    units: int = field(init=False, compare=False, repr=False)
    accelerator_units: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.vm_count < 1:
            raise InvalidModel("gang.vm_count", "must be at least 1")
        if not self.accelerator:
            raise InvalidModel("gang.accelerator", "must name an accelerator type")
        if (self.machine_type is None) == (self.topology is None):
            raise InvalidModel(
                "gang", "give either machine_type (GPU VMs) or topology (a TPU slice), not both"
            )
        if self.machine_type is not None:
            if self.accelerators_per_vm is None or self.accelerators_per_vm < 1:
                raise InvalidModel(
                    "gang.accelerators_per_vm", "must be at least 1 for a machine-type gang"
                )
        elif self.accelerators_per_vm is not None:
            raise InvalidModel(
                "gang.accelerators_per_vm", "applies to machine-type gangs, not TPU slices"
            )
        if self.topology is not None:
            units = self.vm_count * topology_chips(self.topology)
            accelerator_units = units
        else:
            units = self.vm_count
            accelerator_units = self.vm_count * (self.accelerators_per_vm or 0)
        object.__setattr__(self, "units", units)
        object.__setattr__(self, "accelerator_units", accelerator_units)

    @property
    def provider(self) -> Provider:
        """MIG for machine-type gangs, TPU for topology gangs."""
        return Provider.MIG if self.machine_type is not None else Provider.TPU

    @property
    def shape(self) -> str:
        """The pool shape this gang needs: the machine type, or the TPU accelerator type."""
        return self.machine_type if self.machine_type is not None else self.accelerator


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityRequest:
    """One tenant's ask for a gang of capacity, in flex_start or calendar mode.

    Invariants: flex requests run 10 min .. 7 days and wait at most 7 days (``max_wait``) and
    have no ``start_at``; calendar requests run 1 .. 90 days from ``start_at``, which lies within
    Google's lead times after submission (``domain.calendar``: at most 60 days for GPU VMs, 1 to
    120 days for TPUs) and reserve as many units as Google allows, and have no ``max_wait``.
    ``locations`` names zones, or regions meaning any of their zones, in order of preference.
    ``run``, when given, is the job to run on the gang (:mod:`opendws.domain.run`); the
    planner never reads it.
    """

    request_id: str  # client-chosen idempotency key
    tenant: str  # the team that asks, and whose quota it counts against
    mode: Mode
    gang: GangShape
    locations: tuple[str, ...]  # zones or regions, most preferred first
    run_duration: timedelta  # how long the capacity is held once it starts
    submitted_at: datetime
    max_wait: timedelta | None = None  # flex only: give up if not admitted by then
    start_at: datetime | None = None  # calendar only: the block's start
    priority: int = 0  # higher is taken first
    labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value) pairs, carried through
    run: RunSpec | None = None  # the job on the gang; None: capacity only, released by the user
    # A job into the running calendar block of this id (a request of the same tenant): it runs
    # on the block's VMs and holds no capacity of its own; its mode, gang, locations, start and
    # run duration are the block's. None: a request for capacity of its own.
    block: str | None = None

    def __post_init__(self) -> None:
        if not self.request_id:
            raise InvalidModel("request_id", "must not be empty")
        if not self.tenant:
            raise InvalidModel("tenant", "must name a tenant")
        if not self.locations:
            raise InvalidModel("locations", "must list at least one zone or region")
        for location in self.locations:
            if not (is_zone(location) or is_region(location)):
                raise InvalidModel(
                    "locations", f"{location!r} is neither a zone (us-central1-a) nor a region"
                )
        require_utc("submitted_at", self.submitted_at)
        if self.block is not None:
            self._check_block_job()
        elif self.mode is Mode.FLEX_START:
            self._check_flex()
        else:
            self._check_calendar()

    def _check_flex(self) -> None:
        if not FLEX_MIN_RUN <= self.run_duration <= FLEX_MAX_RUN:
            raise InvalidModel("run_duration", "flex_start runs between 10 minutes and 7 days")
        if self.max_wait is None or not timedelta(0) < self.max_wait <= FLEX_MAX_WAIT:
            raise InvalidModel("max_wait", "flex_start waits more than 0 and at most 7 days")
        if self.start_at is not None:
            raise InvalidModel("start_at", "only calendar requests have a start time")

    def _check_block_job(self) -> None:
        """A job into a calendar block: the block's window (Google's lead times were the
        block's to meet when it was booked), and a run to run on its VMs."""
        if not self.block:
            raise InvalidModel("block", "must name a calendar block's request id")
        if self.mode is not Mode.CALENDAR or self.start_at is None or self.max_wait is not None:
            raise InvalidModel("block", "a job into a block takes the block's calendar window")
        require_utc("start_at", self.start_at)
        if self.run is None:
            raise InvalidModel("run", "a request into a block is a job: give its run")

    def _check_calendar(self) -> None:
        if not CALENDAR_MIN_RUN <= self.run_duration <= CALENDAR_MAX_RUN:
            raise InvalidModel("run_duration", "calendar blocks last between 1 and 90 days")
        if self.max_wait is not None:
            raise InvalidModel("max_wait", "calendar requests are confirmed at once; no max_wait")
        if self.start_at is None:
            raise InvalidModel("start_at", "calendar requests need a start time")
        require_utc("start_at", self.start_at)
        tpu = self.gang.provider is Provider.TPU
        kind = "TPU" if tpu else "GPU"
        lead = lead_of(tpu)
        if self.start_at > self.submitted_at + lead.latest:
            raise InvalidModel(
                "start_at",
                f"a {kind} calendar block starts at most {lead.latest.days} days ahead "
                "(Google Cloud's calendar mode)",
            )
        if lead.earliest and self.start_at < self.submitted_at + lead.earliest:
            raise InvalidModel(
                "start_at",
                f"a {kind} calendar block starts at least {_days(lead.earliest)} ahead "
                "(Google Cloud's calendar mode)",
            )
        problem = count_problem(tpu, self.gang.units)
        if problem is not None:
            raise InvalidModel("gang", problem)

    @property
    def units(self) -> int:
        """Pool units the gang occupies."""
        return self.gang.units

    @property
    def accelerator_units(self) -> int:
        """Accelerators counted against the tenant's quota."""
        return self.gang.accelerator_units

    @property
    def deadline(self) -> datetime | None:
        """Flex: the latest admission time (``submitted_at + max_wait``); calendar: None."""
        return None if self.max_wait is None else self.submitted_at + self.max_wait

    @property
    def unit_hours(self) -> float:
        """Requested accelerator-hours: the size that shortest-first ordering uses."""
        return self.gang.accelerator_units * self.run_duration / _HOUR

    def allows(self, zone: str) -> bool:
        """True if the request may run in ``zone``."""
        return zone in self.locations or region_of(zone) in self.locations

    def preference(self, zone: str) -> int:
        """Index of the first location that allows ``zone`` (lower is preferred)."""
        for index, location in enumerate(self.locations):
            if location in (zone, region_of(zone)):
                return index
        return len(self.locations)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pool:
    """Capacity of one shape in one zone.

    ``capacity`` is in units: VMs for a MIG pool, chips for a TPU pool. ``short_until`` marks a
    learned stockout: the cloud refused this pool recently, so nothing new starts in it before
    that time (grants already running are not affected). ``serve_wait`` is how long Google is
    expected to take to serve a flex order admitted here (learned: the pool's recent 90th
    percentile of admission → ACTIVE, :func:`opendws.domain.readiness.expected_wait`): a flex
    run placed here holds the pool that long before its run duration, as its hold does once
    admitted (:func:`opendws.ports.records.hold_end`).
    """

    pool_id: str  # stable name, e.g. us-central1-a/a3-highgpu-8g
    zone: str
    shape: str  # machine type (MIG) or TPU accelerator type
    accelerator: str  # the accelerator type its units carry
    provider: Provider
    capacity: int  # units
    short_until: datetime | None = None
    serve_wait: timedelta = timedelta(0)

    def __post_init__(self) -> None:
        if not self.pool_id:
            raise InvalidModel("pool_id", "must not be empty")
        if self.serve_wait < timedelta(0):
            raise InvalidModel("serve_wait", f"must not be negative, not {self.serve_wait}")
        if not is_zone(self.zone):
            raise InvalidModel("zone", f"{self.zone!r} is not a zone such as us-central1-a")
        if self.capacity < 0:
            raise InvalidModel("capacity", "must not be negative")
        if self.short_until is not None:
            require_utc("short_until", self.short_until)

    def serves(self, request: CapacityRequest) -> bool:
        """True if ``request``'s gang could be placed here (shape, provider, location)."""
        gang = request.gang
        return (
            self.shape == gang.shape
            and self.provider is gang.provider
            and self.accelerator == gang.accelerator
            and request.allows(self.zone)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Quota:
    """A tenant's share of one accelerator type.

    ``nominal`` is guaranteed to the tenant's cohort; the tenant may use up to
    ``nominal + borrowing_limit`` when the cohort has idle quota (``None``: no limit beyond the
    cohort's). Without a cohort a tenant uses at most ``nominal``.
    """

    accelerator: str
    nominal: int
    borrowing_limit: int | None = None

    def __post_init__(self) -> None:
        if self.nominal < 0:
            raise InvalidModel("quota.nominal", "must not be negative")
        if self.borrowing_limit is not None and self.borrowing_limit < 0:
            raise InvalidModel("quota.borrowing_limit", "must not be negative")


@dataclass(frozen=True, slots=True, kw_only=True)
class Tenant:
    """A team: its quotas per accelerator, its cohort and how its own requests queue.

    An accelerator the tenant has no quota for counts as nominal 0 with no borrowing limit: the
    tenant may still borrow it from its cohort.
    """

    name: str
    quotas: tuple[Quota, ...] = ()
    cohort: str | None = None
    queueing: QueueingStrategy = QueueingStrategy.BEST_EFFORT

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidModel("tenant.name", "must not be empty")
        accelerators = [quota.accelerator for quota in self.quotas]
        if len(set(accelerators)) != len(accelerators):
            raise InvalidModel("tenant.quotas", f"{self.name}: one quota per accelerator")

    def quota(self, accelerator: str) -> Quota:
        """The tenant's quota for ``accelerator`` (nominal 0 if none is configured)."""
        for quota in self.quotas:
            if quota.accelerator == accelerator:
                return quota
        return Quota(accelerator=accelerator, nominal=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """A committed hold on a pool over ``[start_at, end_at)``: an admitted flex request
    (provisioning or active) or a confirmed calendar block."""

    request_id: str
    tenant: str
    pool_id: str
    accelerator: str
    units: int  # pool units held
    accelerator_units: int  # counted against the tenant's quota
    start_at: datetime
    end_at: datetime

    def __post_init__(self) -> None:
        require_utc("start_at", self.start_at)
        require_utc("end_at", self.end_at)
        if self.end_at <= self.start_at:
            raise InvalidModel("end_at", "a grant ends after it starts")
        if self.units < 0 or self.accelerator_units < 0:
            raise InvalidModel("units", "must not be negative")

    @classmethod
    def of(
        cls,
        request: CapacityRequest,
        pool_id: str,
        start_at: datetime,
        end_at: datetime | None = None,
    ) -> Grant:
        """The grant that placing ``request`` in ``pool_id`` from ``start_at`` commits, until
        ``end_at`` (default: its run duration later)."""
        return cls(
            request_id=request.request_id,
            tenant=request.tenant,
            pool_id=pool_id,
            accelerator=request.gang.accelerator,
            units=request.units,
            accelerator_units=request.accelerator_units,
            start_at=start_at,
            end_at=start_at + request.run_duration if end_at is None else end_at,
        )


MAX_RACE_WIDTH = 8  # more lanes than this only queue the same gang in more of Google's zones
DEFAULT_COMMIT_WITHIN = timedelta(hours=2)  # see PolicySettings.commit_within


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySettings:
    """Knobs of the admission order."""

    # Shortest-first ages: every half-life spent waiting halves a request's size key, so a big
    # request overtakes ever smaller newcomers and nothing starves. A day, measured on the Philly
    # trace (bench/replay.py --aging-half-life, contended, no commitments): against 6 h, mean
    # queueing delay 3,072 s instead of 4,486 s and p99 58,566 s instead of 131,301 s (FIFO's:
    # 113,535 s), for 10 jobs timed out instead of 9 (FIFO 14, SJF 34). Longer half-lives wait
    # less on average and time out more — 3 days: 2,754 s, 15; 7 days: 2,504 s, 22 — and a time
    # out breaks the max_wait a user was promised, so a day stays the default.
    aging_half_life: timedelta = timedelta(hours=24)
    # Multi-zone racing: a flex request allowed in several pools is offered to up to this many
    # of them at once; the first that Google serves wins and the others are cancelled. Each
    # lane holds its own grant (pool capacity and tenant quota) while it races, so even two
    # lanes served together never put a pool or a tenant over its limit. 1 turns racing off.
    race_width: int = 2
    # Race at admission already (True), or only once Google has said the first pool is short
    # (False: a request's orders all wait with a stockout; see Snapshot.racing). Racing at
    # once wins a little time when stock is short and pays for a second gang whenever it is
    # not — both served together, one released at once (bench/obtain.py measures both).
    race_eagerly: bool = False
    # When Google lets a submitted calendar block be cancelled (domain.calendar): the newest
    # Compute page's windows by default; NEVER as older Compute pages and the TPU page say.
    calendar_cancellation: CancellationRule = CancellationRule.WINDOWS
    # Held slots as commitments: a pending flex request whose announced ETA lies less than
    # this far ahead keeps it (see Snapshot.commitments) — a later pass may move it earlier,
    # never later, unless it no longer fits — and newcomers backfill only into what no
    # commitment needs; beyond it an ETA is an estimate. None: every pass plans every pending
    # request again in policy order, so a newcomer placed first can push any held slot later.
    # Two hours, measured on the Philly trace (bench/replay.py --compare-commitments 0,6, 40%
    # capacity): all 18,946 jobs told an ETA less than two hours ahead started by it, and
    # 95.2% of all first ETAs were kept (89.3% without commitments), for a mean queueing delay
    # 5.6% longer than with none (3,246 s against 3,073 s); 6 h keep 97.1% for 12.1% more.
    commit_within: timedelta | None = DEFAULT_COMMIT_WITHIN

    def __post_init__(self) -> None:
        if self.commit_within is not None and self.commit_within <= timedelta(0):
            raise InvalidModel("commit_within", "must be positive")
        if self.aging_half_life <= timedelta(0):
            raise InvalidModel("aging_half_life", "must be positive")
        if isinstance(self.race_width, bool) or not 1 <= self.race_width <= MAX_RACE_WIDTH:
            raise InvalidModel("race_width", f"must be a whole number from 1 to {MAX_RACE_WIDTH}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Racer:
    """An admitted flex request waiting at Google in ``pools`` (one order each), every one of
    them short: a candidate for more lanes (see :attr:`PolicySettings.race_width`)."""

    request: CapacityRequest
    pools: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Commitment:
    """The start an earlier pass announced to a pending flex request, in its pool (used when
    :attr:`PolicySettings.commit_within` is set)."""

    request_id: str
    pool_id: str
    start_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """An immutable picture of everything admission needs, taken at one instant.

    ``pending`` holds requests awaiting a decision (flex requests still waiting and calendar
    requests not yet confirmed); ``grants`` holds what is already committed. Order is irrelevant:
    the admission core sorts everything by explicit keys.
    """

    pools: tuple[Pool, ...]
    tenants: tuple[Tenant, ...]
    grants: tuple[Grant, ...] = ()
    pending: tuple[CapacityRequest, ...] = ()
    policy: PolicySettings = field(default_factory=PolicySettings)
    # Admitted flex requests whose every order waits in a pool Google reported short: they
    # may be offered to more of their pools (their current orders are among ``grants``).
    racing: tuple[Racer, ...] = ()
    # ETAs announced to pending flex requests (see PolicySettings.commit_within).
    commitments: tuple[Commitment, ...] = ()

    def __post_init__(self) -> None:
        _require_unique("pools", [pool.pool_id for pool in self.pools])
        _require_unique("tenants", [tenant.name for tenant in self.tenants])
        _require_unique("pending", [request.request_id for request in self.pending])


def _require_unique(field_name: str, keys: list[str]) -> None:
    if len(set(keys)) == len(keys):
        return  # the common case, in one pass of C (a snapshot is built on every pass)
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            raise InvalidModel(field_name, f"{key!r} appears twice")
        seen.add(key)
