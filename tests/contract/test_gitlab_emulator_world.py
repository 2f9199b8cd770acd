"""The local GitLab world: the GitLab stand-in's Job Hook webhooks, the stand-in
``gitlab-runner run-single`` taking a job from it, and opendws' runner client reading how the
job ended.

Sources: docs.gitlab.com/user/project/integrations/webhook_events/#job-events (``X-Gitlab-Event:
Job Hook``; ``object_kind: "build"``, ``build_status``, ``build_failure_reason``, ``runner``
with ``id``, ``description``, ``runner_type``, ``active``, ``is_shared``, ``tags``;
``repository``/``project`` with ``visibility_level``) and GitLab's
``lib/gitlab/data_builder/build.rb`` (``runner`` is null until a runner has the job);
docs.gitlab.com/user/project/integrations/webhooks/#delivery-headers (``X-Gitlab-Token``,
``X-Gitlab-Webhook-UUID`` one per webhook, ``X-Gitlab-Event-UUID``, ``Idempotency-Key`` the
same across retries); ``Gitlab::VisibilityLevel`` (private 0, internal 10, public 20);
docs.gitlab.com/api/users/#create-a-runner-linked-to-a-user (``description``);
docs.gitlab.com/api/runners/#list-jobs-processed-by-a-runner; gitlab-runner
``commands/single.go`` (``--wait-timeout``: exit once more than that many whole seconds passed
without a job; a failed build is logged and run-single still exits 0) and
``common/config.go`` (``CI_SERVER_URL``, ``CI_SERVER_TOKEN``, ``RUNNER_EXECUTOR``,
``RUNNER_BUILDS_DIR``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from emulators.gitlab import FakeGitLab
from opendws.adapters.gitlab_runners import (
    GitLabRunners,
    RunnerJob,
    RunnerSpec,
    run_single_argv,
    run_single_environment,
)

STANDIN = Path(__file__).parents[2] / "emulators" / "runners" / "gitlab-runner"
GROUP, PROJECT = 77, 1234
OWNER = "glpat-owner"
HOOK_TOKEN = "hook-secret"
VM = "gl-5f2c-0"  # the VM's name: the runner's description


class Receiver:
    """A webhook endpoint that records each request (headers, JSON body) and answers 200,
    or 500 to the first ``fail_first`` requests."""

    def __init__(self, fail_first: int = 0) -> None:
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.fail_first = fail_first
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver._lock:
                    receiver.requests.append((dict(self.headers.items()), body))
                    failing = len(receiver.requests) <= receiver.fail_first
                self.send_response(500 if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}/hooks/gitlab"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def bodies(self) -> list[dict[str, Any]]:
        with self._lock:
            return [body for _, body in self.requests]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    endpoint = Receiver()
    yield endpoint
    endpoint.close()


def world(receiver: Receiver, **options: Any) -> FakeGitLab:
    fake = FakeGitLab(webhook_url=receiver.url, webhook_token=HOOK_TOKEN, **options).start()
    fake.add_project(PROJECT, group_id=GROUP)
    fake.add_token(OWNER, scopes={"create_runner", "manage_runner"}, owner_of_groups={GROUP})
    return fake


@pytest.fixture
def gitlab(receiver: Receiver) -> Iterator[FakeGitLab]:
    fake = world(receiver, webhook_retry_delay=0.05)
    yield fake
    fake.stop()


def run_standin(
    gitlab: FakeGitLab, token: str, wait: timedelta, builds: Path
) -> subprocess.CompletedProcess[str]:
    argv = run_single_argv(gitlab.url, "shell", wait, str(builds))
    environment = run_single_environment(token) | {"OPENDWS_RUNNER_CHECK_INTERVAL": "0.2"}
    return subprocess.run([sys.executable, str(STANDIN), *argv[1:]], env=environment,
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip


def gpu_runner(gitlab: FakeGitLab) -> tuple[GitLabRunners, int, str]:
    runners = GitLabRunners(gitlab.url, OWNER)
    created = runners.create(RunnerSpec(
        runner_type="group_type", group_id=GROUP, tags=("gpu-a100",),
        maximum_timeout=timedelta(hours=1), description=VM,
    ))  # fmt: skip
    return runners, created.id, created.token


def test_a_failed_job_is_told_in_order_by_its_job_hooks_and_the_runner_exits_0(
    gitlab: FakeGitLab, receiver: Receiver, tmp_path: Path
) -> None:
    """Queued → ``pending`` (no runner); taken by the stand-in → ``running`` with the runner
    opendws created (its description the VM's name, its tags); the script fails →
    ``failed``, ``script_failure``. Each carries ``X-Gitlab-Event: Job Hook`` and the
    webhook's token; the runner exits 0 all the same, and GitLab's runner jobs say failed."""
    runners, runner_id, token = gpu_runner(gitlab)
    job = gitlab.queue_job(PROJECT, tags=["gpu-a100"], script=["exit 3"])
    done = run_standin(gitlab, token, timedelta(seconds=5), tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Failed to process build" in done.stderr
    assert gitlab.wait_for_deliveries(5)
    bodies = receiver.bodies()
    assert [(b["build_id"], b["build_status"]) for b in bodies] == [
        (job, "pending"), (job, "running"), (job, "failed")
    ]  # fmt: skip
    pending, running, failed = bodies
    assert pending["runner"] is None
    assert pending["build_started_at"] is None
    expected_runner = {"id": runner_id, "description": VM, "runner_type": "group_type",
                       "active": True, "is_shared": False, "tags": ["gpu-a100"]}  # fmt: skip
    assert running["runner"] == expected_runner
    assert running["build_started_at"] is not None
    assert failed["runner"] == expected_runner
    assert (failed["build_failure_reason"], failed["object_kind"]) == ("script_failure", "build")
    assert failed["build_finished_at"] is not None
    assert failed["project_id"] == PROJECT
    assert failed["commit"]["id"] == failed["pipeline_id"]
    for headers, _ in receiver.requests:
        assert headers["X-Gitlab-Event"] == "Job Hook"
        assert headers["X-Gitlab-Token"] == HOOK_TOKEN
        assert headers["Content-Type"] == "application/json"
    assert len({headers["X-Gitlab-Webhook-UUID"] for headers, _ in receiver.requests}) == 1
    assert len({headers["X-Gitlab-Event-UUID"] for headers, _ in receiver.requests}) == 3
    assert runners.jobs(runner_id) == [
        RunnerJob(id=job, status="failed", project_id=PROJECT, failure_reason="script_failure")
    ]


def test_a_successful_job_ends_with_success_and_the_projects_visibility_level(
    gitlab: FakeGitLab, receiver: Receiver, tmp_path: Path
) -> None:
    """``success`` with no failure reason; ``repository.visibility_level`` and
    ``project.visibility_level`` are GitLab's 0/10/20 for private/internal/public."""
    runners, runner_id, token = gpu_runner(gitlab)
    job = gitlab.queue_job(PROJECT, tags=["gpu-a100"], visibility="public")
    assert run_standin(gitlab, token, timedelta(seconds=5), tmp_path).returncode == 0
    gitlab.queue_job(4321, visibility="internal")
    gitlab.queue_job(4322)
    assert gitlab.wait_for_deliveries(5)
    bodies = receiver.bodies()
    assert [b["build_status"] for b in bodies if b["build_id"] == job] == [
        "pending", "running", "success"
    ]  # fmt: skip
    assert bodies[2]["build_failure_reason"] is None
    levels = [(b["project_id"], b["repository"]["visibility_level"],
               b["project"]["visibility_level"]) for b in bodies[2:]]  # fmt: skip
    assert levels == [(PROJECT, 20, 20), (4321, 10, 10), (4322, 0, 0)]
    assert bodies[2]["project"]["path_with_namespace"] == f"group-{GROUP}/project-{PROJECT}"
    assert runners.jobs(runner_id)[0].status == "success"
    with pytest.raises(ValueError, match="visibility"):
        gitlab.queue_job(PROJECT, visibility="secret")


def test_a_cancelled_job_is_told_canceled(gitlab: FakeGitLab, receiver: Receiver) -> None:
    job = gitlab.queue_job(PROJECT, tags=["gpu-a100"])
    assert gitlab.cancel_job(job).state == "canceled"
    assert gitlab.cancel_job(job).state == "canceled"  # once
    assert gitlab.wait_for_deliveries(5)
    assert [b["build_status"] for b in receiver.bodies()] == ["pending", "canceled"]


def test_a_redelivery_is_the_same_event_again(gitlab: FakeGitLab, receiver: Receiver) -> None:
    """Redelivering sends the same body with the same ``X-Gitlab-Event-UUID`` and
    ``Idempotency-Key``, recorded as a delivery of its own."""
    job = gitlab.queue_job(PROJECT, tags=["gpu-a100"])
    assert gitlab.wait_for_deliveries(5)
    (first,) = gitlab.deliveries(job)
    assert (first.delivered, first.attempts, first.response_status) == (True, 1, 200)
    again = gitlab.redeliver(first.number)
    assert gitlab.wait_for_deliveries(5)
    (headers_1, body_1), (headers_2, body_2) = receiver.requests
    assert body_1 == body_2
    for name in ("X-Gitlab-Event-UUID", "Idempotency-Key", "X-Gitlab-Webhook-UUID"):
        assert headers_1[name] == headers_2[name] == first.headers[name]
    assert headers_2["X-Gitlab-Token"] == HOOK_TOKEN
    assert [(d.number, d.redelivery_of, d.delivered) for d in gitlab.deliveries(job)] == [
        (first.number, None, True), (again.number, first.number, True)
    ]  # fmt: skip


def test_an_unanswered_delivery_is_retried_with_the_same_event_uuid() -> None:
    """Two 500s, then 200: the third attempt delivers it, with the same event UUID and
    idempotency key each time; with fewer attempts it ends undelivered."""
    receiver = Receiver(fail_first=2)
    gitlab = world(receiver, webhook_retry_delay=0.05, webhook_attempts=3)
    try:
        job = gitlab.queue_job(PROJECT)
        assert gitlab.wait_for_deliveries(5)
        (delivery,) = gitlab.deliveries(job)
        assert (delivery.delivered, delivery.attempts, delivery.response_status) == (True, 3, 200)
        keys = {(h["X-Gitlab-Event-UUID"], h["Idempotency-Key"]) for h, _ in receiver.requests}
        assert len(receiver.requests) == 3
        assert keys == {(delivery.event_uuid, delivery.idempotency_key)}
        receiver.fail_first = 10
        failing = gitlab.queue_job(PROJECT)
        assert gitlab.wait_for_deliveries(5)
        (undelivered,) = gitlab.deliveries(failing)
        assert (undelivered.delivered, undelivered.attempts, undelivered.response_status) == (
            False, 3, 500
        )  # fmt: skip
    finally:
        gitlab.stop()
        receiver.close()


def test_without_a_webhook_nothing_is_sent_and_one_can_be_set_later(receiver: Receiver) -> None:
    with FakeGitLab() as gitlab:
        gitlab.queue_job(PROJECT)
        assert gitlab.deliveries() == []
        gitlab.set_webhook(receiver.url)
        job = gitlab.queue_job(PROJECT)
        assert gitlab.wait_for_deliveries(5)
        ((headers, body),) = receiver.requests
        assert body["build_id"] == job
        assert "X-Gitlab-Token" not in headers
        with pytest.raises(ValueError, match="webhook URL"):
            gitlab.set_webhook("ftp://example.com")


def test_with_no_job_the_runner_exits_0_after_its_wait_timeout_read_from_the_environment(
    gitlab: FakeGitLab, tmp_path: Path
) -> None:
    """``--url``, ``--executor``, ``--builds-dir`` and the token from ``CI_SERVER_URL``,
    ``RUNNER_EXECUTOR``, ``RUNNER_BUILDS_DIR``, ``CI_SERVER_TOKEN``; no job for it within
    ``--wait-timeout 1`` → exit 0 after more than one whole second; the job it could not
    take is still pending. Without a token it is fatal (exit 1, "Missing Token")."""
    _, _, token = gpu_runner(gitlab)
    job = gitlab.queue_job(PROJECT, tags=["gpu-a100", "big-memory"])
    environment = {
        "CI_SERVER_URL": gitlab.url, "CI_SERVER_TOKEN": token, "RUNNER_EXECUTOR": "shell",
        "RUNNER_BUILDS_DIR": str(tmp_path), "OPENDWS_RUNNER_CHECK_INTERVAL": "0.2",
        "PATH": os.environ.get("PATH", ""),
    }  # fmt: skip
    command = [sys.executable, str(STANDIN), "run-single", "--max-builds", "1",
               "--wait-timeout", "1"]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, env=environment, capture_output=True, text=True,
                          timeout=30, check=False)  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "has not received a job in 1 seconds" in done.stderr
    assert 2.0 <= elapsed < 4.5
    assert gitlab.job(job).state == "pending"
    del environment["CI_SERVER_TOKEN"]
    missing = subprocess.run(command, env=environment, capture_output=True, text=True,
                             timeout=30, check=False)  # fmt: skip
    assert (missing.returncode, "Missing Token" in missing.stderr) == (1, True)


def test_the_admin_side_over_http_queues_a_job_and_shows_it_runners_and_deliveries() -> None:
    """What ``dws up``'s users and end-to-end tests drive from another process."""
    import requests

    with FakeGitLab() as gitlab:
        gitlab.add_project(7, group_id=42)
        queued = requests.post(f"{gitlab.url}/_admin/jobs", timeout=10, json={
            "project_id": 7, "tags": ["gpu-a100"], "script": "echo hi"})  # fmt: skip
        assert queued.status_code == 201
        job = queued.json()
        assert (job["state"], job["tags"]) == ("pending", ["gpu-a100"])
        shown = requests.get(f"{gitlab.url}/_admin/jobs/{job['id']}", timeout=10).json()
        assert shown["id"] == job["id"]
        assert requests.get(f"{gitlab.url}/_admin/jobs/999", timeout=10).status_code == 404
        assert requests.get(f"{gitlab.url}/_admin/runners", timeout=10).json() == []
        assert requests.get(f"{gitlab.url}/_admin/deliveries", timeout=10).json() == []
        assert requests.post(f"{gitlab.url}/_admin/nope", timeout=10).status_code == 404
