"""The simulated cloud gives every VM its addresses as Compute Engine does: the Instance view's
``networkInterfaces[0].networkIP`` is an internal address of the VM's own, from its creation
to its deletion, and an interface with an access config has an external ``natIP``
(compute/docs/reference/rest/v1/instances, ``NetworkInterface.networkIP``: "An IPv4 internal
IP address to assign to the instance for this network interface. If not specified by the
user, an unused internal IP is assigned by the system"; ``AccessConfig.natIP``). A MIG's VMs
have the interfaces of the group's instance template."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime, timedelta

import pytest

from opendws.clock import ManualClock
from opendws.sim import SimulatedCloud

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
LATENCY = timedelta(seconds=20)
P, Z, SHAPE = "proj", "us-central1-a", "a3-highgpu-8g"
NIC = {"network": "global/networks/default", "nicType": "GVNIC"}
DISK = {"boot": True, "initializeParams": {"diskType": f"zones/{Z}/diskTypes/hyperdisk-balanced"}}


@pytest.fixture
def cloud() -> SimulatedCloud:
    cloud = SimulatedCloud(
        ManualClock(START), provisioning_latency=LATENCY, operation_latency=timedelta(0)
    )
    properties = {"machineType": SHAPE, "networkInterfaces": [NIC]}
    cloud.insert_instance_template(P, {"name": "tpl", "properties": properties})
    cloud.insert_instance_group_manager(
        P, Z, {"name": "mig", "instanceTemplate": "global/instanceTemplates/tpl"}
    )
    cloud.set_stock(Z, SHAPE, 8)
    return cloud


def _serve(cloud: SimulatedCloud, request: str, vms: list[str]) -> None:
    body = {
        "name": request,
        "instances": [{"name": vm} for vm in vms],
        "requestedRunDuration": {"seconds": "3600"},
    }
    cloud.insert_resize_request(P, Z, "mig", body, "beta")
    cloud.advance(LATENCY)


def _nic(cloud: SimulatedCloud, vm: str) -> dict[str, object]:
    nics = cloud.get_instance(P, Z, vm)["networkInterfaces"]
    assert isinstance(nics, list)
    first = nics[0]
    assert isinstance(first, dict)
    return first


def test_a_mig_vm_has_its_templates_interface_and_an_internal_address_of_its_own(
    cloud: SimulatedCloud,
) -> None:
    _serve(cloud, "rr", ["a-0", "a-1", "a-2"])
    nics = [_nic(cloud, vm) for vm in ("a-0", "a-1", "a-2")]
    assert [(n["name"], n["network"], n["nicType"]) for n in nics] == [
        ("nic0", "global/networks/default", "GVNIC")
    ] * 3
    addresses = [ipaddress.ip_address(str(n["networkIP"])) for n in nics]
    assert all(address.is_private for address in addresses)
    assert len(set(addresses)) == 3
    assert all("accessConfigs" not in n for n in nics)  # the template asks for no external one
    listed = {vm["name"]: vm["networkInterfaces"] for vm in cloud.list_instances(P, Z)}
    assert [listed[vm][0]["networkIP"] for vm in ("a-0", "a-1", "a-2")] == [
        n["networkIP"] for n in nics
    ]


def test_an_address_is_the_vms_for_its_life_and_never_another_live_vms(
    cloud: SimulatedCloud,
) -> None:
    _serve(cloud, "rr", ["a-0", "a-1"])
    first = _nic(cloud, "a-0")["networkIP"]
    cloud.advance(timedelta(minutes=30))
    assert _nic(cloud, "a-0")["networkIP"] == first
    cloud.delete_managed_instances(P, Z, "mig", {"instances": [f"zones/{Z}/instances/a-0"]})
    _serve(cloud, "rr2", ["b-0"])
    live = [_nic(cloud, vm)["networkIP"] for vm in ("a-1", "b-0")]
    assert len(set(live)) == 2


def test_a_vm_inserted_with_an_access_config_has_an_external_address(
    cloud: SimulatedCloud,
) -> None:
    body = {
        "name": "solo",
        "machineType": f"zones/{Z}/machineTypes/{SHAPE}",
        "disks": [DISK],
        "networkInterfaces": [
            {**NIC, "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]}
        ],
    }
    cloud.insert_instance(P, Z, body)
    nic = _nic(cloud, "solo")
    assert ipaddress.ip_address(str(nic["networkIP"])).is_private
    configs = nic["accessConfigs"]
    assert isinstance(configs, list)
    assert configs[0]["type"] == "ONE_TO_ONE_NAT"
    assert ipaddress.ip_address(str(configs[0]["natIP"])).is_global


def test_an_address_asked_for_is_the_one_given(cloud: SimulatedCloud) -> None:
    body = {
        "name": "fixed",
        "machineType": f"zones/{Z}/machineTypes/{SHAPE}",
        "disks": [DISK],
        "networkInterfaces": [{**NIC, "networkIP": "10.128.0.42"}],
    }
    cloud.insert_instance(P, Z, body)
    assert _nic(cloud, "fixed")["networkIP"] == "10.128.0.42"
