"""Instances: standard VMs (decided at once), VMs consuming a calendar block's reservation, and
flex-start VMs that wait in Google's queue.

Google's behaviour, as modelled (CP ``Instance.Status``, ``Scheduling``, ``InstanceParams``,
``ReservationAffinity``; compute/docs/instances/about-flex-start-vms;
compute/docs/instances/future-reservations-calendar-mode-overview):
- A standard VM takes a unit of stock at insert or its operation fails with
  ``ZONE_RESOURCE_POOL_EXHAUSTED`` and no VM exists; it is ``PROVISIONING`` until insert + the
  provisioning latency, then ``RUNNING``.
- A flex-start VM (``scheduling.provisioningModel=FLEX_START``) needs ``scheduling.maxRunDuration``
  (10 min .. 7 d) and ``params.requestValidForDuration`` (90 s .. 2 h, or 0 s: only if capacity is
  there at the first attempt). It exists as ``PENDING`` in Google's queue of its zone and machine
  type while its insert operation is ``RUNNING``; served, it is ``RUNNING`` (the operation
  ``DONE``) and its termination action (``DELETE``, or ``STOP`` → ``TERMINATED``) runs at the end
  of ``maxRunDuration``. When its deadline passes unserved, the creation fails: the VM is gone and
  the insert operation is ``DONE`` with the stockout error.
- ``requestValidForDuration`` is a field of ``InstanceParams``, not of ``Scheduling``: under
  ``scheduling`` it is an unknown field, which Google's REST front end refuses (400).
- A VM consumes a calendar block's auto-created reservation with
  ``scheduling.provisioningModel=RESERVATION_BOUND`` and a ``SPECIFIC_RESERVATION`` affinity
  (key ``compute.googleapis.com/reservation-name``, one value: the reservation's name): one
  unit of the reservation, none of stock. Either without the other is refused (400), as is a
  reservation that is not live or of another machine type; a full one fails the operation
  with ``ZONE_RESOURCE_POOL_EXHAUSTED``. The VM is deleted when the reservation ends.
- A disk's ``initializeParams.diskType`` is a full or partial URL of a disk type in the VM's
  zone (``zones/ZONE/diskTypes/TYPE``); a bare name is refused as malformed (400;
  ``parsing.instance_disk_types``).
- A VM is there from its insert; until that operation is DONE it is not ready to be deleted
  (400 ``resourceNotReady``), except a flex-start VM waiting in the queue, which may be deleted
  at any time. A deleted VM is ``STOPPING`` until the delete operation is DONE; then it is gone
  and its unit is back.
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta

from opendws.sim.cloud.errors import CloudError
from opendws.sim.cloud.parsing import (
    COMPUTE_BASE,
    JSON,
    bounded_duration,
    duration,
    get,
    instance_disk_types,
    last,
    metadata_items,
    name,
    refuse_unknown,
    scope_url,
    service_accounts,
    stamp,
    zonal_path,
)
from opendws.sim.cloud.world import (
    RESERVATION_KEY,
    STOCKOUT,
    FutureReservation,
    Instance,
    Record,
    World,
    by_name,
    compute_failure,
    settled,
)

MIN_RUN = timedelta(minutes=10)
MAX_RUN = timedelta(days=7)
MIN_VALID_FOR = timedelta(seconds=90)
MAX_VALID_FOR = timedelta(hours=2)


class InstanceApi(World):
    """The instances calls."""

    @settled
    def insert_instance(self, project: str, zone: str, body: JSON) -> JSON:
        """Insert a VM: flex-start (queued), from a specific reservation (its free count) or
        from stock (see the module docstring)."""
        vm_name = name(body.get("name"), "instance name")
        state = self._project(project)
        if (zone, vm_name) in state.instances:
            raise CloudError.already_exists(zonal_path(project, zone, "instances", vm_name))
        machine_type = get(body, "machineType")
        if not isinstance(machine_type, str) or not machine_type:
            raise CloudError.invalid("Invalid value for field 'resource.machineType'")
        scheduling = get(body, "scheduling") or {}
        refuse_unknown(scheduling, "requestValidForDuration", "resource.scheduling")
        instance_disk_types(get(body, "disks"), project, zone)
        metadata_items(get(body, "metadata"), "resource.metadata")
        service_accounts(get(body, "serviceAccounts"), "resource.serviceAccounts")
        shape = last(machine_type)
        if get(scheduling, "provisioningModel") == "FLEX_START":
            return self._insert_flex(project, zone, vm_name, shape, body)
        now = self.clock.now()
        reservation = self._consumed_reservation(project, zone, body, shape)
        probe = Record(project, zone, vm_name, 0, now, body)
        target = f"{COMPUTE_BASE}/{zonal_path(project, zone, 'instances', vm_name)}"
        if reservation is not None:
            if self._in_use(reservation) >= reservation.usable:
                message = (
                    f"The reservation '{reservation.reservation_name}' has no free capacity for "
                    f"{shape} ({self._in_use(reservation)} in use of the {reservation.usable} "
                    f"of {reservation.count} delivered so far)"
                )
                return self._operation(probe, "insert", target, error=(503, STOCKOUT, message))
            outcome = "ok"
        else:
            outcome = self._provision(zone, shape, 1)
            if outcome in ("stockout", "error"):
                code, message = compute_failure(outcome, project, zone)
                return self._operation(probe, "insert", target, error=(503, code, message))
        instance = self._add_instance(project, zone, vm_name, shape, now, body)
        instance.block = reservation
        instance.holds_stock = reservation is None and outcome == "ok"
        if outcome == "ok":
            self._at(now + self._latency, functools.partial(_start, instance))
            run = get(scheduling, "maxRunDuration")
            if run is not None:
                ends = now + self._latency + duration(run, "scheduling.maxRunDuration")
                instance.ends_at = ends if instance.holds_stock else None
                self._at(ends, functools.partial(self._expire, instance))
        return self._operation(instance, "insert", _instance_url(instance))

    @settled
    def get_instance(self, project: str, zone: str, name: str) -> JSON:
        return _instance_view(self._instance(project, zone, name))

    @settled
    def list_instances(self, project: str, zone: str) -> list[JSON]:
        instances = [i for i in self._project(project).instances.values() if i.zone == zone]
        return [_instance_view(i) for i in sorted(instances, key=by_name)]

    @settled
    def delete_instance(self, project: str, zone: str, name: str) -> JSON:
        """Delete a VM, returning its unit to stock (or to the reservation it consumed). A
        flex-start VM still waiting leaves the queue and its insert operation fails."""
        instance = self._instance(project, zone, name)
        self._ready(instance, zonal_path(project, zone, "instances", name))
        if instance.operation is not None and instance.operation["status"] != "DONE":
            self._fail_operation(
                instance.operation, self.clock.now(), 400, "RESOURCE_NOT_FOUND",
                f"The instance '{name}' was deleted before it could be created",
            )  # fmt: skip
        self._dequeue(instance)
        instance.status = "STOPPING"
        return self._operation(
            instance, "delete", _instance_url(instance),
            on_done=lambda when: self._remove_instance(instance),
        )  # fmt: skip

    # ------------------------------------------------------------------ flex-start VMs

    def _insert_flex(self, project: str, zone: str, vm_name: str, shape: str, body: JSON) -> JSON:
        scheduling = get(body, "scheduling") or {}
        if get(scheduling, "maxRunDuration") is None:
            raise CloudError.invalid(
                "A FLEX_START instance needs scheduling.maxRunDuration (10 minutes to 7 days)"
            )
        run = bounded_duration(
            get(scheduling, "maxRunDuration"), "resource.scheduling.maxRunDuration",
            MIN_RUN, MAX_RUN,
        )  # fmt: skip
        valid_for = _valid_for(get(get(body, "params") or {}, "requestValidForDuration"))
        now = self.clock.now()
        instance = self._add_instance(project, zone, vm_name, shape, now, body)
        instance.status = "PENDING"
        instance.flex = True
        operation = self._operation(instance, "insert", _instance_url(instance), running=True)
        instance.operation = self._stored(project, operation)
        eligible = now + self._latency
        self._enqueue(
            instance, "instance", shape, 1, eligible, run,
            on_served=functools.partial(self._serve_flex, instance, run),
            on_attempt=_no_record,
            on_fatal=functools.partial(self._fail_flex, instance),
        )  # fmt: skip
        # At least one attempt: the deadline never comes before the first one (scheduled
        # after it, so at an equal moment the attempt runs first).
        self._at(max(now + valid_for, eligible), functools.partial(self._flex_deadline, instance))
        return operation

    def _serve_flex(self, instance: Instance, run: timedelta, when: datetime) -> None:
        instance.status = "RUNNING"
        instance.holds_stock = True
        if instance.operation is not None:
            self._finish_operation(instance.operation, when)
        action = get(get(instance.body, "scheduling") or {}, "instanceTerminationAction")
        end = functools.partial(self._stop_vm if action == "STOP" else self._expire, instance)
        instance.ends_at = when + run
        self._at(instance.ends_at, end)

    def _stop_vm(self, instance: Instance, when: datetime) -> None:
        """``instanceTerminationAction=STOP``: the VM stays, stopped, and frees its unit."""
        if instance.alive and instance.status == "RUNNING":
            instance.status = "TERMINATED"
            if instance.holds_stock:
                instance.holds_stock = False
                self._give_back(instance.zone, instance.shape, 1)

    def _flex_deadline(self, instance: Instance, when: datetime) -> None:
        if instance.alive and instance.status == "PENDING":
            self._counters["expired"] += 1
            code, message = compute_failure("stockout", instance.project, instance.zone)
            self._fail_flex(instance, when, code=code, message=message)

    def _fail_flex(
        self,
        instance: Instance,
        when: datetime,
        *,
        code: str = "RESOURCE_OPERATION_RATE_EXCEEDED",
        message: str = "Operation rate exceeded for resource; try again later.",
    ) -> None:
        """The creation of a flex-start VM failed: it is gone, its operation carries why."""
        if instance.operation is not None:
            self._fail_operation(instance.operation, when, 503, code, message)
        self._remove_instance(instance)

    # ------------------------------------------------------------------ reservations consumed

    def _consumed_reservation(
        self, project: str, zone: str, body: JSON, shape: str
    ) -> FutureReservation | None:
        """The live calendar block whose reservation a VM names, or None for a VM from stock
        (see the module docstring for what is refused)."""
        affinity = get(body, "reservationAffinity") or {}
        bound = get(get(body, "scheduling") or {}, "provisioningModel") == "RESERVATION_BOUND"
        if get(affinity, "consumeReservationType") != "SPECIFIC_RESERVATION":
            if bound:
                raise CloudError.invalid(
                    "Invalid value for field 'resource.reservationAffinity': a RESERVATION_BOUND "
                    "VM needs consumeReservationType SPECIFIC_RESERVATION naming its reservation"
                )
            return None
        values = get(affinity, "values") or []
        if not isinstance(values, list) or len(values) != 1 or not isinstance(values[0], str):
            raise CloudError.invalid("A specific reservation affinity needs exactly one value")
        key = get(affinity, "key")
        if key is not None and key != RESERVATION_KEY:
            raise CloudError.invalid(
                f"Invalid value for field 'resource.reservationAffinity.key': {key!r} (a "
                f"specific reservation is named by {RESERVATION_KEY})"
            )
        reservation_name = last(values[0])
        reservation = self._live_block(project, zone, reservation_name)
        if reservation is None:
            raise CloudError.invalid(
                "Specified reservation "
                f"'{zonal_path(project, zone, 'reservations', reservation_name)}' does not exist"
            )
        if not bound:
            raise CloudError.invalid(
                "Invalid value for field 'resource.scheduling.provisioningModel': a VM consuming "
                f"the calendar-mode reservation '{reservation_name}' must be RESERVATION_BOUND"
            )
        if reservation.tpu or reservation.shape != shape:
            raise CloudError.invalid(
                f"Machine type {shape} does not match reservation '{reservation_name}' "
                f"({reservation.shape})"
            )
        return reservation

    def _instance(self, project: str, zone: str, vm_name: str) -> Instance:
        instance = self._project(project).instances.get((zone, vm_name))
        if instance is None:
            raise CloudError.not_found(zonal_path(project, zone, "instances", vm_name))
        return instance


def _valid_for(value: object) -> timedelta:
    """``params.requestValidForDuration``: 0 s, or 90 s .. 2 h."""
    if value is None:
        raise CloudError.invalid(
            "A FLEX_START instance needs params.requestValidForDuration (0 s, or 90 s to 2 h)"
        )
    span = duration(value, "resource.params.requestValidForDuration")
    if span == timedelta(0):
        return span
    return bounded_duration(
        value, "resource.params.requestValidForDuration", MIN_VALID_FOR, MAX_VALID_FOR
    )


def _no_record(code: str, message: str) -> None:
    """A waiting flex-start VM shows no per-attempt error: it stays ``PENDING``."""


def _start(instance: Instance, when: datetime) -> None:
    if instance.alive and instance.status == "PROVISIONING":
        instance.status = "RUNNING"


def _instance_url(instance: Instance) -> str:
    return f"{scope_url(instance.project, instance.zone)}/instances/{instance.name}"


def _instance_view(instance: Instance) -> JSON:
    zone_url = scope_url(instance.project, instance.zone)
    view: JSON = {
        **instance.body,
        "kind": "compute#instance",
        "id": str(instance.id),
        "name": instance.name,
        "zone": zone_url,
        "machineType": f"{zone_url}/machineTypes/{instance.shape}",
        "status": instance.status,
        "creationTimestamp": stamp(instance.created_at),
        "selfLink": _instance_url(instance),
    }
    if instance.mig is not None:
        # A group's VM carries its template's metadata and the group that made it.
        creator = f"{zone_url}/instanceGroupManagers/{instance.mig}"
        items = get(instance.body.get("metadata") or {}, "items") or []
        view["metadata"] = {"items": [*items, {"key": "created-by", "value": creator}]}
    nics = _interfaces_view(instance)
    if nics:
        view["networkInterfaces"] = nics
    return view


def _interfaces_view(instance: Instance) -> list[JSON]:
    """The VM's interfaces as Compute Engine reports them (compute/docs/reference/rest/v1/
    instances: ``networkInterfaces[].name`` ``nic0``, ``nic1``…; ``networkIP``, the internal
    address; an access config's ``natIP``, the external one): the first carries the addresses
    the VM was given at its creation."""
    nics = instance.body.get("networkInterfaces")
    if not isinstance(nics, list):
        return []
    views: list[JSON] = []
    for index, nic in enumerate(nics):
        view: JSON = {**nic, "kind": "compute#networkInterface", "name": f"nic{index}"}
        if index == 0:
            view["networkIP"] = instance.internal_ip
            configs = nic.get("accessConfigs")
            if isinstance(configs, list) and configs:
                view["accessConfigs"] = [
                    {**configs[0], "kind": "compute#accessConfig", "natIP": instance.external_ip},
                    *configs[1:],
                ]
        views.append(view)
    return views
