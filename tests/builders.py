"""Small builders for domain values, shared by every test suite.

Each builder makes a valid value from defaults and takes keyword overrides for what a test is
about, so a test names only what matters to it::

    flex("train", tenant="vision", vm_count=2, hours=6)
    flex("slice", topology="2x2x4")                      # a TPU gang
    calendar("block", days=7, start_at=NOW + 10 * DAY)
    pool(capacity=16), pool(shape=V5E, zone="europe-west4-a", capacity=256)
    tenant("vision", quota(H100, 64), cohort="research", strict_fifo=True)
    grant_of(flex("r1"), start_at=NOW)

Builders pass values through unchecked (``max_wait=None`` on a flex request, a naive
``start_at``), so validation tests can build invalid values with them too.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from opendws.catalog import MACHINE_TYPES
from opendws.domain.model import (
    CapacityRequest,
    GangShape,
    Grant,
    Mode,
    PolicySettings,
    Pool,
    Provider,
    QueueingStrategy,
    Quota,
    Snapshot,
    Tenant,
)

# The fixed "now" of every test: timezone-aware UTC, never the wall clock.
NOW = datetime(2026, 12, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)

ZONE = "us-central1-a"
REGION = "us-central1"

# GPU machine types and the accelerators each VM carries.
A3 = "a3-highgpu-8g"
A2 = "a2-ultragpu-8g"
G2 = "g2-standard-48"
H100 = "nvidia-h100-80gb"
A100 = "nvidia-a100-80gb"
L4 = "nvidia-l4"
# What each machine type carries, from the project's catalog (unknown ones: 8 × H100).
MACHINES: dict[str, tuple[str, int]] = {
    name: (machine.accelerator, machine.accelerators_per_vm)
    for name, machine in MACHINE_TYPES.items()
}

# TPU accelerator types: a TPU pool's shape is its accelerator type.
V5E = "tpu-v5e"
V5P = "tpu-v5p"


def is_tpu(shape_or_accelerator: str) -> bool:
    """True for a TPU accelerator type such as ``tpu-v5e``."""
    return shape_or_accelerator.startswith("tpu-")


def gpu_gang(
    vm_count: int = 1,
    *,
    machine_type: str = A3,
    accelerator: str | None = None,
    accelerators_per_vm: int | None = None,
) -> GangShape:
    """``vm_count`` VMs of ``machine_type``; accelerator and count per VM default to the
    machine type's own (a3-highgpu-8g: 8 × H100)."""
    known_accelerator, known_per_vm = MACHINES.get(machine_type, (H100, 8))
    return GangShape(
        vm_count=vm_count,
        machine_type=machine_type,
        accelerator=known_accelerator if accelerator is None else accelerator,
        accelerators_per_vm=known_per_vm if accelerators_per_vm is None else accelerators_per_vm,
    )


def tpu_gang(slices: int = 1, *, topology: str = "2x2", accelerator: str = V5E) -> GangShape:
    """``slices`` TPU slices of ``topology`` (``2x2``: 4 chips each)."""
    return GangShape(vm_count=slices, topology=topology, accelerator=accelerator)


def gang(
    vm_count: int = 1,
    *,
    machine_type: str | None = None,
    topology: str | None = None,
    accelerator: str | None = None,
    accelerators_per_vm: int | None = None,
) -> GangShape:
    """A TPU gang when ``topology`` is given, else a GPU gang (default a3-highgpu-8g)."""
    if topology is not None:
        return tpu_gang(
            vm_count, topology=topology, accelerator=V5E if accelerator is None else accelerator
        )
    return gpu_gang(
        vm_count,
        machine_type=A3 if machine_type is None else machine_type,
        accelerator=accelerator,
        accelerators_per_vm=accelerators_per_vm,
    )


def flex(
    request_id: str = "r1",
    *,
    tenant: str = "t",
    vm_count: int = 1,
    hours: float = 1,
    run: timedelta | None = None,
    max_wait: timedelta | None = DAY,
    locations: Iterable[str] = (ZONE,),
    submitted_at: datetime = NOW,
    priority: int = 0,
    machine_type: str | None = None,
    topology: str | None = None,
    accelerator: str | None = None,
    accelerators_per_vm: int | None = None,
    shape: GangShape | None = None,
    start_at: datetime | None = None,
    labels: tuple[tuple[str, str], ...] = (),
) -> CapacityRequest:
    """A flex_start request: ``vm_count`` VMs (or slices, with ``topology``) for ``hours``
    (``run`` overrides), waiting at most ``max_wait``. ``shape`` overrides the gang fields."""
    return CapacityRequest(
        request_id=request_id,
        tenant=tenant,
        mode=Mode.FLEX_START,
        gang=shape
        if shape is not None
        else gang(
            vm_count,
            machine_type=machine_type,
            topology=topology,
            accelerator=accelerator,
            accelerators_per_vm=accelerators_per_vm,
        ),
        locations=tuple(locations),
        run_duration=timedelta(hours=hours) if run is None else run,
        submitted_at=submitted_at,
        max_wait=max_wait,
        start_at=start_at,
        priority=priority,
        labels=labels,
    )


def calendar(
    request_id: str = "c1",
    *,
    tenant: str = "t",
    vm_count: int = 1,
    days: float = 1,
    run: timedelta | None = None,
    start_at: datetime | None = NOW + DAY,
    locations: Iterable[str] = (ZONE,),
    submitted_at: datetime = NOW,
    priority: int = 0,
    machine_type: str | None = None,
    topology: str | None = None,
    accelerator: str | None = None,
    accelerators_per_vm: int | None = None,
    shape: GangShape | None = None,
    max_wait: timedelta | None = None,
    labels: tuple[tuple[str, str], ...] = (),
) -> CapacityRequest:
    """A calendar block: ``vm_count`` VMs (or slices, with ``topology``) for ``days`` (``run``
    overrides) from ``start_at`` (default: a day after ``NOW``)."""
    return CapacityRequest(
        request_id=request_id,
        tenant=tenant,
        mode=Mode.CALENDAR,
        gang=shape
        if shape is not None
        else gang(
            vm_count,
            machine_type=machine_type,
            topology=topology,
            accelerator=accelerator,
            accelerators_per_vm=accelerators_per_vm,
        ),
        locations=tuple(locations),
        run_duration=timedelta(days=days) if run is None else run,
        submitted_at=submitted_at,
        max_wait=max_wait,
        start_at=start_at,
        priority=priority,
        labels=labels,
    )


def pool(
    pool_id: str | None = None,
    *,
    zone: str = ZONE,
    shape: str = A3,
    accelerator: str | None = None,
    provider: Provider | None = None,
    capacity: int = 8,
    short_until: datetime | None = None,
) -> Pool:
    """A pool of ``shape`` in ``zone`` with ``capacity`` units (VMs, or chips for a TPU shape).
    Provider and accelerator follow from the shape unless given; the id is ``zone/shape``."""
    tpu = is_tpu(shape)
    return Pool(
        pool_id=f"{zone}/{shape}" if pool_id is None else pool_id,
        zone=zone,
        shape=shape,
        accelerator=(shape if tpu else MACHINES.get(shape, (H100, 8))[0])
        if accelerator is None
        else accelerator,
        provider=(Provider.TPU if tpu else Provider.MIG) if provider is None else provider,
        capacity=capacity,
        short_until=short_until,
    )


def tpu_pool(
    pool_id: str | None = None,
    *,
    zone: str = ZONE,
    shape: str = V5E,
    capacity: int = 64,
    short_until: datetime | None = None,
) -> Pool:
    """A Cloud TPU pool of ``capacity`` chips."""
    return pool(pool_id, zone=zone, shape=shape, capacity=capacity, short_until=short_until)


def quota(accelerator: str = H100, nominal: int = 64, borrowing_limit: int | None = None) -> Quota:
    """A tenant's quota for one accelerator type."""
    return Quota(accelerator=accelerator, nominal=nominal, borrowing_limit=borrowing_limit)


def tenant(
    name: str = "t",
    *quotas: Quota,
    cohort: str | None = None,
    strict_fifo: bool = False,
) -> Tenant:
    """A tenant with the given quotas (none: nominal 0 everywhere), optionally in ``cohort``
    and queueing strict FIFO."""
    return Tenant(
        name=name,
        quotas=quotas,
        cohort=cohort,
        queueing=QueueingStrategy.STRICT_FIFO if strict_fifo else QueueingStrategy.BEST_EFFORT,
    )


def grant(
    request_id: str = "g1",
    *,
    tenant: str = "t",
    pool_id: str = f"{ZONE}/{A3}",
    accelerator: str = H100,
    units: int = 1,
    accelerator_units: int | None = None,
    start_at: datetime = NOW,
    hours: float = 1,
    end_at: datetime | None = None,
) -> Grant:
    """A committed hold of ``units`` on ``pool_id`` over ``[start_at, start_at + hours)``
    (``end_at`` overrides). Accelerator units default to ``units`` for a TPU accelerator and
    8 per VM otherwise."""
    if accelerator_units is None:
        accelerator_units = units if is_tpu(accelerator) else units * 8
    return Grant(
        request_id=request_id,
        tenant=tenant,
        pool_id=pool_id,
        accelerator=accelerator,
        units=units,
        accelerator_units=accelerator_units,
        start_at=start_at,
        end_at=start_at + timedelta(hours=hours) if end_at is None else end_at,
    )


def grant_of(
    request: CapacityRequest, *, pool_id: str | None = None, start_at: datetime | None = None
) -> Grant:
    """The grant that placing ``request`` commits: in ``pool_id`` (default: the pool the
    ``pool`` builder makes for its first location and shape) from ``start_at`` (default: its
    calendar start, or ``NOW``)."""
    if pool_id is None:
        pool_id = f"{request.locations[0]}/{request.gang.shape}"
    if start_at is None:
        start_at = request.start_at if request.start_at is not None else NOW
    return Grant.of(request, pool_id, start_at)


def snapshot(
    *,
    pools: Iterable[Pool] = (),
    tenants: Iterable[Tenant] = (),
    grants: Iterable[Grant] = (),
    pending: Iterable[CapacityRequest] = (),
    policy: PolicySettings | None = None,
) -> Snapshot:
    """A snapshot of the given values (a default pool and tenant ``t`` if none are given)."""
    pools = tuple(pools) or (pool(),)
    tenants = tuple(tenants) or (tenant("t", quota()),)
    return Snapshot(
        pools=pools,
        tenants=tenants,
        grants=tuple(grants),
        pending=tuple(pending),
        policy=PolicySettings() if policy is None else policy,
    )
