"""The ``dws`` command: ``--version`` and ``dws plan`` (table, JSON, --at, errors)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

import opendws
from opendws.cli import main

EXAMPLE = str(Path(opendws.__file__).parent / "examples" / "scenario.yaml")
# The table in the order `dws plan` prints it: by outcome (domain order), then request id.
EXPECTED_ROWS = [
    ("ci-smoke", "ADMIT"),
    ("quick-eval", "ADMIT"),
    ("train-42", "ADMIT"),
    ("big-sweep", "HOLD"),
    ("ci-nightly", "HOLD"),
    ("tpu-serve", "CONFIRM"),
    ("tpu-train", "REFUSE"),
    ("huge-run", "REJECT"),
]
SUMMARY = "8 requests: 3 ADMIT, 2 HOLD, 1 CONFIRM, 1 REFUSE, 1 REJECT"


def run(*args: str, columns: int = 200) -> Result:
    """``dws ARGS`` in-process, with a terminal ``columns`` wide and no forced colour."""
    env = {"COLUMNS": str(columns), "FORCE_COLOR": None, "TTY_COMPATIBLE": None}
    return CliRunner(env=env).invoke(main, list(args))


def table_rows(output: str) -> list[tuple[str, str]]:
    """(request, outcome) of each table row, in printed order."""
    ids = {request for request, _ in EXPECTED_ROWS}
    rows = []
    for line in output.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ids:
            rows.append((words[0], words[1]))
    return rows


def test_version() -> None:
    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout == f"dws, version {opendws.__version__}\n"


def test_plan_prints_the_table_sorted_by_outcome_then_request() -> None:
    result = run("plan", EXAMPLE)
    assert result.exit_code == 0, result.stderr
    assert table_rows(result.stdout) == EXPECTED_ROWS
    assert result.stdout.rstrip().splitlines()[-1] == SUMMARY
    assert "at 2026-12-01T00:00:00Z" in result.stdout


@pytest.mark.parametrize(
    ("request_id", "cells"),
    [
        pytest.param(
            "train-42", ["us-central1-a/a3-highgpu-8g", "2026-12-01 00:00Z now"], id="admit"
        ),
        pytest.param(
            "big-sweep",
            ["NO_CAPACITY_UNTIL", "us-central1-a/a3-highgpu-8g", "2026-12-01 06:00Z +6h", " 1 "],
            id="hold-eta-position",
        ),
        pytest.param("tpu-serve", ["us-west4-a/tpu-v5e", "2026-12-02 00:00Z +1d"], id="confirm"),
        pytest.param(
            "tpu-train",
            ["NO_CAPACITY", "nearest starts that fit: 2026-12-05T00:00:00+00:00"],
            id="refuse-alternatives",
        ),
        pytest.param("huge-run", ["NEVER_FITS", "the largest allowed pool holds 4"], id="reject"),
    ],
)
def test_plan_row_cells(request_id: str, cells: list[str]) -> None:
    output = run("plan", EXAMPLE, columns=250).stdout
    (row,) = [line for line in output.splitlines() if line.split()[:1] == [request_id]]
    for cell in cells:
        assert cell in row


def test_narrow_terminal_moves_messages_under_the_table() -> None:
    result = run("plan", EXAMPLE, columns=80)
    assert result.exit_code == 0
    assert "Message" not in result.stdout
    assert "huge-run: the gang needs 8 units in one pool" in result.stdout
    assert table_rows(result.stdout)[: len(EXPECTED_ROWS)] == EXPECTED_ROWS
    assert result.stdout.rstrip().splitlines()[-1] == SUMMARY


def test_plan_json_is_the_whole_plan() -> None:
    result = run("plan", EXAMPLE, "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["now"] == "2026-12-01T00:00:00Z"
    decisions = {d["request_id"]: d for d in document["decisions"]}
    assert [d["request_id"] for d in document["decisions"]] == sorted(decisions)
    assert {key: d["outcome"] for key, d in decisions.items()} == dict(EXPECTED_ROWS)
    assert document["counts"] == {"ADMIT": 3, "HOLD": 2, "CONFIRM": 1, "REFUSE": 1, "REJECT": 1}
    assert decisions["big-sweep"] == {
        "request_id": "big-sweep",
        "outcome": "HOLD",
        "reason": "NO_CAPACITY_UNTIL",
        "pool_id": "us-central1-a/a3-highgpu-8g",
        "start_at": "2026-12-01T06:00:00Z",
        "end_at": "2026-12-01T18:00:00Z",
        "eta": "2026-12-01T06:00:00Z",
        "rank": decisions["big-sweep"]["rank"],
        "position": 1,
        "alternatives": [],
        "message": decisions["big-sweep"]["message"],
    }
    assert decisions["tpu-train"]["alternatives"] == [
        {"start_at": "2026-12-05T00:00:00Z", "pool_id": "us-west4-a/tpu-v5e"}
    ]
    for decision in document["decisions"]:
        for key in ("start_at", "end_at", "eta"):
            if decision[key] is not None:
                assert datetime.fromisoformat(decision[key]).utcoffset() is not None


def test_at_overrides_now() -> None:
    result = run("plan", EXAMPLE, "--json", "--at", "2026-12-01T09:00:00+02:00")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["now"] == "2026-12-01T07:00:00Z"
    outcomes = {d["request_id"]: d["outcome"] for d in document["decisions"]}
    # ci-smoke was submitted at 23:50 with a 2 h window: at 07:00 it has timed out. The pending
    # requests are still pending: train-42 starts at 07:00 and big-sweep waits for it to end.
    assert outcomes["ci-smoke"] == "TIME_OUT"
    assert outcomes["train-42"] == "ADMIT"
    big_sweep = next(d for d in document["decisions"] if d["request_id"] == "big-sweep")
    assert (big_sweep["outcome"], big_sweep["eta"]) == ("HOLD", "2026-12-01T13:00:00Z")


def _write(tmp_path: Path, name: str, data: object) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def _example_with(path: str, value: object) -> dict[str, object]:
    """The example scenario with one field of the first pending request changed."""
    data = yaml.safe_load(Path(EXAMPLE).read_text(encoding="utf-8"))
    *parents, last = path.split(".")
    node = data["pending"][0]
    for part in parents:
        node = node[part]
    node[last] = value
    return data  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["plan", "{tmp}/missing.yaml"],
            "error: {tmp}/missing.yaml: no such file; check the path",
            id="missing-file",
        ),
        pytest.param(
            ["plan", "{tmp}/scenario.toml"],
            "error: {tmp}/scenario.toml: unknown file type '.toml'",
            id="extension",
        ),
        pytest.param(
            ["plan", "{unknown_field}"],
            "error: {unknown_field}: pending[0] (train-42): gang: unknown field 'vm_cout'; "
            "did you mean 'vm_count'?",
            id="unknown-field",
        ),
        pytest.param(
            ["plan", "{domain_rule}"],
            "error: {domain_rule}: pending[0] (train-42): run_duration: "
            "flex_start runs between 10 minutes and 7 days",
            id="domain-rule",
        ),
        pytest.param(
            ["plan", EXAMPLE, "--at", "2026-12-01T07:00:00"],
            "error: --at '2026-12-01T07:00:00': 2026-12-01T07:00:00 has no time zone",
            id="naive-at",
        ),
        pytest.param(
            ["plan", EXAMPLE, "--at", "soon"],
            "error: --at 'soon': Input should be a valid datetime",
            id="bad-at",
        ),
    ],
)
def test_errors_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    unknown_gang = _example_with("gang.vm_cout", 2)
    del unknown_gang["pending"][0]["gang"]["vm_count"]  # type: ignore[index]
    names = {
        "tmp": str(tmp_path),
        "unknown_field": _write(tmp_path, "unknown.yaml", unknown_gang),
        "domain_rule": _write(tmp_path, "rule.yaml", _example_with("run_duration", "5m")),
    }
    result = run(*(arg.format(**names) for arg in args))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(message.format(**names))
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
