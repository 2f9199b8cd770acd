"""A GitLab stand-in: the calls opendws makes to create, read and delete a runner for one CI
job, and the minimum a one-job runner (``gitlab-runner run-single``, or the stand-in
``emulators/runners/gitlab-runner``) needs to take that job and report how it ended.

Answered as GitLab answers them — fields, status codes and error bodies from GitLab's REST
documentation (docs.gitlab.com/api/users/#create-a-runner-linked-to-a-user,
docs.gitlab.com/api/runners/, docs.gitlab.com/api/rest/authentication) and, where the pages
leave it open, GitLab's own sources and their request specs (``lib/api/user_runners.rb``,
``lib/api/ci/runners.rb``, ``lib/api/api_guard.rb``, ``lib/api/api.rb``,
``spec/requests/api/user_runners_spec.rb``):

- ``POST /api/v4/user/runners`` → 201 ``{"id", "token": "glrt-…", "token_expires_at": null}``.
  Parameters are checked as GitLab's Grape declaration does, 400 ``{"error": …}``:
  ``runner_type is missing, runner_type does not have a valid value``, ``runner_type does not
  have a valid value``, ``group_id is missing`` (group_type), ``project_id is missing``
  (project_type). A group or project that does not exist: 400 ``{"message": "400 Bad request -
  Missing/invalid scope"}``; a user who is not its owner (or, for ``instance_type``, not an
  administrator): 403 ``{"message": "403 Forbidden - Insufficient permissions"}``; the runner's
  own rules: 400 ``{"message": "400 Bad request - Tags list can not be empty when runner is not
  allowed to pick untagged jobs"}``, ``Maximum timeout needs to be at least 10 minutes``, at
  most 50 tags. ``tag_list`` is a string array or a comma-separated string.
- ``GET /api/v4/runners/:id`` → the runner's details (a subset of GitLab's: ``id``,
  ``description``, ``active``, ``paused``, ``is_shared``, ``runner_type``, ``online``,
  ``status``, ``contacted_at``, ``tag_list``, ``run_untagged``, ``locked``,
  ``maximum_timeout``, ``access_level``); ``status`` is ``never_contacted`` until the runner
  asks for a job, ``online`` while it last did so within two hours, ``offline`` after.
- ``DELETE /api/v4/runners/:id`` → 204; an unknown runner 404 ``{"message": "404 Not
  found"}``; a user who may not manage it 403 ``{"message": "403 Forbidden - No access
  granted"}``.

Authentication (``PRIVATE-TOKEN`` header or ``Authorization: Bearer``): no token or an
unknown one → 401 ``{"message": "401 Unauthorized"}``; an expired one → 401 ``{"error":
"invalid_token", "error_description": "Token is expired. …"}``; a revoked one likewise
("Token was revoked. …"). Scopes: creating a runner takes ``create_runner`` or ``api``;
reading one ``api``, ``read_api`` or ``manage_runner``; deleting one ``api`` or
``manage_runner``. Otherwise 403 ``{"error": "insufficient_scope", "error_description": "The
request requires higher privileges than provided by the access token.", "scope": "…"}``.

Rate limits: :meth:`FakeGitLab.throttle` makes the next requests answer as GitLab's throttle
does (docs.gitlab.com/administration/settings/user_and_ip_rate_limits, "Response headers"):
429, text ``Retry later``, ``Retry-After`` (seconds), ``RateLimit-Reset`` (Unix time),
``RateLimit-ResetTime``, ``RateLimit-Limit``, ``RateLimit-Observed``, ``RateLimit-Remaining``.

The runner's side (GitLab's ``lib/api/ci/runner.rb``; gitlab-runner's ``network/gitlab.go``):

- ``POST /api/v4/jobs/request`` with ``{"token": runner token, …}`` → 201 with the oldest
  pending job this runner may take (its project is the runner's, or in the runner's group, or
  any for an instance runner; the job's tags all among the runner's; an untagged job only if
  the runner runs untagged jobs), which is then running on it; 204 (with
  ``X-GitLab-Last-Update``) when there is none or the runner is paused; 403 ``{"message":
  "403 Forbidden"}`` for an unknown token. Each request is the runner's contact.
  The job carries the fields a minimal runner reads: ``id``, ``token`` (the job's, ``glcbt-…``),
  ``job_info``, ``git_info``, ``runner_info.timeout``, ``variables`` (``[{"key", "value",
  "public", "masked"}]``) and ``steps`` (``[{"name": "script", "script": [...], "timeout",
  "when", "allow_failure"}]``); ``image``, ``services``, ``artifacts``, ``cache``,
  ``credentials`` and ``dependencies`` are empty.
- ``PUT /api/v4/jobs/:id`` with ``{"token": the job's token, "state": "running" | "success" |
  "failed", "failure_reason"?, "exit_code"?}`` → 200 (header ``Job-Status``); an unknown job
  or a wrong token → 403 ``{"message": "403 Forbidden"}``; a job no longer running → 403
  ``{"message": "403 Forbidden - Job is not processing on runner"}``; another state → 400.

Not emulated: job logs (``PATCH /jobs/:id/trace``), artifacts, caches, pipelines, webhooks,
listing runners, runner managers, token expiry and rotation of runner tokens, the ``stale``
status, ``access_level`` rules and protected branches.

The administrator's side is Python: :meth:`FakeGitLab.add_token`, :meth:`~FakeGitLab.add_group`,
:meth:`~FakeGitLab.add_project`, :meth:`~FakeGitLab.queue_job`, :meth:`~FakeGitLab.job`,
:meth:`~FakeGitLab.runner` and :meth:`~FakeGitLab.throttle`.
"""

from __future__ import annotations

import json
import math
import secrets
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from email.utils import format_datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from emulators.official import HOST
from emulators.serving import BackgroundServer
from opendws.clock import SystemClock
from opendws.ports.timers import Clock

RUNNER_TYPES = ("instance_type", "group_type", "project_type")
ONLINE_FOR = timedelta(hours=2)  # Ci::Runner's ONLINE_CONTACT_TIMEOUT
MAX_TAGS = 50  # Ci::Runner::TAG_LIST_MAX_LENGTH
MINIMUM_TIMEOUT_S = 600  # Ci::Runner: maximum_timeout "needs to be at least 10 minutes"
JOB_TIMEOUT_S = 3600  # a project's default job timeout
RATE_LIMIT = 2000  # RateLimit-Limit the throttle reports

CREATE_SCOPES = ("api", "create_runner")
READ_SCOPES = ("api", "read_api", "manage_runner")
DELETE_SCOPES = ("api", "manage_runner")
INSUFFICIENT_SCOPE = "The request requires higher privileges than provided by the access token."
EXPIRED = "Token is expired. You can either do re-authorization or token refresh."
REVOKED = "Token was revoked. You have to re-authorize from the user."


class _Refused(Exception):
    """An answer other than success: ``status`` and the body GitLab sends (JSON; text for a
    throttled request)."""

    def __init__(
        self, status: int, body: Mapping[str, Any] | str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(status, body)
        self.status = status
        self.body: dict[str, Any] | str = body if isinstance(body, str) else dict(body)
        self.headers = dict(headers or {})


def _message(status: int, reason: str = "") -> _Refused:
    """``{"message": "403 Forbidden - reason"}``, as GitLab's error helpers render it."""
    titles = {400: "400 Bad request", 401: "401 Unauthorized", 403: "403 Forbidden",
              404: "404 Not found"}  # fmt: skip
    text = titles[status] + (f" - {reason}" if reason else "")
    return _Refused(status, {"message": text})


@dataclass(frozen=True, slots=True, kw_only=True)
class AccessToken:
    """A personal (or group/project) access token and what its user may do."""

    scopes: frozenset[str]
    admin: bool = False  # may create instance runners and manage any runner
    owner_of_groups: frozenset[int] = frozenset()
    owner_of_projects: frozenset[int] = frozenset()
    expired: bool = False
    revoked: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Runner:
    """A runner as the stand-in holds it."""

    id: int
    token: str = field(repr=False)
    runner_type: str
    group_id: int | None
    project_id: int | None
    tags: tuple[str, ...]
    run_untagged: bool
    locked: bool
    paused: bool
    maximum_timeout: int | None
    description: str
    contacted_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A CI job: ``state`` pending → running → success | failed."""

    id: int
    token: str = field(repr=False)
    project_id: int
    name: str
    tags: tuple[str, ...]
    script: tuple[str, ...]
    variables: tuple[tuple[str, str], ...]
    state: str = "pending"
    runner_id: int | None = None
    failure_reason: str | None = None
    exit_code: int | None = None


class FakeGitLab(BackgroundServer):
    """The stand-in on a background thread; ``url`` is the instance's address (the API is under
    ``/api/v4``). A context manager."""

    def __init__(self, *, host: str = HOST, port: int = 0, clock: Clock | None = None) -> None:
        super().__init__(host, port, what="the GitLab stand-in", thread_name="gitlab")
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._tokens: dict[str, AccessToken] = {}
        self._groups: set[int] = set()
        self._projects: dict[int, int | None] = {}  # project id → its group's
        self._runners: dict[int, Runner] = {}
        self._jobs: dict[int, Job] = {}
        self._next_runner = 9171
        self._next_job = 4001
        self._throttled = 0
        self._retry_after = 60
        self._send_retry_after = True

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def application(self) -> Any:
        return self._serve

    # The administrator's side.

    def add_token(
        self,
        token: str,
        *,
        scopes: Iterable[str],
        admin: bool = False,
        owner_of_groups: Iterable[int] = (),
        owner_of_projects: Iterable[int] = (),
        expired: bool = False,
        revoked: bool = False,
    ) -> None:
        """An access token with ``scopes`` whose user owns those groups and projects."""
        with self._lock:
            self._tokens[token] = AccessToken(
                scopes=frozenset(scopes), admin=admin,
                owner_of_groups=frozenset(owner_of_groups),
                owner_of_projects=frozenset(owner_of_projects), expired=expired,
                revoked=revoked,
            )  # fmt: skip

    def add_group(self, group_id: int) -> None:
        with self._lock:
            self._groups.add(group_id)

    def add_project(self, project_id: int, *, group_id: int | None = None) -> None:
        """A project, in ``group_id`` if given (the group is added too)."""
        with self._lock:
            if group_id is not None:
                self._groups.add(group_id)
            self._projects[project_id] = group_id

    def queue_job(
        self,
        project_id: int,
        *,
        tags: Iterable[str] = (),
        script: Iterable[str] = ("true",),
        variables: Mapping[str, str] | None = None,
        name: str = "build",
    ) -> int:
        """A pending job of ``project_id`` (added if unknown); its id."""
        with self._lock:
            self._projects.setdefault(project_id, None)
            job_id = self._next_job
            self._next_job += 1
            self._jobs[job_id] = Job(
                id=job_id, token="glcbt-" + secrets.token_urlsafe(15), project_id=project_id,
                name=name, tags=tuple(tags), script=tuple(script),
                variables=tuple(sorted((variables or {}).items())),
            )  # fmt: skip
            return job_id

    def job(self, job_id: int) -> Job:
        with self._lock:
            return self._jobs[job_id]

    def runner(self, runner_id: int) -> Runner | None:
        with self._lock:
            return self._runners.get(runner_id)

    def runners(self) -> list[Runner]:
        with self._lock:
            return sorted(self._runners.values(), key=lambda runner: runner.id)

    def throttle(
        self, requests: int = 1, *, retry_after: int = 60, send_retry_after: bool = True
    ) -> None:
        """The next ``requests`` API requests are refused with 429 and the rate-limit headers;
        ``Retry-After: retry_after`` among them unless ``send_retry_after`` is false (GitLab
        leaves it out on some limits: gitlab-org/gitlab#199738), ``RateLimit-Reset`` always."""
        with self._lock:
            self._throttled = requests
            self._retry_after = retry_after
            self._send_retry_after = send_retry_after

    # The API.

    def _serve(self, environ: Any, start_response: Any) -> Any:
        request = Request(environ)
        try:
            with self._lock:
                self._check_throttle()
                status, body, headers = self._answer(request)
        except _Refused as refused:
            status, body, headers = refused.status, refused.body, refused.headers
        if isinstance(body, str):
            response = Response(body, status, content_type="text/plain", headers=headers)
        elif body is None:
            response = Response(None, status, headers=headers)
        else:
            response = Response(json.dumps(body), status, content_type="application/json",
                                headers=headers)  # fmt: skip
        return response(environ, start_response)

    def _check_throttle(self) -> None:
        if self._throttled <= 0:
            return
        self._throttled -= 1
        reset = self._clock.now() + timedelta(seconds=self._retry_after)
        headers = {"Retry-After": str(self._retry_after)} if self._send_retry_after else {}
        raise _Refused(429, "Retry later\n", headers | {
            "RateLimit-Reset": str(math.ceil(reset.timestamp())),
            "RateLimit-ResetTime": format_datetime(reset, usegmt=True),
            "RateLimit-Limit": str(RATE_LIMIT), "RateLimit-Observed": str(RATE_LIMIT + 1),
            "RateLimit-Remaining": "0",
        })  # fmt: skip

    def _answer(self, request: Request) -> tuple[int, Any, dict[str, str]]:
        path, method = request.path.rstrip("/"), request.method
        parts = path.split("/")
        if method == "POST" and path == "/api/v4/user/runners":
            return 201, self._create_runner(request), {}
        if path.startswith("/api/v4/runners/") and len(parts) == 5:
            runner_id = _path_id(parts[4])
            if method == "GET":
                return 200, self._runner_details(request, runner_id), {}
            if method == "DELETE":
                self._delete_runner(request, runner_id)
                return 204, None, {}
        if method == "POST" and path == "/api/v4/jobs/request":
            return self._request_job(request)
        if method == "PUT" and path.startswith("/api/v4/jobs/") and len(parts) == 5:
            return self._update_job(request, _path_id(parts[4]))
        raise _Refused(404, {"error": "404 Not Found"})

    def _authenticate(self, request: Request, scopes: tuple[str, ...]) -> AccessToken:
        """The request's access token, or GitLab's 401/403 (api_guard.rb)."""
        presented = request.headers.get("PRIVATE-TOKEN", "")
        bearer = request.headers.get("Authorization", "")
        if not presented and bearer.startswith("Bearer "):
            presented = bearer.removeprefix("Bearer ")
        token = self._tokens.get(presented) if presented else None
        if token is None:
            raise _message(401)
        if token.revoked:
            raise _Refused(401, {"error": "invalid_token", "error_description": REVOKED})
        if token.expired:
            raise _Refused(401, {"error": "invalid_token", "error_description": EXPIRED})
        if not token.scopes & set(scopes):
            raise _Refused(403, {"error": "insufficient_scope",
                                 "error_description": INSUFFICIENT_SCOPE,
                                 "scope": " ".join(scopes)})  # fmt: skip
        return token

    def _create_runner(self, request: Request) -> dict[str, Any]:
        token = self._authenticate(request, CREATE_SCOPES)
        params = _params(request)
        attributes = _create_attributes(params)
        runner_type = attributes["runner_type"]
        group_id, project_id = attributes.get("group_id"), attributes.get("project_id")
        if runner_type == "group_type" and group_id not in self._groups:
            raise _message(400, "Missing/invalid scope")
        if runner_type == "project_type" and project_id not in self._projects:
            raise _message(400, "Missing/invalid scope")
        allowed = token.admin or (
            (runner_type == "group_type" and group_id in token.owner_of_groups)
            or (runner_type == "project_type" and project_id in token.owner_of_projects)
        )
        if not allowed:
            raise _message(403, "Insufficient permissions")
        problems = _runner_problems(attributes)
        if problems:
            raise _message(400, _sentence(problems))
        runner_id = self._next_runner
        self._next_runner += 1
        runner = Runner(
            id=runner_id, token="glrt-" + secrets.token_urlsafe(15), runner_type=runner_type,
            group_id=group_id if runner_type == "group_type" else None,
            project_id=project_id if runner_type == "project_type" else None,
            tags=attributes["tag_list"], run_untagged=attributes["run_untagged"],
            locked=attributes["locked"], paused=attributes["paused"],
            maximum_timeout=attributes.get("maximum_timeout"),
            description=attributes.get("description", ""),
        )  # fmt: skip
        self._runners[runner_id] = runner
        return {"id": runner.id, "token": runner.token, "token_expires_at": None}

    def _managed_runner(self, request: Request, runner_id: int, scopes: tuple[str, ...]) -> Runner:
        token = self._authenticate(request, scopes)
        runner = self._runners.get(runner_id)
        if runner is None:
            raise _message(404)
        if not (token.admin or runner.group_id in token.owner_of_groups
                or runner.project_id in token.owner_of_projects):  # fmt: skip
            raise _message(403, "No access granted")
        return runner

    def _runner_details(self, request: Request, runner_id: int) -> dict[str, Any]:
        runner = self._managed_runner(request, runner_id, READ_SCOPES)
        status = self._status(runner)
        contacted = runner.contacted_at
        return {
            "id": runner.id, "description": runner.description, "active": not runner.paused,
            "paused": runner.paused, "is_shared": runner.runner_type == "instance_type",
            "runner_type": runner.runner_type, "name": None, "online": status == "online",
            "status": status,
            "contacted_at": contacted.isoformat().replace("+00:00", "Z") if contacted else None,
            "tag_list": list(runner.tags), "run_untagged": runner.run_untagged,
            "locked": runner.locked, "maximum_timeout": runner.maximum_timeout,
            "access_level": "not_protected",
        }  # fmt: skip

    def _status(self, runner: Runner) -> str:
        if runner.contacted_at is None:
            return "never_contacted"
        return "online" if self._clock.now() - runner.contacted_at < ONLINE_FOR else "offline"

    def _delete_runner(self, request: Request, runner_id: int) -> None:
        self._managed_runner(request, runner_id, DELETE_SCOPES)
        del self._runners[runner_id]

    # The runner's side.

    def _request_job(self, request: Request) -> tuple[int, Any, dict[str, str]]:
        params = _params(request)
        presented = params.get("token")
        if not isinstance(presented, str) or not presented:
            raise _Refused(400, {"error": "token is missing"})
        runner = next((r for r in self._runners.values() if r.token == presented), None)
        if runner is None:
            raise _message(403)
        runner = replace(runner, contacted_at=self._clock.now())
        self._runners[runner.id] = runner
        last_update = {"X-GitLab-Last-Update": secrets.token_hex(16)}
        if runner.paused:
            return 204, None, last_update
        job = next((j for _, j in sorted(self._jobs.items())
                    if j.state == "pending" and self._takes(runner, j)), None)  # fmt: skip
        if job is None:
            return 204, None, last_update
        job = replace(job, state="running", runner_id=runner.id)
        self._jobs[job.id] = job
        return 201, self._job_payload(job, runner), {}

    def _takes(self, runner: Runner, job: Job) -> bool:
        """Whether ``runner`` may run ``job``: its scope holds the job's project, and it
        accepts the job's tags (Ci::Runner#matches_build?)."""
        if runner.runner_type == "project_type" and runner.project_id != job.project_id:
            return False
        if runner.runner_type == "group_type" and (
            self._projects.get(job.project_id) != runner.group_id
        ):
            return False
        if not job.tags:
            return runner.run_untagged
        return set(job.tags) <= set(runner.tags)

    def _job_payload(self, job: Job, runner: Runner) -> dict[str, Any]:
        timeout = min(JOB_TIMEOUT_S, runner.maximum_timeout or JOB_TIMEOUT_S)
        zero = "0" * 40
        variables = [{"key": "CI_JOB_ID", "value": str(job.id), "public": True, "masked": False},
                     {"key": "CI_PROJECT_ID", "value": str(job.project_id), "public": True,
                      "masked": False}]  # fmt: skip
        variables += [{"key": key, "value": value, "public": False, "masked": False}
                      for key, value in job.variables]  # fmt: skip
        return {
            "id": job.id, "token": job.token, "allow_git_fetch": False,
            "job_info": {"id": job.id, "name": job.name, "stage": "test",
                         "project_id": job.project_id,
                         "project_name": f"project-{job.project_id}"},
            "git_info": {"repo_url": "", "ref": "main", "sha": zero, "before_sha": zero,
                         "ref_type": "branch", "refspecs": [], "depth": 20},
            "runner_info": {"timeout": timeout},
            "variables": variables,
            "steps": [{"name": "script", "script": list(job.script), "timeout": timeout,
                       "when": "on_success", "allow_failure": False}],
            "image": None, "services": [], "artifacts": [], "cache": [], "credentials": [],
            "dependencies": [], "features": {},
        }  # fmt: skip

    def _update_job(self, request: Request, job_id: int) -> tuple[int, Any, dict[str, str]]:
        params = _params(request)
        job = self._jobs.get(job_id)
        if job is None or params.get("token") != job.token:
            raise _message(403)
        if job.state != "running":
            raise _Refused(403, _message(403, "Job is not processing on runner").body,
                           {"Job-Status": job.state})  # fmt: skip
        state = params.get("state")
        if state == "running" or state is None:
            return 200, "200", {"Job-Status": job.state}
        if state not in ("success", "failed"):
            return 400, "400", {"Job-Status": job.state}
        exit_code = params.get("exit_code")
        job = replace(
            job, state=str(state), failure_reason=params.get("failure_reason"),
            exit_code=exit_code if isinstance(exit_code, int) else None,
        )  # fmt: skip
        self._jobs[job.id] = job
        return 200, "200", {"Job-Status": job.state}


def _path_id(text: str) -> int:
    if not text.isdigit():
        raise _Refused(400, {"error": "id is invalid"})
    return int(text)


def _params(request: Request) -> dict[str, Any]:
    """The request's parameters: a JSON body, or form fields (as curl ``--data`` sends)."""
    if request.mimetype == "application/json":
        try:
            body = json.loads(request.get_data() or b"{}")
        except ValueError:
            raise _Refused(400, {"error": "the request body is not valid JSON"}) from None
        if not isinstance(body, dict):
            raise _Refused(400, {"error": "the request body must be a JSON object"})
        return body
    return {key: request.form.getlist(key) if key.endswith("[]") else request.form[key]
            for key in request.form}  # fmt: skip


def _create_attributes(params: Mapping[str, Any]) -> dict[str, Any]:
    """``POST /user/runners``'s parameters, coerced and checked as its Grape declaration
    does; 400 ``{"error": "a, b"}`` naming every problem."""
    errors: list[str] = []
    runner_type = params.get("runner_type")
    if runner_type is None:
        errors += ["runner_type is missing", "runner_type does not have a valid value"]
    elif runner_type not in RUNNER_TYPES:
        errors.append("runner_type does not have a valid value")
    attributes: dict[str, Any] = {"runner_type": runner_type}
    for name, needed_by in (("group_id", "group_type"), ("project_id", "project_type")):
        if runner_type == needed_by and params.get(name) is None:
            errors.append(f"{name} is missing")
        elif params.get(name) is not None:
            value = _integer(params[name])
            if value is None:
                errors.append(f"{name} is invalid")
            attributes[name] = value
    for name, default in (("locked", False), ("run_untagged", True), ("paused", False)):
        value = _boolean(params.get(name, default))
        if value is None:
            errors.append(f"{name} is invalid")
        attributes[name] = value
    tags = _tags(params.get("tag_list", ()))
    if tags is None:
        errors.append("tag_list is invalid")
    attributes["tag_list"] = tags or ()
    if params.get("maximum_timeout") is not None:
        timeout = _integer(params["maximum_timeout"])
        if timeout is None:
            errors.append("maximum_timeout is invalid")
        attributes["maximum_timeout"] = timeout
    if params.get("description") is not None:
        attributes["description"] = str(params["description"])
    if errors:
        raise _Refused(400, {"error": ", ".join(errors)})
    return attributes


def _runner_problems(attributes: Mapping[str, Any]) -> list[str]:
    """Ci::Runner's validations, as full messages."""
    problems = []
    timeout = attributes.get("maximum_timeout")
    if timeout is not None and timeout < MINIMUM_TIMEOUT_S:
        problems.append("Maximum timeout needs to be at least 10 minutes")
    tags = attributes["tag_list"]
    if not tags and not attributes["run_untagged"]:
        problems.append(
            "Tags list can not be empty when runner is not allowed to pick untagged jobs"
        )
    if len(tags) > MAX_TAGS:
        problems.append(
            f"Tags list Too many tags specified. Please limit the number of tags to {MAX_TAGS}"
        )
    return problems


def _sentence(items: list[str]) -> str:
    """Rails' ``to_sentence``: "a", "a and b", "a, b, and c"."""
    if len(items) <= 2:
        return " and ".join(items)
    return ", ".join(items[:-1]) + ", and " + items[-1]


def _integer(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _boolean(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    return None


def _tags(value: Any) -> tuple[str, ...] | None:
    """A string array, or a comma-separated string (CommaSeparatedToArray)."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list | tuple) or not all(isinstance(tag, str) for tag in value):
        return None
    return tuple(tag.strip() for tag in value if tag.strip())


__all__ = ["AccessToken", "FakeGitLab", "Job", "Runner"]
