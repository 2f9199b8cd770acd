"""The simulated Cloud TPU's nodes and what a TPU VM's metadata server says, in pieces.

Sources: tpu/docs/reference/rest/v2/projects.locations.nodes (``Node``); tpu/docs/
calendar-mode-reservation and tpu/docs/consume-reservation (when the reservation ends the TPUs
consuming it are deleted); the TPU VM metadata JAX reads (``jax/_src/clusters/
cloud_tpu_cluster.py``: ``tpu-env`` lines ``KEY: 'value'``); compute/docs/instances/
verifying-instance-identity (``google.compute_engine.project_id``/``project_number``). TPU VMs
live in a Google tenant project (tpu-env's ``CONSUMER_PROJECT_ID`` is the user's): their token
names a tenant project here, while ``project/project-id`` stays the user's.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from emulators.metadata import Instance, identity_claims, tree
from emulators.vms import tpu_env, tpu_tenant_project
from opendws.catalog import TPU_VM_FAMILIES
from opendws.clock import ManualClock
from opendws.sim import SimulatedCloud
from opendws.sim.cloud import CloudError

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
LATENCY = timedelta(seconds=20)
DAY = timedelta(days=1)
P, Z = "proj", "us-east5-b"
WHEN = datetime(2026, 1, 2, tzinfo=UTC)


def worker(**extra: Any) -> Instance:
    fields: dict[str, Any] = {
        "name": "t1v-n-0a1b2c3d-w-1", "instance_id": "5123456789012345678", "zone": Z,
        "project_id": P, "project_number": 123, "internal_ip": "127.0.0.9",
        "service_account": "jobs@proj.iam.gserviceaccount.com", "created_at": WHEN,
    }  # fmt: skip
    return Instance(**{**fields, **extra})


def test_a_tpu_vm_token_names_its_tenant_project_while_its_metadata_names_the_users() -> None:
    tenant_id, tenant_number = tpu_tenant_project(P)
    instance = worker(token_project_id=tenant_id, token_project_number=tenant_number)
    engine = identity_claims(instance, "aud", "full", WHEN)["google"]
    assert isinstance(engine, dict)
    claims = engine["compute_engine"]
    assert (claims["project_id"], claims["project_number"]) == (tenant_id, tenant_number)
    assert (claims["instance_name"], claims["instance_id"]) == (
        "t1v-n-0a1b2c3d-w-1",
        "5123456789012345678",
    )
    project = tree(instance).entries["project"]
    assert project.entries["project-id"].text == P  # type: ignore[union-attr]
    vm_claims = identity_claims(worker(), "aud", "full", WHEN)["google"]
    assert vm_claims["compute_engine"]["project_id"] == P  # type: ignore[index]


def test_the_tenant_project_is_another_project_the_same_for_every_tpu_vm_of_a_project() -> None:
    tenant_id, tenant_number = tpu_tenant_project(P)
    assert tenant_id.startswith("tpu-tenant-")
    assert tenant_id != P
    assert len(str(tenant_number)) == 12
    assert tpu_tenant_project(P) == (tenant_id, tenant_number)
    assert tpu_tenant_project("other")[0] != tenant_id


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"token_project_id": "tpu-tenant-x"}, "both or neither"),
        ({"token_project_number": 5}, "both or neither"),
        ({"token_project_id": "", "token_project_number": 5}, "not empty"),
        ({"token_project_id": "t", "token_project_number": 0}, "positive"),
        ({"attributes": {"agent-worker-number": 1}}, "strings"),
    ],
)
def test_an_instance_refuses_a_half_or_bad_token_project_and_non_string_attributes(
    extra: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        worker(**extra)


def test_tpu_env_is_one_key_quoted_value_line_per_variable() -> None:
    text = tpu_env({"NODE_ID": "slice", "WORKER_ID": "3", "ZONE": Z})
    assert text == f"NODE_ID: 'slice'\nWORKER_ID: '3'\nZONE: '{Z}'\n"


def test_a_reservations_end_takes_the_nodes_of_the_queued_resource_consuming_it() -> None:
    """A TPU calendar block's reservation ends: Google deletes the TPUs consuming it, so the
    queued resource's nodes are gone (nodes.get: 404)."""
    cloud = SimulatedCloud(
        ManualClock(START), provisioning_latency=LATENCY, operation_latency=timedelta(0)
    )
    cloud.set_stock(Z, "V6E", 16)
    start = START + 2 * DAY
    block = {
        "name": "t", "reservationMode": "CALENDAR", "deploymentType": "DENSE",
        "schedulingType": "INDEPENDENT", "planningStatus": "SUBMITTED",
        "specificReservationRequired": True, "autoDeleteAutoCreatedReservations": True,
        "reservationName": "t-r",
        "aggregateReservation": {
            "vmFamily": TPU_VM_FAMILIES["V6E"], "workloadType": "BATCH",
            "reservedResources": [{"accelerator": {"acceleratorCount": 8}}],
        },
        "timeWindow": {"startTime": start.isoformat(), "endTime": (start + DAY).isoformat()},
    }  # fmt: skip
    cloud.insert_future_reservation(P, Z, block)
    cloud.advance(start - cloud.clock.now() + LATENCY)
    body = {
        "tpu": {"nodeSpec": [{"nodeId": "n", "node": {"acceleratorType": "v6e-8"}}]},
        "reservationName": f"projects/{P}/locations/{Z}/reservations/t-r",
        "provisioningModel": "RESERVATION_BOUND",
    }
    cloud.create_queued_resource(P, Z, "qr", body, "v2alpha1")
    assert cloud.list_nodes(P, Z) == []  # PROVISIONING: no node yet
    cloud.advance(LATENCY)
    node = cloud.get_node(P, Z, "n")
    assert node["acceleratorConfig"] == {"type": "V6E", "topology": "2x4"}
    assert len(node["networkEndpoints"]) == 1
    assert cloud.state()["resources"][P]["nodes"] == [node]  # type: ignore[index]
    cloud.advance(DAY)
    assert cloud.list_nodes(P, Z) == []
    with pytest.raises(CloudError, match="was not found"):
        cloud.get_node(P, Z, "n")
