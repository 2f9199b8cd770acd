"""Over the Compute Engine emulator, read back with the real client: a VM a MIG pool's resize
request makes from opendws' template carries the agent (``startup-script``, the
``opendws-agent-url`` attribute) and runs as the job VMs' account; a group an older opendws
made on a template without the agent makes its new VMs from the new template, and the old
template is deleted once no group uses it; doing it all again changes nothing.

Sources: compute/docs/reference/rest/v1/instances (``metadata``, ``serviceAccounts``);
compute/docs/reference/rest/v1/instanceGroupManagers/patch ("If you update your group to
specify a new template ... "), ``InstanceGroupManager.instanceTemplate`` ("The group uses this
template to create all new instances in the managed instance group. The templates for existing
instances in the group do not change"); compute/docs/instance-templates (templates cannot be
changed; one a group uses cannot be deleted)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1, compute_v1beta

from emulators import ComputeEmulator
from opendws.adapters.gce import (
    AGENT_URL_KEY,
    CLOUD_PLATFORM_SCOPE,
    STARTUP_SCRIPT_KEY,
    CloudSettings,
)
from opendws.adapters.mig import MigFlexProvider, base_template_name, group_name
from opendws.agent.startup import startup_script
from opendws.clock import ManualClock
from opendws.ports import Order, ProvisionPhase
from opendws.sim import SimulatedCloud
from tests.builders import A3, NOW, flex, pool

PROJECT = "job-vms"
ZONE = "us-central1-a"
URL = "https://opendws-agent-1.us-central1.run.app"
ACCOUNT = f"opendws-vm@{PROJECT}.iam.gserviceaccount.com"
SETTINGS = CloudSettings(project=PROJECT, agent_url=URL, vm_service_account=ACCOUNT)


@pytest.fixture
def emulator() -> Iterator[ComputeEmulator]:
    cloud = SimulatedCloud(
        ManualClock(NOW), provisioning_latency=timedelta(0), operation_latency=timedelta(0)
    )
    cloud.set_stock(ZONE, A3, 8)
    with ComputeEmulator(cloud) as running:
        yield running


def options(emulator: ComputeEmulator) -> dict[str, Any]:
    return {
        "client_options": {"api_endpoint": emulator.endpoint},
        "credentials": AnonymousCredentials(),
    }


def provider(emulator: ComputeEmulator, settings: CloudSettings = SETTINGS) -> MigFlexProvider:
    """A provider as a fresh process has it (nothing remembered)."""
    common = options(emulator)
    return MigFlexProvider(
        settings,
        templates=compute_v1.InstanceTemplatesClient(**common),
        groups=compute_v1.InstanceGroupManagersClient(**common),
        resize_requests=compute_v1beta.InstanceGroupManagerResizeRequestsClient(**common),
        instances=compute_v1.InstancesClient(**common),
    )


def template_names(emulator: ComputeEmulator) -> list[str]:
    client = compute_v1.InstanceTemplatesClient(**options(emulator))
    return sorted(template.name for template in client.list(project=PROJECT))


def group_template(emulator: ComputeEmulator) -> str:
    group = compute_v1.InstanceGroupManagersClient(**options(emulator)).get(
        project=PROJECT, zone=ZONE, instance_group_manager=group_name(pool(zone=ZONE))
    )
    return group.instance_template.rsplit("/", 1)[-1]


def vm(emulator: ComputeEmulator, name: str) -> compute_v1.Instance:
    return compute_v1.InstancesClient(**options(emulator)).get(
        project=PROJECT, zone=ZONE, instance=name
    )


def metadata(instance: compute_v1.Instance) -> dict[str, str]:
    return {item.key: item.value for item in instance.metadata.items}


def test_a_vm_the_group_makes_from_the_template_carries_the_agent_and_the_account(
    emulator: ComputeEmulator,
) -> None:
    home = pool(zone=ZONE, capacity=8)
    mig = provider(emulator)
    order = Order(request=flex("train", vm_count=2), pool=home, attempt=1)
    mig.provision(order)
    assert mig.observe([home])[order.name].phase is ProvisionPhase.READY
    for rank in range(2):
        instance = vm(emulator, f"{order.name}-{rank}")
        items = metadata(instance)
        assert items[STARTUP_SCRIPT_KEY] == startup_script(URL)
        assert items[AGENT_URL_KEY] == URL
        assert items["created-by"].endswith(f"/instanceGroupManagers/{group_name(home)}")
        (account,) = instance.service_accounts
        assert (account.email, list(account.scopes)) == (ACCOUNT, [CLOUD_PLATFORM_SCOPE])


def test_a_group_on_an_older_template_moves_to_the_new_one_and_the_old_one_goes(
    emulator: ComputeEmulator,
) -> None:
    """An older opendws made ``odws-{shape}-flex`` without the agent and the group on it; its
    VMs keep running as they are, the group's next VMs carry the agent, and the old template,
    which no group uses any longer, is deleted."""
    home = pool(zone=ZONE, capacity=8)
    templates = compute_v1.InstanceTemplatesClient(**options(emulator))
    old = compute_v1.InstanceTemplate(
        name=base_template_name(home),
        properties=compute_v1.InstanceProperties(
            machine_type=A3, labels={"managed-by": "opendws"},
            scheduling=compute_v1.Scheduling(provisioning_model="FLEX_START"),
        ),
    )  # fmt: skip
    templates.insert(project=PROJECT, instance_template_resource=old).result()
    groups = compute_v1.InstanceGroupManagersClient(**options(emulator))
    group = compute_v1.InstanceGroupManager(
        name=group_name(home), base_instance_name=group_name(home), target_size=0,
        instance_template=f"projects/{PROJECT}/global/instanceTemplates/{old.name}",
    )  # fmt: skip
    groups.insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=group).result()
    # A VM the older version's group made, running.
    resize = compute_v1beta.InstanceGroupManagerResizeRequest(
        name="odws-before", instances=[compute_v1beta.PerInstanceConfig(name="odws-before-0")],
        requested_run_duration=compute_v1beta.Duration(seconds=3600),
    )  # fmt: skip
    compute_v1beta.InstanceGroupManagerResizeRequestsClient(**options(emulator)).insert(
        project=PROJECT, zone=ZONE, instance_group_manager=group_name(home),
        instance_group_manager_resize_request_resource=resize,
    ).result()  # fmt: skip
    assert AGENT_URL_KEY not in metadata(vm(emulator, "odws-before-0"))

    after = Order(request=flex("after", vm_count=1), pool=home, attempt=1)
    provider(emulator).provision(after)
    current = group_template(emulator)
    assert current != old.name
    assert metadata(vm(emulator, f"{after.name}-0"))[AGENT_URL_KEY] == URL
    assert AGENT_URL_KEY not in metadata(vm(emulator, "odws-before-0"))  # left as it was
    assert template_names(emulator) == [current]

    again = Order(request=flex("again", vm_count=1), pool=home, attempt=1)
    provider(emulator).provision(again)  # another process: the same template, nothing new
    assert group_template(emulator) == current
    assert template_names(emulator) == [current]
