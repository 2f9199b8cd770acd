"""Who may call each function, in infra/ and in the local stack alike: the timer's Cloud Run
service is internal-only and invoked by the tasks account alone, so Cloud Run checks each
call's ID token and hands it on with its signature removed, and the timer (and no other
function) is told so; ci_hook, api and agent are public and check their callers themselves;
the local stack's Cloud Run fronts (emulators.stack.SERVICES) are set as Terraform sets the
services.

Sources: run/docs/securing/ingress (internal-only admits Cloud Tasks of the same project);
run/docs/authenticating/service-to-service and run/docs/troubleshooting#signature-removed (a
service that requires authentication gets the token with its signature replaced by
``SIGNATURE_REMOVED_BY_GOOGLE``); infra/README.md, "Who may call each function"."""

from __future__ import annotations

import re

from emulators.cloud_run import Ingress
from emulators.stack import INVOKER, SERVICES, TIMER_AUDIENCE
from opendws.bootstrap import Settings
from tests.unit.test_infra import INFRA, function_modules, root_locals, unquote

FLAG = "OPENDWS_INVOKER_CHECKED_BY_RUN"


def added_environment(entry_point: str) -> dict[str, str]:
    """The variables a function's deployment adds to ``local.common_environment``."""
    environment = str(function_modules()[entry_point]["environment"])
    return dict(re.findall(r'(OPENDWS_[A-Z_]+) = "?([^",}]*)"?', environment))


def test_only_the_timer_is_told_that_cloud_run_checked_its_caller() -> None:
    assert added_environment("timer") == {FLAG: "true"}
    assert "local.common_environment" in str(function_modules()["timer"]["environment"])
    assert Settings.from_environment({FLAG: "true"}).invoker_checked_by_run
    for name in ("intake", "reconcile", "ci_hook", "api", "agent"):
        assert FLAG not in added_environment(name), name
    assert FLAG not in root_locals()["common_environment"]


def test_the_timers_service_requires_the_tasks_account_and_takes_internal_requests_only() -> None:
    """The claims the timer reads unverified are those Cloud Run checked: that holds only while
    its service requires authentication (no allUsers) and only the tasks account invokes it."""
    timer = function_modules()["timer"]
    assert timer["invokers"] == ["${local.member.tasks}"]
    assert "allUsers" not in str(timer["invokers"])
    assert unquote(timer.get("ingress", '"ALLOW_INTERNAL_ONLY"')) == "ALLOW_INTERNAL_ONLY"
    default = re.search(
        r'variable "ingress" \{.*?default\s*=\s*"(\w+)"',
        (INFRA / "modules" / "function" / "variables.tf").read_text(), re.S,
    )  # fmt: skip
    assert default is not None
    assert default.group(1) == "ALLOW_INTERNAL_ONLY"


def test_the_local_fronts_are_set_as_terraform_sets_the_services() -> None:
    functions = function_modules()
    timer = SERVICES["timer"]
    assert (timer.ingress, timer.invokers) == (Ingress.INTERNAL, frozenset({INVOKER}))
    assert INVOKER.startswith("opendws-tasks@")  # module.identities' tasks account
    # Tasks are armed for the run.app URL (OPENDWS_TIMER_AUDIENCE = local.timer_url).
    assert TIMER_AUDIENCE in timer.audiences
    assert re.fullmatch(r"https://opendws-timer-\d+\.[a-z0-9-]+\.run\.app", TIMER_AUDIENCE)
    assert any(a.endswith(".cloudfunctions.net/opendws-timer") for a in timer.audiences)
    # Public: allUsers invokes them (api: unless IAP closes its direct URL, not emulated).
    assert functions["ci_hook"]["invokers"] == ['"allUsers"']
    assert "allUsers" in str(functions["api"]["invokers"])
    # The agent function too: the VMs' agents call it, and it verifies their tokens itself.
    assert functions["agent"]["invokers"] == ['"allUsers"']
    assert unquote(functions["agent"]["ingress"]) == "ALLOW_ALL"
    for name in ("ci_hook", "api", "agent"):
        assert (SERVICES[name].ingress, SERVICES[name].invokers) == (Ingress.ALL, None), name
    assert set(SERVICES) == {
        name for name, body in functions.items() if "pubsub_trigger" not in body
    }
