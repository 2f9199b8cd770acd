"""A fake GitHub REST API for a GitHub App and its just-in-time self-hosted runners, enough for
:class:`opendws.adapters.github_app.GitHubApp` and a stand-in runner program to work locally as
they would on github.com.

Its routes and request bodies come from GitHub's published OpenAPI description, the part
vendored in ``emulators/data/github-openapi-subset.json`` (``@octokit/openapi`` 23.0.2, whose
``x-vendored`` field names the package, version and tarball): a request is routed by the
description's path templates, its integer path parameters checked, and its JSON body checked
against the operation's request schema (required keys, types, ``minItems``/``maxItems``,
``enum``) before anything else happens.

Served, as GitHub answers (JSON; errors ``{"message", "documentation_url", "status"}``, the
status as a string):

- ``POST /app/installations/{installation_id}/access_tokens`` with the App's JWT → 201
  ``{token, expires_at, permissions, repository_selection}``; the token is good for 1 hour
  (docs.github.com/en/rest/apps/apps#create-an-installation-access-token-for-an-app). The JWT
  is checked as GitHub documents it
  (docs.github.com/en/apps/creating-github-apps/authenticating-with-a-github-app/generating-a-json-web-token-jwt-for-a-github-app
  ):
  RS256 signed by the key of the App its ``iss`` names, else 401 "A JSON web token could not
  be decoded"; ``iat`` not in the future; ``exp`` in the future and no more than 10 minutes
  ahead ("'Expiration time' claim ('exp') is too far in the future"). An installation of
  another App, or none, is 404.
- ``POST /orgs/{org}/actions/runners/generate-jitconfig`` and
  ``/repos/{owner}/{repo}/actions/runners/generate-jitconfig`` with an installation token →
  201 ``{runner, encoded_jit_config}``
  (docs.github.com/en/rest/actions/self-hosted-runners#create-configuration-for-a-just-in-time-runner-for-an-organization):
  the config shaped as GitHub's (:func:`encoded_jit_config`: the runner's ``.runner``,
  ``.credentials`` and ``.credentials_rsaparams`` files, ``.runner``'s ``serverUrl`` this
  fake's address as the caller reached it), the runner ``offline``, not busy, its labels as
  given (``self-hosted`` and OS/architecture names ``read-only``, the rest ``custom``); a
  body the description refuses → 422 "Invalid request." and what is wrong; an unknown
  runner group → 404; a name already taken in that scope → 409 "Already exists - A runner
  with the name NAME already exists.".
- ``GET`` and ``DELETE /orgs/{org}/actions/runners/{runner_id}`` (and the repository's) → 200
  the runner, 204; an unknown runner 404; deleting a runner that is running a job 422.
- Credentials: a token this fake did not issue, or one past its hour, → 401 "Bad
  credentials"; a scope outside the installation's account (or its selected repositories) →
  404 "Not Found"; an installation without ``organization_self_hosted_runners`` (organization
  runners) or ``administration`` (repository runners) → 403 "Resource not accessible by
  integration".

Webhooks: given a URL (and a secret), the fake sends the App's ``workflow_job`` webhook as
GitHub does (docs.github.com/en/webhooks/webhook-events-and-payloads#workflow_job) when a job
is queued, when a runner takes it (``in_progress``, with ``runner_id``, ``runner_name``,
``runner_group_id``) and when it completes (with its ``conclusion``): ``POST`` with
``X-GitHub-Event: workflow_job``, ``X-GitHub-Delivery`` (a GUID), ``X-GitHub-Hook-ID``,
``X-GitHub-Hook-Installation-Target-Type``/``-ID``, ``User-Agent: GitHub-Hookshot/…``,
``Content-Type: application/json`` and, with a secret, ``X-Hub-Signature-256`` (and the
legacy SHA-1 ``X-Hub-Signature``). Each body is checked against the schema of
``@octokit/openapi-webhooks`` 12.1.0 vendored in
``emulators/data/github-webhooks-workflow-job.json`` before it is sent. Deliveries leave one
at a time, in order, from a background thread (:class:`Webhooks`); a failed one is recorded,
not retried (as GitHub), unless ``webhook_attempts`` asks for more.

The admin side (``/_admin/…``, and the same as methods of :class:`GitHubState`):

- ``POST /_admin/apps`` ``{id, public_key, installations}``: register an App (id, public key
  PEM, installations with their account, selected repositories, permissions and runner
  groups).
- ``POST /_admin/jobs`` ``{repository, labels, script?, private?}`` → 201 the job: queue a
  workflow job (``script``: its steps as one shell script, run by the stand-in runner;
  ``private``: whether the repository is, default true); ``GET /_admin/jobs``.
- ``GET /_admin/runners``; ``GET /_admin/runners/{id}`` → 200 the runner, 404 once deleted.
- ``POST /_admin/runner/take`` ``{jit_config}`` → ``{runner, job}``: the runner started with
  that JIT config (usable once: again → 409; deleted or unknown → 404) comes online and takes
  the first queued job its scope reaches whose labels it all has, if any.
- ``POST /_admin/runner/poll`` ``{jit_config}`` → ``{runner, job}``: the online runner asks
  again (its job, or the next queued one it can run); 404 once deleted.
- ``POST /_admin/jobs/{id}/complete`` ``{conclusion}``: ``success``, ``failure`` or
  ``cancelled``; the JIT runner is then removed, as GitHub removes a JIT runner after its
  one job.
- ``POST /_admin/webhook`` ``{url, secret}``: where the App's webhook goes (null: nowhere).
- ``GET /_admin/deliveries``: each delivery ``{id, guid, action, job_id, status
  ("pending", "OK", "Invalid HTTP Response: N", ...), status_code, redelivery,
  delivered_at, attempts, ...}``; ``POST /_admin/deliveries/{id}/attempts`` → 202: send it
  again (same ``X-GitHub-Delivery``, a new delivery marked ``redelivery``), as GitHub's
  "Redeliver a delivery for an App webhook" does.
- ``POST /_admin/installations/{id}/revoke``; ``POST /_admin/faults`` ``{status, message,
  headers?, times?}``: make the next API answers fail (a rate limit with its headers, a 5xx).

The wording of the 422 messages for item counts and of a busy runner's refusal is this fake's;
GitHub publishes the status, not the words. Not emulated: GitHub Enterprise Server's
``/api/v3`` prefix (point the client at this server's root), primary rate-limit accounting
(faults are injected instead), other webhook events, the webhook REST API, pagination,
listing runners, runner groups' APIs, the runner's own protocol (the stand-in runner uses the
admin side).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import itertools
import json
import re
import secrets
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from werkzeug.wrappers import Request, Response

from emulators.official import HOST
from emulators.serving import BackgroundServer

DESCRIPTION = Path(__file__).parent / "data" / "github-openapi-subset.json"
TOKEN_LIFETIME = timedelta(hours=1)  # "The installation access token will expire after 1 hour"
JWT_MAX_AHEAD = timedelta(minutes=10)  # exp "no more than 10 minutes into the future"
REST_DOCS = "https://docs.github.com/rest"
IAT_REFUSED = (
    "'Issued at' claim ('iat') must be an Integer representing the time that the assertion "
    "was issued"
)
EXP_REFUSED = (
    "'Expiration time' claim ('exp') must be a numeric value representing the future time at "
    "which the assertion expires"
)
ADMIN = "/_admin"
# Labels GitHub applies itself (read-only); the others a runner is given are custom.
READ_ONLY_LABELS = frozenset({"self-hosted", "linux", "windows", "macos", "x64", "arm", "arm64"})
ORG_PERMISSION = "organization_self_hosted_runners"
REPO_PERMISSION = "administration"
DEFAULT_GROUP = 1  # every organization's "Default" runner group; repository runners' group


def app_key_pair() -> tuple[str, str]:
    """A new GitHub App key pair as GitHub hands one out: the private key (PEM, what the App's
    owner keeps; PKCS#8) and the public key (PEM) this fake checks the App's JWTs with."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()  # fmt: skip
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


class GitHubRefusal(Exception):
    """An answer other than success: ``status``, GitHub's ``message``."""

    def __init__(self, status: int, message: str, documentation_url: str = REST_DOCS) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.documentation_url = documentation_url


# The description, its routes and a validator for its schemas.


@cache
def description() -> dict[str, Any]:
    """The vendored part of GitHub's OpenAPI description."""
    loaded: dict[str, Any] = json.loads(DESCRIPTION.read_text())
    return loaded


@dataclass(frozen=True)
class Operation:
    method: str
    template: str
    pattern: re.Pattern[str]
    spec: Mapping[str, Any]

    @property
    def id(self) -> str:
        return str(self.spec["operationId"])

    @property
    def documentation_url(self) -> str:
        return str(self.spec.get("externalDocs", {}).get("url", REST_DOCS))


@cache
def operations() -> tuple[Operation, ...]:
    found = []
    for template, methods in description()["paths"].items():
        regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template)
        for method, spec in methods.items():
            if method != "parameters":
                found.append(Operation(method.upper(), template, re.compile(regex), spec))
    return tuple(found)


def request_schema(operation_id: str) -> dict[str, Any]:
    """The JSON schema of an operation's request body."""
    for operation in operations():
        if operation.id == operation_id:
            body: dict[str, Any] = operation.spec["requestBody"]["content"]["application/json"]
            schema: dict[str, Any] = body["schema"]
            return schema
    raise KeyError(operation_id)


def response_schema(operation_id: str, status: int) -> dict[str, Any]:
    """The JSON schema of an operation's answer with ``status``."""
    for operation in operations():
        if operation.id == operation_id:
            content = operation.spec["responses"][str(status)]["content"]["application/json"]
            schema: dict[str, Any] = content["schema"]
            return schema
    raise KeyError(operation_id)


_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
_ARTICLES = {"object": "an object", "array": "an array", "integer": "an integer", "null": "nil"}


def _shown(value: Any) -> str:
    """A value as GitHub's messages show it (``nil`` for null)."""
    return "nil" if value is None else json.dumps(value, separators=(",", ":"))


def _kinds(schema: Mapping[str, Any]) -> list[str] | None:
    """The types a schema allows (OpenAPI 3.1 may list several), or None if any."""
    kind = schema.get("type")
    return None if kind is None else [kind] if isinstance(kind, str) else list(kind)


def _article(kinds: Sequence[str]) -> str:
    return " or ".join(_ARTICLES.get(kind, "a " + kind) for kind in kinds)


def _combined(schema: Mapping[str, Any], value: Any, where: str) -> list[str]:
    """What ``value`` breaks of the schema's ``allOf`` (each), ``oneOf`` and ``anyOf`` (one
    of them, at least)."""
    errors = [error for part in schema.get("allOf", ()) for error in validate(part, value, where)]
    for keyword in ("oneOf", "anyOf"):
        options = schema.get(keyword)
        if options and all(validate(option, value, where) for option in options):
            errors.append(f"For '{where or 'items'}', {_shown(value)} is not one of the allowed "
                          "types.")  # fmt: skip
    return errors


def validate(schema: Mapping[str, Any], value: Any, where: str = "") -> list[str]:
    """What ``value`` breaks of ``schema`` (the subset of OpenAPI 3.0 and 3.1 schemas the
    vendored descriptions use: type (one or a list), nullable, required, properties, items,
    minItems, maxItems, enum, allOf, oneOf, anyOf; ``$ref`` resolved beforehand), worded as
    GitHub words it: ``"name" wasn't supplied.``, ``For 'properties/labels', 5 is not an
    array.``; empty if nothing."""
    at = f"For '{where or 'items'}', "
    errors = _combined(schema, value, where)
    kinds = _kinds(schema)
    if value is None:
        if kinds is not None and "null" not in kinds and not schema.get("nullable"):
            errors.append(f"{at}nil is not {_article(kinds)}.")
        elif kinds is not None and "null" in kinds and None not in schema.get("enum", [None]):
            errors.append(f"{at}nil is not a member of {_shown(schema['enum'])}.")
        return errors
    if kinds is not None and not any(_TYPES[kind](value) for kind in kinds):
        return [*errors, f"{at}{_shown(value)} is not {_article(kinds)}."]
    if "enum" in schema and value not in schema["enum"]:
        return [*errors, f"{at}{_shown(value)} is not a member of {_shown(schema['enum'])}."]
    if isinstance(value, dict):
        missing = [key for key in schema.get("required", ()) if key not in value]
        if missing:
            names = ", ".join(f'"{key}"' for key in missing)
            errors.append(f"{names} {'wasn' if len(missing) == 1 else 'weren'}'t supplied.")
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                errors += validate(sub, value[key], f"properties/{key}")
    if isinstance(value, list):
        low, high = schema.get("minItems"), schema.get("maxItems")
        if low is not None and len(value) < low:
            errors.append(f"{at}{_shown(value)} has fewer than {low} items.")
        if high is not None and len(value) > high:
            errors.append(f"{at}an array of {len(value)} items has more than {high} items.")
        for item in value:
            errors += validate(schema.get("items", {}), item, f"{where}/items".lstrip("/"))
    return errors


# The state.


@dataclass
class Installation:
    id: int
    app_id: int
    account: str  # the organization (or user) it is installed on
    repositories: frozenset[str] | None  # selected repository names; None: all
    permissions: dict[str, str]
    runner_groups: set[int]

    def reaches(self, org: str | None, owner: str | None, repo: str | None) -> bool:
        if org is not None:
            return org.lower() == self.account.lower()
        return (owner or "").lower() == self.account.lower() and (
            self.repositories is None or (repo or "") in self.repositories
        )


@dataclass
class App:
    id: int
    public_key: rsa.RSAPublicKey


@dataclass
class FakeRunner:
    id: int
    scope: str  # "org/NAME" or "repo/OWNER/NAME"
    name: str
    runner_group_id: int
    labels: tuple[str, ...]
    jit_config: str = field(repr=False)
    status: str = "offline"
    busy: bool = False
    used: bool = False  # its JIT config has been used
    job_id: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "os": "Linux" if self.used else "unknown",
            "status": self.status, "busy": self.busy, "ephemeral": True,
            "runner_group_id": self.runner_group_id,
            "labels": [
                {"id": index + 1, "name": label,
                 "type": "read-only" if label.lower() in READ_ONLY_LABELS else "custom"}
                for index, label in enumerate(self.labels)
            ],
        }  # fmt: skip


@dataclass
class Job:
    id: int
    run_id: int
    repository: str  # "owner/name"
    labels: tuple[str, ...]
    created_at: datetime
    script: str = field(default="exit 0", repr=False)  # the job's steps as one shell script
    private: bool = True  # whether its repository is private
    name: str = "build"
    head_sha: str = field(default_factory=lambda: secrets.token_hex(20))
    status: str = "queued"  # queued, in_progress, completed
    conclusion: str | None = None
    runner_id: int | None = None
    runner_name: str | None = None
    runner_group_id: int | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "run_id": self.run_id, "name": self.name,
                "repository": self.repository, "private": self.private,
                "labels": list(self.labels), "script": self.script,
                "status": self.status, "conclusion": self.conclusion,
                "runner_id": self.runner_id, "runner_name": self.runner_name}  # fmt: skip


@dataclass
class Fault:
    status: int
    message: str
    headers: dict[str, str]
    times: int


class GitHubState:
    """What the fake knows (thread-safe): Apps, installations, tokens, runners, jobs, and
    the App's webhook (:class:`Webhooks`: ``webhook_url``, ``webhook_secret``,
    ``webhook_attempts``). ``now`` is its clock (timezone-aware)."""

    def __init__(
        self, now: Callable[[], datetime] = lambda: datetime.now(UTC), *,
        webhook_url: str | None = None, webhook_secret: str | None = None,
        webhook_attempts: int = 1,
    ) -> None:  # fmt: skip
        self.now = now
        self.webhooks = Webhooks(now, webhook_url, webhook_secret, attempts=webhook_attempts)
        self._lock = threading.RLock()
        self._apps: dict[int, App] = {}
        self._installations: dict[int, Installation] = {}
        self._tokens: dict[str, tuple[int, datetime]] = {}
        self._runners: dict[int, FakeRunner] = {}
        self._jobs: dict[int, Job] = {}
        self._faults: list[Fault] = []
        self._ids = itertools.count(1)
        self._named_ids: dict[str, int] = {}  # repositories' and accounts' ids

    # Admin.

    def register_app(
        self, app_id: int, public_key_pem: str, installations: Iterable[Mapping[str, Any]]
    ) -> None:
        """The App ``app_id`` with its public key and installations: each ``{id, account,
        repositories?: [names], permissions?: {name: read|write}, runner_groups?: [ids]}``
        (by default every repository, both runner permissions written, group 1)."""
        key = serialization.load_pem_public_key(public_key_pem.encode())
        if not isinstance(key, rsa.RSAPublicKey):
            raise GitHubRefusal(400, "an App's public key is an RSA key")
        with self._lock:
            self._apps[int(app_id)] = App(int(app_id), key)
            for spec in installations:
                repositories = spec.get("repositories")
                self._installations[int(spec["id"])] = Installation(
                    int(spec["id"]), int(app_id), str(spec["account"]),
                    None if repositories is None else frozenset(map(str, repositories)),
                    dict(spec.get("permissions")
                         or {ORG_PERMISSION: "write", REPO_PERMISSION: "write"}),
                    {DEFAULT_GROUP, *map(int, spec.get("runner_groups", ()))},
                )  # fmt: skip

    def revoke_installation(self, installation_id: int) -> None:
        """The App is uninstalled: the installation and its tokens are gone."""
        with self._lock:
            self._installations.pop(installation_id, None)
            self._tokens = {t: v for t, v in self._tokens.items() if v[0] != installation_id}

    def queue_job(
        self, repository: str, labels: Sequence[str], *, script: str = "exit 0",
        private: bool = True,
    ) -> dict[str, Any]:  # fmt: skip
        """A workflow job queued in ``owner/name`` asking for ``labels``; ``script`` is what
        a runner that takes it runs (its steps as one shell script), ``private`` whether the
        repository is. The App's webhook is sent ``workflow_job`` ``queued``."""
        if repository.count("/") != 1 or not all(repository.split("/")) or not labels:
            raise GitHubRefusal(400, "a job has a repository 'owner/name' and labels")
        if not all(isinstance(label, str) and label for label in labels):
            raise GitHubRefusal(400, "a job's labels are non-empty strings")
        if not isinstance(script, str) or not isinstance(private, bool):
            raise GitHubRefusal(400, "a job's script is a string and private a boolean")
        with self._lock:
            job = Job(next(self._ids), next(self._ids), repository, tuple(labels), self.now(),
                      script=script, private=private)  # fmt: skip
            self._jobs[job.id] = job
            self._hook("queued", job)
            return job.as_json()

    def set_webhook(self, url: str | None, secret: str | None) -> None:
        """Where the App's webhook goes (None: nowhere) and the secret it is signed with."""
        self.webhooks.configure(url, secret)

    def deliveries(self) -> list[dict[str, Any]]:
        return self.webhooks.deliveries()

    def redeliver(self, delivery_id: int) -> dict[str, Any]:
        """Send delivery ``delivery_id`` again (same ``X-GitHub-Delivery``, a new delivery
        marked ``redelivery``), as GitHub's "Redeliver a delivery" does."""
        return self.webhooks.redeliver(delivery_id)

    def runners(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{**r.as_json(), "scope": r.scope, "job_id": r.job_id}
                    for r in self._runners.values()]  # fmt: skip

    def jobs(self) -> list[dict[str, Any]]:
        with self._lock:
            return [job.as_json() for job in self._jobs.values()]

    def take_job(self, jit_config: str) -> dict[str, Any]:
        """The runner started with ``jit_config`` comes online (once: a JIT config is not
        reusable) and takes the oldest queued job it can run, if any: ``{runner, job}``."""
        with self._lock:
            runner = self._runner_of(jit_config)
            if runner.used:
                raise GitHubRefusal(409, f"the JIT config of runner {runner.name} was used")
            runner.used, runner.status = True, "online"
            return self._next_job(runner)

    def poll(self, jit_config: str) -> dict[str, Any]:
        """The online runner started with ``jit_config`` asks for a job again (as a listener
        long-polls): ``{runner, job}``, its job if it has one, else the oldest queued job it
        can run, if any. 404 once the runner is deleted; 409 before it took its config."""
        with self._lock:
            runner = self._runner_of(jit_config)
            if not runner.used:
                raise GitHubRefusal(409, f"runner {runner.name} has not started")
            return self._next_job(runner)

    def runner_by_id(self, runner_id: int) -> dict[str, Any]:
        with self._lock:
            runner = self._runners.get(runner_id)
            if runner is None:
                raise GitHubRefusal(404, f"no runner {runner_id}")
            return {**runner.as_json(), "scope": runner.scope, "job_id": runner.job_id}

    def _runner_of(self, jit_config: str) -> FakeRunner:
        runner = next((r for r in self._runners.values() if r.jit_config == jit_config), None)
        if runner is None:
            raise GitHubRefusal(404, "no runner has this JIT config (deleted, or never made)")
        return runner

    def _next_job(self, runner: FakeRunner) -> dict[str, Any]:
        job = None if runner.job_id is None else self._jobs[runner.job_id]
        if job is None:
            job = next((j for j in self._jobs.values()
                        if j.status == "queued" and _runs(runner, j)), None)  # fmt: skip
            if job is not None:
                job.status, job.runner_id, job.runner_name = "in_progress", runner.id, runner.name
                job.runner_group_id, job.started_at = runner.runner_group_id, self.now()
                runner.busy, runner.job_id = True, job.id
                self._hook("in_progress", job)
        return {"runner": runner.as_json(), "job": None if job is None else job.as_json()}

    def complete_job(self, job_id: int, conclusion: str) -> dict[str, Any]:
        """The job ends with ``conclusion`` (``success``, ``failure`` or ``cancelled``); its
        JIT runner is removed. The App's webhook is sent ``workflow_job`` ``completed``."""
        if conclusion not in ("success", "failure", "cancelled"):
            raise GitHubRefusal(400, f"a job's conclusion is success or failure, not {conclusion}")
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.status != "in_progress":
                raise GitHubRefusal(404, f"no job {job_id} in progress")
            job.status, job.conclusion, job.completed_at = "completed", conclusion, self.now()
            if job.runner_id is not None:
                self._runners.pop(job.runner_id, None)
            self._hook("completed", job)
            return job.as_json()

    def _hook(self, action: str, job: Job) -> None:
        """Queue the ``workflow_job`` ``action`` webhook of ``job`` (under the lock, so hooks
        leave in the order the job changed)."""
        owner = job.repository.split("/")[0]
        installation = next((i for i in self._installations.values()
                             if i.reaches(None, owner, job.repository.split("/")[1])),
                            None)  # fmt: skip
        ids = {key: self._stable_id(key) for key in (f"repo/{job.repository}", f"org/{owner}")}
        self.webhooks.send(workflow_job_payload(
            action, job, repository_id=ids[f"repo/{job.repository}"],
            owner_id=ids[f"org/{owner}"],
            installation_id=None if installation is None else installation.id,
        ), app_id=None if installation is None else installation.app_id)  # fmt: skip

    def _stable_id(self, key: str) -> int:
        if key not in self._named_ids:
            self._named_ids[key] = next(self._ids)
        return self._named_ids[key]

    def fail_next(
        self, status: int, message: str, *, headers: Mapping[str, str] | None = None,
        times: int = 1,
    ) -> None:  # fmt: skip
        """The next ``times`` API requests are answered ``status`` with ``message`` and
        ``headers`` (a rate limit, an outage)."""
        with self._lock:
            self._faults.append(Fault(status, message, dict(headers or {}), times))

    def fault(self) -> Fault | None:
        with self._lock:
            if not self._faults:
                return None
            fault = self._faults[0]
            fault.times -= 1
            if fault.times <= 0:
                self._faults.pop(0)
            return fault

    # The API.

    def app_of(self, bearer: str) -> App:
        """The App whose JWT ``bearer`` is, checked as GitHub checks it."""
        undecodable = GitHubRefusal(401, "A JSON web token could not be decoded")
        try:
            head, body, signature = bearer.split(".")
            header, claims = _segment_json(head), _segment_json(body)
            signed = base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4))
        except (ValueError, binascii.Error):
            raise undecodable from None
        issuer = claims.get("iss")
        with self._lock:
            app = self._apps.get(int(str(issuer))) if str(issuer).isdigit() else None
        if header.get("alg") != "RS256" or app is None:
            raise undecodable
        try:
            app.public_key.verify(signed, f"{head}.{body}".encode("ascii"),
                                  padding.PKCS1v15(), hashes.SHA256())  # fmt: skip
        except InvalidSignature:
            raise undecodable from None
        now = self.now().timestamp()
        issued, expires = claims.get("iat"), claims.get("exp")
        if not isinstance(issued, int) or isinstance(issued, bool) or issued > now:
            raise GitHubRefusal(401, IAT_REFUSED)
        if not isinstance(expires, int) or isinstance(expires, bool) or expires <= now:
            raise GitHubRefusal(401, EXP_REFUSED)
        if expires > now + JWT_MAX_AHEAD.total_seconds():
            raise GitHubRefusal(401, "'Expiration time' claim ('exp') is too far in the future")
        return app

    def issue_token(
        self, app: App, installation_id: int, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        with self._lock:
            installation = self._installations.get(installation_id)
            if installation is None or installation.app_id != app.id:
                raise GitHubRefusal(404, "Not Found")
            token = "ghs_" + secrets.token_urlsafe(27)[:36]
            expires = self.now().astimezone(UTC) + TOKEN_LIFETIME
            self._tokens[token] = (installation_id, expires)
            selection = "all" if installation.repositories is None else "selected"
            return {"token": token, "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "permissions": dict(installation.permissions),
                    "repository_selection": selection}  # fmt: skip

    def installation_of(self, bearer: str) -> Installation:
        with self._lock:
            issued = self._tokens.get(bearer)
            installation = None if issued is None else self._installations.get(issued[0])
            if issued is None or installation is None or self.now() >= issued[1]:
                raise GitHubRefusal(401, "Bad credentials")
            return installation

    def create_runner(
        self, installation: Installation, scope: str, body: Mapping[str, Any], server_url: str
    ) -> dict[str, Any]:
        """A JIT runner (``body`` checked against the description already); its config names
        ``server_url`` (this fake's address as the caller reached it) as the runner's server."""
        with self._lock:
            group = int(body["runner_group_id"])
            groups = installation.runner_groups if scope.startswith("org/") else {DEFAULT_GROUP}
            if group not in groups:
                raise GitHubRefusal(404, "Not Found")
            name = str(body["name"])
            if any(r.scope == scope and r.name == name for r in self._runners.values()):
                raise GitHubRefusal(
                    409, f"Already exists - A runner with the name {name} already exists."
                )
            runner_id = next(self._ids)
            config = encoded_jit_config(runner_id, name, group, scope, server_url)
            runner = FakeRunner(runner_id, scope, name, group, tuple(body["labels"]), config)
            self._runners[runner.id] = runner
            return {"runner": runner.as_json(), "encoded_jit_config": runner.jit_config}

    def runner(self, scope: str, runner_id: int) -> FakeRunner:
        with self._lock:
            runner = self._runners.get(runner_id)
            if runner is None or runner.scope != scope:
                raise GitHubRefusal(404, "Not Found")
            return runner

    def delete_runner(self, scope: str, runner_id: int) -> None:
        with self._lock:
            runner = self.runner(scope, runner_id)
            if runner.busy:
                raise GitHubRefusal(
                    422, f'Bad request - Runner "{runner.name}" is still running a job"'
                )
            del self._runners[runner_id]


def _b64_json(value: Mapping[str, Any]) -> str:
    return base64.b64encode(json.dumps(value, separators=(",", ":")).encode()).decode("ascii")


def encoded_jit_config(runner_id: int, name: str, group: int, scope: str, server_url: str) -> str:
    """A runner's ``encoded_jit_config`` shaped as GitHub's: base64 of a JSON object mapping
    the runner's configuration files to their base64 contents (actions/runner
    src/Runner.Listener/Runner.cs decodes it so and writes each file; the files are
    ``.runner``, ``.credentials`` and ``.credentials_rsaparams``,
    ChristopherHX/github-act-runner#138). ``.runner`` holds the runner's settings as
    src/Runner.Common/ConfigurationStore.cs ``RunnerSettings`` names them; here ``serverUrl``
    and ``gitHubUrl`` are this fake's address, so a runner needs only its config to find it.
    The credentials are random (nothing here checks them)."""
    path = scope.split("/", 1)[1]
    runner = {
        "agentId": runner_id, "agentName": name, "poolId": group,
        "poolName": "Default" if group == DEFAULT_GROUP else f"runner-group-{group}",
        "serverUrl": f"{server_url}/", "gitHubUrl": f"{server_url}/{path}",
        "workFolder": "_work", "ephemeral": True, "disableUpdate": True,
    }  # fmt: skip
    credentials = {
        "scheme": "OAuth",
        "data": {"clientId": str(uuid.uuid4()),
                 "authorizationUrl": f"{server_url}/_apis/oauth2/token/{uuid.uuid4()}",
                 "requireFipsCryptography": "False"},
    }  # fmt: skip
    rsa_parameters = {
        key: base64.b64encode(secrets.token_bytes(size)).decode("ascii")
        for key, size in (("d", 256), ("dp", 128), ("dq", 128), ("exponent", 3),
                          ("inverseQ", 128), ("modulus", 256), ("p", 128), ("q", 128))
    }  # fmt: skip
    return _b64_json({".runner": _b64_json(runner), ".credentials": _b64_json(credentials),
                      ".credentials_rsaparams": _b64_json(rsa_parameters)})  # fmt: skip


def _segment_json(segment: str) -> dict[str, Any]:
    decoded = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    if not isinstance(decoded, dict):
        raise ValueError("not a JSON object")
    return decoded


def _runs(runner: FakeRunner, job: Job) -> bool:
    """Whether ``runner`` may take ``job``: its scope reaches the job's repository and it has
    every label the job asks for (case-insensitive)."""
    owner = job.repository.split("/")[0]
    reaches = runner.scope.lower() in (f"org/{owner}".lower(), f"repo/{job.repository}".lower())
    have = {label.lower() for label in runner.labels}
    return reaches and all(label.lower() in have for label in job.labels)


# Webhooks.

WEBHOOKS = Path(__file__).parent / "data" / "github-webhooks-workflow-job.json"
HOOKSHOT = "GitHub-Hookshot/7a1b2c3"  # GitHub's deliveries' User-Agent: GitHub-Hookshot/<id>
HOOK_ID = 1  # the App's one webhook
HOOK_TIMEOUT = 10.0  # "takes longer than 10 seconds to respond": a failed delivery
RETRY_DELAY = 1.0  # between attempts, when more than one is asked for
API = "https://api.github.com"
WEB = "https://github.com"
SENDER = ("octocat", 583231)  # the user whose push queued the jobs


@cache
def webhooks_description() -> dict[str, Any]:
    """The vendored part of GitHub's webhooks description (``@octokit/openapi-webhooks``)."""
    loaded: dict[str, Any] = json.loads(WEBHOOKS.read_text())
    return loaded


def _resolved(schema: Any, components: Mapping[str, Any], seen: tuple[str, ...] = ()) -> Any:
    """``schema`` with each ``$ref`` to ``#/components/schemas/NAME`` replaced by its target."""
    if isinstance(schema, list):
        return [_resolved(item, components, seen) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[1]
        if name in seen:
            raise ValueError(f"the schema {name} refers to itself")
        return _resolved(components[name], components, (*seen, name))
    return {key: _resolved(value, components, seen) for key, value in schema.items()}


@cache
def webhook_operation(action: str) -> dict[str, Any]:
    """The description of the ``workflow_job`` ``action`` webhook (``queued``,
    ``in_progress``, ``completed``), its references resolved."""
    document = webhooks_description()
    name = "workflow-job-" + action.replace("_", "-")
    operation: dict[str, Any] = _resolved(document["webhooks"][name]["post"],
                                          document["components"]["schemas"])  # fmt: skip
    return operation


def webhook_schema(action: str) -> dict[str, Any]:
    """The JSON schema of the ``workflow_job`` ``action`` webhook's body."""
    schema: dict[str, Any] = webhook_operation(action)["requestBody"]["content"][
        "application/json"]["schema"]  # fmt: skip
    return schema


def webhook_headers(action: str) -> list[str]:
    """The headers the description says every ``workflow_job`` ``action`` delivery has."""
    return [parameter["name"] for parameter in webhook_operation(action)["parameters"]
            if parameter.get("in") == "header" and parameter.get("required")]  # fmt: skip


def _stamp(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _user(login: str, user_id: int, kind: str) -> dict[str, Any]:
    """A ``simple-user`` as GitHub sends it."""
    url = f"{API}/users/{login}"
    return {
        "login": login, "id": user_id, "node_id": f"U_{user_id}", "type": kind,
        "avatar_url": f"https://avatars.githubusercontent.com/u/{user_id}?v=4",
        "gravatar_id": "", "url": url, "html_url": f"{WEB}/{login}",
        "followers_url": f"{url}/followers", "following_url": f"{url}/following{{/other_user}}",
        "gists_url": f"{url}/gists{{/gist_id}}", "starred_url": f"{url}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{url}/subscriptions", "organizations_url": f"{url}/orgs",
        "repos_url": f"{url}/repos", "events_url": f"{url}/events{{/privacy}}",
        "received_events_url": f"{url}/received_events", "site_admin": False,
    }  # fmt: skip


def _organization(login: str, org_id: int) -> dict[str, Any]:
    """An ``organization-simple-webhooks`` as GitHub sends it."""
    url = f"{API}/orgs/{login}"
    return {
        "login": login, "id": org_id, "node_id": f"O_{org_id}", "url": url,
        "repos_url": f"{url}/repos", "events_url": f"{url}/events", "hooks_url": f"{url}/hooks",
        "issues_url": f"{url}/issues", "members_url": f"{url}/members{{/member}}",
        "public_members_url": f"{url}/public_members{{/member}}",
        "avatar_url": f"https://avatars.githubusercontent.com/u/{org_id}?v=4",
        "description": None,
    }  # fmt: skip


def _repository(full_name: str, repository_id: int, owner: Mapping[str, Any], private: bool,
                created: datetime) -> dict[str, Any]:  # fmt: skip
    """A ``repository-webhooks`` as GitHub sends it."""
    url, html = f"{API}/repos/{full_name}", f"{WEB}/{full_name}"
    templated = {  # the repository's API links, as GitHub templates them
        "archive_url": "/{archive_format}{/ref}", "assignees_url": "/assignees{/user}",
        "blobs_url": "/git/blobs{/sha}", "branches_url": "/branches{/branch}",
        "collaborators_url": "/collaborators{/collaborator}", "comments_url": "/comments{/number}",
        "commits_url": "/commits{/sha}", "compare_url": "/compare/{base}...{head}",
        "contents_url": "/contents/{+path}", "contributors_url": "/contributors",
        "deployments_url": "/deployments", "downloads_url": "/downloads",
        "events_url": "/events", "forks_url": "/forks", "git_commits_url": "/git/commits{/sha}",
        "git_refs_url": "/git/refs{/sha}", "git_tags_url": "/git/tags{/sha}",
        "hooks_url": "/hooks", "issue_comment_url": "/issues/comments{/number}",
        "issue_events_url": "/issues/events{/number}", "issues_url": "/issues{/number}",
        "keys_url": "/keys{/key_id}", "labels_url": "/labels{/name}",
        "languages_url": "/languages", "merges_url": "/merges",
        "milestones_url": "/milestones{/number}",
        "notifications_url": "/notifications{?since,all,participating}",
        "pulls_url": "/pulls{/number}", "releases_url": "/releases{/id}",
        "stargazers_url": "/stargazers", "statuses_url": "/statuses/{sha}",
        "subscribers_url": "/subscribers", "subscription_url": "/subscription",
        "tags_url": "/tags", "teams_url": "/teams", "trees_url": "/git/trees{/sha}",
    }  # fmt: skip
    stamp = _stamp(created)
    return {
        "id": repository_id, "node_id": f"R_{repository_id}", "name": full_name.split("/")[1],
        "full_name": full_name, "private": private,
        "visibility": "private" if private else "public", "owner": dict(owner),
        "html_url": html, "description": None, "fork": False, "url": url,
        **{key: url + suffix for key, suffix in templated.items()},
        "created_at": stamp, "updated_at": stamp, "pushed_at": stamp,
        "git_url": f"git://github.com/{full_name}.git",
        "ssh_url": f"git@github.com:{full_name}.git",
        "clone_url": f"{html}.git", "svn_url": html, "homepage": None, "size": 0,
        "stargazers_count": 0, "watchers_count": 0, "language": None, "has_issues": True,
        "has_projects": True, "has_downloads": True, "has_wiki": True, "has_pages": False,
        "forks_count": 0, "mirror_url": None, "archived": False, "disabled": False,
        "open_issues_count": 0, "license": None, "forks": 0, "open_issues": 0,
        "watchers": 0, "default_branch": "main",
    }  # fmt: skip


def workflow_job_payload(
    action: str, job: Job, *, repository_id: int, owner_id: int, installation_id: int | None
) -> dict[str, Any]:
    """The body of the ``workflow_job`` ``action`` webhook GitHub sends for ``job``: the
    fields and nullability of ``@octokit/openapi-webhooks``' ``workflow-job-ACTION``
    (docs.github.com/en/webhooks/webhook-events-and-payloads#workflow_job). The repository's
    owner is taken to be an organization (so ``organization`` is sent too)."""
    owner = job.repository.split("/")[0]
    url = f"{API}/repos/{job.repository}"
    done = job.status == "completed"
    steps = [] if job.started_at is None else [{
        "name": "Run script", "status": job.status, "conclusion": job.conclusion, "number": 1,
        "started_at": _stamp(job.started_at), "completed_at": _stamp(job.completed_at),
    }]  # fmt: skip
    workflow_job = {
        "id": job.id, "run_id": job.run_id, "workflow_name": "CI", "head_branch": "main",
        "run_url": f"{url}/actions/runs/{job.run_id}", "run_attempt": 1,
        "node_id": f"CR_{job.id}", "head_sha": job.head_sha, "url": f"{url}/actions/jobs/{job.id}",
        "html_url": f"{WEB}/{job.repository}/actions/runs/{job.run_id}/job/{job.id}",
        "status": job.status, "conclusion": job.conclusion if done else None,
        "created_at": _stamp(job.created_at),
        "started_at": _stamp(job.started_at or job.created_at),
        "completed_at": _stamp(job.completed_at), "name": job.name, "steps": steps,
        "check_run_url": f"{url}/check-runs/{job.id}", "labels": list(job.labels),
        "runner_id": job.runner_id, "runner_name": job.runner_name,
        "runner_group_id": job.runner_group_id,
        "runner_group_name": None if job.runner_group_id is None else (
            "Default" if job.runner_group_id == DEFAULT_GROUP
            else f"runner-group-{job.runner_group_id}"),
    }  # fmt: skip
    payload: dict[str, Any] = {
        "action": action, "workflow_job": workflow_job,
        "repository": _repository(job.repository, repository_id,
                                  _user(owner, owner_id, "Organization"), job.private,
                                  job.created_at),
        "organization": _organization(owner, owner_id),
        "sender": _user(*SENDER, "User"),
    }  # fmt: skip
    if installation_id is not None:
        payload["installation"] = {"id": installation_id, "node_id": f"MDIz_{installation_id}"}
    return payload


def signature_256(secret: str, body: bytes) -> str:
    """``X-Hub-Signature-256``: "sha256=" and the hex HMAC-SHA256 of the body keyed by the
    webhook's secret (docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass
class Delivery:
    id: int
    guid: str  # X-GitHub-Delivery; a redelivery keeps it
    action: str
    job_id: int
    body: bytes = field(repr=False)
    app_id: int | None
    installation_id: int | None
    repository_id: int
    redelivery: bool = False
    status: str = "pending"  # then "OK", "Invalid HTTP Response: N" or why it failed
    status_code: int = 0
    attempts: int = 0
    delivered_at: datetime | None = None
    duration: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "guid": self.guid, "delivered_at": _stamp(self.delivered_at),
            "redelivery": self.redelivery, "duration": self.duration, "status": self.status,
            "status_code": self.status_code, "event": "workflow_job", "action": self.action,
            "installation_id": self.installation_id, "repository_id": self.repository_id,
            "job_id": self.job_id, "attempts": self.attempts,
        }  # fmt: skip


class Webhooks:
    """The App's webhook: deliveries sent one at a time, in the order they were made, by a
    background thread (so a job's ``queued``, ``in_progress`` and ``completed`` arrive in
    that order). A delivery is tried ``attempts`` times (GitHub: once — "GitHub does not
    automatically redeliver failed deliveries",
    docs.github.com/en/webhooks/using-webhooks/handling-failed-webhook-deliveries); a
    non-2xx answer, no answer or one slower than 10 s fails it, and the failure is recorded.
    With no URL, nothing is sent or recorded (there is no webhook)."""

    def __init__(
        self, now: Callable[[], datetime], url: str | None, secret: str | None, *,
        attempts: int = 1,
    ) -> None:  # fmt: skip
        if attempts < 1:
            raise ValueError("a delivery is attempted at least once")
        self._now = now
        self._url, self._secret, self._attempts = url, secret, attempts
        self._lock = threading.Condition()
        self._deliveries: dict[int, Delivery] = {}
        self._outbox: list[Delivery] = []
        self._ids = itertools.count(1)
        self._sender: threading.Thread | None = None

    def configure(self, url: str | None, secret: str | None) -> None:
        with self._lock:
            self._url, self._secret = url or None, secret or None

    def send(self, payload: Mapping[str, Any], *, app_id: int | None) -> None:
        """Queue ``payload`` (checked against the description first: a payload it refuses
        is this fake's bug)."""
        errors = validate(webhook_schema(str(payload["action"])), payload)
        if errors:
            raise RuntimeError("the fake's workflow_job payload breaks its schema: "
                               + "; ".join(errors))  # fmt: skip
        with self._lock:
            if self._url is None:
                return
            installation = payload.get("installation")
            self._queue(Delivery(
                next(self._ids), str(uuid.uuid4()), str(payload["action"]),
                int(payload["workflow_job"]["id"]), json.dumps(payload).encode(), app_id,
                None if installation is None else int(installation["id"]),
                int(payload["repository"]["id"]),
            ))  # fmt: skip

    def redeliver(self, delivery_id: int) -> dict[str, Any]:
        with self._lock:
            original = self._deliveries.get(delivery_id)
            if original is None:
                raise GitHubRefusal(404, "Not Found")
            again = Delivery(next(self._ids), original.guid, original.action, original.job_id,
                             original.body, original.app_id, original.installation_id,
                             original.repository_id, redelivery=True)  # fmt: skip
            self._queue(again)
            return again.as_json()

    def deliveries(self) -> list[dict[str, Any]]:
        with self._lock:
            return [delivery.as_json() for delivery in self._deliveries.values()]

    def wait(self, timeout: float = 10.0) -> bool:
        """Wait until every queued delivery has been attempted; whether they all were."""
        with self._lock:
            return self._lock.wait_for(
                lambda: (
                    not self._outbox
                    and all(d.status != "pending" for d in self._deliveries.values())
                ),
                timeout,
            )

    def _queue(self, delivery: Delivery) -> None:
        self._deliveries[delivery.id] = delivery
        self._outbox.append(delivery)
        if self._sender is None or not self._sender.is_alive():
            self._sender = threading.Thread(target=self._run, name="github-webhooks", daemon=True)
            self._sender.start()
        self._lock.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: bool(self._outbox))
                delivery = self._outbox[0]
                url, secret = self._url, self._secret
            for attempt in range(self._attempts):
                if attempt:
                    time.sleep(RETRY_DELAY)
                if url is not None and self._post(delivery, url, secret):
                    break
            with self._lock:
                if delivery.status == "pending":  # the webhook was removed meanwhile
                    delivery.status = "no webhook URL"
                self._outbox.pop(0)
                self._lock.notify_all()

    def _post(self, delivery: Delivery, url: str, secret: str | None) -> bool:
        headers = {
            "Content-Type": "application/json", "User-Agent": HOOKSHOT,
            "X-GitHub-Event": "workflow_job", "X-GitHub-Delivery": delivery.guid,
            "X-GitHub-Hook-ID": str(HOOK_ID),
            "X-GitHub-Hook-Installation-Target-Type":
                "repository" if delivery.app_id is None else "integration",
            "X-GitHub-Hook-Installation-Target-ID":
                str(delivery.repository_id if delivery.app_id is None else delivery.app_id),
        }  # fmt: skip
        if secret is not None:
            headers["X-Hub-Signature"] = "sha1=" + hmac.new(
                secret.encode(), delivery.body, hashlib.sha1).hexdigest()  # fmt: skip
            headers["X-Hub-Signature-256"] = signature_256(secret, delivery.body)
        started = time.monotonic()
        request = urllib.request.Request(url, data=delivery.body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=HOOK_TIMEOUT) as answer:
                code, status = int(answer.status), "OK"
        except urllib.error.HTTPError as error:
            code, status = error.code, f"Invalid HTTP Response: {error.code}"
        except (OSError, ValueError) as error:
            timed_out = isinstance(error, TimeoutError) or "timed out" in str(error)
            code, status = 0, "timed out" if timed_out else f"failed to connect to host: {error}"
        with self._lock:
            delivery.attempts += 1
            delivery.status, delivery.status_code = status, code
            delivery.delivered_at, delivery.duration = self._now(), time.monotonic() - started
        return 200 <= code < 300


# HTTP.


class _Application:
    def __init__(self, state: GitHubState) -> None:
        self.state = state

    def __call__(self, environ: Any, start_response: Any) -> Any:
        request = Request(environ)
        headers: dict[str, str] = {}
        try:
            if request.path.startswith(ADMIN + "/"):
                status, body = self._admin(request)
            else:
                status, body, headers = self._api(request)
        except GitHubRefusal as refused:
            status = refused.status
            body = {"message": refused.message, "documentation_url": refused.documentation_url,
                    "status": str(refused.status)}  # fmt: skip
        text = "" if status == 204 else json.dumps(body)
        response = Response(text, status, headers=headers, content_type="application/json")
        return response(environ, start_response)

    def _api(self, request: Request) -> tuple[int, Any, dict[str, str]]:
        fault = self.state.fault()
        if fault is not None:
            body = {"message": fault.message, "documentation_url": REST_DOCS,
                    "status": str(fault.status)}  # fmt: skip
            return fault.status, body, fault.headers
        operation, params = _route(request)
        try:
            bearer = _bearer(request)
            status, body = self._operation(request, operation, params, bearer)
        except GitHubRefusal as refused:
            if refused.documentation_url == REST_DOCS and refused.status in (404, 409, 422):
                refused.documentation_url = operation.documentation_url
            raise
        return status, body, {}

    def _operation(
        self, request: Request, operation: Operation, params: dict[str, str], bearer: str
    ) -> tuple[int, Any]:
        state = self.state
        if operation.id == "apps/create-installation-access-token":
            app = state.app_of(bearer)
            body = _body(request, operation, required=False)
            return 201, state.issue_token(app, int(params["installation_id"]), body)
        installation = state.installation_of(bearer)
        scope = _scope(installation, params, write=request.method != "GET")
        if operation.id.startswith("actions/generate-runner-jitconfig"):
            server_url = request.host_url.rstrip("/")
            return 201, state.create_runner(installation, scope, _body(request, operation),
                                            server_url)  # fmt: skip
        runner_id = int(params["runner_id"])
        if request.method == "GET":
            return 200, state.runner(scope, runner_id).as_json()
        state.delete_runner(scope, runner_id)
        return 204, None

    def _admin(self, request: Request) -> tuple[int, Any]:
        state, path, method = self.state, request.path[len(ADMIN) :], request.method
        body = _json(request) if method == "POST" else {}
        if (method, path) == ("POST", "/apps"):
            state.register_app(int(body["id"]), str(body["public_key"]),
                               body.get("installations", ()))  # fmt: skip
            return 201, {"id": int(body["id"])}
        if (method, path) == ("POST", "/jobs"):
            return 201, state.queue_job(str(body.get("repository", "")), body.get("labels", []),
                                        script=body.get("script", "exit 0"),
                                        private=body.get("private", True))  # fmt: skip
        if (method, path) == ("POST", "/webhook"):
            state.set_webhook(body.get("url"), body.get("secret"))
            return 200, {"url": body.get("url")}
        if (method, path) == ("GET", "/deliveries"):
            return 200, state.deliveries()
        if method == "POST" and (match := re.fullmatch(r"/deliveries/(\d+)/attempts", path)):
            return 202, state.redeliver(int(match[1]))
        if (method, path) == ("POST", "/runner/poll"):
            return 200, state.poll(str(body.get("jit_config", "")))
        if method == "GET" and (match := re.fullmatch(r"/runners/(\d+)", path)):
            return 200, state.runner_by_id(int(match[1]))
        if (method, path) == ("GET", "/jobs"):
            return 200, state.jobs()
        if (method, path) == ("GET", "/runners"):
            return 200, state.runners()
        if (method, path) == ("POST", "/runner/take"):
            return 200, state.take_job(str(body.get("jit_config", "")))
        if method == "POST" and (match := re.fullmatch(r"/jobs/(\d+)/complete", path)):
            return 200, state.complete_job(int(match[1]), str(body.get("conclusion", "")))
        if method == "POST" and (match := re.fullmatch(r"/installations/(\d+)/revoke", path)):
            state.revoke_installation(int(match[1]))
            return 200, {}
        if (method, path) == ("POST", "/faults"):
            state.fail_next(
                int(body["status"]), str(body.get("message", "")),
                headers=body.get("headers"), times=int(body.get("times", 1)),
            )  # fmt: skip
            return 201, {}
        raise GitHubRefusal(404, f"{method} {request.path} is not served by this fake")


def _route(request: Request) -> tuple[Operation, dict[str, str]]:
    """The described operation ``request`` asks for, and its path parameters."""
    for operation in operations():
        match = operation.pattern.fullmatch(request.path)
        if match and operation.method == request.method:
            params = match.groupdict()
            for parameter in operation.spec.get("parameters", ()):
                value = params.get(parameter["name"])
                if parameter.get("in") == "path" and validate(parameter["schema"], _typed(value)):
                    raise GitHubRefusal(404, "Not Found", operation.documentation_url)
            return operation, params
    raise GitHubRefusal(404, "Not Found")


def _typed(value: str | None) -> Any:
    return int(value) if value is not None and value.isdigit() else value


def _bearer(request: Request) -> str:
    header = request.headers.get("Authorization", "")
    kind, _, credential = header.partition(" ")
    if kind.lower() not in ("bearer", "token") or not credential.strip():
        raise GitHubRefusal(401, "Requires authentication")
    return credential.strip()


def _scope(installation: Installation, params: Mapping[str, str], *, write: bool) -> str:
    """The runners' scope the path names, if the installation reaches it and may act there."""
    org, owner, repo = params.get("org"), params.get("owner"), params.get("repo")
    if not installation.reaches(org, owner, repo):
        raise GitHubRefusal(404, "Not Found")
    permission = ORG_PERMISSION if org is not None else REPO_PERMISSION
    granted = installation.permissions.get(permission)
    if granted is None or (write and granted != "write"):
        raise GitHubRefusal(403, "Resource not accessible by integration")
    return f"org/{org}" if org is not None else f"repo/{owner}/{repo}"


def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(request.get_data() or b"{}")
    except ValueError:
        raise GitHubRefusal(400, "Problems parsing JSON") from None
    if not isinstance(body, dict):
        raise GitHubRefusal(400, "Problems parsing JSON")
    return body


def _body(request: Request, operation: Operation, *, required: bool = True) -> dict[str, Any]:
    """The request's JSON body, checked against the operation's request schema."""
    if not request.get_data() and not required:
        return {}
    body = _json(request)
    errors = validate(operation.spec["requestBody"]["content"]["application/json"]["schema"],
                      body)  # fmt: skip
    if errors:
        raise GitHubRefusal(422, "Invalid request.\n\n" + "\n".join(errors),
                            operation.documentation_url)  # fmt: skip
    return body


class GitHubEmulator(BackgroundServer):
    """The fake on a background thread (``url`` is the client's API URL); a context
    manager. ``state`` is what it knows, for a local caller to act on directly."""

    def __init__(
        self, *, now: Callable[[], datetime] | None = None, host: str = HOST, port: int = 0,
        webhook_url: str | None = None, webhook_secret: str | None = None,
        webhook_attempts: int = 1,
    ) -> None:  # fmt: skip
        super().__init__(host, port, what="the fake GitHub API", thread_name="github")
        hooks: dict[str, Any] = {"webhook_url": webhook_url, "webhook_secret": webhook_secret,
                                 "webhook_attempts": webhook_attempts}  # fmt: skip
        self.state = GitHubState(now, **hooks) if now is not None else GitHubState(**hooks)

    def application(self) -> _Application:
        return _Application(self.state)

    @property
    def url(self) -> str:
        return f"http://{self.address}"


__all__ = [
    "DESCRIPTION", "GitHubEmulator", "GitHubRefusal", "GitHubState", "encoded_jit_config",
    "request_schema", "response_schema", "validate",
]  # fmt: skip
