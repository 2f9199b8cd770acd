"""CI systems ask for capacity: webhooks of GitHub (``workflow_job``), GitLab (job events) and a
generic signed JSON hook become request messages on ``capacity-requests``.

- A job that is queued (GitHub ``queued``; GitLab ``pending``; generic ``queued``) whose labels
  include those of a configured CI mapping is submitted from the mapping's template; a job
  that finished (GitHub ``completed``; GitLab ``success``/``failed``/``canceled``; generic
  ``completed``) is released — or, when its queued event has not arrived yet (webhooks come
  out of order), recorded as already ended, so that the late queued event starts nothing.
- The request id comes from the job (``gh-…``, ``gl-…``, ``hook-…``), so a redelivered hook —
  the same delivery twice — publishes the same request, which intake stores once.
- A mapping with a runner (``github``/``gitlab``) makes the job's VM run it: the submission's
  ``run`` is a CI runner's (the job's labels and repository or project), and a finished job
  releases its request only if it is not running yet — a one-job runner takes any queued job
  its labels match, so the VM a job asked for may be running another job, and its runner's
  exit ends it. The runner taking a job (GitHub ``in_progress``, GitLab ``running``) and the
  job's end are sent on as ``ci_job`` messages naming the runner (GitHub ``runner_name``,
  GitLab ``runner.description``: the VM's name), so that the request whose VM ran a job
  records it. A finished job's own request is released only if it is not running and no
  running request's runner ran the job: a job another VM's runner took leaves its own VM to
  serve that VM's job. Such a mapping refuses jobs of public repositories and projects unless it
  allows them (a self-hosted runner there runs strangers' code), and jobs of repositories its
  GitHub App's runners do not serve.
- Every call is authenticated before anything is read: GitHub's ``X-Hub-Signature-256``
  (HMAC-SHA256 of the body), GitLab's ``X-Gitlab-Token``, the generic hook's
  ``X-Opendws-Signature`` (HMAC-SHA256), each compared in constant time. A bad or missing one
  is 401 and changes nothing; a provider with no secret configured is 503.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opendws.ports import CiMapping, ConfigStore, RequestPublisher
from opendws.ports.configuration import ci_mapping

log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
PUBLIC_LEVEL = 20  # GitLab's visibility_level of a public project
GITLAB_DONE = frozenset({"success", "failed", "canceled", "cancelled", "skipped"})
# A job event is a few kilobytes (GitHub caps any webhook payload at 25 MB and a workflow_job
# one is ~10 KB): a body larger than this is refused before it is read as JSON or checked.
MAX_BODY = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class HookSecrets:
    """The shared secrets each provider signs with (None: that provider is not set up)."""

    github: str | None = None
    gitlab: str | None = None
    generic: str | None = None


@dataclass(frozen=True, slots=True)
class HookResult:
    """The HTTP answer: status, one line, and the request concerned."""

    status: int
    message: str
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class _Job:
    """A CI job as every provider describes it."""

    provider: str
    job_id: str  # unique per provider (repository or project included)
    labels: frozenset[str]
    queued: bool  # True: it waits for a runner; False: it runs or finished
    source: str = ""  # GitHub owner/name, GitLab the project id
    public: bool = False  # its repository or project is public
    running: bool = False  # a runner took it (it has not finished)
    runner_name: str | None = None  # the runner that took it, once one did
    conclusion: str | None = None  # how it finished (GitHub conclusion, GitLab status)


class HookService:
    """Turns CI webhooks into submit and release messages (see the module docstring)."""

    def __init__(
        self, config: ConfigStore, publisher: RequestPublisher, secrets: HookSecrets
    ) -> None:
        self._config = config
        self._publisher = publisher
        self._secrets = secrets

    def handle(self, headers: Mapping[str, str], body: bytes) -> HookResult:
        """Authenticate, decode and act on one webhook call (413 for a body over
        :data:`MAX_BODY`, before anything else)."""
        if len(body) > MAX_BODY:
            return too_large(len(body))
        lowered = {key.lower(): value for key, value in headers.items()}
        if "x-github-event" in lowered:
            return self._github(lowered, body)
        if "x-gitlab-event" in lowered:
            return self._gitlab(lowered, body)
        return self._generic(lowered, body)

    # Providers --------------------------------------------------------------------------

    def _github(self, headers: Mapping[str, str], body: bytes) -> HookResult:
        secret = self._secrets.github
        if secret is None:
            return HookResult(503, "no GitHub webhook secret is configured")
        if not _signed(secret, body, headers.get("x-hub-signature-256")):
            return HookResult(401, "X-Hub-Signature-256 is missing or does not match the body")
        event = headers["x-github-event"]
        if event == "ping":
            return HookResult(200, "pong")
        if event != "workflow_job":
            return HookResult(202, f"{event} events are not used; send workflow_job")
        payload = _json(body)
        if isinstance(payload, HookResult):
            return payload
        action = payload.get("action")
        if action not in ("queued", "in_progress", "completed"):
            return HookResult(202, f"workflow_job {action!r}: nothing to do")
        try:
            job = _object(payload, "workflow_job")
            repository = _object(payload, "repository", required=False)
            job_id = _identifier(job, "id", "workflow_job.id")
            labels = _labels(job.get("labels"), "workflow_job.labels")
            name = repository.get("full_name", "repo")
            if not isinstance(name, str):
                raise _Malformed("repository.full_name", "must be a string")
            # "private": false, or "visibility": "public" (webhook payload's repository)
            public = repository.get("private") is False or repository.get("visibility") == "public"
            runner_name = _text(job, "runner_name", "workflow_job.runner_name")
            conclusion = _text(job, "conclusion", "workflow_job.conclusion")
        except _Malformed as error:
            return error.result()
        return self._act(
            _Job(
                provider="github", job_id=f"gh-{name}-{job_id}", labels=labels,
                queued=action == "queued", source=name, public=public,
                running=action == "in_progress", runner_name=runner_name, conclusion=conclusion,
            )
        )  # fmt: skip

    def _gitlab(self, headers: Mapping[str, str], body: bytes) -> HookResult:
        secret = self._secrets.gitlab
        if secret is None:
            return HookResult(503, "no GitLab webhook token is configured")
        token = headers.get("x-gitlab-token", "")
        if not hmac.compare_digest(token.encode(), secret.encode()):
            return HookResult(401, "X-Gitlab-Token is missing or wrong")
        payload = _json(body)
        if isinstance(payload, HookResult):
            return payload
        if payload.get("object_kind") != "build" or "build_id" not in payload:
            return HookResult(202, "only job events (Job Hook) are used")
        status = payload.get("build_status")
        if status not in ("pending", "running") and status not in GITLAB_DONE:
            return HookResult(202, f"job {status!r}: nothing to do")
        try:
            build_id = _identifier(payload, "build_id", "build_id")
            project = payload.get("project_id", "project")
            if isinstance(project, bool) or not isinstance(project, (int, str)):
                raise _Malformed("project_id", "must be a number or a string")
            runner = _object(payload, "runner", required=False)
            # The job's own tags (GitLab 16.8+), else the tags of the runner it was given.
            tags = _labels(payload.get("tags"), "tags") or _labels(
                runner.get("tags"), "runner.tags"
            )
            # visibility_level 20 is public (Gitlab::VisibilityLevel), in the Job Hook's
            # project (and its repository)
            levels = {
                _object(payload, key, required=False).get("visibility_level")
                for key in ("project", "repository")
            }
            runner_name = _text(runner, "description", "runner.description")
        except _Malformed as error:
            return error.result()
        return self._act(
            _Job(
                provider="gitlab", job_id=f"gl-{project}-{build_id}", labels=tags,
                queued=status == "pending", source=str(project), public=PUBLIC_LEVEL in levels,
                running=status == "running", runner_name=runner_name,
                conclusion=status if status in GITLAB_DONE else None,
            )
        )  # fmt: skip

    def _generic(self, headers: Mapping[str, str], body: bytes) -> HookResult:
        secret = self._secrets.generic
        if secret is None:
            return HookResult(503, "no hook secret is configured")
        if not _signed(secret, body, headers.get("x-opendws-signature")):
            return HookResult(401, "X-Opendws-Signature is missing or does not match the body")
        payload = _json(body)
        if isinstance(payload, HookResult):
            return payload
        event = payload.get("event")
        if event not in ("queued", "completed"):
            return HookResult(400, "event: must be 'queued' or 'completed'")
        try:
            job_id = _identifier(payload, "job_id", "job_id")
            labels = _labels(payload.get("labels"), "labels")
        except _Malformed as error:
            return error.result()
        return self._act(
            _Job(
                provider="generic", job_id=f"hook-{job_id}", labels=labels, queued=event == "queued"
            )
        )

    # Acting -----------------------------------------------------------------------------

    def _act(self, job: _Job) -> HookResult:
        mapping = self._mapping(job)
        if mapping is None:
            return HookResult(202, f"no CI mapping matches labels {sorted(job.labels)}")
        request_id = _request_id(job.job_id)
        tenant = mapping.tenant
        if job.queued:
            refused = _runner_refusal(mapping, job)
            if refused is not None:
                log.warning("%s: %s", request_id, refused)
                return HookResult(202, refused, request_id)
            self._publisher.publish(self._submission(mapping, job, request_id))
            return HookResult(202, f"capacity requested as {request_id}", request_id)
        if job.running:
            if not (mapping.runs_jobs and job.runner_name):
                return HookResult(202, f"{request_id} runs: nothing to do", request_id)
            self._publisher.publish(self._ci_job(job, request_id, tenant, "in_progress"))
            return HookResult(202, f"{request_id} runs on {job.runner_name}", request_id)
        # Webhooks come in no promised order: a job's finished event may come before its
        # queued one. The release then records the request already ended, so
        # that the late queued event submits a duplicate that starts nothing.
        submission = self._submission(mapping, job, request_id)
        release: dict[str, object] = {
            "schema": "opendws.request/v1", "action": "release", "request_id": request_id,
            "tenant": tenant, "if_absent": submission,
        }  # fmt: skip
        if mapping.runs_jobs:
            release.update(unless_running=True, ran_on=job.runner_name)
        self._publisher.publish(release)
        if mapping.runs_jobs and job.runner_name:
            self._publisher.publish(self._ci_job(job, request_id, tenant, "completed"))
        return HookResult(202, f"release of {request_id} requested", request_id)

    def _submission(self, mapping: CiMapping, job: _Job, request_id: str) -> dict[str, object]:
        """The submission a queued event of ``job`` publishes (the mapping's template)."""
        labels = {**(mapping.template.get("labels") or {}), "ci": job.provider}
        submission: dict[str, object] = {
            "schema": "opendws.request/v1", "action": "submit", **mapping.template,
            "request_id": request_id, "labels": labels,
        }  # fmt: skip
        if mapping.runs_jobs:
            runner = {"provider": job.provider, "labels": sorted(job.labels), "source": job.source}
            submission["run"] = {"runner": runner}
        return submission

    def _ci_job(self, job: _Job, request_id: str, tenant: str, status: str) -> dict[str, object]:
        """The ``ci_job`` message saying a runner took or finished ``job``."""
        return {
            "schema": "opendws.request/v1", "action": "ci_job", "request_id": request_id,
            "tenant": tenant, "status": status, "runner_name": job.runner_name,
            "conclusion": job.conclusion,
        }  # fmt: skip

    def _mapping(self, job: _Job) -> CiMapping | None:
        return ci_mapping(self._config.load().ci, job.provider, job.labels)


def _runner_refusal(mapping: CiMapping, job: _Job) -> str | None:
    """Why a runner mapping gives ``job`` no VM (None: it does)."""
    if mapping.github is not None:
        if job.public and not mapping.github.allow_public_repositories:
            return (
                f"{job.source} is a public repository: its jobs get no self-hosted runner "
                "(strangers' pull requests would run on it) unless the CI mapping's github "
                "block says allow_public_repositories: true"
            )
        if not mapping.github.reaches(job.source):
            scope = mapping.github.repository or mapping.github.organization
            return f"{job.source} is outside the CI mapping's GitHub runners' scope ({scope})"
    if mapping.gitlab is not None and job.public and not mapping.gitlab.allow_public_projects:
        return (
            f"project {job.source} is public: its jobs get no runner (strangers' merge "
            "requests would run on it) unless the CI mapping's gitlab block says "
            "allow_public_projects: true"
        )
    return None


def too_large(size: int | None) -> HookResult:
    """413 for a body over :data:`MAX_BODY` (``size`` None: announced, not read)."""
    got = "" if size is None else f" ({size:,} bytes)"
    return HookResult(413, f"the body is larger than {MAX_BODY:,} bytes{got}")


class _Malformed(ValueError):
    """A field of an authenticated payload that is not what its provider sends: 400 naming
    it."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field

    def result(self) -> HookResult:
        return HookResult(400, str(self))


def _object(payload: dict[str, Any], key: str, *, required: bool = True) -> dict[str, Any]:
    value = payload.get(key)
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise _Malformed(key, "must be an object")
    return value


def _identifier(payload: dict[str, Any], key: str, field: str) -> str:
    """A job's id: a whole number or a non-empty string."""
    value = payload.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
        raise _Malformed(field, "must be a number or a non-empty string")
    return str(value)


def _text(payload: dict[str, Any], key: str, field: str) -> str | None:
    """An optional string field (null or absent: None)."""
    value = payload.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _Malformed(field, "must be a string or null")
    return value or None


def _labels(value: object, field: str) -> frozenset[str]:
    """A list of label strings (absent: none)."""
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _Malformed(field, "must be a list of strings")
    return frozenset(value)


def _signed(secret: str, body: bytes, header: str | None) -> bool:
    """``sha256=<hex HMAC-SHA256 of body>``, compared in constant time."""
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), (header or "").encode())


def _json(body: bytes) -> dict[str, Any] | HookResult:
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return HookResult(400, "the body is not JSON")
    if not isinstance(payload, dict):
        return HookResult(400, "the body is not a JSON object")
    return payload


def _request_id(job_id: str) -> str:
    """A valid request id (letters, digits, . _ -; at most 128) that stays unique per job."""
    safe = _UNSAFE.sub("-", job_id).strip("-.")
    if len(safe) <= 128:
        return safe
    digest = hashlib.sha256(job_id.encode()).hexdigest()[:16]
    return f"{safe[:111]}-{digest}"
