"""The Compute Engine / Cloud TPU emulator, driven by the real ``google-cloud-compute`` and
``google-cloud-tpu`` (REST) clients: what they send is accepted, what they get back parses, and the
simulated cloud behaves as a provider author expects (states, stockouts, stock accounting)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1, compute_v1beta, tpu_v2

from emulators import ComputeEmulator, EmulatorAdmin
from opendws.clock import ManualClock
from opendws.domain.calendar import CancellationRule
from opendws.sim import SimulatedCloud
from opendws.sim.cloud import REVIEW_DELAY

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
LATENCY = timedelta(seconds=20)
PROJECT = "demo-opendws"
ZONE = "us-central1-a"
TPU_ZONE = "us-central2-b"
SHAPE = "a3-highgpu-8g"
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Clients:
    templates: compute_v1.InstanceTemplatesClient
    migs: compute_v1.InstanceGroupManagersClient
    resize: compute_v1beta.InstanceGroupManagerResizeRequestsClient  # named VMs: beta only
    resize_v1: compute_v1.InstanceGroupManagerResizeRequestsClient
    instances: compute_v1.InstancesClient
    futures: compute_v1.FutureReservationsClient
    reservations: compute_v1.ReservationsClient
    zone_operations: compute_v1.ZoneOperationsClient
    global_operations: compute_v1.GlobalOperationsClient
    tpu: tpu_v2.TpuClient


@pytest.fixture(scope="module")
def emulator() -> Iterator[ComputeEmulator]:
    cloud = SimulatedCloud(
        ManualClock(START), provisioning_latency=LATENCY, operation_latency=timedelta(0)
    )
    with ComputeEmulator(cloud) as running:
        yield running


@pytest.fixture
def emu(emulator: ComputeEmulator) -> ComputeEmulator:
    """The shared emulator, emptied; its clock keeps the time earlier tests moved it to."""
    emulator.cloud.reset()
    emulator.cloud.set_latency(LATENCY)
    emulator.cloud.set_review_delay(REVIEW_DELAY)
    emulator.cloud.set_fill_delay(timedelta(0))
    emulator.cloud.set_cancellation_rule(CancellationRule.WINDOWS)
    emulator.round_trip = 0.0
    return emulator


@pytest.fixture
def clients(emu: ComputeEmulator) -> Clients:
    settings: dict[str, Any] = {
        "client_options": {"api_endpoint": emu.endpoint},
        "credentials": AnonymousCredentials(),
    }
    return Clients(
        templates=compute_v1.InstanceTemplatesClient(**settings),
        migs=compute_v1.InstanceGroupManagersClient(**settings),
        resize=compute_v1beta.InstanceGroupManagerResizeRequestsClient(**settings),
        resize_v1=compute_v1.InstanceGroupManagerResizeRequestsClient(**settings),
        instances=compute_v1.InstancesClient(**settings),
        futures=compute_v1.FutureReservationsClient(**settings),
        reservations=compute_v1.ReservationsClient(**settings),
        zone_operations=compute_v1.ZoneOperationsClient(**settings),
        global_operations=compute_v1.GlobalOperationsClient(**settings),
        tpu=tpu_v2.TpuClient(transport="rest", **settings),
    )


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def make_mig(clients: Clients, shape: str = SHAPE) -> str:
    """A template of ``shape`` and an empty MIG on it; returns the MIG's name."""
    template, mig = unique("tpl"), unique("mig")
    clients.templates.insert(
        project=PROJECT,
        instance_template_resource=compute_v1.InstanceTemplate(
            name=template, properties=compute_v1.InstanceProperties(machine_type=shape)
        ),
    ).result()
    clients.migs.insert(
        project=PROJECT,
        zone=ZONE,
        instance_group_manager_resource=compute_v1.InstanceGroupManager(
            name=mig,
            instance_template=f"projects/{PROJECT}/global/instanceTemplates/{template}",
            base_instance_name=mig,
            target_size=0,
        ),
    ).result()
    return mig


def named_resize(
    name: str, vms: list[str], run: timedelta = timedelta(hours=1)
) -> compute_v1beta.InstanceGroupManagerResizeRequest:
    """A resize request naming its VMs (a Preview field: sent through beta)."""
    return compute_v1beta.InstanceGroupManagerResizeRequest(
        name=name,
        instances=[compute_v1beta.PerInstanceConfig(name=vm) for vm in vms],
        requested_run_duration=compute_v1beta.Duration(seconds=int(run.total_seconds())),
    )


def resize(
    clients: Clients, mig: str, name: str, vms: list[str], run: timedelta = timedelta(hours=1)
) -> compute_v1beta.Operation:
    return clients.resize.insert_unary(
        project=PROJECT,
        zone=ZONE,
        instance_group_manager=mig,
        instance_group_manager_resize_request_resource=named_resize(name, vms, run),
    )


def resize_state(
    clients: Clients, mig: str, name: str
) -> compute_v1beta.InstanceGroupManagerResizeRequest:
    return clients.resize.get(
        project=PROJECT, zone=ZONE, instance_group_manager=mig, resize_request=name
    )


def managed(clients: Clients, mig: str) -> list[str]:
    pager = clients.migs.list_managed_instances(
        project=PROJECT, zone=ZONE, instance_group_manager=mig
    )
    return sorted(item.name for item in pager)


def queued_resource(
    *, accelerator_type: str | None = None, valid_until: timedelta | None = None
) -> tpu_v2.QueuedResource:
    node = (
        tpu_v2.Node(accelerator_type=accelerator_type, runtime_version="v2-alpha-tpuv5-lite")
        if accelerator_type
        else tpu_v2.Node(
            accelerator_config=tpu_v2.AcceleratorConfig(
                type_=tpu_v2.AcceleratorConfig.Type.V5LITE_POD, topology="4x4"
            ),
            runtime_version="v2-alpha-tpuv5-lite",
        )
    )
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(
        parent=f"projects/{PROJECT}/locations/{TPU_ZONE}", node_id=unique("node"), node=node
    )
    resource = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]),
        guaranteed=tpu_v2.QueuedResource.Guaranteed(),
    )
    if valid_until is not None:
        resource.queueing_policy = tpu_v2.QueuedResource.QueueingPolicy(
            valid_until_duration=valid_until
        )
    return resource


PARENT = f"projects/{PROJECT}/locations/{TPU_ZONE}"
QR_STATE = tpu_v2.QueuedResourceState.State


# ---------------------------------------------------------------------- Compute


def test_a_round_trip_holds_every_answer_back(emu: ComputeEmulator, clients: Clients) -> None:
    """bench/reconcile.py sets a round trip to see which calls overlap; none by default."""
    with pytest.raises(ValueError, match="negative"):
        emu.round_trip = -1
    emu.round_trip = 0.3
    started = time.monotonic()
    list(clients.migs.list(project=PROJECT, zone=ZONE))
    assert time.monotonic() - started >= 0.3
    emu.round_trip = 0.0
    assert emu.round_trip == 0.0


def test_template_and_mig_are_created_listed_and_deleted(clients: Clients) -> None:
    mig = make_mig(clients)
    got = clients.migs.get(project=PROJECT, zone=ZONE, instance_group_manager=mig)
    assert got.name == mig
    assert got.target_size == 0
    assert got.id > 0
    assert got.self_link.endswith(f"/projects/{PROJECT}/zones/{ZONE}/instanceGroupManagers/{mig}")
    template = got.instance_template.rsplit("/", 1)[-1]
    assert (
        clients.templates.get(project=PROJECT, instance_template=template).properties.machine_type
        == SHAPE
    )
    assert mig in [m.name for m in clients.migs.list(project=PROJECT, zone=ZONE)]
    with pytest.raises(exceptions.BadRequest, match="already being used"):
        clients.templates.delete(project=PROJECT, instance_template=template)
    clients.migs.delete(project=PROJECT, zone=ZONE, instance_group_manager=mig).result()
    clients.templates.delete(project=PROJECT, instance_template=template).result()
    with pytest.raises(exceptions.NotFound):
        clients.migs.get(project=PROJECT, zone=ZONE, instance_group_manager=mig)


def test_operations_have_integer_ids_and_can_be_fetched_and_waited(clients: Clients) -> None:
    mig = make_mig(clients)
    operation = resize(clients, mig, unique("rr"), [unique("vm")])
    assert isinstance(operation.id, int)
    assert operation.id > 0
    assert operation.status == compute_v1beta.Operation.Status.DONE
    assert operation.name.startswith("operation-")
    fetched = clients.zone_operations.get(project=PROJECT, zone=ZONE, operation=operation.name)
    assert fetched.id == operation.id
    assert fetched.target_link == operation.target_link
    waited = clients.zone_operations.wait(project=PROJECT, zone=ZONE, operation=operation.name)
    assert waited.status == compute_v1.Operation.Status.DONE
    template = unique("tpl")
    insert = clients.templates.insert_unary(
        project=PROJECT,
        instance_template_resource=compute_v1.InstanceTemplate(
            name=template, properties=compute_v1.InstanceProperties(machine_type=SHAPE)
        ),
    )
    assert clients.global_operations.get(project=PROJECT, operation=insert.name).id == insert.id
    with pytest.raises(exceptions.NotFound):
        clients.zone_operations.get(project=PROJECT, zone=ZONE, operation="operation-0-missing")


def test_resize_request_succeeds_then_its_vms_end_with_the_run_duration(
    emu: ComputeEmulator, clients: Clients
) -> None:
    emu.cloud.set_stock(ZONE, SHAPE, 5)
    mig, name = make_mig(clients), unique("rr")
    vms = sorted([unique("vm"), unique("vm")])
    resize(clients, mig, name, vms, run=timedelta(hours=2))
    assert resize_state(clients, mig, name).state == "ACCEPTED"
    assert managed(clients, mig) == []
    emu.cloud.advance(LATENCY)
    request = resize_state(clients, mig, name)
    assert request.state == "SUCCEEDED"
    assert request.resize_by == 2
    assert managed(clients, mig) == vms
    assert emu.cloud.stock(ZONE, SHAPE) == 3
    listed = clients.instances.list(project=PROJECT, zone=ZONE)
    assert {i.name: i.status for i in listed} == dict.fromkeys(vms, "RUNNING")
    assert clients.migs.get(project=PROJECT, zone=ZONE, instance_group_manager=mig).target_size == 2
    emu.cloud.advance(timedelta(hours=2) - timedelta(seconds=1))
    assert managed(clients, mig) == vms
    emu.cloud.advance(timedelta(seconds=1))
    assert managed(clients, mig) == []
    assert emu.cloud.stock(ZONE, SHAPE) == 5


def test_resize_request_by_count_names_vms_after_the_base_name(
    emu: ComputeEmulator, clients: Clients
) -> None:
    emu.cloud.set_stock(ZONE, SHAPE, 3)
    mig, name = make_mig(clients), unique("rr")
    clients.resize_v1.insert(
        project=PROJECT,
        zone=ZONE,
        instance_group_manager=mig,
        instance_group_manager_resize_request_resource=compute_v1.InstanceGroupManagerResizeRequest(
            name=name, resize_by=3
        ),
    ).result()
    emu.cloud.advance(LATENCY)
    names = managed(clients, mig)
    assert len(names) == 3
    assert all(n.startswith(f"{mig}-") and len(n) == len(mig) + 5 for n in names)


@pytest.mark.parametrize(("stock", "injected"), [(1, None), (10, "stockout")])
def test_resize_request_waits_on_a_stockout(
    emu: ComputeEmulator, clients: Clients, stock: int, injected: str | None
) -> None:
    """Changed: a stockout used to FAIL the request. Google keeps it ACCEPTED with the
    temporary error in status.lastAttempt.error.errors[] (CP
    InstanceGroupManagerResizeRequestStatus; about-resize-requests-mig)."""
    emu.cloud.set_stock(ZONE, SHAPE, stock)
    if injected is not None:
        emu.cloud.inject(ZONE, SHAPE, injected)
    mig, name = make_mig(clients), unique("rr")
    resize(clients, mig, name, [unique("vm"), unique("vm")])
    emu.cloud.advance(LATENCY)
    request = resize_state(clients, mig, name)
    assert request.state == "ACCEPTED"
    (error,) = request.status.last_attempt.error.errors
    assert error.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert f"projects/{PROJECT}/zones/{ZONE}" in error.message
    assert not request.status.error.errors
    assert managed(clients, mig) == []
    assert emu.cloud.stock(ZONE, SHAPE) == stock


def test_resize_request_fails_on_an_injected_error(emu: ComputeEmulator, clients: Clients) -> None:
    emu.cloud.set_stock(ZONE, SHAPE, 10)
    emu.cloud.inject(ZONE, SHAPE, "error")
    mig, name = make_mig(clients), unique("rr")
    resize(clients, mig, name, [unique("vm"), unique("vm")])
    emu.cloud.advance(LATENCY)
    request = resize_state(clients, mig, name)
    assert request.state == "FAILED"
    assert request.status.error.errors[0].code == "RESOURCE_OPERATION_RATE_EXCEEDED"
    assert managed(clients, mig) == []
    assert emu.cloud.stock(ZONE, SHAPE) == 10


def test_a_hanging_resize_request_waits_until_cancelled_then_can_be_deleted(
    emu: ComputeEmulator, clients: Clients
) -> None:
    emu.cloud.set_stock(ZONE, SHAPE, 4)
    emu.cloud.inject(ZONE, SHAPE, "hang")
    mig, name = make_mig(clients), unique("rr")
    resize(clients, mig, name, [unique("vm")])
    emu.cloud.advance(timedelta(days=3))
    assert resize_state(clients, mig, name).state == "ACCEPTED"
    target: dict[str, Any] = {
        "project": PROJECT,
        "zone": ZONE,
        "instance_group_manager": mig,
        "resize_request": name,
    }
    with pytest.raises(exceptions.BadRequest, match="cancel it before deleting"):
        clients.resize.delete(**target)
    clients.resize.cancel(**target).result()
    assert resize_state(clients, mig, name).state == "CANCELLED"
    with pytest.raises(exceptions.BadRequest, match="can no longer be cancelled"):
        clients.resize.cancel(**target)
    clients.resize.delete(**target).result()
    with pytest.raises(exceptions.NotFound):
        resize_state(clients, mig, name)
    assert emu.cloud.stock(ZONE, SHAPE) == 4


def test_a_second_create_of_the_same_resize_request_conflicts_and_creates_nothing(
    emu: ComputeEmulator, clients: Clients
) -> None:
    emu.cloud.set_stock(ZONE, SHAPE, 4)
    mig, name = make_mig(clients), unique("rr")
    resize(clients, mig, name, [unique("vm")])
    with pytest.raises(exceptions.Conflict, match="already exists"):
        resize(clients, mig, name, [unique("vm")])
    assert emu.cloud.created("resizeRequests") == {name: 1}
    names = [
        r.name for r in clients.resize.list(project=PROJECT, zone=ZONE, instance_group_manager=mig)
    ]
    assert names == [name]


def test_delete_instances_returns_their_stock(emu: ComputeEmulator, clients: Clients) -> None:
    emu.cloud.set_stock(ZONE, SHAPE, 3)
    mig = make_mig(clients)
    vms = sorted([unique("vm"), unique("vm"), unique("vm")])
    resize(clients, mig, unique("rr"), vms)
    emu.cloud.advance(LATENCY)
    assert emu.cloud.stock(ZONE, SHAPE) == 0
    request = compute_v1.InstanceGroupManagersDeleteInstancesRequest(
        instances=[f"zones/{ZONE}/instances/{vms[0]}", "zones/x/instances/not-there"]
    )
    with pytest.raises(exceptions.BadRequest, match="not-there"):
        clients.migs.delete_instances(
            project=PROJECT,
            zone=ZONE,
            instance_group_manager=mig,
            instance_group_managers_delete_instances_request_resource=request,
        )
    assert managed(clients, mig) == vms
    request.skip_instances_on_validation_error = True
    clients.migs.delete_instances(
        project=PROJECT,
        zone=ZONE,
        instance_group_manager=mig,
        instance_group_managers_delete_instances_request_resource=request,
    ).result()
    assert managed(clients, mig) == vms[1:]
    assert emu.cloud.stock(ZONE, SHAPE) == 1
    clients.instances.delete(project=PROJECT, zone=ZONE, instance=vms[1]).result()
    assert emu.cloud.stock(ZONE, SHAPE) == 2


def test_instance_insert_takes_stock_and_a_stockout_fails_the_operation(
    emu: ComputeEmulator, clients: Clients
) -> None:
    emu.cloud.set_stock(ZONE, "g2-standard-8", 1)
    first, second = unique("vm"), unique("vm")
    body = {"machine_type": f"zones/{ZONE}/machineTypes/g2-standard-8"}
    clients.instances.insert(
        project=PROJECT, zone=ZONE, instance_resource=compute_v1.Instance(name=first, **body)
    ).result()
    assert (
        clients.instances.get(project=PROJECT, zone=ZONE, instance=first).status == "PROVISIONING"
    )
    emu.cloud.advance(LATENCY)
    assert clients.instances.get(project=PROJECT, zone=ZONE, instance=first).status == "RUNNING"
    operation = clients.instances.insert(
        project=PROJECT, zone=ZONE, instance_resource=compute_v1.Instance(name=second, **body)
    )
    with pytest.raises(exceptions.ServiceUnavailable, match="does not have enough resources"):
        operation.result()
    assert operation.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    with pytest.raises(exceptions.NotFound):
        clients.instances.get(project=PROJECT, zone=ZONE, instance=second)
    clients.instances.delete(project=PROJECT, zone=ZONE, instance=first).result()
    assert emu.cloud.stock(ZONE, "g2-standard-8") == 1
    assert emu.cloud.created("instances") == {first: 1}


def future_reservation(
    name: str, count: int, start: datetime, days: int
) -> compute_v1.FutureReservation:
    return compute_v1.FutureReservation(
        name=name,
        specific_reservation_required=True,
        reservation_mode="CALENDAR",
        auto_delete_auto_created_reservations=True,
        time_window=compute_v1.FutureReservationTimeWindow(
            start_time=start.isoformat(), end_time=(start + timedelta(days=days)).isoformat()
        ),
        specific_sku_properties=compute_v1.FutureReservationSpecificSKUProperties(
            total_count=count,
            instance_properties=compute_v1.AllocationSpecificSKUAllocationReservedInstanceProperties(
                machine_type=SHAPE
            ),
        ),
    )


def consuming_instance(name: str, reservation: str) -> compute_v1.Instance:
    return compute_v1.Instance(
        name=name,
        machine_type=f"zones/{ZONE}/machineTypes/{SHAPE}",
        reservation_affinity=compute_v1.ReservationAffinity(
            consume_reservation_type="SPECIFIC_RESERVATION",
            key="compute.googleapis.com/reservation-name",
            values=[reservation],
        ),
        scheduling=compute_v1.Scheduling(provisioning_model="RESERVATION_BOUND"),
    )


def test_future_reservation_is_fulfilled_at_start_and_its_vms_end_with_it(
    emu: ComputeEmulator, clients: Clients
) -> None:
    emu.cloud.set_stock(ZONE, SHAPE, 5)
    name = unique("block")
    start = emu.cloud.clock.now() + timedelta(days=1)
    clients.futures.insert(
        project=PROJECT,
        zone=ZONE,
        future_reservation_resource=future_reservation(name, 2, start, 3),
    ).result()
    got = clients.futures.get(project=PROJECT, zone=ZONE, future_reservation=name)
    assert got.status.procurement_status == "PENDING_APPROVAL"
    emu.cloud.advance(REVIEW_DELAY)
    assert emu.cloud.stock(ZONE, SHAPE) == 5  # promised; taken at the start
    got = clients.futures.get(project=PROJECT, zone=ZONE, future_reservation=name)
    assert got.status.procurement_status == "APPROVED"
    # Created at approval, empty (compute/docs/hpc/reserve-capacity-account-team): a VM
    # consuming it before its capacity is provisioned into it fails for want of capacity.
    empty = clients.instances.insert(
        project=PROJECT, zone=ZONE, instance_resource=consuming_instance(unique("vm"), name)
    )
    assert empty.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    emu.cloud.advance(timedelta(days=1) - REVIEW_DELAY + LATENCY)
    got = clients.futures.get(project=PROJECT, zone=ZONE, future_reservation=name)
    assert got.status.procurement_status == "FULFILLED"
    assert got.status.auto_created_reservations[0].endswith(f"/reservations/{name}")
    vms = [unique("vm"), unique("vm")]
    for vm in vms:
        clients.instances.insert(
            project=PROJECT, zone=ZONE, instance_resource=consuming_instance(vm, name)
        ).result()
    reservation = clients.reservations.get(project=PROJECT, zone=ZONE, reservation=name)
    assert (
        reservation.specific_reservation.count,
        reservation.specific_reservation.in_use_count,
    ) == (2, 2)
    full = clients.instances.insert(
        project=PROJECT, zone=ZONE, instance_resource=consuming_instance(unique("vm"), name)
    )
    assert full.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    emu.cloud.advance(LATENCY)
    assert clients.instances.get(project=PROJECT, zone=ZONE, instance=vms[0]).status == "RUNNING"
    assert emu.cloud.stock(ZONE, SHAPE) == 3  # the reservation's VMs take nothing more
    emu.cloud.advance(timedelta(days=3))
    assert list(clients.instances.list(project=PROJECT, zone=ZONE)) == []
    with pytest.raises(exceptions.NotFound):
        clients.reservations.get(project=PROJECT, zone=ZONE, reservation=name)
    assert emu.cloud.stock(ZONE, SHAPE) == 5


def test_future_reservation_beyond_stock_is_declined_and_a_live_one_is_deleted_after_its_end(
    emu: ComputeEmulator, clients: Clients
) -> None:
    emu.cloud.set_stock(ZONE, SHAPE, 2)
    refused, booked = unique("block"), unique("block")
    for name, count in ((refused, 3), (booked, 2)):
        clients.futures.insert(
            project=PROJECT,
            zone=ZONE,
            future_reservation_resource=future_reservation(name, count, emu.cloud.clock.now(), 1),
        ).result()
    emu.cloud.advance(REVIEW_DELAY + LATENCY)
    got = clients.futures.get(project=PROJECT, zone=ZONE, future_reservation=refused)
    assert got.status.procurement_status == "DECLINED"
    clients.futures.delete(project=PROJECT, zone=ZONE, future_reservation=refused).result()
    clients.instances.insert(
        project=PROJECT, zone=ZONE, instance_resource=consuming_instance(unique("vm"), booked)
    ).result()
    assert [f.name for f in clients.futures.list(project=PROJECT, zone=ZONE)] == [booked]
    assert emu.cloud.stock(ZONE, SHAPE) == 0
    with pytest.raises(exceptions.BadRequest, match="cannot be deleted"):
        clients.futures.delete(project=PROJECT, zone=ZONE, future_reservation=booked)
    emu.cloud.advance(timedelta(days=1))
    assert emu.cloud.stock(ZONE, SHAPE) == 2
    assert list(clients.instances.list(project=PROJECT, zone=ZONE)) == []
    clients.futures.delete(project=PROJECT, zone=ZONE, future_reservation=booked).result()
    assert emu.cloud.created("futureReservations") == {refused: 1, booked: 1}


def test_not_found_is_a_not_found(clients: Clients) -> None:
    with pytest.raises(exceptions.NotFound, match="was not found"):
        clients.instances.get(project=PROJECT, zone=ZONE, instance="nothing-here")


# ---------------------------------------------------------------------- TPU


def test_queued_resource_becomes_active_and_a_forced_delete_returns_its_chips(
    emu: ComputeEmulator, clients: Clients
) -> None:
    emu.cloud.set_stock(TPU_ZONE, "V5LITE_POD", 20)
    name = unique("qr")
    operation = clients.tpu.create_queued_resource(
        parent=PARENT, queued_resource_id=name, queued_resource=queued_resource()
    )
    assert operation.done()
    assert operation.metadata.verb == "create"
    created = operation.result()
    assert created.name == f"{PARENT}/queuedResources/{name}"
    # Changed from ACCEPTED: WAITING_FOR_RESOURCES replaced it (tpu/docs/queued-resources).
    assert created.state.state == QR_STATE.WAITING_FOR_RESOURCES
    fetched = clients.tpu.transport.operations_client.get_operation(operation.operation.name)
    assert fetched.done
    emu.cloud.advance(LATENCY)
    got = clients.tpu.get_queued_resource(name=f"{PARENT}/queuedResources/{name}")
    assert got.state.state == QR_STATE.ACTIVE
    assert got.guaranteed is not None
    assert got.tpu.node_spec[0].node.accelerator_config.topology == "4x4"
    assert emu.cloud.stock(TPU_ZONE, "V5LITE_POD") == 4
    assert [q.name for q in clients.tpu.list_queued_resources(parent=PARENT)] == [created.name]
    with pytest.raises(exceptions.BadRequest, match="without force"):
        clients.tpu.delete_queued_resource(name=created.name)
    clients.tpu.delete_queued_resource(request={"name": created.name, "force": True}).result()
    assert emu.cloud.stock(TPU_ZONE, "V5LITE_POD") == 20
    with pytest.raises(exceptions.NotFound):
        clients.tpu.get_queued_resource(name=created.name)


def test_queued_resource_waits_on_a_stockout_and_only_a_forced_delete_removes_it(
    emu: ComputeEmulator, clients: Clients
) -> None:
    """Changed: a stockout used to FAIL the queued resource. It waits in WAITING_FOR_RESOURCES
    "until there are sufficient free resources" (tpu/docs/queued-resources), so deleting it
    needs force."""
    emu.cloud.set_stock(TPU_ZONE, "V5LITE_POD", 8)
    name = unique("qr")
    clients.tpu.create_queued_resource(
        parent=PARENT,
        queued_resource_id=name,
        queued_resource=queued_resource(accelerator_type="v5litepod-16"),
    ).result()
    emu.cloud.advance(LATENCY)
    got = clients.tpu.get_queued_resource(name=f"{PARENT}/queuedResources/{name}")
    assert got.state.state == QR_STATE.WAITING_FOR_RESOURCES
    with pytest.raises(exceptions.BadRequest, match="without force"):
        clients.tpu.delete_queued_resource(name=got.name)
    clients.tpu.delete_queued_resource(request={"name": got.name, "force": True}).result()
    assert emu.cloud.stock(TPU_ZONE, "V5LITE_POD") == 8


def test_a_waiting_queued_resource_fails_when_its_valid_until_passes(
    emu: ComputeEmulator, clients: Clients
) -> None:
    emu.cloud.set_stock(TPU_ZONE, "V5LITE_POD", 64)
    emu.cloud.inject(TPU_ZONE, "V5LITE_POD", "hang")
    name = unique("qr")
    clients.tpu.create_queued_resource(
        parent=PARENT,
        queued_resource_id=name,
        queued_resource=queued_resource(valid_until=timedelta(hours=1)),
    ).result()
    emu.cloud.advance(LATENCY)
    path = f"{PARENT}/queuedResources/{name}"
    assert clients.tpu.get_queued_resource(name=path).state.state == QR_STATE.WAITING_FOR_RESOURCES
    emu.cloud.advance(timedelta(hours=1))
    assert clients.tpu.get_queued_resource(name=path).state.state == QR_STATE.FAILED
    assert emu.cloud.stock(TPU_ZONE, "V5LITE_POD") == 64


def test_a_second_queued_resource_of_the_same_name_conflicts(
    emu: ComputeEmulator, clients: Clients
) -> None:
    name = unique("qr")
    clients.tpu.create_queued_resource(
        parent=PARENT, queued_resource_id=name, queued_resource=queued_resource()
    )
    with pytest.raises(exceptions.Conflict, match="already exists"):
        clients.tpu.create_queued_resource(
            parent=PARENT, queued_resource_id=name, queued_resource=queued_resource()
        )
    assert emu.cloud.created("queuedResources") == {name: 1}
    with pytest.raises(exceptions.NotFound):
        clients.tpu.get_queued_resource(name=f"{PARENT}/queuedResources/{unique('qr')}")


# ---------------------------------------------------------------------- admin


def test_admin_client_steers_the_cloud(emu: ComputeEmulator, clients: Clients) -> None:
    admin = EmulatorAdmin(emu.endpoint)
    admin.set_stock(ZONE, SHAPE, 2)
    assert admin.stock(ZONE, SHAPE) == 2
    admin.set_latency(timedelta(minutes=5))
    admin.inject(ZONE, SHAPE, "error")
    mig, failed, ok = make_mig(clients), unique("rr"), unique("rr")
    resize(clients, mig, failed, [unique("vm")])
    resize(clients, mig, ok, [unique("vm")])
    admin.advance(timedelta(minutes=4))
    assert resize_state(clients, mig, ok).state == "ACCEPTED"
    admin.advance(timedelta(minutes=1))
    # Changed: the injection is "error" (fatal); a "stockout" now leaves the request waiting.
    assert resize_state(clients, mig, failed).state == "FAILED"
    assert resize_state(clients, mig, ok).state == "SUCCEEDED"
    assert admin.stock(ZONE, SHAPE) == 1
    state = admin.state()
    assert state["latency_seconds"] == 300
    assert admin.created("resizeRequests") == {failed: 1, ok: 1}
    resources = state["resources"]
    assert isinstance(resources, dict)
    assert len(resources[PROJECT]["instances"]) == 1
    admin.reset()
    assert admin.created("resizeRequests") == {}
    assert admin.stock(ZONE, SHAPE) == 0


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/admin/stock", {"zone": ZONE, "shape": SHAPE, "units": -1}, "units"),
        ("/admin/stock", {"zone": ZONE, "units": 3}, "'shape'"),
        ("/admin/stock", {"zone": ZONE, "shape": SHAPE, "units": "3"}, "'units'"),
        ("/admin/inject", {"zone": ZONE, "shape": SHAPE, "kind": "flood"}, "kind"),
        ("/admin/inject", {"zone": ZONE, "shape": SHAPE, "kind": "hang", "count": 0}, "count"),
        ("/admin/latency", {"seconds": -5}, "seconds"),
        ("/admin/advance", {"seconds": "soon"}, "seconds"),
        ("/admin/advance", [1, 2], "JSON object"),
    ],
)
def test_bad_admin_input_is_a_400_that_says_what_is_wrong(
    emu: ComputeEmulator, path: str, body: object, message: str
) -> None:
    request = urllib.request.Request(
        emu.endpoint + path, data=json.dumps(body).encode(), method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=10)
    assert raised.value.code == 400
    assert message in json.loads(raised.value.read())["error"]["message"]


def test_admin_client_raises_value_error_on_bad_input(emu: ComputeEmulator) -> None:
    with pytest.raises(ValueError, match="kind"):
        EmulatorAdmin(emu.endpoint).inject(ZONE, SHAPE, "meteor")


def test_standalone_server_prints_its_endpoint_and_stops_on_sigterm() -> None:
    command = [sys.executable, "-m", "emulators.compute", "--stock", f"{ZONE}/{SHAPE}=7",
               "--stock-process", f"{ZONE}/g2-standard-8=2:5", "--seed", "3",
               "--latency", "1"]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "shared")])}
    server = subprocess.Popen(
        command,
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline().strip()
        assert line.startswith("COMPUTE_EMULATOR_ENDPOINT=http://127.0.0.1:")
        admin = EmulatorAdmin(line.partition("=")[2])
        assert admin.stock(ZONE, SHAPE) == 7
        assert admin.state()["latency_seconds"] == 1
        (process,) = cast("list[dict[str, Any]]", admin.state()["stock_processes"])
        assert (process["shape"], process["low"], process["high"], process["seed"]) == (
            "g2-standard-8", 2, 5, 3)  # fmt: skip
        assert admin.stock(ZONE, "g2-standard-8") == 2  # it starts at LOW
        os.killpg(server.pid, signal.SIGTERM)
        assert server.wait(15) == 0
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(15)
