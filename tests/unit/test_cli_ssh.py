"""``dws status`` shows where an ACTIVE request's capacity is, and ``dws ssh ID [--rank R]``
hands the terminal to ``gcloud compute ssh NAME --zone ZONE --project P`` for that VM, through
IAP (``--tunnel-through-iap``) when the VM has no external address
(cloud.google.com/iap/docs/using-tcp-forwarding: IAP TCP forwarding reaches "VM instances that
do not have external IP addresses"; gcloud compute ssh's ``--tunnel-through-iap``). What it
cannot do is refused by name, before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from opendws import bootstrap
from opendws.cli import main
from opendws.domain.states import RequestState
from opendws.ports import Host
from tests.builders import A3, ZONE, flex
from tests.unit.test_client import System

S = RequestState
ROOT = Path(__file__).resolve().parents[2]
HOSTS = (
    Host(rank=0, name="odws-train-0", zone=ZONE, internal_ip="10.128.0.2"),
    Host(rank=1, name="odws-train-1", zone=ZONE, internal_ip="10.128.0.3",
         external_ip="34.0.0.3"),
)  # fmt: skip


def _active(system: System) -> None:
    system.stored(flex("train", tenant="vision", vm_count=2))
    system.move("train", S.PROVISIONING, pool=f"{ZONE}/{A3}", attempt=1)
    system.move("train", S.ACTIVE, pool=f"{ZONE}/{A3}", hosts=HOSTS)


@pytest.fixture
def system(monkeypatch: pytest.MonkeyPatch) -> Iterator[System]:
    def no_exec(*args: object) -> None:
        raise AssertionError("dws ssh must refuse before it runs gcloud")

    monkeypatch.setattr(os, "execvp", no_exec)
    system = System()
    previous = bootstrap.use(system.client.container)
    yield system
    bootstrap.use(previous)


def test_status_shows_the_hosts_of_an_active_request(system: System) -> None:
    _active(system)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["status", "train", "--wide"])
    assert result.exit_code == 0, result.output
    for host in HOSTS:
        assert host.name in result.stdout
        assert host.internal_ip in result.stdout
    assert "34.0.0.3" in result.stdout
    assert "dws ssh train" in result.stdout
    shown = json.loads(CliRunner().invoke(main, ["status", "train", "--json"]).stdout)
    assert shown["hosts"] == [
        {"rank": 0, "name": "odws-train-0", "zone": ZONE, "internal_ip": "10.128.0.2",
         "external_ip": None},
        {"rank": 1, "name": "odws-train-1", "zone": ZONE, "internal_ip": "10.128.0.3",
         "external_ip": "34.0.0.3"},
    ]  # fmt: skip


def test_status_of_a_request_not_active_shows_no_hosts(system: System) -> None:
    system.stored(flex("train", tenant="vision"))
    result = CliRunner().invoke(main, ["status", "train", "--json"])
    assert json.loads(result.stdout)["hosts"] == []
    assert "dws ssh" not in CliRunner().invoke(main, ["status", "train"]).stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["ssh", "nothing"], "no request 'nothing'"),
        (["ssh", "train"], "train is PENDING: only an ACTIVE request has VMs to reach"),
    ],
)
def test_ssh_refuses_an_unknown_or_inactive_request(
    system: System, args: list[str], says: str
) -> None:
    system.stored(flex("train", tenant="vision"))
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert says in result.stderr


def test_ssh_refuses_a_rank_the_gang_has_not(system: System) -> None:
    _active(system)
    result = CliRunner().invoke(main, ["ssh", "train", "--rank", "2"])
    assert result.exit_code == 2
    assert "train has no rank 2: its ranks are 0 to 1" in result.stderr


def test_ssh_without_gcloud_says_how_to_get_it(
    system: System, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _active(system)
    monkeypatch.setenv("PATH", str(tmp_path))
    result = CliRunner().invoke(main, ["ssh", "train"])
    assert result.exit_code == 2
    assert "gcloud is not on PATH" in result.stderr


# The real command, in a process of its own: the stand-in gcloud replaces it (execvp) and
# records its command line.
_RUN = textwrap.dedent("""
    import sys
    from opendws import bootstrap
    from opendws.cli import main
    from tests.unit.test_cli_ssh import System, _active

    system = System()
    _active(system)
    bootstrap.use(system.client.container)
    main(sys.argv[1:])
""")


def _gcloud_argv(tmp_path: Path, *args: str) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    recorded = tmp_path / "argv"
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(f'#!/bin/sh\nprintf "%s\\n" "$0" "$@" > {recorded}\n')
    gcloud.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", _RUN, *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = recorded.read_text().splitlines()
    assert Path(lines[0]).name == "gcloud"
    return lines[1:]


def test_ssh_runs_gcloud_compute_ssh_through_iap_to_a_vm_without_an_external_address(
    tmp_path: Path,
) -> None:
    assert _gcloud_argv(tmp_path, "ssh", "train") == [
        "compute", "ssh", "odws-train-0", "--zone", ZONE, "--project", "client-test",
        "--tunnel-through-iap",
    ]  # fmt: skip


def test_ssh_to_a_rank_with_an_external_address_goes_direct_with_the_users_arguments(
    tmp_path: Path,
) -> None:
    argv = _gcloud_argv(tmp_path, "ssh", "train", "--rank", "1", "--", "--command", "nvidia-smi")
    assert argv == [
        "compute", "ssh", "odws-train-1", "--zone", ZONE, "--project", "client-test",
        "--command", "nvidia-smi",
    ]  # fmt: skip


def test_ssh_to_a_tpu_worker_is_gcloud_tpu_vm_ssh_to_its_node_and_worker() -> None:
    """A TPU worker is reached as Google's TPU VM: ``gcloud compute tpus tpu-vm ssh NODE
    --worker=N`` (sdk/gcloud/reference/compute/tpus/tpu-vm/ssh), over its internal address
    when it has no external one (``--internal-ip``; that command has no IAP flag)."""
    from opendws.cli.requests import ssh_command
    from opendws.ports import Host

    hosts = [
        Host(rank=rank, name=f"odws-x-{rank // 4}", zone=ZONE, internal_ip=f"10.0.0.{rank}",
             worker=rank % 4, external_ip="34.0.0.1" if rank == 6 else None)
        for rank in range(8)
    ]  # fmt: skip
    assert ssh_command(hosts, 5, "p", request_id="x", state="ACTIVE") == [
        "gcloud", "compute", "tpus", "tpu-vm", "ssh", "odws-x-1", "--worker=1", "--zone", ZONE,
        "--project", "p", "--internal-ip",
    ]  # fmt: skip
    assert ssh_command(hosts, 6, "p", ["--command", "ls"], request_id="x", state="ACTIVE") == [
        "gcloud", "compute", "tpus", "tpu-vm", "ssh", "odws-x-1", "--worker=2", "--zone", ZONE,
        "--project", "p", "--command", "ls",
    ]  # fmt: skip
