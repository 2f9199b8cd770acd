"""`dws trace convert` and `dws simulate`: the files they write, the comparison they print,
and one red line for every input a user can fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from opendws.cli import main
from opendws.replay.traces import read_pools, read_trace

DATA = Path(__file__).resolve().parents[1] / "data" / "philly"
PHILLY = Path(__file__).resolve().parents[3] / "shared" / "traces" / "philly"


def run(*arguments: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(arguments))
    return result.exit_code, result.output


@pytest.fixture
def converted(tmp_path: Path) -> tuple[Path, Path]:
    trace, pools = tmp_path / "trace.csv", tmp_path / "pools.json"
    code, output = run(
        "trace", "convert", str(DATA / "philly.csv"), "--nodes", str(DATA / "vc_nodes.csv"),
        "--out", str(trace), "--pools-out", str(pools),
    )  # fmt: skip
    assert code == 0, output
    assert "3 jobs" in output
    assert "left out 1 job: virtual cluster without a capacity" in output
    return trace, pools


def test_convert_writes_a_canonical_trace_and_its_pools(converted: tuple[Path, Path]) -> None:
    trace, pools = converted
    assert [job.job_id for job in read_trace(trace)] == [
        "philly-000002", "philly-000003", "philly-000006",
    ]  # fmt: skip
    assert read_pools(pools).capacity() == {"vcA": 8, "vcB": 32}


def test_convert_scales_pools_but_keeps_room_for_the_largest_gang(tmp_path: Path) -> None:
    code, output = run(
        "trace", "convert", str(DATA / "philly.csv"), "--nodes", str(DATA / "vc_nodes.csv"),
        "--out", str(tmp_path / "t.csv"), "--pools-out", str(tmp_path / "p.json"),
        "--scale", "0.25",
    )  # fmt: skip
    assert code == 0, output
    assert read_pools(tmp_path / "p.json").capacity() == {"vcA": 2, "vcB": 16}


def test_simulate_prints_one_json_object_with_every_policy(converted: tuple[Path, Path]) -> None:
    trace, pools = converted
    code, output = run("simulate", "--trace", str(trace), "--pools", str(pools), "--json")
    assert code == 0, output
    document = json.loads(output)
    assert set(document["policies"]) == {"opendws", "fifo", "strict_fifo", "sjf", "sjf_asked"}
    figures = document["policies"]["opendws"]
    assert set(figures) >= {
        "mean_wait_s", "p50_wait_s", "p95_wait_s", "p99_wait_s", "max_wait_s", "mean_jct_s",
        "utilization", "timed_out",
    }  # fmt: skip
    assert figures["timed_out"] == 0
    assert document["wall_s"] > 0


def test_simulate_answers_what_if_with_more_gpus_and_another_quota(
    converted: tuple[Path, Path],
) -> None:
    trace, pools = converted
    code, output = run(
        "simulate", "--trace", str(trace), "--pools", str(pools), "--policy", "opendws",
        "--add", "vcA=8", "--quota", "vcB=16", "--json",
    )  # fmt: skip
    assert code == 0, output
    assert set(json.loads(output)["policies"]) == {"opendws"}
    code, output = run(
        "simulate", "--trace", str(trace), "--pools", str(pools), "--policy", "fifo",
        "--quota", "vcB=8",
    )  # fmt: skip
    assert code == 2
    assert "job philly-000006 needs 16 GPUs at once; tenant vcB may hold at most 8" in output
    code, output = run("simulate", "--trace", str(trace), "--pools", str(pools), "--policy", "fifo")
    assert code == 0, output
    assert "fifo" in output
    assert "3 jobs from 2017-10-01 to 2017-10-02 on 2 pools, 40 GPUs" in output


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("--add", "vcZ=8"), "--add vcZ=8: there is no pool 'vcZ'"),
        (("--add", "vcA=lots"), "--add 'vcA=lots': expected POOL=GPUS"),
        (("--add", "vcA=-8"), "pool vcA would have 0 GPUs"),
        (("--quota", "vcA=-1"), "a quota cannot be negative"),
        (("--scale", "0"), "--scale must be positive"),
        (("--scale", "0.01"), None),
        (("--aging-half-life", "0s"), "--aging-half-life '0s': aging_half_life: must be positive"),
        (("--aging-half-life", "soon"), "--aging-half-life 'soon'"),
        (("--policy", "opendws", "--aging-half-life", "48h"), None),
    ],
)
def test_simulate_refuses_what_it_cannot_do_in_one_line(
    converted: tuple[Path, Path], arguments: tuple[str, ...], message: str | None
) -> None:
    trace, pools = converted
    code, output = run(
        "simulate", "--trace", str(trace), "--pools", str(pools), "--policy", "fifo", *arguments
    )
    if message is None:  # scaled down, yet every pool still holds its largest gang
        assert code == 0, output
        return
    assert code == 2
    assert output.strip().splitlines() == [f"error: {output.strip()[7:]}"]
    assert message in output


def test_simulate_names_the_file_it_cannot_read(tmp_path: Path) -> None:
    code, output = run(
        "simulate", "--trace", str(tmp_path / "none.csv"), "--pools", str(tmp_path / "p.json")
    )
    assert code == 2
    assert "none.csv: cannot read the trace" in output


@pytest.mark.skipif(
    not (PHILLY / "philly.csv").exists(), reason="the Philly trace is not beside the project"
)
def test_the_philly_trace_converts_to_the_helios_window(tmp_path: Path) -> None:
    code, output = run(
        "trace", "convert", str(PHILLY / "philly.csv"),
        "--nodes", str(PHILLY / "helios_qssf_philly_vc_nodes.csv"),
        "--out", str(tmp_path / "t.csv"), "--pools-out", str(tmp_path / "p.json"), "--scale", "0.4",
    )  # fmt: skip
    assert code == 0, output
    assert "68,503 jobs" in output
    assert "left out 7 jobs: virtual cluster without a capacity" in output
    assert len(read_pools(tmp_path / "p.json").pools) == 11


def test_the_comparison_fits_an_80_column_terminal_with_whole_policy_names(
    converted: tuple[Path, Path],
) -> None:
    """Every policy on one line of at most 80 columns, its name whole and no figure cut."""
    trace, pools = converted
    result = CliRunner(env={"COLUMNS": "80"}).invoke(
        main, ["simulate", "--trace", str(trace), "--pools", str(pools)]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.stdout
    for policy in ("opendws", "fifo", "strict_fifo", "sjf", "sjf_asked"):
        assert any(line.split()[:1] == [policy] for line in lines), (policy, lines)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(45, "45s"), (2_160, "36m"), (75_660, "21h1m"), (407_000, "4d17h"), (432_780, "5d")],
)
def test_table_durations_keep_their_two_largest_units(seconds: float, shown: str) -> None:
    from opendws.cli.replay import _seconds

    assert _seconds(seconds) == shown
