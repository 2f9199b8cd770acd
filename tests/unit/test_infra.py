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
from opendws.adapters.mig import template_name
from opendws.adapters.pubsub import REQUESTS_TOPIC
from opendws.bootstrap import CLOUD_SETTINGS_ENVIRONMENT, Settings
from opendws.domain.model import Pool, Provider

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
MODULES = INFRA / "modules"
BASIC_ROLES = {"roles/owner", "roles/editor", "roles/viewer"}


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
    assert set(signatures()) == {"intake", "reconcile", "timer", "ci_hook", "api"}
    assert set(function_modules()) == set(signatures())
    names = [unquote(name) for name in root_locals()["names"].values()]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("entry_point", ["intake", "reconcile", "timer", "ci_hook", "api"])
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


def test_intake_listens_to_requests_and_reconcile_to_ticks_with_the_right_retry() -> None:
    topics = {key: unquote(name) for key, name in module_locals("pubsub")["topics"].items()}
    functions = function_modules()

    def topic_of(entry_point: str) -> str:
        reference = functions[entry_point]["pubsub_trigger"]["topic"]
        match = re.fullmatch(r"\$\{module\.pubsub\.topic_ids\.(\w+)\}", reference)
        assert match, reference
        return topics[match.group(1)]

    assert topic_of("intake") == REQUESTS_TOPIC
    assert topic_of("reconcile") == Settings(project="p").ticks_topic
    # Intake raises only on transient faults: worth retrying, then dead-lettered.
    assert functions["intake"]["pubsub_trigger"]["retry"] is True
    assert "requests_dead_letter_topic" in functions["intake"]["dead_letter"]
    # A tick is never worth retrying: the next one comes.
    assert functions["reconcile"]["pubsub_trigger"]["retry"] is False


def test_http_functions_are_called_by_whom_the_code_expects() -> None:
    functions = function_modules()
    # The timer checks the OIDC token of the tasks account; only that account may invoke it.
    assert functions["timer"]["invokers"] == ["${local.member.tasks}"]
    assert unquote(functions["timer"].get("ingress", '"ALLOW_INTERNAL_ONLY"')) == (
        "ALLOW_INTERNAL_ONLY"
    )
    # The webhooks and the API authenticate each call themselves (signatures, API keys).
    for public in ("ci_hook", "api"):
        assert functions[public]["invokers"] == ['"allUsers"']
        assert unquote(functions[public]["ingress"]) == "ALLOW_ALL"


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
    settings = Settings(project="p")
    published = {REQUESTS_TOPIC, settings.events_topic, settings.ticks_topic}
    declared = {unquote(name) for name in module_locals("pubsub")["topics"].values()}
    assert published <= declared
    topics = {
        unquote(body["name"]) for _, _, body in all_resources("google_pubsub_topic")
        if not str(body["name"]).startswith("${")
    }  # fmt: skip
    assert f"{REQUESTS_TOPIC}-dead-letter" in topics


def test_each_publisher_may_publish_where_its_code_does() -> None:
    pubsub = root_modules()["pubsub"]
    # The CI hook turns webhooks into request messages.
    assert "local.member.ci_hook" in pubsub["request_publishers"]
    # Everything that changes a request's state publishes its events.
    assert set(pubsub["event_publishers"]) == {
        f"${{local.member.{name}}}" for name in ("intake", "reconcile", "timer", "api")
    }
    # What ends a run nudges the reconciler (the nudger is intake's, the timer's and the API's).
    assert set(pubsub["tick_publishers"]) == {
        f"${{local.member.{name}}}" for name in ("intake", "timer", "api")
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
    assert roles["ci_hook"] == ['"roles/datastore.viewer"']  # reads config/scheduler only
    for name in ("intake", "reconcile", "timer", "api"):
        assert "roles/datastore.user" in roles[name]
        assert "local.capacity_roles" in roles[name]


def test_timer_setters_may_act_as_the_invoker_and_the_invoker_is_the_one_code_expects() -> None:
    tasks = root_modules()["tasks"]
    assert set(tasks["timer_setters"]) == {
        f"${{local.member.{name}}}" for name in ("intake", "reconcile", "timer", "api")
    }
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


def test_flex_templates_are_named_as_the_mig_provider_looks_them_up() -> None:
    ((_, _, template),) = all_resources("google_compute_instance_template")
    pattern = unquote(template["name"])
    pool = Pool(
        pool_id="us-central1-a/a3-highgpu-8g", zone="us-central1-a", shape="a3-highgpu-8g",
        accelerator="nvidia-h100-80gb", provider=Provider.MIG, capacity=1,
    )  # fmt: skip
    assert pattern.replace("${each.key}", pool.shape) == template_name(pool)
    scheduling = template["scheduling"][0]
    assert unquote(scheduling["provisioning_model"]) == "FLEX_START"
    assert unquote(scheduling["instance_termination_action"]) == "DELETE"


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
    assert {"topics", "api_url", "ci_hook_url", "dead_letter_subscription"} <= set(outputs)
    for secret in ("hook_secrets", "api_keys"):
        assert outputs[secret]["sensitive"] is True
