"""The simulated cloud's internal address range is a setting: by default the range of auto mode
VPC networks' subnets (vpc/docs/subnets: 10.128.0.0/9; us-central1's subnet 10.128.0.0/20), one
/24 after another from its .2 (a subnet's first two addresses are Google's own); a local cloud
whose VMs really run takes them from 127.0.0.0/8, so each VM listens on a loopback address of
its own (127.0.0.1, the machine's own, is never given)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from opendws.clock import ManualClock
from opendws.sim import SimulatedCloud

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
P, Z, SHAPE = "proj", "us-central1-a", "a3-highgpu-8g"
NIC = {"network": "global/networks/default"}


def _addresses(cloud: SimulatedCloud, count: int) -> list[str]:
    cloud.insert_instance_template(
        P, {"name": "tpl", "properties": {"machineType": SHAPE, "networkInterfaces": [NIC]}}
    )
    cloud.insert_instance_group_manager(
        P, Z, {"name": "mig", "instanceTemplate": "global/instanceTemplates/tpl"}
    )
    cloud.set_stock(Z, SHAPE, count)
    names = [f"vm-{i:03d}" for i in range(count)]
    body = {"name": "rr", "instances": [{"name": n} for n in names],
            "requestedRunDuration": {"seconds": "3600"}}  # fmt: skip
    cloud.insert_resize_request(P, Z, "mig", body, "beta")
    cloud.advance(timedelta(seconds=20))
    return [cloud.get_instance(P, Z, n)["networkInterfaces"][0]["networkIP"] for n in names]


def test_by_default_addresses_come_from_the_auto_mode_range() -> None:
    addresses = _addresses(SimulatedCloud(ManualClock(START), operation_latency=timedelta(0)), 254)
    assert addresses[:2] == ["10.128.0.2", "10.128.0.3"]
    assert addresses[251:] == ["10.128.0.253", "10.128.1.2", "10.128.1.3"]


def test_a_local_cloud_gives_each_vm_a_loopback_address_of_its_own() -> None:
    cloud = SimulatedCloud(
        ManualClock(START), internal_range="127.0.0.0/8", operation_latency=timedelta(0)
    )
    addresses = _addresses(cloud, 254)
    assert addresses[:2] == ["127.0.0.2", "127.0.0.3"]
    assert addresses[251:] == ["127.0.0.253", "127.0.1.2", "127.0.1.3"]
    cloud.reset()  # configuration, not state: kept
    assert _addresses(cloud, 1) == ["127.0.0.2"]


@pytest.mark.parametrize(
    ("value", "message"),
    [("127.0.0.0/25", "a /24 or larger"), ("10.128.0.1/9", "not an IPv4 network"),
     ("fd00::/8", "not an IPv4 network")],
)  # fmt: skip
def test_an_internal_range_that_cannot_hold_a_subnet_is_refused(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimulatedCloud(ManualClock(START), internal_range=value)
