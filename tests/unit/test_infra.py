"""infra/ against the code it deploys: every function with the trigger its signature needs,
every topic the code publishes to, every index and TTL field the store's queries and records
need, the settings the functions read, and no basic role anywhere (parsed with python-hcl2;
`terraform validate` needs the providers, which these machines cannot download)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import hcl2
import pytest

import opendws.adapters.firestore as firestore_adapter
import opendws.adapters.ranks as ranks_adapter
from opendws.adapters import mig
from opendws.adapters.gce import boot_disk, network
from opendws.adapters.mig import BASE_LABEL, base_template_name
from opendws.adapters.pubsub import REQUESTS_TOPIC
from opendws.bootstrap import CLOUD_SETTINGS_ENVIRONMENT, Settings, cloud_settings
from opendws.catalog import MACHINE_TYPES, TPU_RUNTIME_VERSIONS, VM_PROFILES, VmProfile
from opendws.domain.model import FLEX_MAX_RUN, Pool, Provider

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
MODULES = INFRA / "modules"
BASIC_ROLES = {"roles/owner", "roles/editor", "roles/viewer"}
# The functions of functions/main.py, by entry point.
FUNCTION_NAMES = ("intake", "reconcile", "timer", "ci_hook", "api", "agent")


def unquote(value: Any) -> Any:
    """python-hcl2 keeps string literals' quotes: '"x"' -> 'x'."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


@cache
def parsed(path: Path) -> dict[str, Any]:
    with path.open() as handle:
        document: dict[str, Any] = hcl2.load(handle)
    return document


def tf_files() -> list[Path]:
    return sorted(INFRA.glob("*.tf")) + sorted(MODULES.glob("*/*.tf"))


def blocks(path: Path, kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(label, body) of each ``kind`` block (module, variable, output) in one file."""
    for entry in parsed(path).get(kind, []):
        for label, body in entry.items():
            yield unquote(label), body


def resources(path: Path) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(type, name, body) of each resource in one file."""
    for entry in parsed(path).get("resource", []):
        for kind, named in entry.items():
            for name, body in named.items():
                yield unquote(kind), unquote(name), body


def all_resources(kind: str) -> list[tuple[Path, str, dict[str, Any]]]:
    return [
        (path, name, body)
        for path in tf_files()
        for found, name, body in resources(path)
        if found == kind
    ]


def root_locals() -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for entry in parsed(INFRA / "main.tf").get("locals", []):
        merged.update(entry)
    return merged


def module_locals(module: str) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for entry in parsed(MODULES / module / "main.tf").get("locals", []):
        merged.update(entry)
    return merged


def root_modules() -> dict[str, dict[str, Any]]:
    return dict(blocks(INFRA / "main.tf", "module"))


def function_modules() -> dict[str, dict[str, Any]]:
    """The root's function deployments by entry point."""
    return {
        unquote(body["entry_point"]): body
        for body in root_modules().values()
        if unquote(body["source"]) == "./modules/function"
    }


def signatures() -> dict[str, str]:
    """Each function of functions/main.py and its functions-framework signature
    (``cloud_event`` or ``http``)."""
    tree = ast.parse((ROOT / "functions" / "main.py").read_text())
    found = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if (
                isinstance(decorator, ast.Attribute)
                and isinstance(decorator.value, ast.Name)
                and decorator.value.id == "functions_framework"
            ):
                found[node.name] = decorator.attr
    return found


def variable_default(path: Path, name: str) -> Any:
    return unquote(dict(blocks(path, "variable"))[name].get("default"))


# Functions and triggers -----------------------------------------------------------------------


def test_every_function_in_main_is_deployed_once() -> None:
    assert set(signatures()) == set(FUNCTION_NAMES)
    assert set(function_modules()) == set(signatures())
    names = [unquote(name) for name in root_locals()["names"].values()]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("entry_point", FUNCTION_NAMES)
def test_each_function_has_the_trigger_its_signature_needs(entry_point: str) -> None:
    deployment = function_modules()[entry_point]
    if signatures()[entry_point] == "cloud_event":
        trigger = deployment["pubsub_trigger"]
        assert trigger["service_account_email"] == "${module.identities.emails.trigger}"
        # Eventarc invokes the function as the trigger's account, which must hold run.invoker.
        assert deployment["invokers"] == ["${local.member.trigger}"]
    else:
        assert "pubsub_trigger" not in deployment, f"{entry_point} is an HTTP function"
        assert deployment["invokers"], f"nobody may call {entry_point}"


def test_the_function_module_turns_a_pubsub_trigger_into_an_eventarc_trigger() -> None:
    ((_, _, function),) = [
        entry for entry in resources(MODULES / "function" / "main.tf")
        if entry[0] == "google_cloudfunctions2_function"
    ]  # fmt: skip
    dynamic = function["dynamic"]
    (event_trigger,) = [block['"event_trigger"'] for block in dynamic if '"event_trigger"' in block]
    assert event_trigger["for_each"] == "${var.pubsub_trigger == null ? [] : [var.pubsub_trigger]}"
    content = event_trigger["content"][0]
    assert unquote(content["event_type"]) == "google.cloud.pubsub.topic.v1.messagePublished"
    assert content["pubsub_topic"] == "${event_trigger.value.topic}"
    assert content["service_account_email"] == "${event_trigger.value.service_account_email}"


def test_intake_listens_to_the_request_topics_and_reconcile_to_ticks_with_the_right_retry() -> None:
    """Intake's own trigger is on the admins' topic, which always exists; every other request
    topic (each tenant's, the shared one when made) reaches it through an Eventarc trigger of
    the function module (tests/unit/test_infra_tenants.py evaluates which)."""
    topics: dict[str, str] = {
        key: unquote(name) for key, name in module_locals("pubsub")["topics"].items()
    }
    functions = function_modules()

    def topic_of(entry_point: str) -> str:
        reference = functions[entry_point]["pubsub_trigger"]["topic"]
        match = re.fullmatch(r"\$\{module\.pubsub\.topic_ids\.(\w+)\}", reference)
        assert match, reference
        return topics[match.group(1)]

    intake = functions["intake"]
    assert intake["pubsub_trigger"]["topic"] == '${module.pubsub.request_topic_ids["admin"]}'
    assert "module.pubsub.request_topic_ids" in intake["more_pubsub_topics"]
    assert topic_of("reconcile") == Settings(project="p").ticks_topic
    assert "more_pubsub_topics" not in functions["reconcile"]
    # Intake raises only on transient faults: worth retrying, then dead-lettered.
    assert intake["pubsub_trigger"]["retry"] is True
    assert "requests_dead_letter_topic" in intake["dead_letter"]
    # A tick is never worth retrying: the next one comes.
    assert functions["reconcile"]["pubsub_trigger"]["retry"] is False


def test_http_functions_are_called_by_whom_the_code_expects() -> None:
    functions = function_modules()
    # The timer checks the OIDC token of the tasks account; only that account may invoke it.
    assert functions["timer"]["invokers"] == ["${local.member.tasks}"]
    assert unquote(functions["timer"].get("ingress", '"ALLOW_INTERNAL_ONLY"')) == (
        "ALLOW_INTERNAL_ONLY"
    )
    # The webhooks and the API authenticate each call themselves (signatures, API keys, ID
    # tokens); the API's ingress with IAP in front: tests/unit/test_infra_access.py.
    assert functions["ci_hook"]["invokers"] == ['"allUsers"']
    assert unquote(functions["ci_hook"]["ingress"]) == "ALLOW_ALL"
    assert functions["api"]["invokers"] == (
        '${local.api_direct ? ["allUsers"] : [local.iap_service_agent]}'
    )
    # The agents on the job VMs: each call carries a VM identity token (audience: the
    # function's own URL) or the session it was exchanged for, which the function verifies.
    assert functions["agent"]["invokers"] == ['"allUsers"']
    assert unquote(functions["agent"]["ingress"]) == "ALLOW_ALL"


def test_each_function_runs_as_its_own_service_account() -> None:
    accounts = {
        entry_point: deployment["service_account_email"]
        for entry_point, deployment in function_modules().items()
    }
    assert accounts == {
        entry_point: f"${{module.identities.emails.{entry_point}}}" for entry_point in accounts
    }


# Topics ---------------------------------------------------------------------------------------


def test_every_topic_the_code_publishes_to_exists() -> None:
    """Events and ticks here; the request topics (one per tenant, the admins', the shared one
    when made) in tests/unit/test_infra_tenants.py."""
    settings = Settings(project="p")
    published = {settings.events_topic, settings.ticks_topic}
    declared = {unquote(name) for name in module_locals("pubsub")["topics"].values()}
    assert published <= declared
    topics = {
        unquote(body["name"]) for _, _, body in all_resources("google_pubsub_topic")
        if not str(body["name"]).startswith("${")
    }  # fmt: skip
    assert f"{REQUESTS_TOPIC}-dead-letter" in topics
    assert "capacity-requests" in str(module_locals("pubsub")["shared_request_topic"])


def test_each_publisher_may_publish_where_its_code_does() -> None:
    pubsub = root_modules()["pubsub"]
    # The CI hook turns webhooks into request messages, for the tenant of the CI mapping it
    # matched: it publishes on every tenant's topic (and on no other).
    assert pubsub["every_tenant_publishers"] == ["${local.member.ci_hook}"]
    assert "ci_hook" not in str(pubsub["request_publishers"])
    # Everything that changes a request's state publishes its events (the agent function: a
    # run's end releases its capacity through the end service, as the api does).
    assert set(pubsub["event_publishers"]) == {
        f"${{local.member.{name}}}" for name in ("intake", "reconcile", "timer", "api", "agent")
    }
    # What ends a run nudges the reconciler (the nudger is intake's, the timer's, the API's
    # and the agent function's).
    assert set(pubsub["tick_publishers"]) == {
        f"${{local.member.{name}}}" for name in ("intake", "timer", "api", "agent")
    }


# Firestore ------------------------------------------------------------------------------------


def filtered_and_ordered_fields() -> list[tuple[str, str]]:
    """(filter field, order_by field) for each query of the Firestore adapter that filters on
    one field and orders by another: the shape that needs a composite index."""
    source = Path(firestore_adapter.__file__).read_text()
    pairs = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "order_by"):
            continue
        ordered = node.args[0]
        inner = node.func.value  # type: ignore[attr-defined]
        filters = [
            call.args[0]
            for call in ast.walk(inner)
            if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "FieldFilter"
        ]
        if isinstance(ordered, ast.Constant) and filters and isinstance(filters[0], ast.Constant):
            pairs.append((str(filters[0].value), str(ordered.value)))
    return pairs


def filtered_fields() -> set[str]:
    """Every field the Firestore adapter filters on."""
    source = Path(firestore_adapter.__file__).read_text()
    return {
        str(node.args[0].value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", "") == "FieldFilter"
        and isinstance(node.args[0], ast.Constant)
    }


def declared_indexes() -> set[tuple[str, tuple[str, ...]]]:
    return {
        (unquote(body["collection"]), tuple(unquote(f["field_path"]) for f in body["fields"]))
        for _, _, body in all_resources("google_firestore_index")
    }


def test_each_filtered_and_ordered_query_has_its_composite_index() -> None:
    pairs = filtered_and_ordered_fields()
    assert pairs == [("state", "submitted_at")]
    for filtered, ordered in pairs:
        assert (firestore_adapter.REQUESTS, (filtered, ordered)) in declared_indexes()


def test_no_field_the_store_filters_on_is_exempt_from_indexing() -> None:
    assert {"outbox", "state", "tenant"} <= filtered_fields()
    exempt = {
        unquote(body["field"])
        for _, _, body in all_resources("google_firestore_field")
        if body.get("index_config") in ([{}], {})
    }
    assert not exempt & filtered_fields()


def test_event_records_expire_through_a_ttl_policy_on_their_expiry_field() -> None:
    fields = {
        (unquote(body["collection"]), unquote(body["field"])): body
        for _, _, body in all_resources("google_firestore_field")
    }
    key = (firestore_adapter.EVENTS, firestore_adapter.EVENT_EXPIRY_FIELD)
    assert key in fields
    assert "ttl_config" in fields[key]


def test_the_database_is_the_clients_default() -> None:
    ((_, _, database),) = all_resources("google_firestore_database")
    assert unquote(database["name"]) == "(default)"
    assert unquote(database["type"]) == "FIRESTORE_NATIVE"


# IAM ------------------------------------------------------------------------------------------


def role_values() -> Iterator[tuple[Path, str]]:
    """Every literal role string anywhere in infra/ (comments stripped)."""
    for path in tf_files():
        text = re.sub(r"#.*", "", path.read_text())
        for match in re.finditer(r'"(roles/[\w.]+)"', text):
            yield path, match.group(1)


def test_no_account_holds_a_basic_role() -> None:
    roles = list(role_values())
    assert len(roles) > 10  # the scan sees the grants
    basic = [(path.relative_to(INFRA), role) for path, role in roles if role in BASIC_ROLES]
    # The identities module names them once, in the validation that refuses them.
    assert {str(path) for path, _ in basic} <= {"modules/identities/variables.tf"}
    for path, _, body in all_resources("google_project_iam_member"):
        assert unquote(body["role"]) not in BASIC_ROLES, path


def test_project_roles_are_the_ones_each_function_needs() -> None:
    roles = root_locals()["project_roles"]
    assert set(roles) == set(signatures())
    # Reads config/scheduler only, and writes its metrics.
    assert roles["ci_hook"] == '${concat(["roles/datastore.viewer"], local.metric_roles)}'
    # The agent function reads an order's VMs (instances.list) and a run's end releases them.
    for name in ("intake", "reconcile", "timer", "api", "agent"):
        assert "roles/datastore.user" in roles[name]
        assert "local.capacity_roles" in roles[name]


def test_timer_setters_may_act_as_the_invoker_and_the_invoker_is_the_one_code_expects() -> None:
    tasks = root_modules()["tasks"]
    assert set(tasks["timer_setters"]) == {
        f"${{local.member.{name}}}" for name in ("intake", "reconcile", "timer", "api")
    }
    # The agent function ends runs (disarming their timers) but arms none.
    assert tasks["timer_deleters"] == ["${local.member.agent}"]
    identities = root_modules()["identities"]["accounts"]
    assert "opendws-tasks" in identities  # the code's default OPENDWS_TIMER_SERVICE_ACCOUNT
    default_account = Settings.from_environment().timer_service_account
    assert default_account.startswith("opendws-tasks@")


# Settings -------------------------------------------------------------------------------------


def read_environment_variables() -> set[str]:
    """Every OPENDWS_ variable the package's code names."""
    names: set[str] = set()
    for path in (ROOT / "shared" / "opendws").rglob("*.py"):
        names |= set(re.findall(r"OPENDWS_[A-Z_]+", path.read_text()))
    return names


def test_every_variable_the_functions_get_is_one_the_code_reads() -> None:
    given: set[str] = set(root_locals()["common_environment"])
    for deployment in function_modules().values():
        given |= set(deployment.get("secrets", {}))
        environment = deployment.get("environment", "")
        given |= set(re.findall(r"OPENDWS_[A-Z_]+", str(environment)))
    opendws_names = {name for name in given if name.startswith("OPENDWS_")}
    assert opendws_names <= read_environment_variables()
    assert set(CLOUD_SETTINGS_ENVIRONMENT) <= opendws_names
    assert {
        "OPENDWS_GITHUB_WEBHOOK_SECRET", "OPENDWS_GITLAB_WEBHOOK_TOKEN", "OPENDWS_HOOK_SECRET",
        "OPENDWS_API_KEYS", "OPENDWS_TIMER_URL", "OPENDWS_RECONCILE_FOLLOW_UP_SECONDS",
        "OPENDWS_AGENT_URL", "OPENDWS_AGENT_SESSION_KEY",
    } <= opendws_names  # fmt: skip


def test_the_reconcile_timeout_holds_the_follow_up_and_a_pass() -> None:
    timeout = variable_default(INFRA / "variables.tf", "reconcile_timeout_seconds")
    follow_up = variable_default(INFRA / "variables.tf", "reconcile_follow_up_seconds")
    assert follow_up == Settings(project="p").reconcile_follow_up.total_seconds()
    assert timeout >= follow_up + 30
    reconcile = function_modules()["reconcile"]
    assert reconcile["timeout_seconds"] == "${var.reconcile_timeout_seconds}"
    assert "var.reconcile_follow_up_seconds" in str(reconcile["environment"])
    checks = parsed(INFRA / "main.tf")["check"]
    assert any("reconcile_timeout_holds_follow_up" in str(check) for check in checks)


def test_the_queue_and_its_defaults_match_the_codes() -> None:
    settings = Settings(project="p")
    assert variable_default(MODULES / "tasks" / "variables.tf", "name") == settings.tasks_queue
    assert "module.tasks.queue" in root_locals()["common_environment"]["OPENDWS_TASKS_QUEUE"]


def test_flex_templates_are_named_and_labelled_as_the_mig_provider_looks_them_up() -> None:
    """The MIG provider makes a pool's VMs from a team's template of the pool's machine type
    when one of that name carries its base label (and never deletes it)."""
    ((_, _, template),) = all_resources("google_compute_instance_template")
    pattern = unquote(template["name"])
    pool = Pool(
        pool_id="us-central1-a/a3-highgpu-8g", zone="us-central1-a", shape="a3-highgpu-8g",
        accelerator="nvidia-h100-80gb", provider=Provider.MIG, capacity=1,
    )  # fmt: skip
    assert pattern.replace("${each.key}", pool.shape) == base_template_name(pool)
    for key, value in BASE_LABEL.items():
        assert f'"{key}" = "{value}"' in unquote(template["labels"])
    scheduling = template["scheduling"][0]
    assert unquote(scheduling["provisioning_model"]) == "FLEX_START"
    assert unquote(scheduling["instance_termination_action"]) == "DELETE"


# Timers ---------------------------------------------------------------------------------------


def substituted(expression: str, values: dict[str, str]) -> str:
    """An interpolated HCL string with each ``${reference}`` replaced by ``values[reference]``
    (a KeyError for a reference the test did not expect)."""
    return re.sub(r"\$\{([^}]+)\}", lambda match: values[match.group(1)], unquote(expression))


def test_timers_are_called_at_the_timer_services_run_app_url() -> None:
    """The timer function has internal-only ingress, which admits Cloud Tasks of the same
    project only "if they're using the default run.app URL and not a custom domain"
    (https://cloud.google.com/run/docs/securing/ingress, "Internal"); the cloudfunctions.net
    URL (the provider's ``google_cloudfunctions2_function.url``, "the deployed url for the
    function") is not that. The deterministic run.app URL is
    ``https://[TAG---]SERVICE_NAME-PROJECT_NUMBER.REGION.run.app``, known before the service
    exists (https://cloud.google.com/run/docs/triggering/https-request, "Deterministic URL"),
    so it is computed from the project number, the service name and the region — not read
    from the function's ``service_config[0].uri`` (terraform-provider-google
    website/docs/r/cloudfunctions2_function: "URI of the Service deployed", an output), which
    would make the functions' environment depend on the timer function itself: a cycle. The
    task's OIDC audience is the same URL (tasks v2 ``OidcToken.audience`` defaults to the
    task URL; the timer checks ``aud`` against OPENDWS_TIMER_AUDIENCE)."""
    locals_ = root_locals()
    url = locals_["timer_url"]
    # No reference to a function (the functions' environment holds it: that would be a cycle).
    assert "module." not in url
    assert "google_cloudfunctions2_function" not in url
    names = {key: unquote(name) for key, name in locals_["names"].items()}
    project_number = "123456789012"
    evaluated = substituted(url, {
        "local.names.timer": names["timer"],
        "data.google_project.this.number": project_number,
        "var.region": "us-central1",
    })  # fmt: skip
    assert evaluated == f"https://opendws-timer-{project_number}.us-central1.run.app"
    assert re.fullmatch(r"https://[a-z0-9-]+-\d+\.[a-z0-9-]+\.run\.app", evaluated)
    # data "google_project" "this" gives the number, for the deployment's own project.
    (project,) = [
        entry['"google_project"']['"this"'] for entry in parsed(INFRA / "main.tf")["data"]
        if '"this"' in entry.get('"google_project"', {})
    ]  # fmt: skip
    assert project["project_id"] == "${var.project}"
    environment = locals_["common_environment"]
    assert environment["OPENDWS_TIMER_URL"] == "${local.timer_url}"
    assert environment["OPENDWS_TIMER_AUDIENCE"] == environment["OPENDWS_TIMER_URL"]
    # Nothing calls the timer at cloudfunctions.net any more: the one such URL is the api's
    # own, an audience its callers' ID tokens may name (tests/unit/test_infra_access.py).
    code = re.sub(r"#.*", "", (INFRA / "main.tf").read_text())
    lines = [line.strip() for line in code.splitlines() if "cloudfunctions.net" in line]
    assert lines == [
        '"https://${var.region}-${var.project}.cloudfunctions.net/${local.names.api}",'
    ]
    outputs = dict(blocks(INFRA / "outputs.tf", "output"))
    assert outputs["timer_url"]["value"] == "${local.timer_url}"


def test_an_apply_checks_that_the_timer_service_has_the_url_assumed() -> None:
    """The deterministic URL exists only while SERVICE_NAME-PROJECT_NUMBER fits one DNS label
    of 63 characters (run/docs/triggering/https-request); the check compares the function's
    actual Cloud Run service (``service_config[0].service``) with the name assumed."""
    checks = {
        unquote(name): body for check in parsed(INFRA / "main.tf")["check"]
        for name, body in check.items()
    }  # fmt: skip
    condition = checks["timer_url_is_the_timer_services_run_app_url"]["assert"][0]["condition"]
    assert "module.timer.service" in condition
    assert "local.names.timer" in condition
    assert "<= 63" in condition
    assert len(f"{unquote(root_locals()['names']['timer'])}-123456789012") <= 63


# Pins: what the deployment relies on ----------------------------------------------------------


def lower_bound(constraint: str) -> tuple[int, ...]:
    """The ``>= X.Y.Z`` of a version constraint, as a tuple."""
    match = re.search(r">=\s*([\d.]+)", constraint)
    assert match, f"no lower bound in {constraint!r}"
    return tuple(int(part) for part in match.group(1).split("."))


def test_the_google_provider_is_at_least_the_release_whose_templates_keep_flex_start() -> None:
    """terraform-provider-google#24172: ``provisioning_model = "FLEX_START"`` on an instance
    template "just creates a standard instance template". Fixed by magic-modules#17417
    (terraform-provider-google #28365, commit e86f44ce6f), released in 7.41.0 (July 17, 2026;
    CHANGELOG: "compute: added FLEX_START and RESERVATION_BOUND support to
    google_compute_instance, google_compute_instance_template, and
    google_compute_region_instance_template"). infra/ makes no resize-request or
    future-reservation resources (the reconciler does, through the API)."""
    ((terraform,),) = [parsed(INFRA / "versions.tf")["terraform"]]
    ((providers,),) = [terraform["required_providers"]]
    google = providers["google"]
    assert unquote(google["source"]) == "hashicorp/google"
    constraint = unquote(google["version"])
    assert lower_bound(constraint) >= (7, 41, 0)
    assert "< 8.0" in constraint
    for kind in ("google_compute_resize_request", "google_compute_region_resize_request",
                 "google_compute_future_reservation"):  # fmt: skip
        assert all_resources(kind) == [], f"{kind}: pin the provider release that has its fields"


def test_the_functions_install_a_compute_client_with_the_fields_the_code_sets() -> None:
    """The functions install pyproject's dependencies (infra/package.py writes them to
    requirements.txt). The MIG provider names its VMs with the resize request's ``instances``
    field (first in google-cloud-compute 1.50.0: 1.49.0's InstanceGroupManagerResizeRequest
    has only ``resize_by``) and calendar blocks ask ``AdviceClient.calendar_mode`` (from 1.42.0),
    established from the published wheels' ``compute_v1`` sources — the client's CHANGELOG
    (googleapis/google-cloud-python packages/google-cloud-compute) names only API revisions.
    The named VMs, a Preview field (compute/docs/instance-groups/about-resize-requests-mig),
    go through Compute's beta API: google-cloud-compute-v1beta, whose first release (0.1.0)
    already has the zonal resize-request client and the field."""
    import tomllib

    from google.cloud import compute_v1, compute_v1beta

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dependencies: list[str] = project["dependencies"]

    def named(package: str) -> str:
        (found,) = [d for d in dependencies if re.match(rf"{re.escape(package)}\s*[<>=!~]", d)]
        return found

    assert lower_bound(named("google-cloud-compute")) >= (1, 50)
    assert lower_bound(named("google-cloud-compute-v1beta")) >= (0, 1, 0)
    assert "instances" in compute_v1beta.InstanceGroupManagerResizeRequest.meta.fields
    assert callable(compute_v1beta.InstanceGroupManagerResizeRequestsClient.insert)
    (auth,) = [d for d in dependencies if d.startswith("google-auth")]
    assert lower_bound(auth) >= (2, 3, 2)  # verify_token(clock_skew_in_seconds=...)
    assert "instances" in compute_v1.InstanceGroupManagerResizeRequest.meta.fields
    assert callable(compute_v1.AdviceClient.calendar_mode)


# Per-shape VM settings ------------------------------------------------------------------------


def infra_vm_profile(machine_type: str) -> VmProfile:
    """The boot disk and NIC modules/compute_pools gives ``machine_type`` (its rule: the
    profile of the prefix that matches, else the default)."""
    found = module_locals("compute_pools")
    profiles = {unquote(prefix): body for prefix, body in found["vm_profiles"].items()}
    default = found["default_vm_profile"]
    matching = [body for prefix, body in profiles.items() if machine_type.startswith(prefix)]
    body = (matching or [default])[0]
    return VmProfile(unquote(body["disk_type"]), unquote(body["nic_type"]))


def test_flex_templates_take_the_disk_and_nic_of_their_machine_family_as_the_catalog() -> None:
    """A3 Ultra and A4 boot only from Hyperdisk and need gVNIC; A3 High and Mega need gVNIC
    (ai-hypercomputer/docs/create/create-vm; cluster-toolkit's a3ultra, a4high, a3high and
    a3mega blueprints): modules/compute_pools, the catalog and the reconciler's own templates
    (adapters.gce.boot_disk / network) agree for every machine type opendws knows."""
    found = module_locals("compute_pools")
    declared = {
        unquote(prefix): VmProfile(unquote(body["disk_type"]), unquote(body["nic_type"]))
        for prefix, body in found["vm_profiles"].items()
    }
    assert declared == VM_PROFILES
    # No prefix shadows another, so the order of the map's keys does not matter.
    assert not [(a, b) for a in declared for b in declared if a != b and b.startswith(a)]
    settings = cloud_settings(Settings(project="p"))
    for machine_type in MACHINE_TYPES:
        disk = boot_disk(settings, machine_type).initialize_params.disk_type
        nic = network(settings, machine_type).nic_type or None
        assert infra_vm_profile(machine_type) == VmProfile(disk, nic), machine_type
    ((_, _, template),) = all_resources("google_compute_instance_template")
    assert template["disk"][0]["disk_type"] == "${local.profiles[each.key].disk_type}"
    assert template["network_interface"][0]["nic_type"] == "${local.profiles[each.key].nic_type}"


def test_flex_templates_are_the_reconcilers_flex_start_templates() -> None:
    """Google's resize-request sample template (magic-modules
    samples/services/compute/compute_rmig_resize_request.tf.tmpl): FLEX_START,
    instanceTerminationAction DELETE, maxRunDuration, reservationAffinity NO_RESERVATION —
    what the MIG provider writes and insists on when it reads a template back."""
    ((_, _, template),) = all_resources("google_compute_instance_template")
    scheduling = template["scheduling"][0]
    assert unquote(scheduling["provisioning_model"]) == mig.FLEX_START
    assert unquote(scheduling["on_host_maintenance"]) == "TERMINATE"
    assert scheduling["automatic_restart"] is False
    assert scheduling["max_run_duration"][0]["seconds"] == FLEX_MAX_RUN.total_seconds()
    assert unquote(template["reservation_affinity"][0]["type"]) == mig.NO_RESERVATION


def test_no_managed_instance_group_in_infra_is_in_bulk_mode() -> None:
    """A MIG in bulk mode takes no resize requests (compute/docs/instance-groups/
    about-bulk-mode); the reconciler makes the pools' groups without it, and infra/ makes
    none, or none in bulk mode."""
    for kind in ("google_compute_instance_group_manager",
                 "google_compute_region_instance_group_manager"):  # fmt: skip
        for path, name, body in all_resources(kind):
            assert "BULK" not in str(body.get("target_size_policy", "")), f"{path}: {name}"
    code = "".join(re.sub(r"#.*", "", path.read_text()) for path in tf_files())
    assert "BULK" not in code


def test_tpu_slices_get_their_generations_runtime_unless_one_is_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tpu/docs/runtimes: v6e ``v2-alpha-tpuv6e``, v5p ``v2-alpha-tpuv5``, v5e
    ``v2-alpha-tpuv5-lite``. Terraform passes ``tpu_runtime_version`` (empty by default) as
    OPENDWS_TPU_RUNTIME_VERSION, and empty leaves each generation the catalog's version."""
    assert variable_default(INFRA / "variables.tf", "tpu_runtime_version") == ""
    environment = root_locals()["common_environment"]
    assert environment["OPENDWS_TPU_RUNTIME_VERSION"] == "${var.tpu_runtime_version}"
    monkeypatch.setenv("OPENDWS_TPU_RUNTIME_VERSION", "")
    settings = cloud_settings(Settings.from_environment())
    for accelerator, version in TPU_RUNTIME_VERSIONS.items():
        assert settings.runtime_version(accelerator) == version
    assert TPU_RUNTIME_VERSIONS["tpu-v6e"] == "v2-alpha-tpuv6e"
    assert TPU_RUNTIME_VERSIONS["tpu-v5p"] == "v2-alpha-tpuv5"
    assert TPU_RUNTIME_VERSIONS["tpu-v5e"] == "v2-alpha-tpuv5-lite"


# Documentation --------------------------------------------------------------------------------


def test_every_variable_and_output_is_documented_and_typed() -> None:
    for path in tf_files():
        for name, body in blocks(path, "variable"):
            assert unquote(body.get("description", "")), f"{path}: variable {name}"
            assert "type" in body, f"{path}: variable {name} has no type"
        for name, body in blocks(path, "output"):
            assert unquote(body.get("description", "")), f"{path}: output {name}"


def test_outputs_include_the_topics_and_the_api_url() -> None:
    outputs = dict(blocks(INFRA / "outputs.tf", "output"))
    expected = {"topics", "api_url", "ci_hook_url", "dead_letter_subscription", "agent_url"}
    assert expected <= set(outputs)
    for secret in ("hook_secrets", "api_keys"):
        assert outputs[secret]["sensitive"] is True


def test_the_api_keys_secret_holds_only_digests() -> None:
    """The api compares a caller's key's SHA-256 with the digests it is given
    (opendws.service.api.key_digest): the secret stores ``tenant:sha256:HEX``, made with
    Terraform's sha256(), never a key."""
    secrets = (INFRA / "modules" / "secrets" / "main.tf").read_text()
    version = secrets.split('resource "google_secret_manager_secret_version" "api_keys"', 1)[1]
    data = version.split("secret_data", 1)[1].split("\n", 1)[0]
    assert '"${tenant}:sha256:${sha256(random_password.api_key[tenant].result)}"' in data


# Monitoring ---------------------------------------------------------------------------------

MONITORING = (MODULES / "monitoring" / "main.tf").read_text()
# Each chart: { metric = "NAME", aligner = "ALIGN_X", reducer = "REDUCE_Y", by = [...] }.
CHARTS = re.findall(
    r'metric = "(opendws_\w+)", aligner = "(ALIGN_\w+)", reducer = "(REDUCE_\w+)"', MONITORING
)


def test_the_dashboard_charts_only_metrics_of_the_catalog_aligned_as_their_kind() -> None:
    """Cloud Monitoring: a CUMULATIVE counter is charted as a rate (ALIGN_RATE), a
    distribution (an OpenTelemetry histogram) by ALIGN_DELTA and a percentile reducer, a gauge
    by its mean or max (cloud.google.com/monitoring/api/v3/aggregation)."""
    from opendws.ports.telemetry import BY_NAME, Kind

    assert len(CHARTS) >= 12
    for name, aligner, reducer in CHARTS:
        kind = BY_NAME[name].kind
        if kind is Kind.COUNTER:
            assert aligner == "ALIGN_RATE", name
        elif kind is Kind.HISTOGRAM:
            assert (aligner, reducer.startswith("REDUCE_PERCENTILE_")) == ("ALIGN_DELTA", True)
        else:
            assert aligner in {"ALIGN_MEAN", "ALIGN_MAX"}, name
    named = set(re.findall(r'"(opendws_\w+)"', MONITORING))
    assert named <= set(BY_NAME)
    # Every label a chart groups by is one its metric has.
    for spec in re.findall(r'metric = "(opendws_\w+)".*?by = \[([^\]]*)\]', MONITORING):
        labels = set(re.findall(r"metric\.label\.(\w+)", spec[1]))
        assert labels <= set(BY_NAME[spec[0]].labels), spec


def test_metric_types_are_where_the_cloud_monitoring_exporter_writes_them() -> None:
    """OpenTelemetry's exporter writes ``workload.googleapis.com/<instrument name>`` by
    default (opentelemetry-exporter-gcp-monitoring: CloudMonitoringMetricsExporter
    ``prefix``)."""
    import inspect

    from opentelemetry.exporter.cloud_monitoring import CloudMonitoringMetricsExporter

    default = (
        inspect.signature(CloudMonitoringMetricsExporter.__init__).parameters["prefix"].default
    )
    assert variable_default(MODULES / "monitoring" / "variables.tf", "metric_prefix") == default
    assert '"metric.type=\\"${var.metric_prefix}/${name}\\""' in MONITORING


def test_the_alerts_watch_the_longest_wait_and_the_reconcilers_passes() -> None:
    policies = {name: body for _, name, body in all_resources("google_monitoring_alert_policy")}
    (waiting,) = policies["waiting"]["conditions"]
    (threshold,) = waiting["condition_threshold"]
    assert threshold["filter"] == '${local.metric["opendws_pending_longest_wait_seconds"]}'
    assert threshold["threshold_value"] == "${var.wait_threshold_seconds}"
    (silent,) = policies["reconcile_silent"]["conditions"]
    (absent,) = silent["condition_absent"]
    assert absent["filter"] == ('${local.metric["opendws_reconcile_passes_total"]}')
    for body in policies.values():
        assert body["notification_channels"] == "${var.notification_channels}"


def test_functions_that_record_metrics_may_write_them_and_export_to_both() -> None:
    roles = root_locals()["project_roles"]
    for name in FUNCTION_NAMES:  # each exports its meter
        assert "local.metric_roles" in roles[name]
    assert root_locals()["metric_roles"] == ['"roles/monitoring.metricWriter"']
    export = unquote(root_locals()["common_environment"]["OPENDWS_METRICS_EXPORT"])
    settings = Settings.from_environment({"OPENDWS_METRICS_EXPORT": export})
    assert settings.metrics_export == ("snapshots", "cloud_monitoring")
    services = variable_default(MODULES / "apis" / "variables.tf", "services")
    assert '"monitoring.googleapis.com"' in services or "monitoring.googleapis.com" in services


def test_the_rank_stores_collection_group_query_has_its_single_field_index() -> None:
    """``FirestoreRankStore.of_vm`` queries the ``ranks`` collection group on ``vm``: Firestore
    keeps no single-field index of collection-group scope unless told
    (firestore/docs/query-data/index-overview), so Terraform declares it."""
    source = Path(ranks_adapter.__file__).read_text()
    assert 'collection_group("ranks")' in source
    assert 'FieldFilter("vm", "==", vm)' in source
    fields = {
        (unquote(body["collection"]), unquote(body["field"])): body
        for _, _, body in all_resources("google_firestore_field")
    }
    [config] = fields[("ranks", "vm")]["index_config"]
    indexes = [{k: unquote(v) for k, v in index.items() if not k.startswith("__")}
               for index in config["indexes"]]  # fmt: skip
    assert {"order": "ASCENDING", "query_scope": "COLLECTION_GROUP"} in indexes
