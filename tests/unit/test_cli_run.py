"""The job a request carries, from the command line and from Python: ``dws submit … -- COMMAND``
(everything after ``--`` is the argv) with ``--image``, ``--env``, ``--secret`` and
``--ends-when``, or a request file's ``run:``; ``Client.submit(run=…)``; and ``dws status``
showing the run (``--wide``, ``--json``) with secrets as version names."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from opendws import bootstrap
from opendws.cli import main
from opendws.client import InvalidRequest
from opendws.domain import RunSpec
from tests.builders import flex
from tests.unit.test_client import TRAIN, System

HF = "projects/my-proj/secrets/vision-hf/versions/latest"
GANG = ["submit", "--id", "job-1", "--tenant", "vision", "--vm-count", "2",
        "--machine-type", "a3-highgpu-8g", "--accelerator", "nvidia-h100-80gb",
        "--location", "us-central1-a", "--run", "6h"]  # fmt: skip


@pytest.fixture
def system() -> Iterator[System]:
    system = System()
    previous = bootstrap.use(system.client.container)
    yield system
    bootstrap.use(previous)


def submitted(system: System, *args: str) -> dict[str, object]:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    message = system.publisher.messages[-1]
    assert isinstance(message, dict)
    return message


def test_everything_after_dashes_is_the_command_options_and_all(system: System) -> None:
    message = submitted(
        system, *GANG, "--image", "us-docker.pkg.dev/my-proj/ml/trainer:1.4",
        "--env", "WANDB_MODE=offline", "--env", "EQ=a=b", "--secret", f"HF_TOKEN={HF}",
        "--ends-when", "rank0_exited",
        "--", "torchrun", "--nnodes", "2", "-m", "train", "--", "--run", "x y",
    )  # fmt: skip
    assert message["run"] == {
        "command": ["torchrun", "--nnodes", "2", "-m", "train", "--", "--run", "x y"],
        "image": "us-docker.pkg.dev/my-proj/ml/trainer:1.4",
        "env": {"WANDB_MODE": "offline", "EQ": "a=b"},
        "secrets": {"HF_TOKEN": HF},
        "ends_when": "rank0_exited",
    }
    assert message["run_duration"] == "6h"  # --run before -- is still the run duration


def test_without_dashes_a_submission_carries_no_run(system: System) -> None:
    assert "run" not in submitted(system, *GANG)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--"], "run.command: must not be empty"),
        (["--image", "python:3.12"], "run.command: must not be empty"),
        (["--env", "MASTER_ADDR=h", "--", "true"], "run.env.MASTER_ADDR: is set by opendws"),
        (["--env", "WANDB_MODE", "--", "true"], "--env 'WANDB_MODE': give NAME=VALUE"),
        (["--secret", "HF_TOKEN=hf-token", "--", "true"], "run.secrets.HF_TOKEN:"),
    ],
    ids=["empty command", "flags without command", "reserved name", "no =", "not a version"],
)
def test_a_bad_run_is_one_red_line_and_nothing_is_sent(
    system: System, args: list[str], words: str
) -> None:
    result = CliRunner().invoke(main, [*GANG, *args])
    assert result.exit_code == 2, result.output
    assert words in result.output
    assert system.publisher.messages == []


def test_a_request_files_run_is_published_and_the_command_line_updates_it(
    system: System, tmp_path: Path
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "tenant: vision\nmode: flex_start\nrun_duration: 6h\nlocations: [us-central1-a]\n"
        "gang: {vm_count: 2, machine_type: a3-highgpu-8g, accelerator: nvidia-h100-80gb}\n"
        "run:\n  command: [python, train.py]\n  image: python:3.12\n"
        "  env: {WANDB_MODE: offline, SEED: '1'}\n"
    )
    from_file = submitted(system, "submit", str(path))
    assert from_file["run"] == {
        "command": ["python", "train.py"], "image": "python:3.12",
        "env": {"WANDB_MODE": "offline", "SEED": "1"},
    }  # fmt: skip
    updated = submitted(system, "submit", str(path), "--env", "SEED=2", "--", "python", "eval.py")
    assert updated["run"] == {
        "command": ["python", "eval.py"], "image": "python:3.12",
        "env": {"WANDB_MODE": "offline", "SEED": "2"},
    }  # fmt: skip


def test_client_submit_takes_a_run_as_a_mapping_or_a_run_spec(system: System) -> None:
    run = RunSpec.of(["python", "train.py"], env={"WANDB_MODE": "offline"},
                     secrets={"HF_TOKEN": HF})  # fmt: skip
    system.client.submit(TRAIN, run=run)
    system.client.submit(TRAIN, request_id="train-2", run={"command": ["python", "train.py"]})
    first, second = system.publisher.messages
    assert first["run"] == run.to_json()
    assert second["run"] == {"command": ["python", "train.py"]}
    with pytest.raises(InvalidRequest, match=r"run\.command: must not be empty"):
        system.client.submit(TRAIN, request_id="train-3", run={"command": []})
    assert len(system.publisher.messages) == 2


def test_status_shows_the_run_wide_and_in_json_secrets_as_version_names(system: System) -> None:
    run = RunSpec.of(["python", "train.py", "--note", "a b"], image="python:3.12",
                     env={"WANDB_MODE": "offline"}, secrets={"HF_TOKEN": HF})  # fmt: skip
    system.stored(replace(flex("job-1", tenant="vision"), run=run))
    wide = CliRunner().invoke(main, ["status", "job-1", "--wide"])
    assert wide.exit_code == 0, wide.output
    assert "run: python train.py --note 'a b'\n" in wide.stdout
    assert f"image python:3.12; ends when all_exited; env WANDB_MODE; secrets HF_TOKEN={HF}" in (
        wide.stdout
    )
    shown = CliRunner().invoke(main, ["status", "job-1", "--json"])
    assert json.loads(shown.stdout)["run"] == run.to_json()


def test_status_shows_a_ci_runs_runner(system: System) -> None:
    from opendws.domain.run import CiRunner

    runner = CiRunner.of("github", ["self-hosted", "gpu-h100"], "acme/trainer")
    system.stored(replace(flex("gh-1", tenant="vision"), run=RunSpec(command=(), runner=runner)))
    wide = CliRunner().invoke(main, ["status", "gh-1", "--wide"])
    assert wide.exit_code == 0, wide.output
    assert "run: a one-job github runner for acme/trainer\n  labels gpu-h100, self-hosted" in (
        wide.stdout
    )


def test_status_of_a_capacity_only_request_has_no_run(system: System) -> None:
    system.stored(flex("capacity-1", tenant="vision"))
    wide = CliRunner().invoke(main, ["status", "capacity-1", "--wide"])
    assert "run:" not in wide.stdout
    shown = CliRunner().invoke(main, ["status", "capacity-1", "--json"])
    assert json.loads(shown.stdout)["run"] is None
