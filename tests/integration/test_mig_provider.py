"""What the MIG flex-start provider creates on the Compute Engine API (over the project's
emulator, read back with the real client): the pool's instance template and group, and each
order's resize request."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from emulators import ComputeEmulator
from opendws.adapters.mig import group_name
from opendws.bootstrap import capacity_providers
from opendws.clock import ManualClock
from opendws.domain.model import Pool
from opendws.ports import Order
from opendws.sim import SimulatedCloud
from tests.builders import A3, NOW, flex, pool

PROJECT = "mig-provider"
ZONE = "us-central1-a"


@pytest.fixture
def emulator() -> Iterator[ComputeEmulator]:
    cloud = SimulatedCloud(
        ManualClock(NOW), provisioning_latency=timedelta(0), operation_latency=timedelta(0)
    )
    cloud.set_stock(ZONE, A3, 8)
    with ComputeEmulator(cloud) as running:
        yield running


def client_options(emulator: ComputeEmulator) -> dict[str, object]:
    return {
        "client_options": {"api_endpoint": emulator.endpoint},
        "credentials": AnonymousCredentials(),
    }


def group_template(emulator: ComputeEmulator, home: Pool) -> compute_v1.InstanceTemplate:
    """The template the pool's group makes its VMs from."""
    options = client_options(emulator)
    group = compute_v1.InstanceGroupManagersClient(**options).get(  # type: ignore[arg-type]
        project=PROJECT, zone=home.zone, instance_group_manager=group_name(home)
    )
    return compute_v1.InstanceTemplatesClient(**options).get(  # type: ignore[arg-type]
        project=PROJECT, instance_template=group.instance_template.rsplit("/", 1)[-1]
    )


def test_the_pool_gets_a_flex_start_template_and_a_group_without_bulk_mode(
    emulator: ComputeEmulator,
) -> None:
    """The template is Google's regional flex-start sample (magic-modules
    ``samples/services/compute/compute_rmig_resize_request.tf.tmpl``): FLEX_START,
    ``instanceTerminationAction=DELETE``, ``maxRunDuration``, ``reservationAffinity
    NO_RESERVATION``; the group is not in bulk mode, which takes no resize requests
    (compute/docs/instance-groups/about-bulk-mode)."""
    home = pool(zone=ZONE, capacity=8)
    provider = capacity_providers(PROJECT, endpoint=emulator.endpoint).mig_flex
    order = Order(request=flex("train", vm_count=3, hours=6), pool=home, attempt=1)
    provider.provision(order)
    options = client_options(emulator)
    template = group_template(emulator, home)
    properties = template.properties
    scheduling = properties.scheduling
    assert properties.machine_type == A3
    assert (scheduling.provisioning_model, scheduling.instance_termination_action) == (
        "FLEX_START", "DELETE",
    )  # fmt: skip
    assert scheduling.max_run_duration.seconds == 7 * 24 * 3600
    assert properties.reservation_affinity.consume_reservation_type == "NO_RESERVATION"
    assert properties.network_interfaces[0].nic_type == "GVNIC"  # A3 needs gVNIC
    group = compute_v1.InstanceGroupManagersClient(**options).get(  # type: ignore[arg-type]
        project=PROJECT, zone=ZONE, instance_group_manager=group_name(home)
    )
    assert group.target_size_policy.mode != "BULK"
    # Created at size 0; the resize request (no latency here) has added its 3 VMs since.
    assert group.target_size == 3
    resize = compute_v1.InstanceGroupManagerResizeRequestsClient(**options).get(  # type: ignore[arg-type]
        project=PROJECT, zone=ZONE, instance_group_manager=group_name(home),
        resize_request=order.name,
    )  # fmt: skip
    assert [i.name for i in resize.instances] == [f"{order.name}-{i}" for i in range(3)]
    assert resize.requested_run_duration.seconds == 6 * 3600


def test_a_group_deleted_by_hand_is_made_again(emulator: ComputeEmulator) -> None:
    home = pool(zone=ZONE, capacity=8)
    provider = capacity_providers(PROJECT, endpoint=emulator.endpoint).mig_flex
    first = Order(request=flex("first", vm_count=1), pool=home, attempt=1)
    provider.provision(first)
    provider.release(first.name, home)
    groups = compute_v1.InstanceGroupManagersClient(**client_options(emulator))  # type: ignore[arg-type]
    groups.delete(project=PROJECT, zone=ZONE, instance_group_manager=group_name(home))
    second = Order(request=flex("second", vm_count=1), pool=home, attempt=1)
    provider.provision(second)
    assert set(provider.observe([home])) == {second.name}
