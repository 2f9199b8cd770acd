"""``dws trace convert`` and ``dws demo`` show their progress on a terminal — the trace read
(bytes of its size, jobs kept), the local stack starting and then the demo's steps — and
nothing of it when piped or with ``--json``."""

from __future__ import annotations

import ast
import contextlib
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

import emulators
from emulators import demo as demo_script
from emulators import stack as stack_module
from opendws.cli import main
from opendws.cli import replay as cli_replay
from opendws.cli import stack as cli_stack
from opendws.replay.philly import REPORT_EVERY, convert

DATA = Path(__file__).resolve().parents[1] / "data" / "philly"
HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"


def terminal(monkeypatch: pytest.MonkeyPatch, module: object) -> io.StringIO:
    """Make ``module``'s progress console a 120-column terminal; returns its screen."""
    screen = io.StringIO()
    shown = Console(file=screen, force_terminal=True, width=120, color_system=None)
    monkeypatch.setattr(module, "errors", shown)
    return screen


# dws trace convert ------------------------------------------------------------------------------


def test_a_conversion_reports_bytes_read_and_jobs_kept_as_it_goes(tmp_path: Path) -> None:
    rows = 2 * REPORT_EVERY + 10
    philly = tmp_path / "philly.csv"
    philly.write_text(HEADER + "2017-10-01 00:00:05,3600.0,1,3600.0,vcA\n" * rows)
    told: list[tuple[int, int]] = []
    converted = convert(philly, DATA / "vc_nodes.csv", progress=lambda *seen: told.append(seen))
    assert len(told) == 3  # every REPORT_EVERY rows, and at the end
    assert [read for read, _ in told] == sorted(read for read, _ in told)
    assert told[-1] == (philly.stat().st_size, len(converted.jobs)) == (told[-1][0], rows)
    assert 0 < told[0][1] < told[1][1] < rows


def test_a_terminal_sees_the_trace_read_and_the_jobs_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    screen = terminal(monkeypatch, cli_replay)
    philly = DATA / "philly.csv"
    with cli_replay.convert_progress(philly, shown=True) as report:
        assert report is not None
        convert(philly, DATA / "vc_nodes.csv", progress=report)
    shown = screen.getvalue()
    assert "reading philly.csv" in shown
    assert "318/318 bytes" in shown  # the whole test trace (DownloadColumn's units)
    assert "3 jobs" in shown


def test_nothing_is_shown_when_the_conversion_is_piped(tmp_path: Path) -> None:
    with cli_replay.convert_progress(DATA / "philly.csv", shown=False) as report:
        assert report is None
    result = CliRunner().invoke(main, [
        "trace", "convert", str(DATA / "philly.csv"), "--nodes", str(DATA / "vc_nodes.csv"),
        "--out", str(tmp_path / "t.csv"), "--pools-out", str(tmp_path / "p.json"),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "reading" not in result.output
    assert result.stderr == ""


# dws demo ---------------------------------------------------------------------------------------


def test_a_terminal_sees_the_stack_start_then_the_demos_steps_with_the_story(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    screen = terminal(monkeypatch, cli_stack)
    with cli_stack.demo_progress(shown=True, story=True, steps=3) as view:
        view.step("starting the Firestore and Pub/Sub emulators")
        view.say("submit train")
        view.say("train: ACTIVE")
    shown = screen.getvalue()
    assert "local stack: starting the Firestore and Pub/Sub emulators" in shown
    assert "local stack: ready" in shown
    assert "› submit train" in shown
    assert "› train: ACTIVE" in shown
    assert "demo steps" in shown
    assert "2/3" in shown


@pytest.mark.parametrize(("story", "printed"), [(True, "› submit train\n"), (False, "")])
def test_piped_the_demo_prints_its_story_alone_and_with_json_nothing(
    monkeypatch: pytest.MonkeyPatch, story: bool, printed: str
) -> None:
    screen = terminal(monkeypatch, cli_stack)
    out = io.StringIO()
    monkeypatch.setattr(cli_stack, "console", Console(file=out, color_system=None))
    with cli_stack.demo_progress(shown=False, story=story, steps=3) as view:
        view.step("starting the Firestore and Pub/Sub emulators")
        view.say("submit train")
    assert out.getvalue() == printed
    assert screen.getvalue() == ""


def test_the_bar_counts_every_line_the_demo_says() -> None:
    """``STEPS`` is the number of ``say`` calls in ``run_demo``, each one step of the bar."""
    source = Path(demo_script.__file__).read_text()
    (run_demo,) = [
        node for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.name == "run_demo"
    ]  # fmt: skip
    calls = [
        node for node in ast.walk(run_demo)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "say"
    ]  # fmt: skip
    assert len(calls) == demo_script.STEPS


class FakeStack:
    """What ``dws demo`` needs of a local stack here: nothing (the script is replaced too)."""


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dws demo`` on a stand-in stack and script: the stack reports two steps of starting,
    the script says two lines and ends with one outcome."""

    @contextlib.contextmanager
    def local_stack(*, progress: Callable[[str], None], **_: object) -> Iterator[FakeStack]:
        progress("starting the Firestore and Pub/Sub emulators")
        progress("ready")
        yield FakeStack()

    def run_demo(stack: FakeStack, say: Callable[[str], None]) -> list[demo_script.Outcome]:
        say("submit train")
        say("train: ACTIVE")
        return [demo_script.Outcome("train", "vision", "ACTIVE", "pool", 1, 3, "a", "b", "c")]

    monkeypatch.setattr(emulators, "missing_reason", lambda: None)
    monkeypatch.setattr(stack_module, "local_stack", local_stack)
    monkeypatch.setattr(demo_script, "run_demo", run_demo)


@pytest.mark.usefixtures("scripted")
def test_the_demo_with_json_prints_the_summary_alone() -> None:
    result = CliRunner().invoke(main, ["demo", "--json"])
    assert result.exit_code == 0, result.output
    assert [o["request_id"] for o in json.loads(result.stdout)] == ["train"]
    assert result.stderr == ""


@pytest.mark.usefixtures("scripted")
def test_the_demo_piped_prints_its_story_and_table_without_the_stacks_steps() -> None:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["demo"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[:2] == ["› submit train", "› train: ACTIVE"]
    assert "opendws demo" in result.stdout
    assert "emulators" not in result.output
