"""The domain model: every validation rule (field and rule named) and every derived value."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest

from opendws.domain.model import (
    CapacityRequest,
    GangShape,
    Grant,
    InvalidModel,
    Mode,
    PolicySettings,
    Pool,
    Provider,
    Quota,
    Snapshot,
    Tenant,
)
from tests.builders import (
    A2,
    A3,
    A100,
    DAY,
    G2,
    H100,
    HOUR,
    L4,
    MINUTE,
    NOW,
    V5E,
    V5P,
    ZONE,
    calendar,
    flex,
    gpu_gang,
    grant,
    grant_of,
    pool,
    quota,
    snapshot,
    tenant,
    tpu_gang,
    tpu_pool,
)

SECOND = timedelta(seconds=1)
NAIVE = datetime(2026, 12, 1)  # noqa: DTZ001 - deliberately naive: it must be refused


@dataclass(frozen=True)
class Invalid:
    """A value that breaks one rule: building it raises InvalidModel on ``field`` with a
    message containing ``rule``."""

    build: Callable[[], object]
    field: str
    rule: str


def assert_invalid(case: Invalid) -> None:
    with pytest.raises(InvalidModel) as raised:
        case.build()
    assert raised.value.field == case.field
    assert case.rule in raised.value.rule
    assert str(raised.value) == f"{case.field}: {raised.value.rule}"


def assert_valid(build: Callable[[], object]) -> None:
    build()  # raises if a rule is broken


# --- GangShape -----------------------------------------------------------------------------------

GANG_INVALID = {
    "no VMs": Invalid(lambda: gpu_gang(0), "gang.vm_count", "at least 1"),
    "negative VMs": Invalid(lambda: gpu_gang(-2), "gang.vm_count", "at least 1"),
    "no TPU slices": Invalid(lambda: tpu_gang(0), "gang.vm_count", "at least 1"),
    "empty accelerator": Invalid(lambda: gpu_gang(accelerator=""), "gang.accelerator", "name"),
    "machine type and topology": Invalid(
        lambda: GangShape(
            vm_count=1, accelerator=H100, machine_type=A3, accelerators_per_vm=8, topology="2x2"
        ),
        "gang",
        "either machine_type",
    ),
    "neither machine type nor topology": Invalid(
        lambda: GangShape(vm_count=1, accelerator=H100), "gang", "either machine_type"
    ),
    "machine type without accelerators per VM": Invalid(
        lambda: GangShape(vm_count=1, accelerator=H100, machine_type=A3),
        "gang.accelerators_per_vm",
        "at least 1",
    ),
    "machine type with 0 accelerators per VM": Invalid(
        lambda: gpu_gang(accelerators_per_vm=0), "gang.accelerators_per_vm", "at least 1"
    ),
    "TPU slice with accelerators per VM": Invalid(
        lambda: GangShape(vm_count=1, accelerator=V5E, topology="2x2", accelerators_per_vm=4),
        "gang.accelerators_per_vm",
        "not TPU slices",
    ),
    "topology of one dimension": Invalid(
        lambda: tpu_gang(topology="16"), "gang.topology", "not a topology"
    ),
    "topology of four dimensions": Invalid(
        lambda: tpu_gang(topology="2x2x2x2"), "gang.topology", "not a topology"
    ),
    "topology with a zero": Invalid(
        lambda: tpu_gang(topology="0x4"), "gang.topology", "not a topology"
    ),
    "topology with a leading zero": Invalid(
        lambda: tpu_gang(topology="2x04"), "gang.topology", "not a topology"
    ),
    "topology with another separator": Invalid(
        lambda: tpu_gang(topology="2*2"), "gang.topology", "not a topology"
    ),
    "topology in capitals": Invalid(
        lambda: tpu_gang(topology="2X2"), "gang.topology", "not a topology"
    ),
    "empty topology": Invalid(lambda: tpu_gang(topology=""), "gang.topology", "not a topology"),
    "topology with a trailing newline": Invalid(
        lambda: tpu_gang(topology="2x2\n"), "gang.topology", "not a topology"
    ),
}


@pytest.mark.parametrize("case", GANG_INVALID.values(), ids=GANG_INVALID.keys())
def test_gang_shape_refuses(case: Invalid) -> None:
    assert_invalid(case)


# (gang, provider, pool shape, pool units, accelerator units)
GANG_DERIVED = {
    "one a3 VM": (gpu_gang(1), Provider.MIG, A3, 1, 8),
    "four a3 VMs": (gpu_gang(4), Provider.MIG, A3, 4, 32),
    "three g2 VMs of 4 L4": (gpu_gang(3, machine_type=G2), Provider.MIG, G2, 3, 12),
    "a2 VM with 1 accelerator": (
        gpu_gang(2, machine_type=A2, accelerators_per_vm=1),
        Provider.MIG,
        A2,
        2,
        2,
    ),
    "TPU 1x1": (tpu_gang(topology="1x1"), Provider.TPU, V5E, 1, 1),
    "TPU 2x4": (tpu_gang(topology="2x4"), Provider.TPU, V5E, 8, 8),
    "TPU 4x4": (tpu_gang(topology="4x4"), Provider.TPU, V5E, 16, 16),
    "TPU 2x2x4": (tpu_gang(topology="2x2x4", accelerator=V5P), Provider.TPU, V5P, 16, 16),
    "TPU 16x16": (tpu_gang(topology="16x16"), Provider.TPU, V5E, 256, 256),
    "two TPU 2x2x4 slices": (tpu_gang(2, topology="2x2x4"), Provider.TPU, V5E, 32, 32),
}


@pytest.mark.parametrize(
    ("shape", "provider", "pool_shape", "units", "accelerator_units"),
    GANG_DERIVED.values(),
    ids=GANG_DERIVED.keys(),
)
def test_gang_shape_derives_units(
    shape: GangShape, provider: Provider, pool_shape: str, units: int, accelerator_units: int
) -> None:
    assert (shape.provider, shape.shape, shape.units, shape.accelerator_units) == (
        provider,
        pool_shape,
        units,
        accelerator_units,
    )


def test_gang_shapes_compare_by_their_fields_only() -> None:
    assert gpu_gang(2) == gpu_gang(2)
    assert gpu_gang(2) != gpu_gang(3)
    assert tpu_gang(topology="4x4") != tpu_gang(topology="2x2x4")  # same chips, other slice


# --- CapacityRequest -----------------------------------------------------------------------------

REQUEST_INVALID = {
    # Fields of every request.
    "empty request id": Invalid(lambda: flex(""), "request_id", "must not be empty"),
    "empty tenant": Invalid(lambda: flex(tenant=""), "tenant", "must name a tenant"),
    "no locations": Invalid(lambda: flex(locations=()), "locations", "at least one"),
    "a location that is no place": Invalid(
        lambda: flex(locations=("mars",)), "locations", "neither a zone"
    ),
    "a bad location after a good one": Invalid(
        lambda: flex(locations=(ZONE, "us-central1-ab")), "locations", "neither a zone"
    ),
    "a location in capitals": Invalid(
        lambda: flex(locations=("US-CENTRAL1-A",)), "locations", "neither a zone"
    ),
    "a region without its number": Invalid(
        lambda: flex(locations=("us-central",)), "locations", "neither a zone"
    ),
    "a zone without its letter": Invalid(
        lambda: flex(locations=("us-central1-",)), "locations", "neither a zone"
    ),
    "a location with a trailing newline": Invalid(
        lambda: flex(locations=(f"{ZONE}\n",)), "locations", "neither a zone"
    ),
    "a calendar location that is no place": Invalid(
        lambda: calendar(locations=("global",)), "locations", "neither a zone"
    ),
    "naive submitted_at": Invalid(
        lambda: flex(submitted_at=NAIVE), "submitted_at", "timezone-aware"
    ),
    "naive submitted_at (calendar)": Invalid(
        lambda: calendar(submitted_at=NAIVE, start_at=NOW), "submitted_at", "timezone-aware"
    ),
    # flex_start.
    "flex run 9m59s": Invalid(
        lambda: flex(run=10 * MINUTE - SECOND), "run_duration", "between 10 minutes and 7 days"
    ),
    "flex run 0": Invalid(
        lambda: flex(run=timedelta(0)), "run_duration", "between 10 minutes and 7 days"
    ),
    "flex run negative": Invalid(
        lambda: flex(run=-HOUR), "run_duration", "between 10 minutes and 7 days"
    ),
    "flex run 7d+1s": Invalid(
        lambda: flex(run=7 * DAY + SECOND), "run_duration", "between 10 minutes and 7 days"
    ),
    "flex without max_wait": Invalid(
        lambda: flex(max_wait=None), "max_wait", "more than 0 and at most 7 days"
    ),
    "flex max_wait 0": Invalid(
        lambda: flex(max_wait=timedelta(0)), "max_wait", "more than 0 and at most 7 days"
    ),
    "flex max_wait negative": Invalid(
        lambda: flex(max_wait=-SECOND), "max_wait", "more than 0 and at most 7 days"
    ),
    "flex max_wait 7d+1s": Invalid(
        lambda: flex(max_wait=7 * DAY + SECOND), "max_wait", "more than 0 and at most 7 days"
    ),
    "flex with start_at": Invalid(
        lambda: flex(start_at=NOW + DAY), "start_at", "only calendar requests"
    ),
    # calendar.
    "calendar run 1d-1s": Invalid(
        lambda: calendar(run=DAY - SECOND), "run_duration", "between 1 and 90 days"
    ),
    "calendar run 90d+1s": Invalid(
        lambda: calendar(run=90 * DAY + SECOND), "run_duration", "between 1 and 90 days"
    ),
    "calendar run of a flex length": Invalid(
        lambda: calendar(run=HOUR), "run_duration", "between 1 and 90 days"
    ),
    "calendar with max_wait": Invalid(lambda: calendar(max_wait=HOUR), "max_wait", "no max_wait"),
    "calendar without start_at": Invalid(
        lambda: calendar(start_at=None), "start_at", "need a start time"
    ),
    "calendar naive start_at": Invalid(
        lambda: calendar(start_at=NAIVE), "start_at", "timezone-aware"
    ),
    # Google's calendar mode (compute/docs/instances/future-reservations-calendar-mode-overview:
    # availability up to 60 days ahead for GPU VMs, 120 for TPUs; tpu/docs/calendar-mode-
    # reservation: TPUs 1 to 120 days in advance; 1-80 GPU VMs, TPU chips 1, 4, 8 ... 1,024).
    "GPU calendar start 60d+1s ahead": Invalid(
        lambda: calendar(start_at=NOW + 60 * DAY + SECOND), "start_at", "at most 60 days ahead"
    ),
    "GPU calendar start 60d+1s after a later submission": Invalid(
        lambda: calendar(submitted_at=NOW + DAY, start_at=NOW + 61 * DAY + SECOND),
        "start_at",
        "at most 60 days ahead",
    ),
    "TPU calendar start 120d+1s ahead": Invalid(
        lambda: calendar(topology="2x2", start_at=NOW + 120 * DAY + SECOND),
        "start_at",
        "a TPU calendar block starts at most 120 days ahead",
    ),
    "TPU calendar start less than a day ahead": Invalid(
        lambda: calendar(topology="2x2", start_at=NOW + DAY - SECOND),
        "start_at",
        "a TPU calendar block starts at least 1 day ahead",
    ),
    "GPU calendar of 81 VMs": Invalid(
        lambda: calendar(vm_count=81), "gang", "reserves 1 to 80 VMs; 81 asked"
    ),
    "TPU calendar of 12 chips": Invalid(
        lambda: calendar(topology="2x2", vm_count=3),
        "gang",
        "12 is not one of them",
    ),
}


@pytest.mark.parametrize("case", REQUEST_INVALID.values(), ids=REQUEST_INVALID.keys())
def test_capacity_request_refuses(case: Invalid) -> None:
    assert_invalid(case)


REQUEST_VALID: dict[str, Callable[[], CapacityRequest]] = {
    "flex run exactly 10 min": lambda: flex(run=10 * MINUTE),
    "flex run exactly 7 days": lambda: flex(run=7 * DAY),
    "flex max_wait 1 microsecond": lambda: flex(max_wait=timedelta(microseconds=1)),
    "flex max_wait exactly 7 days": lambda: flex(max_wait=7 * DAY),
    "flex TPU slice": lambda: flex(topology="2x2x4"),
    "flex in a region": lambda: flex(locations=("europe-west4",)),
    "flex in zones and regions": lambda: flex(locations=("europe-west4-b", "us-central1")),
    "calendar run exactly 1 day": lambda: calendar(run=DAY),
    "calendar run exactly 90 days": lambda: calendar(run=90 * DAY),
    "GPU calendar start exactly 60 days ahead": lambda: calendar(start_at=NOW + 60 * DAY),
    "GPU calendar start 60 days after a later submission": lambda: calendar(
        submitted_at=NOW + DAY, start_at=NOW + 61 * DAY
    ),
    "TPU calendar start exactly 120 days ahead": lambda: calendar(
        topology="2x2", start_at=NOW + 120 * DAY
    ),
    "TPU calendar start exactly a day ahead": lambda: calendar(topology="2x2", start_at=NOW + DAY),
    "GPU calendar of 80 VMs": lambda: calendar(vm_count=80),
    "TPU calendar of 1,024 chips": lambda: calendar(topology="16x16", vm_count=4),
    "calendar start at submission": lambda: calendar(start_at=NOW),
    "calendar TPU slice": lambda: calendar(topology="4x4", days=7),
}


@pytest.mark.parametrize("build", REQUEST_VALID.values(), ids=REQUEST_VALID.keys())
def test_capacity_request_accepts(build: Callable[[], CapacityRequest]) -> None:
    assert_valid(build)


def test_capacity_request_modes_and_defaults() -> None:
    request = flex()
    assert request.mode is Mode.FLEX_START
    assert (request.priority, request.labels, request.start_at) == (0, (), None)
    block = calendar()
    assert block.mode is Mode.CALENDAR
    assert block.max_wait is None


# (request, units, accelerator units, deadline, accelerator-hours)
REQUEST_DERIVED = {
    "flex 2 a3 VMs for 6 h": (flex(vm_count=2, hours=6), 2, 16, NOW + DAY, 96.0),
    "flex g2 VM for 30 min, 2 h wait": (
        flex(machine_type=G2, run=30 * MINUTE, max_wait=2 * HOUR),
        1,
        4,
        NOW + 2 * HOUR,
        2.0,
    ),
    "flex TPU 2x2x4 for 1 h": (flex(topology="2x2x4"), 16, 16, NOW + DAY, 16.0),
    "calendar 3 a3 VMs for 2 days": (calendar(vm_count=3, days=2), 3, 24, None, 1152.0),
    "calendar two TPU 4x4 slices for 1 day": (
        calendar(vm_count=2, topology="4x4"),
        32,
        32,
        None,
        768.0,
    ),
}


@pytest.mark.parametrize(
    ("request_", "units", "accelerator_units", "deadline", "unit_hours"),
    REQUEST_DERIVED.values(),
    ids=REQUEST_DERIVED.keys(),
)
def test_capacity_request_derives_sizes(
    request_: CapacityRequest,
    units: int,
    accelerator_units: int,
    deadline: datetime | None,
    unit_hours: float,
) -> None:
    assert request_.units == units
    assert request_.accelerator_units == accelerator_units
    assert request_.deadline == deadline
    assert request_.unit_hours == pytest.approx(unit_hours)


LOCATIONS = ("us-central1-b", "us-central1", "europe-west4-a")
# zone → (allowed, preference index) for a request asking for LOCATIONS in that order
ALLOWS = {
    "first zone": ("us-central1-b", True, 0),
    "zone of a listed region": ("us-central1-f", True, 1),
    "other zone of the region": ("us-central1-a", True, 1),
    "zone listed last": ("europe-west4-a", True, 2),
    "other zone of the last zone's region": ("europe-west4-b", False, 3),
    "unlisted region": ("asia-east1-a", False, 3),
    "region whose name extends a listed one": ("us-central10-a", False, 3),
}


@pytest.mark.parametrize(("zone", "allowed", "preference"), ALLOWS.values(), ids=ALLOWS.keys())
def test_capacity_request_allows_and_prefers(zone: str, allowed: bool, preference: int) -> None:
    request = flex(locations=LOCATIONS)
    assert request.allows(zone) is allowed
    assert request.preference(zone) == preference


# --- Pool ----------------------------------------------------------------------------------------

POOL_INVALID = {
    "empty pool id": Invalid(lambda: pool(""), "pool_id", "must not be empty"),
    "region instead of zone": Invalid(lambda: pool(zone="us-central1"), "zone", "not a zone"),
    "no place": Invalid(lambda: pool(zone="somewhere"), "zone", "not a zone"),
    "zone with a trailing newline": Invalid(lambda: pool(zone=f"{ZONE}\n"), "zone", "not a zone"),
    "negative capacity": Invalid(lambda: pool(capacity=-1), "capacity", "must not be negative"),
    "naive short_until": Invalid(lambda: pool(short_until=NAIVE), "short_until", "timezone-aware"),
}


@pytest.mark.parametrize("case", POOL_INVALID.values(), ids=POOL_INVALID.keys())
def test_pool_refuses(case: Invalid) -> None:
    assert_invalid(case)


POOL_VALID: dict[str, Callable[[], Pool]] = {
    "capacity 0": lambda: pool(capacity=0),
    "short until a later time": lambda: pool(short_until=NOW + HOUR),
    "TPU pool": lambda: tpu_pool(capacity=256),
}


@pytest.mark.parametrize("build", POOL_VALID.values(), ids=POOL_VALID.keys())
def test_pool_accepts(build: Callable[[], Pool]) -> None:
    assert_valid(build)


# (pool, request, served)
SERVES = {
    "GPU pool, same shape and zone": (pool(), flex(), True),
    "GPU pool, request names its region": (pool(), flex(locations=("us-central1",)), True),
    "GPU pool, request names another zone of the region": (
        pool(),
        flex(locations=("us-central1-b",)),
        False,
    ),
    "GPU pool, request names another region": (pool(), flex(locations=("europe-west4",)), False),
    "GPU pool, zone listed second": (pool(), flex(locations=("us-central1-b", ZONE)), True),
    "GPU pool, other machine type": (pool(shape=A2), flex(), False),
    "GPU pool, same machine type, other accelerator": (
        pool(accelerator=A100),
        flex(),
        False,
    ),
    "g2 pool, g2 request": (pool(shape=G2), flex(machine_type=G2), True),
    "GPU pool, calendar request": (pool(), calendar(), True),
    "GPU pool, TPU request": (pool(), flex(topology="2x2"), False),
    "TPU pool, TPU request": (tpu_pool(), flex(topology="2x2"), True),
    "TPU pool, TPU request in its region": (
        tpu_pool(zone="europe-west4-a"),
        calendar(topology="2x2x4", locations=("europe-west4",)),
        True,
    ),
    "TPU pool, other TPU type": (tpu_pool(shape=V5P), flex(topology="2x2"), False),
    "TPU pool, GPU request": (tpu_pool(), flex(), False),
    "MIG pool of a TPU shape, TPU request": (
        pool(shape=V5E, provider=Provider.MIG),
        flex(topology="2x2"),
        False,
    ),
    "TPU pool of a machine type, GPU request": (
        pool(provider=Provider.TPU),
        flex(),
        False,
    ),
}


@pytest.mark.parametrize(("pool_", "request_", "served"), SERVES.values(), ids=SERVES.keys())
def test_pool_serves(pool_: Pool, request_: CapacityRequest, served: bool) -> None:
    assert pool_.serves(request_) is served


def test_pool_builders_make_both_providers() -> None:
    assert (pool().provider, pool().accelerator, pool().pool_id) == (
        Provider.MIG,
        H100,
        f"{ZONE}/{A3}",
    )
    assert (pool(shape=G2).accelerator, tpu_pool().provider, tpu_pool().accelerator) == (
        L4,
        Provider.TPU,
        V5E,
    )


# --- Quota and Tenant ----------------------------------------------------------------------------

QUOTA_TENANT_INVALID = {
    "negative nominal": Invalid(lambda: quota(nominal=-1), "quota.nominal", "must not be negative"),
    "negative borrowing limit": Invalid(
        lambda: quota(borrowing_limit=-1), "quota.borrowing_limit", "must not be negative"
    ),
    "empty tenant name": Invalid(lambda: tenant(""), "tenant.name", "must not be empty"),
    "two quotas for one accelerator": Invalid(
        lambda: tenant("vision", quota(H100, 8), quota(V5E, 16), quota(H100, 4)),
        "tenant.quotas",
        "one quota per accelerator",
    ),
}


@pytest.mark.parametrize("case", QUOTA_TENANT_INVALID.values(), ids=QUOTA_TENANT_INVALID.keys())
def test_quota_and_tenant_refuse(case: Invalid) -> None:
    assert_invalid(case)


def test_tenant_names_itself_in_a_duplicate_quota() -> None:
    with pytest.raises(InvalidModel, match="vision"):
        tenant("vision", quota(H100, 8), quota(H100, 4))


QUOTA_VALID: dict[str, Callable[[], object]] = {
    "nominal 0": lambda: quota(nominal=0),
    "borrowing limit 0": lambda: quota(borrowing_limit=0),
    "no borrowing limit": lambda: quota(borrowing_limit=None),
    "tenant without quotas": lambda: tenant("t"),
    "tenant with quotas for two accelerators": lambda: tenant("t", quota(H100), quota(V5E)),
    "strict FIFO tenant in a cohort": lambda: tenant("t", quota(), cohort="c", strict_fifo=True),
}


@pytest.mark.parametrize("build", QUOTA_VALID.values(), ids=QUOTA_VALID.keys())
def test_quota_and_tenant_accept(build: Callable[[], object]) -> None:
    assert_valid(build)


TENANT_QUOTA = {
    "configured quota": (H100, Quota(accelerator=H100, nominal=16, borrowing_limit=4)),
    "other configured quota": (V5E, Quota(accelerator=V5E, nominal=64)),
    "unconfigured accelerator: nominal 0, no borrowing limit": (
        A100,
        Quota(accelerator=A100, nominal=0, borrowing_limit=None),
    ),
}


@pytest.mark.parametrize(
    ("accelerator", "expected"), TENANT_QUOTA.values(), ids=TENANT_QUOTA.keys()
)
def test_tenant_quota(accelerator: str, expected: Quota) -> None:
    team = tenant("vision", quota(H100, 16, borrowing_limit=4), quota(V5E, 64))
    assert team.quota(accelerator) == expected


def test_tenant_without_quotas_has_nominal_zero_everywhere() -> None:
    assert Tenant(name="t").quota(H100) == Quota(accelerator=H100, nominal=0)


# --- Grant ---------------------------------------------------------------------------------------

GRANT_INVALID = {
    "ends when it starts": Invalid(lambda: grant(end_at=NOW), "end_at", "ends after it starts"),
    "ends before it starts": Invalid(
        lambda: grant(end_at=NOW - SECOND), "end_at", "ends after it starts"
    ),
    "ends a microsecond before it starts": Invalid(
        lambda: grant(start_at=NOW, end_at=NOW - timedelta(microseconds=1)),
        "end_at",
        "ends after it starts",
    ),
    "naive start_at": Invalid(
        lambda: grant(start_at=NAIVE, end_at=NOW + HOUR), "start_at", "timezone-aware"
    ),
    "naive end_at": Invalid(lambda: grant(end_at=NAIVE + HOUR), "end_at", "timezone-aware"),
    "negative units": Invalid(
        lambda: grant(units=-1, accelerator_units=0), "units", "must not be negative"
    ),
    "negative accelerator units": Invalid(
        lambda: grant(units=1, accelerator_units=-1), "units", "must not be negative"
    ),
}


@pytest.mark.parametrize("case", GRANT_INVALID.values(), ids=GRANT_INVALID.keys())
def test_grant_refuses(case: Invalid) -> None:
    assert_invalid(case)


def test_grant_of_one_microsecond_is_valid() -> None:
    assert_valid(lambda: grant(end_at=NOW + timedelta(microseconds=1)))


GRANT_OF = {
    "GPU flex": (
        flex("r1", tenant="vision", vm_count=2, hours=6),
        "us-central1-a/a3-highgpu-8g",
        NOW + HOUR,
        Grant(
            request_id="r1",
            tenant="vision",
            pool_id="us-central1-a/a3-highgpu-8g",
            accelerator=H100,
            units=2,
            accelerator_units=16,
            start_at=NOW + HOUR,
            end_at=NOW + 7 * HOUR,
        ),
    ),
    "TPU calendar": (
        calendar("c1", tenant="nlp", topology="2x2x4", days=3, start_at=NOW + DAY),
        "us-central1-a/tpu-v5e",
        NOW + DAY,
        Grant(
            request_id="c1",
            tenant="nlp",
            pool_id="us-central1-a/tpu-v5e",
            accelerator=V5E,
            units=16,
            accelerator_units=16,
            start_at=NOW + DAY,
            end_at=NOW + 4 * DAY,
        ),
    ),
}


@pytest.mark.parametrize(
    ("request_", "pool_id", "start_at", "expected"), GRANT_OF.values(), ids=GRANT_OF.keys()
)
def test_grant_of_request(
    request_: CapacityRequest, pool_id: str, start_at: datetime, expected: Grant
) -> None:
    assert Grant.of(request_, pool_id, start_at) == expected
    assert grant_of(request_, pool_id=pool_id, start_at=start_at) == expected


# --- PolicySettings and Snapshot -----------------------------------------------------------------

SNAPSHOT_INVALID = {
    "zero aging half-life": Invalid(
        lambda: PolicySettings(aging_half_life=timedelta(0)), "aging_half_life", "positive"
    ),
    "negative aging half-life": Invalid(
        lambda: PolicySettings(aging_half_life=-HOUR), "aging_half_life", "positive"
    ),
    "duplicate pool id": Invalid(
        lambda: snapshot(pools=(pool("p"), pool("q"), pool("p", zone="us-east1-b"))),
        "pools",
        "'p' appears twice",
    ),
    "duplicate tenant": Invalid(
        lambda: snapshot(tenants=(tenant("a"), tenant("b", cohort="c"), tenant("a"))),
        "tenants",
        "'a' appears twice",
    ),
    "duplicate pending request id": Invalid(
        lambda: snapshot(pending=(flex("r1"), flex("r2"), calendar("r1"))),
        "pending",
        "'r1' appears twice",
    ),
}


@pytest.mark.parametrize("case", SNAPSHOT_INVALID.values(), ids=SNAPSHOT_INVALID.keys())
def test_snapshot_refuses(case: Invalid) -> None:
    assert_invalid(case)


def test_snapshot_accepts_distinct_ids() -> None:
    taken = snapshot(
        pools=(pool(), tpu_pool(), pool(zone="us-central1-b")),
        tenants=(tenant("a", quota()), tenant("b", quota(V5E), cohort="c", strict_fifo=True)),
        grants=(grant("g1"), grant("g2")),
        pending=(flex("r1"), calendar("r2"), flex("r3", topology="2x2")),
    )
    assert len(taken.pools) == 3
    assert taken.policy == PolicySettings()


def test_snapshot_defaults() -> None:
    bare = Snapshot(pools=(), tenants=())
    assert (bare.grants, bare.pending, bare.policy) == ((), (), PolicySettings())
