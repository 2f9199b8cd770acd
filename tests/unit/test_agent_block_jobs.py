"""The agent on a calendar block's VM (issue 51: "another job can be submitted into it: a request
naming the block runs on its VMs"): after the block's own run is over it registers again, waits
while the agent function says no run is on the block now, and runs each job into the block in
turn — as a process of its own against a fake agent function (see tests.unit.test_agent)."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.unit.test_agent import (  # the fixtures function and metadata too
    Call,
    FakeFunction,
    FakeMetadata,
    agent_process,
    function,
    job,
    metadata,
    python_module_argv,
    wait_until,
)


@dataclass
class BlockFunction(FakeFunction):
    """Registers the VM for the block's own run, then answers "wait" twice, then registers it
    for job ``j1``, then waits for ever; each run is over (410) once its exit is reported."""

    answers: list[dict[str, Any]] = field(default_factory=list)
    exited: set[str] = field(default_factory=set)

    def answer(self, call: Call) -> tuple[int, dict[str, Any] | None]:
        session = call.authorization.removeprefix("Bearer ")
        if call.path == "/v1/register":
            if call.authorization != "Bearer " + self.expected_token:
                return 401, {"error": "identity token invalid"}
            turn = len(self.of("/v1/register"))
            if turn == 1:
                return 200, self._session("s-block", "block")
            if turn == 4:
                return 200, self._session("s-j1", "j1")
            return 200, {"wait": True, "retry_after_s": 0.2, "request_id": "block",
                         "error": "no run on the VMs of block 'block' now"}  # fmt: skip
        if session not in ("s-block", "s-j1"):
            return 401, {"error": "session invalid"}
        if call.path == "/v1/barrier":
            word = "own" if session == "s-block" else "j1"
            return 200, {"ready": True, "image": None, "env": {},
                         "command": job(f"print('{word}')")}  # fmt: skip
        if call.path == "/v1/heartbeat":
            return (410, {"error": "over"}) if session in self.exited else (200, {"stop": False})
        if call.path == "/v1/logs":
            return 204, None
        if call.path == "/v1/exit":
            self.exited.add(session)
            return 200, {}
        return 404, {"error": "no such endpoint"}

    def _session(self, session: str, request_id: str) -> dict[str, Any]:
        return {
            "session": session, "request_id": request_id, "order": "o-1", "attempt": 1,
            "rank": 0, "num_nodes": 1, "heartbeat_s": 0.2, "block": "block",
        }  # fmt: skip


def test_a_blocks_agent_runs_the_blocks_run_then_waits_then_runs_the_next_job(
    tmp_path: Path, metadata: FakeMetadata
) -> None:
    function = BlockFunction()
    function.serve()
    try:
        function.expected_token = FakeMetadata.token_for(function.url)
        metadata.agent_url = function.url
        with agent_process(python_module_argv(), metadata, tmp_path / "out") as agent:
            wait_until(lambda: len(function.exits()) == 2, timeout_s=15)
            wait_until(lambda: len(function.of("/v1/register")) >= 5, timeout_s=5)
            assert agent.poll() is None  # still there, for the next job
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=5) == 0
    finally:
        function.close()
    assert function.texts() == ["own", "j1"]
    exits = [(call.authorization, call.body) for call in function.of("/v1/exit")]
    assert exits == [("Bearer s-block", {"code": 0, "stopped": False}),
                     ("Bearer s-j1", {"code": 0, "stopped": False})]  # fmt: skip
    registers = [call.at for call in function.of("/v1/register")]
    assert registers[2] - registers[1] >= 0.15  # it waited as told between two asks
    out = (tmp_path / "out").read_text()
    # Said once per wait (after the block's run: two answers; after j1's: the ones till the end).
    assert out.count("waiting for the next job") == 2
    assert "registering again for the next job into block block" in out


def test_an_agent_whose_registration_names_no_block_leaves_after_its_run(
    tmp_path: Path, metadata: FakeMetadata, function: FakeFunction
) -> None:
    """A flex gang's VM (no ``block``): one run, then the agent exits, as before."""
    function.start = {"command": job("print('once')")}
    with agent_process(python_module_argv(), metadata, tmp_path / "out") as agent:
        assert agent.wait(timeout=10) == 0
    assert len(function.of("/v1/register")) == 1


__all__ = ["function", "metadata"]  # fixtures
