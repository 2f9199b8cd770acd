"""The simulated cloud's Compute operations take time, and its Compute Engine API rate quotas.

Google: an Operation's ``status`` is "PENDING, RUNNING, or DONE" (compute/docs/reference/rest/
v1/zoneOperations), and ``zoneOperations.wait`` "waits for no more than the 2 minute deadline"
(compute/docs/reference/rest/v1/zoneOperations/wait): operations are DONE seconds after the call
that made them. A resource whose operation is still running is "not ready": Compute answers
400 ``resourceNotReady`` (magic-modules ``mmv1/third_party/terraform/transport/
error_retry_predicates.go``, ``isSubnetworkUnreadyError``). Rate quotas: compute/docs/
api-rate-limits ("a 403 error with the reason rateLimitExceeded"; a quota reached at 10:00:15
"refills at the start of the next synchronized interval, such as 10:01:00"); the message is
"Quota exceeded for quota metric '...' and limit '... per minute' of service
'compute.googleapis.com'" (magic-modules ``is403QuotaExceededPerMinuteError``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from opendws.clock import ManualClock
from opendws.sim import CloudError, SimulatedCloud
from opendws.sim.cloud import OPERATION_LATENCY, CallKind, RateQuotas

P, Z, SHAPE = "proj", "us-central1-a", "a3-highgpu-8g"
START = datetime(2026, 3, 2, 9, 0, 15, tzinfo=UTC)
LATENCY = timedelta(seconds=10)
TEMPLATE = {"name": "tpl", "properties": {"machineType": SHAPE}}
GROUP = {"name": "mig", "instanceTemplate": "global/instanceTemplates/tpl"}


def cloud(latency: timedelta = LATENCY) -> SimulatedCloud:
    world = SimulatedCloud(
        ManualClock(START), provisioning_latency=timedelta(0), operation_latency=latency
    )
    world.set_stock(Z, SHAPE, 4)
    return world


def settle(world: SimulatedCloud) -> None:
    world.advance(LATENCY)


def test_the_default_is_a_few_seconds() -> None:
    assert timedelta(seconds=1) <= OPERATION_LATENCY <= timedelta(seconds=10)
    assert SimulatedCloud(ManualClock(START)).operation_latency == OPERATION_LATENCY


def test_an_operation_goes_pending_running_done_over_the_latency() -> None:
    world = cloud()
    operation = world.insert_instance_template(P, TEMPLATE)
    name = operation["name"]
    assert (operation["status"], operation["progress"]) == ("PENDING", 0)
    assert "endTime" not in operation
    world.advance(LATENCY / 2)
    running = world.get_operation(P, "global", name)
    assert running["status"] == "RUNNING"
    assert 0 < running["progress"] < 100
    world.advance(LATENCY / 2)
    done = world.get_operation(P, "global", name)
    assert (done["status"], done["progress"]) == ("DONE", 100)
    assert "endTime" in done
    assert "error" not in done


def test_an_insert_is_visible_at_once_and_not_ready_until_done() -> None:
    """A group naming a template still being inserted is refused resourceNotReady."""
    world = cloud()
    world.insert_instance_template(P, TEMPLATE)
    assert world.get_instance_template(P, "tpl")["name"] == "tpl"
    with pytest.raises(CloudError) as refused:
        world.insert_instance_group_manager(P, Z, GROUP)
    assert (refused.value.http_status, refused.value.reason) == (400, "resourceNotReady")
    assert refused.value.message == (
        "The resource 'projects/proj/global/instanceTemplates/tpl' is not ready"
    )
    settle(world)
    world.insert_instance_group_manager(P, Z, GROUP)


def test_a_mutation_of_a_resource_whose_own_operation_runs_is_refused() -> None:
    world = cloud()
    world.insert_instance_template(P, TEMPLATE)
    settle(world)
    world.insert_instance_group_manager(P, Z, GROUP)
    for mutate in (
        lambda: world.patch_instance_group_manager(P, Z, "mig", {"description": "x"}),
        lambda: world.delete_instance_group_manager(P, Z, "mig"),
        lambda: world.insert_resize_request(P, Z, "mig", {"name": "rr", "resizeBy": 1}),
    ):
        with pytest.raises(CloudError) as refused:
            mutate()
        assert refused.value.reason == "resourceNotReady"
    world.insert_instance(P, Z, {"name": "vm", "machineType": f"zones/{Z}/machineTypes/{SHAPE}"})
    with pytest.raises(CloudError) as refused:
        world.delete_instance(P, Z, "vm")
    assert refused.value.message == (
        "The resource 'projects/proj/zones/us-central1-a/instances/vm' is not ready"
    )


def test_a_delete_lands_when_its_operation_is_done() -> None:
    world = cloud()
    world.insert_instance(P, Z, {"name": "vm", "machineType": f"zones/{Z}/machineTypes/{SHAPE}"})
    settle(world)
    assert world.stock(Z, SHAPE) == 3
    world.delete_instance(P, Z, "vm")
    assert world.get_instance(P, Z, "vm")["status"] == "STOPPING"
    assert world.stock(Z, SHAPE) == 3
    settle(world)
    with pytest.raises(CloudError):
        world.get_instance(P, Z, "vm")
    assert world.stock(Z, SHAPE) == 4


def test_a_cancel_lands_when_done_and_the_request_is_not_served_meanwhile() -> None:
    world = cloud()
    world.set_stock(Z, SHAPE, 0)
    world.insert_instance_template(P, TEMPLATE)
    settle(world)
    world.insert_instance_group_manager(P, Z, GROUP)
    settle(world)
    world.insert_resize_request(P, Z, "mig", {"name": "rr", "resizeBy": 2})
    settle(world)
    world.cancel_resize_request(P, Z, "mig", "rr")
    world.set_stock(Z, SHAPE, 4)  # capacity comes back while the cancel runs
    assert world.get_resize_request(P, Z, "mig", "rr")["state"] == "ACCEPTED"
    with pytest.raises(CloudError) as refused:
        world.delete_resize_request(P, Z, "mig", "rr")
    assert refused.value.reason == "resourceNotReady"
    settle(world)
    assert world.get_resize_request(P, Z, "mig", "rr")["state"] == "CANCELLED"
    assert world.list_instances(P, Z) == []
    world.delete_resize_request(P, Z, "mig", "rr")
    assert world.list_resize_requests(P, Z, "mig")[0]["name"] == "rr"
    settle(world)
    assert world.list_resize_requests(P, Z, "mig") == []


def test_a_zero_latency_makes_operations_done_at_once() -> None:
    world = cloud(timedelta(0))
    assert world.insert_instance_template(P, TEMPLATE)["status"] == "DONE"
    world.insert_instance_group_manager(P, Z, GROUP)
    assert world.delete_instance_group_manager(P, Z, "mig")["status"] == "DONE"
    assert world.list_instance_group_managers(P, Z) == []


def test_a_tpu_operation_is_done_after_the_latency() -> None:
    world = cloud()
    world.set_stock(Z, "V5LITE_POD", 8)
    body = {"tpu": {"nodeSpec": [{"parent": f"projects/{P}/locations/{Z}",
                                  "node": {"acceleratorType": "v5litepod-8",
                                           "runtimeVersion": "v2-alpha-tpuv5-lite"}}]}}  # fmt: skip
    operation = world.create_queued_resource(P, Z, "qr", body)
    assert operation["done"] is False
    assert "response" not in operation
    assert world.get_queued_resource(P, Z, "qr")["name"].endswith("/qr")
    settle(world)
    name = operation["name"].rsplit("/", 1)[-1]
    assert world.get_tpu_operation(P, Z, name)["done"] is True


def test_the_operation_latency_is_configuration() -> None:
    world = cloud()
    world.set_operation_latency(timedelta(seconds=2))
    world.reset()
    assert world.operation_latency == timedelta(seconds=2)
    assert world.state()["operation_latency_seconds"] == 2.0
    with pytest.raises(ValueError, match="negative"):
        world.set_operation_latency(timedelta(seconds=-1))
    with pytest.raises(ValueError, match="negative"):
        SimulatedCloud(ManualClock(START), operation_latency=timedelta(seconds=-1))


def test_rate_quotas_are_off_by_default() -> None:
    world = cloud()
    for _ in range(5000):
        world.charge(P, "us-central1", CallKind.WRITE)
    assert world.rate_quotas is None


def test_a_call_over_the_quota_gets_googles_answer_until_the_next_minute() -> None:
    world = cloud()
    world.set_rate_quotas(RateQuotas(writes=2))
    world.charge(P, "us-central1", CallKind.WRITE)
    world.charge(P, "us-central1", CallKind.WRITE)
    with pytest.raises(CloudError) as refused:
        world.charge(P, "us-central1", CallKind.WRITE)
    error = refused.value
    assert (error.http_status, error.reason, error.domain) == (
        403, "rateLimitExceeded", "usageLimits",
    )  # fmt: skip
    assert error.message == (
        "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute per region' "
        "of service 'compute.googleapis.com' for consumer 'projects/proj'."
    )
    # Other groups, regions and projects are counted apart.
    world.charge(P, "us-central1", CallKind.READ)
    world.charge(P, "us-west4", CallKind.WRITE)
    world.charge("other", "us-central1", CallKind.WRITE)
    # Refilled at the start of the next whole minute (09:01:00), not 60 s after the first call.
    world.advance(timedelta(seconds=44))
    with pytest.raises(CloudError):
        world.charge(P, "us-central1", CallKind.WRITE)
    world.advance(timedelta(seconds=1))
    world.charge(P, "us-central1", CallKind.WRITE)


def test_google_default_quotas_and_their_view() -> None:
    quotas = RateQuotas.google_defaults()
    assert quotas.view() == {kind.value: 1500 for kind in CallKind}
    assert RateQuotas.from_view({"write": 10}) == RateQuotas(writes=10)
    with pytest.raises(ValueError, match="unknown"):
        RateQuotas.from_view({"mutations": 1})
    with pytest.raises(ValueError, match="whole number"):
        RateQuotas(reads=-1)
    world = cloud()
    world.set_rate_quotas(quotas)
    world.reset()
    assert world.state()["rate_quotas"] == quotas.view()
