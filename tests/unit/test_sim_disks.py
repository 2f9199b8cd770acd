"""Disk types on the simulated Compute Engine, as Google takes them: a URL on
``instances.insert``, a bare name in an instance template (CP
``AttachedDiskInitializeParams.disk_type``: "When creating a single instance, you must provide
either the full or partial URL of the disk type ... When creating an instance template ... you
specify the disk type without a URL"; Google's answer to a bare name on insert,
terraform-provider-google #275, #322, #3713: "Invalid value for field
'resource.disks[0].initializeParams.diskType': 'pd-ssd'. The URL is malformed.")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from opendws.adapters.gce import CloudSettings, boot_disk
from opendws.clock import ManualClock
from opendws.sim import CloudError, SimulatedCloud

P, Z, SHAPE = "proj", "us-central1-a", "a3-highgpu-8g"


def cloud() -> SimulatedCloud:
    world = SimulatedCloud(
        ManualClock(datetime(2026, 3, 2, tzinfo=UTC)), operation_latency=timedelta(0)
    )
    world.set_stock(Z, SHAPE, 4)
    return world


def vm(name: str, disk_type: str) -> dict[str, object]:
    return {
        "name": name,
        "machineType": f"zones/{Z}/machineTypes/{SHAPE}",
        "disks": [{"boot": True, "initializeParams": {"diskType": disk_type}}],
    }


def template(name: str, disk_type: str) -> dict[str, object]:
    disks = [{"boot": True, "initializeParams": {"diskType": disk_type}}]
    return {"name": name, "properties": {"machineType": SHAPE, "disks": disks}}


@pytest.mark.parametrize(
    "disk_type",
    [
        f"zones/{Z}/diskTypes/pd-balanced",
        f"projects/{P}/zones/{Z}/diskTypes/pd-balanced",
        f"https://www.googleapis.com/compute/v1/projects/{P}/zones/{Z}/diskTypes/hyperdisk-balanced",
    ],
)
def test_an_insert_takes_a_full_or_partial_disk_type_url(disk_type: str) -> None:
    assert "error" not in cloud().insert_instance(P, Z, vm("vm", disk_type))


def test_an_insert_refuses_a_bare_disk_type_name_or_another_zones() -> None:
    world = cloud()
    with pytest.raises(CloudError, match=r"disks\[0\].initializeParams.diskType.*malformed"):
        world.insert_instance(P, Z, vm("bare", "pd-balanced"))
    with pytest.raises(CloudError, match="zone us-central1-a"):
        world.insert_instance(P, Z, vm("other", "zones/us-east5-a/diskTypes/pd-balanced"))
    assert world.list_instances(P, Z) == []


def test_a_template_takes_the_bare_name_and_refuses_a_url() -> None:
    world = cloud()
    world.insert_instance_template(P, template("bare", "pd-balanced"))
    with pytest.raises(CloudError, match="not an url"):
        world.insert_instance_template(P, template("url", f"zones/{Z}/diskTypes/pd-balanced"))


def test_the_adapters_boot_disk_is_a_url_for_a_vm_and_a_name_for_a_template() -> None:
    """What the calendar provider inserts and what the flex templates carry (adapters.gce)."""
    settings = CloudSettings(project=P)
    one_vm = boot_disk(settings, SHAPE, zone=Z).initialize_params.disk_type
    assert one_vm == f"zones/{Z}/diskTypes/pd-balanced"
    assert boot_disk(settings, SHAPE).initialize_params.disk_type == "pd-balanced"
    world = cloud()
    assert "error" not in world.insert_instance(P, Z, vm("vm", one_vm))
