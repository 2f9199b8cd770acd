"""What Terraform gives the job VMs (the HCL, evaluated as ``terraform plan`` would with the
example's values): their own service account `opendws-vm` with the logging and image-pull
roles and nothing else (no Secret Manager role: the agent function hands the job its secrets);
the functions that make VMs may act as it; the functions are told the account and the agent
function's URL; an optional Cloud NAT (off unless regions are named); a Deep Learning VM GPU
image as the default boot image; the README says what the subnets need and what is not
provided.

Sources: logging/docs/access-control (roles/logging.logWriter: logging.logEntries.create);
artifact-registry/docs/access-control (roles/artifactregistry.reader: pull images);
compute/docs/access/service-accounts (a user who makes a VM running as a service account needs
iam.serviceAccounts.actAs on it, in roles/iam.serviceAccountUser); vpc/docs/
configure-private-google-access (``private_ip_google_access``: VMs without external addresses
reach Google's APIs); nat/docs/overview; cloud.google.com/deep-learning-vm/docs/images."""

from __future__ import annotations

from typing import Any

from opendws.adapters.gce import GPU_BOOT_IMAGE
from opendws.bootstrap import CLOUD_SETTINGS_ENVIRONMENT
from tests.unit.test_infra import INFRA, MODULES, root_locals, substituted, variable_default
from tests.unit.test_infra_tenants import Ref, example_root, instances, known, root_with

VM_ROLES = {"roles/logging.logWriter", "roles/artifactregistry.reader"}
MAKERS = {"intake", "reconcile", "timer", "api"}


def vm_account() -> dict[str, Any]:
    accounts = example_root().module("identities").var("accounts")
    account: dict[str, Any] = accounts["vm"]
    return account


def vm_member_grants() -> list[tuple[str, str]]:
    """(role, resource) of every IAM grant anywhere in infra/ whose member is the VM account
    (its key in module.identities is ``vm``)."""
    text = "\n".join(p.read_text() for p in INFRA.rglob("*.tf"))
    assert 'account["vm"]' not in text  # granted only through module.identities' roles
    identities = example_root().module("identities")
    bindings = identities.local("project_bindings")
    return [(b["role"], "project") for b in bindings.values() if b["account"] == "vm"]


def test_the_job_vms_account_holds_logging_and_image_pull_only() -> None:
    account = vm_account()
    assert account["account_id"] == "opendws-vm"
    assert set(account["project_roles"]) == VM_ROLES
    assert set(vm_member_grants()) == {(role, "project") for role in VM_ROLES}


def test_the_job_vms_account_reads_no_secret() -> None:
    """The job's secrets reach it from the agent function, never through the VM's account:
    no Secret Manager role is granted to it, at the project or on a secret."""
    assert not any("secretmanager" in role for role, _ in vm_member_grants())
    root = example_root()
    for module in ("secrets",):
        for grant in instances(root.module(module), "google_secret_manager_secret_iam_member",
                               "hook_reader").values():  # fmt: skip
            assert "opendws-vm" not in str(grant.attr("member"))
    readers = {str(r) for r in root.module("secrets").var("hook_readers")}
    readers |= {str(r) for r in root.module("secrets").var("api_key_readers")}
    assert not any('account["vm"]' in reader for reader in readers)


def test_the_functions_that_make_vms_may_act_as_the_job_vms_account() -> None:
    grants = instances(example_root(), "google_service_account_iam_member", "act_as_job_vm_account")
    assert MAKERS <= set(grants) <= set(root_locals()["names"])
    for key, grant in grants.items():
        assert grant.attr("role") == "roles/iam.serviceAccountUser"
        account = 'module.identities.google_service_account.account["{}"].{}'
        assert grant.attr("service_account_id") == Ref(account.format("vm", "name"))
        assert grant.attr("member") == Ref(account.format(key, "member"))


def test_the_functions_are_told_the_job_vms_account_and_the_agent_functions_url() -> None:
    environment = root_locals()["common_environment"]
    assert environment["OPENDWS_VM_SERVICE_ACCOUNT"] == "${module.identities.emails.vm}"
    assert environment["OPENDWS_AGENT_URL"] == "${local.agent_url}"
    assert {"OPENDWS_AGENT_URL", "OPENDWS_VM_SERVICE_ACCOUNT"} <= set(CLOUD_SETTINGS_ENVIRONMENT)
    # The agent function's deterministic run.app URL (run/docs/triggering/https-request), as
    # the timer's: known before the function exists.
    values = {
        "data.google_project.this.number": "123", "var.region": "us-central1",
        "local.names.agent": "opendws-agent",
    }  # fmt: skip
    url = substituted(root_locals()["agent_url"], values)
    assert url == "https://opendws-agent-123.us-central1.run.app"


def test_the_templates_terraform_makes_name_the_job_vms_account_by_default() -> None:
    pools = [{"shape": "a3-highgpu-8g"}, {"shape": "a3-megagpu-8g", "service_account": "t@p.iam"}]
    root = root_with(flex_pools=pools)
    templates = instances(root.module("compute_pools"), "google_compute_instance_template", "flex")
    emails = {
        shape: [account.attr("email") for account in template.attr("service_account")]
        for shape, template in templates.items()
    }
    project = root.var("project")
    assert emails == {
        "a3-highgpu-8g": [f"opendws-vm@{project}.iam.gserviceaccount.com"],
        "a3-megagpu-8g": ["t@p.iam"],
    }


def test_cloud_nat_is_off_unless_regions_are_named() -> None:
    assert variable_default(INFRA / "variables.tf", "vm_nat_regions") == []
    assert instances(example_root(), "google_compute_router_nat", "vm_nat") == {}
    assert instances(example_root(), "google_compute_router", "vm_nat") == {}
    root = root_with(vm_nat_regions=["us-central1", "europe-west4"])
    nats = instances(root, "google_compute_router_nat", "vm_nat")
    routers = instances(root, "google_compute_router", "vm_nat")
    assert set(nats) == set(routers) == {"us-central1", "europe-west4"}
    for region, nat in nats.items():
        assert nat.attr("region") == region
        assert nat.attr("source_subnetwork_ip_ranges_to_nat") == "ALL_SUBNETWORKS_ALL_IP_RANGES"
        assert routers[region].attr("network") == known(root.local("vm_network_reference"))


def test_gpu_pools_boot_a_deep_learning_vm_image_unless_overridden() -> None:
    assert variable_default(INFRA / "variables.tf", "vm_boot_image") == GPU_BOOT_IMAGE
    assert (
        variable_default(MODULES / "compute_pools" / "variables.tf", "boot_image") == GPU_BOOT_IMAGE
    )
    root = root_with(flex_pools=[{"shape": "a3-highgpu-8g", "boot_image": "projects/p/mine"}])
    (template,) = instances(
        root.module("compute_pools"), "google_compute_instance_template", "flex"
    ).values()
    (disk,) = template.attr("disk")
    assert disk.attr("source_image") == "projects/p/mine"


def test_the_readme_says_what_a_job_vm_needs_and_what_is_not_provided() -> None:
    readme = (INFRA / "README.md").read_text()
    section = readme.split("## What a job VM needs", 1)[1].split("\n## ", 1)[0]
    for needed in ("private_ip_google_access = true", "vm_nat_regions", "opendws-vm",
                   "roles/logging.logWriter", "roles/artifactregistry.reader",
                   "compact placement", "GPUDirect", "NVIDIA", "python3"):  # fmt: skip
        assert needed in section, needed
