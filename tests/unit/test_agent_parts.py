"""The agent's parts, in process: its backoff, how it batches the job's output, how it reads
the function's replies, and that it needs nothing but the standard library."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from opendws.agent.backoff import Backoff
from opendws.agent.job import exit_code
from opendws.agent.logs import MAX_BYTES, MAX_LINE_CHARS, MAX_LINES, Line, LogShipper
from opendws.agent.run import Session, Start
from opendws.agent.transport import Unreachable

AGENT = Path(__file__).resolve().parents[2] / "shared" / "opendws" / "agent"


def test_backoff_doubles_from_half_a_second_to_thirty_with_jitter() -> None:
    low = Backoff(rand=lambda: 0.0)
    high = Backoff(rand=lambda: 0.999999)
    steps = [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert [low.next_delay() for _ in steps] == [step / 2 for step in steps]
    assert [round(high.next_delay(), 3) for _ in steps] == steps
    low.reset()
    assert low.next_delay() == 0.25


def test_the_output_goes_in_order_in_batches_of_at_most_256_lines_and_256_kib() -> None:
    sent: list[list[Line]] = []
    shipper = LogShipper(sent.append, echo=False)
    for i in range(600):
        shipper.add("stdout", f"line {i}")
    for _ in range(40):
        shipper.add("stderr", "x" * 10_000)
    shipper.add("stdout", "y" * (MAX_LINE_CHARS + 5))
    shipper.start()
    shipper.close(5)
    lines = [line for batch in sent for line in batch]
    assert [line["text"] for line in lines[:600]] == [f"line {i}" for i in range(600)]
    assert all(line["stream"] == "stderr" for line in lines[600:640])
    assert lines[-1]["text"] == "y" * MAX_LINE_CHARS
    assert len(lines) == 641
    for batch in sent:
        assert len(batch) <= MAX_LINES
        assert len(json.dumps({"lines": batch})) <= MAX_BYTES


def test_the_output_waits_for_an_unreachable_function_and_is_not_lost() -> None:
    attempts: list[int] = []
    sent: list[Line] = []

    def send(batch: list[Line]) -> None:
        attempts.append(len(batch))
        if len(attempts) < 3:
            raise Unreachable("down")
        sent.extend(batch)

    shipper = LogShipper(send, echo=False)
    shipper.add("stdout", "hello")
    shipper.start()
    shipper.close(10)
    assert sent == [{"stream": "stdout", "text": "hello"}]
    assert len(attempts) == 3


@pytest.mark.parametrize(("returncode", "code"), [(0, 0), (3, 3), (-9, 137), (-15, 143)])
def test_a_job_killed_by_a_signal_exits_as_a_shell_says(returncode: int, code: int) -> None:
    assert exit_code(returncode) == code


def test_malformed_replies_are_not_taken_for_a_session_or_a_start() -> None:
    with pytest.raises(Unreachable):
        Session.parse({"session": "s", "rank": 0})
    with pytest.raises(Unreachable):
        Session.parse({"session": "s", "rank": 0, "num_nodes": 1, "heartbeat_s": 0})
    with pytest.raises(Unreachable):
        Start.parse({"ready": True, "command": []})
    with pytest.raises(Unreachable):
        Start.parse({"ready": True, "command": ["x"], "env": {"A": 1}})
    start = Start.parse({"ready": True, "command": ["x"], "image": None, "env": {"A": "1"}})
    assert start == Start(("x",), None, {"A": "1"})


def test_the_agent_imports_nothing_but_the_standard_library_and_itself() -> None:
    """Besides the import-linter contract (pyproject.toml), which CI runs."""
    outside = []
    for path in sorted(AGENT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and not name.startswith("opendws.agent"):
                    outside.append((path.name, name))
    assert outside == []
