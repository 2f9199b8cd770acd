"""Calendar blocks on Compute Engine (google-cloud-compute): at booking, a calendar-mode
``FutureReservation`` for the block's VMs over its time window, whose auto-created reservation
is deleted at the end; at the block's start, the gang's VMs, created to consume that
reservation and named ``{order}-{index}``; at the end, the VMs and the future reservation are
deleted.

Phases: the reservation alone is RESERVED; VMs being created are CREATING; every VM RUNNING is
READY. A future reservation the cloud refused leaves nothing behind (it is asked for again).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Sequence

from google.cloud import compute_v1

from opendws.adapters.gce import (
    MANAGED_BY,
    CloudSettings,
    boot_disk,
    created,
    deleted,
    network,
    order_of_vm,
    owned,
    vm_names,
)
from opendws.domain.model import Pool
from opendws.ports import Observed, Order, ProvisionPhase

RESERVATION_KEY = "compute.googleapis.com/reservation-name"


class CalendarReservationProvider:
    """CapacityProvider for calendar blocks (see the module docstring)."""

    def __init__(
        self,
        settings: CloudSettings,
        *,
        future_reservations: compute_v1.FutureReservationsClient,
        instances: compute_v1.InstancesClient,
    ) -> None:
        self._settings = settings
        self._project = settings.project
        self._future_reservations = future_reservations
        self._instances = instances

    def observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        by_zone: dict[str, dict[str, Pool]] = defaultdict(dict)
        for pool in pools:
            by_zone[pool.zone][pool.shape] = pool
        observed: dict[str, Observed] = {}
        for zone, pools_here in sorted(by_zone.items()):
            observed.update(self._observe_zone(zone, pools_here))
        return observed

    def reserve(self, order: Order) -> None:
        request = order.request
        assert request.start_at is not None  # calendar blocks have a start
        end = request.start_at + request.run_duration
        reservation = compute_v1.FutureReservation(
            name=order.name,
            description=f"opendws calendar block {request.request_id}",
            reservation_mode="CALENDAR",
            reservation_name=order.name,
            planning_status="SUBMITTED",
            specific_reservation_required=True,
            auto_delete_auto_created_reservations=True,
            specific_sku_properties=compute_v1.FutureReservationSpecificSKUProperties(
                total_count=request.gang.vm_count,
                instance_properties=(
                    compute_v1.AllocationSpecificSKUAllocationReservedInstanceProperties(
                        machine_type=order.pool.shape
                    )
                ),
            ),
            time_window=compute_v1.FutureReservationTimeWindow(
                start_time=request.start_at.isoformat().replace("+00:00", "Z"),
                end_time=end.isoformat().replace("+00:00", "Z"),
            ),
        )
        created(
            lambda: self._future_reservations.insert(
                project=self._project,
                zone=order.pool.zone,
                future_reservation_resource=reservation,
            )
        )

    def provision(self, order: Order) -> None:
        pool = order.pool
        for name in vm_names(order.name, order.request.gang.vm_count):
            instance = compute_v1.Instance(
                name=name,
                machine_type=f"zones/{pool.zone}/machineTypes/{pool.shape}",
                reservation_affinity=compute_v1.ReservationAffinity(
                    consume_reservation_type="SPECIFIC_RESERVATION",
                    key=RESERVATION_KEY,
                    values=[order.name],
                ),
                scheduling=compute_v1.Scheduling(
                    provisioning_model="RESERVATION_BOUND",
                    instance_termination_action="DELETE",
                    on_host_maintenance="TERMINATE",
                ),
                disks=[boot_disk(self._settings)],
                network_interfaces=[network(self._settings)],
                labels=MANAGED_BY,
            )
            created(functools.partial(
                self._instances.insert,
                project=self._project, zone=pool.zone, instance_resource=instance,
            ))  # fmt: skip

    def release(self, name: str, pool: Pool) -> None:
        for vm in self._instances.list(project=self._project, zone=pool.zone):
            if owned(vm.name) and order_of_vm(vm.name) == name:
                deleted(functools.partial(
                    self._instances.delete,
                    project=self._project, zone=pool.zone, instance=vm.name,
                ))  # fmt: skip
        deleted(
            lambda: self._future_reservations.delete(
                project=self._project, zone=pool.zone, future_reservation=name
            )
        )

    def _observe_zone(self, zone: str, pools: dict[str, Pool]) -> dict[str, Observed]:
        reservations = {
            reservation.name: reservation
            for reservation in self._future_reservations.list(project=self._project, zone=zone)
            if owned(reservation.name)
        }
        vms: dict[str, list[compute_v1.Instance]] = defaultdict(list)
        for vm in self._instances.list(project=self._project, zone=zone):
            if owned(vm.name):
                vms[order_of_vm(vm.name)].append(vm)
        observed: dict[str, Observed] = {}
        for name, reservation in reservations.items():
            shape = reservation.specific_sku_properties.instance_properties.machine_type
            pool = pools.get(shape.rsplit("/", 1)[-1])
            if pool is None:
                continue
            wanted = reservation.specific_sku_properties.total_count
            gang = vms.get(name, [])
            status = reservation.status
            phase = _phase(gang, wanted)
            if status.procurement_status in ("FAILED", "CANCELLED", "DECLINED"):
                phase = ProvisionPhase.FAILED
            elif (
                status.procurement_status == "FULFILLED"
                and not status.auto_created_reservations
                and not gang
            ):
                phase = ProvisionPhase.ENDED  # the window closed; its reservation is gone
            observed[name] = Observed(name=name, pool_id=pool.pool_id, phase=phase)
        for name, gang in vms.items():
            # VMs whose reservation is gone: still owned, still to be reported (and released).
            pool = pools.get(gang[0].machine_type.rsplit("/", 1)[-1])
            if name not in observed and pool is not None and _is_calendar_vm(gang[0]):
                observed[name] = Observed(
                    name=name, pool_id=pool.pool_id, phase=_phase(gang, len(gang))
                )
        return observed


def _phase(gang: list[compute_v1.Instance], wanted: int) -> ProvisionPhase:
    if not gang:
        return ProvisionPhase.RESERVED
    running = sum(vm.status == "RUNNING" for vm in gang)
    return ProvisionPhase.READY if running >= wanted else ProvisionPhase.CREATING


def _is_calendar_vm(vm: compute_v1.Instance) -> bool:
    affinity = vm.reservation_affinity
    return bool(affinity) and affinity.consume_reservation_type == "SPECIFIC_RESERVATION"
