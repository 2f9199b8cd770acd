"""TPU slices run their jobs: the rank of each worker (node, then ``agent-worker-number``), the
workers a slice has, a TPU worker's registration held to its node as the TPU API reports it, and
what the agent asks of its metadata server and of Docker on a TPU VM.

Sources: tpu/docs/v5e and tpu/docs/v6e ("Configurations": v5litepod-8 / v6e-8 is one host,
v5litepod-16 four); tpu/docs/reference/rest/v2/projects.locations.nodes (``networkEndpoints``,
``metadata`` "Can set startup-script", ``serviceAccount``); MultiNodeParams.nodeIdPrefix (nodes
``{prefix}-{i}``); compute/docs/instances/verifying-instance-identity (the
``google.compute_engine`` claims of every VM's token; nothing TPU-specific is documented);
tpu/docs/run-in-container (``docker run --net=host --privileged``); JAX's
jax/_src/clusters/cloud_tpu_cluster.py and Ray's ray/_private/accelerators/tpu.py
(``agent-worker-number``, ``tpu-env`` of ``KEY: 'value'`` lines)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from opendws.adapters.gce import CloudSettings
from opendws.adapters.tpu import nodes_hosts, queued_resource_spec, tpu_node
from opendws.agent import transport
from opendws.agent.job import docker_argv
from opendws.catalog import tpu_hosts
from opendws.domain.model import GangShape
from opendws.ports import Host, Order, tpu_node_index, tpu_rank
from opendws.ports.access import Forbidden
from opendws.ports.runs import (
    TPU_ORDER_KEY,
    TpuNode,
    TpuWorkerClaim,
    VmIdentity,
    accelerators_per_rank,
    bind_tpu,
    gang_ranks,
    workers_per_node,
)
from tests.builders import flex, tpu_pool

ORDER = "odws-train-0123456789-1"
ZONE = "us-west4-a"
ACCOUNT = "opendws-vm@demo-opendws.iam.gserviceaccount.com"


@pytest.mark.parametrize(
    ("accelerator", "chips", "hosts"),
    [("tpu-v5e", 1, 1), ("tpu-v5e", 8, 1), ("tpu-v5e", 16, 4), ("tpu-v5e", 256, 64),
     ("tpu-v6e", 8, 1), ("tpu-v6e", 32, 8), ("tpu-v5p", 4, 1), ("tpu-v5p", 8, 2),
     ("tpu-v4", 4, 1), ("tpu-v4", 32, 8)],
)  # fmt: skip
def test_a_slice_has_one_worker_per_host(accelerator: str, chips: int, hosts: int) -> None:
    assert tpu_hosts(accelerator, chips) == hosts


def test_ranks_run_over_nodes_then_workers() -> None:
    two_v5e_16 = GangShape(vm_count=2, topology="4x4", accelerator="tpu-v5e")
    assert (gang_ranks(two_v5e_16), workers_per_node(two_v5e_16)) == (8, 4)
    assert accelerators_per_rank(two_v5e_16) == 4
    assert [tpu_rank(node, worker, 4) for node in (0, 1) for worker in range(4)] == list(range(8))
    with pytest.raises(ValueError, match="worker 4 is not one of the node's 4 workers"):
        tpu_rank(0, 4, 4)
    gpus = GangShape(vm_count=3, machine_type="a3-highgpu-8g", accelerators_per_vm=8,
                     accelerator="nvidia-h100-80gb")  # fmt: skip
    assert (gang_ranks(gpus), accelerators_per_rank(gpus)) == (3, 8)


def test_a_node_is_indexed_within_its_order() -> None:
    assert tpu_node_index(ORDER, ORDER) == 0
    assert tpu_node_index(f"{ORDER}-3", ORDER) == 3
    assert tpu_node_index("odws-other-1", ORDER) is None
    assert tpu_node_index(f"{ORDER}-x", ORDER) is None


def test_a_host_says_its_worker_and_reads_back() -> None:
    host = Host(rank=5, name=f"{ORDER}-1", zone=ZONE, internal_ip="10.0.0.7", worker=1)
    assert host.to_json()["worker"] == 1
    assert Host.from_json(host.to_json()) == host
    vm = Host(rank=0, name=f"{ORDER}-0", zone=ZONE, internal_ip="10.0.0.2")
    assert "worker" not in vm.to_json()
    assert Host.from_json(vm.to_json()) == vm


def _order(slices: int, topology: str = "4x4") -> Order:
    request = flex("train", vm_count=slices, topology=topology, locations=(ZONE,))
    return Order(request=request, pool=tpu_pool(zone=ZONE), attempt=1)


def test_the_queued_resource_carries_the_agent_the_url_a_key_and_the_account() -> None:
    settings = CloudSettings(project="demo-opendws", agent_url="https://agent.example/",
                             vm_service_account=ACCOUNT)  # fmt: skip
    first = queued_resource_spec(settings, _order(2))["node"]
    metadata = first["metadata"]
    assert metadata["startup-script"].startswith("#!/bin/bash")
    assert metadata["opendws-agent-url"] == "https://agent.example/"
    assert len(metadata[TPU_ORDER_KEY]) >= 32
    assert first["serviceAccount"] == {
        "email": ACCOUNT, "scope": ["https://www.googleapis.com/auth/cloud-platform"],
    }  # fmt: skip
    again = queued_resource_spec(settings, _order(2))["node"]["metadata"][TPU_ORDER_KEY]
    assert again != metadata[TPU_ORDER_KEY]  # a new order, a new key
    bare = queued_resource_spec(CloudSettings(project="demo-opendws"), _order(1))["node"]
    assert "metadata" not in bare
    assert "serviceAccount" not in bare


def _node(name: str, workers: int, base: int, **fields: Any) -> dict[str, Any]:
    return {
        "name": f"projects/demo-opendws/locations/{ZONE}/nodes/{name}",
        "state": "READY",
        "queuedResource": f"projects/demo-opendws/locations/{ZONE}/queuedResources/{ORDER}",
        "networkEndpoints": [
            {"ipAddress": f"10.0.0.{base + w}", "port": 8470} for w in range(workers)
        ],
        "serviceAccount": {"email": ACCOUNT, "scope": []},
        "metadata": {TPU_ORDER_KEY: "k" * 32},
        **fields,
    }


def test_a_gangs_workers_are_its_hosts_in_rank_order() -> None:
    nodes = [_node(f"{ORDER}-1", 4, 20), _node(f"{ORDER}-0", 4, 10),
             _node("someone-elses", 1, 90, queuedResource="")]  # fmt: skip
    nodes[0]["networkEndpoints"][2]["accessConfig"] = {"externalIp": "34.1.2.3"}
    hosts = nodes_hosts(nodes, ZONE)[ORDER]
    assert [(h.rank, h.name.rsplit("-", 1)[-1], h.worker) for h in hosts] == [
        (rank, str(rank // 4), rank % 4) for rank in range(8)
    ]
    assert hosts[0].internal_ip == "10.0.0.10"
    assert hosts[4].internal_ip == "10.0.0.20"
    assert hosts[6].external_ip == "34.1.2.3"
    assert list(nodes_hosts(nodes, ZONE)) == [ORDER]


IDENTITY = VmIdentity(
    project_id="tpu-tenant-project", project_number=42, zone=ZONE,
    instance_name="t1v-n-5269661a-w-2", instance_id="881", instance_creation_timestamp=1,
    email=ACCOUNT,
)  # fmt: skip
CLAIM = TpuWorkerClaim(node=f"{ORDER}-1", worker=2, key="k" * 32)


def _tpu_node(**fields: Any) -> TpuNode:
    return replace(tpu_node(_node(f"{ORDER}-1", 4, 20), ZONE), **fields)


def test_a_worker_is_ranked_by_its_node_and_number() -> None:
    assert bind_tpu(IDENTITY, CLAIM, _tpu_node(), ORDER, 4) == 6


@pytest.mark.parametrize(
    ("identity", "claim", "node", "says"),
    [
        (IDENTITY, CLAIM, None, "does not exist"),
        (IDENTITY, CLAIM, _tpu_node(name="odws-other-1"), "not one of order"),
        (IDENTITY, replace(CLAIM, key="j" * 32), _tpu_node(), "a worker of another node"),
        (IDENTITY, CLAIM, _tpu_node(order_key=None), "a worker of another node"),
        (replace(IDENTITY, zone="us-east5-a"), CLAIM, _tpu_node(), "is in zone"),
        (replace(IDENTITY, email="x@y.iam.gserviceaccount.com"), CLAIM, _tpu_node(), "runs as"),
        (IDENTITY, CLAIM, _tpu_node(state="CREATING"), "not READY"),
        (IDENTITY, replace(CLAIM, worker=7), _tpu_node(), "has 4 workers, not a worker 7"),
        (IDENTITY, replace(CLAIM, worker=1), _tpu_node(), "is worker 2, not worker 1"),
    ],
    ids=["no-node", "other-order", "other-key", "no-key", "zone", "account", "not-ready",
         "no-such-worker", "other-worker"],
)  # fmt: skip
def test_a_worker_that_is_not_what_it_claims_is_refused(
    identity: VmIdentity, claim: TpuWorkerClaim, node: TpuNode | None, says: str
) -> None:
    with pytest.raises(Forbidden, match=says):
        bind_tpu(identity, claim, node, ORDER, 4)


@pytest.mark.parametrize(
    ("data", "says"),
    [(None, "an object"), ({"worker": 0, "key": "k"}, "tpu.node"),
     ({"node": "n", "worker": -1, "key": "k"}, "tpu.worker"),
     ({"node": "n", "worker": True, "key": "k"}, "tpu.worker"),
     ({"node": "n", "worker": 0}, "tpu.key")],
)  # fmt: skip
def test_a_malformed_claim_says_what_is_wrong(data: object, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        TpuWorkerClaim.from_json(data)


def test_a_tpu_container_is_privileged_on_the_host_network_without_gpus() -> None:
    argv = docker_argv("img", ["python", "t.py"], ["A"], "job", devices="tpu")
    assert "--privileged" in argv
    assert "--gpus" not in argv
    assert argv[argv.index("--network") + 1] == "host"
    gpu = docker_argv("img", ["python", "t.py"], ["A"], "job")
    assert gpu[gpu.index("--gpus") + 1] == "all"
    assert "--privileged" not in gpu
    with pytest.raises(ValueError, match="devices"):
        docker_argv("img", ["x"], [], "job", devices="fpga")


TPU_ENV = "ACCELERATOR_TYPE: 'v5litepod-16'\nNODE_ID: 'my-node-1'\nWORKER_ID: '3'\nZONE: 'z'\n"


def test_the_agent_reads_its_claim_from_the_metadata_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    values = {"instance/attributes/agent-worker-number": "3",
              "instance/attributes/tpu-env": TPU_ENV,
              "instance/attributes/opendws-order-key": "k" * 32}  # fmt: skip

    def metadata(path: str, query: object = None) -> str:
        if path not in values:
            raise transport.Refused(404, "not found")
        return values[path]

    monkeypatch.setattr(transport, "metadata", metadata)
    assert transport.tpu_claim() == {"node": "my-node-1", "worker": 3, "key": "k" * 32}
    assert transport.tpu_env_value(TPU_ENV, "ACCELERATOR_TYPE") == "v5litepod-16"
    del values["instance/attributes/opendws-order-key"]
    with pytest.raises(transport.Unreachable, match="lacks a value"):
        transport.tpu_claim()
    values.clear()
    assert transport.tpu_claim() is None  # a GPU VM: no agent-worker-number


class Nodes:
    """The TPU API's nodes, as the agent function reads them."""

    def __init__(self, *nodes: TpuNode) -> None:
        self.known = {node.name: node for node in nodes}

    def node(self, zone: str, name: str) -> TpuNode | None:
        found = self.known.get(name)
        return found if found is not None and found.zone == zone else None


def test_a_two_slice_gangs_workers_register_meet_and_see_ranks_0_to_7() -> None:
    """On the in-memory world with tokens signed as the metadata emulator signs them and the
    real verifier: a worker's token, whatever project it names, is held to its node; another
    node's worker is refused; the barrier opens at eight ranks with a TPU job's environment."""
    from datetime import UTC, datetime, timedelta

    from emulators.metadata import Instance, identity_claims
    from emulators.signing import LocalSigner
    from opendws.adapters.memory import MemoryNudger
    from opendws.adapters.ranks import MemoryRankStore
    from opendws.adapters.vm_identity import EMULATOR_ISSUER, VmIdentityVerifier
    from opendws.domain.run import RunSpec
    from opendws.domain.states import RequestState
    from opendws.ports import order_name
    from opendws.service.agents import AgentService, Sessions
    from opendws.service.release import EndService
    from tests.unit.test_agent_service import AGENT_URL, PROJECT, Logs, Secrets, Vms
    from tests.world import memory_world, submit, tenants_for

    world, cloud = memory_world([tpu_pool(zone=ZONE, capacity=64)], tenants_for("tpu-v5e"))
    cloud.set_stock(ZONE, "tpu-v5e", 64)
    request = flex("train", vm_count=2, topology="4x4", hours=6, locations=(ZONE,))
    submit(world.store, replace(request, run=RunSpec.of(["python", "train.py"])))
    world.run()
    world.clock.advance(timedelta(seconds=20))
    world.run()
    assert world.state("train") is RequestState.ACTIVE
    order = order_name("train", 1)
    record = world.store.get("train")
    assert record is not None
    assert [(h.rank, h.name, h.worker) for h in record.hosts] == [
        (rank, f"{order}-{rank // 4}", rank % 4) for rank in range(8)
    ]
    signer = LocalSigner("metadata", datetime.now(UTC))
    nodes = Nodes(*(
        TpuNode(name=f"{order}-{i}", zone=ZONE, state="READY",
                endpoints=tuple(h.internal_ip for h in record.hosts[4 * i: 4 * i + 4]),
                service_account=ACCOUNT, order_key=f"key-of-{order}")
        for i in (0, 1)
    ))  # fmt: skip
    service = AgentService(
        store=world.store, ranks=MemoryRankStore(),
        verifier=VmIdentityVerifier(
            audience=AGENT_URL, project_id=PROJECT, certs=signer.certs,
            issuers=frozenset({EMULATOR_ISSUER}),
        ),
        order_vms=Vms(), secrets=Secrets(), logs=Logs(),
        ending=EndService(world.store, world.config, world.providers, None, world.bus,
                          MemoryNudger(), world.clock),
        sessions=Sessions(b"k" * 32, world.clock, timedelta(days=8)), clock=world.clock,
        tpu_nodes=nodes,
    )  # fmt: skip

    def token(node: int, worker: int) -> str:
        vm = Instance(
            name=f"t1v-n-0000000{node}-w-{worker}", instance_id=str(700 + 10 * node + worker),
            zone=ZONE, project_id="tpu-tenant-project", project_number=99,
            internal_ip=record.hosts[4 * node + worker].internal_ip,
            service_account=ACCOUNT, created_at=datetime.now(UTC),
        )  # fmt: skip
        return f"Bearer {signer.sign(identity_claims(vm, AGENT_URL, 'full', datetime.now(UTC)))}"

    def claim(node: int, worker: int, key: str | None = None) -> dict[str, object]:
        return {"tpu": {"node": f"{order}-{node}", "worker": worker,
                        "key": key or f"key-of-{order}"}}  # fmt: skip

    impostor = service.handle("/v1/register", token(1, 0), claim(0, 0, key="key-of-another"))
    assert impostor.status == 403
    assert "a worker of another node" in impostor.body["error"]
    sessions = {}
    for node in (0, 1):
        for worker in range(4):
            answer = service.handle("/v1/register", token(node, worker), claim(node, worker))
            assert answer.status == 200, answer
            assert (answer.body["rank"], answer.body["num_nodes"]) == (4 * node + worker, 8)
            sessions[4 * node + worker] = f"Bearer {answer.body['session']}"
    opened = service.handle("/v1/barrier", sessions[5], {})
    assert opened.body["ready"] is True
    assert opened.body["devices"] == "tpu"
    env = opened.body["env"]
    assert env["OPENDWS_NODE_RANK"] == "5"
    assert env["OPENDWS_NUM_NODES"] == "8"
    assert env["OPENDWS_ACCELERATORS_PER_NODE"] == "4"
    assert env["OPENDWS_NODE_IPS"].split("\n") == [h.internal_ip for h in record.hosts]
    assert "JAX_COORDINATOR_ADDRESS" not in env  # JAX on a slice finds its peers itself
    # The run is every worker's: it is over when all eight exited, not when rank 0 did.
    for rank in range(7):
        exited = service.handle("/v1/exit", sessions[rank], {"code": 0, "stopped": False})
        assert exited.status == 200
        assert world.state("train") is RequestState.ACTIVE, rank
    assert service.handle("/v1/exit", sessions[7], {"code": 0, "stopped": False}).status == 200
    final = world.store.get("train")
    assert final is not None
    assert (final.state, final.reason) == (RequestState.RELEASED, "JOB_SUCCEEDED")
    assert final.message == ", ".join(f"rank {rank} exited 0" for rank in range(8))


def test_the_agent_runs_on_every_default_tpu_runtimes_python() -> None:
    """Each generation's default runtime (tpu/docs/runtimes) states its python3, and the agent
    runs on it (opendws.agent.MINIMUM_PYTHON)."""
    from opendws.agent import MINIMUM_PYTHON
    from opendws.catalog import TPU_RUNTIME_PYTHON, TPU_RUNTIME_VERSIONS

    assert set(TPU_RUNTIME_VERSIONS.values()) <= set(TPU_RUNTIME_PYTHON)
    for runtime in TPU_RUNTIME_VERSIONS.values():
        assert TPU_RUNTIME_PYTHON[runtime] >= MINIMUM_PYTHON, runtime
