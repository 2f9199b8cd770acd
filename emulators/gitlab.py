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
- ``GET /api/v4/runners/:id/jobs`` (docs.gitlab.com/api/runners/#list-jobs-processed-by-a-runner;
  ``lib/api/ci/runners.rb``) → the jobs the runner took, as GitLab's ``JobBasicWithProject``
  (a subset: ``id``, ``status``, ``stage``, ``name``, ``ref``, ``tag``, ``allow_failure``,
  ``created_at``, ``started_at``, ``finished_at``, ``duration``, ``queued_duration``,
  ``failure_reason``, ``pipeline``, ``project``), only of projects the user may read;
  ``status`` filters (400 ``status does not have a valid value`` for one outside
  ``Ci::HasStatus::AVAILABLE_STATUSES``), ``order_by=id`` with ``sort`` (default ``desc``)
  orders, else ascending ids; ``page``/``per_page`` (default 20, at most 100) paginate with
  ``X-Page``, ``X-Per-Page``, ``X-Next-Page``, ``X-Total``. Scopes as reading a runner
  (``manage_runner`` covers every ``/runners/:id`` path); an unknown runner 404, a user who
  may not read its jobs 403 "No access granted".

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

Job Hook webhooks (docs.gitlab.com/user/project/integrations/webhook_events/#job-events,
GitLab's ``lib/gitlab/data_builder/build.rb``; headers from
docs.gitlab.com/user/project/integrations/webhooks/#delivery-headers): with a webhook URL set
(``webhook_url``/``webhook_token`` or :meth:`FakeGitLab.set_webhook`), each change of a job's
status is POSTed there — ``pending`` when it is queued (``runner`` null), ``running`` when a
runner takes it (``runner``: ``id``, ``description``, ``runner_type``, ``active``,
``is_shared``, ``tags``), then ``success``, ``failed`` (with ``build_failure_reason``) or
``canceled`` — with ``Content-Type: application/json``, ``User-Agent: GitLab/<version>``,
``X-Gitlab-Event: Job Hook``, ``X-Gitlab-Token`` (when a token is set),
``X-Gitlab-Instance``, ``X-Gitlab-Webhook-UUID`` (one per webhook),
``X-Gitlab-Event-UUID`` and ``Idempotency-Key`` (one per event, the same on every retry and
redelivery). The body has the documented fields (``object_kind: "build"``, ``ref``, ``tag``,
``before_sha``, ``sha``, ``retries_count``, ``build_*``, ``pipeline_id``, ``runner``,
``project_id``, ``project_name``, ``user``, ``commit`` — whose ``id`` is the pipeline's —,
``repository``, ``project`` with ``visibility_level`` 0/10/20 for private/internal/public,
``environment``) and the job's own ``tags`` (added in GitLab 16.8 by gitlab-org/gitlab!140760,
"Include job tags in build webhook event payload", so that autoscalers see them while the job
is pending; the documented example predates it).
Deliveries leave one background thread in the order the events happened; one that is not
answered 2xx is tried again (``webhook_attempts`` in all, ``webhook_retry_delay`` seconds
apart). :meth:`FakeGitLab.deliveries` lists them, :meth:`FakeGitLab.redeliver` sends one
again as it was, :meth:`FakeGitLab.wait_for_deliveries` waits for the queue to empty. This
fake's jobs are queued ``pending`` (no ``created`` event before).

Not emulated: job logs (``PATCH /jobs/:id/trace``), artifacts, caches, pipelines, other
webhooks, GitLab's own webhook auto-disabling, listing runners, runner managers, token expiry
and rotation of runner tokens, the ``stale`` status, ``access_level`` rules and protected
branches.

The administrator's side is Python: :meth:`FakeGitLab.add_token`, :meth:`~FakeGitLab.add_group`,
:meth:`~FakeGitLab.add_project`, :meth:`~FakeGitLab.queue_job`, :meth:`~FakeGitLab.cancel_job`,
:meth:`~FakeGitLab.job`, :meth:`~FakeGitLab.runner`, :meth:`~FakeGitLab.throttle`,
:meth:`~FakeGitLab.set_webhook`, :meth:`~FakeGitLab.deliveries`,
:meth:`~FakeGitLab.redeliver` and :meth:`~FakeGitLab.wait_for_deliveries`; for processes
outside this one (``dws up``'s users), the same over HTTP under ``/_admin`` (not GitLab's):
``POST /_admin/jobs {project_id, tags, script, visibility?}`` (201, the job), ``GET
/_admin/jobs/ID`` (its ``state``, ``runner_id``, ``failure_reason``), ``GET /_admin/runners``,
``GET /_admin/deliveries`` and ``POST /_admin/deliveries/N/redeliver``.
"""

from __future__ import annotations

import http.client
import json
import math
import queue
import re
import secrets
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from email.utils import format_datetime
from typing import Any
from urllib.parse import urlsplit

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

# Gitlab::VisibilityLevel: PRIVATE = 0, INTERNAL = 10, PUBLIC = 20.
VISIBILITY_LEVELS = {"private": 0, "internal": 10, "public": 20}
# Ci::HasStatus::AVAILABLE_STATUSES: the values GET /runners/:id/jobs takes for ``status``.
JOB_STATUSES = ("created", "waiting_for_resource", "preparing", "waiting_for_callback",
                "pending", "running", "success", "failed", "canceled", "canceling",
                "skipped", "manual", "scheduled")  # fmt: skip
FINISHED = ("success", "failed", "canceled")
PER_PAGE, MAX_PER_PAGE = 20, 100  # GitLab's pagination defaults
GITLAB_VERSION = "17.11.0"  # what User-Agent says
HOOK_TIMEOUT_S = 10.0  # GitLab's default webhook timeout
# The user who started every job here (User#hook_attrs); GitLab redacts a private email.
HOOK_USER = {"id": 1, "name": "Administrator", "username": "root", "avatar_url": None,
             "email": "[REDACTED]"}  # fmt: skip


ADMIN = "/_admin"  # the stand-in's own calls (not GitLab's API)


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
    pipeline_id: int = 0
    sha: str = "0" * 40
    ref: str = "main"
    stage: str = "test"
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """One Job Hook event sent (or being sent) to the webhook: its request as sent — the
    token is in ``token``, not in ``headers`` — and how its last attempt went. A redelivery
    is a delivery of its own whose ``redelivery_of`` names the first, with the same
    ``event_uuid``, ``idempotency_key`` and body."""

    number: int
    job_id: int
    build_status: str
    url: str
    token: str = field(repr=False)
    headers: Mapping[str, str]
    body: Mapping[str, Any]
    redelivery_of: int | None = None
    attempts: int = 0
    response_status: int | None = None
    error: str | None = None
    delivered: bool = False
    done: bool = False

    @property
    def event_uuid(self) -> str:
        return self.headers["X-Gitlab-Event-UUID"]

    @property
    def idempotency_key(self) -> str:
        return self.headers["Idempotency-Key"]


class FakeGitLab(BackgroundServer):
    """The stand-in on a background thread; ``url`` is the instance's address (the API is under
    ``/api/v4``). A context manager."""

    def __init__(
        self,
        *,
        host: str = HOST,
        port: int = 0,
        clock: Clock | None = None,
        webhook_url: str | None = None,
        webhook_token: str | None = None,
        webhook_attempts: int = 4,
        webhook_retry_delay: float = 1.0,
    ) -> None:
        super().__init__(host, port, what="the GitLab stand-in", thread_name="gitlab")
        if webhook_attempts < 1 or webhook_retry_delay < 0:
            raise ValueError("webhook_attempts must be at least 1, webhook_retry_delay >= 0")
        self._clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._tokens: dict[str, AccessToken] = {}
        self._groups: set[int] = set()
        self._projects: dict[int, int | None] = {}  # project id → its group's
        self._visibility: dict[int, str] = {}  # project id → private | internal | public
        self._runners: dict[int, Runner] = {}
        self._jobs: dict[int, Job] = {}
        self._next_runner = 9171
        self._next_job = 4001
        self._next_pipeline = 2301
        self._throttled = 0
        self._retry_after = 60
        self._send_retry_after = True
        self._webhook_url: str | None = None
        self._webhook_token = ""
        self._webhook_uuid = ""
        self._webhook_attempts = webhook_attempts
        self._webhook_retry_delay = webhook_retry_delay
        self._deliveries: dict[int, Delivery] = {}
        self._outbox: queue.Queue[int | None] = queue.Queue()
        self._sender: threading.Thread | None = None
        if webhook_url is not None:
            self.set_webhook(webhook_url, webhook_token)

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

    def add_project(
        self, project_id: int, *, group_id: int | None = None, visibility: str = "private"
    ) -> None:
        """A project, in ``group_id`` if given (the group is added too), ``private``,
        ``internal`` or ``public``."""
        level = _visibility(visibility)
        with self._lock:
            if group_id is not None:
                self._groups.add(group_id)
            self._projects[project_id] = group_id
            self._visibility[project_id] = level

    def queue_job(
        self,
        project_id: int,
        *,
        tags: Iterable[str] = (),
        script: Iterable[str] = ("true",),
        variables: Mapping[str, str] | None = None,
        name: str = "build",
        visibility: str | None = None,
    ) -> int:
        """A pending job of ``project_id`` (added if unknown; ``visibility``, if given, is
        the project's from now on); its id. Its ``pending`` Job Hook is sent."""
        level = None if visibility is None else _visibility(visibility)
        with self._lock:
            self._projects.setdefault(project_id, None)
            if level is not None:
                self._visibility[project_id] = level
            job_id = self._next_job
            self._next_job += 1
            pipeline_id = self._next_pipeline
            self._next_pipeline += 1
            job = Job(
                id=job_id, token="glcbt-" + secrets.token_urlsafe(15), project_id=project_id,
                name=name, tags=tuple(tags), script=tuple(script),
                variables=tuple(sorted((variables or {}).items())), pipeline_id=pipeline_id,
                sha=secrets.token_hex(20), created_at=self._clock.now(),
            )  # fmt: skip
            self._jobs[job_id] = job
            self._announce(job)
            return job_id

    def cancel_job(self, job_id: int) -> Job:
        """Cancel a pending or running job (as a user cancelling it would); a finished one
        stays as it is. Its ``canceled`` Job Hook is sent."""
        with self._lock:
            job = self._jobs[job_id]
            if job.state in FINISHED:
                return job
            job = replace(job, state="canceled", finished_at=self._clock.now())
            self._jobs[job_id] = job
            self._announce(job)
            return job

    def job(self, job_id: int) -> Job:
        with self._lock:
            return self._jobs[job_id]

    def runner(self, runner_id: int) -> Runner | None:
        with self._lock:
            return self._runners.get(runner_id)

    def runners(self) -> list[Runner]:
        with self._lock:
            return sorted(self._runners.values(), key=lambda runner: runner.id)

    def set_webhook(self, url: str | None, token: str | None = None) -> None:
        """Send Job Hooks to ``url`` (``None``: send none) with ``X-Gitlab-Token: token``
        (none if not given). A new webhook gets a new ``X-Gitlab-Webhook-UUID``."""
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"webhook URL {url!r}: an http(s) address")
        with self._lock:
            self._webhook_url = url
            self._webhook_token = token or ""
            self._webhook_uuid = str(uuid.uuid4())

    def deliveries(self, job_id: int | None = None) -> list[Delivery]:
        """Every Job Hook delivery (of ``job_id`` only, if given), oldest first."""
        with self._lock:
            return [delivery for _, delivery in sorted(self._deliveries.items())
                    if job_id is None or delivery.job_id == job_id]  # fmt: skip

    def redeliver(self, number: int) -> Delivery:
        """Send delivery ``number`` again as it was (same body, event UUID and idempotency
        key, to the same URL with the same token), as a new delivery; returns it."""
        with self._lock:
            first = self._deliveries[number]
            again = replace(
                first, number=self._next_delivery(), redelivery_of=first.redelivery_of or number,
                attempts=0, response_status=None, error=None, delivered=False, done=False,
            )  # fmt: skip
            self._queue_delivery(again)
            return again

    def wait_for_deliveries(self, timeout: float = 10.0) -> bool:
        """Wait until every delivery is done (delivered, or out of attempts); whether it
        happened within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if all(delivery.done for delivery in self._deliveries.values()):
                    return True
            time.sleep(0.01)
        return False

    def stop(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None:
            self._outbox.put(None)
            sender.join(HOOK_TIMEOUT_S)
        super().stop()

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
            if request.path.startswith(ADMIN):
                status, body, headers = self._admin(request)
            else:
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

    def _admin(self, request: Request) -> tuple[int, Any, dict[str, str]]:
        """The stand-in's own HTTP side (not GitLab's API), for what runs outside this
        process (``dws up``'s users, end-to-end tests): queue a job, read jobs, runners and
        hook deliveries, redeliver one."""
        path, method = request.path[len(ADMIN) :].rstrip("/"), request.method
        body = _admin_body(request) if method == "POST" else {}
        if (method, path) == ("POST", "/jobs"):
            script = body.get("script", ["true"])
            job_id = self.queue_job(
                int(body["project_id"]), tags=[str(tag) for tag in body.get("tags", ())],
                script=[script] if isinstance(script, str) else [str(line) for line in script],
                visibility=body.get("visibility"),
            )  # fmt: skip
            return 201, _job_json(self.job(job_id)), {}
        if method == "GET" and (match := re.fullmatch(r"/jobs/(\d+)", path)):
            try:
                return 200, _job_json(self.job(int(match[1]))), {}
            except KeyError:
                raise _Refused(404, {"message": f"no job {match[1]}"}) from None
        if (method, path) == ("GET", "/runners"):
            return 200, [{"id": r.id, "description": r.description, "tags": list(r.tags),
                          "runner_type": r.runner_type} for r in self.runners()], {}  # fmt: skip
        if (method, path) == ("GET", "/deliveries"):
            return 200, [{
                "number": d.number, "job_id": d.job_id, "build_status": d.build_status,
                "response_status": d.response_status, "delivered": d.delivered,
                "redelivery_of": d.redelivery_of, "event_uuid": d.event_uuid,
            } for d in self.deliveries()], {}  # fmt: skip
        if method == "POST" and (match := re.fullmatch(r"/deliveries/(\d+)/redeliver", path)):
            return 201, {"number": self.redeliver(int(match[1])).number}, {}
        raise _Refused(404, {"message": f"{method} {request.path} is not served by this stand-in"})

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
        if method == "GET" and path.startswith("/api/v4/runners/") and parts[5:] == ["jobs"]:
            return self._runner_jobs(request, _path_id(parts[4]))
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
        if not self._may_manage(token, runner):
            raise _message(403, "No access granted")
        return runner

    @staticmethod
    def _may_manage(token: AccessToken, runner: Runner) -> bool:
        return (token.admin or runner.group_id in token.owner_of_groups
                or runner.project_id in token.owner_of_projects)  # fmt: skip

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
        job = replace(job, state="running", runner_id=runner.id, started_at=self._clock.now())
        self._jobs[job.id] = job
        self._announce(job)
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
            "job_info": {"id": job.id, "name": job.name, "stage": job.stage,
                         "project_id": job.project_id,
                         "project_name": f"project-{job.project_id}"},
            "git_info": {"repo_url": "", "ref": job.ref, "sha": job.sha, "before_sha": zero,
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
        failure_reason = params.get("failure_reason") or "unknown_failure"
        job = replace(
            job, state=str(state), finished_at=self._clock.now(),
            failure_reason=failure_reason if state == "failed" else None,
            exit_code=exit_code if isinstance(exit_code, int) else None,
        )  # fmt: skip
        self._jobs[job.id] = job
        self._announce(job)
        return 200, "200", {"Job-Status": job.state}

    # The runner's jobs.

    def _runner_jobs(self, request: Request, runner_id: int) -> tuple[int, Any, dict[str, str]]:
        """``GET /runners/:id/jobs`` (runners.rb: ``authenticate_list_runners_jobs!`` — 403
        "No access granted" without ``read_builds`` on the runner; RunnerJobsFinder lists
        only the jobs of projects the user may read)."""
        token = self._authenticate(request, READ_SCOPES)
        runner = self._runners.get(runner_id)
        if runner is None:
            raise _message(404)
        if not self._may_manage(token, runner):
            raise _message(403, "No access granted")
        args = request.args
        status = args.get("status")
        errors = []
        if status is not None and status not in JOB_STATUSES:
            errors.append("status does not have a valid value")
        order_by, sort = args.get("order_by"), args.get("sort", "desc")
        if order_by is not None and order_by != "id":
            errors.append("order_by does not have a valid value")
        if sort not in ("asc", "desc"):
            errors.append("sort does not have a valid value")
        page, per_page = _integer(args.get("page", "1")), _integer(args.get("per_page", "20"))
        if page is None or page < 1:
            errors.append("page is invalid")
        if per_page is None or per_page < 1:
            errors.append("per_page is invalid")
        if errors or page is None or per_page is None:
            raise _Refused(400, {"error": ", ".join(errors)})
        jobs = [job for _, job in sorted(self._jobs.items())
                if job.runner_id == runner_id and (status is None or job.state == status)
                and (token.admin or job.project_id in token.owner_of_projects
                     or self._projects.get(job.project_id) in token.owner_of_groups)]  # fmt: skip
        if order_by == "id" and sort == "desc":
            jobs.reverse()
        per_page = min(per_page, MAX_PER_PAGE)
        shown = jobs[(page - 1) * per_page : page * per_page]
        headers = {"X-Page": str(page), "X-Per-Page": str(per_page), "X-Total": str(len(jobs)),
                   "X-Next-Page": str(page + 1) if page * per_page < len(jobs) else ""}  # fmt: skip
        return 200, [self._job_basic(job) for job in shown], headers

    def _job_basic(self, job: Job) -> dict[str, Any]:
        """Entities::Ci::JobBasicWithProject, the fields this fake has."""
        project = self._project_attrs(job.project_id)
        return {
            "id": job.id, "status": job.state, "stage": job.stage, "name": job.name,
            "ref": job.ref, "tag": False, "coverage": None, "allow_failure": False,
            "created_at": _iso_ms(job.created_at), "started_at": _iso_ms(job.started_at),
            "finished_at": _iso_ms(job.finished_at), "duration": self._duration(job),
            "queued_duration": self._queued_duration(job),
            "failure_reason": job.failure_reason, "user": HOOK_USER,
            "pipeline": {"id": job.pipeline_id, "project_id": job.project_id, "sha": job.sha,
                         "ref": job.ref, "status": job.state},
            "project": {"id": job.project_id, "name": project["name"],
                        "description": project["description"],
                        "path_with_namespace": project["path_with_namespace"]},
        }  # fmt: skip

    def _duration(self, job: Job) -> float | None:
        if job.started_at is None:
            return None
        return ((job.finished_at or self._clock.now()) - job.started_at).total_seconds()

    def _queued_duration(self, job: Job) -> float | None:
        if job.created_at is None:
            return None
        return ((job.started_at or self._clock.now()) - job.created_at).total_seconds()

    # Job Hooks.

    def _announce(self, job: Job) -> None:
        """Queue ``job``'s Job Hook for its current status, if a webhook is set (called
        under the lock, so deliveries are queued in the order the changes happened)."""
        if self._webhook_url is None:
            return
        headers = {
            "Content-Type": "application/json", "User-Agent": f"GitLab/{GITLAB_VERSION}",
            "X-Gitlab-Event": "Job Hook", "X-Gitlab-Instance": self._instance(),
            "X-Gitlab-Webhook-UUID": self._webhook_uuid,
            "X-Gitlab-Event-UUID": str(uuid.uuid4()), "Idempotency-Key": str(uuid.uuid4()),
        }  # fmt: skip
        self._queue_delivery(Delivery(
            number=self._next_delivery(), job_id=job.id, build_status=job.state,
            url=self._webhook_url, token=self._webhook_token, headers=headers,
            body=self._job_hook(job),
        ))  # fmt: skip

    def _next_delivery(self) -> int:
        return len(self._deliveries) + 1

    def _queue_delivery(self, delivery: Delivery) -> None:
        self._deliveries[delivery.number] = delivery
        self._outbox.put(delivery.number)
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_deliveries, daemon=True,
                                            name="gitlab-webhooks")  # fmt: skip
            self._sender.start()

    def _send_deliveries(self) -> None:
        """The sender: one delivery at a time, in the order queued, each tried until it is
        answered 2xx or out of attempts."""
        while (number := self._outbox.get()) is not None:
            for attempt in range(1, self._webhook_attempts + 1):
                with self._lock:
                    delivery = self._deliveries[number]
                status, error = _post(delivery)
                delivered = status is not None and 200 <= status < 300
                with self._lock:
                    self._deliveries[number] = replace(
                        delivery, attempts=attempt, response_status=status, error=error,
                        delivered=delivered,
                        done=delivered or attempt == self._webhook_attempts,
                    )  # fmt: skip
                if delivered:
                    break
                if attempt < self._webhook_attempts:
                    time.sleep(self._webhook_retry_delay)

    def _instance(self) -> str:
        """``X-Gitlab-Instance``: this instance's address (a placeholder when not serving)."""
        try:
            return self.url
        except Exception:  # not serving
            return "http://gitlab.invalid"

    def _project_attrs(self, project_id: int) -> dict[str, Any]:
        """Project#hook_attrs(backward: false), for the names this fake gives projects."""
        group_id = self._projects.get(project_id)
        namespace = f"group-{group_id}" if group_id is not None else "root"
        name = f"project-{project_id}"
        path = f"{namespace}/{name}"
        base = self._instance()
        host = urlsplit(base).hostname or "gitlab.invalid"
        web_url, ssh_url = f"{base}/{path}", f"git@{host}:{path}.git"
        return {
            "id": project_id, "name": name, "description": "", "web_url": web_url,
            "avatar_url": None, "git_ssh_url": ssh_url, "git_http_url": f"{web_url}.git",
            "namespace": namespace,
            "visibility_level": VISIBILITY_LEVELS[self._visibility.get(project_id, "private")],
            "path_with_namespace": path, "default_branch": "main", "ci_config_path": None,
            "homepage": web_url, "url": ssh_url, "ssh_url": ssh_url,
            "http_url": f"{web_url}.git",
        }  # fmt: skip

    def _job_hook(self, job: Job) -> dict[str, Any]:
        """The Job Hook body (Gitlab::DataBuilder::Build; the documented example's fields,
        and the job's ``tags``)."""
        project = self._project_attrs(job.project_id)
        runner = self._runners.get(job.runner_id) if job.runner_id is not None else None
        return {
            "object_kind": "build", "ref": job.ref, "tag": False, "before_sha": "0" * 40,
            "sha": job.sha, "retries_count": 0, "build_id": job.id, "build_name": job.name,
            "build_stage": job.stage, "build_status": job.state,
            "build_created_at": _iso_ms(job.created_at),
            "build_created_at_iso": _iso(job.created_at),
            "build_started_at": _iso_ms(job.started_at),
            "build_started_at_iso": _iso(job.started_at),
            "build_finished_at": _iso_ms(job.finished_at),
            "build_finished_at_iso": _iso(job.finished_at),
            "build_duration": self._duration(job),
            "build_queued_duration": self._queued_duration(job),
            "build_allow_failure": False, "build_failure_reason": job.failure_reason,
            "pipeline_id": job.pipeline_id,
            "runner": None if runner is None else {
                "id": runner.id, "description": runner.description,
                "runner_type": runner.runner_type, "active": not runner.paused,
                "is_shared": runner.runner_type == "instance_type", "tags": list(runner.tags),
            },
            "project_id": job.project_id, "project_name": project["path_with_namespace"],
            "user": HOOK_USER,
            "commit": {
                "id": job.pipeline_id, "name": None, "sha": job.sha, "message": "CI\n",
                "author_name": HOOK_USER["name"], "author_email": "admin@example.com",
                "author_url": "mailto:admin@example.com", "status": job.state,
                "duration": self._duration(job) if job.state in FINISHED else None,
                "started_at": _iso_ms(job.started_at), "started_at_iso": _iso(job.started_at),
                "finished_at": _iso_ms(job.finished_at),
                "finished_at_iso": _iso(job.finished_at),
            },
            "repository": {
                "name": project["name"], "url": project["url"],
                "description": project["description"], "homepage": project["homepage"],
                "git_http_url": project["git_http_url"], "git_ssh_url": project["git_ssh_url"],
                "visibility_level": project["visibility_level"],
            },
            "project": project,
            "environment": None,
            # The job's own tags, pending or not (GitLab 16.8, gitlab-org/gitlab!140760:
            # "Include job tags in build webhook event payload").
            "tags": list(job.tags),
        }  # fmt: skip


def _admin_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(request.get_data() or b"{}")
    except ValueError:
        raise _Refused(400, {"message": "the body is not JSON"}) from None
    if not isinstance(body, dict):
        raise _Refused(400, {"message": "the body is not a JSON object"})
    return body


def _job_json(job: Job) -> dict[str, Any]:
    return {"id": job.id, "project_id": job.project_id, "tags": list(job.tags),
            "state": job.state, "runner_id": job.runner_id,
            "failure_reason": job.failure_reason, "exit_code": job.exit_code}  # fmt: skip


def _visibility(name: str) -> str:
    if name not in VISIBILITY_LEVELS:
        raise ValueError(f"visibility {name!r}: one of {', '.join(VISIBILITY_LEVELS)}")
    return name


def _iso_ms(moment: datetime | None) -> str | None:
    """A time as the documented Job Hook shows it: ``2021-02-23T02:41:37.886Z``."""
    if moment is None:
        return None
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _iso(moment: datetime | None) -> str | None:
    """The ``…_iso`` form: ``2021-02-23T02:41:37Z``."""
    return None if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _post(delivery: Delivery) -> tuple[int | None, str | None]:
    """One attempt at ``delivery``: (the answer's status, or None and what went wrong). Sent
    with http.client, which keeps the headers' case as GitLab writes them."""
    headers = dict(delivery.headers)
    if delivery.token:
        headers["X-Gitlab-Token"] = delivery.token
    target = urlsplit(delivery.url)
    kind = http.client.HTTPSConnection if target.scheme == "https" else http.client.HTTPConnection
    connection = kind(target.netloc, timeout=HOOK_TIMEOUT_S)
    path = (target.path or "/") + (f"?{target.query}" if target.query else "")
    try:
        connection.request("POST", path, body=json.dumps(delivery.body).encode(), headers=headers)
        reply = connection.getresponse()
        reply.read()
    except (OSError, http.client.HTTPException) as error:
        return None, f"no answer ({error})"
    finally:
        connection.close()
    return reply.status, None if 200 <= reply.status < 300 else f"answered {reply.status}"


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


__all__ = ["AccessToken", "Delivery", "FakeGitLab", "Job", "Runner"]
