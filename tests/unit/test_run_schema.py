"""``run`` in opendws.request/v1: the job a request carries, what it accepts, and a refusal
naming the field and the rule for what it does not. A request without it is as before."""

from __future__ import annotations

import json
from typing import Any

import pytest

from opendws.domain import EndsWhen, InvalidModel, RunSpec
from opendws.schema import MessageError, Submit, parse_message, to_capacity_request
from tests.builders import NOW
from tests.unit.test_request_schema import DESIGN_EXAMPLE

# DESIGN.md's example (section "Work on the gang").
DESIGN_RUN: dict[str, Any] = {
    "command": ["python", "train.py", "--epochs", "3"],
    "image": "us-docker.pkg.dev/my-proj/ml/trainer:1.4",
    "env": {"WANDB_MODE": "offline"},
    "secrets": {"HF_TOKEN": "projects/my-proj/secrets/hf-token/versions/latest"},
    "ends_when": "all_exited",
}
HF = "projects/my-proj/secrets/hf-token/versions/latest"


def submit_with(run: object) -> Submit:
    submit = parse_message(json.dumps({**DESIGN_EXAMPLE, "run": run}))
    assert isinstance(submit, Submit)
    return submit


def problems(run: object) -> list[tuple[str, str]]:
    """The (field, rule) pairs a submission carrying ``run`` is refused with."""
    with pytest.raises(MessageError) as raised:
        to_capacity_request(submit_with(run), default_request_id="m", submitted_at=NOW)
    return raised.value.problems


def test_the_design_example_run_is_accepted_and_carried_by_the_request() -> None:
    request = to_capacity_request(submit_with(DESIGN_RUN), default_request_id="m", submitted_at=NOW)
    assert request.run == RunSpec(
        command=("python", "train.py", "--epochs", "3"),
        image="us-docker.pkg.dev/my-proj/ml/trainer:1.4",
        env=(("WANDB_MODE", "offline"),),
        secrets=(("HF_TOKEN", HF),),
        ends_when=EndsWhen.ALL_EXITED,
    )
    assert request.run.to_json() == DESIGN_RUN


def test_a_run_needs_only_its_command_and_ends_when_every_rank_exited() -> None:
    request = to_capacity_request(submit_with({"command": ["true"]}), default_request_id="m",
                                  submitted_at=NOW)  # fmt: skip
    assert request.run == RunSpec(command=("true",))
    assert request.run.ends_when is EndsWhen.ALL_EXITED
    ending = to_capacity_request(
        submit_with({"command": ["true"], "ends_when": "rank0_exited"}),
        default_request_id="m", submitted_at=NOW,
    )  # fmt: skip
    assert ending.run is not None
    assert ending.run.ends_when is EndsWhen.RANK0_EXITED


def test_a_request_without_run_is_capacity_only() -> None:
    submit = parse_message(json.dumps(DESIGN_EXAMPLE))
    assert isinstance(submit, Submit)
    assert to_capacity_request(submit, default_request_id="m", submitted_at=NOW).run is None


@pytest.mark.parametrize(
    ("run", "field", "words"),
    [
        ({"command": []}, "run.command", "must not be empty"),
        ({"command": ["python", ""]}, "run.command[1]", "must not be empty"),
        ({"command": "python train.py"}, "run.command", "valid array"),
        ({"image": "trainer:1.4"}, "run.command", "must not be empty"),
        ({"command": ["x"], "env": {"OPENDWS_NODE_RANK": "0"}}, "run.env.OPENDWS_NODE_RANK",
         "set by opendws"),
        ({"command": ["x"], "env": {"MASTER_ADDR": "h"}}, "run.env.MASTER_ADDR", "set by opendws"),
        ({"command": ["x"], "env": {"PET_NNODES": "2"}}, "run.env.PET_NNODES", "set by opendws"),
        ({"command": ["x"], "env": {"JAX_COORDINATOR_ADDRESS": "h:1"}},
         "run.env.JAX_COORDINATOR_ADDRESS", "set by opendws"),
        ({"command": ["x"], "secrets": {"MASTER_PORT": HF}}, "run.secrets.MASTER_PORT",
         "set by opendws"),
        ({"command": ["x"], "env": {"1ST": "a"}}, "run.env.1ST", "not an environment name"),
        ({"command": ["x"], "env": {"A-B": "a"}}, "run.env.A-B", "not an environment name"),
        ({"command": ["x"], "secrets": {"HF TOKEN": HF}}, "run.secrets.HF TOKEN",
         "not an environment name"),
        ({"command": ["x"], "env": {"HF_TOKEN": "a"}, "secrets": {"HF_TOKEN": HF}},
         "run.secrets.HF_TOKEN", "also set in run.env"),
        ({"command": ["x"], "secrets": {"T": "projects/my-proj/secrets/hf-token"}},
         "run.secrets.T", "Secret Manager version name"),
        ({"command": ["x"], "secrets": {"T": "projects/my-proj/secrets/hf-token/versions/v1"}},
         "run.secrets.T", "a number or 'latest'"),
        ({"command": ["x"], "secrets": {"T": "hf-token"}}, "run.secrets.T", "version name"),
        ({"command": ["x"], "secrets": {"T": "projects/my-proj/secrets/hf.token/versions/1"}},
         "run.secrets.T", "version name"),
        ({"command": ["x"], "env": {"A": 1}}, "run.env.A", "valid string"),
        ({"command": ["x"], "env": {"BLOB": "x" * (64 * 1024)}}, "run.env", "64 KiB"),
        ({"command": ["x"], "image": "Trainer:1.4"}, "run.image", "container image reference"),
        ({"command": ["x"], "image": "trainer:"}, "run.image", "container image reference"),
        ({"command": ["x"], "image": "us-docker.pkg.dev/p/r/t@sha256:abc"}, "run.image",
         "container image reference"),
        ({"command": ["x"], "ends_when": "any_exited"}, "run.ends_when",
         "'all_exited' or 'rank0_exited'"),
        ({"command": ["x"], "cwd": "/"}, "run.cwd", "unknown fields are refused"),
        ({"command": ["x", "a\u0000b"]}, "run.command[1]", "NUL"),
        ({"command": ["x"], "env": {"A": "a\u0000b"}}, "run.env.A", "NUL"),
        ({"command": ["x", "y" * (64 * 1024)]}, "run.command", "64 KiB"),
    ],
    ids=[
        "empty command", "empty argument", "command as text", "no command",
        "OPENDWS_", "MASTER_", "PET_", "JAX coordinator", "reserved secret name",
        "digit first", "hyphen", "space in a secret's name", "in env and secrets",
        "secret without version", "version neither number nor latest", "secret id alone",
        "bad secret id", "env value not text", "env over 64 KiB", "uppercase image",
        "image with empty tag", "short digest", "ends_when", "unknown field",
        "NUL in an argument", "NUL in a value", "command over 64 KiB",
    ],
)  # fmt: skip
def test_each_rule_of_run_is_refused_naming_the_field(
    run: dict[str, Any], field: str, words: str
) -> None:
    """Secret versions are Secret Manager's resource names, ``projects/*/secrets/*/versions/*``
    with ``latest`` the alias of the newest (cloud.google.com/secret-manager/docs/reference/
    rest/v1/projects.secrets.versions/access), secret ids letters, digits, '-' and '_'
    (CreateSecretRequest.secret_id); environment names POSIX's portable form
    (pubs.opengroup.org/onlinepubs/9699919799/basedefs/V1_chap08.html); images Docker's
    reference grammar (github.com/distribution/reference, reference.go: lowercase path
    components, a tag of at least one character, a digest of at least 32 hex digits); an
    argument or environment value is a C string, which holds no NUL (man7.org execve(2))."""
    found = problems(run)
    assert [field_ for field_, _ in found] == [field], found
    assert words in found[0][1]


def test_env_of_exactly_64_kib_is_accepted_and_one_byte_more_is_not() -> None:
    """Names and values count in UTF-8 bytes: "é" is two."""
    value = "x" * (64 * 1024 - len("BLOB"))
    run = RunSpec.of(["x"], env={"BLOB": value})
    assert run.env == (("BLOB", value),)
    with pytest.raises(InvalidModel, match="65537 bytes"):
        RunSpec.of(["x"], env={"BLOB": value[:-1] + "é"})


@pytest.mark.parametrize(
    "image",
    [
        "us-docker.pkg.dev/my-proj/ml/trainer:1.4",
        "europe-west4-docker.pkg.dev/my-proj/ml/trainer@sha256:" + "a" * 64,
        "nvcr.io/nvidia/pytorch:24.05-py3",
        "python:3.12-slim",
        "localhost:5000/trainer",
        "ubuntu",
    ],
)
def test_container_image_references_docker_takes_are_accepted(image: str) -> None:
    """Artifact Registry's form LOCATION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE[:TAG|@DIGEST]
    (cloud.google.com/artifact-registry/docs/docker/names), a registry with a port, Docker
    Hub's short names (github.com/distribution/reference, reference.go)."""
    submit = submit_with({"command": ["true"], "image": image})
    assert submit.run is not None
    assert submit.run.image == image


def test_a_secret_version_by_number_or_latest_of_a_project_by_id_or_number_is_accepted() -> None:
    secrets = {
        "A": "projects/my-proj/secrets/hf-token/versions/3",
        "B": "projects/123456789012/secrets/HF_token-2/versions/latest",
    }
    run = RunSpec.of(["x"], secrets=secrets)
    assert dict(run.secrets) == secrets


def test_the_nested_release_if_absent_names_its_run_field() -> None:
    release = {
        "schema": "opendws.request/v1", "action": "release", "request_id": "train-42",
        "tenant": "vision",
        "if_absent": {**DESIGN_EXAMPLE, "action": "submit", "run": {"command": []}},
    }  # fmt: skip
    with pytest.raises(MessageError) as raised:
        parse_message(json.dumps(release))
    assert [field for field, _ in raised.value.problems] == ["if_absent.run.command"]
