"""The GitHub App client (opendws.adapters.github_app) against the fake GitHub API
(emulators.github), and the fake against GitHub's published OpenAPI description
(``@octokit/openapi`` 23.0.2, vendored in emulators/data/github-openapi-subset.json).

Sources:
docs.github.com/en/apps/creating-github-apps/authenticating-with-a-github-app/generating-a-json-web-token-jwt-for-a-github-app
(RS256, ``iss``, ``iat`` 60 s back, ``exp`` at most 10 minutes ahead);
docs.github.com/en/apps/creating-github-apps/authenticating-with-a-github-app/authenticating-as-a-github-app-installation
and docs.github.com/en/rest/apps/apps#create-an-installation-access-token-for-an-app (the
token, good for 1 hour);
docs.github.com/en/rest/actions/self-hosted-runners#create-configuration-for-a-just-in-time-runner-for-an-organization
(``name``, ``runner_group_id``, ``labels`` 1–100 required; 201 ``{runner,
encoded_jit_config}``; 404, 409, 422) and the get/delete operations beside it;
docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api ("Exceeding the rate
limit": ``retry-after``; ``x-ratelimit-remaining: 0`` and ``x-ratelimit-reset``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests
from google.auth import crypt, jwt

from emulators.github import GitHubEmulator, app_key_pair, response_schema, validate
from opendws.adapters.github_app import (
    GitHubApp,
    GitHubInvalid,
    GitHubRateLimited,
    GitHubRefused,
    GitHubUnauthorized,
    GitHubUnavailable,
    RunnerScope,
    app_jwt,
)
from opendws.clock import ManualClock

APP_ID, INSTALLATION, ORG, GROUP = 12345, 777, "acme", 3
START = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
JOB_LABELS = ["self-hosted", "gpu-h100"]


@pytest.fixture(scope="module")
def keys() -> tuple[str, str]:
    return app_key_pair()


@dataclass
class World:
    github: GitHubEmulator
    app: GitHubApp
    clock: ManualClock
    private_key: str

    def token(self) -> str:
        return self.app.installation_token(INSTALLATION)

    def post(self, path: str, body: Any, token: str | None = None) -> requests.Response:
        headers = {"Authorization": f"Bearer {token or self.token()}",
                   "Accept": "application/vnd.github+json"}  # fmt: skip
        return requests.post(self.github.url + path, json=body, headers=headers, timeout=10)


@pytest.fixture
def world(keys: tuple[str, str]) -> Iterator[World]:
    private, public = keys
    clock = ManualClock(START)
    with GitHubEmulator(now=clock.now) as github:
        github.state.register_app(APP_ID, public, [
            {"id": INSTALLATION, "account": ORG, "runner_groups": [GROUP]},
        ])  # fmt: skip
        yield World(github, GitHubApp(APP_ID, private, api_url=github.url, now=clock.now),
                    clock, private)  # fmt: skip


ORG_SCOPE = RunnerScope.organization(ORG)
JIT = f"/orgs/{ORG}/actions/runners/generate-jitconfig"


def jit_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "req-1-0", "runner_group_id": GROUP, "labels": JOB_LABELS}
    body.update(changes)
    return {key: value for key, value in body.items() if value is not None}


def test_a_runner_from_token_to_jit_config_to_removal(world: World) -> None:
    """Mint the App's JWT → an installation token (kept, not asked for again) → a JIT runner
    with the job's labels in the runner group → read it (offline, not busy) → delete it →
    delete it again: GitHub answers 404, which counts as removed."""
    token = world.token()
    assert token.startswith("ghs_")
    assert world.token() == token  # cached: one POST …/access_tokens

    jit = world.app.generate_jit_config(INSTALLATION, ORG_SCOPE, name="req-1-0",
                                        runner_group_id=GROUP, labels=JOB_LABELS)  # fmt: skip
    assert jit.encoded_jit_config
    assert jit.encoded_jit_config not in repr(jit)  # a credential: never in a log line

    runner = world.app.runner(INSTALLATION, ORG_SCOPE, jit.runner_id)
    assert runner is not None
    assert (runner.name, runner.status, runner.busy) == ("req-1-0", "offline", False)
    assert runner.labels == tuple(JOB_LABELS)

    world.app.delete_runner(INSTALLATION, ORG_SCOPE, jit.runner_id)
    assert world.app.runner(INSTALLATION, ORG_SCOPE, jit.runner_id) is None
    world.app.delete_runner(INSTALLATION, ORG_SCOPE, jit.runner_id)  # 404: already gone


def test_the_token_is_renewed_five_minutes_before_it_expires(world: World) -> None:
    token = world.token()
    world.clock.advance(timedelta(minutes=54))
    assert world.token() == token
    world.clock.advance(timedelta(minutes=1, seconds=1))
    assert world.token() != token


def test_an_expired_installation_token_is_refused_401_bad_credentials(world: World) -> None:
    """A token lives 1 hour; after that GitHub answers 401 "Bad credentials"."""
    token = world.token()
    world.clock.advance(timedelta(hours=1))
    answer = world.post(JIT, jit_body(), token=token)
    assert answer.status_code == 401
    assert answer.json()["message"] == "Bad credentials"


def test_a_token_the_fake_never_issued_is_refused(world: World) -> None:
    answer = world.post(JIT, jit_body(), token="ghs_" + "x" * 36)
    assert answer.status_code == 401


def test_a_revoked_installation_is_unauthorized_and_not_retried_forever(world: World) -> None:
    """The client caches a token; the App is uninstalled: the next call is a 401 the caller
    reports (GitHubUnauthorized), and the cached token is dropped, so the next attempt asks
    for a new one (404: no such installation) instead of reusing a dead one."""
    world.token()
    world.github.state.revoke_installation(INSTALLATION)
    with pytest.raises(GitHubUnauthorized):
        world.app.runner(INSTALLATION, ORG_SCOPE, 1)
    with pytest.raises(GitHubRefused) as refused:
        world.app.runner(INSTALLATION, ORG_SCOPE, 1)
    assert refused.value.status == 404


def test_a_rate_limit_with_retry_after_says_when_to_retry(world: World) -> None:
    world.token()
    world.github.state.fail_next(
        429, "You have exceeded a secondary rate limit.", headers={"Retry-After": "30"}
    )
    with pytest.raises(GitHubRateLimited) as limited:
        world.app.runner(INSTALLATION, ORG_SCOPE, 1)
    assert limited.value.retry_at == START + timedelta(seconds=30)


def test_a_spent_primary_limit_waits_for_x_ratelimit_reset(world: World) -> None:
    world.token()
    reset = int((START + timedelta(minutes=17)).timestamp())
    world.github.state.fail_next(403, "API rate limit exceeded for installation ID 777.",
                                 headers={"x-ratelimit-remaining": "0",
                                          "x-ratelimit-reset": str(reset)})  # fmt: skip
    with pytest.raises(GitHubRateLimited) as limited:
        world.app.runner(INSTALLATION, ORG_SCOPE, 1)
    assert limited.value.retry_at == START + timedelta(minutes=17)


def test_a_403_that_is_no_rate_limit_is_a_refusal(world: World) -> None:
    world.token()
    world.github.state.fail_next(403, "Resource not accessible by integration")
    with pytest.raises(GitHubRefused) as refused:
        world.app.runner(INSTALLATION, ORG_SCOPE, 1)
    assert not isinstance(refused.value, GitHubRateLimited)


def test_a_5xx_is_unavailable_and_retryable(world: World) -> None:
    world.token()
    world.github.state.fail_next(502, "Server Error")
    with pytest.raises(GitHubUnavailable):
        world.app.runner(INSTALLATION, ORG_SCOPE, 1)
    assert world.app.runner(INSTALLATION, ORG_SCOPE, 1) is None  # the next call goes through


# What GitHub's description refuses (each would pass on a fake that accepts anything).


def test_more_than_100_labels_is_422_naming_the_field(world: World) -> None:
    """``labels``: maxItems 100."""
    with pytest.raises(GitHubInvalid) as invalid:
        world.app.generate_jit_config(INSTALLATION, ORG_SCOPE, name="req-1-0",
                                      runner_group_id=GROUP,
                                      labels=[f"l{i}" for i in range(101)])  # fmt: skip
    assert invalid.value.status == 422
    assert invalid.value.message.startswith("Invalid request.")
    assert "properties/labels" in invalid.value.message
    assert world.github.state.runners() == []


def test_exactly_100_labels_are_taken(world: World) -> None:
    labels = [f"l{i}" for i in range(100)]
    jit = world.app.generate_jit_config(INSTALLATION, ORG_SCOPE, name="req-1-0",
                                        runner_group_id=GROUP, labels=labels)  # fmt: skip
    runner = world.app.runner(INSTALLATION, ORG_SCOPE, jit.runner_id)
    assert runner is not None
    assert len(runner.labels) == 100


def test_no_labels_is_422(world: World) -> None:
    """``labels``: minItems 1."""
    answer = world.post(JIT, jit_body(labels=[]))
    assert answer.status_code == 422
    assert "properties/labels" in answer.json()["message"]


@pytest.mark.parametrize("missing", ["runner_group_id", "name", "labels"])
def test_a_missing_required_field_is_422(world: World, missing: str) -> None:
    """``required: [name, runner_group_id, labels]``; GitHub says ``"X" wasn't supplied.``"""
    body = jit_body()
    del body[missing]
    answer = world.post(JIT, body)
    assert answer.status_code == 422
    error = answer.json()
    assert error["message"] == f'Invalid request.\n\n"{missing}" wasn\'t supplied.'
    assert error["status"] == "422"
    assert error["documentation_url"].endswith(
        "#create-configuration-for-a-just-in-time-runner-for-an-organization"
    )


def test_a_wrongly_typed_field_is_422(world: World) -> None:
    answer = world.post(JIT, jit_body(runner_group_id="3"))
    assert answer.status_code == 422
    assert answer.json()["message"] == (
        "Invalid request.\n\nFor 'properties/runner_group_id', \"3\" is not an integer."
    )


def test_an_unknown_runner_group_is_404(world: World) -> None:
    answer = world.post(JIT, jit_body(runner_group_id=99999))
    assert answer.status_code == 404


def test_a_name_already_taken_is_409(world: World) -> None:
    assert world.post(JIT, jit_body()).status_code == 201
    answer = world.post(JIT, jit_body())
    assert answer.status_code == 409
    assert answer.json()["message"] == (
        "Already exists - A runner with the name req-1-0 already exists."
    )


def test_another_organization_is_not_found(world: World) -> None:
    answer = world.post("/orgs/other/actions/runners/generate-jitconfig", jit_body())
    assert answer.status_code == 404


def test_the_answers_match_the_description(world: World) -> None:
    """The fake's 201s and 200 validate against the response schemas of the description."""
    token = world.post(f"/app/installations/{INSTALLATION}/access_tokens", None,
                       token=app_jwt(APP_ID, world.private_key, START))  # fmt: skip
    assert token.status_code == 201
    assert validate(response_schema("apps/create-installation-access-token", 201),
                    token.json()) == []  # fmt: skip
    created = world.post(JIT, jit_body())
    assert created.status_code == 201
    assert validate(response_schema("actions/generate-runner-jitconfig-for-org", 201),
                    created.json()) == []  # fmt: skip
    runner = requests.get(f"{world.github.url}/orgs/{ORG}/actions/runners/"
                          f"{created.json()['runner']['id']}",
                          headers={"Authorization": f"Bearer {world.token()}"},
                          timeout=10)  # fmt: skip
    assert validate(response_schema("actions/get-self-hosted-runner-for-org", 200),
                    runner.json()) == []  # fmt: skip


# The App's JWT as the fake checks it.


def test_a_jwt_expiring_more_than_10_minutes_ahead_is_refused(world: World) -> None:
    """GitHub: "'Expiration time' claim ('exp') is too far in the future" (401)."""
    now = int(START.timestamp())
    too_long = signed(world.private_key, {"iat": now - 60, "exp": now + 601, "iss": APP_ID})
    answer = world.post(f"/app/installations/{INSTALLATION}/access_tokens", None, token=too_long)
    assert answer.status_code == 401
    assert answer.json()["message"] == "'Expiration time' claim ('exp') is too far in the future"
    just_right = signed(world.private_key, {"iat": now - 60, "exp": now + 600, "iss": APP_ID})
    answer = world.post(f"/app/installations/{INSTALLATION}/access_tokens", None,
                        token=just_right)  # fmt: skip
    assert answer.status_code == 201


def signed(private_key: str, claims: dict[str, Any]) -> str:
    """``claims`` as an RS256 JWT signed with ``private_key``, whatever they say."""
    token: bytes = jwt.encode(crypt.RSASigner.from_string(private_key), claims)
    return token.decode()


def test_an_expired_jwt_is_refused(world: World) -> None:
    old = app_jwt(APP_ID, world.private_key, START)
    world.clock.advance(timedelta(minutes=9))
    answer = world.post(f"/app/installations/{INSTALLATION}/access_tokens", None, token=old)
    assert answer.status_code == 401


def test_a_jwt_signed_by_another_key_cannot_be_decoded(world: World) -> None:
    other, _ = app_key_pair()
    with pytest.raises(GitHubUnauthorized) as refused:
        GitHubApp(APP_ID, other, api_url=world.github.url,
                  now=world.clock.now).installation_token(INSTALLATION)  # fmt: skip
    assert refused.value.message == "A JSON web token could not be decoded"


def test_an_installation_of_another_app_is_not_found(world: World) -> None:
    with pytest.raises(GitHubRefused) as refused:
        world.app.installation_token(INSTALLATION + 1)
    assert refused.value.status == 404


# The stand-in runner's side.


def test_a_jit_runner_takes_one_matching_job_and_is_gone_after_it(world: World) -> None:
    state = world.github.state
    other = state.queue_job(f"{ORG}/web", ["self-hosted", "gpu-a100"])
    job = state.queue_job(f"{ORG}/train", JOB_LABELS)
    jit = world.app.generate_jit_config(INSTALLATION, ORG_SCOPE, name="req-1-0",
                                        runner_group_id=GROUP, labels=JOB_LABELS)  # fmt: skip
    taken = state.take_job(jit.encoded_jit_config)
    assert taken["job"]["id"] == job["id"]
    assert taken["job"]["runner_name"] == "req-1-0"
    runner = world.app.runner(INSTALLATION, ORG_SCOPE, jit.runner_id)
    assert runner is not None
    assert (runner.status, runner.busy) == ("online", True)
    with pytest.raises(GitHubInvalid):  # GitHub refuses to remove a runner running a job
        world.app.delete_runner(INSTALLATION, ORG_SCOPE, jit.runner_id)

    done = state.complete_job(job["id"], "failure")
    assert (done["status"], done["conclusion"]) == ("completed", "failure")
    assert world.app.runner(INSTALLATION, ORG_SCOPE, jit.runner_id) is None
    assert next(j for j in state.jobs() if j["id"] == other["id"])["status"] == "queued"


def test_a_jit_config_is_used_once(world: World) -> None:
    jit = world.app.generate_jit_config(INSTALLATION, ORG_SCOPE, name="req-1-0",
                                        runner_group_id=GROUP, labels=JOB_LABELS)  # fmt: skip
    assert world.github.state.take_job(jit.encoded_jit_config)["job"] is None
    admin = requests.post(f"{world.github.url}/_admin/runner/take",
                          json={"jit_config": jit.encoded_jit_config}, timeout=10)  # fmt: skip
    assert admin.status_code == 409


def test_repository_runners_need_the_repository_selected_and_administration(
    keys: tuple[str, str],
) -> None:
    """Repository runners: the installation must cover the repository (else 404) and grant
    ``administration`` write (else 403 "Resource not accessible by integration")."""
    private, public = keys
    clock = ManualClock(START)
    with GitHubEmulator(now=clock.now) as github:
        github.state.register_app(APP_ID, public, [
            {"id": 1, "account": "octo", "repositories": ["train"]},
            {"id": 2, "account": "octo", "permissions": {"organization_self_hosted_runners":
                                                         "write"}},
        ])  # fmt: skip
        app = GitHubApp(APP_ID, private, api_url=github.url, now=clock.now)
        train = RunnerScope.repository("octo", "train")
        jit = app.generate_jit_config(1, train, name="r", runner_group_id=1, labels=JOB_LABELS)
        assert app.runner(1, train, jit.runner_id) is not None
        with pytest.raises(GitHubRefused) as elsewhere:
            app.generate_jit_config(1, RunnerScope.repository("octo", "web"), name="r",
                                    runner_group_id=1, labels=JOB_LABELS)  # fmt: skip
        assert elsewhere.value.status == 404
        with pytest.raises(GitHubRefused) as forbidden:
            app.generate_jit_config(2, train, name="r2", runner_group_id=1, labels=JOB_LABELS)
        assert forbidden.value.status == 403
        assert forbidden.value.message == "Resource not accessible by integration"


def test_the_admin_api_over_http(keys: tuple[str, str]) -> None:
    """What a stand-in runner program and the local stack do over HTTP: register an App,
    queue a job, take it with the runner's JIT config, complete it, see jobs and runners."""
    private, public = keys
    with GitHubEmulator() as github:
        admin = f"{github.url}/_admin"
        installations = [{"id": INSTALLATION, "account": ORG}]
        app_spec: dict[str, Any] = {"id": APP_ID, "public_key": public,
                                    "installations": installations}  # fmt: skip
        assert requests.post(f"{admin}/apps", json=app_spec, timeout=10).status_code == 201
        queued = {"repository": f"{ORG}/train", "labels": JOB_LABELS}
        job = requests.post(f"{admin}/jobs", json=queued, timeout=10).json()
        app = GitHubApp(APP_ID, private, api_url=github.url)
        jit = app.generate_jit_config(INSTALLATION, ORG_SCOPE, name="req-1-0",
                                      runner_group_id=1, labels=JOB_LABELS)  # fmt: skip
        runners = requests.get(f"{admin}/runners", timeout=10).json()
        assert [r["name"] for r in runners] == ["req-1-0"]
        assert "encoded_jit_config" not in runners[0]
        started = {"jit_config": jit.encoded_jit_config}
        taken = requests.post(f"{admin}/runner/take", json=started, timeout=10).json()
        assert taken["job"]["id"] == job["id"]
        done = requests.post(f"{admin}/jobs/{job['id']}/complete",
                             json={"conclusion": "success"}, timeout=10).json()  # fmt: skip
        assert done["conclusion"] == "success"
        assert requests.get(f"{admin}/jobs", timeout=10).json()[0]["status"] == "completed"
        assert requests.get(f"{admin}/runners", timeout=10).json() == []
        fault: dict[str, Any] = {"status": 503, "message": "Service Unavailable", "times": 1}
        assert requests.post(f"{admin}/faults", json=fault, timeout=10).status_code == 201
        with pytest.raises(GitHubUnavailable):
            app.runner(INSTALLATION, ORG_SCOPE, jit.runner_id)


def test_a_secondary_limit_without_headers_waits_a_minute(world: World) -> None:
    """ "Otherwise, wait for at least one minute before retrying"."""
    world.token()
    world.github.state.fail_next(403, "You have exceeded a secondary rate limit.")
    with pytest.raises(GitHubRateLimited) as limited:
        world.app.runner(INSTALLATION, ORG_SCOPE, 1)
    assert limited.value.retry_at == START + timedelta(minutes=1)


def test_no_answer_at_all_is_unavailable(keys: tuple[str, str]) -> None:
    with GitHubEmulator() as github:
        url = github.url  # a port nothing listens on once it stops
    with pytest.raises(GitHubUnavailable):
        GitHubApp(APP_ID, keys[0], api_url=url).installation_token(INSTALLATION)
