"""Calendar mode on the simulated cloud directly, with its manual clock: the review of a
submitted future reservation, its lock time and cancellation rule, its limits, its start (the
auto-created reservation and the VMs and TPU queued resources consuming it), its end, and the
Advice API's recommendations from the same capacity model. Every test's docstring names the
Google page it pins (see ../shared/GOOGLE-SEMANTICS.md, "Calendar mode"; CP = googleapis
compute.proto). The rules themselves are ``opendws.domain.calendar``'s."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from opendws.catalog import TPU_COMPUTE_ACCELERATORS, TPU_VM_FAMILIES
from opendws.clock import ManualClock
from opendws.domain.calendar import (
    GPU_MAX_VMS,
    CancellationRule,
    cancel_deadline,
    lead_of,
)
from opendws.domain.model import CALENDAR_MAX_RUN, CALENDAR_MIN_RUN
from opendws.sim import CloudError, SimulatedCloud
from opendws.sim.cloud import REVIEW_DELAY

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
LATENCY = timedelta(seconds=20)
DAY = timedelta(days=1)
P, Z, REGION = "proj", "us-east5-a", "us-east5"
Z2 = "us-east5-b"
SHAPE = "a3-highgpu-8g"
TPU = "V6E"

JSON = dict[str, Any]
COMPUTE = "https://www.googleapis.com/compute/v1"


@pytest.fixture
def cloud() -> SimulatedCloud:
    cloud = SimulatedCloud(
        ManualClock(START), provisioning_latency=LATENCY, operation_latency=timedelta(0)
    )
    cloud.set_stock(Z, SHAPE, 4)
    cloud.set_stock(Z, TPU, 16)
    return cloud


def window(start: datetime, length: timedelta) -> JSON:
    return {"startTime": start.isoformat(), "endTime": (start + length).isoformat()}


def gpu_block(name: str, count: int, start: datetime, length: timedelta = 2 * DAY) -> JSON:
    """A GPU calendar block as the contract's insert body has it."""
    return {
        "name": name,
        "reservationMode": "CALENDAR",
        "deploymentType": "DENSE",
        "schedulingType": "INDEPENDENT",
        "planningStatus": "SUBMITTED",
        "specificReservationRequired": True,
        "autoDeleteAutoCreatedReservations": True,
        "reservationName": f"{name}-r",
        "specificSkuProperties": {
            "totalCount": str(count),
            "instanceProperties": {"machineType": SHAPE},
        },
        "timeWindow": window(start, length),
    }


def tpu_block(name: str, chips: int, start: datetime, length: timedelta = DAY) -> JSON:
    """A TPU calendar block: an aggregate reservation of the v6e VM family, as gcloud sends
    it (the family, the chip count and the workload type; no accelerator type)."""
    body = gpu_block(name, 1, start, length)
    del body["specificSkuProperties"]
    body["aggregateReservation"] = {
        "vmFamily": TPU_VM_FAMILIES[TPU],
        "workloadType": "BATCH",
        "reservedResources": [{"accelerator": {"acceleratorCount": chips}}],
    }
    return body


def status(cloud: SimulatedCloud, name: str, zone: str = Z) -> JSON:
    got = cloud.get_future_reservation(P, zone, name)["status"]
    assert isinstance(got, dict)
    return got


def procurement(cloud: SimulatedCloud, name: str) -> str:
    return str(status(cloud, name)["procurementStatus"])


def submit(cloud: SimulatedCloud, body: JSON, *, reviewed: bool = True) -> None:
    operation = cloud.insert_future_reservation(P, Z, body)
    assert operation["status"] == "DONE"
    assert "error" not in operation
    if reviewed:
        cloud.advance(cloud.review_delay)


def bound_vm(name: str, reservation: str, *, bound: bool = True) -> JSON:
    """A VM consuming a specific reservation (RESERVATION_BOUND unless ``bound`` is False)."""
    body: JSON = {
        "name": name,
        "machineType": f"zones/{Z}/machineTypes/{SHAPE}",
        "reservationAffinity": {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": [reservation],
        },
    }
    if bound:
        body["scheduling"] = {"provisioningModel": "RESERVATION_BOUND"}
    return body


def reserved_qr(reservation: str, chips: int = 8, **extra: Any) -> JSON:
    return {
        "tpu": {"nodeSpec": [{"node": {"acceleratorType": f"v6e-{chips}"}}]},
        "reservationName": f"projects/{P}/locations/{Z}/reservations/{reservation}",
        "provisioningModel": "RESERVATION_BOUND",
        **extra,
    }


def refused(call: Any, *fields: str) -> CloudError:
    """``call`` is refused with a 400 whose message names every one of ``fields``."""
    with pytest.raises(CloudError) as raised:
        call()
    assert raised.value.http_status == 400
    for field in fields:
        assert field in raised.value.message
    return raised.value


# ---------------------------------------------------------------------- review


def test_a_submitted_block_is_pending_approval_until_the_review_then_approved(
    cloud: SimulatedCloud,
) -> None:
    """The insert succeeds and the request is PENDING_APPROVAL; Google reviews it (after a
    delay it does not document) and approves it when the capacity is there: nothing is taken
    from stock before the start, and its reservation is created at approval, empty ("Compute
    Engine automatically creates an empty reservation", compute/docs/hpc/
    reserve-capacity-account-team; CP FutureReservationStatus.ProcurementStatus,
    AllocationSpecificSKUReservation.assured_count "how many instances are actually usable
    currently"; compute/docs/instances/create-future-reservations-calendar-mode)."""
    assert cloud.review_delay == REVIEW_DELAY
    submit(cloud, gpu_block("b", 3, START + 10 * DAY), reviewed=False)
    assert procurement(cloud, "b") == "PENDING_APPROVAL"
    assert cloud.list_reservations(P, Z) == []
    cloud.advance(REVIEW_DELAY - timedelta(seconds=1))
    assert procurement(cloud, "b") == "PENDING_APPROVAL"
    cloud.advance(timedelta(seconds=1))
    assert procurement(cloud, "b") == "APPROVED"
    assert cloud.stock(Z, SHAPE) == 4
    (reservation,) = cloud.list_reservations(P, Z)
    assert reservation["name"] == "b-r"
    assert reservation["specificReservation"]["assuredCount"] == "0"
    assert cloud.created("futureReservations") == {"b": 1}


def test_a_block_beyond_the_capacity_left_by_overlapping_approved_blocks_is_declined(
    cloud: SimulatedCloud,
) -> None:
    """Google approves a request only if it has the capacity: the units promised to an
    approved overlapping block are not offered twice; a block outside that window is free to
    be approved (compute/docs/instances/future-reservations-calendar-mode-overview: "view
    resources future availability ... helps ensure that Google Cloud approves your
    request"; CP ProcurementStatus DECLINED)."""
    start = START + 10 * DAY
    submit(cloud, gpu_block("first", 3, start))
    submit(cloud, gpu_block("overlapping", 2, start + DAY))
    submit(cloud, gpu_block("after", 4, start + 2 * DAY))
    submit(cloud, gpu_block("fits", 1, start - DAY))
    assert procurement(cloud, "first") == "APPROVED"
    assert procurement(cloud, "overlapping") == "DECLINED"
    assert procurement(cloud, "after") == "APPROVED"
    assert procurement(cloud, "fits") == "APPROVED"
    assert "lockTime" not in status(cloud, "overlapping")


def test_injected_failures_decline_hang_or_fail_the_insert(cloud: SimulatedCloud) -> None:
    """Injections steer the review: a stockout declines the block, a hang leaves it pending
    approval for good, an error fails the insert operation itself and nothing is created (CP
    ProcurementStatus; compute Operation.error)."""
    start = START + 10 * DAY
    cloud.inject(Z, SHAPE, "stockout")
    submit(cloud, gpu_block("declined", 1, start))
    assert procurement(cloud, "declined") == "DECLINED"
    cloud.inject(Z, SHAPE, "hang")
    submit(cloud, gpu_block("hung", 1, start))
    cloud.advance(DAY)
    assert procurement(cloud, "hung") == "PENDING_APPROVAL"
    cloud.inject(Z, SHAPE, "error")
    operation = cloud.insert_future_reservation(P, Z, gpu_block("broken", 1, start))
    assert operation["error"]["errors"][0]["code"] == "RESOURCE_OPERATION_RATE_EXCEEDED"
    with pytest.raises(CloudError, match="was not found"):
        cloud.get_future_reservation(P, Z, "broken")
    assert "broken" not in cloud.created("futureReservations")


# ---------------------------------------------------------------------- lock time and cancel


def test_lock_time_is_the_cancel_deadline_and_the_block_is_procuring_after_it(
    cloud: SimulatedCloud,
) -> None:
    """An approved block shows status.lockTime, its last moment of cancellation; beyond it
    the block is PROCURING, "locked and no further modifications are allowed" (CP
    FutureReservationStatus.lockTime, ProcurementStatus.PROCURING;
    compute/docs/instances/delete-future-reservations-calendar-mode)."""
    start = START + 40 * DAY
    submit(cloud, gpu_block("b", 1, start))
    approved_at = START + REVIEW_DELAY
    deadline = cancel_deadline(CancellationRule.WINDOWS, start=start, approved_at=approved_at)
    assert deadline is not None
    locked = datetime.fromisoformat(status(cloud, "b")["lockTime"])
    assert deadline - timedelta(milliseconds=1) < locked <= deadline
    cloud.advance(deadline - cloud.clock.now())
    assert procurement(cloud, "b") == "APPROVED"
    cloud.advance(timedelta(milliseconds=1))
    assert procurement(cloud, "b") == "PROCURING"


def test_a_block_far_ahead_may_be_cancelled(cloud: SimulatedCloud) -> None:
    """A block whose start is more than 30 days away may be cancelled: CANCELLED, then
    deletable (compute/docs/instances/delete-future-reservations-calendar-mode)."""
    submit(cloud, gpu_block("far", 4, START + 40 * DAY))
    cloud.advance(5 * DAY)
    operation = cloud.cancel_future_reservation(P, Z, "far")
    assert operation["operationType"] == "cancel"
    assert "error" not in operation
    assert procurement(cloud, "far") == "CANCELLED"
    submit(cloud, gpu_block("again", 4, START + 40 * DAY))
    assert procurement(cloud, "again") == "APPROVED"  # the units are offered again
    cloud.delete_future_reservation(P, Z, "far")
    assert [f["name"] for f in cloud.list_future_reservations(P, Z)] == ["again"]


def test_a_block_may_be_cancelled_within_24_hours_of_approval_when_4_days_ahead(
    cloud: SimulatedCloud,
) -> None:
    """Within 24 hours after approval a block starting at least 4 days later may still be
    cancelled; 24 hours after approval it may not
    (compute/docs/instances/delete-future-reservations-calendar-mode)."""
    submit(cloud, gpu_block("grace", 1, START + 10 * DAY))
    submit(cloud, gpu_block("late", 1, START + 10 * DAY))
    cloud.advance(timedelta(hours=23))
    cloud.cancel_future_reservation(P, Z, "grace")
    assert procurement(cloud, "grace") == "CANCELLED"
    cloud.advance(timedelta(hours=1, seconds=1))
    refused(lambda: cloud.cancel_future_reservation(P, Z, "late"), "cannot be cancelled")
    assert procurement(cloud, "late") == "PROCURING"


def test_a_refused_cancel_changes_nothing(cloud: SimulatedCloud) -> None:
    """A cancel Google refuses is a 400 "Future reservation NAME cannot be cancelled: ..."
    that says why, and leaves the block, its promise and everything else as they were
    (compute/docs/instances/delete-future-reservations-calendar-mode)."""
    submit(cloud, gpu_block("b", 2, START + 10 * DAY))
    cloud.advance(2 * DAY)
    before = cloud.state()
    error = refused(lambda: cloud.cancel_future_reservation(P, Z, "b"), "Future reservation b")
    assert error.reason == "invalid"
    assert "cannot be cancelled" in error.message
    assert "billed in full" in error.message
    assert cloud.state() == before
    cloud.advance(8 * DAY + LATENCY)
    refused(lambda: cloud.cancel_future_reservation(P, Z, "b"), "it is FULFILLED")


def test_under_the_never_rule_an_approved_block_cannot_be_cancelled(
    cloud: SimulatedCloud,
) -> None:
    """Older Compute pages and the TPU page: a submitted request cannot be cancelled, so an
    approved block has no lockTime and any cancel is refused; a block not yet approved may
    still be withdrawn (tpu/docs/calendar-mode-reservation, "Limitations")."""
    cloud.set_cancellation_rule("never")
    assert cloud.cancellation_rule is CancellationRule.NEVER
    submit(cloud, gpu_block("b", 1, START + 60 * DAY))
    assert procurement(cloud, "b") == "APPROVED"
    assert "lockTime" not in status(cloud, "b")
    refused(lambda: cloud.cancel_future_reservation(P, Z, "b"), "does not allow")
    submit(cloud, gpu_block("pending", 1, START + 60 * DAY), reviewed=False)
    cloud.cancel_future_reservation(P, Z, "pending")
    assert procurement(cloud, "pending") == "CANCELLED"
    with pytest.raises(ValueError, match="cancellation rule"):
        cloud.set_cancellation_rule("sometimes")


def test_delete_is_refused_while_the_block_is_live_and_allowed_once_it_is_over(
    cloud: SimulatedCloud,
) -> None:
    """A future reservation can be deleted only after it was cancelled (or declined, or
    failed) or after its end; before, delete is refused and nothing changes
    (compute/docs/instances/delete-future-reservations-calendar-mode)."""
    start = START + 3 * DAY
    submit(cloud, gpu_block("b", 2, start))
    submit(cloud, gpu_block("declined", 4, start))
    refused(lambda: cloud.delete_future_reservation(P, Z, "b"), "cannot be deleted")
    cloud.delete_future_reservation(P, Z, "declined")
    cloud.advance(start - cloud.clock.now() + LATENCY)
    before = cloud.state()
    refused(lambda: cloud.delete_future_reservation(P, Z, "b"), "FULFILLED")
    assert cloud.state() == before
    cloud.advance(2 * DAY)
    assert procurement(cloud, "b") == "FULFILLED"  # listed until deleted
    cloud.delete_future_reservation(P, Z, "b")
    assert cloud.list_future_reservations(P, Z) == []


# ---------------------------------------------------------------------- limits


def test_the_request_must_be_a_dense_calendar_request(cloud: SimulatedCloud) -> None:
    """reservationMode CALENDAR; v1 deploymentType has only DENSE; schedulingType GROUPED or
    INDEPENDENT (CP FutureReservation enums;
    compute/docs/instances/create-future-reservations-calendar-mode)."""
    start = START + 10 * DAY
    for field, value in (
        ("reservationMode", "DEFAULT"),
        ("deploymentType", "FLEXIBLE"),
        ("schedulingType", "ANYHOW"),
    ):
        body = {**gpu_block("b", 1, start), field: value}
        refused(lambda b=body: cloud.insert_future_reservation(P, Z, b), field, value)
    body = gpu_block("b", 1, start)
    del body["reservationMode"]
    refused(lambda: cloud.insert_future_reservation(P, Z, body), "reservationMode")
    grouped = {**gpu_block("grouped", 1, start), "schedulingType": "GROUPED"}
    submit(cloud, grouped)
    assert procurement(cloud, "grouped") == "APPROVED"


def test_a_block_lasts_1_to_90_days(cloud: SimulatedCloud) -> None:
    """A calendar block lasts between 1 and 90 days
    (compute/docs/instances/future-reservations-calendar-mode-overview)."""
    start = START + 10 * DAY
    for length in (CALENDAR_MIN_RUN - timedelta(seconds=1), CALENDAR_MAX_RUN + DAY):
        body = gpu_block("b", 1, start, length)
        refused(lambda b=body: cloud.insert_future_reservation(P, Z, b), "timeWindow")
    submit(cloud, gpu_block("shortest", 1, start, CALENDAR_MIN_RUN))
    submit(cloud, gpu_block("longest", 1, start, CALENDAR_MAX_RUN))
    assert {procurement(cloud, "shortest"), procurement(cloud, "longest")} == {"APPROVED"}


def test_gpu_blocks_start_within_60_days_tpu_blocks_1_to_120_days_ahead(
    cloud: SimulatedCloud,
) -> None:
    """GPU VMs can be reserved up to 60 days ahead; TPUs 1 to 120 days ahead
    (compute/docs/instances/future-reservations-calendar-mode-overview;
    tpu/docs/calendar-mode-reservation)."""
    gpu, tpu = lead_of(False), lead_of(True)
    now = cloud.clock.now()
    refused(
        lambda: cloud.insert_future_reservation(P, Z, gpu_block("g", 1, now + gpu.latest + DAY)),
        "timeWindow.startTime",
    )
    refused(
        lambda: cloud.insert_future_reservation(P, Z, gpu_block("g", 1, now - DAY)), "startTime"
    )
    refused(
        lambda: cloud.insert_future_reservation(P, Z, tpu_block("t", 8, now + tpu.latest + DAY)),
        "timeWindow.startTime",
    )
    soon = now + tpu.earliest - timedelta(hours=1)
    refused(lambda: cloud.insert_future_reservation(P, Z, tpu_block("t", 8, soon)), "startTime")
    submit(cloud, gpu_block("gpu-far", 1, now + gpu.latest), reviewed=False)
    submit(cloud, gpu_block("gpu-now", 1, now), reviewed=False)
    submit(cloud, tpu_block("tpu-far", 8, now + tpu.latest), reviewed=False)
    submit(cloud, tpu_block("tpu-soon", 8, now + tpu.earliest))
    got = {
        f["name"]: f["status"]["procurementStatus"] for f in cloud.list_future_reservations(P, Z)
    }
    assert got == {
        "gpu-far": "APPROVED",
        "gpu-now": "FULFILLED",  # reviewed after its start: it starts at once
        "tpu-far": "APPROVED",
        "tpu-soon": "APPROVED",
    }


def test_a_gpu_block_reserves_1_to_80_vms_and_a_tpu_block_an_allowed_chip_count(
    cloud: SimulatedCloud,
) -> None:
    """1 to 80 GPU VMs per request; TPU chips per request 1, 4, 8, ..., 1,024
    (compute/docs/instances/create-future-reservations-calendar-mode, "Limitations")."""
    start = START + 10 * DAY
    for count in (0, GPU_MAX_VMS + 1):
        body = gpu_block("g", count, start)
        refused(lambda b=body: cloud.insert_future_reservation(P, Z, b), "specificSkuProperties")
    body = tpu_block("t", 3, start)
    refused(lambda: cloud.insert_future_reservation(P, Z, body), "aggregateReservation", "3")
    wrong = tpu_block("t", 8, start)
    chip = wrong["aggregateReservation"]["reservedResources"][0]["accelerator"]
    chip["acceleratorType"] = f"zones/{Z}/acceleratorTypes/ct5p"
    refused(lambda: cloud.insert_future_reservation(P, Z, wrong), "acceleratorType", "ct6e")
    family = tpu_block("t", 8, start)
    family["aggregateReservation"]["vmFamily"] = "VM_FAMILY_CLOUD_TPU_DEVICE_CT3"
    refused(lambda: cloud.insert_future_reservation(P, Z, family), "vmFamily")


def test_calendar_mode_reserves_tpu_v6e_v5p_and_v5e_only(cloud: SimulatedCloud) -> None:
    """ "You can only reserve the following TPU versions": v6e, v5p and v5e
    (tpu/docs/calendar-mode-reservation, "Limitations"): a v4 block is refused."""
    v4 = tpu_block("t", 8, START + 10 * DAY)
    aggregate = v4["aggregateReservation"]
    aggregate["vmFamily"] = TPU_VM_FAMILIES["V4"]
    refused(lambda: cloud.insert_future_reservation(P, Z, v4), "vmFamily", "only")


# ---------------------------------------------------------------------- start and end


def test_at_its_start_the_reservation_is_live_and_reservation_bound_vms_consume_it(
    cloud: SimulatedCloud,
) -> None:
    """At the start the block is FULFILLED with its auto-created reservation (PROVISIONING
    passes at once), which VMs with provisioningModel RESERVATION_BOUND and a specific affinity
    naming it consume, up to its count (CP FutureReservationStatus.autoCreatedReservations,
    Scheduling.ProvisioningModel.RESERVATION_BOUND;
    compute/docs/instances/future-reservations-calendar-mode-overview)."""
    start = START + 2 * DAY
    submit(cloud, gpu_block("b", 2, start))
    with pytest.raises(CloudError, match="does not exist"):
        cloud.insert_instance(P, Z, bound_vm("unknown", "other-r"))
    early = cloud.insert_instance(P, Z, bound_vm("early", "b-r"))  # there, but empty
    assert early["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    cloud.advance(start - cloud.clock.now() - timedelta(seconds=1))
    assert procurement(cloud, "b") == "APPROVED"  # never cancellable: no lockTime, no PROCURING
    (empty,) = cloud.list_reservations(P, Z)
    assert empty["specificReservation"]["assuredCount"] == "0"
    cloud.advance(timedelta(seconds=1))
    got = status(cloud, "b")
    assert got["procurementStatus"] == "FULFILLED"
    assert got["autoCreatedReservations"] == [
        f"https://www.googleapis.com/compute/v1/projects/{P}/zones/{Z}/reservations/b-r"
    ]
    assert cloud.stock(Z, SHAPE) == 2
    refused(
        lambda: cloud.insert_instance(P, Z, bound_vm("x", "b-r", bound=False)), "RESERVATION_BOUND"
    )
    for vm in ("vm-0", "vm-1"):
        cloud.insert_instance(P, Z, bound_vm(vm, "b-r"))
    full = cloud.insert_instance(P, Z, bound_vm("vm-2", "b-r"))
    assert full["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    reservation = cloud.get_reservation(P, Z, "b-r")["specificReservation"]
    assert (reservation["count"], reservation["inUseCount"]) == ("2", "2")
    cloud.advance(LATENCY)
    assert cloud.get_instance(P, Z, "vm-0")["status"] == "RUNNING"
    assert cloud.stock(Z, SHAPE) == 2  # the reservation's VMs take nothing more


def test_units_coming_back_before_a_window_are_offered_for_it(cloud: SimulatedCloud) -> None:
    """Google reviews a block against its own window: the units a running block gives back
    at its end are there for a block starting after it (CP FutureReservation.timeWindow;
    compute/docs/instances/future-reservations-calendar-mode-overview, "View resources future
    availability"). The memory fake counts them the same way."""
    start = START + 2 * DAY
    submit(cloud, gpu_block("now", 4, start))
    cloud.advance(start - cloud.clock.now())
    assert cloud.stock(Z, SHAPE) == 0
    submit(cloud, gpu_block("overlapping", 1, start + DAY))
    submit(cloud, gpu_block("after", 4, start + 2 * DAY))
    assert procurement(cloud, "overlapping") == "DECLINED"
    assert procurement(cloud, "after") == "APPROVED"


def test_at_its_end_the_vms_and_the_reservation_are_deleted_and_the_units_return(
    cloud: SimulatedCloud,
) -> None:
    """At the end of the reservation period Compute Engine deletes the auto-created
    reservation and the VMs consuming it; the future reservation stays FULFILLED until
    deleted (compute/docs/instances/future-reservations-calendar-mode-overview,
    "Auto-delete"; tpu/docs/calendar-mode-reservation)."""
    start = START + 2 * DAY
    submit(cloud, gpu_block("b", 2, start))
    cloud.advance(start - cloud.clock.now() + LATENCY)
    cloud.insert_instance(P, Z, bound_vm("vm-0", "b-r"))
    cloud.advance(2 * DAY - LATENCY - timedelta(seconds=1))
    assert [vm["name"] for vm in cloud.list_instances(P, Z)] == ["vm-0"]
    cloud.advance(timedelta(seconds=1))
    assert cloud.list_instances(P, Z) == []
    assert cloud.list_reservations(P, Z) == []
    assert cloud.stock(Z, SHAPE) == 4
    assert procurement(cloud, "b") == "FULFILLED"
    assert "autoCreatedReservations" not in status(cloud, "b")  # over: its reservation is gone


# ---------------------------------------------------------------------- TPU


def test_a_tpu_block_is_consumed_by_a_queued_resource_naming_its_reservation(
    cloud: SimulatedCloud,
) -> None:
    """A TPU block's chips are an aggregate reservation of its VM family; a queued resource
    naming reservationName projects/P/locations/Z/reservations/R, reservation-bound ("for
    future reservations created in calendar mode, you must also set the --provisioning-model
    flag to reservation-bound", tpu/docs/consume-reservation; gcloud's
    command_lib/compute/tpus/queued_resources/util.py sends provisioningModel
    RESERVATION_BOUND), takes them at once (ACTIVE after provisioning) if they are delivered
    and free, and fails otherwise; at the end the TPUs go with the reservation
    (tpu/docs/calendar-mode-reservation; tpu/docs/reference/rest/v2alpha1/
    projects.locations.queuedResources: reservationName, provisioningModel)."""
    start = START + 2 * DAY
    submit(cloud, tpu_block("t", 8, start))
    cloud.create_queued_resource(P, Z, "early", reserved_qr("t-r"), "v2alpha1")
    early = cloud.get_queued_resource(P, Z, "early")["state"]
    assert early["state"] == "FAILED"  # its reservation exists from approval, empty
    assert "0 delivered so far" in early["failedData"]["error"]["message"]
    cloud.advance(start - cloud.clock.now() + LATENCY)
    assert cloud.stock(Z, TPU) == 8
    aggregate = cloud.get_reservation(P, Z, "t-r")["aggregateReservation"]
    assert aggregate["vmFamily"] == TPU_VM_FAMILIES[TPU]
    chips = f"{COMPUTE}/projects/{P}/zones/{Z}/acceleratorTypes/{TPU_COMPUTE_ACCELERATORS[TPU]}"
    assert aggregate["reservedResources"] == [
        {"accelerator": {"acceleratorCount": 8, "acceleratorType": chips}}
    ]
    guaranteed = reserved_qr("t-r", guaranteed={"reserved": True})
    del guaranteed["provisioningModel"]
    for unbound in (guaranteed, reserved_qr("t-r", provisioningModel="STANDARD")):
        refused(
            lambda body=unbound: cloud.create_queued_resource(P, Z, "unbound", body, "v2alpha1"),
            "RESERVATION_BOUND",
        )
    cloud.create_queued_resource(P, Z, "qr", reserved_qr("t-r"), "v2alpha1")
    assert cloud.get_queued_resource(P, Z, "qr")["state"]["state"] == "PROVISIONING"
    cloud.create_queued_resource(P, Z, "more", reserved_qr("t-r", 4), "v2alpha1")
    more = cloud.get_queued_resource(P, Z, "more")["state"]
    assert more["state"] == "FAILED"
    assert "0 of 8 chips free" in more["failedData"]["error"]["message"]
    cloud.advance(LATENCY)
    assert cloud.get_queued_resource(P, Z, "qr")["state"]["state"] == "ACTIVE"
    in_use = cloud.get_reservation(P, Z, "t-r")["aggregateReservation"]["inUseResources"]
    assert in_use[0]["accelerator"]["acceleratorCount"] == 8
    assert cloud.stock(Z, TPU) == 8  # the queued resource took the reservation's chips
    cloud.advance(DAY)
    assert sorted(q["name"].rsplit("/", 1)[-1] for q in cloud.list_queued_resources(P, Z)) == [
        "early",
        "more",
    ]
    assert cloud.list_reservations(P, Z) == []
    assert cloud.stock(Z, TPU) == 16


# ---------------------------------------------------------------------- advice


def advice(
    cloud: SimulatedCloud, count: int, earliest: datetime, span: timedelta, **extra: Any
) -> list[JSON]:
    spec: JSON = {
        "deploymentType": "DENSE",
        "targetResources": {
            "specificSkuResources": {"instanceCount": str(count), "machineType": SHAPE}
        },
        "timeRangeSpec": {
            "startTimeNotEarlierThan": earliest.isoformat(),
            "minDuration": f"{int(span.total_seconds())}s",
            "maxDuration": f"{int(span.total_seconds())}s",
        },
        **extra,
    }
    answer = cloud.calendar_mode_advice(P, REGION, {"futureResourcesSpecs": {"spec": spec}})
    return [r["recommendationsPerSpec"]["spec"] for r in answer["recommendations"]]


def test_advice_recommends_the_earliest_start_when_the_capacity_is_free_now(
    cloud: SimulatedCloud,
) -> None:
    """Advice.CalendarMode answers when and where the spec's resources are available, up to
    the spec's maxDuration, in the allowed zones (CP service Advice,
    CalendarModeAdviceResponse; compute/docs/instances/future-reservations-calendar-mode-
    overview, "View resources future availability")."""
    cloud.set_stock(Z2, SHAPE, 1)
    earliest = START + 5 * DAY
    [recommendation] = advice(cloud, 3, earliest, 2 * DAY)
    assert recommendation["startTime"] == "2026-03-07T09:00:00.000000Z"
    assert recommendation["endTime"] == "2026-03-09T09:00:00.000000Z"
    assert recommendation["location"] == f"zones/{Z}"
    assert recommendation["otherLocations"] == {f"zones/{Z2}": {"status": "NO_CAPACITY"}}
    policy = {"locationPolicy": {"locations": {f"zones/{Z}": {"preference": "DENY"}}}}
    assert advice(cloud, 1, earliest, 2 * DAY, **policy)[0]["location"] == f"zones/{Z2}"


def test_advice_pushes_the_start_past_an_approved_overlapping_block(
    cloud: SimulatedCloud,
) -> None:
    """The advice and the review use one capacity model: units promised to an approved block
    are not recommended again before it ends (CP CalendarModeAdviceRequest
    timeRangeSpec.startTimeNotEarlierThan / NotLaterThan)."""
    start = START + 10 * DAY
    submit(cloud, gpu_block("held", 3, start))
    [recommendation] = advice(cloud, 2, start - DAY, 2 * DAY)
    assert datetime.fromisoformat(recommendation["startTime"]) == start + 2 * DAY
    submit(cloud, gpu_block("advised", 2, start + 2 * DAY))
    assert procurement(cloud, "advised") == "APPROVED"


def test_advice_has_no_recommendation_when_nothing_fits(cloud: SimulatedCloud) -> None:
    """No start in the range has the capacity: an empty list of recommendations (CP
    CalendarModeAdviceResponse.recommendations)."""
    start = START + 10 * DAY
    submit(cloud, gpu_block("held", 3, start, 30 * DAY))
    latest = {"startTimeNotLaterThan": (start + DAY).isoformat()}
    spec = {
        "targetResources": {"specificSkuResources": {"instanceCount": "2", "machineType": SHAPE}},
        "timeRangeSpec": {"startTimeNotEarlierThan": start.isoformat(), "maxDuration": "86400s"}
        | latest,
    }
    answer = cloud.calendar_mode_advice(P, REGION, {"futureResourcesSpecs": {"k": spec}})
    assert answer == {"recommendations": []}
    assert advice(cloud, GPU_MAX_VMS, START + DAY, DAY) == []
    refused(lambda: advice(cloud, GPU_MAX_VMS + 1, START + DAY, DAY), "instanceCount", "80")


def test_advice_for_tpu_chips_counts_the_vm_familys_pool(cloud: SimulatedCloud) -> None:
    """A TPU spec asks aggregateResources {acceleratorCount, vmFamily, workloadType}, counted
    in the pool of the family's TPU type; the start is at least a day ahead (CP
    FutureResourcesSpecAggregateResources; tpu/docs/calendar-mode-reservation)."""
    spec = {
        "targetResources": {
            "aggregateResources": {
                "acceleratorCount": "16",
                "vmFamily": TPU_VM_FAMILIES[TPU],
                "workloadType": "BATCH",
            }
        },
        "timeRangeSpec": {"minDuration": "86400s"},
    }
    answer = cloud.calendar_mode_advice(P, REGION, {"futureResourcesSpecs": {"tpu": spec}})
    [recommendation] = [r["recommendationsPerSpec"]["tpu"] for r in answer["recommendations"]]
    assert datetime.fromisoformat(recommendation["startTime"]) == START + lead_of(True).earliest


# ---------------------------------------------------------------------- settings


def test_the_review_delay_is_a_setting_kept_by_reset(cloud: SimulatedCloud) -> None:
    """The approval latency is not documented (CP FutureReservationStatus): the review delay
    is the world's setting, configuration that reset keeps like the provisioning latency."""
    cloud.set_review_delay(timedelta(hours=1))
    cloud.set_cancellation_rule(CancellationRule.NEVER)
    cloud.reset()
    assert cloud.review_delay == timedelta(hours=1)
    assert cloud.cancellation_rule is CancellationRule.NEVER
    assert cloud.state()["review_delay_seconds"] == 3600
    cloud.set_stock(Z, SHAPE, 1)
    submit(cloud, gpu_block("b", 1, START + 10 * DAY), reviewed=False)
    cloud.advance(timedelta(minutes=59))
    assert procurement(cloud, "b") == "PENDING_APPROVAL"
    cloud.advance(timedelta(minutes=1))
    assert procurement(cloud, "b") == "APPROVED"
    with pytest.raises(ValueError, match="review delay"):
        cloud.set_review_delay(timedelta(seconds=-1))


def test_an_approved_blocks_reservation_is_filled_from_its_start_possibly_later(
    cloud: SimulatedCloud,
) -> None:
    """ "Compute Engine automatically creates an empty reservation. Then, at your chosen start
    time, Compute Engine provisions the requested capacity into the auto-created reservation"
    (compute/docs/hpc/reserve-capacity-account-team), which takes a while (PROVISIONING:
    "fulfilledCount ... the fulfilled capacity so far. This is set during PROVISIONING state",
    CP FutureReservationStatus; FULFILLED "fulfilled completely"): until then nothing can
    consume it, VM or TPU, though it exists."""
    cloud.set_fill_delay(timedelta(minutes=5))
    start = START + 2 * DAY
    submit(cloud, gpu_block("b", 2, start))
    submit(cloud, tpu_block("t", 8, start))
    cloud.advance(start - cloud.clock.now())
    assert (procurement(cloud, "b"), status(cloud, "b")["fulfilledCount"]) == ("PROVISIONING", "0")
    assert cloud.stock(Z, SHAPE) == 2  # Google holds the units; the reservation is not filled
    assert cloud.get_reservation(P, Z, "b-r")["specificReservation"]["assuredCount"] == "0"
    vm = cloud.insert_instance(P, Z, bound_vm("vm-0", "b-r"))
    assert vm["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    cloud.create_queued_resource(P, Z, "qr-early", reserved_qr("t-r"), "v2alpha1")
    assert cloud.get_queued_resource(P, Z, "qr-early")["state"]["state"] == "FAILED"
    cloud.advance(timedelta(minutes=5) - timedelta(seconds=1))
    assert procurement(cloud, "b") == "PROVISIONING"
    cloud.advance(timedelta(seconds=1))
    assert (procurement(cloud, "b"), status(cloud, "b")["fulfilledCount"]) == ("FULFILLED", "2")
    assert cloud.get_reservation(P, Z, "b-r")["specificReservation"]["assuredCount"] == "2"
    assert "error" not in cloud.insert_instance(P, Z, bound_vm("vm-1", "b-r"))
    cloud.create_queued_resource(P, Z, "qr", reserved_qr("t-r"), "v2alpha1")
    assert cloud.get_queued_resource(P, Z, "qr")["state"]["state"] == "PROVISIONING"


def test_tpu_blocks_are_reserved_in_googles_zones_as_the_workload_type_each_serves(
    cloud: SimulatedCloud,
) -> None:
    """ "You can only reserve the following TPU versions in the specified zones": v6e in
    asia-northeast1-b, europe-west4-a, us-east5-a, us-east5-b; v5p in us-east5-a; v5e in
    europe-west4-b and us-west4-b (BATCH), us-south1-a (SERVING)
    (tpu/docs/calendar-mode-reservation, "Limitations"); "you can only reserve one, four, or
    eight TPUs v5e for serving (SERVING) workload types" (compute/docs/instances/
    create-future-reservations-calendar-mode). An accelerator type, if given, is a "Full or
    partial URL" (CP AllocationAggregateReservationReservedResourceInfoAccelerator): a bare
    name is malformed."""
    start = START + 10 * DAY
    cloud.set_stock("us-south1-a", "V5LITE_POD", 16)
    cloud.set_stock("us-west4-b", "V5LITE_POD", 16)

    def v5e(name: str, chips: int, workload: str) -> JSON:
        body = tpu_block(name, chips, start)
        body["aggregateReservation"]["vmFamily"] = TPU_VM_FAMILIES["V5LITE_POD"]
        body["aggregateReservation"]["workloadType"] = workload
        return body

    serving = "us-south1-a"
    refused(lambda: cloud.insert_future_reservation(P, serving, v5e("a", 8, "BATCH")),
            "workloadType", "SERVING")  # fmt: skip
    refused(lambda: cloud.insert_future_reservation(P, serving, v5e("b", 16, "SERVING")),
            "SERVING", "16")  # fmt: skip
    assert "error" not in cloud.insert_future_reservation(P, serving, v5e("c", 8, "SERVING"))
    refused(lambda: cloud.insert_future_reservation(P, "us-west4-b", v5e("d", 16, "SERVING")),
            "workloadType", "BATCH")  # fmt: skip
    assert "error" not in cloud.insert_future_reservation(P, "us-west4-b", v5e("e", 16, "BATCH"))
    refused(lambda: cloud.insert_future_reservation(P, "us-central1-a", tpu_block("f", 8, start)),
            "tpu-v6e", "us-central1-a")  # fmt: skip
    bare = tpu_block("g", 8, start)
    bare["aggregateReservation"]["reservedResources"][0]["accelerator"]["acceleratorType"] = "ct6e"
    refused(lambda: cloud.insert_future_reservation(P, Z, bare), "acceleratorType", "malformed")
    url = tpu_block("h", 8, start)
    url["aggregateReservation"]["reservedResources"][0]["accelerator"]["acceleratorType"] = (
        f"projects/{P}/zones/{Z}/acceleratorTypes/ct6e"
    )
    assert "error" not in cloud.insert_future_reservation(P, Z, url)
