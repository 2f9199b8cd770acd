"""GitLab runners for CI jobs: a client of GitLab's REST API v4 that creates a runner for one
job, reads it and deletes it, and the ``gitlab-runner run-single`` command line that runs
that job's build on the VM.

The API (docs.gitlab.com/api/users/#create-a-runner-linked-to-a-user,
docs.gitlab.com/api/runners/; GitLab's ``lib/api/user_runners.rb`` and ``lib/api/ci/runners.rb``):

- ``POST /api/v4/user/runners`` with ``runner_type`` (``instance_type`` | ``group_type`` |
  ``project_type``; ``group_id`` is required for a group runner, ``project_id`` for a project
  runner), ``tag_list`` (a string array; GitLab also takes a comma-separated string),
  ``run_untagged``, ``locked``, ``maximum_timeout`` (seconds, at least 600: "Maximum timeout
  needs to be at least 10 minutes") and ``description`` answers 201 ``{"id", "token":
  "glrt-…", "token_expires_at"}``. The token's scope must be ``create_runner`` or ``api``.
- ``GET /api/v4/runners/:id`` answers the runner's details (``status``: ``online``,
  ``offline``, ``stale`` or ``never_contacted``; ``paused``; ``contacted_at``; ``tag_list``).
- ``DELETE /api/v4/runners/:id`` answers 204. A runner already gone (404) counts as deleted,
  so a repeated delete is safe.
- ``GET /api/v4/runners/:id/jobs`` (docs.gitlab.com/api/runners/#list-jobs-processed-by-a-runner)
  answers the jobs the runner took, with their ``status`` (``running``, ``success``,
  ``failed``, ``canceled``, …): how a one-job runner's job ended, which ``gitlab-runner
  run-single`` does not say (it exits 0 after a failed build too). Only the jobs of projects
  the token's user may read (at least the Reporter role) are listed; a user without access to
  the runner gets 403 "No access granted". Pages are followed (``X-Next-Page``).
  Reading a runner or its jobs and deleting it need the ``manage_runner`` scope (or
  ``api``; ``read_api`` reads): a token with ``create_runner`` alone creates runners it may
  not delete (GitLab's ``lib/api/ci/runners.rb``: ``allow_access_with_scope :manage_runner``
  on ``/runners/:id`` and the paths under it).

The access token (a personal, group or project access token) travels in the ``PRIVATE-TOKEN``
header, as docs.gitlab.com/api/rest/authentication documents for those tokens.

Refusals, each its own error (all :class:`GitLabError`), each naming GitLab's own message:

- 401 → :class:`GitLabUnauthorized` (an unknown, expired or revoked token; GitLab answers
  ``{"message": "401 Unauthorized"}`` or ``{"error": "invalid_token", "error_description"}``):
  not worth retrying until the token is replaced;
- 403 → :class:`GitLabForbidden` (``{"error": "insufficient_scope", …}`` for a token without
  the scope; ``{"message": "403 Forbidden - Insufficient permissions"}`` for a user not
  allowed on the group or project);
- 400 → :class:`GitLabInvalid` (``{"error": "group_id is missing"}``, ``{"message": "400 Bad
  request - Tags list can not be empty …"}``);
- 404 on a read → :class:`GitLabNotFound`;
- 429 → :class:`GitLabRateLimited` whose ``retry_at`` comes from ``Retry-After`` (seconds or
  an HTTP date), else ``RateLimit-Reset`` (Unix time), else a minute from now — the headers
  GitLab sends (docs.gitlab.com/administration/settings/user_and_ip_rate_limits, "Response
  headers"; docs.gitlab.com/user/gitlab_com/#rate-limits-on-gitlabcom);
- 5xx, or no answer at all → :class:`GitLabUnavailable`.

The runner's token is a credential: it is returned to the caller only (never logged, never in
an error, hidden from ``repr``), and passed to ``gitlab-runner`` in its environment
(:func:`run_single_environment`), never on its command line (:func:`run_single_argv`).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Literal, get_args

from opendws.clock import SystemClock
from opendws.ports.timers import Clock

RunnerType = Literal["instance_type", "group_type", "project_type"]
RUNNER_TYPES: tuple[str, ...] = get_args(RunnerType)
RunnerStatus = Literal["online", "offline", "stale", "never_contacted"]
# A job's status (Ci::HasStatus::AVAILABLE_STATUSES), which GET /runners/:id/jobs filters by.
JobStatus = Literal["created", "waiting_for_resource", "preparing", "waiting_for_callback",
                    "pending", "running", "success", "failed", "canceled", "canceling",
                    "skipped", "manual", "scheduled"]  # fmt: skip
JOB_STATUSES: tuple[str, ...] = get_args(JobStatus)
FINISHED_JOB_STATUSES = ("success", "failed", "canceled")
JOBS_PER_PAGE = 100  # the most GitLab gives in one page
Executor = Literal["shell", "docker"]
EXECUTORS: tuple[str, ...] = get_args(Executor)

# Ci::Runner validates maximum_timeout >= 600 s ("needs to be at least 10 minutes").
MINIMUM_TIMEOUT = timedelta(minutes=10)
# When a 429 names no time to come back: a minute, GitLab's usual rate-limit period.
DEFAULT_RETRY = timedelta(minutes=1)
# gitlab-runner's environment variable for --token (common/config.go, RunnerCredentials:
# `long:"token" env:"CI_SERVER_TOKEN"`): the token stays off the process list.
TOKEN_VARIABLE = "CI_SERVER_TOKEN"


class GitLabError(Exception):
    """A refusal or failure of GitLab's API: ``status`` (0: no answer) and GitLab's
    ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"GitLab answered {status}: {message}" if status else message)
        self.status = status
        self.message = message


class GitLabUnauthorized(GitLabError):
    """401: the access token is unknown, expired or revoked. Replace it; retrying won't help."""


class GitLabForbidden(GitLabError):
    """403: the token lacks the scope, or its user may not create runners there."""


class GitLabInvalid(GitLabError):
    """400: GitLab refused the request's parameters."""


class GitLabNotFound(GitLabError):
    """404: no such runner (or not visible to this token)."""


class GitLabUnavailable(GitLabError):
    """5xx, or GitLab did not answer: worth retrying later."""


class GitLabRateLimited(GitLabError):
    """429: come back at ``retry_at`` (timezone-aware UTC)."""

    def __init__(self, message: str, retry_at: datetime) -> None:
        super().__init__(429, message)
        self.retry_at = retry_at


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerSpec:
    """What a runner for one CI job is created with (``POST /user/runners``). GitLab's rules
    (a group runner's ``group_id``, a project runner's ``project_id``, a tag unless it runs
    untagged jobs, ``maximum_timeout`` of at least :data:`MINIMUM_TIMEOUT`) are GitLab's to
    apply: its refusal comes back as :class:`GitLabInvalid` with its message."""

    runner_type: RunnerType
    group_id: int | None = None  # required for a group runner
    project_id: int | None = None  # required for a project runner
    tags: tuple[str, ...] = ()  # the job's tags: the runner takes only jobs they cover
    run_untagged: bool = False
    locked: bool = True  # a project runner stays with its project
    maximum_timeout: timedelta | None = None  # at least MINIMUM_TIMEOUT
    description: str = ""

    def body(self) -> dict[str, Any]:
        """The request body, as GitLab's attribute table names it."""
        body: dict[str, Any] = {
            "runner_type": self.runner_type,
            "tag_list": list(self.tags),
            "run_untagged": self.run_untagged,
            "locked": self.locked,
        }
        if self.group_id is not None:
            body["group_id"] = self.group_id
        if self.project_id is not None:
            body["project_id"] = self.project_id
        if self.maximum_timeout is not None:
            body["maximum_timeout"] = math.ceil(self.maximum_timeout.total_seconds())
        if self.description:
            body["description"] = self.description
        return body


@dataclass(frozen=True, slots=True, kw_only=True)
class CreatedRunner:
    """A new runner: its id, and its authentication token (a credential: not in ``repr``)."""

    id: int
    token: str = field(repr=False)
    token_expires_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerState:
    """What ``GET /runners/:id`` says of a runner."""

    id: int
    status: str  # online | offline | stale | never_contacted
    paused: bool
    contacted_at: datetime | None
    tags: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerJob:
    """A job a runner took, as ``GET /runners/:id/jobs`` lists it."""

    id: int
    status: str  # one of JOB_STATUSES
    project_id: int
    failure_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_JOB_STATUSES


class GitLabRunners:
    """GitLab's runner API at ``url`` (``https://gitlab.com`` or a self-managed instance's
    address; ``/api/v4`` is added), with an access token that has the ``create_runner`` scope
    (and ``manage_runner`` to read and delete runners)."""

    def __init__(
        self, url: str, token: str, *, timeout: float = 30.0, clock: Clock | None = None
    ) -> None:
        if not url.startswith(("https://", "http://")):
            raise ValueError(f"GitLab URL {url!r}: an http(s) address such as https://gitlab.com")
        if not token:
            raise ValueError("a GitLab access token with the create_runner scope is required")
        self._api = url.rstrip("/") + "/api/v4"
        self._token = token
        self._timeout = timeout
        self._clock: Clock = clock or SystemClock()

    def __repr__(self) -> str:
        return f"GitLabRunners({self._api!r})"

    def create(self, spec: RunnerSpec) -> CreatedRunner:
        """``POST /user/runners``: a new runner and its token."""
        reply = self._request("POST", "/user/runners", spec.body())
        if not isinstance(reply, dict) or not isinstance(reply.get("token"), str):
            raise GitLabUnavailable(201, "the created runner's answer has no token")
        expires = reply.get("token_expires_at")
        return CreatedRunner(
            id=int(reply["id"]),
            token=reply["token"],
            token_expires_at=_timestamp(expires) if isinstance(expires, str) else None,
        )

    def get(self, runner_id: int) -> RunnerState:
        """``GET /runners/:id``: GitLabNotFound when there is no such runner."""
        reply = self._request("GET", f"/runners/{int(runner_id)}")
        if not isinstance(reply, dict):
            raise GitLabUnavailable(200, "the runner's details are not a JSON object")
        contacted = reply.get("contacted_at")
        return RunnerState(
            id=int(reply["id"]),
            status=str(reply.get("status", "")),
            paused=bool(reply.get("paused", not reply.get("active", True))),
            contacted_at=_timestamp(contacted) if isinstance(contacted, str) else None,
            tags=tuple(str(tag) for tag in reply.get("tag_list") or ()),
        )

    def jobs(self, runner_id: int, status: JobStatus | None = None) -> list[RunnerJob]:
        """``GET /runners/:id/jobs``: the jobs the runner took (with ``status`` only, if
        given), oldest first; GitLabNotFound when there is no such runner."""
        if status is not None and status not in JOB_STATUSES:
            raise ValueError(f"job status {status!r}: one of {', '.join(JOB_STATUSES)}")
        query = {"order_by": "id", "sort": "asc", "per_page": str(JOBS_PER_PAGE)}
        if status is not None:
            query["status"] = status
        jobs: list[RunnerJob] = []
        page = "1"
        while page:
            query["page"] = page
            path = f"/runners/{int(runner_id)}/jobs?" + urllib.parse.urlencode(query)
            reply, headers = self._exchange("GET", path)
            if not isinstance(reply, list):
                raise GitLabUnavailable(200, "the runner's jobs are not a JSON array")
            jobs += [_runner_job(item) for item in reply]
            page = (headers.get("X-Next-Page") or "").strip()
        return jobs

    def delete(self, runner_id: int) -> None:
        """``DELETE /runners/:id``; a runner already gone is deleted too (safe to repeat)."""
        try:
            self._request("DELETE", f"/runners/{int(runner_id)}")
        except GitLabNotFound:
            return

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        return self._exchange(method, path, body)[0]

    def _exchange(
        self, method: str, path: str, body: Mapping[str, Any] | None = None
    ) -> tuple[Any, Any]:
        """One call: (the answer's JSON, its headers), or the refusal as a GitLabError."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self._api + path, data=data, method=method)
        request.add_header("PRIVATE-TOKEN", self._token)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as reply:
                text, headers = reply.read(), reply.headers
        except urllib.error.HTTPError as error:
            raise self._refusal(error) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            raise GitLabUnavailable(0, f"{method} {self._api}{path}: no answer ({error})") from None
        return (json.loads(text) if text.strip() else None), headers

    def _refusal(self, error: urllib.error.HTTPError) -> GitLabError:
        status = error.code
        message = _message(error.read())
        if status == 401:
            return GitLabUnauthorized(status, message)
        if status == 403:
            return GitLabForbidden(status, message)
        if status == 404:
            return GitLabNotFound(status, message)
        if status == 429:
            return GitLabRateLimited(message, self._retry_at(error.headers))
        if status >= 500:
            return GitLabUnavailable(status, message)
        return GitLabInvalid(status, message)

    def _retry_at(self, headers: Any) -> datetime:
        """When a 429 says to come back: ``Retry-After`` (seconds or HTTP date), else
        ``RateLimit-Reset`` (Unix time), else a minute from now."""
        now = self._clock.now()
        retry_after = (headers.get("Retry-After") or "").strip()
        if retry_after.isdigit():
            return now + timedelta(seconds=int(retry_after))
        if retry_after:
            try:
                return parsedate_to_datetime(retry_after).astimezone(UTC)
            except (TypeError, ValueError):
                pass
        reset = (headers.get("RateLimit-Reset") or "").strip()
        if reset.isdigit():
            return datetime.fromtimestamp(int(reset), UTC)
        return now + DEFAULT_RETRY


def _message(body: bytes) -> str:
    """GitLab's message in an error body: ``{"message": …}`` (a string, or a field → errors
    object), ``{"error": …, "error_description": …}``, or plain text (a throttled request)."""
    text = body.decode(errors="replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return text or "(no message)"
    if not isinstance(parsed, dict):
        return text
    if "error" in parsed:
        described = ": ".join(str(parsed[key]) for key in ("error", "error_description")
                              if parsed.get(key))  # fmt: skip
        scope = f" (scope needed: {parsed['scope']})" if parsed.get("scope") else ""
        return described + scope
    message = parsed.get("message", text)
    return message if isinstance(message, str) else json.dumps(message, sort_keys=True)


def _runner_job(item: Any) -> RunnerJob:
    """One entry of ``GET /runners/:id/jobs`` (``JobBasicWithProject``)."""
    if not (isinstance(item, dict) and "id" in item and "status" in item
            and isinstance(item.get("project"), dict) and "id" in item["project"]):  # fmt: skip
        raise GitLabUnavailable(200, "a runner's job has no id, status or project")
    reason = item.get("failure_reason")
    return RunnerJob(
        id=int(item["id"]),
        status=str(item["status"]),
        project_id=int(item["project"]["id"]),
        failure_reason=reason if isinstance(reason, str) else None,
    )


def _timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def run_single_argv(
    url: str, executor: Executor, wait_timeout: timedelta, builds_dir: str | None = None
) -> list[str]:
    """``gitlab-runner run-single`` for one build: ``--url`` (the GitLab instance, not its
    API), ``--executor``, ``--max-builds 1`` and ``--wait-timeout`` (whole seconds: it exits
    when no job came that long), and ``--builds-dir`` if given (gitlab-runner
    ``commands/single.go`` and ``common/config.go``). The token is not on it: it goes in
    :func:`run_single_environment`."""
    if not url.startswith(("https://", "http://")):
        raise ValueError(f"GitLab URL {url!r}: an http(s) address such as https://gitlab.com")
    if executor not in EXECUTORS:
        raise ValueError(f"executor {executor!r}: one of {', '.join(EXECUTORS)}")
    seconds = math.ceil(wait_timeout.total_seconds())
    if seconds < 1:
        raise ValueError(f"wait_timeout {wait_timeout}: at least one second")
    argv = ["gitlab-runner", "run-single", "--url", url, "--executor", executor,
            "--max-builds", "1", "--wait-timeout", str(seconds)]  # fmt: skip
    if builds_dir is not None:
        argv += ["--builds-dir", builds_dir]
    return argv


def run_single_environment(token: str) -> dict[str, str]:
    """The runner's token as ``gitlab-runner`` reads it from its environment
    (``CI_SERVER_TOKEN``, the ``env`` of its ``--token`` flag), so it never shows in the
    process list."""
    if not token:
        raise ValueError("the runner's token is required")
    return {TOKEN_VARIABLE: token}


__all__ = [
    "EXECUTORS", "FINISHED_JOB_STATUSES", "JOB_STATUSES", "MINIMUM_TIMEOUT", "RUNNER_TYPES",
    "TOKEN_VARIABLE", "CreatedRunner", "Executor", "GitLabError", "GitLabForbidden",
    "GitLabInvalid", "GitLabNotFound", "GitLabRateLimited", "GitLabRunners",
    "GitLabUnauthorized", "GitLabUnavailable", "JobStatus", "RunnerJob", "RunnerSpec",
    "RunnerState", "RunnerStatus", "RunnerType", "run_single_argv", "run_single_environment",
]  # fmt: skip
