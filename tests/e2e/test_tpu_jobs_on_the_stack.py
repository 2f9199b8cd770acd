"""A TPU slice runs its job on ``dws up`` (issue "TPU slices and calendar blocks run their jobs
too"): the simulated Cloud TPU's queued resource becomes nodes whose workers each run the agent
as a process of its own, on the worker's network endpoint, with a metadata server that serves
what a TPU VM's does (``agent-worker-number``, ``worker-network-endpoints``, ``tpu-env``); each
worker registers for its node with its identity token, checked against the node the TPU API
reports, and the gang's ranks run over the nodes, then their workers.

Sources: tpu/docs/reference/rest/v2/projects.locations.nodes (``networkEndpoints``, one per
TPU VM), tpu/docs/v5e ("Configurations": v5litepod-16, 4x4, four hosts), JAX's
jax/_src/clusters/cloud_tpu_cluster.py (``agent-worker-number``; worker 0 of
``worker-network-endpoints`` coordinates)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from opendws.ports import order_name
from tests.e2e.test_jobs_on_the_stack import ended
from tests.e2e.test_local_stack import dws, start_up

# Each worker reads its slice from its metadata server as JAX does, prints who it is, and meets
# its node's worker 0 (the first of worker-network-endpoints) over TCP at MASTER_PORT.
MEET_WORKER_0 = """
import os, socket, sys, time, urllib.request
def attribute(key):
    url = "http://%s/computeMetadata/v1/instance/attributes/%s" % (
        os.environ["GCE_METADATA_HOST"], key)
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    return urllib.request.urlopen(request, timeout=5).read().decode()
worker = int(attribute("agent-worker-number"))
env = dict(line.split(": ", 1) for line in attribute("tpu-env").splitlines() if ": " in line)
node = env["NODE_ID"].strip("'")
endpoints = [entry.split(":")[2] for entry in attribute("worker-network-endpoints").split(",")]
rank, ranks = os.environ["OPENDWS_NODE_RANK"], os.environ["OPENDWS_NUM_NODES"]
print(f"{node} worker {worker} is rank {rank} of {ranks}", flush=True)
address = (endpoints[0], int(os.environ["MASTER_PORT"]))
if worker == 0:
    server = socket.create_server(address)
    got = []
    for _ in range(len(endpoints) - 1):
        peer, _ = server.accept()
        got.append(peer.makefile().readline().strip())
    print(f"{node} worker 0 met " + ", ".join(sorted(got)), flush=True)
else:
    for _ in range(200):
        try:
            peer = socket.create_connection(address)
            break
        except OSError:
            time.sleep(0.1)
    peer.sendall(f"worker {worker}\\n".encode())
"""


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, str]]:
    process, environment = start_up()
    try:
        yield environment
    finally:
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(60) == 0


def _submit(stack: dict[str, str], request_id: str, slices: int) -> None:
    result = dws(
        stack, "submit", "--id", request_id, "--tenant", "vision", "--vm-count", str(slices),
        "--topology", "4x4", "--accelerator", "tpu-v5e", "--location", "us-west4-a",
        "--run", "1h", "--max-wait", "1h", "--", "python3", "-c", MEET_WORKER_0,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def _active_hosts(status: dict[str, Any]) -> list[dict[str, Any]]:
    (active,) = [event for event in status["events"] if event["state"] == "ACTIVE"]
    hosts: list[dict[str, Any]] = active["hosts"]
    return hosts


def test_a_v5e_16_slices_four_workers_meet_worker_0_and_end_as_succeeded(
    stack: dict[str, str],
) -> None:
    _submit(stack, "slice", 1)
    status = ended(stack, "slice", timeout=120)
    assert (status["state"], status["reason"]) == ("RELEASED", "JOB_SUCCEEDED"), status
    node = order_name("slice", 1)
    hosts = _active_hosts(status)
    assert [(h["rank"], h["name"], h["worker"]) for h in hosts] == [
        (worker, node, worker) for worker in range(4)
    ]
    assert len({h["internal_ip"] for h in hosts}) == 4
    assert all(h["internal_ip"].startswith("127.") for h in hosts)
    lines = dws(stack, "logs", "slice").stdout.splitlines()
    for worker in range(4):
        assert f"[{worker}] {node} worker {worker} is rank {worker} of 4" in lines
    assert f"[0] {node} worker 0 met worker 1, worker 2, worker 3" in lines


def test_a_two_slice_gang_sees_ranks_0_to_7_in_node_then_worker_order(
    stack: dict[str, str],
) -> None:
    _submit(stack, "slices", 2)
    status = ended(stack, "slices", timeout=120)
    assert (status["state"], status["reason"]) == ("RELEASED", "JOB_SUCCEEDED"), status
    order = order_name("slices", 1)
    hosts = _active_hosts(status)
    assert [(h["rank"], h["name"], h["worker"]) for h in hosts] == [
        (rank, f"{order}-{rank // 4}", rank % 4) for rank in range(8)
    ]
    lines = dws(stack, "logs", "slices").stdout.splitlines()
    for rank in range(8):
        node, worker = f"{order}-{rank // 4}", rank % 4
        assert f"[{rank}] {node} worker {worker} is rank {rank} of 8" in lines
    for node in (f"{order}-0", f"{order}-1"):
        assert any(line.endswith(f"{node} worker 0 met worker 1, worker 2, worker 3")
                   for line in lines)  # fmt: skip
