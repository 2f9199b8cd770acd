"""CI jobs run on the VMs they got, on ``dws up`` (DESIGN.md "Work on the gang": the VM lives
as long as its runner). The stack's fake GitHub and GitLab send their own job webhooks to
``ci_hook`` (GitHub's ``workflow_job`` checked against octokit's webhook schema; GitLab's Job
Hook as docs.gitlab.com/user/project/integrations/webhook_events/#job-events shows it); a
queued job's VM gets a one-job runner from the agent function (a just-in-time runner with the
job's labels in the mapping's runner group:
docs.github.com/en/rest/actions/self-hosted-runners#create-configuration-for-a-just-in-time-runner-for-an-organization;
a GitLab runner for the job's tags: docs.gitlab.com/api/users/#create-a-runner-linked-to-a-user),
the stand-in runners take the job, run its script and exit, and the VM is released. The
example configuration's mappings are used as README's walk-through uses them."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_jobs_on_the_stack import ended as ended_within
from tests.e2e.test_local_stack import dws, post, start_up

DATA = Path(__file__).resolve().parents[1] / "data" / "hooks"
LABELS = ["self-hosted", "gpu-h100"]
# The jobs' own labels: a runner takes a job only if it has all of them (the ghost's runner,
# made for LABELS alone, takes none of these).
TRAINER = [*LABELS, "trainer"]


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, str]]:
    process, environment = start_up()
    try:
        yield environment
    finally:
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(60) == 0


def call(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
    return json.loads(text) if text.strip() else None


def github(stack: dict[str, str], path: str, body: dict[str, Any] | None = None) -> Any:
    return call(stack["OPENDWS_GITHUB_API_URL"] + "/_admin" + path, body)


def gitlab(stack: dict[str, str], path: str, body: dict[str, Any] | None = None) -> Any:
    return call(stack["OPENDWS_GITLAB_URL"] + "/_admin" + path, body)


def events(stack: dict[str, str], request_id: str) -> list[tuple[str, str]]:
    shown = json.loads(dws(stack, "status", request_id, "--json").stdout)
    return [(event["reason"] or "", event["message"]) for event in shown["events"]]


def ended(stack: dict[str, str], request_id: str, timeout: float = 90) -> dict[str, Any]:
    """The request once it ended; on a timeout, the assertion shows where it is."""
    try:
        return ended_within(stack, request_id, timeout)
    except AssertionError as error:
        shown = dws(stack, "status", request_id).stdout
        raise AssertionError(f"{error}:\n{shown}\nrunners: {github(stack, '/runners')}") from None


def recorded(
    stack: dict[str, str], request_id: str, wanted: tuple[tuple[str, str], ...], timeout: float = 20
) -> bool:
    """Whether every one of ``wanted`` (reason, message) is among the request's events within
    ``timeout`` seconds (AssertionError naming what is missing otherwise)."""
    deadline = time.monotonic() + timeout
    while True:
        missing = [event for event in wanted if event not in events(stack, request_id)]
        if not missing:
            return True
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{request_id} has no events {missing}: {events(stack, request_id)}"
            )
        time.sleep(0.5)


def order_of(vm: str) -> str:
    return vm.rsplit("-", 1)[0]


@pytest.fixture(scope="module")
def ghost(stack: dict[str, str]) -> str:
    """A queued job GitHub then cancels: its webhook reaches ci_hook (signed as GitHub signs
    it), but no runner will ever find the job. Sent first: its runner idles while the other
    tests run."""
    from emulators.stack import LOCAL_HOOK_SECRET

    payload = json.loads((DATA / "github_workflow_job_queued.json").read_text())
    payload["workflow_job"].update(id=777001, labels=LABELS)
    payload["repository"].update(full_name="example-org/ghost", name="ghost", private=True)
    body = json.dumps(payload).encode()
    digest = hmac.new(LOCAL_HOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
    status, answer = post(stack["url:ci_hook"], body, {
        "X-GitHub-Event": "workflow_job", "X-Hub-Signature-256": f"sha256={digest}"})  # fmt: skip
    assert status == 202, answer
    return str(answer["request_id"])


def test_two_github_jobs_each_run_once_on_a_vm_that_records_it_and_is_released(
    stack: dict[str, str], ghost: str
) -> None:
    del ghost  # queued first, checked last
    jobs = {
        "ok": github(stack, "/jobs", {"repository": "example-org/trainer", "labels": TRAINER,
                                      "script": "echo trained on the H100"}),
        "failing": github(stack, "/jobs", {"repository": "example-org/trainer",
                                           "labels": TRAINER, "script": "echo broken; exit 3"}),
    }  # fmt: skip
    requests = {name: f"gh-example-org-trainer-{job['id']}" for name, job in jobs.items()}
    for request_id in requests.values():
        status = ended(stack, request_id)
        # The runner exits 0 after its one job, failed or not (actions/runner run.sh).
        assert (status["state"], status["reason"]) == ("RELEASED", "JOB_SUCCEEDED"), status
    done = {job["id"]: job for job in github(stack, "/jobs")}
    conclusions = {name: done[job["id"]]["conclusion"] for name, job in jobs.items()}
    assert conclusions == {"ok": "success", "failing": "failure"}
    # Each job ran on a VM of one of the two requests, once; that request says so.
    hosts: dict[str, str] = {}
    for name, job in jobs.items():
        ran_on = done[job["id"]]["runner_name"]
        host = next(r for r in requests.values() if order_of(ran_on).startswith(f"odws-{r}-"))
        hosts[name] = host
        outcome = "success" if name == "ok" else "failure"
        # The hooks may come after the runner's exit released the VM: they are recorded then.
        said = recorded(stack, host, (
            ("CI_JOB_RUNNING", f"its runner {ran_on} runs CI job {requests[name]}"),
            ("CI_JOB_COMPLETED",
             f"CI job {requests[name]} on its runner {ran_on} completed: {outcome}"),
        ))  # fmt: skip
        assert said
    ours = tuple(f"odws-{request_id}-" for request_id in requests.values())
    assert not any(runner["name"].startswith(ours) for runner in github(stack, "/runners"))
    assert sorted(hosts.values()) == sorted(requests.values())  # one job on each VM
    assert "trained on the H100" in dws(stack, "logs", hosts["ok"]).stdout


def test_a_redelivered_queued_hook_mints_nothing_new(stack: dict[str, str]) -> None:
    job = github(stack, "/jobs", {"repository": "example-org/trainer", "labels": TRAINER})
    request_id = f"gh-example-org-trainer-{job['id']}"
    assert ended(stack, request_id)["reason"] == "JOB_SUCCEEDED"
    deadline = time.monotonic() + 20  # the job's end may come after the runner's exit
    while not any(reason == "CI_JOB_COMPLETED" for reason, _ in events(stack, request_id)):
        assert time.monotonic() < deadline, events(stack, request_id)
        time.sleep(0.5)
    queued = next(d for d in github(stack, "/deliveries")
                  if d["job_id"] == job["id"] and d["action"] == "queued")  # fmt: skip
    before = events(stack, request_id)
    call(f"{stack['OPENDWS_GITHUB_API_URL']}/_admin/deliveries/{queued['id']}/attempts", {})
    time.sleep(5)
    assert events(stack, request_id) == before
    assert not any(r["name"].startswith(f"odws-{request_id}-") for r in github(stack, "/runners"))


def test_a_public_repositorys_job_gets_no_vm(stack: dict[str, str]) -> None:
    job = github(stack, "/jobs", {"repository": "example-org/open-source", "labels": TRAINER,
                                  "private": False})  # fmt: skip
    time.sleep(5)
    shown = dws(stack, "status", f"gh-example-org-open-source-{job['id']}")
    assert shown.returncode != 0
    assert "no request" in shown.stderr


def test_a_gitlab_job_runs_on_its_vm_whose_runner_is_deleted_after(stack: dict[str, str]) -> None:
    job = gitlab(stack, "/jobs", {"project_id": 7, "tags": ["gpu-a100"],
                                  "script": "echo tested on the A100"})  # fmt: skip
    request_id = f"gl-7-{job['id']}"
    status = ended(stack, request_id)
    assert (status["state"], status["reason"]) == ("RELEASED", "JOB_SUCCEEDED"), status
    assert gitlab(stack, f"/jobs/{job['id']}")["state"] == "success"
    deadline = time.monotonic() + 20  # the job's end may come after the runner's exit
    while not any(reason == "CI_JOB_COMPLETED" and message.endswith("completed: success")
                  for reason, message in events(stack, request_id)):  # fmt: skip
        assert time.monotonic() < deadline, events(stack, request_id)
        time.sleep(0.5)
    said = events(stack, request_id)
    assert gitlab(stack, "/runners") == []
    assert "tested on the A100" in dws(stack, "logs", request_id).stdout
    # A redelivered pending hook makes no new runner.
    pending = next(d for d in gitlab(stack, "/deliveries")
                   if d["job_id"] == job["id"] and d["build_status"] == "pending")  # fmt: skip
    gitlab(stack, f"/deliveries/{pending['number']}/redeliver", {})
    time.sleep(5)
    assert gitlab(stack, "/runners") == []
    assert events(stack, request_id) == said


def test_a_runner_that_takes_no_job_within_the_idle_time_is_deleted_and_its_vm_released(
    stack: dict[str, str], ghost: str
) -> None:
    status = ended(stack, ghost, timeout=150)
    assert (status["state"], status["reason"]) == ("RELEASED", "RUNNER_IDLE"), status
    assert "took no job within 1m" in status["message"]
    assert not any(r["name"].startswith(f"odws-{ghost}-") for r in github(stack, "/runners"))
