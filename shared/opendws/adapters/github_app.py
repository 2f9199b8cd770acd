"""A GitHub App on GitHub's REST API: its JWT, its installations' access tokens and the
just-in-time self-hosted runners they register, on github.com (``https://api.github.com``) or
a GitHub Enterprise Server (``https://HOST/api/v3``).

As GitHub documents it:

- **The App's JWT** ("Generating a JSON Web Token (JWT) for a GitHub App",
  docs.github.com/en/apps/creating-github-apps/authenticating-with-a-github-app/generating-a-json-web-token-jwt-for-a-github-app
  ):
  signed with RS256 by the App's private key; ``iss`` the App's id (or client id); ``iat``
  "60 seconds in the past" against clock drift; ``exp`` "no more than 10 minutes into the
  future". :func:`app_jwt` dates ``exp`` 9 minutes after the backdated ``iat``, so a clock a
  little fast is still within GitHub's 10 minutes.
- **Installation access tokens** ("Authenticating as a GitHub App installation",
  docs.github.com/en/apps/creating-github-apps/authenticating-with-a-github-app/authenticating-as-a-github-app-installation;
  docs.github.com/en/rest/apps/apps#create-an-installation-access-token-for-an-app):
  ``POST /app/installations/{id}/access_tokens`` with the JWT answers 201 ``{token,
  expires_at}``, a token that "will expire after 1 hour". :class:`GitHubApp` keeps one per
  installation until 5 minutes before it expires.
- **Just-in-time runners**
  (docs.github.com/en/rest/actions/self-hosted-runners#create-configuration-for-a-just-in-time-runner-for-an-organization
  and ``…-for-a-repository``): ``POST /orgs/{org}/actions/runners/generate-jitconfig`` (or
  ``/repos/{owner}/{repo}/…``) with ``name``, ``runner_group_id``, ``labels`` (1 to 100) and
  optionally ``work_folder`` answers 201 ``{runner, encoded_jit_config}``; ``GET`` and
  ``DELETE …/actions/runners/{id}`` read and remove one (a runner already gone, 404, is
  removed). The encoded config is a credential: it is handed to the caller only, never logged
  nor kept here (:class:`JitRunner` leaves it out of its repr).
- **Errors** ("Rate limits for the REST API", "Exceeding the rate limit",
  docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api): a 403 or 429
  with ``retry-after`` is not retried before that many seconds; with
  ``x-ratelimit-remaining: 0``, not before ``x-ratelimit-reset`` (UTC epoch seconds);
  otherwise a 429, or a 403 that names a secondary rate limit, waits "at least one minute" —
  all :class:`GitHubRateLimited` with ``retry_at``. A 401 (bad or expired credentials: a
  revoked installation, a wrong key) is :class:`GitHubUnauthorized`, not worth retrying; a
  5xx or no answer :class:`GitHubUnavailable` (retryable); a 422 :class:`GitHubInvalid` with
  GitHub's message; any other refusal :class:`GitHubRefused`.

Every request carries ``Accept: application/vnd.github+json``, ``X-GitHub-Api-Version:
2022-11-28`` and a ``User-Agent`` ("Getting started with the REST API",
docs.github.com/en/rest/using-the-rest-api/getting-started-with-the-rest-api).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, overload
from urllib.parse import quote

import requests
from google.auth import crypt, jwt

__all__ = [
    "API_VERSION", "GITHUB_API", "GitHubApp", "GitHubError", "GitHubInvalid",
    "GitHubRateLimited", "GitHubRefused", "GitHubUnauthorized", "GitHubUnavailable",
    "JitRunner", "Runner", "RunnerScope", "app_jwt",
]  # fmt: skip

GITHUB_API = "https://api.github.com"
API_VERSION = "2022-11-28"
USER_AGENT = "opendws"
JWT_BACKDATE = timedelta(seconds=60)  # "set this 60 seconds in the past"
JWT_LIFETIME = timedelta(minutes=9)  # after iat; GitHub's limit: 10 minutes into the future
TOKEN_MARGIN = timedelta(minutes=5)  # a cached installation token is renewed this early
SECONDARY_LIMIT_WAIT = timedelta(minutes=1)  # "wait for at least one minute before retrying"
TIMEOUT_SECONDS = 30.0


class GitHubError(Exception):
    """GitHub refused or did not answer: ``status`` (0: no answer) and GitHub's ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"GitHub answered {status}: {message}" if status else message)
        self.status = status
        self.message = message


class GitHubUnauthorized(GitHubError):
    """401: the credentials are bad or expired (a revoked installation, a wrong key): report
    it; retrying the same credentials will not help."""


class GitHubRateLimited(GitHubError):
    """403/429 for a rate limit: do not ask again before ``retry_at``."""

    def __init__(self, status: int, message: str, retry_at: datetime) -> None:
        super().__init__(status, f"{message} (retry after {retry_at.isoformat()})")
        self.retry_at = retry_at


class GitHubUnavailable(GitHubError):
    """A 5xx, or no answer at all: retry later."""


class GitHubInvalid(GitHubError):
    """422: GitHub refused the request's content; its message says what."""


class GitHubRefused(GitHubError):
    """Any other refusal (403 without a rate limit, 404, 409…)."""


@dataclass(frozen=True)
class RunnerScope:
    """Where runners are registered: an organization or one repository (``path`` is the
    API path's prefix, ``/orgs/{org}`` or ``/repos/{owner}/{repo}``)."""

    path: str

    @classmethod
    def organization(cls, org: str) -> RunnerScope:
        return cls(f"/orgs/{_segment(org)}")

    @classmethod
    def repository(cls, owner: str, repo: str) -> RunnerScope:
        return cls(f"/repos/{_segment(owner)}/{_segment(repo)}")


@dataclass(frozen=True)
class Runner:
    """A self-hosted runner as GitHub reports it (``status``: ``online`` or ``offline``)."""

    id: int
    name: str
    status: str
    busy: bool
    labels: tuple[str, ...]

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Runner:
        labels = tuple(str(label.get("name", "")) for label in body.get("labels", ()))
        return cls(int(body["id"]), str(body["name"]), str(body.get("status", "")),
                   bool(body.get("busy", False)), labels)  # fmt: skip


@dataclass(frozen=True)
class JitRunner:
    """A just-in-time runner: its id, and the config its machine starts it with
    (``run.sh --jitconfig CONFIG``) — a credential, left out of the repr."""

    runner_id: int
    encoded_jit_config: str = field(repr=False)


def app_jwt(app_id: int | str, private_key_pem: str, now: datetime) -> str:
    """The App's JWT at ``now``: RS256 with the App's key, ``iss`` the App's id, ``iat``
    60 s before ``now``, ``exp`` 9 minutes after ``iat``."""
    try:
        signer = crypt.RSASigner.from_string(private_key_pem)  # type: ignore[no-untyped-call]
    except ValueError as error:
        raise ValueError(f"the GitHub App's private key is not an RSA PEM key: {error}") from None
    issued = int((now - JWT_BACKDATE).timestamp())
    claims = {"iat": issued, "exp": issued + int(JWT_LIFETIME.total_seconds()),
              "iss": str(app_id)}  # fmt: skip
    token: bytes = jwt.encode(signer, claims)  # type: ignore[no-untyped-call]
    return token.decode("ascii")


def _segment(value: str) -> str:
    if not value or "/" in value:
        raise ValueError(f"{value!r} is not an organization, owner or repository name")
    return quote(value, safe="")


class GitHubApp:
    """One GitHub App at ``api_url``: installation tokens (cached, thread-safe) and
    just-in-time runners. ``now`` is the clock (timezone-aware)."""

    def __init__(
        self,
        app_id: int | str,
        private_key_pem: str,
        *,
        api_url: str = GITHUB_API,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        session: requests.Session | None = None,
    ) -> None:
        self.app_id = app_id
        self._key = private_key_pem
        self.api_url = api_url.rstrip("/")
        self._now = now
        self._session = session or requests.Session()
        self._tokens: dict[int, tuple[str, datetime]] = {}
        self._lock = threading.Lock()

    # Installation tokens.

    def installation_token(self, installation_id: int) -> str:
        """An access token of the installation: the cached one until 5 minutes before it
        expires, then a new one (``POST /app/installations/{id}/access_tokens``)."""
        with self._lock:
            cached = self._tokens.get(installation_id)
            if cached is not None and self._now() < cached[1] - TOKEN_MARGIN:
                return cached[0]
            bearer = app_jwt(self.app_id, self._key, self._now())
            body = self._send("POST", f"/app/installations/{int(installation_id)}/access_tokens",
                              bearer)  # fmt: skip
            token, expires = str(body["token"]), _timestamp(str(body["expires_at"]))
            self._tokens[installation_id] = (token, expires)
            return token

    def forget_token(self, installation_id: int) -> None:
        """Drop the installation's cached token (GitHub refused it)."""
        with self._lock:
            self._tokens.pop(installation_id, None)

    # Just-in-time runners.

    def generate_jit_config(
        self,
        installation_id: int,
        scope: RunnerScope,
        *,
        name: str,
        runner_group_id: int,
        labels: Sequence[str],
        work_folder: str | None = None,
    ) -> JitRunner:
        """A new just-in-time runner ``name`` in the runner group, with ``labels`` (GitHub
        takes 1 to 100 and says what it refuses: :class:`GitHubInvalid`)."""
        body: dict[str, Any] = {"name": name, "runner_group_id": int(runner_group_id),
                                "labels": list(labels)}  # fmt: skip
        if work_folder is not None:
            body["work_folder"] = work_folder
        answer = self._installation_call(
            installation_id, "POST", f"{scope.path}/actions/runners/generate-jitconfig", body
        )
        return JitRunner(int(answer["runner"]["id"]), str(answer["encoded_jit_config"]))

    def runner(self, installation_id: int, scope: RunnerScope, runner_id: int) -> Runner | None:
        """The runner, or None where GitHub has none by that id (404)."""
        answer = self._installation_call(
            installation_id,
            "GET",
            f"{scope.path}/actions/runners/{int(runner_id)}",
            missing_ok=True,
        )
        return None if answer is None else Runner.of(answer)

    def delete_runner(self, installation_id: int, scope: RunnerScope, runner_id: int) -> None:
        """Remove the runner; one already gone (404) counts as removed, so this is safe to
        repeat."""
        self._installation_call(
            installation_id,
            "DELETE",
            f"{scope.path}/actions/runners/{int(runner_id)}",
            missing_ok=True,
        )

    # HTTP.

    @overload
    def _installation_call(
        self,
        installation_id: int,
        method: str,
        path: str,
        body: Any = None,
        *,
        missing_ok: Literal[False] = False,
    ) -> dict[str, Any]: ...

    @overload
    def _installation_call(
        self,
        installation_id: int,
        method: str,
        path: str,
        body: Any = None,
        *,
        missing_ok: bool,
    ) -> dict[str, Any] | None: ...

    def _installation_call(
        self,
        installation_id: int,
        method: str,
        path: str,
        body: Any = None,
        *,
        missing_ok: bool = False,
    ) -> dict[str, Any] | None:
        """The call with the installation's token; with ``missing_ok``, None for a 404 of the
        call itself (not of the token's)."""
        token = self.installation_token(installation_id)
        try:
            return self._send(method, path, token, body)
        except GitHubUnauthorized:
            self.forget_token(installation_id)  # the next call asks for a new one
            raise
        except GitHubRefused as refused:
            if missing_ok and refused.status == 404:
                return None
            raise

    def _send(self, method: str, path: str, bearer: str, body: Any = None) -> dict[str, Any]:
        headers = {
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
            "Authorization": f"Bearer {bearer}",
            "User-Agent": USER_AGENT,
        }
        try:
            response = self._session.request(
                method, self.api_url + path, headers=headers, json=body, timeout=TIMEOUT_SECONDS
            )
        except requests.RequestException as error:
            raise GitHubUnavailable(0, f"{method} {path}: no answer from GitHub: "
                                       f"{type(error).__name__}") from None  # fmt: skip
        if response.status_code < 300:
            return _json(response) if response.content else {}
        raise self._refusal(response)

    def _refusal(self, response: requests.Response) -> GitHubError:
        status = response.status_code
        message = str(_json(response).get("message") or response.reason or "")
        if status in (403, 429) and (retry_at := self._retry_at(response, message)) is not None:
            return GitHubRateLimited(status, message, retry_at)
        if status == 401:
            return GitHubUnauthorized(status, message)
        if status == 422:
            return GitHubInvalid(status, message)
        if status >= 500:
            return GitHubUnavailable(status, message)
        return GitHubRefused(status, message)

    def _retry_at(self, response: requests.Response, message: str) -> datetime | None:
        """When a rate-limited request may be sent again, or None if this is no rate limit."""
        headers = response.headers
        retry_after = headers.get("retry-after", "").strip()
        if retry_after.isdigit():
            return self._now() + timedelta(seconds=int(retry_after))
        reset = headers.get("x-ratelimit-reset", "").strip()
        if headers.get("x-ratelimit-remaining", "").strip() == "0" and reset.isdigit():
            return datetime.fromtimestamp(int(reset), UTC)
        if response.status_code == 429 or "rate limit" in message.lower():
            return self._now() + SECONDARY_LIMIT_WAIT
        return None


def _json(response: requests.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except (ValueError, json.JSONDecodeError):
        return {}
    return body if isinstance(body, dict) else {}


def _timestamp(value: str) -> datetime:
    """GitHub's ``2016-07-11T22:14:10Z``, timezone-aware."""
    moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
