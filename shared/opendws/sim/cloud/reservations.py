"""Calendar-mode future reservations and the reservations they auto-create. Their behaviour is
kept as it was (approval when the units are free over the window, units taken at the start and
held until the end or a deletion); only their place in the package is new."""

from __future__ import annotations

import functools
from datetime import datetime

from opendws.sim.cloud.errors import CloudError
from opendws.sim.cloud.parsing import (
    COMPUTE_BASE,
    JSON,
    duration,
    get,
    integer,
    last,
    name,
    scope_url,
    stamp,
    timestamp,
    zonal_path,
)
from opendws.sim.cloud.world import FutureReservation, World, by_name, compute_failure, settled


class ReservationApi(World):
    """The futureReservations and reservations calls."""

    @settled
    def insert_future_reservation(self, project: str, zone: str, body: JSON) -> JSON:
        """Book a calendar block. It is approved when its units are free now, counting those
        promised to other approved blocks whose windows overlap its own; otherwise the
        operation fails with ``ZONE_RESOURCE_POOL_EXHAUSTED`` and nothing is created. Its units
        are taken from stock at ``startTime`` (at once if that has come) and held until its end
        or its deletion; from then a reservation of the same name exists for instances to
        consume. A block whose units are gone by its start fails (procurement ``FAILED``)."""
        block_name = name(body.get("name"), "future reservation name")
        state = self._project(project)
        if (zone, block_name) in state.future_reservations:
            raise CloudError.already_exists(
                zonal_path(project, zone, "futureReservations", block_name)
            )
        sku = get(body, "specificSkuProperties") or {}
        count = integer(get(sku, "totalCount") or 0, "specificSkuProperties.totalCount")
        machine_type = get(get(sku, "instanceProperties") or {}, "machineType")
        if count <= 0 or not isinstance(machine_type, str) or not machine_type:
            raise CloudError.invalid(
                "specificSkuProperties needs totalCount > 0 and instanceProperties.machineType"
            )
        start, end = _window(get(body, "timeWindow"))
        now = self.clock.now()
        record = FutureReservation(
            project, zone, block_name, self._new_id(), now, body, shape=last(machine_type),
            count=count, start=start, end=end,
            auto_delete=get(body, "autoDeleteAutoCreatedReservations") is not False,
        )  # fmt: skip
        target = f"{COMPUTE_BASE}/{zonal_path(project, zone, 'futureReservations', block_name)}"
        outcome = (
            self._approve(record) if start > now else self._provision(zone, record.shape, count)
        )
        if outcome in ("stockout", "error"):
            code, message = compute_failure(outcome, project, zone)
            return self._operation(record, "insert", target, error=(503, code, message))
        state.future_reservations[(zone, block_name)] = record
        self._created["futureReservations"][block_name] += 1
        if outcome == "hang":
            record.procurement = "PENDING_APPROVAL"
        else:
            record.holds_stock = start <= now  # a future block takes its units at its start
            self._at(start, functools.partial(self._begin_block, record))
            self._at(end, functools.partial(self._end_block, record))
        return self._operation(record, "insert", target)

    @settled
    def get_future_reservation(self, project: str, zone: str, name: str) -> JSON:
        return _future_view(self._future(project, zone, name))

    @settled
    def list_future_reservations(self, project: str, zone: str) -> list[JSON]:
        records = [f for f in self._project(project).future_reservations.values() if f.zone == zone]
        return [_future_view(f) for f in sorted(records, key=by_name)]

    @settled
    def cancel_future_reservation(self, project: str, zone: str, name: str) -> JSON:
        """Cancel a block: ``CANCELLED``, its reservation and VMs deleted, its units returned."""
        record = self._future(project, zone, name)
        self._release_block(record)
        record.procurement = "CANCELLED"
        return self._operation(record, "cancel", _future_url(record))

    @settled
    def delete_future_reservation(self, project: str, zone: str, name: str) -> JSON:
        """Delete a block; early, its reservation and the VMs consuming it go with it."""
        record = self._future(project, zone, name)
        self._release_block(record)
        record.alive = False
        del self._project(project).future_reservations[(zone, name)]
        return self._operation(record, "delete", _future_url(record))

    @settled
    def get_reservation(self, project: str, zone: str, name: str) -> JSON:
        record = self._project(project).future_reservations.get((zone, name))
        if record is None or not record.reservation_live:
            raise CloudError.not_found(zonal_path(project, zone, "reservations", name))
        return self._reservation_view(record)

    @settled
    def list_reservations(self, project: str, zone: str) -> list[JSON]:
        records = [
            f
            for f in self._project(project).future_reservations.values()
            if f.zone == zone and f.reservation_live
        ]
        return [self._reservation_view(f) for f in sorted(records, key=by_name)]

    def _approve(self, record: FutureReservation) -> str:
        """Decide a future block: ``ok`` if its units are free now beyond what overlapping
        approved blocks were promised (nothing is taken yet), else a failure kind."""
        pending = self._injections.get((record.zone, record.shape))
        if pending:
            outcome = pending.popleft()
        else:
            promised = sum(
                other.count
                for state in self._projects.values()
                for other in state.future_reservations.values()
                if other.alive and not other.holds_stock and other.procurement == "APPROVED"
                and (other.zone, other.shape) == (record.zone, record.shape)
                and other.start < record.end and record.start < other.end
            )  # fmt: skip
            free = self._stock.get((record.zone, record.shape), 0) - promised
            outcome = "ok" if free >= record.count else "stockout"
        self._counters[{"ok": "provisioned"}.get(outcome, outcome)] += 1
        return outcome

    def _begin_block(self, record: FutureReservation, when: datetime) -> None:
        if record.alive and record.procurement == "APPROVED":
            if not record.holds_stock:
                key = (record.zone, record.shape)
                if self._stock.get(key, 0) < record.count:
                    record.procurement = "FAILED"  # its units were taken meanwhile
                    return
                self._stock[key] = self._stock.get(key, 0) - record.count
                record.holds_stock = True
            record.procurement = "FULFILLED"
            record.reservation_id = self._new_id()

    def _end_block(self, record: FutureReservation, when: datetime) -> None:
        # Without auto-delete the reservation outlives the window, as in GCE, until deleted.
        if record.alive and record.auto_delete and record.holds_stock:
            self._release_block(record)

    def _release_block(self, record: FutureReservation) -> None:
        for instance in self._consumers(record):
            self._remove_instance(instance)
        record.reservation_id = None
        if record.holds_stock:
            record.holds_stock = False
            self._give_back(record.zone, record.shape, record.count)

    def _future(self, project: str, zone: str, block_name: str) -> FutureReservation:
        record = self._project(project).future_reservations.get((zone, block_name))
        if record is None:
            raise CloudError.not_found(zonal_path(project, zone, "futureReservations", block_name))
        return record

    def _reservation_view(self, record: FutureReservation) -> JSON:
        return {
            "kind": "compute#reservation",
            "id": str(record.reservation_id),
            "name": record.name,
            "zone": scope_url(record.project, record.zone),
            "creationTimestamp": stamp(record.start),
            "selfLink": _reservation_url(record),
            "specificReservationRequired": True,
            "status": "READY",
            "specificReservation": {
                "count": str(record.count),
                "inUseCount": str(self._in_use(record)),
                "assuredCount": str(record.count),
                "instanceProperties": {"machineType": record.shape},
            },
        }


def _window(window: object) -> tuple[datetime, datetime]:
    """(start, end) of a future reservation's timeWindow (an end time or a duration)."""
    if not isinstance(window, dict) or get(window, "startTime") is None:
        raise CloudError.invalid("timeWindow.startTime is required")
    start = timestamp(get(window, "startTime"), "timeWindow.startTime")
    if get(window, "endTime") is not None:
        end = timestamp(get(window, "endTime"), "timeWindow.endTime")
    elif get(window, "duration") is not None:
        end = start + duration(get(window, "duration"), "timeWindow.duration")
    else:
        raise CloudError.invalid("timeWindow needs endTime or duration")
    if end <= start:
        raise CloudError.invalid("timeWindow must end after it starts")
    return start, end


def _future_url(record: FutureReservation) -> str:
    return f"{scope_url(record.project, record.zone)}/futureReservations/{record.name}"


def _reservation_url(record: FutureReservation) -> str:
    return f"{scope_url(record.project, record.zone)}/reservations/{record.name}"


def _future_view(record: FutureReservation) -> JSON:
    status: JSON = {"procurementStatus": record.procurement}
    if record.reservation_live:
        status["autoCreatedReservations"] = [_reservation_url(record)]
        status["fulfilledCount"] = str(record.count)
    return {
        **record.body,
        "kind": "compute#futureReservation",
        "id": str(record.id),
        "name": record.name,
        "zone": scope_url(record.project, record.zone),
        "creationTimestamp": stamp(record.created_at),
        "selfLink": _future_url(record),
        "status": status,
    }
