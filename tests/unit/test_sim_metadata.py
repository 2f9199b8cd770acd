"""The simulated Compute Engine takes a template's and a VM's metadata and service account as
Google does, and refuses what Google refuses; a group's VMs carry their template's metadata;
a group moves to another template by ``patch``.

Sources: compute/docs/reference/rest/v1/Metadata (``items[].key``: "Keys must conform to the
following regexp: [a-zA-Z0-9-_]+, and be less than 128 bytes in length"; ``items[].value``:
"their size must be less than or equal to 262144 bytes (256 KiB)"; ``items[]``: "The total size
of all keys and values must be less than 512 KB"); compute/docs/reference/rest/v1/instances
(``serviceAccounts[]``: "Only one service account per VM instance is supported");
compute/docs/reference/rest/v1/instanceGroupManagers/patch and ``instanceTemplate`` ("The
group uses this template to create all new instances in the managed instance group. The
templates for existing instances in the group do not change")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from opendws.clock import ManualClock
from opendws.sim import CloudError, SimulatedCloud

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
P, Z, SHAPE = "proj", "us-central1-a", "a3-highgpu-8g"
KIB = 1024
ACCOUNT = {"email": "vm@proj.iam.gserviceaccount.com", "scopes": ["cloud-platform"]}


def cloud() -> SimulatedCloud:
    world = SimulatedCloud(
        ManualClock(START), provisioning_latency=timedelta(0), operation_latency=timedelta(0)
    )
    world.set_stock(Z, SHAPE, 8)
    return world


def template(world: SimulatedCloud, name: str, **properties: Any) -> None:
    world.insert_instance_template(
        P, {"name": name, "properties": {"machineType": SHAPE, **properties}}
    )


def vm(world: SimulatedCloud, name: str, **fields: Any) -> None:
    world.insert_instance(
        P, Z, {"name": name, "machineType": f"zones/{Z}/machineTypes/{SHAPE}", **fields}
    )


def metadata(**items: str) -> dict[str, Any]:
    return {"items": [{"key": key, "value": value} for key, value in items.items()]}


def refused(call: Callable[[], object], match: str) -> None:
    with pytest.raises(CloudError, match=match) as raised:
        call()
    assert raised.value.http_status == 400


def resize(world: SimulatedCloud, name: str, vms: int) -> None:
    body = {
        "name": name,
        "instances": [{"name": f"{name}-{i}"} for i in range(vms)],
        "requestedRunDuration": {"seconds": "3600"},
    }
    world.insert_resize_request(P, Z, "mig", body, "beta")


def items_of(view: dict[str, Any]) -> dict[str, str]:
    return {item["key"]: item["value"] for item in view.get("metadata", {}).get("items", [])}


@pytest.mark.parametrize("where", ["template", "vm"])
def test_metadata_within_googles_limits_is_taken(where: str) -> None:
    world = cloud()
    big = metadata(**{"startup-script": "x" * 256 * KIB, "opendws-agent-url": "https://a"})
    if where == "template":
        template(world, "tpl", metadata=big, serviceAccounts=[ACCOUNT])
        assert items_of(world.get_instance_template(P, "tpl")["properties"])["opendws-agent-url"]
    else:
        vm(world, "one", metadata=big, serviceAccounts=[ACCOUNT])
        assert items_of(world.get_instance(P, Z, "one"))["opendws-agent-url"] == "https://a"


@pytest.mark.parametrize("where", ["template", "vm"])
def test_a_value_over_256_kib_is_refused(where: str) -> None:
    world = cloud()
    big = metadata(**{"startup-script": "x" * (256 * KIB + 1)})
    make = (lambda: template(world, "t", metadata=big)) if where == "template" else (
        lambda: vm(world, "v", metadata=big)
    )  # fmt: skip
    refused(make, r"at most 262144 bytes")


def test_keys_and_values_of_512_kb_or_more_in_all_are_refused() -> None:
    world = cloud()
    two = metadata(a="x" * 256 * KIB, b="x" * 256 * KIB)
    refused(lambda: vm(world, "v", metadata=two), r"less than 524288 bytes")
    refused(lambda: template(world, "t", metadata=two), r"less than 524288 bytes")


@pytest.mark.parametrize("key", ["has space", "dot.ted", "", "k" * 128])
def test_a_key_not_of_googles_form_is_refused(key: str) -> None:
    world = cloud()
    refused(lambda: vm(world, "v", metadata=metadata(**{key: "1"})), r"Keys must|less than 128")


def test_only_one_service_account_per_vm() -> None:
    world = cloud()
    second = {"email": "other@proj.iam.gserviceaccount.com", "scopes": []}
    refused(lambda: vm(world, "v", serviceAccounts=[ACCOUNT, second]), "only one service account")
    refused(
        lambda: template(world, "t", serviceAccounts=[ACCOUNT, second]), "only one service account"
    )


def test_a_groups_vms_carry_its_templates_metadata_and_account_and_the_group() -> None:
    world = cloud()
    template(world, "tpl", metadata=metadata(**{"opendws-agent-url": "https://a"}),
             serviceAccounts=[ACCOUNT])  # fmt: skip
    world.insert_instance_group_manager(
        P, Z, {"name": "mig", "instanceTemplate": "global/instanceTemplates/tpl"}
    )
    resize(world, "rr", 2)
    view = world.get_instance(P, Z, "rr-0")
    items = items_of(view)
    assert items["opendws-agent-url"] == "https://a"
    assert items["created-by"].endswith(f"/zones/{Z}/instanceGroupManagers/mig")
    assert view["serviceAccounts"] == [ACCOUNT]


def test_a_group_patched_to_another_template_makes_its_new_vms_from_it() -> None:
    world = cloud()
    template(world, "old")
    template(world, "new", metadata=metadata(**{"opendws-agent-url": "https://new"}))
    world.insert_instance_group_manager(
        P, Z, {"name": "mig", "instanceTemplate": "global/instanceTemplates/old"}
    )
    resize(world, "before", 1)
    refused(
        lambda: world.patch_instance_group_manager(
            P, Z, "mig", {"instanceTemplate": "global/instanceTemplates/none"}
        ),
        "no such global instance template",
    )
    world.patch_instance_group_manager(
        P, Z, "mig", {"instanceTemplate": "global/instanceTemplates/new"}
    )
    assert world.get_instance_group_manager(P, Z, "mig")["instanceTemplate"].endswith("/new")
    resize(world, "after", 1)
    assert "opendws-agent-url" not in items_of(world.get_instance(P, Z, "before-0"))
    assert items_of(world.get_instance(P, Z, "after-0"))["opendws-agent-url"] == "https://new"
    # The old one is free now; the new one is in use and cannot be deleted.
    world.delete_instance_template(P, "old")
    refused(lambda: world.delete_instance_template(P, "new"), "already being used")
