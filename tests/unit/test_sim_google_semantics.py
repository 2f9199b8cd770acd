"""Google's documented behaviours, one table row each, on the simulated cloud directly. Every
row's docstring names the page or pinned file it comes from (see ../shared/GOOGLE-SEMANTICS.md:
CP = googleapis compute.proto @ f8291d2b, MM = magic-modules @ d5778440, TPU-α = the tpu
v2alpha1 discovery document)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from opendws.clock import ManualClock
from opendws.sim import CloudError, SimulatedCloud
from opendws.sim.cloud import RETRY_AFTER

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
LATENCY = timedelta(seconds=20)
P, Z, SHAPE = "proj", "us-central1-a", "a3-highgpu-8g"
HOUR = 3600


def world(stock: int = 0, *, mode: str | None = None) -> SimulatedCloud:
    cloud = SimulatedCloud(
        ManualClock(START), provisioning_latency=LATENCY, operation_latency=timedelta(0)
    )
    cloud.insert_instance_template(P, {"name": "tpl", "properties": {"machineType": SHAPE}})
    mig: dict[str, object] = {"name": "mig", "instanceTemplate": "global/instanceTemplates/tpl"}
    if mode is not None:
        mig["targetSizePolicy"] = {"mode": mode}
    cloud.insert_instance_group_manager(P, Z, mig)
    cloud.set_stock(Z, SHAPE, stock)
    return cloud


def resize(cloud: SimulatedCloud, name: str, vms: int, seconds: int = HOUR) -> None:
    body = {
        "name": name,
        "instances": [{"name": f"{name}-{i}"} for i in range(vms)],
        "requestedRunDuration": {"seconds": str(seconds)},
    }
    cloud.insert_resize_request(P, Z, "mig", body, "beta")  # named VMs: beta only


def rr(cloud: SimulatedCloud, name: str) -> dict[str, object]:
    return cloud.get_resize_request(P, Z, "mig", name)


def state(cloud: SimulatedCloud, name: str) -> object:
    return rr(cloud, name)["state"]


def refused(call: Callable[[], object], match: str) -> None:
    with pytest.raises(CloudError, match=match) as raised:
        call()
    assert raised.value.http_status == 400


# ---------------------------------------------------------------------- MIGs and resize requests


def bulk_mig_refuses_a_resize_request() -> None:
    """A MIG in bulk mode can be created but does not support resize requests
    (compute/docs/instance-groups/about-bulk-mode, "Features not supported")."""
    cloud = world(4, mode="BULK")
    refused(lambda: resize(cloud, "rr", 1), "BULK")
    assert cloud.created("resizeRequests") == {}


def bulk_mode_cannot_be_changed() -> None:
    """ "You can't change the target size policy mode in an existing MIG"
    (compute/docs/instance-groups/about-bulk-mode); the view carries targetSizePolicy
    (CP InstanceGroupManager.target_size_policy)."""
    cloud = world(mode="BULK")
    assert cloud.get_instance_group_manager(P, Z, "mig")["targetSizePolicy"] == {"mode": "BULK"}
    patch = {"targetSizePolicy": {"mode": "INDIVIDUAL"}}
    refused(lambda: cloud.patch_instance_group_manager(P, Z, "mig", patch), "cannot be changed")
    cloud.patch_instance_group_manager(P, Z, "mig", {"description": "same mode"})
    assert world().get_instance_group_manager(P, Z, "mig")["targetSizePolicy"] == {
        "mode": "INDIVIDUAL"
    }


def stockout_waits_accepted_with_last_attempt_then_succeeds() -> None:
    """A request without capacity stays ACCEPTED ("the MIG schedules VM creation as soon as
    resources are available", about-resize-requests-mig); the attempt's temporary error is in
    status.lastAttempt.error.errors[], cleared at the final state; status.error is only for
    FAILED (CP InstanceGroupManagerResizeRequestStatus{,LastAttempt}; MM ResizeRequest.yaml)."""
    cloud = world(1)
    resize(cloud, "rr", 2)
    cloud.advance(timedelta(days=3))
    status = rr(cloud, "rr")["status"]
    assert state(cloud, "rr") == "ACCEPTED"
    assert isinstance(status, dict)
    assert "error" not in status
    assert status["lastAttempt"]["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    cloud.set_stock(Z, SHAPE, 2)
    assert state(cloud, "rr") == "SUCCEEDED"
    assert rr(cloud, "rr")["status"] == {}
    assert cloud.stock(Z, SHAPE) == 0


def requested_run_duration_is_600_s_to_7_days() -> None:
    """requestedRunDuration "must be from 600 to 604800 inclusive" (MM ResizeRequest.yaml;
    about-resize-requests-mig: between 10 minutes and 7 days)."""
    cloud = world()
    refused(lambda: resize(cloud, "short", 1, seconds=599), "between 600s and 604800s")
    refused(lambda: resize(cloud, "long", 1, seconds=604_801), "between 600s and 604800s")
    resize(cloud, "min", 1, seconds=600)
    resize(cloud, "max", 1, seconds=604_800)


def resize_by_and_instances_are_mutually_exclusive() -> None:
    """resize_by "cannot be used together with 'instances'" (CP
    InstanceGroupManagerResizeRequest)."""
    cloud = world()
    body = {"name": "rr", "resizeBy": 1, "instances": [{"name": "a"}]}
    refused(lambda: cloud.insert_resize_request(P, Z, "mig", body, "beta"), "mutually exclusive")


def named_vms_are_taken_on_beta_only() -> None:
    """A resize request's named VMs (``instances``) are a Preview field
    (compute/docs/instance-groups/about-resize-requests-mig) that cluster-toolkit sends through
    the beta API (CT ``slurm_files/scripts/util.py`` ``compute_service(version="beta")``); GA
    Terraform sends only ``resizeBy`` (MM ``ResizeRequest.yaml``). On v1 they are refused and
    nothing is queued; v1 takes ``resizeBy``."""
    cloud = world(stock=2)
    body = {"name": "rr", "instances": [{"name": "a"}], "requestedRunDuration": "3600s"}
    refused(lambda: cloud.insert_resize_request(P, Z, "mig", body, "v1"), "Preview")
    assert cloud.created("resizeRequests") == {}
    by_count = {"name": "by-count", "resizeBy": 1, "requestedRunDuration": "3600s"}
    cloud.insert_resize_request(P, Z, "mig", by_count, "v1")
    cloud.insert_resize_request(P, Z, "mig", body, "beta")
    cloud.advance(LATENCY)
    assert "a" in [vm["name"] for vm in cloud.list_managed_instances(P, Z, "mig")]


def served_first_come_first_served_and_a_head_blocks() -> None:
    """Waiting requests are served as capacity frees, first come first served, per zone and
    machine type (about-resize-requests-mig: DWS schedules requests "based on requested
    durations and resource availability"). Our rule: a head that does not fit blocks the
    requests behind it (no overtaking, nothing starves)."""
    cloud = world(0)
    resize(cloud, "first", 2)
    cloud.advance(timedelta(seconds=1))
    resize(cloud, "second", 1)
    cloud.advance(LATENCY)
    cloud.set_stock(Z, SHAPE, 1)
    assert (state(cloud, "first"), state(cloud, "second")) == ("ACCEPTED", "ACCEPTED")
    cloud.set_stock(Z, SHAPE, 3)
    assert (state(cloud, "first"), state(cloud, "second")) == ("SUCCEEDED", "SUCCEEDED")


def shorter_requested_run_durations_are_served_sooner() -> None:
    """ "Shorter requests are typically fulfilled more quickly" (about-resize-requests-mig);
    our rule: order by creation + run duration / 24, so a 1-hour request made a minute later
    goes before a 7-day one."""
    cloud = world(0)
    resize(cloud, "week", 1, seconds=604_800)
    cloud.advance(timedelta(minutes=1))
    resize(cloud, "hour", 1, seconds=HOUR)
    cloud.advance(LATENCY)
    cloud.set_stock(Z, SHAPE, 1)
    assert (state(cloud, "week"), state(cloud, "hour")) == ("ACCEPTED", "SUCCEEDED")


def never_served_before_creation_plus_latency() -> None:
    """Served no sooner than creation + the provisioning latency (CP State.CREATING →
    ACCEPTED: the request is created, then queued)."""
    cloud = world(4)
    resize(cloud, "rr", 1)
    cloud.advance(LATENCY - timedelta(seconds=1))
    assert state(cloud, "rr") == "ACCEPTED"
    cloud.advance(timedelta(seconds=1))
    assert state(cloud, "rr") == "SUCCEEDED"


def cancel_only_accepted_delete_only_inactive() -> None:
    """ "Cancel is only possible for requests that are accepted in the queue"; "deletes the
    specified, inactive resize request. Requests that are still active cannot be deleted"
    (CP service InstanceGroupManagerResizeRequests); Terraform cancels, waits, then deletes
    (MM custom_delete/compute_mig_resize_request_delete.go.tmpl)."""
    cloud = world(0)
    resize(cloud, "rr", 1)
    refused(lambda: cloud.delete_resize_request(P, Z, "mig", "rr"), "cancel it before")
    assert cloud.cancel_resize_request(P, Z, "mig", "rr")["status"] == "DONE"
    assert state(cloud, "rr") == "CANCELLED"
    refused(lambda: cloud.cancel_resize_request(P, Z, "mig", "rr"), "no longer be cancelled")
    cloud.set_stock(Z, SHAPE, 1)
    assert cloud.stock(Z, SHAPE) == 1  # a cancelled request is out of the queue
    cloud.delete_resize_request(P, Z, "mig", "rr")


def deleting_a_request_keeps_its_vms() -> None:
    """ "Deleting request does not delete instances that were provisioned previously" (CP
    InstanceGroupManagerResizeRequests.Delete); a SUCCEEDED request cannot be cancelled."""
    cloud = world(2)
    resize(cloud, "rr", 2)
    cloud.advance(LATENCY)
    refused(lambda: cloud.cancel_resize_request(P, Z, "mig", "rr"), "no longer be cancelled")
    cloud.delete_resize_request(P, Z, "mig", "rr")
    assert [vm["name"] for vm in cloud.list_managed_instances(P, Z, "mig")] == ["rr-0", "rr-1"]
    assert cloud.stock(Z, SHAPE) == 0


def a_fatal_failure_rolls_back_its_vms() -> None:
    """FAILED: "if the request fails during provisioning, any VMs that were created during
    provisioning are rolled back and removed from the MIG" (CP
    InstanceGroupManagerResizeRequest.State.FAILED); status.error is final."""
    cloud = world(4)
    cloud.inject(Z, SHAPE, "error")
    resize(cloud, "rr", 2)
    cloud.advance(LATENCY)
    assert state(cloud, "rr") == "FAILED"
    status = rr(cloud, "rr")["status"]
    assert isinstance(status, dict)
    assert "lastAttempt" not in status
    assert status["error"]["errors"][0]["code"] == "RESOURCE_OPERATION_RATE_EXCEEDED"
    assert cloud.created("instances") == {"rr-0": 1, "rr-1": 1}  # made, then rolled back
    assert cloud.list_managed_instances(P, Z, "mig") == []
    assert cloud.stock(Z, SHAPE) == 4


def an_injected_stockout_is_one_failed_attempt() -> None:
    """Injections fit the queue model: ``stockout`` fails one attempt (the temporary error in
    lastAttempt, tried again after RETRY_AFTER), ``hang`` is never served (CP lastAttempt:
    "the ResizeRequest can retry, as long as it's still active")."""
    cloud = world(4)
    cloud.inject(Z, SHAPE, "stockout")
    resize(cloud, "rr", 1)
    cloud.advance(LATENCY)
    assert state(cloud, "rr") == "ACCEPTED"
    cloud.advance(RETRY_AFTER)
    assert state(cloud, "rr") == "SUCCEEDED"
    cloud.inject(Z, SHAPE, "hang")
    resize(cloud, "stuck", 1)
    cloud.advance(timedelta(days=2))
    assert state(cloud, "stuck") == "ACCEPTED"


# ---------------------------------------------------------------------- flex-start VMs


def flex_vm(
    cloud: SimulatedCloud, name: str, valid_for: str = "600s", run: str = "3600s"
) -> dict[str, Any]:
    body = {
        "name": name,
        "machineType": f"zones/{Z}/machineTypes/{SHAPE}",
        "scheduling": {
            "provisioningModel": "FLEX_START",
            "maxRunDuration": run,
            "instanceTerminationAction": "DELETE",
        },
        "params": {"requestValidForDuration": valid_for},
    }
    return cloud.insert_instance(P, Z, body)


def flex_vm_waits_pending_and_its_creation_fails_at_its_deadline() -> None:
    """A flex-start VM is PENDING "waiting for available capacity from DWS" (CP
    Instance.Status.PENDING); "if resources aren't available, then the VM creation request
    fails" at the end of requestValidForDuration (compute/docs/instances/about-flex-start-vms;
    CP InstanceParams): the VM is gone, its insert operation DONE with the error."""
    cloud = world(0)
    operation = flex_vm(cloud, "vm", valid_for="600s")
    assert operation["status"] == "RUNNING"
    cloud.advance(timedelta(minutes=5))
    assert cloud.get_instance(P, Z, "vm")["status"] == "PENDING"
    cloud.advance(timedelta(minutes=5))
    with pytest.raises(CloudError):
        cloud.get_instance(P, Z, "vm")
    done = cloud.get_operation(P, Z, operation["name"])
    assert done["status"] == "DONE"
    assert done["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"


def flex_vm_served_runs_and_is_deleted_at_max_run_duration() -> None:
    """Served from the same queue as resize requests, it runs for maxRunDuration, then its
    termination action DELETE runs (about-flex-start-vms, "limited run duration"; CP
    Scheduling.max_run_duration)."""
    cloud = world(0)
    operation = flex_vm(cloud, "vm", run="3600s")
    cloud.advance(timedelta(minutes=2))
    cloud.set_stock(Z, SHAPE, 1)
    assert cloud.get_instance(P, Z, "vm")["status"] == "RUNNING"
    assert cloud.get_operation(P, Z, operation["name"])["status"] == "DONE"
    assert cloud.stock(Z, SHAPE) == 0
    cloud.advance(timedelta(hours=1))
    assert cloud.list_instances(P, Z) == []
    assert cloud.stock(Z, SHAPE) == 1


def flex_vm_durations_are_bounded() -> None:
    """maxRunDuration 10 min .. 7 d; requestValidForDuration 90 s .. 2 h, or 0 s = only if
    available now (about-flex-start-vms; GOOGLE-SEMANTICS flex-start row)."""
    cloud = world(0)
    refused(lambda: flex_vm(cloud, "a", valid_for="89s"), "requestValidForDuration")
    refused(lambda: flex_vm(cloud, "b", valid_for="7201s"), "requestValidForDuration")
    refused(lambda: flex_vm(cloud, "c", run="599s"), "maxRunDuration")
    flex_vm(cloud, "now-or-never", valid_for="0s")
    cloud.advance(LATENCY)
    assert cloud.list_instances(P, Z) == []  # nothing free at its one attempt


def request_valid_for_under_scheduling_is_an_unknown_field() -> None:
    """requestValidForDuration belongs to InstanceParams; Scheduling has no such field (CP
    Scheduling, InstanceParams), and Google's REST front end refuses unknown names (400)."""
    cloud = world(1)
    body = {
        "name": "vm",
        "machineType": SHAPE,
        "scheduling": {"provisioningModel": "FLEX_START", "requestValidForDuration": "600s"},
    }
    refused(lambda: cloud.insert_instance(P, Z, body), "Unknown name")


# ---------------------------------------------------------------------- TPU queued resources


def qr_body(accelerator: str = "v6e-8", **extra: object) -> dict[str, object]:
    return {"tpu": {"nodeSpec": [{"node": {"acceleratorType": accelerator}}]}, **extra}


def tpu_waits_then_fails_after_valid_until_and_stays_listed() -> None:
    """A queued resource waits in WAITING_FOR_RESOURCES (it replaced ACCEPTED); when its
    valid-until passes it goes FAILED; "the request remains in the queue until it is explicitly
    deleted" (tpu/docs/queued-resources). Guaranteed and spot wait too: a stockout is not a
    failure."""
    cloud = world()
    cloud.set_stock("z", "V6E", 4)
    body = qr_body(guaranteed={}, queueingPolicy={"validUntilDuration": "3600s"})
    cloud.create_queued_resource(P, "z", "qr", body)
    cloud.advance(timedelta(minutes=30))
    assert cloud.get_queued_resource(P, "z", "qr")["state"]["state"] == "WAITING_FOR_RESOURCES"
    cloud.advance(timedelta(minutes=30))
    got = cloud.get_queued_resource(P, "z", "qr")["state"]
    assert got["state"] == "FAILED"
    assert got["failedData"]["error"]["code"] == 4
    assert [q["name"].rsplit("/", 1)[-1] for q in cloud.list_queued_resources(P, "z")] == ["qr"]
    cloud.set_stock("z", "V6E", 8)
    assert cloud.get_queued_resource(P, "z", "qr")["state"]["state"] == "FAILED"


def tpu_flex_start_runs_its_duration_then_is_suspended() -> None:
    """v2alpha1 provisioningModel=FLEX_START with runDuration.maxRunDuration (TPU-α;
    tpu/docs/request-using-flex-start: the TPU VMs run "for the duration that you specified");
    at its end the resources are deleted: SUSPENDED ("the resources specified in the request
    have been deleted", tpu/docs/queued-resources), initiated by the service."""
    cloud = world()
    cloud.set_stock("z", "V5LITE_POD", 16)
    body = qr_body(
        "v5litepod-16", provisioningModel="FLEX_START", runDuration={"maxRunDuration": "7200s"}
    )
    cloud.create_queued_resource(P, "z", "qr", body, "v2alpha1")
    cloud.advance(LATENCY)
    assert cloud.get_queued_resource(P, "z", "qr")["state"]["state"] == "ACTIVE"
    assert cloud.stock("z", "V5LITE_POD") == 0
    cloud.advance(timedelta(hours=2))
    assert cloud.get_queued_resource(P, "z", "qr")["state"] == {
        "state": "SUSPENDED",
        "stateInitiator": "SERVICE",
    }
    assert cloud.stock("z", "V5LITE_POD") == 16
    cloud.delete_queued_resource(P, "z", "qr", force=False)


def tpu_flex_start_is_v6e_and_v5e_only_and_only_in_v2alpha1() -> None:
    """Flex-start TPUs: "you can only request Flex-start TPU v6e and v5e"
    (tpu/docs/request-using-flex-start); the v2 QueuedResource has no provisioningModel (TPU-α
    vs v2), so v2 refuses it as an unknown field."""
    cloud = world()
    flex: dict[str, Any] = {
        "provisioningModel": "FLEX_START", "runDuration": {"maxRunDuration": "3600s"},
    }  # fmt: skip
    refused(lambda: cloud.create_queued_resource(P, "z", "a", qr_body("v5p-8", **flex), "v2alpha1"),
            "only v6e and v5e")  # fmt: skip
    refused(lambda: cloud.create_queued_resource(P, "z", "b", qr_body(**flex)), "Unknown name")
    long = {**flex, "runDuration": {"maxRunDuration": f"{8 * 86400}s"}}
    refused(lambda: cloud.create_queued_resource(P, "z", "c", qr_body(**long), "v2alpha1"),
            "maxRunDuration")  # fmt: skip


# ---------------------------------------------------------------------- stock


def walk(seed: int, moves: list[timedelta]) -> list[int]:
    cloud = world()
    cloud.set_stock(Z, SHAPE, 5)
    cloud.set_stock_process(Z, SHAPE, low=2, high=8, step=2, every=timedelta(minutes=5), seed=seed)
    seen = []
    for move in moves:
        cloud.advance(move)
        seen.append(cloud.stock(Z, SHAPE))
    return seen


def stock_process_is_deterministic_and_bounded() -> None:
    """Other customers take and free capacity (issue 13: "a stock that rises and falls"): the
    seeded walk is the same for a seed however the clock is moved, stays within its bounds,
    and really moves."""
    fine = walk(7, [timedelta(minutes=5)] * 48)
    coarse = walk(7, [timedelta(minutes=60)] * 4)
    assert coarse == fine[11::12]
    assert all(2 <= units <= 8 for units in fine)
    assert len(set(fine)) > 1
    assert walk(8, [timedelta(minutes=5)] * 48) != fine


def stock_process_never_takes_held_units_and_an_explicit_stock_stays() -> None:
    """Only free units move: VMs keep theirs; ``set_stock`` stops the key's process, so an
    explicit stock stays as set (issue 13)."""
    cloud = world(3)
    resize(cloud, "rr", 3, seconds=7 * 86400)
    cloud.advance(LATENCY)
    cloud.set_stock_process(Z, SHAPE, low=0, high=2, seed=1)
    cloud.advance(timedelta(hours=5))
    assert len(cloud.list_managed_instances(P, Z, "mig")) == 3
    assert 0 <= cloud.stock(Z, SHAPE) <= 2
    cloud.set_stock(Z, SHAPE, 6)
    cloud.advance(timedelta(hours=5))
    assert cloud.stock(Z, SHAPE) == 6
    assert cloud.state()["stock_processes"] == []


ROWS = [
    bulk_mig_refuses_a_resize_request,
    bulk_mode_cannot_be_changed,
    stockout_waits_accepted_with_last_attempt_then_succeeds,
    requested_run_duration_is_600_s_to_7_days,
    resize_by_and_instances_are_mutually_exclusive,
    named_vms_are_taken_on_beta_only,
    served_first_come_first_served_and_a_head_blocks,
    shorter_requested_run_durations_are_served_sooner,
    never_served_before_creation_plus_latency,
    cancel_only_accepted_delete_only_inactive,
    deleting_a_request_keeps_its_vms,
    a_fatal_failure_rolls_back_its_vms,
    an_injected_stockout_is_one_failed_attempt,
    flex_vm_waits_pending_and_its_creation_fails_at_its_deadline,
    flex_vm_served_runs_and_is_deleted_at_max_run_duration,
    flex_vm_durations_are_bounded,
    request_valid_for_under_scheduling_is_an_unknown_field,
    tpu_waits_then_fails_after_valid_until_and_stays_listed,
    tpu_flex_start_runs_its_duration_then_is_suspended,
    tpu_flex_start_is_v6e_and_v5e_only_and_only_in_v2alpha1,
    stock_process_is_deterministic_and_bounded,
    stock_process_never_takes_held_units_and_an_explicit_stock_stays,
]


@pytest.mark.parametrize("row", [pytest.param(row, id=row.__name__) for row in ROWS])
def test_google_semantics(row: Callable[[], None]) -> None:
    """One documented behaviour per row; the row's docstring cites its source."""
    assert row.__doc__
    row()
