"""Local VMs that really run (emulators.vms): each RUNNING VM of the simulated cloud runs the
agent as a process of its own, with its own loopback address (its ``networkIP``) and its own
metadata server, and a VM the cloud ends takes its processes with it.

Sources: compute/docs/reference/rest/v1/instances (``networkInterfaces[0].networkIP``, the
VM's internal address; ``id``, never reused, where the name may be); compute/docs/metadata/
predefined-metadata-keys (``instance/name``, ``instance/id``, ``instance/zone`` as
``projects/NUMBER/zones/ZONE``, custom metadata under ``instance/attributes/``);
compute/docs/instances/verifying-instance-identity (the identity token the agent presents:
``google.compute_engine.{project_id, zone, instance_name, instance_id}``);
compute/docs/instance-groups/about-resize-requests-mig (``requestedRunDuration``: "At the end
of the run duration, the MIG deletes the created VMs").

The agent function here is a stand-in (an http.server) that answers the agent's protocol: a
404 to ``/v1/register`` (no run: the agent idles) or a run whose job starts a child of its own.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest

from emulators.metadata import ISSUER
from emulators.signing import LocalSigner
from emulators.vms import LOOPBACK_RANGE, VmHost, VmSettings
from opendws.adapters.vm_identity import VmIdentityVerifier
from opendws.clock import ManualClock
from opendws.sim import SimulatedCloud

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /proc")

P, NUMBER, Z, SHAPE = "demo-opendws", 123456789012, "us-central1-a", "a3-highgpu-8g"
LATENCY = timedelta(seconds=20)
RUN = timedelta(hours=1)
NIC = {"network": "global/networks/default"}
# The job: writes its own process id and its child's into job.pids (in the VM's folder, its
# working directory), then waits; the child sleeps in the job's session.
JOB = textwrap.dedent("""
    import os, subprocess, time
    child = subprocess.Popen(["sleep", "300"])
    with open("job.pids.tmp", "w") as out:
        out.write(f"{os.getpid()} {child.pid}")
    os.rename("job.pids.tmp", "job.pids")
    time.sleep(300)
""")


def wait_until(check: Callable[[], bool], timeout_s: float = 10.0) -> float:
    """Seconds until ``check`` held; AssertionError after ``timeout_s``."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout_s:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)
    return time.monotonic() - start


def alive(pid: int) -> bool:
    """Whether process ``pid`` lives (a zombie, dead but not yet reaped by whoever adopted it,
    does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


def reaped(pid: int) -> bool:
    """Whether ``pid`` is gone altogether (``os.kill(pid, 0)`` finds no process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@dataclass
class AgentFunction:
    """The agent function's stand-in: the registrations it was sent (their bearer tokens),
    and, when ``command`` is set, a run of one rank that starts at once."""

    command: list[str] | None = None
    tokens: list[str] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, path: str, authorization: str) -> tuple[int, dict[str, Any]]:
        if path == "/v1/register":
            self.tokens.append(authorization.removeprefix("Bearer "))
            if self.command is None:
                return 404, {"error": "no run for this order"}
            return 200, {"session": "s", "request_id": "r", "order": "o", "attempt": 1,
                         "rank": 0, "num_nodes": 1, "heartbeat_s": 1}  # fmt: skip
        if path == "/v1/barrier":
            return 200, {"ready": True, "command": self.command, "image": None, "env": {}}
        if path == "/v1/heartbeat":
            return 200, {"stop": False, "grace_s": 5}
        return 200, {}

    def __enter__(self) -> AgentFunction:
        function = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, reply = function.answer(self.path, self.headers.get("Authorization", ""))
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def signer() -> LocalSigner:
    return LocalSigner(ISSUER, datetime.now(UTC))


def make_cloud(internal_range: str = LOOPBACK_RANGE) -> SimulatedCloud:
    cloud = SimulatedCloud(
        ManualClock(datetime.now(UTC)),
        provisioning_latency=LATENCY,
        internal_range=internal_range,
        operation_latency=timedelta(0),
    )
    properties = {"machineType": SHAPE, "networkInterfaces": [NIC]}
    cloud.insert_instance_template(P, {"name": "tpl", "properties": properties})
    cloud.insert_instance_group_manager(
        P, Z, {"name": "mig", "instanceTemplate": "global/instanceTemplates/tpl"}
    )
    cloud.set_stock(Z, SHAPE, 8)
    return cloud


def serve_gang(cloud: SimulatedCloud, vms: list[str]) -> None:
    """A resize request for ``vms``, served: they are RUNNING."""
    body = {
        "name": "rr",
        "instances": [{"name": vm} for vm in vms],
        "requestedRunDuration": {"seconds": str(int(RUN.total_seconds()))},
    }
    cloud.insert_resize_request(P, Z, "mig", body, "beta")
    cloud.advance(LATENCY)


def delete(cloud: SimulatedCloud, vm: str) -> None:
    cloud.delete_managed_instances(P, Z, "mig", {"instances": [f"zones/{Z}/instances/{vm}"]})


@dataclass
class Local:
    cloud: SimulatedCloud
    host: VmHost
    function: AgentFunction
    settings: VmSettings


@pytest.fixture
def local(signer: LocalSigner, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Local]:
    command = getattr(request, "param", None)
    with AgentFunction(command) as function:
        settings = VmSettings(
            agent_url=function.url, signer=signer, run_folder=tmp_path, project_id=P,
            project_number=NUMBER, poll_s=0.1,
        )  # fmt: skip
        cloud = make_cloud()
        with VmHost(cloud, settings) as host:
            yield Local(cloud, host, function, settings)


def metadata(address: str, path: str) -> str:
    request = urllib.request.Request(
        f"http://{address}/computeMetadata/v1/{path}", headers={"Metadata-Flavor": "Google"}
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        text: str = answer.read().decode()
        return text


def answers(address: str) -> bool:
    """Whether a metadata server answers at ``address``."""
    try:
        metadata(address, "instance/name")
    except OSError:
        return False
    return True


def job_pids(local: Local, vm: str) -> tuple[int, int]:
    """The job's process id and its child's, once the job has written them."""
    folder = local.host.vms()[vm].folder
    wait_until((folder / "job.pids").exists)
    job, child = (folder / "job.pids").read_text().split()
    return int(job), int(child)


def test_each_running_vm_runs_its_agent_on_its_own_address_with_its_own_metadata_server(
    local: Local, signer: LocalSigner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each VM: a process of its own (the agent, in a session of its own); a metadata server
    on the VM's own networkIP answering its name, id, zone, project and attributes; an
    identity token the agent function's verifier accepts as that VM."""
    monkeypatch.setenv("OPENDWS_SECRET_OF_THE_STACK", "x")
    monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", "127.0.0.1:1")
    serve_gang(local.cloud, ["o-0", "o-1"])
    wait_until(lambda: len(local.host.vms()) == 2)
    vms = local.host.vms()
    verifier = VmIdentityVerifier(audience=local.function.url, project_id=P, certs=signer.certs,
                                  issuers=frozenset({ISSUER}))  # fmt: skip
    wait_until(lambda: len(local.function.tokens) >= 2)
    identities = {verifier.verify(f"Bearer {t}").instance_name: verifier.verify(f"Bearer {t}")
                  for t in local.function.tokens}  # fmt: skip
    addresses = set()
    for name in ("o-0", "o-1"):
        view = local.cloud.get_instance(P, Z, name)
        vm = vms[name]
        address = view["networkInterfaces"][0]["networkIP"]
        assert ip_address(address).is_loopback
        assert address != "127.0.0.1"
        assert vm.instance.internal_ip == address
        assert vm.metadata_host.split(":")[0] == address
        addresses.add(address)
        assert alive(vm.pid)
        assert os.getsid(vm.pid) == vm.pid
        assert metadata(vm.metadata_host, "instance/name") == name
        assert metadata(vm.metadata_host, "instance/id") == view["id"]
        assert metadata(vm.metadata_host, "instance/zone") == f"projects/{NUMBER}/zones/{Z}"
        assert metadata(vm.metadata_host, "instance/network-interfaces/0/ip") == address
        assert metadata(vm.metadata_host, "project/project-id") == P
        assert (metadata(vm.metadata_host, "instance/attributes/opendws-agent-url")
                == local.function.url)  # fmt: skip
        identity = identities[name]
        assert (identity.instance_id, identity.zone, identity.project_id,
                identity.project_number) == (view["id"], Z, P, NUMBER)  # fmt: skip
        environment = Path(f"/proc/{vm.pid}/environ").read_bytes().split(b"\0")
        assert f"GCE_METADATA_HOST={vm.metadata_host}".encode() in environment
        assert not [v for v in environment if v.startswith((b"OPENDWS_", b"FIRESTORE_"))]
        assert vm.log.exists()
    assert len(addresses) == 2
    wait_until(lambda: all(b"no run for this VM's order" in vms[n].log.read_bytes()
                           for n in ("o-0", "o-1")))  # fmt: skip


@pytest.mark.parametrize("local", [[sys.executable, "-c", JOB]], indirect=True)
@pytest.mark.parametrize("end", ["deleted", "run-time limit"])
def test_a_vm_the_cloud_ends_takes_its_agent_its_job_and_the_jobs_children_within_a_second(
    local: Local, end: str
) -> None:
    """A VM deleted (a release) or ended at its run time (requestedRunDuration): its agent,
    its job and what the job started are killed within a second; its metadata server stops;
    the other VM runs on (when only one goes)."""
    serve_gang(local.cloud, ["o-0", "o-1"])
    wait_until(lambda: len(local.host.vms()) == 2)
    vm, other = local.host.vms()["o-0"], local.host.vms()["o-1"]
    job, child = job_pids(local, "o-0")
    assert alive(job)
    assert alive(child)
    if end == "deleted":
        delete(local.cloud, "o-0")
    else:  # only the clock moves: the host's own looks at the cloud settle it
        local.cloud.clock.advance(RUN)
    took = wait_until(lambda: reaped(vm.pid) and not alive(job) and not alive(child)
                      and not answers(vm.metadata_host), 5)  # fmt: skip
    assert took < 1.0
    if end == "deleted":
        assert alive(other.pid)
        assert set(local.host.vms()) == {"o-1"}
    else:
        wait_until(lambda: local.host.vms() == {} and reaped(other.pid), 2)


@pytest.mark.parametrize("local", [[sys.executable, "-c", JOB]], indirect=True)
def test_kill_vm_sigkills_the_agent_its_job_goes_with_it_and_the_vm_stays_without_one(
    local: Local,
) -> None:
    serve_gang(local.cloud, ["o-0"])
    wait_until(lambda: "o-0" in local.host.vms())
    vm = local.host.vms()["o-0"]
    job, child = job_pids(local, "o-0")
    assert local.host.kill_vm("o-0") == vm.pid
    assert reaped(vm.pid)
    wait_until(lambda: not alive(job), 2)  # the agent's death signal for its job
    time.sleep(3 * local.settings.poll_s)
    assert local.host.vms() == {"o-0": vm}  # still the VM, not started again
    with pytest.raises(KeyError, match="no VM named 'o-9'"):
        local.host.kill_vm("o-9")
    delete(local.cloud, "o-0")  # what the agent left running goes with the VM
    wait_until(lambda: not alive(child), 2)


@pytest.mark.parametrize("local", [[sys.executable, "-c", JOB]], indirect=True)
def test_close_leaves_no_process_and_no_metadata_server(local: Local) -> None:
    serve_gang(local.cloud, ["o-0", "o-1", "o-2"])
    wait_until(lambda: len(local.host.vms()) == 3)
    vms = local.host.vms().values()
    jobs = [pid for name in ("o-0", "o-1", "o-2") for pid in job_pids(local, name)]
    local.host.close()
    assert all(reaped(vm.pid) for vm in vms)
    assert not [pid for pid in jobs if alive(pid)]
    assert not [vm for vm in vms if answers(vm.metadata_host)]
    local.host.close()  # again: nothing left to do


def test_a_vm_that_comes_back_under_its_name_is_another_vm_with_another_agent(
    local: Local,
) -> None:
    serve_gang(local.cloud, ["o-0"])
    wait_until(lambda: "o-0" in local.host.vms())
    first = local.host.vms()["o-0"]
    delete(local.cloud, "o-0")
    body = {"name": "rr2", "instances": [{"name": "o-0"}],
            "requestedRunDuration": {"seconds": "3600"}}  # fmt: skip
    local.cloud.insert_resize_request(P, Z, "mig", body, "beta")
    local.cloud.advance(LATENCY)
    wait_until(lambda: "o-0" in local.host.vms() and local.host.vms()["o-0"] != first)
    second = local.host.vms()["o-0"]
    assert second.instance.instance_id != first.instance.instance_id
    assert second.pid != first.pid
    assert reaped(first.pid)
    assert metadata(second.metadata_host, "instance/id") == second.instance.instance_id


def test_vms_whose_addresses_are_not_loopback_are_not_run(
    signer: LocalSigner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cloud made without the loopback range gives 10.128.0.x addresses, which no local
    process can listen on as the VM: the host says so rather than run the VM elsewhere."""
    cloud = make_cloud(internal_range="10.128.0.0/9")
    settings = VmSettings(agent_url="http://127.0.0.1:9", signer=signer, run_folder=tmp_path,
                          project_id=P, project_number=NUMBER)  # fmt: skip
    serve_gang(cloud, ["o-0"])
    with caplog.at_level(logging.ERROR, logger="emulators.vms"), VmHost(cloud, settings) as host:
        host.sync()
        assert host.vms() == {}
    assert "internal address 10.128.0.2 is not a loopback address" in caplog.text
