"""Calendar blocks on Google Cloud: calendar-mode future reservations (google-cloud-compute),
consumed at their start by VMs (GPU blocks) or by TPU queued resources (TPU blocks).

A block's life at Google (compute/docs/instances/future-reservations-calendar-mode-overview,
create-future-reservations-calendar-mode, delete-future-reservations-calendar-mode;
tpu/docs/calendar-mode-reservation):

- Before booking, Google's Advice API (``advice.calendarMode``) says at which starts it has
  the capacity; :meth:`advise` asks it.
- :meth:`reserve` submits a future reservation in CALENDAR mode (DENSE, the only v1 deployment
  type) for the block's window: GPU VMs as ``specificSkuProperties`` of the machine type, TPU
  chips as an ``aggregateReservation`` of the generation's VM family, reserved as the workload
  type the zone serves (catalog.TPU_CALENDAR_ZONES). Google reviews it: ``procurementStatus``
  PENDING_APPROVAL, then APPROVED (its reservation, of the block's name, created now, empty)
  or DECLINED; from the start PROVISIONING while Google fills the reservation (possibly up to
  24 h), then FULFILLED.
- :meth:`provision`, once the block is FULFILLED, creates the consumers: VMs named
  ``{order}-{index}`` with the RESERVATION_BOUND provisioning model and a specific reservation
  affinity naming it (as cluster-toolkit's ``resume.py`` and the AI Hypercomputer REST examples
  do), their boot disk type a URL of the zone, or one reservation-bound queued resource naming
  the reservation.
- :meth:`withdraw` cancels a submitted block at Google, which allows it only within the
  cancellation windows; a refusal is reported, never raised. Google does not document the
  code of a refused cancel, so after any client error (4xx) the block is read back and its
  procurement status decides.
- :meth:`release` deletes the consumers, then deletes the block if Google allows it (cancelled,
  declined, failed or ended) or withdraws and deletes it if it may still be cancelled; a block
  Google keeps is left to its end (it is billed in full either way), when Google deletes its
  reservation and consumers itself and a later release deletes the request.

Observed phases (ports.Observed): PENDING_APPROVAL is REVIEW; approved, its reservation not
yet filled (absent, or there and empty), is APPROVED; FULFILLED with its reservation there and
nothing consuming it is RESERVED; consumers being created
CREATING, all running READY; DECLINED, CANCELLED and FAILED are FAILED with that code; FULFILLED
with its reservation gone is ENDED. ``locked_at`` is ``status.lockTime`` (when Google stops
allowing a cancel), ``ends_at`` the window's end.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from google.api_core.exceptions import ClientError, NotFound
from google.cloud import compute_v1

from opendws.adapters.gce import (
    MANAGED_BY,
    CloudSettings,
    awaited,
    boot_disk,
    created,
    deleted,
    found,
    hosts_of,
    network,
    order_of_vm,
    owned,
    per_zone,
    poll_where_called,
    vm_metadata,
    vm_names,
    vm_service_accounts,
    waited,
)
from opendws.adapters.tpu import Response, Session, TpuQueuedProvider, queued_resource_spec
from opendws.catalog import (
    TPU_ACCELERATOR_OF_API_TYPE,
    TPU_API_TYPES,
    TPU_TYPE_OF_VM_FAMILY,
    TPU_VM_FAMILIES,
    tpu_calendar_workload,
)
from opendws.domain.model import CapacityRequest, Pool, Provider, region_of
from opendws.ports import Advised, Host, Observed, Order, ProvisionPhase, Withdrawal

RESERVATION_KEY = "compute.googleapis.com/reservation-name"
SPEC = "block"  # the key of the one spec an Advice request asks about
# procurementStatus values after which a block may be deleted at once.
_DELETABLE = frozenset({"CANCELLED", "DECLINED", "FAILED", "FAILED_PARTIALLY_FULFILLED"})
_FAILED = {"DECLINED": "DECLINED", "CANCELLED": "CANCELLED", "FAILED": "FAILED",
           "FAILED_PARTIALLY_FULFILLED": "FAILED_PARTIALLY_FULFILLED"}  # fmt: skip
_IN_REVIEW = frozenset({"DRAFTING", "PENDING_APPROVAL", "PENDING_AMENDMENT_APPROVAL"})
# The procurementStatus of a block whose capacity is in its reservation: "Future reservation is
# fulfilled completely" (CP FutureReservationStatus.ProcurementStatus.FULFILLED). An approved
# block's reservation exists from approval, empty, and is filled from the start, possibly up
# to 24 h later (compute/docs/hpc/reserve-capacity-account-team: "Compute Engine
# automatically creates an empty reservation. Then, at your chosen start time, Compute Engine
# provisions the requested capacity into the auto-created reservation"): its existence is not
# its capacity.
_FILLED = "FULFILLED"


class _Blocks:
    """What GPU and TPU blocks share: the future reservation, the advice and the cancel."""

    tpu: bool = False

    def __init__(
        self, settings: CloudSettings, *, future_reservations: compute_v1.FutureReservationsClient,
        advice: compute_v1.AdviceClient | None = None,
        reservations: compute_v1.ReservationsClient | None = None,
        zone_operations: compute_v1.ZoneOperationsClient | None = None,
    ) -> None:  # fmt: skip
        self._settings = settings
        self._project = settings.project
        self._future_reservations = future_reservations
        self._advice = advice
        poll_where_called(future_reservations)  # its cancels and deletes are awaited
        # Whether a block's reservation exists is read from the reservations themselves
        # when a client is given (status.autoCreatedReservations names what was created,
        # not what still exists); from the status alone otherwise.
        self._reservations = reservations
        # A tenant's cancel waits on Google's zoneOperations.wait when given (it answers as
        # soon as the cancel is DONE), on the client's backing-off polls otherwise.
        self._zone_operations = zone_operations

    # The block --------------------------------------------------------------------------

    def reserve(self, order: Order) -> None:
        """Submit the block for Google's review (a repeat finds it there)."""
        request = order.request
        assert request.start_at is not None  # calendar blocks have a start
        end = request.start_at + request.run_duration
        reservation = compute_v1.FutureReservation(
            name=order.name,
            description=f"opendws calendar block {request.request_id}",
            reservation_mode="CALENDAR",
            deployment_type="DENSE",
            # Maintenance of the whole gang at once, as Google's dense GPU reservations show
            # it (AI Hypercomputer's reservation views: resourceStatus.reservationMaintenance.
            # schedulingType GROUPED): a training run is stopped once, not VM by VM.
            scheduling_type="GROUPED",
            reservation_name=order.name,
            planning_status="SUBMITTED",
            specific_reservation_required=True,
            auto_delete_auto_created_reservations=True,
            time_window=compute_v1.FutureReservationTimeWindow(
                start_time=_stamp(request.start_at), end_time=_stamp(end)
            ),
        )
        if self.tpu:
            # As gcloud sends it (command_lib/compute/future_reservations/util.py,
            # MakeAggregateReservationPropertiesMessage): the VM family, the chip count and
            # the workload type; no accelerator type (the family says which chip, and the
            # field takes a URL, not a bare name).
            api_type = TPU_API_TYPES[order.pool.accelerator]
            reservation.aggregate_reservation = compute_v1.AllocationAggregateReservation(
                vm_family=TPU_VM_FAMILIES[api_type],
                workload_type=_workload(order.pool),
                reserved_resources=[
                    compute_v1.AllocationAggregateReservationReservedResourceInfo(
                        accelerator=(
                            compute_v1.AllocationAggregateReservationReservedResourceInfoAccelerator(
                                accelerator_count=request.units
                            )
                        )
                    )
                ],
            )
        else:
            reservation.specific_sku_properties = compute_v1.FutureReservationSpecificSKUProperties(
                total_count=request.gang.vm_count,
                instance_properties=(
                    compute_v1.AllocationSpecificSKUAllocationReservedInstanceProperties(
                        machine_type=order.pool.shape
                    )
                ),
            )
        created(
            awaited(
                lambda: self._future_reservations.insert(
                    project=self._project, zone=order.pool.zone,
                    future_reservation_resource=reservation,
                ),
                self._settings.operation_timeout,
            )
        )  # fmt: skip

    def advise(
        self, request: CapacityRequest, pools: Sequence[Pool], *, earliest: datetime,
        latest: datetime,
    ) -> tuple[Advised, ...]:  # fmt: skip
        """Google's recommended starts in the zones of ``pools`` (one Advice call per region);
        () when the client has no Advice API configured."""
        if self._advice is None:
            return ()
        by_region: dict[str, set[str]] = defaultdict(set)
        for pool in pools:
            by_region[region_of(pool.zone)].add(pool.zone)
        advised: dict[tuple[datetime, str], Advised] = {}
        for region, zones in sorted(by_region.items()):
            response = self._advice.calendar_mode(
                project=self._project, region=region,
                calendar_mode_advice_request_resource=self._advice_request(
                    request, pools[0], zones, earliest, latest
                ),
            )  # fmt: skip
            for advice in _recommended(response, zones):
                advised.setdefault((advice.start_at, advice.zone), advice)
        return tuple(sorted(advised.values(), key=lambda a: (a.start_at, a.zone)))

    def withdraw(self, name: str, pool: Pool) -> Withdrawal:
        """Cancel the block at Google (awaited); REFUSED when Google keeps it."""
        return self._withdraw(self._get(name, pool), name, pool)

    def _withdraw(
        self, block: compute_v1.FutureReservation | None, name: str, pool: Pool
    ) -> Withdrawal:
        """:meth:`withdraw` of a block already read (None: there is none)."""
        if block is None or block.status.procurement_status in _DELETABLE:
            return Withdrawal.WITHDRAWN
        try:
            self._awaited(
                lambda: self._future_reservations.cancel(
                    project=self._project, zone=pool.zone, future_reservation=name
                ),
                pool.zone,
            )()
        except NotFound:
            return Withdrawal.WITHDRAWN
        except ClientError:
            # Google does not document the code of a refused cancel: the block's own state,
            # read back, says whether it went (cancelled, or gone) or Google keeps it. A server
            # error (5xx) is not a refusal: it raises, and a later pass tries again.
            after = self._get(name, pool)
            if after is None or after.status.procurement_status in _DELETABLE:
                return Withdrawal.WITHDRAWN
            return Withdrawal.REFUSED  # past its cancellation window: Google keeps it
        return Withdrawal.WITHDRAWN

    def _release_block(self, name: str, pool: Pool) -> None:
        """Delete the block where Google allows it (see the module docstring)."""
        block = self._get(name, pool)
        if block is None:
            return
        status = block.status.procurement_status
        ended = status == "FULFILLED" and not self._live(block, pool.zone)
        keeps = status not in _DELETABLE and not ended
        if keeps and self._withdraw(block, name, pool) is Withdrawal.REFUSED:
            return  # Google keeps it to its end; it is deleted after that
        deleted(
            awaited(
                lambda: self._future_reservations.delete(
                    project=self._project, zone=pool.zone, future_reservation=name
                ),
                self._settings.operation_timeout,
            )
        )

    def _awaited(self, call: Callable[[], Any], zone: str) -> Callable[[], object]:
        """``call`` and its operation in ``zone`` awaited: through Google's wait, which answers
        as soon as it is DONE, when a zone operations client is given. The cancel's end is
        what the reconciler observes too: answering at once keeps a tenant's cancel recorded
        as the tenant's (CANCELLED) rather than as a block cancelled at Google."""
        timeout = self._settings.operation_timeout
        operations = self._zone_operations
        if operations is None:
            return awaited(call, timeout)
        return waited(
            call,
            lambda name: operations.wait(project=self._project, zone=zone, operation=name),
            timeout,
        )

    def _get(self, name: str, pool: Pool) -> compute_v1.FutureReservation | None:
        return found(functools.partial(
            self._future_reservations.get,
            project=self._project, zone=pool.zone, future_reservation=name,
        ))  # fmt: skip

    def _blocks(self, zone: str) -> dict[str, tuple[compute_v1.FutureReservation, bool]]:
        """The owned calendar blocks in ``zone``, each with whether its reservation exists."""
        blocks = {
            block.name: block
            for block in self._future_reservations.list(project=self._project, zone=zone)
            if owned(block.name) and block.reservation_mode == "CALENDAR"
        }
        if self._reservations is None:
            return {
                name: (block, bool(block.status.auto_created_reservations))
                for name, block in blocks.items()
            }
        existing = (
            {r.name for r in self._reservations.list(project=self._project, zone=zone)}
            if blocks
            else set()
        )
        return {
            name: (block, (block.reservation_name or name) in existing)
            for name, block in blocks.items()
        }

    def _live(self, block: compute_v1.FutureReservation, zone: str) -> bool:
        """Whether the block's auto-created reservation exists now."""
        if self._reservations is None:
            return bool(block.status.auto_created_reservations)
        found_one = found(functools.partial(
            self._reservations.get,
            project=self._project, zone=zone, reservation=block.reservation_name or block.name,
        ))  # fmt: skip
        return found_one is not None

    def _advice_request(
        self, request: CapacityRequest, pool: Pool, zones: set[str], earliest: datetime,
        latest: datetime,
    ) -> compute_v1.CalendarModeAdviceRequest:  # fmt: skip
        duration = f"{int(request.run_duration.total_seconds())}s"
        if self.tpu:
            api_type = TPU_API_TYPES[pool.accelerator]
            target = compute_v1.FutureResourcesSpecTargetResources(
                aggregate_resources=compute_v1.FutureResourcesSpecAggregateResources(
                    accelerator_count=request.units, vm_family=TPU_VM_FAMILIES[api_type],
                    workload_type=_workload(pool),
                )
            )  # fmt: skip
        else:
            target = compute_v1.FutureResourcesSpecTargetResources(
                specific_sku_resources=compute_v1.FutureResourcesSpecSpecificSKUResources(
                    instance_count=request.gang.vm_count, machine_type=pool.shape
                )
            )
        spec = compute_v1.FutureResourcesSpec(
            deployment_type="DENSE",
            location_policy=compute_v1.FutureResourcesSpecLocationPolicy(
                locations={
                    f"zones/{zone}": compute_v1.FutureResourcesSpecLocationPolicyLocation(
                        preference="ALLOW"
                    )
                    for zone in sorted(zones)
                }
            ),
            target_resources=target,
            time_range_spec=compute_v1.FlexibleTimeRange(
                start_time_not_earlier_than=_stamp(earliest),
                start_time_not_later_than=_stamp(latest),
                min_duration=duration, max_duration=duration,
            ),
        )  # fmt: skip
        return compute_v1.CalendarModeAdviceRequest(future_resources_specs={SPEC: spec})

    def _observed(
        self, name: str, pool: Pool, block: compute_v1.FutureReservation, live: bool,
        wanted: int, running: Sequence[bool],
    ) -> Observed:  # fmt: skip
        """The block as a phase (see the module docstring); ``live``: its reservation
        exists; ``running`` has one entry per consumer found (VM, or queued resource), True
        once it runs."""
        status = block.status
        procurement = status.procurement_status
        locked = _time(status.lock_time)
        ends = _time(block.time_window.end_time)
        common: dict[str, Any] = {"name": name, "pool_id": pool.pool_id, "locked_at": locked,
                                  "ends_at": ends}  # fmt: skip
        if procurement in _FAILED:
            # A decline or a cancel is its own explanation; a failure says what it was.
            failed = procurement.startswith("FAILED")
            return Observed(
                phase=ProvisionPhase.FAILED, error_code=_FAILED[procurement],
                message=f"procurement status {procurement}" if failed else "", **common,
            )  # fmt: skip
        if procurement in _IN_REVIEW:
            return Observed(phase=ProvisionPhase.REVIEW, **common)
        if running:
            ready = sum(running) >= wanted
            phase = ProvisionPhase.READY if ready else ProvisionPhase.CREATING
        elif live and procurement == _FILLED:
            phase = ProvisionPhase.RESERVED
        elif procurement == _FILLED:
            phase = ProvisionPhase.ENDED  # its window closed: Google deleted its reservation
        else:
            # Approved, its reservation not there yet or still empty (APPROVED, PROCURING,
            # PROVISIONING with status.fulfilledCount short of the block): nothing to consume.
            phase = ProvisionPhase.APPROVED
            if live and procurement == "PROVISIONING":
                common["message"] = (
                    f"Google Cloud is filling the block's reservation "
                    f"({status.fulfilled_count} of {wanted_units(block)} delivered)"
                )
        return Observed(phase=phase, **common)


class CalendarReservationProvider(_Blocks):
    """BlockProvider of GPU calendar blocks, consumed by RESERVATION_BOUND VMs."""

    def __init__(
        self, settings: CloudSettings, *, future_reservations: compute_v1.FutureReservationsClient,
        instances: compute_v1.InstancesClient, advice: compute_v1.AdviceClient | None = None,
        reservations: compute_v1.ReservationsClient | None = None,
        zone_operations: compute_v1.ZoneOperationsClient | None = None,
    ) -> None:  # fmt: skip
        super().__init__(
            settings, future_reservations=future_reservations, advice=advice,
            reservations=reservations, zone_operations=zone_operations,
        )  # fmt: skip
        self._instances = instances
        poll_where_called(instances)

    def observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        by_zone: dict[str, dict[str, Pool]] = defaultdict(dict)
        for pool in pools:
            if pool.provider is Provider.MIG:
                by_zone[pool.zone][pool.shape] = pool
        return per_zone(
            by_zone, lambda zone: self._observe_zone(zone, by_zone[zone]),
            self._settings.observe_workers,
        )  # fmt: skip

    def provision(self, order: Order) -> None:
        """The block's VMs, consuming its reservation (the next pass sees them), each with
        what a job VM needs: the agent's metadata and the VMs' service account when
        configured (gce.vm_metadata, gce.vm_service_accounts)."""
        pool = order.pool
        metadata = vm_metadata(self._settings)
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
                disks=[boot_disk(self._settings, pool.shape, zone=pool.zone)],
                network_interfaces=[network(self._settings, pool.shape)],
                service_accounts=vm_service_accounts(self._settings),
                labels=MANAGED_BY,
            )
            if metadata is not None:
                instance.metadata = metadata
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
        self._release_block(name, pool)

    def _observe_zone(self, zone: str, pools: dict[str, Pool]) -> dict[str, Observed]:
        vms: dict[str, list[compute_v1.Instance]] = defaultdict(list)
        for vm in self._instances.list(project=self._project, zone=zone):
            if owned(vm.name) and _is_calendar_vm(vm):
                vms[order_of_vm(vm.name)].append(vm)
        observed: dict[str, Observed] = {}
        for name, (block, live) in self._blocks(zone).items():
            if block.aggregate_reservation.vm_family:
                continue  # a TPU block: TpuCalendarProvider's
            shape = block.specific_sku_properties.instance_properties.machine_type
            pool = pools.get(shape.rsplit("/", 1)[-1])
            if pool is None:
                continue
            gang = vms.get(name, [])
            seen = self._observed(
                name, pool, block, live, block.specific_sku_properties.total_count,
                [vm.status == "RUNNING" for vm in gang],
            )  # fmt: skip
            if seen.phase is ProvisionPhase.READY:
                seen = replace(seen, hosts=_running_hosts(gang, zone))
            observed[name] = seen
        for name, gang in vms.items():
            # VMs whose block is gone: still owned, still to be reported (and released).
            home = pools.get(gang[0].machine_type.rsplit("/", 1)[-1])
            if name not in observed and home is not None:
                running = sum(vm.status == "RUNNING" for vm in gang)
                phase = ProvisionPhase.READY if running == len(gang) else ProvisionPhase.CREATING
                hosts = _running_hosts(gang, zone) if phase is ProvisionPhase.READY else ()
                observed[name] = Observed(name=name, pool_id=home.pool_id, phase=phase, hosts=hosts)
        return observed


class TpuCalendarProvider(_Blocks):
    """BlockProvider of TPU calendar blocks: a future reservation of TPU chips, consumed at its
    start by one queued resource naming the reservation (tpu/docs/calendar-mode-reservation)."""

    tpu = True

    def __init__(
        self, settings: CloudSettings, *, future_reservations: compute_v1.FutureReservationsClient,
        session: Session, endpoint: str | None = None,
        advice: compute_v1.AdviceClient | None = None,
        reservations: compute_v1.ReservationsClient | None = None,
        zone_operations: compute_v1.ZoneOperationsClient | None = None,
    ) -> None:  # fmt: skip
        super().__init__(
            settings, future_reservations=future_reservations, advice=advice,
            reservations=reservations, zone_operations=zone_operations,
        )  # fmt: skip
        self._queued = TpuQueuedProvider(settings, session, endpoint=endpoint)

    def observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        by_zone: dict[str, dict[str, Pool]] = defaultdict(dict)
        for pool in pools:
            if pool.provider is Provider.TPU:
                by_zone[pool.zone][pool.accelerator] = pool
        return per_zone(
            by_zone, lambda zone: self._observe_zone(zone, by_zone[zone]),
            self._settings.observe_workers,
        )  # fmt: skip

    def _observe_zone(self, zone: str, pools_here: dict[str, Pool]) -> dict[str, Observed]:
        """The TPU blocks of ``zone`` and their consumers, and consumers whose block is gone."""
        observed: dict[str, Observed] = {}
        consumers = {
            str(resource.get("name", "")).rsplit("/", 1)[-1]: resource
            for resource in self._queued.listed(zone)
            if resource.get("reservationName")
        }
        for name, (block, live) in self._blocks(zone).items():
            api_type = TPU_TYPE_OF_VM_FAMILY.get(block.aggregate_reservation.vm_family, "")
            block_pool = pools_here.get(TPU_ACCELERATOR_OF_API_TYPE.get(api_type, ""))
            if block_pool is None:
                continue
            consumer = consumers.pop(name, None)
            running = [] if consumer is None else [_state(consumer) == "ACTIVE"]
            observed[name] = self._observed(name, block_pool, block, live, 1, running)
        ready = [name for name, seen in observed.items() if seen.phase is ProvisionPhase.READY]
        if ready:
            hosts = self._queued.hosts(zone)  # the slices' workers, as for a flex slice
            for name in ready:
                observed[name] = replace(observed[name], hosts=hosts.get(name, ()))
        for name, resource in consumers.items():
            # A queued resource whose block is gone: reported, so that it is released.
            home = next(iter(pools_here.values()), None)
            if owned(name) and home is not None:
                phase = (
                    ProvisionPhase.READY
                    if _state(resource) == "ACTIVE"
                    else ProvisionPhase.CREATING
                )
                observed[name] = Observed(name=name, pool_id=home.pool_id, phase=phase)
        return observed

    def provision(self, order: Order) -> None:
        """One queued resource on the block's reservation, reservation-bound: "for future
        reservations created in calendar mode, you must also set the --provisioning-model
        flag to reservation-bound" (tpu/docs/consume-reservation); gcloud sends that as
        ``provisioningModel: RESERVATION_BOUND`` beside ``reservationName``
        (command_lib/compute/tpus/queued_resources/util.py, SetProvisioningModel and
        CreateReservationName)."""
        zone = order.pool.zone
        body: dict[str, Any] = {
            "tpu": {"nodeSpec": [queued_resource_spec(self._settings, order)]},
            "provisioningModel": "RESERVATION_BOUND",
            "reservationName": (
                f"projects/{self._project}/locations/{zone}/reservations/{order.name}"
            ),
        }
        self._queued.create(order, body)

    def release(self, name: str, pool: Pool) -> None:
        self._queued.release(name, pool)
        self._release_block(name, pool)


def _running_hosts(gang: Sequence[compute_v1.Instance], zone: str) -> tuple[Host, ...]:
    """A block's running VMs as hosts, in rank order (:func:`hosts_of`)."""
    return hosts_of((vm for vm in gang if vm.status == "RUNNING"), zone)


def _recommended(response: compute_v1.CalendarModeAdviceResponse, zones: set[str]) -> list[Advised]:
    """The recommended (start, zone) pairs of an Advice response, in ``zones``: each
    recommendation's location, and its other locations whose status is RECOMMENDED."""
    advised: list[Advised] = []
    for recommendation in response.recommendations:
        for spec in recommendation.recommendations_per_spec.values():
            start, end = _time(spec.start_time), _time(spec.end_time)
            if start is None or end is None:
                continue
            places = [spec.location]
            places += [
                where
                for where, other in spec.other_locations.items()
                if other.status == "RECOMMENDED"
            ]
            for place in places:
                zone = place.rsplit("/", 1)[-1]
                if zone in zones:
                    advised.append(Advised(start_at=start, end_at=end, zone=zone))
    return advised


def wanted_units(block: compute_v1.FutureReservation) -> int:
    """What a block reserves: its VMs, or its TPU chips."""
    if block.aggregate_reservation.vm_family:
        return sum(
            resource.accelerator.accelerator_count
            for resource in block.aggregate_reservation.reserved_resources
        )
    return block.specific_sku_properties.total_count


def _workload(pool: Pool) -> str:
    """The workload type a TPU block in ``pool`` is reserved as (catalog.TPU_CALENDAR_ZONES);
    BATCH where the table has no entry (Google then refuses the zone, saying so)."""
    return tpu_calendar_workload(pool.accelerator, pool.zone) or "BATCH"


def _is_calendar_vm(vm: compute_v1.Instance) -> bool:
    affinity = vm.reservation_affinity
    return bool(affinity) and affinity.consume_reservation_type == "SPECIFIC_RESERVATION"


def _state(resource: dict[str, Any]) -> str:
    return str((resource.get("state") or {}).get("state", ""))


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _time(value: str) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)


__all__ = [
    "CalendarReservationProvider",
    "Response",
    "TpuCalendarProvider",
]
