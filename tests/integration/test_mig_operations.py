"""The MIG flex-start provider against Compute operations that take as long as Google's (over
the project's emulator, the simulated cloud's clock running with the wall clock): it waits
only where the next call needs a resource (template, then group), leaves every other
operation running for a later pass to observe, takes ``resourceNotReady`` on a resource whose
own operation runs as "under way", is safe under concurrent calls, and raises a rate-quota
refusal as CloudRateLimited."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from unittest import mock

import pytest

from emulators import ComputeEmulator
from opendws.adapters.mig import MigFlexProvider, group_name
from opendws.bootstrap import capacity_providers
from opendws.clock import ManualClock
from opendws.domain.model import Pool
from opendws.ports import CloudRateLimited, Order, ProvisionPhase
from opendws.sim import SimulatedCloud
from opendws.sim.cloud import RateQuotas
from tests.builders import A3, NOW, flex, pool

PROJECT = "mig-operations"
ZONE = "us-central1-a"
# Google's operations are DONE seconds after the call; long enough here that a call which
# waited for one is told apart from one that did not.
OPERATION = timedelta(seconds=3)


@dataclass
class Bench:
    cloud: SimulatedCloud
    provider: MigFlexProvider
    home: Pool

    def resize_requests(self) -> dict[str, str]:
        """The pool's resize requests in the cloud, by name, with their state."""
        state = self.cloud.state()["resources"]
        assert isinstance(state, dict)
        requests = state.get(PROJECT, {}).get("resizeRequests", [])
        return {request["name"]: request["state"] for request in requests}

    def instances(self) -> list[str]:
        state = self.cloud.state()["resources"]
        assert isinstance(state, dict)
        return sorted(vm["name"] for vm in state.get(PROJECT, {}).get("instances", []))

    def settle(self) -> None:
        """Let every operation started so far finish."""
        self.cloud.advance(OPERATION + timedelta(seconds=1))


@pytest.fixture
def bench() -> Iterator[Bench]:
    cloud = SimulatedCloud(
        ManualClock(NOW, running=True),
        provisioning_latency=timedelta(0),
        operation_latency=OPERATION,
    )
    cloud.set_stock(ZONE, A3, 64)
    with ComputeEmulator(cloud) as emulator:
        provider = capacity_providers(PROJECT, endpoint=emulator.endpoint).mig_flex
        assert isinstance(provider, MigFlexProvider)
        yield Bench(cloud=cloud, provider=provider, home=pool(zone=ZONE, capacity=64))


def order(bench: Bench, request_id: str, vm_count: int = 1) -> Order:
    return Order(request=flex(request_id, vm_count=vm_count), pool=bench.home, attempt=1)


def timed(call: object, *args: object) -> float:
    began = time.monotonic()
    call(*args)  # type: ignore[operator]
    return time.monotonic() - began


def test_provision_and_release_return_before_their_operations_finish(bench: Bench) -> None:
    """A resize request's insert, its VMs' deletes and its delete are started and left: on
    Google an operation is DONE seconds later ("PENDING, RUNNING, or DONE", compute.v1
    Operation.status; compute/docs/api/how-tos/api-requests-responses#handling_api_responses)
    and the next pass observes the result. Only the pool's first provision waits, for its
    template and group (a group naming a template still being inserted is refused)."""
    first = order(bench, "first")
    bench.provider.provision(first)  # the template and group: awaited
    bench.settle()
    second = order(bench, "second", vm_count=2)
    assert timed(bench.provider.provision, second) < OPERATION.total_seconds() / 2
    assert second.name in bench.resize_requests()  # visible while its insert runs
    bench.settle()
    assert bench.resize_requests()[second.name] == "SUCCEEDED"
    assert timed(bench.provider.release, second.name, bench.home) < OPERATION.total_seconds() / 2
    bench.settle()
    assert second.name not in bench.resize_requests()
    assert not [vm for vm in bench.instances() if vm.startswith(second.name)]


def test_a_release_whose_cancel_runs_is_finished_by_a_later_release(bench: Bench) -> None:
    """A queued request is cancelled and left; a release while the cancel runs finds it
    "not ready" (Compute's ``resourceNotReady``: its own operation still runs), which is not
    an error; the release after the cancel is DONE deletes the now CANCELLED request (only an
    inactive request can be deleted: compute.proto ``InstanceGroupManagerResizeRequests``)."""
    bench.provider.provision(order(bench, "warm-up"))
    bench.settle()
    bench.cloud.set_stock(ZONE, A3, 0)
    queued = order(bench, "queued")
    bench.provider.provision(queued)
    bench.settle()
    assert bench.resize_requests()[queued.name] == "ACCEPTED"
    bench.provider.release(queued.name, bench.home)  # the cancel starts
    assert bench.resize_requests()[queued.name] == "ACCEPTED"  # until it is DONE
    bench.provider.release(queued.name, bench.home)  # the cancel runs: not an error
    bench.settle()
    assert bench.resize_requests()[queued.name] == "CANCELLED"
    seen = bench.provider.observe([bench.home])[queued.name]
    assert (seen.phase, seen.error_code) == (ProvisionPhase.FAILED, "CANCELLED")
    bench.provider.release(queued.name, bench.home)  # deletes it
    bench.provider.release(queued.name, bench.home)  # its delete runs: not an error
    bench.settle()
    assert queued.name not in bench.resize_requests()
    assert queued.name not in bench.provider.observe([bench.home])


def test_a_release_while_the_deletes_run_is_no_error(bench: Bench) -> None:
    """While a served request's delete runs (the next pass still sees it), a release is
    refused nothing: the group skips VMs already being deleted
    (``skipInstancesOnValidationError``, compute/docs/reference/rest/v1/instanceGroupManagers/
    deleteInstances), and the request's delete, refused ``resourceNotReady`` because its own
    delete still runs, is under way — the state the next pass carries on."""
    served = order(bench, "served", vm_count=2)
    bench.provider.provision(served)
    bench.settle()
    assert bench.resize_requests()[served.name] == "SUCCEEDED"
    # A release that started the deletes (an earlier pass's, or another reconciler's).
    resize_requests = bench.provider._resize_requests
    resize_requests.delete(
        project=PROJECT, zone=ZONE, instance_group_manager=group_name(bench.home),
        resize_request=served.name,
    )  # fmt: skip
    bench.provider.release(served.name, bench.home)  # its delete runs: not an error
    bench.provider.release(served.name, bench.home)
    bench.settle()
    bench.provider.release(served.name, bench.home)  # all gone: nothing to do
    assert served.name not in bench.resize_requests()
    assert not [vm for vm in bench.instances() if vm.startswith(served.name)]
    assert served.name not in bench.provider.observe([bench.home])


def test_concurrent_provisions_of_one_pool_make_one_group_and_each_request_once(
    bench: Bench,
) -> None:
    """Twelve orders provisioned at once from ten threads (the reconciler's pool of cloud
    calls) on a pool with no group yet: the first makes the template and group and the others
    wait for it under the pool's lock, so the group is inserted once and every order gets its
    one resize request."""
    orders = [order(bench, f"burst-{i}") for i in range(12)]
    groups = bench.provider._groups
    with (
        mock.patch.object(groups, "insert", wraps=groups.insert) as inserted,
        ThreadPoolExecutor(max_workers=10) as pool_of_calls,
    ):
        list(pool_of_calls.map(bench.provider.provision, orders))
    assert inserted.call_count == 1
    bench.settle()
    assert set(bench.resize_requests()) == {o.name for o in orders}
    made = bench.cloud.created("resizeRequests")
    assert all(made[o.name] == 1 for o in orders)
    state = bench.cloud.state()["resources"]
    assert isinstance(state, dict)
    assert [m["name"] for m in state[PROJECT]["instanceGroupManagers"]] == [group_name(bench.home)]


def test_a_call_over_the_rate_quota_raises_cloud_rate_limited(bench: Bench) -> None:
    """Compute answers a call over a per-minute rate quota with "a 403 error with the reason
    rateLimitExceeded" (compute/api-quota); provision, release and observe raise it as
    CloudRateLimited, so the reconciler slows down instead of counting a failure."""
    served = order(bench, "quota", vm_count=1)
    bench.provider.provision(served)
    bench.settle()
    bench.cloud.set_rate_quotas(RateQuotas(writes=0, reads=0, lists=0))
    with pytest.raises(CloudRateLimited) as raised:
        bench.provider.provision(order(bench, "over-quota"))
    assert "rateLimitExceeded" in repr(raised.value.__cause__.errors)  # type: ignore[union-attr]
    with pytest.raises(CloudRateLimited):
        bench.provider.release(served.name, bench.home)
    with pytest.raises(CloudRateLimited):
        bench.provider.observe([bench.home])
