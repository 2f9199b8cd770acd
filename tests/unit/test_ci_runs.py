"""A CI job's VM runs its job: the agent function mints the VM's one-job runner at the barrier
and hands it to the agent once, the runner's exit ends the run, an idle runner is deleted and
its VM released (DESIGN "Work on the gang": the VM lives as long as its runner). Over the
in-memory world with the real runner adapter talking HTTP to the local GitHub and GitLab
stand-ins (emulators/github.py, checked against GitHub's OpenAPI description; emulators/gitlab.py).

Sources:
docs.github.com/en/rest/actions/self-hosted-runners#create-configuration-for-a-just-in-time-runner-for-an-organization
(``name``, ``runner_group_id``, ``labels``; the answer's ``encoded_jit_config``);
docs.github.com/en/rest/actions/self-hosted-runners#delete-a-self-hosted-runner-from-an-organization;
docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api (``retry-after``);
docs.gitlab.com/api/users/#create-a-runner-linked-to-a-user (``POST /user/runners``:
``runner_type``, ``project_id``, ``tag_list``, ``run_untagged``, ``locked``,
``maximum_timeout``; the ``create_runner`` scope); docs.gitlab.com/runner/commands/
(``run-single``, ``--max-builds``, ``--wait-timeout``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from emulators.github import GitHubEmulator, app_key_pair
from emulators.gitlab import FakeGitLab
from emulators.metadata import Instance, identity_claims
from emulators.signing import LocalSigner
from opendws.adapters.ci_runners import JITCONFIG_VARIABLE, ProviderRunners
from opendws.adapters.memory import MemoryNudger
from opendws.adapters.ranks import MemoryRankStore
from opendws.adapters.vm_identity import EMULATOR_ISSUER, VmIdentityVerifier
from opendws.domain.run import CiRunner, RunSpec
from opendws.domain.states import RequestState
from opendws.ports import order_name
from opendws.ports.ci import GITHUB_RUNNER_VERSION, Overrides, RunnerPrograms
from opendws.ports.configuration import CiMapping, GitHubRunners, GitLabRunners
from opendws.ports.runs import UnknownSecret
from opendws.service.agents import AgentService, Answer, Sessions
from opendws.service.release import EndReason, EndService
from tests.builders import A3, H100, flex, pool
from tests.world import World, memory_world, tenants_for

S = RequestState
ZONE = "us-central1-a"
AGENT_URL = "https://opendws-agent-123.us-central1.run.app"
PROJECT = "demo-opendws"
APP_ID, INSTALLATION, ORG, GROUP = 4242, 99, "acme", 7
KEY_SECRET = "projects/demo-opendws/secrets/github-app-key/versions/latest"
TOKEN_SECRET = "projects/demo-opendws/secrets/gitlab-token/versions/latest"
GITLAB_TOKEN = "glpat-opendws-runner-maker"
PROJECT_ID = 31
LABELS = ("gpu-h100", "self-hosted")
IDLE = timedelta(minutes=10)


@pytest.fixture(scope="module")
def app_key() -> tuple[str, str]:
    return app_key_pair()


class Secrets:
    """Secret Manager with the App's key and the GitLab token."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.reads: list[str] = []

    def read(self, version: str) -> str:
        self.reads.append(version)
        if version not in self.values:
            raise UnknownSecret(f"Secret [{version}] not found or has no versions.")
        return self.values[version]


@dataclass
class Vms:
    known: dict[str, tuple[str, str]]

    def vms(self, zone: str, order: str) -> dict[str, tuple[str, str]]:
        return {n: w for n, w in self.known.items() if n.rsplit("-", 1)[0] == order}


class Logs:
    def write(self, request_id: str, rank: int, lines: list[tuple[str, str]]) -> None:
        del request_id, rank, lines


@dataclass
class Kit:
    world: World
    service: AgentService
    ranks: MemoryRankStore
    signer: LocalSigner
    vm: str

    def register(self) -> str:
        instance = Instance(
            name=self.vm, instance_id="5000", zone=ZONE, project_id=PROJECT,
            project_number=123, internal_ip="10.0.0.2",
            service_account="opendws-vm@demo-opendws.iam.gserviceaccount.com",
            created_at=datetime.now(UTC),
        )  # fmt: skip
        token = self.signer.sign(identity_claims(instance, AGENT_URL, "full", datetime.now(UTC)))
        answer = self.service.handle("/v1/register", f"Bearer {token}", {})
        assert answer.status == 200, answer
        return f"Bearer {answer.body['session']}"

    def call(self, path: str, session: str, body: dict[str, Any] | None = None) -> Answer:
        return self.service.handle(path, session, body or {})

    def last_event(self) -> Any:
        return self.world.store.events("ci-job")[-1]


def kit(mapping: CiMapping, runner: CiRunner, secrets: Secrets, tenant: str = "t") -> Kit:
    world, cloud = memory_world([pool(zone=ZONE, capacity=8)], tenants_for(H100, names=("t", "u")))
    world.config.save(replace(world.config.load(), ci=(mapping,)))
    cloud.set_stock(ZONE, A3, 8)
    request = replace(
        flex("ci-job", vm_count=1, hours=6, locations=(ZONE,), tenant=tenant),
        run=RunSpec(command=(), runner=runner),
    )
    from tests.world import submit

    submit(world.store, request)
    world.run()
    world.clock.advance(timedelta(seconds=20))
    world.run()
    assert world.state("ci-job") is S.ACTIVE
    vm = f"{order_name('ci-job', 1)}-0"
    signer = LocalSigner("metadata", datetime.now(UTC))
    ranks = MemoryRankStore()
    ending = EndService(
        world.store, world.config, world.providers, None, world.bus, MemoryNudger(), world.clock
    )
    service = AgentService(
        store=world.store, ranks=ranks,
        verifier=VmIdentityVerifier(audience=AGENT_URL, project_id=PROJECT, certs=signer.certs,
                                    issuers=frozenset({EMULATOR_ISSUER})),
        order_vms=Vms({vm: (ZONE, "5000")}), secrets=secrets, logs=Logs(), ending=ending,
        sessions=Sessions(b"k" * 32, world.clock, timedelta(days=8)), clock=world.clock,
        config=world.config,
        runners=ProviderRunners(secrets, RunnerPrograms(gitlab_runner="/usr/bin/gitlab-runner")),
    )  # fmt: skip
    return Kit(world, service, ranks, signer, vm)


@pytest.fixture
def github(app_key: tuple[str, str]) -> Iterator[GitHubEmulator]:
    with GitHubEmulator() as server:
        server.state.register_app(APP_ID, app_key[1], [
            {"id": INSTALLATION, "account": ORG, "runner_groups": [GROUP]}])  # fmt: skip
        yield server


def github_mapping(server: GitHubEmulator, tenant: str = "t") -> CiMapping:
    return CiMapping(
        provider="github", labels=frozenset({"gpu-h100"}), template={"tenant": tenant},
        github=GitHubRunners(app_id=APP_ID, installation_id=INSTALLATION,
                             private_key_secret=KEY_SECRET, organization=ORG,
                             runner_group_id=GROUP, api_url=server.url),
        idle_timeout=IDLE,
    )  # fmt: skip


GH_RUNNER = CiRunner.of("github", LABELS, "acme/trainer")


def github_kit(server: GitHubEmulator, app_key: tuple[str, str], tenant: str = "t") -> Kit:
    return kit(github_mapping(server), GH_RUNNER, Secrets({KEY_SECRET: app_key[0]}), tenant)


def test_the_vm_gets_a_just_in_time_runner_with_the_jobs_labels_and_hands_it_over_once(
    github: GitHubEmulator, app_key: tuple[str, str]
) -> None:
    k = github_kit(github, app_key)
    session = k.register()
    ready = k.call("/v1/barrier", session)
    assert ready.status == 200
    assert ready.body["ready"] is True
    [runner] = github.state.runners()
    assert runner["name"] == k.vm
    assert runner["runner_group_id"] == GROUP
    assert sorted(label["name"] for label in runner["labels"]) == sorted(LABELS)
    assert ready.body["command"] == [f"/opt/actions-runner-{GITHUB_RUNNER_VERSION}/run.sh"]
    config = ready.body["env"][JITCONFIG_VARIABLE]
    assert config
    assert ready.body["env"]["RUNNER_ALLOW_RUNASROOT"] == "1"
    assert ready.body["install"]["creates"] == "run.sh"
    assert ready.body["install"]["url"].startswith("https://github.com/actions/runner/releases/")
    # Its id is kept, never the config: not in the request, its events, the ranks or the bus.
    [rank] = k.ranks.ranks("ci-job")
    assert rank.runner_id == str(runner["id"])
    kept = repr(k.world.record("ci-job")) + repr(k.world.store.events("ci-job"))
    assert config not in kept + repr(k.ranks.ranks("ci-job")) + repr(k.world.bus.published)


def test_an_agent_that_asks_again_gets_a_new_runner_and_the_unused_one_is_deleted(
    github: GitHubEmulator, app_key: tuple[str, str]
) -> None:
    k = github_kit(github, app_key)
    session = k.register()
    first = k.call("/v1/barrier", session).body["env"][JITCONFIG_VARIABLE]
    [before] = github.state.runners()
    second = k.call("/v1/barrier", session).body["env"][JITCONFIG_VARIABLE]
    [after] = github.state.runners()
    assert first != second
    assert after["id"] != before["id"]
    assert after["name"] == k.vm
    assert k.ranks.ranks("ci-job")[0].runner_id == str(after["id"])


def test_the_runners_exit_ends_the_run_and_the_runner_is_deleted(
    github: GitHubEmulator, app_key: tuple[str, str]
) -> None:
    k = github_kit(github, app_key)
    session = k.register()
    config = k.call("/v1/barrier", session).body["env"][JITCONFIG_VARIABLE]
    job = github.state.queue_job("acme/trainer", list(LABELS))
    github.state.take_job(config)
    github.state.complete_job(job["id"], "success")  # GitHub removes the JIT runner
    assert k.call("/v1/exit", session, {"code": 0}).status == 200
    assert k.world.state("ci-job") is S.RELEASED
    assert k.last_event().reason == EndReason.JOB_SUCCEEDED
    assert github.state.runners() == []


def test_a_runner_exiting_non_zero_fails_the_run(
    github: GitHubEmulator, app_key: tuple[str, str]
) -> None:
    k = github_kit(github, app_key)
    session = k.register()
    k.call("/v1/barrier", session)
    k.call("/v1/exit", session, {"code": 1})
    assert (k.world.state("ci-job"), k.last_event().reason) == (S.RELEASED, EndReason.JOB_FAILED)


def test_a_runner_that_takes_no_job_within_the_idle_time_is_deleted_and_its_vm_released(
    github: GitHubEmulator, app_key: tuple[str, str]
) -> None:
    k = github_kit(github, app_key)
    session = k.register()
    k.call("/v1/barrier", session)
    k.world.clock.advance(IDLE - timedelta(seconds=1))
    k.call("/v1/heartbeat", session, {"state": "running"})
    assert k.service.sweep() == []
    k.world.clock.advance(timedelta(seconds=2))
    assert k.service.sweep() == ["ci-job"]
    assert k.world.state("ci-job") is S.RELEASED
    event = k.last_event()
    assert event.reason == EndReason.RUNNER_IDLE
    assert "took no job within 10m" in event.message
    assert github.state.runners() == []


def test_a_runner_running_a_job_is_never_taken_for_idle(
    github: GitHubEmulator, app_key: tuple[str, str]
) -> None:
    k = github_kit(github, app_key)
    session = k.register()
    config = k.call("/v1/barrier", session).body["env"][JITCONFIG_VARIABLE]
    job = github.state.queue_job("acme/trainer", list(LABELS))
    assert github.state.take_job(config)["job"]["id"] == job["id"]
    k.world.clock.advance(IDLE * 3)
    k.call("/v1/heartbeat", session, {"state": "running"})
    assert k.service.sweep() == []
    assert k.world.state("ci-job") is S.ACTIVE
    assert github.state.runners()[0]["busy"] is True


def test_a_revoked_installation_fails_the_run_saying_so_and_is_not_retried(
    github: GitHubEmulator, app_key: tuple[str, str]
) -> None:
    k = github_kit(github, app_key)
    github.state.revoke_installation(INSTALLATION)
    session = k.register()
    answer = k.call("/v1/barrier", session)
    assert answer.status == 410
    assert k.world.state("ci-job") is S.RELEASED
    event = k.last_event()
    assert event.reason == EndReason.JOB_FAILED
    assert "GitHub refused to mint a just-in-time runner" in event.message
    assert "404" in event.message or "401" in event.message


def test_a_rate_limit_makes_the_agent_wait_as_long_as_github_asks(
    github: GitHubEmulator, app_key: tuple[str, str]
) -> None:
    k = github_kit(github, app_key)
    session = k.register()
    github.state.fail_next(429, "API rate limit exceeded", headers={"retry-after": "45"}, times=9)
    answer = k.call("/v1/barrier", session)
    assert answer.status == 200
    assert answer.body["ready"] is False
    assert answer.body["retry_after_s"] >= 44
    assert k.world.state("ci-job") is S.ACTIVE


def test_a_run_of_a_tenant_no_runner_mapping_serves_fails_naming_why(
    github: GitHubEmulator, app_key: tuple[str, str]
) -> None:
    k = github_kit(github, app_key, tenant="u")
    answer = k.call("/v1/barrier", k.register())
    assert answer.status == 410
    assert "no github CI mapping of tenant 'u'" in k.last_event().message
    assert github.state.runners() == []


def test_the_app_key_that_cannot_be_read_fails_the_run_naming_the_secret(
    github: GitHubEmulator,
) -> None:
    k = kit(github_mapping(github), GH_RUNNER, Secrets({}))
    assert k.call("/v1/barrier", k.register()).status == 410
    assert KEY_SECRET in k.last_event().message


# GitLab ---------------------------------------------------------------------------------


@pytest.fixture
def gitlab() -> Iterator[FakeGitLab]:
    with FakeGitLab() as server:
        server.add_project(PROJECT_ID)
        server.add_token(GITLAB_TOKEN, scopes=("create_runner", "manage_runner"),
                         owner_of_projects=(PROJECT_ID,))  # fmt: skip
        server.add_token("glpat-no-scope", scopes=("read_api",), owner_of_projects=(PROJECT_ID,))
        yield server


def gitlab_kit(server: FakeGitLab, token: str = GITLAB_TOKEN) -> Kit:
    mapping = CiMapping(
        provider="gitlab", labels=frozenset({"gpu-a100"}), template={"tenant": "t"},
        gitlab=GitLabRunners(url=server.url, token_secret=TOKEN_SECRET), idle_timeout=IDLE,
    )  # fmt: skip
    runner = CiRunner.of("gitlab", ("gpu-a100",), str(PROJECT_ID))
    return kit(mapping, runner, Secrets({TOKEN_SECRET: token}))


def test_a_gitlab_job_gets_a_locked_project_runner_with_its_tags_and_run_single(
    gitlab: FakeGitLab,
) -> None:
    k = gitlab_kit(gitlab)
    ready = k.call("/v1/barrier", k.register())
    assert ready.status == 200, ready
    [runner] = gitlab.runners()
    assert runner.runner_type == "project_type"
    assert runner.tags == ("gpu-a100",)
    assert (runner.locked, runner.run_untagged) == (True, False)
    assert runner.maximum_timeout == 6 * 3600
    assert runner.description == k.vm
    argv = ready.body["command"]
    assert argv[:2] == ["/usr/bin/gitlab-runner", "run-single"]
    assert argv[argv.index("--url") + 1] == gitlab.url
    assert argv[argv.index("--max-builds") + 1] == "1"
    assert argv[argv.index("--wait-timeout") + 1] == str(int(IDLE.total_seconds()))
    token = ready.body["env"]["CI_SERVER_TOKEN"]
    assert token not in " ".join(argv)
    assert token not in repr(k.world.store.events("ci-job")) + repr(k.ranks.ranks("ci-job"))
    assert k.ranks.ranks("ci-job")[0].runner_id == str(runner.id)


def test_a_gitlab_runner_is_deleted_when_its_run_ends(gitlab: FakeGitLab) -> None:
    import requests

    k = gitlab_kit(gitlab)
    session = k.register()
    token = k.call("/v1/barrier", session).body["env"]["CI_SERVER_TOKEN"]
    gitlab.queue_job(PROJECT_ID, tags=["gpu-a100"])
    taken = requests.post(f"{gitlab.url}/api/v4/jobs/request", json={"token": token}, timeout=10)
    assert taken.status_code == 201  # the runner took the job (as run-single asks)
    k.call("/v1/exit", session, {"code": 0})
    assert (k.world.state("ci-job"), k.last_event().reason) == (
        S.RELEASED, EndReason.JOB_SUCCEEDED)  # fmt: skip
    assert gitlab.runners() == []


def test_a_gitlab_runner_that_waited_in_vain_ends_the_run_as_idle(gitlab: FakeGitLab) -> None:
    """run-single exits 0 at its --wait-timeout with no job (docs.gitlab.com/runner/commands/)."""
    k = gitlab_kit(gitlab)
    session = k.register()
    k.call("/v1/barrier", session)
    k.call("/v1/exit", session, {"code": 0})
    assert k.last_event().reason == EndReason.RUNNER_IDLE
    assert gitlab.runners() == []


def test_a_gitlab_token_without_create_runner_fails_the_run_with_gitlabs_403(
    gitlab: FakeGitLab,
) -> None:
    k = gitlab_kit(gitlab, token="glpat-no-scope")
    assert k.call("/v1/barrier", k.register()).status == 410
    message = k.last_event().message
    assert "GitLab refused to create a runner" in message
    assert "403" in message
    assert gitlab.runners() == []


def test_an_idle_gitlab_runner_is_deleted_and_its_vm_released(gitlab: FakeGitLab) -> None:
    k = gitlab_kit(gitlab)
    session = k.register()
    k.call("/v1/barrier", session)
    k.world.clock.advance(IDLE + timedelta(seconds=1))
    k.call("/v1/heartbeat", session, {"state": "running"})
    assert k.service.sweep() == ["ci-job"]
    assert k.last_event().reason == EndReason.RUNNER_IDLE
    assert gitlab.runners() == []


def test_overrides_point_a_mapping_at_another_server_and_read_the_key_from_a_file(
    github: GitHubEmulator, app_key: tuple[str, str], tmp_path: Path
) -> None:
    """OPENDWS_GITHUB_API_URL and OPENDWS_GITHUB_APP_KEY_FILE, as ``dws up`` sets them."""
    key_file = tmp_path / "app.pem"
    key_file.write_text(app_key[0])
    secrets = Secrets({})
    runners = ProviderRunners(
        secrets, overrides=Overrides(github_api_url=github.url, github_app_key_file=str(key_file))
    )
    mapping = replace(github_mapping(github), github=replace(
        github_mapping(github).github, api_url="https://api.github.com"))  # type: ignore[type-var]  # fmt: skip
    launch = runners.launch(mapping, GH_RUNNER, "odws-x-1-0", timedelta(hours=1))
    assert [r["id"] for r in github.state.runners()] == [int(launch.runner_id)]
    assert secrets.reads == []


def test_an_outage_makes_the_agent_ask_again_later(
    github: GitHubEmulator, app_key: tuple[str, str]
) -> None:
    """A 5xx is worth another try, not a failed run (docs.github.com/en/rest/using-the-rest-api/
    troubleshooting-the-rest-api); with no time of GitHub's own, ten seconds later."""
    k = github_kit(github, app_key)
    session = k.register()
    github.state.fail_next(503, "Service Unavailable", times=9)
    answer = k.call("/v1/barrier", session)
    assert (answer.status, answer.body["ready"]) == (200, False)
    assert answer.body["retry_after_s"] >= 10
    assert k.world.state("ci-job") is S.ACTIVE


def test_the_runner_of_a_lost_agent_is_deleted_with_its_run(
    github: GitHubEmulator, app_key: tuple[str, str]
) -> None:
    k = github_kit(github, app_key)
    k.call("/v1/barrier", k.register())
    assert len(github.state.runners()) == 1
    k.world.clock.advance(timedelta(minutes=2))  # no heartbeat since
    assert k.service.sweep() == ["ci-job"]
    assert k.last_event().reason == EndReason.AGENT_LOST
    assert github.state.runners() == []


def test_the_ci_settings_come_from_the_environment() -> None:
    from opendws.bootstrap import Settings
    from opendws.ports.ci import GITHUB_RUNNER_INSTALL

    settings = Settings.from_environment({
        "OPENDWS_GITHUB_API_URL": "http://127.0.0.1:9", "OPENDWS_GITHUB_APP_ID": "77",
        "OPENDWS_GITHUB_APP_KEY_FILE": "/run/app.pem", "OPENDWS_GITLAB_URL": "http://127.0.0.1:8",
        "OPENDWS_GITLAB_TOKEN_FILE": "/run/token", "OPENDWS_GITHUB_RUNNER_DIR": "/opt/runner",
        "OPENDWS_GITLAB_RUNNER": "/usr/local/bin/gitlab-runner",
    })  # fmt: skip
    assert settings.ci_overrides == Overrides(
        github_api_url="http://127.0.0.1:9", github_app_id=77, github_app_key_file="/run/app.pem",
        gitlab_url="http://127.0.0.1:8", gitlab_token_file="/run/token",
    )  # fmt: skip
    assert settings.ci_programs == RunnerPrograms(
        github_dir="/opt/runner", github_install=None, gitlab_runner="/usr/local/bin/gitlab-runner"
    )
    default = Settings.from_environment({}).ci_programs
    assert (default.github_install, default.gitlab_runner) == (
        GITHUB_RUNNER_INSTALL,
        "gitlab-runner",
    )
    with pytest.raises(ValueError, match="OPENDWS_GITHUB_APP_ID"):
        Settings.from_environment({"OPENDWS_GITHUB_APP_ID": "app"})
    mapping = github_mapping_for_override()
    overridden = Overrides(github_app_id=77).github(mapping)
    assert overridden.app_id == 77


def github_mapping_for_override() -> GitHubRunners:
    return GitHubRunners(app_id=1, installation_id=2, private_key_secret=KEY_SECRET,
                         organization=ORG)  # fmt: skip
