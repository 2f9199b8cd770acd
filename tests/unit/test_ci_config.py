"""CI mappings that run their jobs: the ``github`` and ``gitlab`` blocks, ``max_vms`` and
``idle_timeout`` as ``dws config apply`` validates them, each refusal naming the field; and the
document written back (``dws config show``) loads as the same configuration.

A GitHub App runner scope is an organization or one repository
(docs.github.com/en/rest/actions/self-hosted-runners: ``/orgs/{org}/…`` or
``/repos/{owner}/{repo}/…``); the App's key and the GitLab token are Secret Manager version names
(secret-manager/docs/reference/rest/v1/projects.secrets.versions/access)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from opendws.config import configuration_from_document, configuration_to_document
from opendws.ports.configuration import GitHubRunners, GitLabRunners
from opendws.schema.common import ScenarioError

FLEX = {
    "tenant": "ci", "mode": "flex_start",
    "gang": {"vm_count": 1, "machine_type": "a3-highgpu-8g", "accelerator": "nvidia-h100-80gb"},
    "locations": ["us-central1-a"], "run_duration": "2h",
}  # fmt: skip
KEY = "projects/my-ml-project/secrets/github-app-key/versions/latest"
GITHUB = {"app_id": 123456, "installation_id": 987, "private_key_secret": KEY,
          "organization": "acme", "runner_group_id": 3}  # fmt: skip
TOKEN = "projects/my-ml-project/secrets/gitlab-runner-token/versions/2"
GITLAB = {"url": "https://gitlab.example.com", "group_id": 42, "token_secret": TOKEN}


def load(**mapping: Any) -> Any:
    entry = {"provider": "github", "labels": ["self-hosted", "gpu-h100"], "request": FLEX}
    entry.update(mapping)
    return configuration_from_document({"ci": [entry]}, source="ci.yaml")


def test_a_github_mapping_names_its_app_and_caps_and_reads_back_the_same() -> None:
    configuration = load(github=GITHUB, max_vms=8, idle_timeout="15m")
    [mapping] = configuration.ci
    assert mapping.github == GitHubRunners(
        app_id=123456, installation_id=987, private_key_secret=KEY, organization="acme",
        runner_group_id=3,
    )  # fmt: skip
    assert (mapping.max_vms, mapping.idle_timeout, mapping.runs_jobs) == (
        8, timedelta(minutes=15), True)  # fmt: skip
    again = configuration_from_document(configuration_to_document(configuration), source="x")
    assert again.ci == configuration.ci


def test_a_gitlab_mapping_names_its_url_token_and_group() -> None:
    [mapping] = load(provider="gitlab", labels=["gpu-a100"], gitlab=GITLAB).ci
    assert mapping.gitlab == GitLabRunners(
        url="https://gitlab.example.com", token_secret=TOKEN, group_id=42
    )
    assert mapping.idle_timeout == timedelta(minutes=10)


@pytest.mark.parametrize(
    ("mapping", "words"),
    [
        ({"github": {**GITHUB, "repository": "acme/app"}}, "exactly one"),
        ({"github": {k: v for k, v in GITHUB.items() if k != "organization"}}, "exactly one"),
        ({"github": {**GITHUB, "private_key_secret": "github-app-key"}}, "Secret Manager version"),
        ({"github": {**GITHUB, "api_url": "http://github.example.com/api/v3"}}, "https://"),
        ({"github": {**GITHUB, "app_id": 0}}, "app_id"),
        ({"github": {**GITHUB, "installation": 1}}, "installation"),
        ({"provider": "gitlab", "github": GITHUB}, "cannot be github's"),
        ({"github": GITHUB, "request": {**FLEX, "run": {"command": ["x"]}}}, "give no run"),
        ({"max_vms": 4}, "give a github or gitlab block"),
        ({"github": GITHUB, "max_vms": 0}, "max_vms"),
        ({"github": GITHUB, "idle_timeout": "10s"}, "between 1 minute and 24 hours"),
        ({"provider": "gitlab", "gitlab": {**GITLAB, "executor": "kubernetes"}}, "executor"),
        ({"provider": "gitlab", "gitlab": {"url": "https://gitlab.com"}}, "token_secret"),
    ],
    ids=[
        "organization and repository",
        "neither",
        "bare secret id",
        "plain http",
        "app id zero",
        "unknown field",
        "github block on gitlab",
        "run with runners",
        "cap without runners",
        "cap zero",
        "idle too short",
        "unknown executor",
        "gitlab without token",
    ],
)
def test_a_bad_mapping_is_refused_naming_the_field(mapping: dict[str, Any], words: str) -> None:
    with pytest.raises(ScenarioError, match="ci") as raised:
        load(**mapping)
    assert words in str(raised.value)


def test_the_http_api_of_a_local_fake_is_accepted_on_loopback_only() -> None:
    local = load(github={**GITHUB, "api_url": "http://127.0.0.1:8123"}).ci[0]
    assert local.github is not None
    assert local.github.api_url == "http://127.0.0.1:8123"
