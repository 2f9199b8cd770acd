"""Calendar blocks run their jobs on ``dws up`` (issue 51, calendar half).

Google provisions an approved block's capacity into its reservation from the block's start,
possibly up to 24 h later ("at your chosen start time, Compute Engine provisions the requested
capacity into the auto-created reservation", compute/docs/hpc/reserve-capacity-account-team;
the PROVISIONING procurement status, CP FutureReservationStatus), and bills an approved block
in full (compute/docs/instances/delete-future-reservations-calendar-mode). Here the simulated
Google fills two blocks' reservations 5 simulated minutes after their start (the Compute
emulator's ``/admin/calendar`` fill delay, and ``/admin/advance`` moving its clock): each job
starts only then, and the events say it waited for Google. When the jobs end, the default
block keeps its VMs (ACTIVE, until its end), the ``release_on_end`` one's are deleted; both are
billed in full, as ``dws usage`` says. A second request into the kept block (``dws submit
--block``) runs on the same VMs (names, instance ids), ends RELEASED ``JOB_SUCCEEDED``, and
leaves them running.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from opendws.ports import order_name
from tests.e2e.test_local_stack import dws, start_up

ZONE = "us-central1-a"
FILL = timedelta(minutes=5)
JOB = "import os; print('block job on rank', os.environ['OPENDWS_NODE_RANK'])"
SECOND = (
    "import os; print('second job on rank', os.environ['OPENDWS_NODE_RANK'], 'of', "
    "os.environ['OPENDWS_REQUEST_ID'])"
)


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, str]]:
    process, environment = start_up()
    try:
        # Google reviews the blocks at once and fills them 5 minutes after their start.
        fill = {"reviewDelaySeconds": 1, "fillDelaySeconds": FILL.total_seconds()}
        admin(environment, "/admin/calendar", fill)
        yield environment
    finally:
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(60) == 0


def admin(environment: dict[str, str], path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        environment["OPENDWS_COMPUTE_ENDPOINT"].rstrip("/") + path, json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.loads(response.read() or b"{}")
        return answer


def vms(environment: dict[str, str], request_id: str) -> dict[str, str]:
    """Name → status of the VMs of ``request_id``'s block, as Compute Engine lists them."""
    url = (
        environment["OPENDWS_COMPUTE_ENDPOINT"].rstrip("/")
        + f"/compute/v1/projects/demo-opendws/zones/{ZONE}/instances"
    )
    with urllib.request.urlopen(url, timeout=30) as response:
        items = json.loads(response.read()).get("items", [])
    prefix = order_name(request_id, 1) + "-"
    return {vm["name"]: vm["status"] for vm in items if vm["name"].startswith(prefix)}


def instance_ids(environment: dict[str, str], request_id: str) -> dict[str, str]:
    """Name → instance id of the VMs of ``request_id``'s block."""
    url = (
        environment["OPENDWS_COMPUTE_ENDPOINT"].rstrip("/")
        + f"/compute/v1/projects/demo-opendws/zones/{ZONE}/instances"
    )
    with urllib.request.urlopen(url, timeout=30) as response:
        items = json.loads(response.read()).get("items", [])
    prefix = order_name(request_id, 1) + "-"
    return {vm["name"]: str(vm["id"]) for vm in items if vm["name"].startswith(prefix)}


def status(environment: dict[str, str], request_id: str) -> dict[str, Any]:
    shown = dws(environment, "status", request_id, "--json")
    assert shown.returncode == 0, shown.stderr
    answer: dict[str, Any] = json.loads(shown.stdout)
    return answer


def until(
    environment: dict[str, str], request_id: str, holds: Callable[[dict[str, Any]], bool],
    timeout: float = 150,
) -> dict[str, Any]:  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = dws(environment, "status", request_id, "--json")
        if shown.returncode == 0:
            current: dict[str, Any] = json.loads(shown.stdout)
            if holds(current):
                return current
        time.sleep(1)
    raise AssertionError(
        f"{request_id}: not there in {timeout} s: {status(environment, request_id)}"
    )


def submit_block(environment: dict[str, str], request_id: str, vm_count: int, start: datetime,
                 *extra: str) -> None:  # fmt: skip
    result = dws(
        environment, "submit", "--id", request_id, "--tenant", "vision", "--mode", "calendar",
        "--vm-count", str(vm_count), "--machine-type", "a3-highgpu-8g",
        "--accelerator", "nvidia-h100-80gb", "--location", ZONE, "--run", "1d",
        "--start-at", start.isoformat(), *extra, "--", "python3", "-c", JOB,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def reasons(shown: dict[str, Any]) -> list[tuple[str, str]]:
    return [(event["state"], event["reason"]) for event in shown["events"]]


def message_of(shown: dict[str, Any], reason: str) -> str:
    (said,) = [event["message"] for event in shown["events"] if event["reason"] == reason]
    return str(said)


def test_blocks_filled_late_run_their_jobs_then_and_keep_or_release_their_vms(
    stack: dict[str, str],
) -> None:
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=45)
    submit_block(stack, "kept", 2, start)
    submit_block(stack, "gone", 1, start, "--release-on-end")
    for block in ("kept", "gone"):
        waiting = until(stack, block, lambda s: ("PROVISIONING", "BLOCK_STARTED") in reasons(s))
        assert "waiting for Google Cloud to fill its reservation" in message_of(
            waiting, "BLOCK_STARTED"
        )
    # Google has not filled them: nothing runs, no VM is asked for.
    time.sleep(10)
    for block in ("kept", "gone"):
        assert status(stack, block)["state"] == "PROVISIONING"
        assert vms(stack, block) == {}
    admin(stack, "/admin/advance", {"seconds": FILL.total_seconds()})  # 5 simulated minutes
    kept = until(stack, "kept", lambda s: s["reason"] == "JOB_SUCCEEDED")
    gone = until(stack, "gone", lambda s: s["state"] == "RELEASED")
    for shown in (kept, gone):
        assert reasons(shown)[-4:-1] == [
            ("PROVISIONING", "BLOCK_STARTED"), ("PROVISIONING", "BLOCK_FILLED"),
            ("ACTIVE", "READY"),
        ]  # fmt: skip
        assert "Google Cloud filled the block's reservation" in message_of(shown, "BLOCK_FILLED")
    # The default block: its job ended, its VMs stay until the block's end, billed in full.
    assert (kept["state"], kept["reason"]) == ("ACTIVE", "JOB_SUCCEEDED")
    end = (start + timedelta(days=1)).isoformat()
    assert f"the block's VMs are kept until its end at {end}" in kept["message"]
    assert "bills the block in full" in kept["message"]
    assert sorted(vms(stack, "kept").values()) == ["RUNNING", "RUNNING"]
    lines = dws(stack, "logs", "kept").stdout.splitlines()
    assert "[0] block job on rank 0" in lines
    assert "[1] block job on rank 1" in lines
    # release_on_end: deleted at once, and still billed in full.
    assert gone["reason"] == "JOB_SUCCEEDED"
    assert "the block's VMs are deleted now (release_on_end)" in gone["message"]
    assert "bills the block in full" in gone["message"]
    deadline = time.monotonic() + 60
    while vms(stack, "gone") and time.monotonic() < deadline:
        time.sleep(1)
    assert vms(stack, "gone") == {}
    time.sleep(5)  # the kept block's VMs are still there after the other's went
    assert sorted(vms(stack, "kept").values()) == ["RUNNING", "RUNNING"]
    assert status(stack, "kept")["state"] == "ACTIVE"
    # A second request into the kept block runs on its VMs, and leaves them there.
    before = instance_ids(stack, "kept")
    second = dws(stack, "submit", "--id", "second", "--tenant", "vision", "--block", "kept",
                 "--", "python3", "-c", SECOND)  # fmt: skip
    assert second.returncode == 0, second.stderr
    done = until(stack, "second", lambda s: s["state"] == "RELEASED", timeout=60)
    assert done["reason"] == "JOB_SUCCEEDED", done
    assert ("ACTIVE", "ON_BLOCK") in reasons(done)
    (started,) = [event for event in done["events"] if event["reason"] == "ON_BLOCK"]
    assert [host["name"] for host in started["hosts"]] == sorted(before)
    lines = dws(stack, "logs", "second").stdout.splitlines()
    assert "[0] second job on rank 0 of second" in lines
    assert "[1] second job on rank 1 of second" in lines
    assert instance_ids(stack, "kept") == before  # the same VMs, still running
    assert sorted(vms(stack, "kept").values()) == ["RUNNING", "RUNNING"]
    assert status(stack, "kept")["state"] == "ACTIVE"
    # The block's end: Google ends its VMs and reservation, and the request ends with it.
    admin(stack, "/admin/advance", {"seconds": timedelta(days=1).total_seconds()})
    ended = until(stack, "kept", lambda s: s["state"] == "EXPIRED")
    assert vms(stack, "kept") == {}
    assert ended["state"] == "EXPIRED"
    usage = dws(stack, "usage", "--tenant", "vision", "--json")
    assert usage.returncode == 0, usage.stderr
    (row,) = [r for r in json.loads(usage.stdout) if r["accelerator"] == "nvidia-h100-80gb"]
    assert row["blocks"] == {"kept_to_end": 1, "released_early": 1}
    table = dws(stack, "usage", "--tenant", "vision")
    assert "1 kept to end, 1 released early (billed in full either way)" in " ".join(
        table.stdout.split()
    )
