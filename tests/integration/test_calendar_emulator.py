"""Calendar mode through the emulator, with the real google-cloud-compute clients
(FutureReservationsClient, ReservationsClient, InstancesClient, AdviceClient over REST) and
plain REST JSON for TPU v2alpha1 queued resources: what the clients send is accepted, what they
get back parses, and the review, lock time, cancellation rule, limits, start, end and advice
behave as Google documents them. Each docstring cites its page (see
../shared/GOOGLE-SEMANTICS.md, "Calendar mode"; CP = googleapis compute.proto; the simulated
cloud's own table is tests/unit/test_sim_calendar.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from emulators import ComputeEmulator, EmulatorAdmin
from opendws.catalog import TPU_VM_FAMILIES
from opendws.domain.calendar import GPU_MAX_VMS, CancellationRule, cancel_deadline, lead_of
from opendws.domain.model import CALENDAR_MAX_RUN
from opendws.sim.cloud import REVIEW_DELAY
from tests.integration import test_compute_emulator as base
from tests.integration.test_compute_emulator import LATENCY, PROJECT, ROOT, SHAPE, ZONE, unique

# The emulator fixtures of the Compute emulator's own tests: one emulator per module.
emulator = base.emulator
emu = base.emu

DAY = timedelta(days=1)
REGION = "us-central1"
ZONE_B = "us-central1-b"
TPU = "V6E"
# Where Google's calendar mode reserves v6e (tpu/docs/calendar-mode-reservation, "Limitations").
TPU_ZONE = "us-east5-a"


@dataclass(frozen=True)
class Calendar:
    futures: compute_v1.FutureReservationsClient
    reservations: compute_v1.ReservationsClient
    instances: compute_v1.InstancesClient
    advice: compute_v1.AdviceClient


@pytest.fixture
def cal(emu: ComputeEmulator) -> Calendar:
    """The calendar clients on the emulator, 4 A3 VMs in stock in ZONE and 16 v6e chips in
    TPU_ZONE."""
    emu.cloud.set_stock(ZONE, SHAPE, 4)
    emu.cloud.set_stock(TPU_ZONE, TPU, 16)
    settings: dict[str, Any] = {
        "client_options": {"api_endpoint": emu.endpoint},
        "credentials": AnonymousCredentials(),
        "transport": "rest",
    }
    return Calendar(
        futures=compute_v1.FutureReservationsClient(**settings),
        reservations=compute_v1.ReservationsClient(**settings),
        instances=compute_v1.InstancesClient(**settings),
        advice=compute_v1.AdviceClient(**settings),
    )


def now(emu: ComputeEmulator) -> datetime:
    return emu.cloud.clock.now()


def zulu(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def window(start: datetime, length: timedelta) -> compute_v1.FutureReservationTimeWindow:
    return compute_v1.FutureReservationTimeWindow(
        start_time=zulu(start), end_time=zulu(start + length)
    )


def gpu_block(
    name: str, count: int, start: datetime, length: timedelta = 2 * DAY, **fields: Any
) -> compute_v1.FutureReservation:
    """A GPU calendar block as the contract's insert has it (fields override)."""
    settings: dict[str, Any] = {
        "name": name,
        "reservation_mode": "CALENDAR",
        "deployment_type": "DENSE",
        "scheduling_type": "INDEPENDENT",
        "planning_status": "SUBMITTED",
        "specific_reservation_required": True,
        "auto_delete_auto_created_reservations": True,
        "reservation_name": name,
        "specific_sku_properties": compute_v1.FutureReservationSpecificSKUProperties(
            total_count=count,
            instance_properties=compute_v1.AllocationSpecificSKUAllocationReservedInstanceProperties(
                machine_type=SHAPE
            ),
        ),
        "time_window": window(start, length),
        **fields,
    }
    return compute_v1.FutureReservation(**settings)


def tpu_block(name: str, chips: int, start: datetime) -> compute_v1.FutureReservation:
    """A TPU calendar block: an aggregate reservation of the v6e VM family's chips, as gcloud
    sends it (no accelerator type: the family names the chip)."""
    accelerator = compute_v1.AllocationAggregateReservationReservedResourceInfoAccelerator(
        accelerator_count=chips
    )
    return compute_v1.FutureReservation(
        name=name,
        reservation_mode="CALENDAR",
        deployment_type="DENSE",
        planning_status="SUBMITTED",
        specific_reservation_required=True,
        auto_delete_auto_created_reservations=True,
        reservation_name=name,
        aggregate_reservation=compute_v1.AllocationAggregateReservation(
            vm_family=TPU_VM_FAMILIES[TPU],
            workload_type="BATCH",
            reserved_resources=[
                compute_v1.AllocationAggregateReservationReservedResourceInfo(
                    accelerator=accelerator
                )
            ],
        ),
        time_window=window(start, DAY),
    )


def insert(cal: Calendar, block: compute_v1.FutureReservation, zone: str = ZONE) -> None:
    cal.futures.insert(project=PROJECT, zone=zone, future_reservation_resource=block).result()


def get(cal: Calendar, name: str) -> compute_v1.FutureReservation:
    return cal.futures.get(project=PROJECT, zone=ZONE, future_reservation=name)


def procurement(cal: Calendar, name: str) -> str:
    return get(cal, name).status.procurement_status


def bound_vm(name: str, reservation: str) -> compute_v1.Instance:
    """A RESERVATION_BOUND VM with a specific affinity naming ``reservation``."""
    return compute_v1.Instance(
        name=name,
        machine_type=f"zones/{ZONE}/machineTypes/{SHAPE}",
        reservation_affinity=compute_v1.ReservationAffinity(
            consume_reservation_type="SPECIFIC_RESERVATION",
            key="compute.googleapis.com/reservation-name",
            values=[reservation],
        ),
        scheduling=compute_v1.Scheduling(
            provisioning_model="RESERVATION_BOUND", instance_termination_action="DELETE"
        ),
    )


def rest(emu: ComputeEmulator, method: str, path: str, body: object | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(emu.endpoint + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


# ---------------------------------------------------------------------- review


def test_a_block_is_pending_approval_then_approved_with_its_lock_time(
    emu: ComputeEmulator, cal: Calendar
) -> None:
    """The insert operation is DONE and the request PENDING_APPROVAL; after Google's review it
    is APPROVED with status.lockTime, its last moment of cancellation (CP
    FutureReservationStatus.procurementStatus, lockTime;
    compute/docs/instances/delete-future-reservations-calendar-mode)."""
    name, start = unique("block"), now(emu) + 40 * DAY
    insert(cal, gpu_block(name, 3, start))
    assert procurement(cal, name) == "PENDING_APPROVAL"
    approved_at = now(emu) + REVIEW_DELAY
    emu.cloud.advance(REVIEW_DELAY)
    status = get(cal, name).status
    assert status.procurement_status == "APPROVED"
    deadline = cancel_deadline(CancellationRule.WINDOWS, start=start, approved_at=approved_at)
    assert deadline is not None
    assert abs(datetime.fromisoformat(status.lock_time) - deadline) < timedelta(milliseconds=1)
    assert emu.cloud.stock(ZONE, SHAPE) == 4  # promised, not taken


def test_a_block_beyond_the_capacity_is_declined_and_may_be_deleted(
    emu: ComputeEmulator, cal: Calendar
) -> None:
    """Google declines a request it has no capacity for (units promised to an overlapping
    approved block count); a declined request may be deleted (CP ProcurementStatus.DECLINED;
    compute/docs/instances/delete-future-reservations-calendar-mode)."""
    first, second, start = unique("block"), unique("block"), now(emu) + 10 * DAY
    insert(cal, gpu_block(first, 3, start))
    insert(cal, gpu_block(second, 2, start + DAY))
    emu.cloud.advance(REVIEW_DELAY)
    assert (procurement(cal, first), procurement(cal, second)) == ("APPROVED", "DECLINED")
    cal.futures.delete(project=PROJECT, zone=ZONE, future_reservation=second).result()
    assert [f.name for f in cal.futures.list(project=PROJECT, zone=ZONE)] == [first]


def test_an_injected_error_fails_the_insert_operation_and_creates_nothing(
    emu: ComputeEmulator, cal: Calendar
) -> None:
    """An error injected for the key fails the insert operation itself (compute Operation
    error; CP FutureReservation)."""
    EmulatorAdmin(emu.endpoint).inject(ZONE, SHAPE, "error")
    name = unique("block")
    operation = cal.futures.insert(
        project=PROJECT, zone=ZONE, future_reservation_resource=gpu_block(name, 1, now(emu) + DAY)
    )
    assert operation.error.errors[0].code == "RESOURCE_OPERATION_RATE_EXCEEDED"
    with pytest.raises(exceptions.NotFound):
        get(cal, name)


# ---------------------------------------------------------------------- limits


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"reservation_mode": "DEFAULT"}, "reservationMode"),
        ({"deployment_type": "DEPLOYMENT_TYPE_UNSPECIFIED"}, "deploymentType"),
        ({"scheduling_type": "GROUP_MAINTENANCE_TYPE_UNSPECIFIED"}, "schedulingType"),
        ({"length": CALENDAR_MAX_RUN + DAY}, "timeWindow"),
        ({"ahead": lead_of(False).latest + DAY}, "timeWindow.startTime"),
        ({"count": GPU_MAX_VMS + 1}, "totalCount"),
    ],
)
def test_an_insert_beyond_the_limits_is_a_400_naming_the_field(
    emu: ComputeEmulator, cal: Calendar, fields: dict[str, Any], named: str
) -> None:
    """reservationMode CALENDAR, deploymentType DENSE, schedulingType GROUPED or INDEPENDENT,
    1 to 90 days, GPU VMs up to 60 days ahead, 1 to 80 VMs
    (compute/docs/instances/future-reservations-calendar-mode-overview;
    create-future-reservations-calendar-mode; CP FutureReservation enums)."""
    ahead, length = fields.pop("ahead", DAY), fields.pop("length", 2 * DAY)
    block = gpu_block(unique("block"), fields.pop("count", 1), now(emu) + ahead, length, **fields)
    with pytest.raises(exceptions.BadRequest, match=named):
        insert(cal, block)
    assert list(cal.futures.list(project=PROJECT, zone=ZONE)) == []


def test_a_tpu_block_starts_at_least_a_day_ahead(emu: ComputeEmulator, cal: Calendar) -> None:
    """TPUs are reserved 1 to 120 days in advance, GPU VMs from now on
    (tpu/docs/calendar-mode-reservation; compute/docs/instances/
    future-reservations-calendar-mode-overview)."""
    soon = now(emu) + lead_of(True).earliest - timedelta(hours=1)
    with pytest.raises(exceptions.BadRequest, match=r"timeWindow\.startTime"):
        insert(cal, tpu_block(unique("tpu"), 8, soon), TPU_ZONE)
    insert(cal, gpu_block(unique("gpu"), 1, soon))


# ---------------------------------------------------------------------- cancel and delete


def test_cancel_is_allowed_far_ahead_and_within_24_hours_of_approval(
    emu: ComputeEmulator, cal: Calendar
) -> None:
    """A block may be cancelled while its start is more than 30 days away, or within 24 hours
    after its approval while its start is at least 4 days away; it is then CANCELLED
    (compute/docs/instances/delete-future-reservations-calendar-mode)."""
    far, near = unique("far"), unique("near")
    insert(cal, gpu_block(far, 2, now(emu) + 40 * DAY))
    insert(cal, gpu_block(near, 2, now(emu) + 10 * DAY))
    emu.cloud.advance(REVIEW_DELAY + timedelta(hours=23))
    for name in (far, near):
        cal.futures.cancel(project=PROJECT, zone=ZONE, future_reservation=name).result()
        assert procurement(cal, name) == "CANCELLED"
        cal.futures.delete(project=PROJECT, zone=ZONE, future_reservation=name).result()


def test_a_refused_cancel_is_a_400_and_changes_nothing(emu: ComputeEmulator, cal: Calendar) -> None:
    """More than 24 hours after approval and within 30 days of its start a block cannot be
    cancelled: 400 "Future reservation NAME cannot be cancelled: ..." and nothing changes
    (compute/docs/instances/delete-future-reservations-calendar-mode)."""
    name = unique("block")
    insert(cal, gpu_block(name, 2, now(emu) + 10 * DAY))
    emu.cloud.advance(REVIEW_DELAY + 2 * DAY)
    before = EmulatorAdmin(emu.endpoint).state()
    with pytest.raises(exceptions.BadRequest, match=f"Future reservation {name} cannot be"):
        cal.futures.cancel(project=PROJECT, zone=ZONE, future_reservation=name)
    assert EmulatorAdmin(emu.endpoint).state() == before
    assert procurement(cal, name) == "PROCURING"


def test_under_the_never_rule_set_by_the_admin_api_nothing_approved_is_cancelled(
    emu: ComputeEmulator, cal: Calendar
) -> None:
    """Older Compute pages and the TPU page: a submitted request cannot be cancelled; the
    rule and the review delay are settings of the emulator (POST /admin/calendar)
    (tpu/docs/calendar-mode-reservation, "Limitations")."""
    admin = EmulatorAdmin(emu.endpoint)
    settings = admin.set_calendar(
        review_delay=timedelta(minutes=10), fill_delay=timedelta(hours=3), cancellation_rule="never"
    )
    assert settings == {
        "reviewDelaySeconds": 600, "fillDelaySeconds": 10800, "cancellationRule": "never"
    }  # fmt: skip
    name = unique("block")
    insert(cal, gpu_block(name, 1, now(emu) + 50 * DAY))
    emu.cloud.advance(timedelta(minutes=9))
    assert procurement(cal, name) == "PENDING_APPROVAL"
    emu.cloud.advance(timedelta(minutes=1))
    got = get(cal, name)
    assert got.status.procurement_status == "APPROVED"
    assert not got.status.lock_time
    with pytest.raises(exceptions.BadRequest, match="does not allow"):
        cal.futures.cancel(project=PROJECT, zone=ZONE, future_reservation=name)
    assert rest(emu, "GET", "/admin/calendar")["cancellationRule"] == "never"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"reviewDelaySeconds": -1}, "reviewDelaySeconds"),
        ({"reviewDelaySeconds": "soon"}, "reviewDelaySeconds"),
        ({"fillDelaySeconds": -5}, "fillDelaySeconds"),
        ({"cancellationRule": "sometimes"}, "cancellation rule"),
    ],
)
def test_bad_calendar_settings_are_a_400(
    emu: ComputeEmulator, body: dict[str, object], message: str
) -> None:
    """The admin API refuses settings it cannot apply, saying which."""
    with pytest.raises(urllib.error.HTTPError) as raised:
        rest(emu, "POST", "/admin/calendar", body)
    assert raised.value.code == 400
    assert message in json.loads(raised.value.read())["error"]["message"]


def test_delete_is_refused_until_the_end_then_allowed(emu: ComputeEmulator, cal: Calendar) -> None:
    """A future reservation is deleted only after it was cancelled or after its end; before,
    delete is a 400 (compute/docs/instances/delete-future-reservations-calendar-mode)."""
    name, start = unique("block"), now(emu) + DAY
    insert(cal, gpu_block(name, 1, start))
    emu.cloud.advance(REVIEW_DELAY)
    with pytest.raises(exceptions.BadRequest, match="cannot be deleted"):
        cal.futures.delete(project=PROJECT, zone=ZONE, future_reservation=name)
    emu.cloud.advance(start - now(emu) + 2 * DAY)
    assert procurement(cal, name) == "FULFILLED"
    cal.futures.delete(project=PROJECT, zone=ZONE, future_reservation=name).result()
    assert list(cal.futures.list(project=PROJECT, zone=ZONE)) == []


# ---------------------------------------------------------------------- start and end


def test_at_its_start_reservation_bound_vms_consume_it_and_at_its_end_they_go(
    emu: ComputeEmulator, cal: Calendar
) -> None:
    """The auto-created reservation exists from approval, empty ("Compute Engine
    automatically creates an empty reservation", compute/docs/hpc/reserve-capacity-account-team):
    a VM consuming it before it is filled fails for want of capacity. Filled at the start
    (FULFILLED, status.autoCreatedReservations), RESERVATION_BOUND VMs with a specific
    affinity consume it; at the end Compute Engine deletes it and the VMs consuming it, and
    the request stays FULFILLED (compute/docs/instances/future-reservations-calendar-mode-overview;
    CP FutureReservationStatus, Scheduling.provisioningModel RESERVATION_BOUND)."""
    name, start = unique("block"), now(emu) + DAY
    insert(cal, gpu_block(name, 2, start))
    emu.cloud.advance(start - now(emu) - timedelta(seconds=1))
    early = cal.instances.insert(project=PROJECT, zone=ZONE, instance_resource=bound_vm("e", name))
    with pytest.raises(exceptions.ServiceUnavailable, match="no free capacity"):
        early.result()
    emu.cloud.advance(timedelta(seconds=1))
    status = get(cal, name).status
    assert status.procurement_status == "FULFILLED"
    assert status.auto_created_reservations[0].endswith(f"/zones/{ZONE}/reservations/{name}")
    assert status.fulfilled_count == 2
    vms = [unique("vm"), unique("vm")]
    for vm in vms:
        cal.instances.insert(
            project=PROJECT, zone=ZONE, instance_resource=bound_vm(vm, name)
        ).result()
    reservation = cal.reservations.get(project=PROJECT, zone=ZONE, reservation=name)
    assert (
        reservation.specific_reservation.count,
        reservation.specific_reservation.in_use_count,
    ) == (2, 2)
    assert [r.name for r in cal.reservations.list(project=PROJECT, zone=ZONE)] == [name]
    emu.cloud.advance(LATENCY)
    assert cal.instances.get(project=PROJECT, zone=ZONE, instance=vms[0]).status == "RUNNING"
    emu.cloud.advance(2 * DAY)
    assert list(cal.instances.list(project=PROJECT, zone=ZONE)) == []
    with pytest.raises(exceptions.NotFound):
        cal.reservations.get(project=PROJECT, zone=ZONE, reservation=name)
    status = get(cal, name).status
    assert status.procurement_status == "FULFILLED"
    assert list(status.auto_created_reservations) == []  # over: Google deleted it
    assert emu.cloud.stock(ZONE, SHAPE) == 4


def test_a_tpu_block_is_consumed_by_a_v2alpha1_queued_resource_naming_its_reservation(
    emu: ComputeEmulator, cal: Calendar
) -> None:
    """A TPU calendar block (an aggregate reservation of its VM family) is consumed by a
    queued resource with reservationName projects/P/locations/Z/reservations/R that is
    reservation-bound ("for future reservations created in calendar mode, you must also set
    the --provisioning-model flag to reservation-bound", tpu/docs/consume-reservation; gcloud
    sends provisioningModel RESERVATION_BOUND); guaranteed.reserved alone is refused. At the
    end the TPUs are deleted with the reservation (tpu/docs/calendar-mode-reservation;
    tpu/docs/reference/rest/v2alpha1/projects.locations.queuedResources)."""
    name, start = unique("tpu"), now(emu) + lead_of(True).earliest
    insert(cal, tpu_block(name, 8, start), TPU_ZONE)
    emu.cloud.advance(start - now(emu) + LATENCY)
    reservation = cal.reservations.get(project=PROJECT, zone=TPU_ZONE, reservation=name)
    accelerator = reservation.aggregate_reservation.reserved_resources[0].accelerator
    assert accelerator.accelerator_count == 8
    assert accelerator.accelerator_type.endswith(f"/zones/{TPU_ZONE}/acceleratorTypes/ct6e")
    base_path = f"/v2alpha1/projects/{PROJECT}/locations/{TPU_ZONE}"
    unbound = {
        "tpu": {"nodeSpec": [{"parent": f"projects/{PROJECT}/locations/{TPU_ZONE}",
                              "nodeId": "n",
                              "node": {"acceleratorType": "v6e-8",
                                       "runtimeVersion": "v2-alpha-tpuv6e"}}]},
        "reservationName": f"projects/{PROJECT}/locations/{TPU_ZONE}/reservations/{name}",
        "guaranteed": {"reserved": True},
    }  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as refused:
        rest(emu, "POST", f"{base_path}/queuedResources?queuedResourceId=unbound", unbound)
    assert refused.value.code == 400
    assert "RESERVATION_BOUND" in refused.value.read().decode()
    body = {**unbound, "provisioningModel": "RESERVATION_BOUND"}
    del body["guaranteed"]
    operation = rest(emu, "POST", f"{base_path}/queuedResources?queuedResourceId=qr", body)
    assert operation["response"]["state"] == {"state": "PROVISIONING"}
    emu.cloud.advance(LATENCY)
    assert rest(emu, "GET", f"{base_path}/queuedResources/qr")["state"] == {"state": "ACTIVE"}
    in_use = cal.reservations.get(project=PROJECT, zone=TPU_ZONE, reservation=name)
    assert in_use.aggregate_reservation.in_use_resources[0].accelerator.accelerator_count == 8
    assert emu.cloud.stock(TPU_ZONE, TPU) == 8
    emu.cloud.advance(DAY)
    assert rest(emu, "GET", f"{base_path}/queuedResources") == {"queuedResources": []}
    assert emu.cloud.stock(TPU_ZONE, TPU) == 16


# ---------------------------------------------------------------------- advice


def advise(
    cal: Calendar, count: int, earliest: datetime, span: timedelta, latest: datetime | None = None
) -> list[compute_v1.FutureResourcesRecommendation]:
    """AdviceClient.calendar_mode for ``count`` A3 VMs in the region's two zones."""
    time_range = compute_v1.FlexibleTimeRange(
        start_time_not_earlier_than=zulu(earliest),
        min_duration=f"{int(span.total_seconds())}s",
        max_duration=f"{int(span.total_seconds())}s",
    )
    if latest is not None:
        time_range.start_time_not_later_than = zulu(latest)
    allow = compute_v1.FutureResourcesSpecLocationPolicyLocation(preference="ALLOW")
    spec = compute_v1.FutureResourcesSpec(
        deployment_type="DENSE",
        location_policy=compute_v1.FutureResourcesSpecLocationPolicy(
            locations={f"zones/{ZONE}": allow, f"zones/{ZONE_B}": allow}
        ),
        target_resources=compute_v1.FutureResourcesSpecTargetResources(
            specific_sku_resources=compute_v1.FutureResourcesSpecSpecificSKUResources(
                instance_count=count, machine_type=SHAPE
            )
        ),
        time_range_spec=time_range,
    )
    answer = cal.advice.calendar_mode(
        project=PROJECT,
        region=REGION,
        calendar_mode_advice_request_resource=compute_v1.CalendarModeAdviceRequest(
            future_resources_specs={"spec": spec}
        ),
    )
    return [r.recommendations_per_spec["spec"] for r in answer.recommendations]


def test_advice_recommends_the_earliest_start_where_the_capacity_is_free_now(
    emu: ComputeEmulator, cal: Calendar
) -> None:
    """Advice.CalendarMode recommends a start, an end (start + maxDuration) and a zone, and
    says of the other zones whether they are recommended or lack capacity (CP service Advice,
    FutureResourcesRecommendation, OtherLocation.Status; compute/docs/instances/
    future-reservations-calendar-mode-overview, "View resources future availability")."""
    emu.cloud.set_stock(ZONE_B, SHAPE, 1)
    earliest = now(emu) + 5 * DAY
    [recommendation] = advise(cal, 3, earliest, 2 * DAY)
    assert datetime.fromisoformat(recommendation.start_time) == earliest
    assert datetime.fromisoformat(recommendation.end_time) == earliest + 2 * DAY
    assert recommendation.location == f"zones/{ZONE}"
    assert recommendation.other_locations[f"zones/{ZONE_B}"].status == "NO_CAPACITY"


def test_advice_pushes_the_start_past_an_approved_overlapping_block(
    emu: ComputeEmulator, cal: Calendar
) -> None:
    """The advice comes from the capacity model the review uses: after an approved block
    takes most of the zone, the next start it recommends is that block's end, and a request
    for it is approved (CP CalendarModeAdviceRequest, FlexibleTimeRange)."""
    held, start = unique("held"), now(emu) + 10 * DAY
    insert(cal, gpu_block(held, 3, start))
    emu.cloud.advance(REVIEW_DELAY)
    [recommendation] = advise(cal, 2, start - DAY, 2 * DAY)
    advised = datetime.fromisoformat(recommendation.start_time)
    assert advised == start + 2 * DAY
    follow = unique("advised")
    insert(cal, gpu_block(follow, 2, advised))
    emu.cloud.advance(REVIEW_DELAY)
    assert procurement(cal, follow) == "APPROVED"


def test_advice_has_no_recommendation_when_nothing_fits(
    emu: ComputeEmulator, cal: Calendar
) -> None:
    """No start in [startTimeNotEarlierThan, startTimeNotLaterThan] has the capacity: no
    recommendations (CP CalendarModeAdviceResponse.recommendations)."""
    held, start = unique("held"), now(emu) + 10 * DAY
    insert(cal, gpu_block(held, 4, start, 30 * DAY))
    emu.cloud.advance(REVIEW_DELAY)
    assert advise(cal, 1, start, DAY, latest=start + 5 * DAY) == []
    with pytest.raises(exceptions.BadRequest, match="instanceCount"):
        advise(cal, GPU_MAX_VMS + 1, start, DAY)


# ---------------------------------------------------------------------- standalone


def test_the_standalone_server_takes_the_calendar_settings_as_flags() -> None:
    """``--review-delay`` and ``--cancellation-rule`` set the calendar settings of a
    standalone emulator (GET /admin/calendar shows them)."""
    command = [sys.executable, "-m", "emulators.compute", "--review-delay", "30",
               "--fill-delay", "300", "--cancellation-rule", "never"]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "shared")])}
    server = subprocess.Popen(
        command, cwd=ROOT, env=environment, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        endpoint = server.stdout.readline().strip().partition("=")[2]
        with urllib.request.urlopen(endpoint + "/admin/calendar", timeout=10) as reply:
            settings = json.loads(reply.read())
        assert settings == {
            "reviewDelaySeconds": 30, "fillDelaySeconds": 300, "cancellationRule": "never"
        }  # fmt: skip
        os.killpg(server.pid, signal.SIGTERM)
        assert server.wait(15) == 0
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(15)
