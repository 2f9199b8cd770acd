"""What Terraform gives the agent function (the HCL, evaluated as ``terraform plan`` would with
the example's values): it is public at Cloud Run and verifies its callers itself; it and the
reconciler (whose sweep of lost agents builds the same service) read the agents' session key
from Secret Manager as OPENDWS_AGENT_SESSION_KEY and no other function does; both are told the
agent function's own run.app URL as OPENDWS_AGENT_URL, the audience the VMs' identity tokens
name; and the function reads the tenants' secrets only, by an IAM condition on each tenant's
secret prefix.

Sources: run/docs/triggering/https-request ("Deterministic URL":
``https://SERVICE-PROJECT_NUMBER.REGION.run.app``); compute/docs/instances/
verifying-instance-identity (the token's ``aud`` is the audience the VM asked for);
secret-manager/docs/access-control (roles/secretmanager.secretAccessor:
secretmanager.versions.access; granted on a project it reaches every secret of the project,
hence the condition); iam/docs/conditions-resource-attributes (the resource name of a
Secret Manager secret in a condition is ``projects/PROJECT_NUMBER/secrets/SECRET_ID``, its
versions' ``…/versions/VERSION``: ``resource.name.startsWith`` on it holds a grant to the
secrets whose ids start with a prefix); functions/docs/configuring/secrets (a secret as an
environment variable, read at instance start)."""

from __future__ import annotations

from typing import Any

import pytest

from opendws.bootstrap import Settings
from opendws.clock import ManualClock
from opendws.service.agents import AgentSettings, Sessions
from tests.unit.test_infra_iam import SECRET_PREFIXES, instances_of
from tests.unit.test_infra_tenants import Module, Ref, instances, known, root_with

SESSION_KEY = "OPENDWS_AGENT_SESSION_KEY"
SESSION_SECRET = "opendws-agent-session-key"
FUNCTIONS = ("intake", "reconcile", "timer", "ci_hook", "api", "agent")


def function(root: Module, name: str) -> Any:
    return root.module(name).resource("google_cloudfunctions2_function", "this")


def service_config(root: Module, name: str) -> Any:
    (config,) = function(root, name).attr("service_config")
    return config


def secret_environment(root: Module, name: str) -> dict[str, tuple[str, str]]:
    """A function's secret environment variables: name => (secret, version)."""
    return {
        item.attr("key"): (item.attr("secret"), item.attr("version"))
        for item in service_config(root, name).attr("secret_environment_variables")
    }


def account(key: str) -> Ref:
    return Ref(f'module.identities.google_service_account.account["{key}"].member')


def test_the_agent_function_is_public_and_checks_its_callers_itself() -> None:
    """The agents call from the job VMs; after registering they carry the function's own
    session token, which Cloud Run's invoker check cannot take: allUsers invokes it, from
    anywhere, and the function verifies every call (as ci_hook and api)."""
    root = root_with()
    assert function(root, "agent").attr("name") == "opendws-agent"
    (build,) = function(root, "agent").attr("build_config")
    assert build.attr("entry_point") == "agent"
    assert service_config(root, "agent").attr("ingress_settings") == "ALLOW_ALL"
    invokers = instances(root.module("agent"), "google_cloud_run_service_iam_member", "invoker")
    assert [grant.attr("member") for grant in invokers.values()] == ["allUsers"]
    assert service_config(root, "agent").attr("service_account_email") == Ref(
        'module.identities.google_service_account.account["agent"].email'
    )


def test_the_agent_and_the_reconciler_read_the_session_key_and_no_other_function() -> None:
    """The agent function signs each session with the key; the reconcile function builds the
    same service after each pass (container.agents.sweep), which refuses to start without a
    key of at least 16 bytes."""
    root = root_with()
    for name in FUNCTIONS:
        secrets = secret_environment(root, name)
        if name in ("agent", "reconcile"):
            assert secrets[SESSION_KEY] == (SESSION_SECRET, "latest"), name
        else:
            assert SESSION_KEY not in secrets, name
    readers = instances_of(
        root.module("secrets"), "google_secret_manager_secret_iam_member",
        "agent_session_key_reader",
    )  # fmt: skip
    assert {str(grant.attr("member")) for grant in readers} == {
        str(account("agent")),
        str(account("reconcile")),
    }
    for grant in readers:
        assert grant.attr("role") == "roles/secretmanager.secretAccessor"
        assert grant.attr("secret_id") == SESSION_SECRET
    module = root.module("secrets")
    key = module.resource("random_password", "agent_session_key")
    length = key.attr("length")
    # Letters and digits only (special = false): one byte each, as the service takes the key.
    assert key.attr("special") is False
    Sessions(b"k" * length, ManualClock(), AgentSettings().session_lifetime)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        Sessions(b"k" * 15, ManualClock(), AgentSettings().session_lifetime)
    version = module.resource("google_secret_manager_secret_version", "agent_session_key")
    assert version.attr("secret_data") == Ref(
        "module.secrets.random_password.agent_session_key.result"
    )


def test_the_agent_and_the_reconciler_are_told_the_agent_functions_own_run_app_url() -> None:
    """One URL for both ends: the reconciler writes it into the VMs' templates
    (opendws-agent-url), whose agents ask the metadata server for identity tokens with it as
    the audience; the agent function checks ``aud`` against its own OPENDWS_AGENT_URL. It is
    the function's deterministic run.app URL, built from its name, not read from the function
    (whose own environment holds it: a cycle); a check after apply compares the name."""
    root = root_with()
    urls = {
        name: service_config(root, name).attr("environment_variables")["OPENDWS_AGENT_URL"]
        for name in ("agent", "reconcile")
    }
    expected = "https://opendws-agent-${data.google_project.this.number}.us-central1.run.app"
    assert urls == {"agent": expected, "reconcile": expected}
    assert root.output("agent_url") == expected
    audiences = {
        Settings.from_environment({"OPENDWS_AGENT_URL": url}).agent_url for url in urls.values()
    }
    assert audiences == {expected}
    (check,) = [b for b in root.of("check").values() if "agent" in str(b.labels)]
    assert check.labels == ("agent_url_is_the_agent_services_run_app_url",)


def test_the_agent_reads_each_tenants_secrets_only_through_a_condition_on_its_prefix() -> None:
    """secretAccessor on the prefix's project, held to the secrets whose resource name (with
    the project number, as conditions see it) starts with the prefix; a prefix naming its
    project by id gets the number from a google_project data source, one by number keeps it."""
    root = root_with(tenant_secret_prefixes=SECRET_PREFIXES)
    grants = instances(root, "google_project_iam_member", "agent_reads_tenant_secrets")
    assert set(grants) == set(SECRET_PREFIXES)
    number = 'data.google_project.tenant_secrets["my-ml-project"].number'
    expected = {
        "vision": (
            "my-ml-project",
            f'resource.name.startsWith("projects/${{{number}}}/secrets/vision-")',
        ),
        "speech": (
            "123456789012",
            'resource.name.startsWith("projects/123456789012/secrets/speech-")',
        ),
    }
    for tenant, grant in grants.items():
        assert grant.attr("role") == "roles/secretmanager.secretAccessor"
        assert grant.attr("member") == account("agent")
        (condition,) = grant.attr("condition")
        assert (grant.attr("project"), condition.attr("expression")) == expected[tenant]
    lookups = known(
        root.evaluate(root.of("data")[("google_project", "tenant_secrets")].attributes["for_each"])
    )
    assert lookups == ["my-ml-project"]
    # Without prefixes the agent reads no secret at all.
    assert instances(root_with(), "google_project_iam_member", "agent_reads_tenant_secrets") == {}


def test_no_grant_lets_the_agent_read_every_secret_of_a_project() -> None:
    """The agent's project roles hold no Secret Manager role; its one project-level Secret
    Manager grant is the conditioned one above."""
    root = root_with(tenant_secret_prefixes=SECRET_PREFIXES)
    roles = root.module("identities").var("accounts")["agent"]["project_roles"]
    assert not [role for role in roles if "secretmanager" in role]
    for grant in instances(
        root, "google_project_iam_member", "agent_reads_tenant_secrets"
    ).values():
        assert grant.attr("condition"), grant


@pytest.mark.parametrize(
    "prefix",
    [
        "projects/my-ml-project/secrets/vision-",
        "projects/my-ml-project/secrets/",
        "projects/123456789012/secrets/speech_",
    ],
)
def test_a_secret_prefix_as_the_configuration_takes_it_is_accepted(prefix: str) -> None:
    root = root_with(tenant_secret_prefixes={"vision": prefix})
    assert all(ok for ok, _ in root.validations("tenant_secret_prefixes"))


@pytest.mark.parametrize(
    "prefix",
    [
        "vision-",
        "projects/my-ml-project/secrets",
        "projects/my-ml-project/secrets/vision/versions/1",
        "projects/My_Project/secrets/vision-",
        "projects/my-ml-project/locations/us/secrets/vision-",
    ],
)
def test_a_secret_prefix_the_configuration_would_refuse_is_refused(prefix: str) -> None:
    """The rule of opendws.domain.run.check_secret_prefix: projects/PROJECT/secrets/ and the
    start of the secrets' ids, if any."""
    from opendws.domain.run import SECRET_PREFIX

    assert SECRET_PREFIX.fullmatch(prefix) is None
    root = root_with(tenant_secret_prefixes={"vision": prefix})
    assert not all(ok for ok, _ in root.validations("tenant_secret_prefixes"))
