"""The GitLab runner client (opendws.adapters.gitlab_runners) against the GitLab stand-in
(emulators.gitlab), the stand-in's refusals as GitLab words them, and the stand-in
``gitlab-runner run-single`` (emulators/runners/gitlab-runner) taking one job from it.

Sources:
docs.gitlab.com/api/users/#create-a-runner-linked-to-a-user (``POST /user/runners``: the
attributes, ``group_id`` "Required if ``runner_type`` is ``group_type``", the ``create_runner``
scope, the answer ``{"id", "token": "glrt-…", "token_expires_at"}``);
docs.gitlab.com/api/runners/ (get and delete a runner; ``status``);
docs.gitlab.com/api/rest/authentication (``PRIVATE-TOKEN``; 401 ``{"message": "401
Unauthorized"}``);
GitLab's ``lib/api/user_runners.rb`` (``allow_access_with_scope :create_runner``; the Grape
declaration; ``forbidden!``/``bad_request!`` with the service's message) and
``spec/requests/api/user_runners_spec.rb`` (400 ``"group_id is missing"``, ``"runner_type is
missing, runner_type does not have a valid value"``; 403 ``insufficient_scope`` for a
``read_api`` token; ``"Tags list can not be empty"``); ``lib/api/ci/runners.rb``
(``allow_access_with_scope :manage_runner`` on ``/runners/:id`` and below;
``authenticate_list_runners_jobs!``: 403 "No access granted" without ``read_builds`` on the
runner); docs.gitlab.com/api/runners/#list-jobs-processed-by-a-runner (``status`` filter,
``order_by``/``sort``, jobs of projects where the user has at least the Reporter role);
``lib/api/api_guard.rb`` (the ``insufficient_scope`` and ``invalid_token`` bodies);
docs.gitlab.com/administration/settings/user_and_ip_rate_limits, "Response headers"
(``Retry-After``, ``RateLimit-Reset``);
gitlab-runner ``commands/single.go`` (``--wait-timeout``, ``--max-builds``; a failed build is
logged and run-single still exits 0) and ``common/config.go`` (``--token`` ↔
``CI_SERVER_TOKEN``, ``--builds-dir`` ↔ ``RUNNER_BUILDS_DIR``).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from emulators.gitlab import FakeGitLab
from opendws.adapters.gitlab_runners import (
    GitLabForbidden,
    GitLabInvalid,
    GitLabNotFound,
    GitLabRateLimited,
    GitLabRunners,
    GitLabUnauthorized,
    GitLabUnavailable,
    RunnerJob,
    RunnerSpec,
    run_single_argv,
    run_single_environment,
)
from opendws.clock import ManualClock

STANDIN = Path(__file__).parents[2] / "emulators" / "runners" / "gitlab-runner"
START = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
GROUP, PROJECT, OTHER_GROUP = 77, 1234, 88
OWNER = "glpat-owner-create-and-manage"  # create_runner + manage_runner, owner of GROUP
GPU = RunnerSpec(runner_type="group_type", group_id=GROUP, tags=("gpu-a100",),
                 maximum_timeout=timedelta(hours=1), description="opendws gl-1")  # fmt: skip


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def gitlab(clock: ManualClock) -> Iterator[FakeGitLab]:
    with FakeGitLab(clock=clock) as fake:
        fake.add_project(PROJECT, group_id=GROUP)
        fake.add_group(OTHER_GROUP)
        fake.add_token(OWNER, scopes={"create_runner", "manage_runner"},
                       owner_of_groups={GROUP})  # fmt: skip
        yield fake


def client(gitlab: FakeGitLab, token: str, clock: ManualClock) -> GitLabRunners:
    return GitLabRunners(gitlab.url, token, clock=clock)


def raw(gitlab: FakeGitLab, method: str, path: str, body: Any, token: str = OWNER) -> Any:
    """One request as a client other than ours sends it: (status, JSON body)."""
    request = urllib.request.Request(
        gitlab.url + path, data=json.dumps(body).encode(), method=method,
        headers={"PRIVATE-TOKEN": token, "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def test_a_group_runner_is_created_read_and_deleted_and_a_second_delete_is_fine(
    gitlab: FakeGitLab, clock: ManualClock
) -> None:
    """201 ``{"id", "token": "glrt-…"}``; the runner carries the job's tags and has never
    contacted GitLab; 204 on delete; a runner already gone is deleted as well."""
    runners = client(gitlab, OWNER, clock)
    created = runners.create(GPU)
    assert created.token.startswith("glrt-")
    assert created.token_expires_at is None
    assert created.token not in repr(created)
    state = runners.get(created.id)
    assert (state.id, state.status, state.paused, state.contacted_at, state.tags) == (
        created.id, "never_contacted", False, None, ("gpu-a100",)
    )  # fmt: skip
    stored = gitlab.runner(created.id)
    assert stored is not None
    assert (stored.runner_type, stored.group_id, stored.run_untagged, stored.locked,
            stored.maximum_timeout) == ("group_type", GROUP, False, True, 3600)  # fmt: skip
    runners.delete(created.id)
    assert gitlab.runner(created.id) is None
    with pytest.raises(GitLabNotFound):
        runners.get(created.id)
    runners.delete(created.id)


def test_an_unknown_token_is_unauthorized(gitlab: FakeGitLab, clock: ManualClock) -> None:
    """401 ``{"message": "401 Unauthorized"}`` (REST authentication); nothing is created."""
    with pytest.raises(GitLabUnauthorized, match="401 Unauthorized"):
        client(gitlab, "glpat-nobody", clock).create(GPU)
    assert gitlab.runners() == []


def test_an_expired_token_is_unauthorized_saying_so(gitlab: FakeGitLab, clock: ManualClock) -> None:
    """api_guard.rb: an expired (or revoked) token is 401 ``invalid_token``, "Token is
    expired. …" ("Token was revoked. …")."""
    gitlab.add_token("glpat-old", scopes={"create_runner"}, owner_of_groups={GROUP},
                     expired=True)  # fmt: skip
    with pytest.raises(GitLabUnauthorized, match="invalid_token: Token is expired"):
        client(gitlab, "glpat-old", clock).create(GPU)
    gitlab.add_token("glpat-revoked", scopes={"create_runner"}, revoked=True)
    with pytest.raises(GitLabUnauthorized, match="invalid_token: Token was revoked"):
        client(gitlab, "glpat-revoked", clock).create(GPU)
    assert gitlab.runners() == []


def test_a_token_without_create_runner_is_forbidden(gitlab: FakeGitLab, clock: ManualClock) -> None:
    """user_runners_spec.rb: a ``read_api`` token gets 403 ``insufficient_scope``; the error
    names GitLab's answer and the scopes that would do."""
    gitlab.add_token("glpat-reader", scopes={"read_api"}, owner_of_groups={GROUP})
    with pytest.raises(GitLabForbidden, match="insufficient_scope") as refused:
        client(gitlab, "glpat-reader", clock).create(GPU)
    assert "api create_runner" in refused.value.message
    assert gitlab.runners() == []


def test_a_create_runner_token_may_not_delete_the_runner(
    gitlab: FakeGitLab, clock: ManualClock
) -> None:
    """runners.rb: ``/runners/:id`` takes ``manage_runner`` (or ``api``), not
    ``create_runner``: such a token creates a runner it cannot delete."""
    gitlab.add_token("glpat-create", scopes={"create_runner"}, owner_of_groups={GROUP})
    runners = client(gitlab, "glpat-create", clock)
    created = runners.create(GPU)
    with pytest.raises(GitLabForbidden, match=r"insufficient_scope.*api manage_runner"):
        runners.delete(created.id)
    assert gitlab.runner(created.id) is not None


def test_a_user_who_does_not_own_the_group_is_forbidden(
    gitlab: FakeGitLab, clock: ManualClock
) -> None:
    """users API prerequisites: the Owner role of the group; otherwise 403 "Insufficient
    permissions" (CreateRunnerService)."""
    spec = RunnerSpec(runner_type="group_type", group_id=OTHER_GROUP, tags=("gpu-a100",))
    with pytest.raises(GitLabForbidden, match="403 Forbidden - Insufficient permissions"):
        client(gitlab, OWNER, clock).create(spec)


def test_a_group_runner_without_group_id_is_invalid(gitlab: FakeGitLab, clock: ManualClock) -> None:
    """``group_id`` is required for ``group_type`` (400 "group_id is missing"), ``project_id``
    for ``project_type``."""
    runners = client(gitlab, OWNER, clock)
    with pytest.raises(GitLabInvalid, match=r"^GitLab answered 400: group_id is missing$"):
        runners.create(RunnerSpec(runner_type="group_type", tags=("gpu-a100",)))
    with pytest.raises(GitLabInvalid, match="project_id is missing"):
        runners.create(RunnerSpec(runner_type="project_type", tags=("gpu-a100",)))
    assert gitlab.runners() == []


def test_the_runner_rules_are_refused_with_gitlabs_messages(
    gitlab: FakeGitLab, clock: ManualClock
) -> None:
    """Ci::Runner: no tags and no untagged jobs, or a maximum timeout under 10 minutes, is 400
    with the model's messages."""
    runners = client(gitlab, OWNER, clock)
    with pytest.raises(GitLabInvalid, match="Tags list can not be empty when runner is not"):
        runners.create(RunnerSpec(runner_type="group_type", group_id=GROUP))
    with pytest.raises(GitLabInvalid, match="Maximum timeout needs to be at least 10 minutes"):
        runners.create(RunnerSpec(runner_type="group_type", group_id=GROUP, tags=("gpu",),
                                  maximum_timeout=timedelta(minutes=5)))  # fmt: skip
    assert gitlab.runners() == []


def test_the_runner_type_is_checked_as_gitlab_declares_it(gitlab: FakeGitLab) -> None:
    """user_runners_spec.rb: the exact 400 bodies for a missing and an unknown ``runner_type``;
    a comma-separated ``tag_list`` is a list of tags."""
    assert raw(gitlab, "POST", "/api/v4/user/runners", {}) == (
        400, {"error": "runner_type is missing, runner_type does not have a valid value"}
    )  # fmt: skip
    assert raw(gitlab, "POST", "/api/v4/user/runners", {"runner_type": "unknown"}) == (
        400, {"error": "runner_type does not have a valid value"}
    )  # fmt: skip
    status, body = raw(
        gitlab,
        "POST",
        "/api/v4/user/runners",
        {"runner_type": "group_type", "group_id": GROUP, "tag_list": "gpu-a100, linux"},
    )
    assert status == 201
    assert set(body) == {"id", "token", "token_expires_at"}
    runner = gitlab.runner(body["id"])
    assert runner is not None
    assert runner.tags == ("gpu-a100", "linux")


def test_a_throttled_request_says_when_to_come_back(gitlab: FakeGitLab, clock: ManualClock) -> None:
    """429 with ``Retry-After`` (seconds): ``retry_at`` is that far ahead; without it,
    ``RateLimit-Reset`` (Unix time) says when. The request after goes through."""
    runners = client(gitlab, OWNER, clock)
    gitlab.throttle(1, retry_after=30)
    with pytest.raises(GitLabRateLimited) as limited:
        runners.create(GPU)
    assert limited.value.retry_at == START + timedelta(seconds=30)
    assert "Retry later" in limited.value.message
    gitlab.throttle(1, retry_after=90, send_retry_after=False)
    with pytest.raises(GitLabRateLimited) as limited:
        runners.create(GPU)
    assert limited.value.retry_at == START + timedelta(seconds=90)
    assert runners.create(GPU).token.startswith("glrt-")


def test_no_answer_is_unavailable(clock: ManualClock) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(GitLabUnavailable, match="no answer"):
        GitLabRunners(f"http://127.0.0.1:{port}", OWNER, timeout=2, clock=clock).get(1)


def test_run_single_argv_is_one_build_with_the_token_in_the_environment() -> None:
    """single.go's flags; the token goes in ``CI_SERVER_TOKEN`` (common/config.go), not argv."""
    assert run_single_argv("https://gitlab.example.com", "shell", timedelta(minutes=5)) == [
        "gitlab-runner", "run-single", "--url", "https://gitlab.example.com",
        "--executor", "shell", "--max-builds", "1", "--wait-timeout", "300",
    ]  # fmt: skip
    argv = run_single_argv("https://gitlab.com", "docker", timedelta(seconds=1.2), "/builds")
    assert argv[-4:] == ["--wait-timeout", "2", "--builds-dir", "/builds"]
    assert run_single_environment("glrt-secret") == {"CI_SERVER_TOKEN": "glrt-secret"}
    with pytest.raises(ValueError, match="executor"):
        run_single_argv("https://gitlab.com", "kubernetes", timedelta(minutes=1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one second"):
        run_single_argv("https://gitlab.com", "shell", timedelta(0))


def run_standin(gitlab: FakeGitLab, token: str, wait: timedelta, builds: Path) -> int:
    argv = run_single_argv(gitlab.url, "shell", wait, str(builds))
    assert token not in argv
    command = [sys.executable, str(STANDIN), *argv[1:]]
    return subprocess.run(command, env=run_single_environment(token), timeout=60,
                          check=False).returncode  # fmt: skip


def test_the_runner_takes_the_job_with_its_tags_and_exits(
    gitlab: FakeGitLab, clock: ManualClock, tmp_path: Path
) -> None:
    """The runner created for a job's tags takes that job (not one of other tags), runs it,
    reports success and exits 0; the runner has now contacted GitLab."""
    runners = client(gitlab, OWNER, clock)
    created = runners.create(GPU)
    other = gitlab.queue_job(PROJECT, tags=["tpu-v5"])
    job = gitlab.queue_job(PROJECT, tags=["gpu-a100"], script=["echo $GREETING > out.txt"],
                           variables={"GREETING": "hello"})  # fmt: skip
    assert run_standin(gitlab, created.token, timedelta(seconds=10), tmp_path) == 0
    taken = gitlab.job(job)
    assert (taken.state, taken.runner_id) == ("success", created.id)
    assert (tmp_path / str(job) / "out.txt").read_text() == "hello\n"
    assert gitlab.job(other).state == "pending"
    assert runners.get(created.id).status == "online"


def test_a_failed_job_is_reported_failed_and_run_single_still_exits_0(
    gitlab: FakeGitLab, clock: ManualClock, tmp_path: Path
) -> None:
    """single.go: a failed build is logged ("Failed to process build") and run-single exits 0
    once its build limit is reached; the job's state at GitLab says it failed."""
    created = client(gitlab, OWNER, clock).create(GPU)
    job = gitlab.queue_job(PROJECT, tags=["gpu-a100"], script=["exit 3"])
    assert run_standin(gitlab, created.token, timedelta(seconds=10), tmp_path) == 0
    failed = gitlab.job(job)
    assert (failed.state, failed.exit_code, failed.failure_reason) == (
        "failed", 3, "script_failure"
    )  # fmt: skip


def test_with_no_job_for_it_the_runner_exits_after_its_wait_timeout(
    gitlab: FakeGitLab, clock: ManualClock, tmp_path: Path
) -> None:
    created = client(gitlab, OWNER, clock).create(GPU)
    job = gitlab.queue_job(PROJECT, tags=["gpu-a100", "big-memory"])
    assert run_standin(gitlab, created.token, timedelta(seconds=1), tmp_path) == 0
    assert gitlab.job(job).state == "pending"


def test_the_job_api_refuses_unknown_runners_and_foreign_job_tokens(gitlab: FakeGitLab) -> None:
    """runner.rb: an unknown runner token is 403; a job is updated only with its own token
    and only while it runs."""
    assert raw(gitlab, "POST", "/api/v4/jobs/request", {"token": "glrt-unknown"}) == (
        403, {"message": "403 Forbidden"}
    )  # fmt: skip
    status, body = raw(
        gitlab,
        "POST",
        "/api/v4/user/runners",
        {"runner_type": "group_type", "group_id": GROUP, "tag_list": ["gpu-a100"]},
    )
    job = gitlab.queue_job(PROJECT, tags=["gpu-a100"])
    status, taken = raw(gitlab, "POST", "/api/v4/jobs/request", {"token": body["token"]})
    assert status == 201
    assert taken["id"] == job
    assert (
        raw(gitlab, "PUT", f"/api/v4/jobs/{job}", {"token": body["token"], "state": "success"})[0]
        == 403
    )
    assert gitlab.job(job).state == "running"


def take_and_finish(gitlab: FakeGitLab, runner_token: str, state: str, **extra: Any) -> int:
    """The runner's side over HTTP: take the next job, report it ``state``; its id."""
    status, job = raw(gitlab, "POST", "/api/v4/jobs/request", {"token": runner_token})
    assert status == 201
    update = {"token": job["token"], "state": state, **extra}
    assert raw(gitlab, "PUT", f"/api/v4/jobs/{job['id']}", update)[0] == 200
    return int(job["id"])


def test_the_runner_jobs_say_how_its_job_ended(gitlab: FakeGitLab, clock: ManualClock) -> None:
    """``GET /runners/:id/jobs``: the job the runner took, its status and project, and why it
    failed; ``status`` filters; another runner's jobs are not listed."""
    runners = client(gitlab, OWNER, clock)
    created, other = runners.create(GPU), runners.create(GPU)
    assert runners.jobs(created.id) == []
    gitlab.queue_job(PROJECT, tags=["gpu-a100"])
    job = take_and_finish(gitlab, created.token, "failed", failure_reason="script_failure",
                          exit_code=3)  # fmt: skip
    gitlab.queue_job(PROJECT, tags=["gpu-a100"])
    take_and_finish(gitlab, other.token, "success")
    failed = RunnerJob(id=job, status="failed", project_id=PROJECT,
                       failure_reason="script_failure")  # fmt: skip
    assert runners.jobs(created.id) == [failed]
    assert failed.finished
    assert runners.jobs(created.id, status="failed") == [failed]
    assert runners.jobs(created.id, status="success") == []
    with pytest.raises(ValueError, match="job status"):
        runners.jobs(created.id, status="done")  # type: ignore[arg-type]


def test_the_runner_jobs_of_an_unknown_runner_are_not_found(
    gitlab: FakeGitLab, clock: ManualClock
) -> None:
    """runners.rb ``get_runner``: 404 for a runner that does not exist (or was deleted)."""
    runners = client(gitlab, OWNER, clock)
    created = runners.create(GPU)
    runners.delete(created.id)
    with pytest.raises(GitLabNotFound):
        runners.jobs(created.id)


def test_the_runner_jobs_need_a_reading_scope_and_access_to_the_runner(
    gitlab: FakeGitLab, clock: ManualClock
) -> None:
    """A ``create_runner``-only token is 403 ``insufficient_scope`` (``manage_runner``,
    ``api`` or, for a GET, ``read_api`` would do); a token whose user may not read the
    runner's builds is 403 "No access granted"; a ``read_api`` token of the group's owner
    reads them."""
    created = client(gitlab, OWNER, clock).create(GPU)
    gitlab.add_token("glpat-create", scopes={"create_runner"}, owner_of_groups={GROUP})
    with pytest.raises(GitLabForbidden, match="insufficient_scope"):
        client(gitlab, "glpat-create", clock).jobs(created.id)
    gitlab.add_token("glpat-stranger", scopes={"api"}, owner_of_groups={OTHER_GROUP})
    with pytest.raises(GitLabForbidden, match="403 Forbidden - No access granted"):
        client(gitlab, "glpat-stranger", clock).jobs(created.id)
    gitlab.add_token("glpat-reader", scopes={"read_api"}, owner_of_groups={GROUP})
    assert client(gitlab, "glpat-reader", clock).jobs(created.id) == []
    with pytest.raises(GitLabUnauthorized):
        client(gitlab, "glpat-nobody", clock).jobs(created.id)


def test_the_runner_jobs_are_read_page_by_page(gitlab: FakeGitLab, clock: ManualClock) -> None:
    """GitLab gives at most 100 jobs a page and names the next (``X-Next-Page``): all 101
    are read, oldest first; an unknown ``status`` is GitLab's 400."""
    runners = client(gitlab, OWNER, clock)
    spec = RunnerSpec(runner_type="group_type", group_id=GROUP, run_untagged=True)
    created = runners.create(spec)
    for _ in range(101):
        gitlab.queue_job(PROJECT)
        take_and_finish(gitlab, created.token, "success")
    jobs = runners.jobs(created.id)
    assert len(jobs) == 101
    assert [job.id for job in jobs] == sorted(job.id for job in jobs)
    status, body = raw(gitlab, "GET", f"/api/v4/runners/{created.id}/jobs?status=done", None)
    assert (status, body) == (400, {"error": "status does not have a valid value"})
