"""What accelerators and machine types opendws knows, so a request can be checked before it is
stored: an unknown accelerator, or a machine type that does not carry the accelerator or count
the request claims, is refused at intake with a message that says which ones exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MachineType:
    """A Compute Engine accelerator-optimized machine type and the GPUs each VM carries."""

    name: str
    accelerator: str
    accelerators_per_vm: int


GPU_ACCELERATORS = frozenset(
    {
        "nvidia-b200",
        "nvidia-h200-141gb",
        "nvidia-h100-80gb",
        "nvidia-h100-mega-80gb",
        "nvidia-a100-80gb",
        "nvidia-tesla-a100",
        "nvidia-l4",
    }
)
TPU_ACCELERATORS = frozenset({"tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"})
ACCELERATORS = GPU_ACCELERATORS | TPU_ACCELERATORS


def _family(prefix: str, accelerator: str, counts: tuple[int, ...]) -> list[MachineType]:
    return [MachineType(f"{prefix}-{count}g", accelerator, count) for count in counts]


MACHINE_TYPES: dict[str, MachineType] = {
    machine.name: machine
    for machine in [
        MachineType("a4-highgpu-8g", "nvidia-b200", 8),
        MachineType("a3-ultragpu-8g", "nvidia-h200-141gb", 8),
        MachineType("a3-megagpu-8g", "nvidia-h100-mega-80gb", 8),
        *_family("a3-highgpu", "nvidia-h100-80gb", (1, 2, 4, 8)),
        *_family("a2-ultragpu", "nvidia-a100-80gb", (1, 2, 4, 8)),
        *_family("a2-highgpu", "nvidia-tesla-a100", (1, 2, 4, 8)),
        MachineType("a2-megagpu-16g", "nvidia-tesla-a100", 16),
        MachineType("g2-standard-4", "nvidia-l4", 1),
        MachineType("g2-standard-8", "nvidia-l4", 1),
        MachineType("g2-standard-12", "nvidia-l4", 1),
        MachineType("g2-standard-16", "nvidia-l4", 1),
        MachineType("g2-standard-24", "nvidia-l4", 2),
        MachineType("g2-standard-32", "nvidia-l4", 1),
        MachineType("g2-standard-48", "nvidia-l4", 4),
        MachineType("g2-standard-96", "nvidia-l4", 8),
    ]
}


# TPU accelerator types as the Cloud TPU v2 API names them (AcceleratorConfig.Type).
TPU_API_TYPES: dict[str, str] = {
    "tpu-v4": "V4",
    "tpu-v5e": "V5LITE_POD",
    "tpu-v5p": "V5P",
    "tpu-v6e": "V6E",
}
TPU_ACCELERATOR_OF_API_TYPE = {api: name for name, api in TPU_API_TYPES.items()}

# Calendar-mode future reservations reserve TPU chips as an aggregate reservation of one VM
# family (FutureResourcesSpecAggregateResources.vmFamily, AllocationAggregateReservation) and
# an accelerator type (the chip's Compute name), keyed by the TPU API type of the pool.
TPU_VM_FAMILIES: dict[str, str] = {
    "V4": "VM_FAMILY_CLOUD_TPU_POD_SLICE_CT4P",
    "V5LITE_POD": "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT5LP",
    "V5P": "VM_FAMILY_CLOUD_TPU_POD_SLICE_CT5P",
    "V6E": "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E",
}
TPU_COMPUTE_ACCELERATORS: dict[str, str] = {
    "V4": "ct4p",
    "V5LITE_POD": "ct5lp",
    "V5P": "ct5p",
    "V6E": "ct6e",
}
TPU_TYPE_OF_VM_FAMILY = {family: api for api, family in TPU_VM_FAMILIES.items()}

# The TPU generations Dynamic Workload Scheduler serves, per mode. Flex-start: "You can only
# request Flex-start TPU v6e and v5e" (tpu/docs/request-using-flex-start, Limitations).
# Calendar mode: "You can only reserve the following TPU versions": v6e, v5p and v5e
# (tpu/docs/calendar-mode-reservation, Limitations). Google GPUs have no such list per mode.
TPU_FLEX_START = frozenset({"tpu-v5e", "tpu-v6e"})
TPU_CALENDAR = frozenset({"tpu-v5e", "tpu-v5p", "tpu-v6e"})
# Where calendar mode reserves each generation, and for which workload type
# (``AllocationAggregateReservation.workloadType``), from tpu/docs/calendar-mode-reservation
# ("Limitations": "You can only reserve the following TPU versions in the specified zones"):
# v6e in asia-northeast1-b, europe-west4-a, us-east5-a and us-east5-b; v5p in us-east5-a; v5e
# in europe-west4-b and us-west4-b (BATCH) and us-south1-a (SERVING). The page names a workload
# type for v5e only; v6e and v5p blocks are training blocks (BATCH).
TPU_CALENDAR_ZONES: dict[str, dict[str, str]] = {
    "tpu-v6e": {
        "asia-northeast1-b": "BATCH", "europe-west4-a": "BATCH", "us-east5-a": "BATCH",
        "us-east5-b": "BATCH",
    },
    "tpu-v5p": {"us-east5-a": "BATCH"},
    "tpu-v5e": {"europe-west4-b": "BATCH", "us-west4-b": "BATCH", "us-south1-a": "SERVING"},
}  # fmt: skip
# A SERVING block of v5e holds 1, 4 or 8 chips (compute/docs/instances/
# create-future-reservations-calendar-mode, "Limitations": "You can only reserve one, four, or
# eight TPUs v5e for serving (SERVING) workload types").
TPU_SERVING_CHIPS = frozenset({1, 4, 8})


def tpu_calendar_zone_problem(accelerator: str, locations: Sequence[str]) -> str | None:
    """Why Google would refuse every calendar block of TPU ``accelerator`` in ``locations``
    (zones, or regions standing for their zones): none of them is a zone where calendar mode
    reserves it (:data:`TPU_CALENDAR_ZONES`); None if one is, or if ``accelerator`` is not a
    TPU Google reserves in calendar mode at all (:func:`tpu_mode_problem` says so)."""
    zones = TPU_CALENDAR_ZONES.get(accelerator)
    if not zones:
        return None
    if any(zone in locations or zone.rsplit("-", 1)[0] in locations for zone in zones):
        return None
    listed = ", ".join(f"{zone} ({workload})" for zone, workload in sorted(zones.items()))
    return (
        f"Google Cloud's calendar mode reserves {accelerator} only in {listed}, none of which "
        f"is in {', '.join(locations)} (cloud.google.com/tpu/docs/calendar-mode-reservation)"
    )


def tpu_calendar_workload(accelerator: str, zone: str) -> str | None:
    """The workload type a calendar block of TPU ``accelerator`` is reserved as in ``zone``;
    None where Google does not reserve that generation in calendar mode."""
    return TPU_CALENDAR_ZONES.get(accelerator, {}).get(zone)


def tpu_mode_problem(accelerator: str, mode: str) -> str | None:
    """Why Google would refuse a TPU request of ``accelerator`` in ``mode`` (``flex_start`` or
    ``calendar``); None if it serves it, or if ``accelerator`` is not a TPU."""
    if accelerator not in TPU_ACCELERATORS:
        return None
    flex = mode == "flex_start"
    served = TPU_FLEX_START if flex else TPU_CALENDAR
    if accelerator in served:
        return None
    label, page = ("flex-start", "request-using-flex-start") if flex else (
        "calendar mode", "calendar-mode-reservation")  # fmt: skip
    problem = (
        f"Google Cloud's {label} serves {', '.join(sorted(served))} only, not {accelerator} "
        f"(cloud.google.com/tpu/docs/{page})"
    )
    if flex and accelerator in TPU_CALENDAR:
        problem += f"; reserve {accelerator} in calendar mode instead"
    return problem


# TPU VMs (hosts, "workers") per slice. Every multi-host slice has four chips on each of its
# VMs; v5e and v6e also have single-host slices of up to eight chips on one VM (tpu/docs/v5e and
# tpu/docs/v6e, "Configurations": v5litepod-8 / v6e-8 (2x4) are one host, v5litepod-16 (4x4) is
# four; tpu/docs/v5p-training and tpu/docs/v4: four chips per host).
TPU_CHIPS_PER_HOST = 4
TPU_SINGLE_HOST_CHIPS: dict[str, int] = {"tpu-v5e": 8, "tpu-v6e": 8, "tpu-v4": 4, "tpu-v5p": 4}


def tpu_hosts(accelerator: str, chips: int) -> int:
    """The TPU VMs ("workers") of one slice of ``chips`` chips of ``accelerator``."""
    if chips < 1:
        raise ValueError(f"a slice has at least one chip, not {chips}")
    if chips <= TPU_SINGLE_HOST_CHIPS.get(accelerator, TPU_CHIPS_PER_HOST):
        return 1
    return -(-chips // TPU_CHIPS_PER_HOST)


# The Cloud TPU software version each generation boots (tpu/docs/runtimes): queued resources of
# one accelerator use its version unless OPENDWS_TPU_RUNTIME_VERSION names another for all.
TPU_RUNTIME_VERSIONS: dict[str, str] = {
    "tpu-v4": "tpu-ubuntu2204-base",
    "tpu-v5e": "v2-alpha-tpuv5-lite",
    "tpu-v5p": "v2-alpha-tpuv5",
    "tpu-v6e": "v2-alpha-tpuv6e",
}
# The ``python3`` each of those runtimes boots with, on which the agent runs (it needs
# opendws.agent.MINIMUM_PYTHON). tpu/docs/runtimes says each image holds "the Ubuntu operating
# system, Docker" and names no version; tpu-ubuntu2204-base is Ubuntu 22.04, whose python3 is
# 3.10 (pytorch/xla moved its TPU wheels to cp310 for it: "tpu-ubuntu2204-base doesn't support
# python 3.8"), and the v2-alpha-tpuv5*/tpuv6e runtimes are built on it ("TPU v6e supports
# Python 3.10+", vertex-ai/docs/training/training-with-tpu-vm).
TPU_RUNTIME_PYTHON: dict[str, tuple[int, int]] = {
    "tpu-ubuntu2204-base": (3, 10),
    "v2-alpha-tpuv5-lite": (3, 10),
    "v2-alpha-tpuv5": (3, 10),
    "v2-alpha-tpuv6e": (3, 10),
}


@dataclass(frozen=True, slots=True)
class VmProfile:
    """What a machine family's VMs need in their instance template: the boot disk type, and the
    NIC type (None: the default). A3 Ultra and A4 take only Hyperdisk and need gVNIC
    (ai-hypercomputer/docs/create/create-vm; cluster-toolkit's a3ultra-vm.yaml and
    a4high-vm.yaml: ``disk_type: hyperdisk-balanced``, ``nic_type: GVNIC``); A3 High and Mega
    need gVNIC (cluster-toolkit's a3high and a3mega blueprints: ``bandwidth_tier:
    gvnic_enabled``, ``pd-balanced``)."""

    disk_type: str
    nic_type: str | None = None


VM_PROFILES: dict[str, VmProfile] = {
    "a4-": VmProfile("hyperdisk-balanced", "GVNIC"),
    "a3-ultragpu": VmProfile("hyperdisk-balanced", "GVNIC"),
    "a3-megagpu": VmProfile("pd-balanced", "GVNIC"),
    "a3-highgpu": VmProfile("pd-balanced", "GVNIC"),
}
DEFAULT_VM_PROFILE = VmProfile("pd-balanced")


def vm_profile(machine_type: str) -> VmProfile:
    """The boot disk and NIC a VM of ``machine_type`` needs (the family rule above)."""
    for prefix, profile in VM_PROFILES.items():
        if machine_type.startswith(prefix):
            return profile
    return DEFAULT_VM_PROFILE
