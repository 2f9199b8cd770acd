"""The simulated cloud on its own: steering, lazy deterministic settling, stock accounting and
each resource's life cycle, through its Python API (its clock is tested in test_clock)."""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import opendws.sim
from opendws.clock import ManualClock
from opendws.sim import FAILURE_KINDS, CloudError, SimulatedCloud

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
LATENCY = timedelta(seconds=20)
P, Z, SHAPE = "proj", "us-central1-a", "a3-highgpu-8g"


@pytest.fixture
def cloud() -> SimulatedCloud:
    cloud = SimulatedCloud(
        ManualClock(START), provisioning_latency=LATENCY, operation_latency=timedelta(0)
    )
    cloud.insert_instance_template(P, {"name": "tpl", "properties": {"machineType": SHAPE}})
    cloud.insert_instance_group_manager(
        P, Z, {"name": "mig", "instanceTemplate": "global/instanceTemplates/tpl"}
    )
    return cloud


def resize(cloud: SimulatedCloud, name: str, vms: list[str], hours: int = 1) -> None:
    body = {
        "name": name,
        "instances": [{"name": vm} for vm in vms],
        "requestedRunDuration": {"seconds": str(hours * 3600)},
    }
    cloud.insert_resize_request(P, Z, "mig", body, "beta")  # named VMs: beta only


def state_of(cloud: SimulatedCloud, name: str) -> str:
    state = cloud.get_resize_request(P, Z, "mig", name)["state"]
    assert isinstance(state, str)
    return state


def test_steering_refuses_bad_input(cloud: SimulatedCloud) -> None:
    with pytest.raises(ValueError, match="units"):
        cloud.set_stock(Z, SHAPE, -1)
    with pytest.raises(ValueError, match="kind"):
        cloud.inject(Z, SHAPE, "meteor")
    with pytest.raises(ValueError, match="count"):
        cloud.inject(Z, SHAPE, "hang", 0)
    with pytest.raises(ValueError, match="latency"):
        cloud.set_latency(timedelta(seconds=-1))
    with pytest.raises(ValueError, match="kind"):
        cloud.created("disks")
    assert FAILURE_KINDS == ("stockout", "hang", "error")


def test_a_resize_request_is_decided_exactly_at_creation_plus_latency(
    cloud: SimulatedCloud,
) -> None:
    cloud.set_stock(Z, SHAPE, 3)
    resize(cloud, "rr", ["a", "b"])
    cloud.advance(LATENCY - timedelta(seconds=1))
    assert state_of(cloud, "rr") == "ACCEPTED"
    assert cloud.stock(Z, SHAPE) == 3
    cloud.advance(timedelta(seconds=1))
    assert state_of(cloud, "rr") == "SUCCEEDED"
    assert cloud.stock(Z, SHAPE) == 1
    vms = cloud.list_managed_instances(P, Z, "mig")
    assert [(vm["name"], vm["instanceStatus"]) for vm in vms] == [
        ("a", "RUNNING"),
        ("b", "RUNNING"),
    ]


def test_settling_late_still_runs_each_event_at_its_own_moment(cloud: SimulatedCloud) -> None:
    cloud.set_stock(Z, SHAPE, 2)
    resize(cloud, "rr", ["a", "b"], hours=1)
    cloud.clock.advance(timedelta(days=1))  # nothing settles until the next call
    assert cloud.stock(Z, SHAPE) == 2  # created at +20 s, deleted at +1 h 20 s
    assert cloud.list_instances(P, Z) == []
    assert state_of(cloud, "rr") == "SUCCEEDED"
    assert cloud.created("instances") == {"a": 1, "b": 1}
    assert cloud.state()["counters"] == {"provisioned": 1, "auto_deleted": 2}


def test_requests_compete_for_stock_in_creation_order(cloud: SimulatedCloud) -> None:
    """Changed: the second request used to FAIL on the stockout. Google keeps it ACCEPTED
    with the temporary error in status.lastAttempt (CP InstanceGroupManagerResizeRequestStatus)
    and serves it when capacity frees."""
    cloud.set_stock(Z, SHAPE, 2)
    resize(cloud, "first", ["a", "b"])
    resize(cloud, "second", ["c"])
    cloud.advance(LATENCY)
    assert (state_of(cloud, "first"), state_of(cloud, "second")) == ("SUCCEEDED", "ACCEPTED")
    status = cloud.get_resize_request(P, Z, "mig", "second")["status"]
    assert status["lastAttempt"]["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert "error" not in status
    cloud.delete_instance(P, Z, "a")
    assert state_of(cloud, "second") == "SUCCEEDED"
    assert cloud.get_resize_request(P, Z, "mig", "second")["status"] == {}


def test_injections_are_consumed_in_order_one_provisioning_each(cloud: SimulatedCloud) -> None:
    cloud.set_stock(Z, SHAPE, 10)
    cloud.inject(Z, SHAPE, "error")
    cloud.inject(Z, SHAPE, "hang")
    for name in ("one", "two", "three"):
        resize(cloud, name, [f"{name}-vm"])
    cloud.advance(LATENCY)
    assert [state_of(cloud, n) for n in ("one", "two", "three")] == [
        "FAILED",
        "ACCEPTED",
        "SUCCEEDED",
    ]
    errors = cloud.get_resize_request(P, Z, "mig", "one")["status"]["error"]["errors"]
    assert errors[0]["code"] == "RESOURCE_OPERATION_RATE_EXCEEDED"
    assert cloud.stock(Z, SHAPE) == 9


def test_resize_request_validation(cloud: SimulatedCloud) -> None:
    with pytest.raises(CloudError) as raised:
        cloud.insert_resize_request(P, Z, "mig", {"name": "rr"})
    assert (raised.value.http_status, raised.value.reason) == (400, "invalid")
    # Changed: both fields used to be accepted when they agreed; Google says they are
    # mutually exclusive (CP InstanceGroupManagerResizeRequest.resize_by).
    with pytest.raises(CloudError, match="mutually exclusive"):
        cloud.insert_resize_request(
            P, Z, "mig", {"name": "rr", "resizeBy": 3, "instances": [{"name": "a"}]}, "beta"
        )
    with pytest.raises(CloudError, match="distinct"):
        cloud.insert_resize_request(
            P, Z, "mig", {"name": "rr", "instances": [{"name": "a"}, {"name": "a"}]}, "beta"
        )
    with pytest.raises(CloudError) as missing:
        cloud.insert_resize_request(P, Z, "nope", {"name": "rr", "resizeBy": 1})
    assert missing.value.http_status == 404
    assert cloud.created("resizeRequests") == {}


def test_snake_case_requests_are_read_too(cloud: SimulatedCloud) -> None:
    cloud.set_stock(Z, SHAPE, 1)
    cloud.insert_resize_request(
        P, Z, "mig", {"name": "rr", "resize_by": 1, "requested_run_duration": "600s"}
    )
    cloud.advance(LATENCY)
    (vm,) = cloud.list_managed_instances(P, Z, "mig")
    assert vm["name"].startswith("mig-")
    cloud.advance(timedelta(minutes=10))
    assert cloud.list_managed_instances(P, Z, "mig") == []


def test_deleting_a_mig_deletes_its_vms_and_returns_their_stock(cloud: SimulatedCloud) -> None:
    cloud.set_stock(Z, SHAPE, 2)
    resize(cloud, "rr", ["a", "b"])
    cloud.advance(LATENCY)
    cloud.delete_instance_group_manager(P, Z, "mig")
    assert cloud.stock(Z, SHAPE) == 2
    assert cloud.list_instances(P, Z) == []


def test_operations_are_recorded_and_failed_ones_carry_the_error(cloud: SimulatedCloud) -> None:
    operation = cloud.insert_instance(P, Z, {"name": "vm", "machineType": SHAPE})
    assert operation["status"] == "DONE"
    assert operation["httpErrorStatusCode"] == 503
    assert operation["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert operation["id"].isdigit()
    assert cloud.get_operation(P, Z, operation["name"]) == operation
    with pytest.raises(CloudError):
        cloud.get_operation(P, "global", operation["name"])


def test_queued_resource_life_cycle_and_chip_accounting(cloud: SimulatedCloud) -> None:
    cloud.set_stock("z", "V4", 32)
    body = {
        "tpu": {"nodeSpec": [{"nodeId": "n", "node": {"acceleratorType": "v4-32"}}]},
        "guaranteed": {},
    }
    operation = cloud.create_queued_resource(P, "z", "qr", body)
    assert operation["done"] is True
    # Changed from ACCEPTED: WAITING_FOR_RESOURCES replaced it (tpu/docs/queued-resources).
    assert operation["response"]["state"] == {"state": "WAITING_FOR_RESOURCES"}
    cloud.advance(LATENCY)
    assert cloud.get_queued_resource(P, "z", "qr")["state"]["state"] == "ACTIVE"
    assert cloud.stock("z", "V4") == 16  # v4-32 counts TensorCores: 16 chips
    with pytest.raises(CloudError, match="without force"):
        cloud.delete_queued_resource(P, "z", "qr", force=False)
    cloud.delete_queued_resource(P, "z", "qr", force=True)
    assert cloud.stock("z", "V4") == 32


@pytest.mark.parametrize(
    ("config", "shape", "chips"),
    [
        ({"acceleratorConfig": {"type": 9, "topology": "4x4"}}, "V5LITE_POD", 16),
        ({"acceleratorConfig": {"type": "V5P", "topology": "2x2x4"}}, "V5P", 16),
        ({"acceleratorType": "v6e-8"}, "V6E", 8),
    ],
)
def test_tpu_shapes_and_chip_counts(
    cloud: SimulatedCloud, config: dict[str, object], shape: str, chips: int
) -> None:
    cloud.set_stock("z", shape, chips)
    cloud.create_queued_resource(P, "z", "qr", {"tpu": {"nodeSpec": [{"node": config}]}})
    cloud.advance(LATENCY)
    assert cloud.get_queued_resource(P, "z", "qr")["state"]["state"] == "ACTIVE"
    assert cloud.stock("z", shape) == 0


def test_a_queued_resource_valid_until_before_the_decision_fails_it(
    cloud: SimulatedCloud,
) -> None:
    cloud.set_stock("z", "V6E", 8)
    body = {
        "tpu": {"nodeSpec": [{"node": {"acceleratorType": "v6e-8"}}]},
        "queueingPolicy": {"validUntilDuration": "10s"},
    }
    cloud.create_queued_resource(P, "z", "qr", body)
    cloud.advance(LATENCY)
    got = cloud.get_queued_resource(P, "z", "qr")["state"]
    assert got["state"] == "FAILED"
    assert got["failedData"]["error"]["code"] == 4
    assert cloud.stock("z", "V6E") == 8


def calendar_block(name: str, count: int, start: datetime) -> dict[str, object]:
    """A calendar-mode future reservation of ``count`` VMs for a day from ``start``."""
    return {
        "name": name,
        "reservationMode": "CALENDAR",
        "timeWindow": {"startTime": start.isoformat(), "duration": {"seconds": "86400"}},
        "specificSkuProperties": {
            "totalCount": str(count),
            "instanceProperties": {"machineType": SHAPE},
        },
    }


def test_future_reservation_holds_its_units_for_its_window(cloud: SimulatedCloud) -> None:
    cloud.set_stock(Z, SHAPE, 4)
    start = START + timedelta(hours=1)
    cloud.insert_future_reservation(P, Z, calendar_block("block", 3, start))
    cloud.insert_future_reservation(P, Z, calendar_block("second", 2, start))
    cloud.advance(cloud.review_delay)
    assert cloud.stock(Z, SHAPE) == 4  # promised, not taken: the block has not started
    (empty,) = cloud.list_reservations(P, Z)  # created at approval, empty
    assert empty["specificReservation"]["assuredCount"] == "0"
    second = cloud.get_future_reservation(P, Z, "second")["status"]["procurementStatus"]
    assert second == "DECLINED"  # the overlapping block's units were promised to the first
    cloud.advance(start - cloud.clock.now() + LATENCY)
    assert cloud.stock(Z, SHAPE) == 1  # taken at the start
    assert cloud.get_future_reservation(P, Z, "block")["status"]["procurementStatus"] == "FULFILLED"
    affinity = {"consumeReservationType": "SPECIFIC_RESERVATION", "values": ["block"]}
    bound = {"provisioningModel": "RESERVATION_BOUND"}
    cloud.insert_instance(
        P, Z, {"name": "vm", "machineType": SHAPE, "reservationAffinity": affinity,
               "scheduling": bound},
    )  # fmt: skip
    with pytest.raises(CloudError, match="does not match"):
        cloud.insert_instance(
            P, Z, {"name": "other", "machineType": "g2-standard-8",
                   "reservationAffinity": affinity, "scheduling": bound},
        )  # fmt: skip
    assert cloud.get_reservation(P, Z, "block")["specificReservation"]["inUseCount"] == "1"
    cloud.delete_instance(P, Z, "vm")
    assert cloud.stock(Z, SHAPE) == 1  # the unit went back to the reservation
    cloud.advance(timedelta(days=1))
    assert cloud.stock(Z, SHAPE) == 4
    assert cloud.list_reservations(P, Z) == []


def test_reset_forgets_everything_but_the_clock(cloud: SimulatedCloud) -> None:
    cloud.set_stock(Z, SHAPE, 2)
    cloud.inject(Z, SHAPE, "hang")
    resize(cloud, "rr", ["a"])
    cloud.advance(timedelta(minutes=1))
    now = cloud.clock.now()
    cloud.reset()
    state = cloud.state()
    assert state["stock"] == []
    assert state["injections"] == []
    assert state["resources"] == {}
    assert state["created"] == {
        "resizeRequests": {},
        "queuedResources": {},
        "futureReservations": {},
        "instances": {},
    }
    assert cloud.clock.now() == now
    with pytest.raises(CloudError):
        cloud.get_instance_group_manager(P, Z, "mig")


def test_the_simulated_cloud_imports_neither_google_nor_the_adapters() -> None:
    imported: set[str] = set()
    for source in Path(opendws.sim.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
    forbidden = [m for m in imported if m.split(".")[0] == "google" or "adapters" in m]
    assert forbidden == []


def test_a_block_whose_units_are_gone_by_its_start_fails(cloud: SimulatedCloud) -> None:
    cloud.set_stock(Z, SHAPE, 2)
    start = START + timedelta(hours=1)
    cloud.insert_future_reservation(P, Z, calendar_block("late", 2, start))
    cloud.advance(cloud.review_delay)
    cloud.set_stock(Z, SHAPE, 1)  # taken by someone else meanwhile
    cloud.advance(start - cloud.clock.now() + LATENCY)
    status = cloud.get_future_reservation(P, Z, "late")["status"]
    assert status["procurementStatus"] == "FAILED"
    assert cloud.list_reservations(P, Z) == []
    assert cloud.stock(Z, SHAPE) == 1
