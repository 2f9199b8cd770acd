"""Local TPU VMs that really run (emulators.vms): every worker of every READY node of the
simulated Cloud TPU runs the agent as a process of its own, on the worker's own address from
the node's ``networkEndpoints``, with a metadata server that says what a TPU VM's says; the
workers go with their node.

Sources: tpu/docs/reference/rest/v2/projects.locations.nodes (``networkEndpoints[].ipAddress``,
one per TPU VM; ``metadata``; ``serviceAccount.email``); tpu/docs/queued-resources (a deleted
queued resource's TPUs are deleted); the TPU VM metadata JAX reads in
``jax/_src/clusters/cloud_tpu_cluster.py`` (``instance/attributes/agent-worker-number``;
``worker-network-endpoints``, comma-separated entries whose third ``:``-separated field is the
worker's address; ``accelerator-type``; ``tpu-env`` lines ``KEY: 'value'``, with
``MEGASCALE_COORDINATOR_ADDRESS``, ``MEGASCALE_NUM_SLICES`` and ``MEGASCALE_SLICE_ID`` for a
multislice queued resource, tpu/docs/multislice-introduction); TPU VM hostnames
``t1v-n-<hex>-w-<worker>`` (what a TPU VM's ``hostname`` answers on Google);
compute/docs/instances/verifying-instance-identity (``google.compute_engine`` claims of the
identity token). TPU VMs live in a Google tenant project (tpu-env's ``CONSUMER_PROJECT_ID`` is
the user's): Google does not document the token's project for them, so it is a tenant
project's here, never the user's.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest
from google.auth import jwt

from emulators.metadata import ISSUER
from emulators.signing import LocalSigner
from emulators.vms import LOOPBACK_RANGE, VmHost, VmSettings, tpu_tenant_project
from opendws.clock import ManualClock
from opendws.sim import SimulatedCloud
from tests.integration.test_vm_host import (
    JOB,
    AgentFunction,
    alive,
    answers,
    metadata,
    reaped,
    wait_until,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux: /proc")

P, NUMBER, Z = "demo-opendws", 123456789012, "us-west4-a"
LATENCY = timedelta(seconds=20)
ACCOUNT = "opendws-jobs@demo-opendws.iam.gserviceaccount.com"
NAME = re.compile(r"t1v-n-([0-9a-f]{8})-w-(\d+)")


@dataclass
class Local:
    cloud: SimulatedCloud
    host: VmHost
    function: AgentFunction


@pytest.fixture(scope="module")
def signer() -> LocalSigner:
    return LocalSigner(ISSUER, datetime.now(UTC))


@pytest.fixture
def local(signer: LocalSigner, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Local]:
    with AgentFunction(getattr(request, "param", None)) as function:
        settings = VmSettings(
            agent_url=function.url, signer=signer, run_folder=tmp_path, project_id=P,
            project_number=NUMBER, poll_s=0.1,
        )  # fmt: skip
        cloud = SimulatedCloud(
            ManualClock(datetime.now(UTC)), provisioning_latency=LATENCY,
            internal_range=LOOPBACK_RANGE, operation_latency=timedelta(0),
        )  # fmt: skip
        cloud.set_stock(Z, "V5LITE_POD", 64)
        with VmHost(cloud, settings) as host:
            yield Local(cloud, host, function)


def serve(cloud: SimulatedCloud, name: str, topology: str, **spec: Any) -> None:
    """A v5e queued resource of ``topology`` slices, served (ACTIVE: its nodes READY)."""
    node = {
        "acceleratorConfig": {"type": "V5LITE_POD", "topology": topology},
        "runtimeVersion": "v2-alpha-tpuv5-lite",
        # The agent on a TPU VM names its order by the node metadata item opendws-order-key.
        "metadata": {"startup-script": "#!/bin/sh\n", "opendws-order-key": name},
        "serviceAccount": {"email": ACCOUNT, "scope": []},
    }
    body = {"tpu": {"nodeSpec": [{"node": node, **spec}]}}
    cloud.create_queued_resource(P, Z, name, body, "v2alpha1")
    cloud.advance(LATENCY)


def tpu_env(text: str) -> dict[str, str]:
    pairs = [line.split(": ", 1) for line in text.splitlines()]
    assert all(value.startswith("'") and value.endswith("'") for _, value in pairs)
    return {key: value[1:-1] for key, value in pairs}


def test_each_worker_of_a_node_runs_its_agent_with_a_tpu_vms_metadata(
    local: Local, signer: LocalSigner
) -> None:
    """v5e 4x4: four TPU VMs, each its agent, on its own endpoint address, serving its worker
    number, the node's endpoints, accelerator type, tpu-env and metadata, and a token of its
    instance (name, id, zone) in the tenant project with the node's service account."""
    serve(local.cloud, "qr", "4x4", nodeId="slice")
    node = local.cloud.get_node(P, Z, "slice")
    endpoints = [e["ipAddress"] for e in node["networkEndpoints"]]
    wait_until(lambda: len(local.host.workers("slice")) == 4)
    workers = local.host.workers("slice")
    assert set(local.host.vms()) == {vm.instance.name for vm in workers}
    wait_until(lambda: len(local.function.tokens) >= 4)
    tokens = [jwt.decode(t, certs=signer.certs, audience=local.function.url)
              for t in local.function.tokens]  # fmt: skip
    claims = {c["google"]["compute_engine"]["instance_name"]: c for c in tokens}
    hexes = set()
    tenant = tpu_tenant_project(P)
    for worker, vm in enumerate(workers):
        host = vm.metadata_host
        match = NAME.fullmatch(vm.instance.name)
        assert match is not None
        assert int(match.group(2)) == worker
        hexes.add(match.group(1))
        assert (vm.node, vm.worker) == (node["name"], worker)
        assert host.split(":")[0] == endpoints[worker]
        assert ip_address(endpoints[worker]).is_loopback
        assert alive(vm.pid)
        assert metadata(host, "instance/name") == vm.instance.name
        assert metadata(host, "instance/id") == vm.instance.instance_id
        assert vm.instance.instance_id.isdigit()
        assert metadata(host, "instance/zone") == f"projects/{NUMBER}/zones/{Z}"
        assert metadata(host, "instance/network-interfaces/0/ip") == endpoints[worker]
        assert metadata(host, "project/project-id") == P
        assert metadata(host, "instance/service-accounts/default/email") == ACCOUNT
        attributes = "instance/attributes/"
        assert metadata(host, attributes + "agent-worker-number") == str(worker)
        assert metadata(host, attributes + "worker-network-endpoints") == ",".join(
            f"unknown:unknown:{ip}" for ip in endpoints
        )
        assert [e.split(":")[2] for e in metadata(host, attributes + "worker-network-endpoints")
                .split(",")] == endpoints  # fmt: skip
        assert metadata(host, attributes + "accelerator-type") == "v5litepod-16"
        assert metadata(host, attributes + "startup-script") == "#!/bin/sh\n"
        assert metadata(host, attributes + "opendws-order-key") == "qr"
        assert metadata(host, attributes + "opendws-agent-url") == local.function.url
        assert tpu_env(metadata(host, attributes + "tpu-env")) == {
            "ACCELERATOR_TYPE": "v5litepod-16", "NODE_ID": "slice", "WORKER_ID": str(worker),
            "ZONE": Z, "TOPOLOGY": "4x4", "CONSUMER_PROJECT_ID": P,
            "CONSUMER_PROJECT_NUMBER": str(NUMBER),
        }  # fmt: skip
        engine = claims[vm.instance.name]["google"]["compute_engine"]
        assert engine["instance_id"] == vm.instance.instance_id
        assert engine["zone"] == Z
        assert (engine["project_id"], engine["project_number"]) == tenant
        assert engine["project_id"] != P
        assert engine["project_number"] != NUMBER
        assert claims[vm.instance.name]["email"] == ACCOUNT
    assert len(hexes) == 1
    assert len({vm.instance.instance_id for vm in workers}) == 4
    assert str(node["id"]) not in {vm.instance.instance_id for vm in workers}


def test_the_workers_of_a_multislice_queued_resource_see_googles_multislice_variables(
    local: Local,
) -> None:
    """Two v5e 2x4 slices (one TPU VM each): MEGASCALE_NUM_SLICES 2, MEGASCALE_SLICE_ID the
    node's index, MEGASCALE_COORDINATOR_ADDRESS node 0 worker 0's address, port 8080; each
    node's TPU VMs have names of their own."""
    serve(local.cloud, "qr", "2x4", multiNodeParams={"nodeCount": 2, "nodeIdPrefix": "o"})
    wait_until(lambda: len(local.host.vms()) == 2)
    first = local.cloud.get_node(P, Z, "o-0")["networkEndpoints"][0]["ipAddress"]
    for index in (0, 1):
        (vm,) = local.host.workers(f"o-{index}")
        env = tpu_env(metadata(vm.metadata_host, "instance/attributes/tpu-env"))
        assert env["NODE_ID"] == f"o-{index}"
        assert env["WORKER_ID"] == "0"
        assert env["MEGASCALE_NUM_SLICES"] == "2"
        assert env["MEGASCALE_SLICE_ID"] == str(index)
        assert env["MEGASCALE_COORDINATOR_ADDRESS"] == f"{first}:8080"
    names = [local.host.workers(f"o-{i}")[0].instance.name for i in (0, 1)]
    assert NAME.fullmatch(names[0])
    assert NAME.fullmatch(names[1])
    assert names[0][:14] != names[1][:14]


@pytest.mark.parametrize("local", [[sys.executable, "-c", JOB]], indirect=True)
def test_a_deleted_queued_resource_powers_off_every_worker_within_a_second(
    local: Local,
) -> None:
    """The queued resource deleted: its node goes, and with it every TPU VM's agent, job and
    metadata server."""
    serve(local.cloud, "qr", "4x4", nodeId="slice")
    wait_until(lambda: len(local.host.workers("slice")) == 4)
    workers = local.host.workers("slice")
    wait_until(lambda: all((vm.folder / "job.pids").exists() for vm in workers))
    jobs = [int(pid) for vm in workers for pid in (vm.folder / "job.pids").read_text().split()]
    assert all(alive(pid) for pid in jobs)
    local.cloud.delete_queued_resource(P, Z, "qr", force=True)
    took = wait_until(lambda: all(reaped(vm.pid) for vm in workers)
                      and not [pid for pid in jobs if alive(pid)]
                      and not [vm for vm in workers if answers(vm.metadata_host)], 5)  # fmt: skip
    assert took < 1.0
    assert local.host.vms() == {}


@pytest.mark.parametrize("local", [[sys.executable, "-c", JOB]], indirect=True)
def test_kill_vm_kills_one_workers_agent_and_the_others_run_on(local: Local) -> None:
    serve(local.cloud, "qr", "4x4", nodeId="slice")
    wait_until(lambda: len(local.host.workers("slice")) == 4)
    victim, *others = local.host.workers("slice")
    assert local.host.kill_vm(victim.instance.name) == victim.pid
    assert reaped(victim.pid)
    assert all(alive(vm.pid) for vm in others)
    assert local.host.workers("slice")[0] == victim  # still the TPU VM, no new agent
