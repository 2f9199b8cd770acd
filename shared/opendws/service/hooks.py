"""CI systems ask for capacity: webhooks of GitHub (``workflow_job``), GitLab (job events) and a
generic signed JSON hook become request messages on ``capacity-requests``.

- A job that is queued (GitHub ``queued``; GitLab ``pending``; generic ``queued``) whose labels
  include those of a configured CI mapping is submitted from the mapping's template; a job
  that finished (GitHub ``completed``; GitLab ``success``/``failed``/``canceled``; generic
  ``completed``) is released — or, when its queued event has not arrived yet (webhooks come
  out of order), recorded as already ended, so that the late queued event starts nothing.
- The request id comes from the job (``gh-…``, ``gl-…``, ``hook-…``), so a redelivered hook —
  the same delivery twice — publishes the same request, which intake stores once.
- Every call is authenticated before anything is read: GitHub's ``X-Hub-Signature-256``
  (HMAC-SHA256 of the body), GitLab's ``X-Gitlab-Token``, the generic hook's
  ``X-Opendws-Signature`` (HMAC-SHA256), each compared in constant time. A bad or missing one
  is 401 and changes nothing; a provider with no secret configured is 503.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opendws.ports import CiMapping, ConfigStore, RequestPublisher

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
GITLAB_DONE = frozenset({"success", "failed", "canceled", "cancelled", "skipped"})


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
    queued: bool  # True: it waits for a runner; False: it finished


class HookService:
    """Turns CI webhooks into submit and release messages (see the module docstring)."""

    def __init__(
        self, config: ConfigStore, publisher: RequestPublisher, secrets: HookSecrets
    ) -> None:
        self._config = config
        self._publisher = publisher
        self._secrets = secrets

    def handle(self, headers: Mapping[str, str], body: bytes) -> HookResult:
        """Authenticate, decode and act on one webhook call."""
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
        job, repository = payload.get("workflow_job") or {}, payload.get("repository") or {}
        action = payload.get("action")
        if action not in ("queued", "completed") or "id" not in job:
            return HookResult(202, f"workflow_job {action!r}: nothing to do")
        return self._act(
            _Job(
                provider="github",
                job_id=f"gh-{repository.get('full_name', 'repo')}-{job['id']}",
                labels=frozenset(str(label) for label in job.get("labels") or ()),
                queued=action == "queued",
            )
        )

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
        if status != "pending" and status not in GITLAB_DONE:
            return HookResult(202, f"job {status!r}: nothing to do")
        # The job's own tags (GitLab 16.8+), else the tags of the runner it was given.
        tags = payload.get("tags") or (payload.get("runner") or {}).get("tags") or ()
        return self._act(
            _Job(
                provider="gitlab",
                job_id=f"gl-{payload.get('project_id', 'project')}-{payload['build_id']}",
                labels=frozenset(str(tag) for tag in tags),
                queued=status == "pending",
            )
        )

    def _generic(self, headers: Mapping[str, str], body: bytes) -> HookResult:
        secret = self._secrets.generic
        if secret is None:
            return HookResult(503, "no hook secret is configured")
        if not _signed(secret, body, headers.get("x-opendws-signature")):
            return HookResult(401, "X-Opendws-Signature is missing or does not match the body")
        payload = _json(body)
        if isinstance(payload, HookResult):
            return payload
        event, job_id = payload.get("event"), payload.get("job_id")
        if event not in ("queued", "completed") or not job_id:
            return HookResult(400, "give event (queued or completed) and job_id")
        return self._act(
            _Job(
                provider="generic",
                job_id=f"hook-{job_id}",
                labels=frozenset(str(label) for label in payload.get("labels") or ()),
                queued=event == "queued",
            )
        )

    # Acting -----------------------------------------------------------------------------

    def _act(self, job: _Job) -> HookResult:
        mapping = self._mapping(job)
        if mapping is None:
            return HookResult(202, f"no CI mapping matches labels {sorted(job.labels)}")
        request_id = _request_id(job.job_id)
        tenant = str(mapping.template.get("tenant", ""))
        if job.queued:
            self._publisher.publish(self._submission(mapping, job, request_id))
            return HookResult(202, f"capacity requested as {request_id}", request_id)
        # Webhooks come out of order (GitHub and GitLab both say so): a job may finish before
        # its queued event arrives. The release then records the request already ended, so
        # that the late queued event submits a duplicate that starts nothing.
        submission = self._submission(mapping, job, request_id)
        self._publisher.publish({"schema": "opendws.request/v1", "action": "release",
                                 "request_id": request_id, "tenant": tenant,
                                 "if_absent": submission})  # fmt: skip
        return HookResult(202, f"release of {request_id} requested", request_id)

    def _submission(self, mapping: CiMapping, job: _Job, request_id: str) -> dict[str, object]:
        """The submission a queued event of ``job`` publishes (the mapping's template)."""
        labels = {**(mapping.template.get("labels") or {}), "ci": job.provider}
        return {
            "schema": "opendws.request/v1", "action": "submit", **mapping.template,
            "request_id": request_id, "labels": labels,
        }  # fmt: skip

    def _mapping(self, job: _Job) -> CiMapping | None:
        for mapping in self._config.load().ci:
            if mapping.provider == job.provider and mapping.labels <= job.labels:
                return mapping
        return None


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
