"""Google's documented behaviours through the emulator, with the real google-cloud-compute and
google-cloud-tpu clients (and plain REST JSON for TPU v2alpha1, which the client types lack).
One row per behaviour; each docstring cites its page or pinned file (see
../shared/GOOGLE-SEMANTICS.md and tests/unit/test_sim_google_semantics.py for the full table on
the simulated cloud itself)."""

from __future__ import annotations

import json
import urllib.request
from datetime import timedelta
from typing import Any, cast

import pytest
from google.api_core import exceptions
from google.cloud import compute_v1

from emulators import ComputeEmulator, EmulatorAdmin
from tests.integration import test_compute_emulator as base
from tests.integration.test_compute_emulator import (
    LATENCY,
    PARENT,
    PROJECT,
    QR_STATE,
    SHAPE,
    TPU_ZONE,
    ZONE,
    Clients,
    make_mig,
    managed,
    named_resize,
    queued_resource,
    resize,
    resize_state,
    unique,
)

# The emulator fixtures of the Compute emulator's own tests: one emulator per module.
emulator = base.emulator
emu = base.emu
clients = base.clients


def test_a_bulk_mig_refuses_a_resize_request(clients: Clients) -> None:
    """A MIG in bulk mode supports no resize requests, and its mode cannot be changed
    (compute/docs/instance-groups/about-bulk-mode)."""
    template, mig = unique("tpl"), unique("mig")
    clients.templates.insert(
        project=PROJECT,
        instance_template_resource=compute_v1.InstanceTemplate(
            name=template, properties=compute_v1.InstanceProperties(machine_type=SHAPE)
        ),
    ).result()
    clients.migs.insert(
        project=PROJECT,
        zone=ZONE,
        instance_group_manager_resource=compute_v1.InstanceGroupManager(
            name=mig,
            instance_template=f"projects/{PROJECT}/global/instanceTemplates/{template}",
            target_size=0,
            target_size_policy=compute_v1.InstanceGroupManagerTargetSizePolicy(mode="BULK"),
        ),
    ).result()
    got = clients.migs.get(project=PROJECT, zone=ZONE, instance_group_manager=mig)
    assert got.target_size_policy.mode == "BULK"
    with pytest.raises(exceptions.BadRequest, match="BULK"):
        resize(clients, mig, unique("rr"), [unique("vm")])
    with pytest.raises(exceptions.BadRequest, match="cannot be changed"):
        clients.migs.patch(
            project=PROJECT,
            zone=ZONE,
            instance_group_manager=mig,
            instance_group_manager_resource=compute_v1.InstanceGroupManager(
                target_size_policy=compute_v1.InstanceGroupManagerTargetSizePolicy(
                    mode="INDIVIDUAL"
                )
            ),
        )


def test_named_vms_in_a_resize_request_are_taken_on_beta_and_refused_on_v1(
    emu: ComputeEmulator, clients: Clients
) -> None:
    """A resize request's named VMs (``instances``, a list of ``{name}``) are a Preview field
    (compute/docs/instance-groups/about-resize-requests-mig); GA gcloud and Terraform send only
    ``resizeBy`` (magic-modules ``mmv1/products/compute/ResizeRequest.yaml``), and
    cluster-toolkit sends named VMs through Compute's beta API
    (``community/modules/scheduler/schedmd-slurm-gcp-v6-controller/modules/slurm_files/
    scripts/util.py`` ``compute_service(version="beta")``, used by ``mig_flex.py``'s
    ``regionInstanceGroupManagerResizeRequests().insert(body={instances: [{name}]})``). The
    local world takes them on ``/compute/beta`` only; ``v1`` is refused, with nothing made, so
    a VM name opendws relies on can only come from the surface Google's own tools use."""
    emu.cloud.set_stock(ZONE, SHAPE, 2)
    mig, name = make_mig(clients), unique("rr")
    vms = [f"{name}-0", f"{name}-1"]
    as_v1 = compute_v1.InstanceGroupManagerResizeRequest(
        name=name,
        instances=[compute_v1.PerInstanceConfig(name=vm) for vm in vms],
        requested_run_duration=compute_v1.Duration(seconds=3600),
    )
    with pytest.raises(exceptions.BadRequest, match=r"Preview.*beta"):
        clients.resize_v1.insert(
            project=PROJECT, zone=ZONE, instance_group_manager=mig,
            instance_group_manager_resize_request_resource=as_v1,
        )  # fmt: skip
    assert emu.cloud.created("resizeRequests") == {}
    clients.resize.insert(
        project=PROJECT, zone=ZONE, instance_group_manager=mig,
        instance_group_manager_resize_request_resource=named_resize(name, vms),
    ).result()  # fmt: skip
    emu.cloud.advance(LATENCY)
    assert resize_state(clients, mig, name).state == "SUCCEEDED"
    assert managed(clients, mig) == vms


def test_a_request_waits_accepted_with_stockout_attempts_and_succeeds_when_stock_returns(
    emu: ComputeEmulator, clients: Clients
) -> None:
    """ACCEPTED while capacity is short, the temporary error in status.lastAttempt.error,
    cleared at SUCCEEDED (CP InstanceGroupManagerResizeRequestStatus; about-resize-requests-mig);
    served first come first served (our documented rule)."""
    emu.cloud.set_stock(ZONE, SHAPE, 0)
    mig, first, second = make_mig(clients), unique("rr"), unique("rr")
    resize(clients, mig, first, [unique("vm"), unique("vm")])
    resize(clients, mig, second, [unique("vm")])
    emu.cloud.advance(LATENCY)
    waiting = resize_state(clients, mig, first)
    assert waiting.state == "ACCEPTED"
    assert waiting.status.last_attempt.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    EmulatorAdmin(emu.endpoint).set_stock(ZONE, SHAPE, 2)
    assert resize_state(clients, mig, first).state == "SUCCEEDED"
    assert resize_state(clients, mig, second).state == "ACCEPTED"
    assert not resize_state(clients, mig, first).status.last_attempt.error.errors


def test_cancel_then_delete_and_the_refused_orders(emu: ComputeEmulator, clients: Clients) -> None:
    """Cancel only an ACCEPTED request, delete only an inactive one; deleting a request keeps
    its VMs (CP service InstanceGroupManagerResizeRequests; MM
    custom_delete/compute_mig_resize_request_delete.go.tmpl)."""
    emu.cloud.set_stock(ZONE, SHAPE, 0)
    mig, name = make_mig(clients), unique("rr")
    target: dict[str, Any] = {"project": PROJECT, "zone": ZONE, "instance_group_manager": mig,
                              "resize_request": name}  # fmt: skip
    resize(clients, mig, name, [unique("vm")])
    with pytest.raises(exceptions.BadRequest, match="cancel it before deleting"):
        clients.resize.delete(**target)
    clients.resize.cancel(**target).result()
    clients.resize.delete(**target).result()
    emu.cloud.set_stock(ZONE, SHAPE, 1)
    kept, vm = unique("rr"), unique("vm")
    resize(clients, mig, kept, [vm])
    emu.cloud.advance(LATENCY)
    done = {**target, "resize_request": kept}
    with pytest.raises(exceptions.BadRequest, match="can no longer be cancelled"):
        clients.resize.cancel(**done)
    clients.resize.delete(**done).result()
    assert managed(clients, mig) == [vm]


def test_failed_rolls_back_the_vms_it_made(emu: ComputeEmulator, clients: Clients) -> None:
    """FAILED rolls back the VMs created during provisioning; status.error is final (CP
    InstanceGroupManagerResizeRequest.State.FAILED)."""
    emu.cloud.set_stock(ZONE, SHAPE, 3)
    emu.cloud.inject(ZONE, SHAPE, "error")
    mig, name = make_mig(clients), unique("rr")
    resize(clients, mig, name, [unique("vm"), unique("vm")])
    emu.cloud.advance(LATENCY)
    request = resize_state(clients, mig, name)
    assert request.state == "FAILED"
    assert request.status.error.errors
    assert managed(clients, mig) == []
    assert emu.cloud.stock(ZONE, SHAPE) == 3


def test_a_flex_vm_waits_pending_and_its_creation_fails_at_its_deadline(
    emu: ComputeEmulator, clients: Clients
) -> None:
    """Flex-start VMs: PENDING while DWS looks for capacity (CP Instance.Status.PENDING); the
    deadline is params.requestValidForDuration (CP InstanceParams); "if resources aren't
    available, then the VM creation request fails" (compute/docs/instances/about-flex-start-vms)."""
    emu.cloud.set_stock(ZONE, SHAPE, 0)
    name = unique("vm")
    instance = compute_v1.Instance(
        name=name,
        machine_type=f"zones/{ZONE}/machineTypes/{SHAPE}",
        scheduling=compute_v1.Scheduling(
            provisioning_model="FLEX_START",
            max_run_duration=compute_v1.Duration(seconds=3600),
            instance_termination_action="DELETE",
        ),
        params=compute_v1.InstanceParams(
            request_valid_for_duration=compute_v1.Duration(seconds=900)
        ),
    )
    operation = clients.instances.insert_unary(
        project=PROJECT, zone=ZONE, instance_resource=instance
    )
    assert operation.status == compute_v1.Operation.Status.RUNNING
    emu.cloud.advance(timedelta(minutes=10))
    assert clients.instances.get(project=PROJECT, zone=ZONE, instance=name).status == "PENDING"
    emu.cloud.advance(timedelta(minutes=5))
    with pytest.raises(exceptions.NotFound):
        clients.instances.get(project=PROJECT, zone=ZONE, instance=name)
    done = clients.zone_operations.get(project=PROJECT, zone=ZONE, operation=operation.name)
    assert done.status == compute_v1.Operation.Status.DONE
    assert done.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"


def test_a_tpu_waits_for_resources_then_fails_after_valid_until_and_stays_listed(
    emu: ComputeEmulator, clients: Clients
) -> None:
    """WAITING_FOR_RESOURCES until resources or the allocation interval; then FAILED and
    listed until deleted — also for a guaranteed (v2) queued resource
    (tpu/docs/queued-resources)."""
    emu.cloud.set_stock(TPU_ZONE, "V5LITE_POD", 4)
    name = unique("qr")
    clients.tpu.create_queued_resource(
        parent=PARENT,
        queued_resource_id=name,
        queued_resource=queued_resource(valid_until=timedelta(hours=1)),
    ).result()
    path = f"{PARENT}/queuedResources/{name}"
    emu.cloud.advance(timedelta(minutes=30))
    assert clients.tpu.get_queued_resource(name=path).state.state == QR_STATE.WAITING_FOR_RESOURCES
    emu.cloud.advance(timedelta(minutes=30))
    assert clients.tpu.get_queued_resource(name=path).state.state == QR_STATE.FAILED
    assert [q.name for q in clients.tpu.list_queued_resources(parent=PARENT)] == [path]


def rest(emu: ComputeEmulator, method: str, path: str, body: object = None) -> dict[str, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(emu.endpoint + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as reply:
        answer = json.loads(reply.read())
    assert isinstance(answer, dict)
    return answer


def test_a_v2alpha1_flex_start_tpu_is_served_then_suspended_at_its_run_duration(
    emu: ComputeEmulator,
) -> None:
    """TPU flex-start over REST v2alpha1: provisioningModel=FLEX_START, runDuration (TPU-α;
    tpu/docs/request-using-flex-start); at its end the TPU VMs are deleted: SUSPENDED."""
    emu.cloud.set_stock(TPU_ZONE, "V6E", 8)
    base = f"/v2alpha1/projects/{PROJECT}/locations/{TPU_ZONE}"
    body = {
        "tpu": {"nodeSpec": [{"parent": PARENT, "nodeId": "n",
                              "node": {"acceleratorType": "v6e-8",
                                       "runtimeVersion": "v2-alpha-tpuv6e"}}]},
        "provisioningModel": "FLEX_START",
        "runDuration": {"maxRunDuration": "3600s"},
        "queueingPolicy": {"validUntilDuration": "7200s"},
    }  # fmt: skip
    operation = rest(emu, "POST", f"{base}/queuedResources?queuedResourceId=flex", body)
    assert operation["done"] is True
    assert operation["metadata"]["apiVersion"] == "v2alpha1"  # type: ignore[index]
    emu.cloud.advance(LATENCY)
    assert rest(emu, "GET", f"{base}/queuedResources/flex")["state"] == {"state": "ACTIVE"}
    emu.cloud.advance(timedelta(hours=1))
    state = rest(emu, "GET", f"{base}/queuedResources/flex")["state"]
    assert state == {"state": "SUSPENDED", "stateInitiator": "SERVICE"}
    assert emu.cloud.stock(TPU_ZONE, "V6E") == 8
    rest(emu, "DELETE", f"{base}/queuedResources/flex")
    assert rest(emu, "GET", f"{base}/queuedResources") == {"queuedResources": []}


def test_the_stock_process_is_deterministic_bounded_and_stopped_by_an_explicit_stock(
    emu: ComputeEmulator,
) -> None:
    """Other customers move the free units (issue 13): the admin process is seeded and stays
    within its bounds; an explicit stock stays as set; /admin/state shows the processes."""
    admin = EmulatorAdmin(emu.endpoint)

    def run() -> list[int]:
        admin.reset()
        admin.set_stock(ZONE, SHAPE, 4)
        admin.set_stock_process(ZONE, SHAPE, low=1, high=6, every=timedelta(minutes=1), seed=3)
        seen = []
        for _ in range(20):
            admin.advance(timedelta(minutes=1))
            seen.append(admin.stock(ZONE, SHAPE))
        return seen

    first = run()
    assert first == run()
    assert all(1 <= units <= 6 for units in first)
    (process,) = cast("list[dict[str, Any]]", admin.state()["stock_processes"])
    assert process["low"] == 1
    admin.set_stock(ZONE, SHAPE, 9)
    admin.advance(timedelta(hours=1))
    assert admin.stock(ZONE, SHAPE) == 9
    assert admin.state()["stock_processes"] == []
