"""What a job VM carries on Google Cloud, in the bodies opendws sends Compute Engine: the MIG
pools' instance templates and the calendar blocks' VMs carry the agent (metadata
``startup-script``, which starts it, and the attribute ``opendws-agent-url``, where it reports)
and run as the job VMs' own service account with the ``cloud-platform`` scope, when these are
configured; without them the bodies carry neither.

Sources: compute/docs/reference/rest/v1/instanceTemplates and /instances (``metadata.items[]``,
``serviceAccounts[]``: "Only one service account per VM instance is supported");
compute/docs/reference/rest/v1/Metadata (a value at most 262144 bytes, all keys and values
under 512 KB); compute/docs/instances/startup-scripts/linux (the ``startup-script`` key);
compute/docs/access/service-accounts (the cloud-platform scope, access then set by IAM roles).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google.api_core.exceptions import Conflict, NotFound
from google.cloud import compute_v1

from opendws.adapters.gce import (
    AGENT_URL_KEY,
    CLOUD_PLATFORM_SCOPE,
    GPU_BOOT_IMAGE,
    STARTUP_SCRIPT_KEY,
    CloudSettings,
)
from opendws.adapters.mig import BASE_LABEL, MigFlexProvider, base_template_name, template_name
from opendws.adapters.reservations import CalendarReservationProvider
from opendws.agent.startup import METADATA_VALUE_LIMIT, startup_script
from opendws.bootstrap import Settings, cloud_settings
from opendws.ports import Order
from tests.builders import A3, ZONE, calendar, flex, pool

URL = "https://opendws-agent-123.us-central1.run.app"
ACCOUNT = "opendws-vm@p.iam.gserviceaccount.com"
CONFIGURED = CloudSettings(project="p", agent_url=URL, vm_service_account=ACCOUNT)
BARE = CloudSettings(project="p")


class Done:
    """A Compute operation that has finished."""

    def result(self, timeout: float | None = None) -> object:
        return None


class Templates:
    """instanceTemplates as Compute keeps them: insert (409 if the name is taken), get (404),
    list, delete."""

    def __init__(self) -> None:
        self.stored: dict[str, compute_v1.InstanceTemplate] = {}
        self.deleted: list[str] = []

    def insert(self, *, project: str, instance_template_resource: Any) -> Done:
        template = compute_v1.InstanceTemplate(instance_template_resource)
        if template.name in self.stored:
            raise Conflict(f"{template.name} already exists")
        self.stored[template.name] = template
        return Done()

    def get(self, *, project: str, instance_template: str) -> compute_v1.InstanceTemplate:
        if instance_template not in self.stored:
            raise NotFound(instance_template)
        return self.stored[instance_template]

    def list(self, *, request: Any) -> list[compute_v1.InstanceTemplate]:
        return list(self.stored.values())

    def delete(self, *, project: str, instance_template: str) -> Done:
        self.deleted.append(instance_template)
        del self.stored[instance_template]
        return Done()


class Groups:
    """instanceGroupManagers: none until one is inserted."""

    def __init__(self) -> None:
        self.stored: dict[str, compute_v1.InstanceGroupManager] = {}

    def get(self, *, project: str, zone: str, instance_group_manager: str) -> Any:
        if instance_group_manager not in self.stored:
            raise NotFound(instance_group_manager)
        return self.stored[instance_group_manager]

    def insert(self, *, project: str, zone: str, instance_group_manager_resource: Any) -> Done:
        self.stored[instance_group_manager_resource.name] = instance_group_manager_resource
        return Done()


class Recorder:
    """Any other client: each call is recorded and finishes at once."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, method: str) -> Callable[..., Done]:
        def call(**kwargs: Any) -> Done:
            self.calls.append((method, kwargs))
            return Done()

        return call


def made_template(settings: CloudSettings, templates: Templates | None = None) -> Any:
    """The instance template a MIG pool's first order makes, under ``settings``."""
    templates = templates or Templates()
    groups = Groups()
    provider = MigFlexProvider(
        settings, templates=templates, groups=groups,  # type: ignore[arg-type]
        resize_requests=Recorder(),  # type: ignore[arg-type]
    )  # fmt: skip
    home = pool(zone=ZONE, capacity=8)
    provider.provision(Order(request=flex("train", vm_count=2), pool=home, attempt=1))
    (group,) = groups.stored.values()
    return templates.stored[group.instance_template.rsplit("/", 1)[-1]]


def calendar_vms(settings: CloudSettings) -> list[compute_v1.Instance]:
    """The VMs a calendar block's order inserts, under ``settings``."""
    instances = Recorder()
    provider = CalendarReservationProvider(
        settings, future_reservations=Recorder(),  # type: ignore[arg-type]
        instances=instances,  # type: ignore[arg-type]
    )  # fmt: skip
    home = pool(zone=ZONE, capacity=8)
    provider.provision(Order(request=calendar("block", vm_count=2), pool=home, attempt=1))
    return [kwargs["instance_resource"] for method, kwargs in instances.calls if method == "insert"]


def items(metadata: compute_v1.Metadata) -> dict[str, str]:
    return {item.key: item.value for item in metadata.items}


def test_a_pools_template_carries_the_agent_and_the_job_vms_account_when_configured() -> None:
    properties = made_template(CONFIGURED).properties
    metadata = items(properties.metadata)
    assert metadata[STARTUP_SCRIPT_KEY] == startup_script(URL)
    assert metadata[AGENT_URL_KEY] == URL
    (account,) = properties.service_accounts
    assert (account.email, list(account.scopes)) == (ACCOUNT, [CLOUD_PLATFORM_SCOPE])


def test_without_an_agent_url_or_an_account_the_template_carries_neither() -> None:
    properties = made_template(BARE).properties
    assert STARTUP_SCRIPT_KEY not in items(properties.metadata)
    assert AGENT_URL_KEY not in items(properties.metadata)
    assert list(properties.service_accounts) == []


def test_a_calendar_blocks_vms_carry_the_agent_and_the_account_when_configured() -> None:
    vms = calendar_vms(CONFIGURED)
    assert [vm.name for vm in vms] == [f"{vms[0].name[:-2]}-{i}" for i in range(2)]
    for vm in vms:
        assert items(vm.metadata) == {STARTUP_SCRIPT_KEY: startup_script(URL), AGENT_URL_KEY: URL}
        (account,) = vm.service_accounts
        assert (account.email, list(account.scopes)) == (ACCOUNT, [CLOUD_PLATFORM_SCOPE])


def test_without_them_a_calendar_blocks_vms_carry_neither() -> None:
    for vm in calendar_vms(BARE):
        assert list(vm.metadata.items) == []
        assert list(vm.service_accounts) == []


def test_the_agents_metadata_fits_computes_limits_with_room_to_spare() -> None:
    """A value at most 262144 bytes; all keys and values under 512 KB
    (compute/docs/reference/rest/v1/Metadata)."""
    metadata = made_template(CONFIGURED).properties.metadata
    sizes = [len(item.key.encode()) + len(item.value.encode()) for item in metadata.items]
    assert max(sizes) < METADATA_VALUE_LIMIT // 4
    assert sum(sizes) < 512 * 1024 // 8


def test_gpu_vms_boot_a_deep_learning_vm_family_by_default() -> None:
    """The NVIDIA driver, Docker with the NVIDIA Container Toolkit and python3 come with the
    Deep Learning VM GPU images (cloud.google.com/deep-learning-vm/docs/images)."""
    assert BARE.boot_image == GPU_BOOT_IMAGE
    assert GPU_BOOT_IMAGE.startswith("projects/deeplearning-platform-release/global/images/family/")
    disk = made_template(BARE).properties.disks[0]
    assert disk.initialize_params.source_image == GPU_BOOT_IMAGE


def test_the_templates_name_is_the_same_for_the_same_properties_and_new_for_others() -> None:
    """Templates cannot be changed: a template of other properties (another agent URL, an
    agent of another version, another image) is another template, under another name; the
    same properties find the one already made (safe to repeat)."""
    home = pool(zone=ZONE, capacity=8)
    first, again = made_template(CONFIGURED), made_template(CONFIGURED)
    assert first.name == again.name == template_name(home, first.properties)
    assert first.name.startswith(f"odws-{A3}-")
    assert len(first.name) <= 63
    other = CloudSettings(project="p", agent_url=URL + "/x", vm_service_account=ACCOUNT)
    assert made_template(other).name != first.name
    assert made_template(BARE).name != first.name


def test_a_teams_base_template_is_the_starting_point_and_gets_the_agent() -> None:
    """A template of the pool's machine type labelled as a team's base (infra/modules/
    compute_pools) gives the VMs its image and account; opendws adds the agent, and its own
    template is not labelled as a base."""
    templates = Templates()
    home = pool(zone=ZONE, capacity=8)
    base = compute_v1.InstanceTemplate(
        name=base_template_name(home),
        properties=compute_v1.InstanceProperties(
            machine_type=A3,
            scheduling=compute_v1.Scheduling(provisioning_model="FLEX_START"),
            disks=[compute_v1.AttachedDisk(
                boot=True,
                initialize_params=compute_v1.AttachedDiskInitializeParams(source_image="mine"),
            )],
            service_accounts=[compute_v1.ServiceAccount(email="team@p.iam.gserviceaccount.com")],
            metadata=compute_v1.Metadata(
                items=[compute_v1.Items(key="enable-oslogin", value="TRUE")]
            ),
            labels={**BASE_LABEL, "team": "ml"},
        ),
    )  # fmt: skip
    templates.stored[base.name] = base
    made = made_template(CONFIGURED, templates)
    assert made.name != base.name
    properties = made.properties
    assert properties.disks[0].initialize_params.source_image == "mine"
    assert [a.email for a in properties.service_accounts] == ["team@p.iam.gserviceaccount.com"]
    assert items(properties.metadata) == {
        "enable-oslogin": "TRUE", STARTUP_SCRIPT_KEY: startup_script(URL), AGENT_URL_KEY: URL,
    }  # fmt: skip
    assert dict(properties.labels) == {"team": "ml", "managed-by": "opendws"}
    assert base.name in templates.stored  # a base is never deleted


def test_a_template_of_an_older_opendws_under_the_base_name_is_not_a_base() -> None:
    """An older opendws named its own template ``odws-{shape}-flex``, without the agent and
    without the base label: its VMs' image and settings are not a team's choice, so the pool's
    template is made from the settings (and the old one deleted once no group uses it)."""
    templates = Templates()
    home = pool(zone=ZONE, capacity=8)
    old = compute_v1.InstanceTemplate(
        name=base_template_name(home),
        properties=compute_v1.InstanceProperties(
            machine_type=A3, labels={"managed-by": "opendws"},
            scheduling=compute_v1.Scheduling(provisioning_model="FLEX_START"),
        ),
    )  # fmt: skip
    templates.stored[old.name] = old
    made = made_template(CONFIGURED, templates)
    assert made.properties.disks[0].initialize_params.source_image == GPU_BOOT_IMAGE
    assert templates.deleted == [old.name]


def test_an_agent_url_the_agent_cannot_use_is_refused_when_settings_are_made() -> None:
    with pytest.raises(ValueError, match="agent_url must be an http"):
        CloudSettings(project="p", agent_url="opendws-agent")


def test_the_environment_configures_the_agent_and_the_job_vms_account() -> None:
    settings = cloud_settings(
        Settings.from_environment({
            "OPENDWS_PROJECT": "p", "OPENDWS_AGENT_URL": URL,
            "OPENDWS_VM_SERVICE_ACCOUNT": ACCOUNT,
        })
    )  # fmt: skip
    assert (settings.agent_url, settings.vm_service_account) == (URL, ACCOUNT)
    bare = cloud_settings(Settings.from_environment({"OPENDWS_PROJECT": "p"}))
    assert (bare.agent_url, bare.vm_service_account) == (None, None)
