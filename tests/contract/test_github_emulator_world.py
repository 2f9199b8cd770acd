"""The fake GitHub's world around a just-in-time runner (emulators.github): the JIT config a
runner is started with, the ``workflow_job`` webhooks GitHub sends as a job is queued, taken
and completed, and the stand-in runner program (emulators/runners/actions-runner/run.sh).

Sources:
actions/runner src/Runner.Listener/Runner.cs (the JIT config is base64 of a JSON object of
the runner's files, each base64; ``.runner`` and ``.credentials`` as
src/Runner.Common/ConfigurationStore.cs and CredentialData.cs name their fields;
ChristopherHX/github-act-runner#138 lists the three files);
docs.github.com/en/rest/actions/self-hosted-runners#create-configuration-for-a-just-in-time-runner-for-an-organization.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from emulators.github import GitHubEmulator
from opendws.adapters.github_app import GitHubApp, JitRunner, RunnerScope

APP_ID, INSTALLATION, ORG, GROUP = 4321, 99, "acme", 3
REPOSITORY = f"{ORG}/train"
LABELS = ["self-hosted", "gpu-h100"]


@pytest.fixture(scope="module")
def app_key() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()  # fmt: skip
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


@dataclass
class World:
    github: GitHubEmulator
    app: GitHubApp

    def runner(self, name: str = "req-1-0") -> JitRunner:
        return self.app.generate_jit_config(INSTALLATION, RunnerScope.organization(ORG),
                                            name=name, runner_group_id=GROUP,
                                            labels=LABELS)  # fmt: skip


@pytest.fixture
def world(app_key: tuple[str, str]) -> Iterator[World]:
    private, public = app_key
    with GitHubEmulator() as github:
        github.state.register_app(APP_ID, public, [
            {"id": INSTALLATION, "account": ORG, "runner_groups": [GROUP]},
        ])  # fmt: skip
        yield World(github, GitHubApp(APP_ID, private, api_url=github.url))


def files_of(encoded_jit_config: str) -> dict[str, dict[str, object]]:
    """The runner's files a JIT config holds, decoded as Runner.Listener decodes them."""
    files = json.loads(base64.b64decode(encoded_jit_config))
    return {name: json.loads(base64.b64decode(content)) for name, content in files.items()}


def test_a_jit_config_holds_the_runners_files_naming_the_server(world: World) -> None:
    """The config is base64 of ``{".runner", ".credentials", ".credentials_rsaparams"}``,
    each base64 JSON; ``.runner`` names the runner (``agentId``, ``agentName``), its group
    (``poolId``) and the server it talks to (``serverUrl``, here the fake's own address)."""
    jit = world.runner()
    files = files_of(jit.encoded_jit_config)
    assert set(files) == {".runner", ".credentials", ".credentials_rsaparams"}
    runner = files[".runner"]
    assert (runner["agentId"], runner["agentName"], runner["poolId"]) == (
        jit.runner_id, "req-1-0", GROUP)  # fmt: skip
    assert runner["serverUrl"] == world.github.url + "/"
    assert runner["gitHubUrl"] == f"{world.github.url}/{ORG}"
    assert runner["ephemeral"] is True
    assert files[".credentials"]["scheme"] == "OAuth"
    assert world.runner("req-1-1").encoded_jit_config != jit.encoded_jit_config
