"""What the MIG and TPU providers do on the Compute Engine and Cloud TPU APIs (over the
project's emulator, read back with the real clients), one test per behaviour Google documents
and the page it is documented on."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import requests
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import compute_v1, compute_v1beta

from emulators import ComputeEmulator
from opendws.adapters.gce import CloudSettings
from opendws.adapters.mig import (
    BASE_LABEL,
    MigFlexProvider,
    TemplateNotFlexStart,
    base_template_name,
    group_name,
)
from opendws.adapters.tpu import TpuQueuedProvider
from opendws.catalog import vm_profile
from opendws.clock import ManualClock
from opendws.domain.model import Pool
from opendws.ports import Order, ProvisionPhase
from opendws.sim import SimulatedCloud
from tests.builders import A3, DAY, NOW, flex, pool, tpu_pool

PROJECT = "semantics"
ZONE = "us-central1-a"
A3_ULTRA = "a3-ultragpu-8g"
# Compute calls that change something, in the order a spy records them.
MUTATIONS = ("insert", "delete", "cancel", "delete_instances")


@pytest.fixture
def cloud() -> SimulatedCloud:
    return SimulatedCloud(
        ManualClock(NOW), provisioning_latency=timedelta(0), operation_latency=timedelta(0)
    )


@pytest.fixture
def emulator(cloud: SimulatedCloud) -> Iterator[ComputeEmulator]:
    with ComputeEmulator(cloud) as running:
        yield running


def options(emulator: ComputeEmulator) -> dict[str, Any]:
    return {
        "client_options": {"api_endpoint": emulator.endpoint},
        "credentials": AnonymousCredentials(),
    }


class Spy:
    """A client that records its mutating calls (``kind.method``) into a shared log, and can
    fail (as a crash would) at the ``crash_at``-th of them, before making it."""

    def __init__(self, kind: str, client: object, log: list[str], crash: list[int]) -> None:
        self._kind, self._client, self._log, self._crash = kind, client, log, crash

    def __getattr__(self, method: str) -> Any:
        call = getattr(self._client, method)
        if method not in MUTATIONS:
            return call

        def recorded(*args: Any, **kwargs: Any) -> Any:
            if self._crash and len(self._log) + 1 == self._crash[0]:
                raise ConnectionError(f"crashed before {self._kind}.{method}")
            self._log.append(f"{self._kind}.{method}")
            return call(*args, **kwargs)

        return recorded


def mig_provider(
    emulator: ComputeEmulator, log: list[str] | None = None, crash: list[int] | None = None
) -> MigFlexProvider:
    common = options(emulator)
    calls = [] if log is None else log
    crashes = [] if crash is None else crash

    def spy(kind: str, client: object) -> Any:
        return Spy(kind, client, calls, crashes)

    return MigFlexProvider(
        CloudSettings(project=PROJECT),
        templates=spy("templates", compute_v1.InstanceTemplatesClient(**common)),
        groups=spy("groups", compute_v1.InstanceGroupManagersClient(**common)),
        resize_requests=spy(
            "resize", compute_v1beta.InstanceGroupManagerResizeRequestsClient(**common)
        ),
        instances=spy("instances", compute_v1.InstancesClient(**common)),
    )


def group_template(emulator: ComputeEmulator, home: Pool) -> compute_v1.InstanceTemplate:
    """The template the pool's group makes its VMs from."""
    group = compute_v1.InstanceGroupManagersClient(**options(emulator)).get(
        project=PROJECT, zone=home.zone, instance_group_manager=group_name(home)
    )
    return compute_v1.InstanceTemplatesClient(**options(emulator)).get(
        project=PROJECT, instance_template=group.instance_template.rsplit("/", 1)[-1]
    )


def vms(emulator: ComputeEmulator) -> list[str]:
    client = compute_v1.InstancesClient(**options(emulator))
    return sorted(vm.name for vm in client.list(project=PROJECT, zone=ZONE))


# MIG -----------------------------------------------------------------------------------


def test_a3_ultra_and_a4_templates_get_hyperdisk_and_gvnic(emulator: ComputeEmulator) -> None:
    """A3 Ultra and A4 VMs boot only from Hyperdisk and need gVNIC
    (ai-hypercomputer/docs/create/create-vm; cluster-toolkit
    ``examples/machine-learning/a3-ultragpu-8g/a3ultra-vm.yaml``: ``disk_type:
    hyperdisk-balanced``, ``nic_type: GVNIC``): the family rule is in the catalog."""
    assert vm_profile("a4-highgpu-8g") == vm_profile(A3_ULTRA)
    home = pool(zone=ZONE, shape=A3_ULTRA, accelerator="nvidia-h200-141gb", capacity=8)
    emulator.cloud.set_stock(ZONE, A3_ULTRA, 8)
    provider = mig_provider(emulator)
    provider.provision(Order(request=flex("ultra", vm_count=1), pool=home, attempt=1))
    template = group_template(emulator, home)
    disk = template.properties.disks[0].initialize_params
    assert disk.disk_type == "hyperdisk-balanced"
    assert template.properties.network_interfaces[0].nic_type == "GVNIC"


def test_a_template_that_is_not_flex_start_is_refused_loudly(emulator: ComputeEmulator) -> None:
    """A team's own template for the pool's machine type is read back, and one whose
    provisioning model is not FLEX_START is refused: its VMs would be STANDARD ones, silently
    (skypilot-org/skypilot#9607). Nothing is created from it."""
    home = pool(zone=ZONE, capacity=8)
    standard = compute_v1.InstanceTemplate(
        name=base_template_name(home),
        properties=compute_v1.InstanceProperties(
            machine_type=A3,
            scheduling=compute_v1.Scheduling(provisioning_model="STANDARD"),
            labels=BASE_LABEL,
        ),
    )
    templates = compute_v1.InstanceTemplatesClient(**options(emulator))
    templates.insert(project=PROJECT, instance_template_resource=standard).result()
    provider = mig_provider(emulator)
    order = Order(request=flex("refused", vm_count=1), pool=home, attempt=1)
    with pytest.raises(TemplateNotFlexStart, match=r"STANDARD VMs, not FLEX_START"):
        provider.provision(order)
    groups = compute_v1.InstanceGroupManagersClient(**options(emulator))
    assert list(groups.list(project=PROJECT, zone=ZONE)) == []


def test_a_group_in_bulk_mode_is_replaced_and_says_so(
    emulator: ComputeEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    """A MIG in bulk mode takes no resize requests, and its mode cannot be changed
    (compute/docs/instance-groups/about-bulk-mode): one made by an older version is deleted
    and made again, with a warning, and the order's resize request then goes through."""
    home = pool(zone=ZONE, capacity=8)
    emulator.cloud.set_stock(ZONE, A3, 8)
    provider = mig_provider(emulator)
    template = provider._ensure_template(home)  # the template an older version made too
    groups = compute_v1.InstanceGroupManagersClient(**options(emulator))
    bulk = compute_v1.InstanceGroupManager(
        name=group_name(home),
        base_instance_name=group_name(home),
        instance_template=template,
        target_size=0,
        target_size_policy=compute_v1.InstanceGroupManagerTargetSizePolicy(mode="BULK"),
    )
    groups.insert(project=PROJECT, zone=ZONE, instance_group_manager_resource=bulk).result()
    order = Order(request=flex("after-bulk", vm_count=2), pool=home, attempt=1)
    with caplog.at_level(logging.WARNING, logger="opendws.adapters.mig"):
        provider.provision(order)
    assert "bulk mode" in caplog.text
    group = groups.get(project=PROJECT, zone=ZONE, instance_group_manager=group_name(home))
    assert group.target_size_policy.mode != "BULK"
    assert provider.observe([home])[order.name].phase is ProvisionPhase.READY


def test_creation_awaits_template_then_group_then_request(emulator: ComputeEmulator) -> None:
    """Every operation is awaited, in order: template → group → resize request (cluster-
    toolkit's ``mig_flex.py`` waits for each operation before the next call)."""
    log: list[str] = []
    provider = mig_provider(emulator, log)
    home = pool(zone=ZONE, capacity=8)
    provider.provision(Order(request=flex("ordered", vm_count=1), pool=home, attempt=1))
    assert log == ["templates.insert", "groups.insert", "resize.insert"]


def test_a_vm_left_without_its_resize_request_is_observed_and_released(
    emulator: ComputeEmulator,
) -> None:
    """Deleting a resize request does not delete its VMs (compute.proto
    ``InstanceGroupManagerResizeRequests.Delete``): such a VM — a release interrupted after
    the request was deleted — still runs and bills, so it is observed under its order's name
    (READY) and released by name."""
    home = pool(zone=ZONE, capacity=8)
    emulator.cloud.set_stock(ZONE, A3, 8)
    provider = mig_provider(emulator)
    order = Order(request=flex("orphan", vm_count=2), pool=home, attempt=1)
    provider.provision(order)
    assert provider.observe([home])[order.name].phase is ProvisionPhase.READY
    resize = compute_v1.InstanceGroupManagerResizeRequestsClient(**options(emulator))
    resize.delete(
        project=PROJECT, zone=ZONE, instance_group_manager=group_name(home),
        resize_request=order.name,
    ).result()  # fmt: skip
    assert vms(emulator) == [f"{order.name}-0", f"{order.name}-1"]
    seen = provider.observe([home])[order.name]
    assert (seen.phase, seen.pool_id) == (ProvisionPhase.READY, home.pool_id)
    provider.release(order.name, home)
    assert vms(emulator) == []
    assert provider.observe([home]) == {}
    assert emulator.cloud.stock(ZONE, A3) == 8


def test_release_after_ready_deletes_the_vms_before_the_request(
    emulator: ComputeEmulator,
) -> None:
    """Release goes VMs first, then the request, so that a crash between the two leaves the
    VMs — observable by name — rather than VMs no request names."""
    home = pool(zone=ZONE, capacity=8)
    emulator.cloud.set_stock(ZONE, A3, 8)
    log: list[str] = []
    provider = mig_provider(emulator, log)
    order = Order(request=flex("ready", vm_count=2), pool=home, attempt=1)
    provider.provision(order)
    log.clear()
    provider.release(order.name, home)
    assert log == ["groups.delete_instances", "resize.delete"]
    assert vms(emulator) == []
    assert provider.observe([home]) == {}


def test_release_while_waiting_cancels_and_awaits_before_deleting(
    emulator: ComputeEmulator,
) -> None:
    """Only an ACCEPTED request can be cancelled, and only an inactive one deleted: the
    cancel is awaited, then the request deleted (magic-modules
    ``custom_delete/compute_mig_resize_request_delete.go.tmpl``)."""
    home = pool(zone=ZONE, capacity=8)
    emulator.cloud.set_stock(ZONE, A3, 0)
    log: list[str] = []
    provider = mig_provider(emulator, log)
    order = Order(request=flex("queued", vm_count=2), pool=home, attempt=1)
    provider.provision(order)
    seen = provider.observe([home])[order.name]
    assert (seen.phase, seen.last_attempt) == (
        ProvisionPhase.WAITING, "ZONE_RESOURCE_POOL_EXHAUSTED",
    )  # fmt: skip
    log.clear()
    provider.release(order.name, home)
    assert log == ["resize.cancel", "resize.delete"]
    assert provider.observe([home]) == {}


@pytest.mark.parametrize("queued", [False, True], ids=["ready", "waiting"])
def test_a_release_crashed_after_any_step_leaves_something_observed_and_converges(
    emulator: ComputeEmulator, queued: bool
) -> None:
    """Whatever step a release is interrupted before, what is left is observed under the
    order's name, and releasing again leaves nothing (release is safe to repeat)."""
    home = pool(zone=ZONE, capacity=8)
    steps = 2  # ready: delete VMs, delete request; waiting: cancel, delete request
    for crash_at in range(1, steps + 1):
        emulator.cloud.set_stock(ZONE, A3, 0 if queued else 8)
        log: list[str] = []
        crash: list[int] = []
        provider = mig_provider(emulator, log, crash)
        order = Order(request=flex(f"crash-{queued}-{crash_at}", vm_count=1), pool=home, attempt=1)
        provider.provision(order)
        log.clear()
        crash.append(crash_at)
        with pytest.raises(ConnectionError):
            provider.release(order.name, home)
        assert order.name in provider.observe([home])
        crash.clear()
        provider.release(order.name, home)
        assert provider.observe([home]) == {}
        assert vms(emulator) == []


# TPU -----------------------------------------------------------------------------------


def tpu_provider(emulator: ComputeEmulator, tier: str = "flex_start") -> TpuQueuedProvider:
    session = AuthorizedSession(AnonymousCredentials())
    settings = CloudSettings(project=PROJECT, tpu_tier=tier)
    return TpuQueuedProvider(settings, session, endpoint=emulator.endpoint)


def queued_resource(emulator: ComputeEmulator, name: str) -> dict[str, Any]:
    url = f"{emulator.endpoint}/v2alpha1/projects/{PROJECT}/locations/{ZONE}/queuedResources"
    response = requests.get(f"{url}/{name}", timeout=10)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def test_a_tpu_order_is_a_flex_start_queued_resource_of_its_generation(
    emulator: ComputeEmulator,
) -> None:
    """Flex-start TPUs are queued resources with ``provisioningModel=FLEX_START`` and
    ``runDuration.maxRunDuration`` in the ``v2alpha1`` API (its discovery document;
    tpu/docs/request-using-flex-start); each generation boots its own runtime version
    (tpu/docs/runtimes: v6e ``v2-alpha-tpuv6e``); it stays valid until the request's
    max_wait."""
    home = tpu_pool(zone=ZONE, shape="tpu-v6e", capacity=64)
    request = flex("slice", topology="2x2", accelerator="tpu-v6e", hours=3, max_wait=DAY)
    order = Order(request=request, pool=home, attempt=1)
    tpu_provider(emulator).provision(order)
    body = queued_resource(emulator, order.name)
    assert body["provisioningModel"] == "FLEX_START"
    assert body["runDuration"]["maxRunDuration"] == "10800s"
    assert "guaranteed" not in body
    assert "spot" not in body
    node = body["tpu"]["nodeSpec"][0]["node"]
    assert node["runtimeVersion"] == "v2-alpha-tpuv6e"
    assert node["acceleratorConfig"] == {"type": "V6E", "topology": "2x2"}
    assert body["queueingPolicy"]["validUntilTime"].startswith("2026-12-02T00:00:00")


def test_the_spot_tier_stays_an_option(emulator: ComputeEmulator) -> None:
    home = tpu_pool(zone=ZONE, capacity=64)
    order = Order(request=flex("spot", topology="2x2"), pool=home, attempt=1)
    tpu_provider(emulator, "spot").provision(order)
    body = queued_resource(emulator, order.name)
    assert "spot" in body
    assert body.get("provisioningModel") in (None, "PROVISIONING_MODEL_UNSPECIFIED")


def test_a_queued_resource_waits_then_fails_at_valid_until_and_stays_listed(
    emulator: ComputeEmulator,
) -> None:
    """A queued resource that cannot be served waits in WAITING_FOR_RESOURCES; when its
    valid-until passes it goes FAILED and stays listed until deleted
    (tpu/docs/queued-resources)."""
    home = tpu_pool(zone=ZONE, capacity=64)
    emulator.cloud.set_stock(ZONE, "V5LITE_POD", 0)
    provider = tpu_provider(emulator)
    order = Order(request=flex("short", topology="2x2", max_wait=DAY), pool=home, attempt=1)
    provider.provision(order)
    assert queued_resource(emulator, order.name)["state"]["state"] == "WAITING_FOR_RESOURCES"
    assert provider.observe([home])[order.name].phase is ProvisionPhase.WAITING
    emulator.cloud.advance(DAY + timedelta(minutes=1))
    seen = provider.observe([home])[order.name]
    assert seen.phase is ProvisionPhase.FAILED
    assert seen.error_code
    provider.release(order.name, home)
    assert provider.observe([home]) == {}
    provider.release(order.name, home)  # gone already: success
