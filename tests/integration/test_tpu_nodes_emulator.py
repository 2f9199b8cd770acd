"""TPU nodes on the Compute/TPU emulator: a queued resource that becomes ACTIVE has its nodes,
read with the real ``google-cloud-tpu`` client (``v2``) and as plain REST JSON (``v2alpha1``),
and they go when it does.

Sources: tpu/docs/reference/rest/v2/projects.locations.nodes and
tpu/docs/reference/rest/v2alpha1/projects.locations.nodes (``Node``: ``name``, ``id``,
``acceleratorType``, ``acceleratorConfig``, ``state``, ``runtimeVersion``,
``networkEndpoints[{ipAddress, port}]``, ``metadata`` and ``labels`` maps of string to string,
``serviceAccount {email, scope[]}``, ``queuedResource``, ``multisliceNode``, ``createTime``;
``nodes.list`` answers ``nodes`` and ``nextPageToken``); the queued resource reference's
``NodeSpec`` (``nodeId``: "Should follow the ^[A-Za-z0-9_.~+%-]+$ regex format. This is only
specified when requesting a single node") and ``MultisliceParams`` (``v2``) /
``MultiNodeParams`` (``v2alpha1``): "If node_count = 3 and node_id_prefix = "np", node ids of
nodes created will be "np-0", "np-1", "np-2". If this field is not provided we use
queued_resource_id as the node_id_prefix"; ``node_count`` "needs to be > 1"; "It's an error to
specify both node_id and multi_node_params"); tpu/docs/queued-resources (a queued resource's
TPUs exist while it is ACTIVE); tpu/docs/request-using-flex-start (at the end of its run
duration the TPU VMs are deleted and the queued resource is SUSPENDED).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from ipaddress import ip_address
from typing import Any

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from emulators import ComputeEmulator
from emulators.vms import LOOPBACK_RANGE
from opendws.clock import ManualClock
from opendws.sim import SimulatedCloud

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
LATENCY = timedelta(seconds=20)
PROJECT, ZONE = "demo-opendws", "us-west4-a"
PARENT = f"projects/{PROJECT}/locations/{ZONE}"
RUNTIME = "v2-alpha-tpuv5-lite"


@pytest.fixture(scope="module")
def emulator() -> Iterator[ComputeEmulator]:
    cloud = SimulatedCloud(
        ManualClock(START), provisioning_latency=LATENCY, operation_latency=timedelta(0),
        internal_range=LOOPBACK_RANGE,
    )  # fmt: skip
    with ComputeEmulator(cloud) as running:
        yield running


@pytest.fixture
def emu(emulator: ComputeEmulator) -> ComputeEmulator:
    emulator.cloud.reset()
    emulator.cloud.set_stock(ZONE, "V5LITE_POD", 64)
    return emulator


@pytest.fixture
def client(emu: ComputeEmulator) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(
        transport="rest",
        client_options={"api_endpoint": emu.endpoint},
        credentials=AnonymousCredentials(),
    )


def rest(emu: ComputeEmulator, method: str, path: str, body: object | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(emu.endpoint + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def refusal(emu: ComputeEmulator, method: str, path: str, body: object) -> tuple[int, Any]:
    with pytest.raises(urllib.error.HTTPError) as refused:
        rest(emu, method, path, body)
    return refused.value.code, json.loads(refused.value.read())


def spec(topology: str = "4x4", **extra: Any) -> dict[str, Any]:
    """A v5e node spec of ``topology`` with ``extra`` spec fields (nodeId, multiNodeParams)."""
    node = {"acceleratorConfig": {"type": "V5LITE_POD", "topology": topology},
            "runtimeVersion": RUNTIME}  # fmt: skip
    return {"parent": PARENT, "node": node, **extra}


def create(emu: ComputeEmulator, name: str, *specs: dict[str, Any], **body: Any) -> None:
    """Create queued resource ``name`` through v2alpha1 and let Google serve it."""
    payload = {"tpu": {"nodeSpec": list(specs)}, **body}
    rest(emu, "POST", f"/v2alpha1/{PARENT}/queuedResources?queuedResourceId={name}", payload)
    emu.cloud.advance(LATENCY)


def node_names(emu: ComputeEmulator, version: str = "v2alpha1") -> list[str]:
    return [n["name"].rsplit("/", 1)[-1] for n in rest(emu, "GET", f"/{version}/{PARENT}/nodes")
            ["nodes"]]  # fmt: skip


def test_a_single_node_is_read_with_the_tpu_client_as_googles_node(
    emu: ComputeEmulator, client: tpu_v2.TpuClient
) -> None:
    """The node spec's nodeId names the node; the v2 client parses every field: READY, its
    type, one endpoint (port 8470) per worker, its metadata, service account and labels as
    sent, the queued resource that made it, a decimal id of its own."""
    metadata = {"startup-script": "#!/bin/sh\necho hi\n", "opendws-order": "o-1"}
    account = {"email": "jobs@demo-opendws.iam.gserviceaccount.com",
               "scope": ["https://www.googleapis.com/auth/cloud-platform"]}  # fmt: skip
    one = spec(nodeId="slice-a")
    one["node"].update(metadata=metadata, serviceAccount=account, labels={"managed-by": "x"})
    create(emu, "qr", one)
    node = client.get_node(name=f"{PARENT}/nodes/slice-a")
    assert node.name == f"{PARENT}/nodes/slice-a"
    assert node.state == tpu_v2.Node.State.READY
    assert node.accelerator_type == "v5litepod-16"
    assert node.accelerator_config.type_ == tpu_v2.AcceleratorConfig.Type.V5LITE_POD
    assert node.accelerator_config.topology == "4x4"
    assert node.runtime_version == RUNTIME
    assert dict(node.metadata) == metadata
    assert dict(node.labels) == {"managed-by": "x"}
    assert node.service_account.email == account["email"]
    assert list(node.service_account.scope) == account["scope"]
    assert node.queued_resource == f"{PARENT}/queuedResources/qr"
    assert node.multislice_node is False
    assert node.id > 0
    assert node.create_time.timestamp() == (START + LATENCY).timestamp()
    addresses = [e.ip_address for e in node.network_endpoints]
    assert len(addresses) == 4
    assert len(set(addresses)) == 4
    assert all(ip_address(a).is_loopback for a in addresses)
    assert {e.port for e in node.network_endpoints} == {8470}
    assert [n.name for n in client.list_nodes(parent=PARENT)] == [node.name]
    raw = rest(emu, "GET", f"/v2/{PARENT}/nodes/slice-a")
    assert raw["id"] == str(node.id)
    assert raw["metadata"] == metadata


@pytest.mark.parametrize(
    ("topology", "chips", "workers"), [("4x4", 16, 4), ("2x4", 8, 1), ("2x2", 4, 1)]
)
def test_a_node_has_one_network_endpoint_per_tpu_vm(
    emu: ComputeEmulator, topology: str, chips: int, workers: int
) -> None:
    """v5e: a slice of 8 chips or fewer is one TPU VM; a larger one has 4 chips per VM
    (v5litepod-16, 4x4: 4 VMs)."""
    create(emu, "qr", spec(topology, nodeId="n"))
    node = rest(emu, "GET", f"/v2alpha1/{PARENT}/nodes/n")
    assert len(node["networkEndpoints"]) == workers
    assert node["acceleratorType"] == f"v5litepod-{chips}"


def test_multi_node_params_name_the_nodes_prefix_dash_index(emu: ComputeEmulator) -> None:
    """nodeIdPrefix np, nodeCount 3 → np-0, np-1, np-2, each a multislice node of the queued
    resource, with addresses of its own; without a prefix the queued resource's id is the
    prefix."""
    create(emu, "qr", spec(multiNodeParams={"nodeCount": 3, "nodeIdPrefix": "np"}))
    create(emu, "other", spec("2x4", multiNodeParams={"nodeCount": 2}))
    assert node_names(emu) == ["np-0", "np-1", "np-2", "other-0", "other-1"]
    nodes = rest(emu, "GET", f"/v2/{PARENT}/nodes")["nodes"]
    assert all(n["multisliceNode"] is True for n in nodes)
    assert {n["queuedResource"] for n in nodes[:3]} == {f"{PARENT}/queuedResources/qr"}
    addresses = [e["ipAddress"] for n in nodes for e in n["networkEndpoints"]]
    assert len(addresses) == 3 * 4 + 2
    assert len(set(addresses)) == len(addresses)
    assert len({n["id"] for n in nodes}) == 5


def test_nodes_list_pages_like_google(emu: ComputeEmulator, client: tpu_v2.TpuClient) -> None:
    create(emu, "qr", spec("2x4", multiNodeParams={"nodeCount": 3}))
    page = rest(emu, "GET", f"/v2/{PARENT}/nodes?pageSize=2")
    assert [n["name"].rsplit("/", 1)[-1] for n in page["nodes"]] == ["qr-0", "qr-1"]
    rest_page = rest(emu, "GET", f"/v2/{PARENT}/nodes?pageSize=2&pageToken={page['nextPageToken']}")
    assert [n["name"].rsplit("/", 1)[-1] for n in rest_page["nodes"]] == ["qr-2"]
    assert "nextPageToken" not in rest_page
    pager = client.list_nodes(request={"parent": PARENT, "page_size": 1})
    assert [n.name.rsplit("/", 1)[-1] for n in pager] == ["qr-0", "qr-1", "qr-2"]


def test_no_node_before_active_and_none_after_a_delete(
    emu: ComputeEmulator, client: tpu_v2.TpuClient
) -> None:
    """A waiting queued resource has no node yet; a deleted one's nodes are gone: nodes.get
    answers 404 NOT_FOUND as Google does for a node that does not exist."""
    rest(emu, "POST", f"/v2alpha1/{PARENT}/queuedResources?queuedResourceId=qr",
         {"tpu": {"nodeSpec": [spec(nodeId="n")]}})  # fmt: skip
    assert node_names(emu) == []
    emu.cloud.advance(LATENCY)
    assert node_names(emu) == ["n"]
    client.delete_queued_resource(request={"name": f"{PARENT}/queuedResources/qr",
                                           "force": True}).result()  # fmt: skip
    assert node_names(emu, "v2") == []
    with pytest.raises(exceptions.NotFound):
        client.get_node(name=f"{PARENT}/nodes/n")
    code, answer = refusal(emu, "GET", f"/v2alpha1/{PARENT}/nodes/n", None)
    assert (code, answer["error"]["status"]) == (404, "NOT_FOUND")


def test_a_flex_start_run_that_ends_takes_its_nodes(emu: ComputeEmulator) -> None:
    """At the end of its run duration the service deletes the TPU VMs: SUSPENDED, no node."""
    create(emu, "qr", spec(nodeId="n"), provisioningModel="FLEX_START",
           runDuration={"maxRunDuration": "3600s"})  # fmt: skip
    assert node_names(emu) == ["n"]
    emu.cloud.advance(timedelta(hours=1))
    state = rest(emu, "GET", f"/v2alpha1/{PARENT}/queuedResources/qr")["state"]
    assert state["state"] == "SUSPENDED"
    assert node_names(emu) == []


@pytest.mark.parametrize(
    ("version", "node_spec", "says"),
    [
        ("v2alpha1", spec(nodeId="n", multiNodeParams={"nodeCount": 2}), "both node_id"),
        ("v2alpha1", spec(multiNodeParams={"nodeCount": 1}), "> 1"),
        ("v2alpha1", spec(nodeId="n/1"), "must follow ^[A-Za-z0-9_.~+%-]+$"),
        ("v2", spec(multiNodeParams={"nodeCount": 2}), 'Unknown name "multiNodeParams"'),
        ("v2alpha1", spec(multisliceParams={"nodeCount": 2}), 'Unknown name "multisliceParams"'),
    ],
)
def test_node_names_google_refuses_are_refused(
    emu: ComputeEmulator, version: str, node_spec: dict[str, Any], says: str
) -> None:
    code, answer = refusal(emu, "POST", f"/{version}/{PARENT}/queuedResources?queuedResourceId=q",
                           {"tpu": {"nodeSpec": [node_spec]}})  # fmt: skip
    assert code == 400
    assert says in answer["error"]["message"]
    assert emu.cloud.created("queuedResources") == {}


@pytest.mark.parametrize(
    ("node", "says"),
    [
        ({"metadata": ["startup-script"]}, "metadata"),
        ({"metadata": {"startup-script": 1}}, "TYPE_STRING"),
        ({"labels": {"a": True}}, "TYPE_STRING"),
        ({"serviceAccount": "x@y.z"}, "service_account"),
        ({"serviceAccount": {"email": "x@y.z", "scopes": []}}, 'Unknown name "scopes"'),
        ({"serviceAccount": {"email": "x@y.z", "scope": "cloud-platform"}}, "scope"),
        ({"serviceAccount": {"email": 7}}, "email"),
    ],
)
def test_node_metadata_and_service_account_shapes_google_refuses_are_refused(
    emu: ComputeEmulator, node: dict[str, Any], says: str
) -> None:
    """Node.metadata and labels are map<string, string>; ServiceAccount is {email: string,
    scope: [string]}: another shape or an unknown field name is a 400."""
    bad = spec(nodeId="n")
    bad["node"].update(node)
    code, answer = refusal(emu, "POST", f"/v2alpha1/{PARENT}/queuedResources?queuedResourceId=q",
                           {"tpu": {"nodeSpec": [bad]}})  # fmt: skip
    assert code == 400
    assert says in answer["error"]["message"]
