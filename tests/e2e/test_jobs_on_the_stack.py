"""A GPU gang runs its job on ``dws up`` (DESIGN.md "Work on the gang"): every VM the simulated
cloud brings up runs the agent as a process of its own, on its own loopback address, with its
own metadata server; the agents register with the agent function (VM identity tokens), meet
at the barrier, run the command with the gang's environment, and the run ends by itself —
RELEASED JOB_SUCCEEDED when every rank exits 0, JOB_FAILED naming the code of a rank that
failed (the others stopped first), AGENT_LOST when a VM's agent dies."""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_local_stack import dws, start_up

# Rank 0 listens on MASTER_ADDR:MASTER_PORT, rank 1 connects; each sends a line and prints
# what it got, and whether the secret reached its environment (compared reversed, so that the
# value is not in the command, which opendws keeps).
MEET = """
import os, socket, sys, time
rank = int(os.environ["OPENDWS_NODE_RANK"])
address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
print("secret ok" if os.environ.get("VISION_TOKEN", "")[::-1] == "t3rc3s" else "no secret")
if rank == 0:
    server = socket.create_server(address)
    peer, _ = server.accept()
else:
    for _ in range(100):
        try:
            peer = socket.create_connection(address)
            break
        except OSError:
            time.sleep(0.1)
peer.sendall(f"hello from {rank}\\n".encode())
print(f"rank {rank} got: {peer.makefile().readline().strip()}", flush=True)
sys.exit(int(os.environ.get("EXIT_OF_RANK_" + str(rank), "0")))
"""


# A stand-in for torchrun (torch is not installed here): it checks the variables torchrun reads
# (PET_*), meets its peer at PET_MASTER_ADDR:PET_MASTER_PORT as torchrun's rendezvous does, and
# says what it would run.
TORCHRUN = """#!{python}
import os, socket, sys, time
names = ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
         "PET_NPROC_PER_NODE")
missing = [name for name in names if not os.environ.get(name)]
if missing:
    print("torchrun: missing", " ".join(missing))
    sys.exit(2)
rank = int(os.environ["PET_NODE_RANK"])
master = (os.environ["PET_MASTER_ADDR"], int(os.environ["PET_MASTER_PORT"]))
if rank == 0:
    peer, _ = socket.create_server(master).accept()
else:
    for _ in range(100):
        try:
            peer = socket.create_connection(master)
            break
        except OSError:
            time.sleep(0.1)
peer.sendall(b"rendezvous\\n")
peer.makefile().readline()
print(f"torchrun: node {{rank}} of {{os.environ['PET_NNODES']}}, "
      f"{{os.environ['PET_NPROC_PER_NODE']}} processes, met its peer; runs", *sys.argv[1:])
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tools = tmp_path_factory.mktemp("bin")
    torchrun = tools / "torchrun"
    torchrun.write_text(TORCHRUN.format(python=sys.executable))
    torchrun.chmod(0o755)
    process, environment = start_up(path=tools)
    _secret(environment, "vision-token", "s3cr3t")
    try:
        yield environment
    finally:
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(60) == 0


def _secret(environment: dict[str, str], secret: str, value: str) -> None:
    """Put a secret in the stack's Secret Manager stand-in with Google's REST calls."""
    base = environment["OPENDWS_SECRETS_ENDPOINT"] + "/v1/projects/demo-opendws/secrets"
    for url, body in (
        (f"{base}?secretId={secret}", {"replication": {"automatic": {}}}),
        (f"{base}/{secret}:addVersion",
         {"payload": {"data": base64.b64encode(value.encode()).decode()}}),
    ):  # fmt: skip
        request = urllib.request.Request(
            url, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(request, timeout=10).close()


def submit(stack: dict[str, str], request_id: str, *extra: str) -> None:
    result = dws(
        stack, "submit", "--id", request_id, "--tenant", "vision", "--vm-count", "2",
        "--machine-type", "a3-highgpu-8g", "--accelerator", "nvidia-h100-80gb",
        "--accelerators-per-vm", "8", "--location", "us-central1-a", "--run", "1h",
        "--max-wait", "1h", "--secret",
        "VISION_TOKEN=projects/demo-opendws/secrets/vision-token/versions/latest",
        *extra, "--", "python3", "-c", MEET,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def ended(stack: dict[str, str], request_id: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = dws(stack, "status", request_id, "--json")
        if shown.returncode == 0:
            status: dict[str, Any] = json.loads(shown.stdout)
            if status["state"] in ("RELEASED", "EXPIRED", "CANCELLED", "TIMED_OUT"):
                return status
        time.sleep(1)
    raise AssertionError(f"{request_id} did not end in {timeout} s")


def test_a_two_vm_gang_meets_at_its_master_and_ends_as_succeeded(stack: dict[str, str]) -> None:
    submit(stack, "meet")
    status = ended(stack, "meet")
    assert (status["state"], status["reason"]) == ("RELEASED", "JOB_SUCCEEDED"), status
    assert status["message"] == "rank 0 exited 0, rank 1 exited 0"
    (active,) = [event for event in status["events"] if event["state"] == "ACTIVE"]
    hosts = active["hosts"]
    assert [host["rank"] for host in hosts] == [0, 1]
    assert all(host["internal_ip"].startswith("127.") for host in hosts)
    logs = dws(stack, "logs", "meet")
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert "[0] rank 0 got: hello from 1" in lines
    assert "[1] rank 1 got: hello from 0" in lines
    assert lines.count("[0] secret ok") + lines.count("[1] secret ok") == 2
    # The secret's value is nowhere in what opendws keeps or announces.
    assert "s3cr3t" not in json.dumps(status)


def test_a_rank_that_fails_stops_the_other_and_the_run_fails_naming_its_code(
    stack: dict[str, str],
) -> None:
    """Rank 1 exits 3 after meeting rank 0; rank 0 then sleeps (it would run an hour): it is
    stopped, and the run is released as JOB_FAILED naming rank 1's code."""
    result = dws(
        stack, "submit", "--id", "fails", "--tenant", "vision", "--vm-count", "2",
        "--machine-type", "a3-highgpu-8g", "--accelerator", "nvidia-h100-80gb",
        "--accelerators-per-vm", "8", "--location", "us-central1-a", "--run", "1h",
        "--max-wait", "1h", "--", "python3", "-c",
        "import os, sys, time\n"
        "sys.exit(3) if os.environ['OPENDWS_NODE_RANK'] == '1' else time.sleep(3600)",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    status = ended(stack, "fails")
    assert (status["state"], status["reason"]) == ("RELEASED", "JOB_FAILED"), status
    assert "rank 1 exited 3" in status["message"]
    assert "rank 0 stopped" in status["message"]


def test_a_vm_whose_agent_is_killed_is_lost_and_released(stack: dict[str, str]) -> None:
    result = dws(
        stack, "submit", "--id", "lost", "--tenant", "vision", "--vm-count", "2",
        "--machine-type", "a3-highgpu-8g", "--accelerator", "nvidia-h100-80gb",
        "--accelerators-per-vm", "8", "--location", "us-central1-a", "--run", "1h",
        "--max-wait", "1h", "--", "python3", "-c", "import time; time.sleep(3600)",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    agent = _agent_of(stack, "lost", rank=1)
    os.kill(agent, signal.SIGKILL)
    status = ended(stack, "lost")
    assert (status["state"], status["reason"]) == ("RELEASED", "AGENT_LOST"), status
    assert "rank 1" in status["message"]


def _agent_of(stack: dict[str, str], request_id: str, *, rank: int, timeout: float = 60) -> int:
    """The process id of the agent of ``request_id``'s VM of ``rank`` (its working folder
    is ``vms/{VM name}-{id}``), once its job runs."""
    from opendws.ports import order_name

    vm = f"{order_name(request_id, 1)}-{rank}-"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
                folder = os.readlink(entry / "cwd")
            except OSError:
                continue
            if b"opendws.agent" in command and Path(folder).name.startswith(vm):
                running = Path(folder) / "agent.log"
                if running.exists() and "running" in running.read_text().lower():
                    return int(entry.name)
        time.sleep(0.5)
    raise AssertionError(f"no running agent for {vm}")


def test_the_readmes_torchrun_example_runs(stack: dict[str, str]) -> None:
    """README, "Run a job on your gang": ``dws submit … -- torchrun train.py`` across two VMs;
    torchrun needs no flags (a stand-in here, checking what torchrun reads)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index(".venv/bin/dws submit --id ddp")
    command = readme[start : readme.index("\n.venv/bin/dws wait ddp", start)]
    argv = command.replace("\\\n", " ").split()[1:]  # the words after the dws of the README
    result = dws(stack, *argv)
    assert result.returncode == 0, result.stderr
    status = ended(stack, "ddp")
    assert (status["state"], status["reason"]) == ("RELEASED", "JOB_SUCCEEDED"), status
    lines = dws(stack, "logs", "ddp").stdout.splitlines()
    assert "[0] torchrun: node 0 of 2, 8 processes, met its peer; runs train.py" in lines
    assert "[1] torchrun: node 1 of 2, 8 processes, met its peer; runs train.py" in lines
