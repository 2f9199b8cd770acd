"""What the Compute Engine and Cloud TPU adapters share: settings, names, and the calls'
idempotence (an "already exists" on create and a "not found" on delete are both success)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from google.api_core.exceptions import Conflict, NotFound
from google.cloud import compute_v1

from opendws.ports import ORDER_PREFIX

T = TypeVar("T")
MANAGED_BY = {"managed-by": "opendws"}


@dataclass(frozen=True, slots=True, kw_only=True)
class CloudSettings:
    """Where and how capacity is created."""

    project: str
    boot_image: str = "projects/debian-cloud/global/images/family/debian-12"
    network: str = "global/networks/default"
    tpu_runtime_version: str = "v2-alpha-tpuv5-lite"
    tpu_tier: str = "guaranteed"  # or "spot"
    # How long a queued TPU resource may wait for capacity before the cloud gives up by itself
    # (the reconciler cancels it earlier, at its own provisioning timeout).
    tpu_valid_for: timedelta = timedelta(minutes=30)


def created(call: Callable[[], object]) -> None:
    """Run a create; one that finds its resource already there has nothing left to do."""
    with contextlib.suppress(Conflict):
        call()


def deleted(call: Callable[[], object]) -> None:
    """Run a delete; one that finds nothing to delete has nothing left to do."""
    with contextlib.suppress(NotFound):
        call()


def found(call: Callable[[], T]) -> T | None:
    """Run a get; None if there is no such resource."""
    try:
        return call()
    except NotFound:
        return None


def owned(name: str) -> bool:
    """True for a resource opendws created (and may therefore change or delete)."""
    return name.startswith(ORDER_PREFIX)


def order_of_vm(vm_name: str) -> str:
    """The order a gang VM belongs to: VMs are named ``{order}-{index}``."""
    return vm_name.rsplit("-", 1)[0]


def vm_names(order: str, count: int) -> list[str]:
    """The names of an order's ``count`` VMs."""
    return [f"{order}-{index}" for index in range(count)]


def boot_disk(settings: CloudSettings) -> compute_v1.AttachedDisk:
    """A boot disk from the configured image, deleted with its VM."""
    return compute_v1.AttachedDisk(
        boot=True,
        auto_delete=True,
        initialize_params=compute_v1.AttachedDiskInitializeParams(source_image=settings.boot_image),
    )


def network(settings: CloudSettings) -> compute_v1.NetworkInterface:
    return compute_v1.NetworkInterface(network=settings.network)
