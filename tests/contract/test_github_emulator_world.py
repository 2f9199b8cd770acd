"""The fake GitHub's world around a just-in-time runner (emulators.github): the JIT config a
runner is started with, the ``workflow_job`` webhooks GitHub sends as a job is queued, taken
and completed, and the stand-in runner program (emulators/runners/actions-runner/run.sh).

Sources:
actions/runner src/Runner.Listener/Runner.cs (the JIT config is base64 of a JSON object of
the runner's files, each base64; ``.runner`` and ``.credentials`` as
src/Runner.Common/ConfigurationStore.cs and CredentialData.cs name their fields;
ChristopherHX/github-act-runner#138 lists the three files);
docs.github.com/en/rest/actions/self-hosted-runners#create-configuration-for-a-just-in-time-runner-for-an-organization;
docs.github.com/en/webhooks/webhook-events-and-payloads#workflow_job and its schema in
``@octokit/openapi-webhooks`` 12.1.0 (vendored in
emulators/data/github-webhooks-workflow-job.json: the body's fields and nullability, the
headers every delivery has);
docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries (X-Hub-Signature-256);
docs.github.com/en/webhooks/using-webhooks/handling-failed-webhook-deliveries (a failed
delivery is recorded, not retried; a redelivery is asked for);
for the stand-in runner: actions/runner src/Runner.Listener/CommandSettings.cs (any flag from
``ACTIONS_RUNNER_INPUT_<NAME>``), src/Runner.Listener/Runner.cs (an ephemeral runner's
listener returns Success after its one job, whatever its result, and when its registration
is gone), src/Misc/layoutroot/run-helper.sh.template and run.sh (the listener's 0, 1 and 5
all end run.sh with 0).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from werkzeug.wrappers import Request, Response

from emulators.github import GitHubEmulator, app_key_pair, validate, webhook_headers, webhook_schema
from emulators.serving import BackgroundServer
from opendws.adapters.github_app import GitHubApp, JitRunner, RunnerScope

APP_ID, INSTALLATION, ORG, GROUP = 4321, 99, "acme", 3
REPOSITORY = f"{ORG}/train"
LABELS = ["self-hosted", "gpu-h100"]
SECRET = "It's a Secret to Everybody"


@dataclass
class Hook:
    headers: dict[str, str]
    body: bytes

    @property
    def payload(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.body)
        return loaded


@dataclass
class Receiver(BackgroundServer):
    """A webhook endpoint recording what it is sent; answers ``status``."""

    status: int = 200
    hooks: list[Hook] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__("127.0.0.1", 0, what="the webhook receiver", thread_name="hooks")
        self.arrived = threading.Condition()

    def application(self) -> Any:
        def receive(environ: Any, start_response: Any) -> Any:
            request = Request(environ)
            with self.arrived:
                self.hooks.append(Hook(dict(request.headers), request.get_data()))
                self.arrived.notify_all()
            return Response("", self.status)(environ, start_response)

        return receive

    @property
    def url(self) -> str:
        return f"http://{self.address}/hooks"


@pytest.fixture(scope="module")
def app_key() -> tuple[str, str]:
    return app_key_pair()


@dataclass
class World:
    github: GitHubEmulator
    app: GitHubApp

    def runner(self, name: str = "req-1-0") -> JitRunner:
        return self.app.generate_jit_config(INSTALLATION, RunnerScope.organization(ORG),
                                            name=name, runner_group_id=GROUP,
                                            labels=LABELS)  # fmt: skip


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as started:
        yield started


@pytest.fixture
def world(app_key: tuple[str, str], receiver: Receiver) -> Iterator[World]:
    private, public = app_key
    with GitHubEmulator(webhook_url=receiver.url, webhook_secret=SECRET) as github:
        github.state.register_app(APP_ID, public, [
            {"id": INSTALLATION, "account": ORG, "runner_groups": [GROUP]},
        ])  # fmt: skip
        yield World(github, GitHubApp(APP_ID, private, api_url=github.url))


def files_of(encoded_jit_config: str) -> dict[str, dict[str, object]]:
    """The runner's files a JIT config holds, decoded as Runner.Listener decodes them."""
    files = json.loads(base64.b64decode(encoded_jit_config))
    return {name: json.loads(base64.b64decode(content)) for name, content in files.items()}


def test_a_jit_config_holds_the_runners_files_naming_the_server(world: World) -> None:
    """The config is base64 of ``{".runner", ".credentials", ".credentials_rsaparams"}``,
    each base64 JSON; ``.runner`` names the runner (``agentId``, ``agentName``), its group
    (``poolId``) and the server it talks to (``serverUrl``, here the fake's own address)."""
    jit = world.runner()
    files = files_of(jit.encoded_jit_config)
    assert set(files) == {".runner", ".credentials", ".credentials_rsaparams"}
    runner = files[".runner"]
    assert (runner["agentId"], runner["agentName"], runner["poolId"]) == (
        jit.runner_id, "req-1-0", GROUP)  # fmt: skip
    assert runner["serverUrl"] == world.github.url + "/"
    assert runner["gitHubUrl"] == f"{world.github.url}/{ORG}"
    assert runner["ephemeral"] is True
    assert files[".credentials"]["scheme"] == "OAuth"
    assert world.runner("req-1-1").encoded_jit_config != jit.encoded_jit_config


# Webhooks.


def run_one_job(world: World, conclusion: str) -> dict[str, Any]:
    state = world.github.state
    job = state.queue_job(REPOSITORY, LABELS, script="echo hi", private=True)
    jit = world.runner()
    assert state.take_job(jit.encoded_jit_config)["job"]["id"] == job["id"]
    state.complete_job(job["id"], conclusion)
    assert state.webhooks.wait(5)
    return job


def test_a_jobs_hooks_arrive_in_order_signed_and_as_described(
    world: World, receiver: Receiver
) -> None:
    """queued → in_progress (with the runner's name and group) → completed (with the
    conclusion), each signed with the secret (``X-Hub-Signature-256`` = "sha256=" + hex
    HMAC-SHA256 of the body), with every header the description requires, and a body the
    description's schema for that action accepts."""
    job = run_one_job(world, "failure")
    hooks = receiver.hooks
    actions = [hook.payload["action"] for hook in hooks]
    assert actions == ["queued", "in_progress", "completed"]
    for hook in hooks:
        action, payload = hook.payload["action"], hook.payload
        headers = {name.lower(): value for name, value in hook.headers.items()}
        assert {name.lower() for name in webhook_headers(action)} <= set(headers)
        assert headers["x-github-event"] == "workflow_job"
        assert headers["user-agent"].startswith("GitHub-Hookshot/")
        assert headers["content-type"] == "application/json"
        expected = hmac.new(SECRET.encode(), hook.body, hashlib.sha256).hexdigest()
        assert headers["x-hub-signature-256"] == f"sha256={expected}"
        assert validate(webhook_schema(action), payload) == []
        assert payload["workflow_job"]["id"] == job["id"]
        assert payload["repository"]["full_name"] == REPOSITORY
        assert (payload["repository"]["private"], payload["repository"]["visibility"]) == (
            True, "private")  # fmt: skip
        assert payload["installation"]["id"] == INSTALLATION
    assert len({hook.headers["X-Github-Delivery"] for hook in hooks}) == 3
    queued, started, completed = (hook.payload["workflow_job"] for hook in hooks)
    assert (queued["status"], queued["runner_name"], queued["conclusion"]) == (
        "queued", None, None)  # fmt: skip
    assert (started["status"], started["runner_name"], started["runner_group_id"]) == (
        "in_progress", "req-1-0", GROUP)  # fmt: skip
    assert (completed["status"], completed["conclusion"]) == ("completed", "failure")
    assert completed["labels"] == LABELS


def test_the_schema_check_refuses_what_github_would_not_send(
    world: World, receiver: Receiver
) -> None:
    """The vendored schema bites: a completed job without a conclusion, a runner id that is
    a string, a repository without its owner."""
    schema = webhook_schema("completed")
    run_one_job(world, "success")
    payload = receiver.hooks[2].payload
    assert validate(schema, payload) == []
    for broken in (
        {**payload, "workflow_job": {**payload["workflow_job"], "conclusion": None}},
        {**payload, "workflow_job": {**payload["workflow_job"], "runner_id": "7"}},
        {**payload, "repository": {k: v for k, v in payload["repository"].items()
                                   if k != "owner"}},
    ):  # fmt: skip
        assert validate(schema, broken)


def test_a_redelivered_hook_keeps_its_delivery_guid(world: World, receiver: Receiver) -> None:
    run_one_job(world, "success")
    state = world.github.state
    completed = state.deliveries()[-1]
    again = state.redeliver(completed["id"])
    assert state.webhooks.wait(5)
    assert (again["guid"], again["redelivery"]) == (completed["guid"], True)
    first, last = receiver.hooks[2], receiver.hooks[3]
    assert last.headers["X-Github-Delivery"] == first.headers["X-Github-Delivery"]
    assert last.body == first.body
    assert state.deliveries()[-1]["status"] == "OK"


def test_a_failed_delivery_is_recorded_and_not_retried(world: World, receiver: Receiver) -> None:
    """GitHub does not redeliver a failed delivery by itself: one attempt, its status kept."""
    receiver.status = 500
    world.github.state.queue_job(REPOSITORY, LABELS)
    assert world.github.state.webhooks.wait(5)
    [delivery] = world.github.state.deliveries()
    assert (delivery["status"], delivery["status_code"]) == ("Invalid HTTP Response: 500", 500)
    assert len(receiver.hooks) == 1


def test_the_webhook_admin_api_over_http(app_key: tuple[str, str], receiver: Receiver) -> None:
    """``POST /_admin/webhook {url, secret}``, ``POST /_admin/jobs`` with ``script`` and
    ``private``, ``GET /_admin/deliveries``, ``POST /_admin/deliveries/{id}/attempts``."""
    with GitHubEmulator() as github:
        admin = f"{github.url}/_admin"
        hook = {"url": receiver.url, "secret": SECRET}
        assert requests.post(f"{admin}/webhook", json=hook, timeout=10).status_code == 200
        body: dict[str, Any] = {"repository": "octo/web", "labels": LABELS, "script": "true",
                                "private": False}  # fmt: skip
        job = requests.post(f"{admin}/jobs", json=body, timeout=10).json()
        assert (job["script"], job["private"]) == ("true", False)
        assert github.state.webhooks.wait(5)
        [delivery] = requests.get(f"{admin}/deliveries", timeout=10).json()
        assert (delivery["action"], delivery["status"]) == ("queued", "OK")
        again = requests.post(f"{admin}/deliveries/{delivery['id']}/attempts", timeout=10)
        assert again.status_code == 202
        assert github.state.webhooks.wait(5)
        assert [h.headers["X-Github-Delivery"] for h in receiver.hooks] == [delivery["guid"]] * 2
        assert receiver.hooks[0].payload["repository"]["visibility"] == "public"
        bad = {"repository": "octo/web", "labels": LABELS, "private": "no"}
        assert requests.post(f"{admin}/jobs", json=bad, timeout=10).status_code == 400


# The stand-in runner.

RUN_SH = Path(__file__).parents[2] / "emulators" / "runners" / "actions-runner" / "run.sh"


def start_runner(config: str, *, in_env: bool = True) -> subprocess.Popen[str]:
    """run.sh as an agent starts it: the config in ACTIONS_RUNNER_INPUT_JITCONFIG."""
    environment = {**os.environ, "RUNNER_ALLOW_RUNASROOT": "1"}
    argv = [str(RUN_SH)]
    if in_env:
        environment["ACTIONS_RUNNER_INPUT_JITCONFIG"] = config
    else:
        argv += ["--jitconfig", config]
    return subprocess.Popen(argv, env=environment, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def finish(process: subprocess.Popen[str], timeout: float = 4) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def test_the_runner_runs_its_job_and_exits_0(world: World, tmp_path: Path) -> None:
    """The config alone (from the environment) leads the runner to the fake; it takes the
    job, runs its script with its output on stdout, completes it ``success``, exits 0; the
    config's variable is not in the job's environment."""
    marker = tmp_path / "ran"
    script = f'echo "hello from $RUNNER_NAME"\nenv > {marker}'
    job = world.github.state.queue_job(REPOSITORY, LABELS, script=script)
    code, out, err = finish(start_runner(world.runner().encoded_jit_config))
    assert code == 0, err
    assert "hello from req-1-0" in out
    assert marker.exists()
    assert "ACTIONS_RUNNER_INPUT_JITCONFIG" not in marker.read_text()
    [done] = [j for j in world.github.state.jobs() if j["id"] == job["id"]]
    assert (done["status"], done["conclusion"], done["runner_name"]) == (
        "completed", "success", "req-1-0")  # fmt: skip


def test_a_failing_script_fails_the_job_and_the_runner_still_exits_0(
    world: World, receiver: Receiver
) -> None:
    """An ephemeral runner exits 0 after its one job, whatever the job's result; the job's
    conclusion is ``failure`` (and the ``completed`` hook says so)."""
    job = world.github.state.queue_job(REPOSITORY, LABELS, script="echo broken\nexit 3")
    code, out, _ = finish(start_runner(world.runner().encoded_jit_config, in_env=False))
    assert code == 0
    assert "completed with result: Failed" in out
    [done] = [j for j in world.github.state.jobs() if j["id"] == job["id"]]
    assert done["conclusion"] == "failure"
    assert world.github.state.webhooks.wait(5)
    assert receiver.hooks[-1].payload["workflow_job"]["conclusion"] == "failure"


def test_a_used_or_unreadable_config_is_refused_on_stderr(world: World) -> None:
    """A used config (its runner gone after its job), one in use, one that does not
    decode: the listener's error on stderr, no job taken, and run.sh's exit 0 (run-helper
    maps the listener's TerminatedError and SessionConflict to 0)."""
    world.github.state.queue_job(REPOSITORY, LABELS)
    config = world.runner().encoded_jit_config
    assert finish(start_runner(config))[0] == 0
    code, _, err = finish(start_runner(config))
    assert code == 0
    assert "The runner no longer exists on the server. Please reconfigure the runner." in err
    idle = world.runner("req-1-1").encoded_jit_config
    world.github.state.take_job(idle)
    code, out, err = finish(start_runner(idle))
    assert (code, "A session for this runner already exists.") == (0, err.strip())
    assert "Session Conflict" in out
    code, out, err = finish(start_runner("not a config"))
    assert code == 0
    assert "JIT config could not be read" in err
    assert "terminated error" in out
    assert [j["status"] for j in world.github.state.jobs()] == ["completed"]


def test_a_deleted_idle_runners_process_exits(world: World) -> None:
    """A runner with no job listens until its registration is deleted, then ends."""
    jit = world.runner()
    process = start_runner(jit.encoded_jit_config)
    try:
        deadline = time.monotonic() + 3
        while world.github.state.runner_by_id(jit.runner_id)["status"] != "online":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.2)
        assert process.poll() is None  # still listening
        world.app.delete_runner(INSTALLATION, RunnerScope.organization(ORG), jit.runner_id)
        code, _, err = finish(process, timeout=3)
    finally:
        process.kill()
    assert code == 0
    assert "The runner no longer exists on the server. Cleaning up local configuration." in err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_as_root_it_needs_runner_allow_runasroot(world: World) -> None:
    environment = {k: v for k, v in os.environ.items() if k != "RUNNER_ALLOW_RUNASROOT"}
    environment["ACTIONS_RUNNER_INPUT_JITCONFIG"] = world.runner().encoded_jit_config
    done = subprocess.run([str(RUN_SH)], env=environment, capture_output=True, text=True,
                          timeout=4, check=False)  # fmt: skip
    assert (done.returncode, done.stdout.splitlines()[0]) == (
        0, "Must not run interactively with sudo")  # fmt: skip
    assert world.github.state.runners()[0]["status"] == "offline"
