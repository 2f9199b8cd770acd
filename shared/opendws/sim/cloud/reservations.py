"""Calendar-mode future reservations, the reservations they auto-create, and the Advice API's
calendar-mode recommendations, all from one capacity model.

Google's behaviour, as modelled (CP ``FutureReservation``, ``FutureReservationStatus``,
``service Advice``, ``CalendarModeAdviceRequest/Response``;
compute/docs/instances/future-reservations-calendar-mode-overview,
create-future-reservations-calendar-mode, delete-future-reservations-calendar-mode;
tpu/docs/calendar-mode-reservation). The numbers and the cancellation rule are
``opendws.domain.calendar``'s (and the 1-90-day window ``opendws.domain.model``'s):
- insert: ``reservationMode`` must be ``CALENDAR``; ``deploymentType``, if given, ``DENSE``;
  ``schedulingType``, if given, ``GROUPED`` or ``INDEPENDENT``; the window lasts 1 to 90 days
  and starts within ``lead_of(tpu)`` of now; the count is allowed by ``count_problem``.
  Anything else is a 400 naming the field. A GPU block reserves
  ``specificSkuProperties.totalCount`` VMs of one machine type; a TPU block an
  ``aggregateReservation`` of one ``vmFamily``, its chips the ``reservedResources[]``
  accelerator counts, counted in the stock of (zone, the family's TPU API type). The insert
  operation is DONE and the block ``PENDING_APPROVAL``; only an ``error`` injection that is next
  for its key at insert fails the operation instead (nothing is created).
- review, ``review_delay`` after the insert (approval latency is not documented): the next
  injection of the key decides it if there is one (``stockout`` or ``error``: ``DECLINED``;
  ``hang``: never reviewed, it stays ``PENDING_APPROVAL``); otherwise the capacity model (the
  memory fake's too, so the contract suite holds on both): ``APPROVED`` iff the free stock of
  the key, plus the units held now by what gives them back by the block's start (blocks ending,
  VMs and TPUs whose run ends), minus the units promised to other approved blocks not yet
  holding theirs whose windows overlap its own, is at least its count. Approved, it shows
  ``status.lockTime`` = ``cancel_deadline`` under the world's ``cancellation_rule`` (none when
  it never could be cancelled) and is ``PROCURING`` (locked) just after it. Its reservation
  (``reservationName``, or the block's own name) is created at approval, empty
  ("Compute Engine automatically creates an empty reservation",
  compute/docs/hpc/reserve-capacity-account-team): listed, ``assuredCount`` 0, nothing can
  consume it.
- at its start it is ``PROVISIONING`` ("entered after start_time, while reservations are
  being created"; ``fulfilledCount`` 0): its units are taken from stock, and ``fill_delay``
  later (0 by default; "up to 24 h" on Google) they are in its reservation and it is
  ``FULFILLED``; if the units are gone at the start (the promise does not fence them off from
  others) it is ``FAILED`` and its reservation deleted. At its end every VM and
  queued resource consuming the reservation is deleted, the reservation is deleted and the
  units return; the block stays listed, ``FULFILLED`` (no longer naming the reservation), until
  deleted.
- cancel: while ``PENDING_APPROVAL``, ``APPROVED`` or ``PROCURING`` and ``may_cancel``
  allows it at now: ``CANCELLED``. Otherwise 400 "Future reservation NAME cannot be cancelled:
  ..." and nothing changes.
- delete: when ``CANCELLED``, ``DECLINED`` or ``FAILED``, or from its end on; otherwise 400 and
  nothing changes.
- advice (``POST .../regions/R/advice/calendarMode``): for its one spec, up to three starts,
  earliest first, within the spec's start range and the kind's lead, at which some allowed zone
  of the region has the units free for ``maxDuration`` by the review's own test; the candidate
  starts are the earliest allowed one and the ends of promised blocks after it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from opendws.catalog import (
    TPU_ACCELERATOR_OF_API_TYPE,
    TPU_API_TYPES,
    TPU_CALENDAR,
    TPU_CALENDAR_ZONES,
    TPU_COMPUTE_ACCELERATORS,
    TPU_SERVING_CHIPS,
    TPU_TYPE_OF_VM_FAMILY,
    TPU_VM_FAMILIES,
)
from opendws.domain.calendar import (
    CancellationRule,
    Lead,
    cancel_deadline,
    count_problem,
    lead_of,
    may_cancel,
    why_not_cancellable,
)
from opendws.domain.model import CALENDAR_MAX_RUN, CALENDAR_MIN_RUN
from opendws.sim.cloud.errors import CloudError
from opendws.sim.cloud.parsing import (
    COMPUTE_BASE,
    JSON,
    duration,
    get,
    integer,
    last,
    name,
    rfc3339,
    scope_url,
    stamp,
    timestamp,
    zonal_path,
)
from opendws.sim.cloud.world import (
    FutureReservation,
    Key,
    World,
    by_name,
    compute_failure,
    settled,
)

PENDING = "PENDING_APPROVAL"
# Not yet started and promised: their units are counted against later reviews.
PROMISED = ("APPROVED", "PROCURING", "PROVISIONING")
CANCELLABLE = ("PENDING_APPROVAL", "APPROVED", "PROCURING")
DELETABLE = ("CANCELLED", "DECLINED", "FAILED")
SCHEDULING_TYPES = ("GROUPED", "INDEPENDENT")
WORKLOAD_TYPES = ("BATCH", "SERVING")
PREFERENCES = ("ALLOW", "DENY")
MAX_RECOMMENDATIONS = 3
# lockTime is the last moment a block may be cancelled: it is locked just after.
LOCK_AFTER = timedelta(microseconds=1)

# The TPU API types calendar mode reserves (catalog.TPU_CALENDAR).
CALENDAR_TPU_TYPES = tuple(sorted(TPU_API_TYPES[accelerator] for accelerator in TPU_CALENDAR))


@dataclass(frozen=True, slots=True)
class BlockRequest:
    """What an insert asks for, validated: ``count`` units of ``shape`` over [start, end)."""

    shape: str
    count: int
    tpu: bool
    start: datetime
    end: datetime
    reservation_name: str


@dataclass(frozen=True, slots=True)
class AdviceSpec:
    """One FutureResourcesSpec, validated: ``units`` of ``shape`` for ``span``, starting in
    [``earliest``, ``latest``], in ``zones`` (in the order asked)."""

    shape: str
    units: int
    earliest: datetime
    latest: datetime
    span: timedelta
    zones: tuple[str, ...]


class ReservationApi(World):
    """The futureReservations, reservations and advice calls, and the calendar settings."""

    # ------------------------------------------------------------------ settings

    @settled
    def set_review_delay(self, delay: timedelta) -> None:
        """Set how long after its insert a calendar block is reviewed (for blocks from now on)."""
        if delay < timedelta(0):
            raise ValueError(f"the review delay cannot be negative, not {delay}")
        self._review_delay = delay

    @settled
    def set_fill_delay(self, delay: timedelta) -> None:
        """Set how long after its start Google takes to fill a calendar block's reservation
        (for blocks that start from now on): "up to 24 h" on Google, 0 by default here."""
        if delay < timedelta(0):
            raise ValueError(f"the fill delay cannot be negative, not {delay}")
        self._fill_delay = delay

    @settled
    def set_cancellation_rule(self, rule: CancellationRule | str) -> None:
        """Choose the page approved blocks are cancelled by (``windows`` or ``never``); lock
        times are computed with the rule in force at approval."""
        try:
            self._cancellation_rule = CancellationRule(rule)
        except ValueError:
            allowed = ", ".join(r.value for r in CancellationRule)
            raise ValueError(
                f"the cancellation rule must be one of {allowed}, not {rule!r}"
            ) from None

    @property
    def review_delay(self) -> timedelta:
        return self._review_delay

    @property
    def fill_delay(self) -> timedelta:
        return self._fill_delay

    @property
    def cancellation_rule(self) -> CancellationRule:
        return self._cancellation_rule

    # ------------------------------------------------------------------ future reservations

    @settled
    def insert_future_reservation(self, project: str, zone: str, body: JSON) -> JSON:
        """Submit a calendar block for review (see the module docstring)."""
        block_name = name(body.get("name"), "future reservation name")
        state = self._project(project)
        if (zone, block_name) in state.future_reservations:
            raise CloudError.already_exists(
                zonal_path(project, zone, "futureReservations", block_name)
            )
        now = self.clock.now()
        request = _block_request(body, block_name, zone, now)
        self._refuse_taken_name(project, zone, request.reservation_name)
        record = FutureReservation(
            project, zone, block_name, self._new_id(), now, body, shape=request.shape,
            count=request.count, tpu=request.tpu, start=request.start, end=request.end,
            reservation_name=request.reservation_name,
        )  # fmt: skip
        target = f"{COMPUTE_BASE}/{zonal_path(project, zone, 'futureReservations', block_name)}"
        pending = self._injections.get((zone, request.shape))
        if pending and pending[0] == "error":
            pending.popleft()
            self._counters["error"] += 1
            code, message = compute_failure("error", project, zone)
            return self._operation(record, "insert", target, error=(503, code, message))
        state.future_reservations[(zone, block_name)] = record
        self._created["futureReservations"][block_name] += 1
        self._at(now + self._review_delay, functools.partial(self._review, record))
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
        """Cancel a block not yet started, if the cancellation rule allows it now; refused
        (400, nothing changed) otherwise."""
        record = self._future(project, zone, name)
        self._ready(record, zonal_path(project, zone, "futureReservations", name))
        now = self.clock.now()
        if record.procurement not in CANCELLABLE:
            raise _cannot_cancel(record, f"it is {record.procurement}")
        if not may_cancel(
            self._cancellation_rule, start=record.start, approved_at=record.approved_at, now=now
        ):
            assert record.approved_at is not None  # a block not yet approved may be withdrawn
            why = why_not_cancellable(
                self._cancellation_rule, start=record.start, end=record.end,
                approved_at=record.approved_at, now=now, cost=None,
            )  # fmt: skip
            raise _cannot_cancel(record, why)
        return self._operation(
            record, "cancel", _future_url(record),
            on_done=functools.partial(self._cancel_block, record),
        )  # fmt: skip

    def _cancel_block(self, record: FutureReservation, when: datetime) -> None:
        """A cancel's operation is DONE: the block and its reservation are gone."""
        self._release_block(record)
        record.procurement = "CANCELLED"

    @settled
    def delete_future_reservation(self, project: str, zone: str, name: str) -> JSON:
        """Delete a block that is cancelled, declined or failed, or whose end has come;
        refused (400, nothing changed) otherwise."""
        record = self._future(project, zone, name)
        self._ready(record, zonal_path(project, zone, "futureReservations", name))
        if record.procurement not in DELETABLE and self.clock.now() < record.end:
            raise CloudError.invalid(
                f"Future reservation {record.name} cannot be deleted: it is "
                f"{record.procurement} until its end at {stamp(record.end)}; only a cancelled, "
                "declined or failed future reservation, or one whose end has passed, can be "
                "deleted"
            )
        return self._operation(
            record, "delete", _future_url(record),
            on_done=functools.partial(self._drop_block, record),
        )  # fmt: skip

    def _drop_block(self, record: FutureReservation, when: datetime) -> None:
        """A delete's operation is DONE: the block is gone (its reservation too)."""
        self._release_block(record)
        record.alive = False
        store = self._project(record.project).future_reservations
        if store.get((record.zone, record.name)) is record:
            del store[(record.zone, record.name)]

    # ------------------------------------------------------------------ reservations

    @settled
    def get_reservation(self, project: str, zone: str, name: str) -> JSON:
        record = self._live_block(project, zone, name)
        if record is None:
            raise CloudError.not_found(zonal_path(project, zone, "reservations", name))
        return self._reservation_view(record)

    @settled
    def list_reservations(self, project: str, zone: str) -> list[JSON]:
        records = [
            f
            for f in self._project(project).future_reservations.values()
            if f.zone == zone and f.reservation_live
        ]
        return [
            self._reservation_view(f) for f in sorted(records, key=lambda f: f.reservation_name)
        ]

    # ------------------------------------------------------------------ advice

    @settled
    def calendar_mode_advice(self, project: str, region: str, body: JSON) -> JSON:
        """Advice.CalendarMode: when and where the one spec of ``body`` would be approved now
        (a CalendarModeAdviceResponse; see the module docstring)."""
        specs = get(body, "futureResourcesSpecs")
        if not isinstance(specs, dict) or len(specs) != 1:
            raise CloudError.invalid(
                "Invalid value for field 'futureResourcesSpecs': exactly one spec is needed"
            )
        [(key, raw)] = specs.items()
        spec = self._advice_spec(raw, region, f"futureResourcesSpecs[{key}]")
        recommendations = [
            {"recommendationsPerSpec": {key: recommendation}}
            for recommendation in self._recommend(spec)
        ]
        return {"recommendations": recommendations}

    # ------------------------------------------------------------------ the capacity model

    def _promised(
        self, key: Key, start: datetime, end: datetime, *, besides: FutureReservation | None
    ) -> int:
        """Units promised to approved blocks of ``key`` not yet holding them whose windows
        overlap [``start``, ``end``)."""
        return sum(
            other.count
            for state in self._projects.values()
            for other in state.future_reservations.values()
            if other is not besides and other.alive and not other.holds_stock
            and other.procurement in PROMISED and (other.zone, other.shape) == key
            and other.start < end and start < other.end
        )  # fmt: skip

    def _back_by(self, key: Key, start: datetime) -> int:
        """Units of ``key`` held now by blocks, VMs and queued resources that give them back by
        themselves by ``start``."""
        back = 0
        for state in self._projects.values():
            back += sum(
                f.count for f in state.future_reservations.values()
                if f.holds_stock and (f.zone, f.shape) == key and f.end <= start
            )  # fmt: skip
            back += sum(
                1 for i in state.instances.values()
                if i.holds_stock and (i.zone, i.shape) == key
                and i.ends_at is not None and i.ends_at <= start
            )  # fmt: skip
            back += sum(
                q.chips for q in state.queued_resources.values()
                if q.holds_stock and (q.zone, q.shape) == key
                and q.ends_at is not None and q.ends_at <= start
            )  # fmt: skip
        return back

    def _fits(
        self, key: Key, start: datetime, end: datetime, units: int,
        besides: FutureReservation | None = None,
    ) -> bool:  # fmt: skip
        """The review's test (the module docstring): ``units`` of ``key`` free over
        [``start``, ``end``) beyond what overlapping approved blocks were promised."""
        free = self._stock.get(key, 0) + self._back_by(key, start)
        return free - self._promised(key, start, end, besides=besides) >= units

    def _promised_ends(self, keys: Iterable[Key]) -> list[datetime]:
        """When promises of ``keys`` end: the starts at which a later block may fit."""
        wanted = set(keys)
        return sorted(
            other.end
            for state in self._projects.values()
            for other in state.future_reservations.values()
            if other.alive and not other.holds_stock and other.procurement in PROMISED
            and (other.zone, other.shape) in wanted
        )  # fmt: skip

    # ------------------------------------------------------------------ a block's life

    def _review(self, record: FutureReservation, when: datetime) -> None:
        if not record.alive or record.procurement != PENDING:
            return
        key = (record.zone, record.shape)
        pending = self._injections.get(key)
        kind = pending.popleft() if pending else None
        if kind == "hang":
            self._counters["hang"] += 1
            return  # never reviewed: it stays PENDING_APPROVAL
        if kind is None and self._fits(key, record.start, record.end, record.count, record):
            self._counters["approved"] += 1
            self._approve(record, when)
            return
        self._counters[kind or "declined"] += 1
        record.procurement = "DECLINED"

    def _approve(self, record: FutureReservation, when: datetime) -> None:
        """Approved: its reservation is created now, empty; it is filled from the start."""
        record.procurement = "APPROVED"
        record.approved_at = when
        record.reservation_id = self._new_id()
        record.lock_time = cancel_deadline(
            self._cancellation_rule, start=record.start, approved_at=when
        )
        if record.lock_time is not None and record.lock_time < record.start:
            locked = record.lock_time + LOCK_AFTER
            self._at(locked, functools.partial(self._lock_block, record))
        self._at(max(record.start, when), functools.partial(self._begin_block, record))

    def _lock_block(self, record: FutureReservation, when: datetime) -> None:
        """Past its last moment of cancellation: locked (``PROCURING``)."""
        if record.alive and record.procurement == "APPROVED":
            record.procurement = "PROCURING"

    def _begin_block(self, record: FutureReservation, when: datetime) -> None:
        """The start: take the block's units (PROVISIONING) and fill its reservation with them
        ``fill_delay`` later (FULFILLED), or fail it if they are gone (its reservation is
        deleted)."""
        if not record.alive or record.procurement not in ("APPROVED", "PROCURING"):
            return
        record.procurement = "PROVISIONING"
        key = (record.zone, record.shape)
        if self._stock.get(key, 0) < record.count:
            self._counters["stockout"] += 1
            record.procurement = "FAILED"
            record.reservation_id = None
            return
        self._counters["provisioned"] += 1
        self._stock[key] = self._stock.get(key, 0) - record.count
        record.holds_stock = True
        if self._fill_delay:
            self._at(when + self._fill_delay, functools.partial(self._fill_block, record))
        else:
            self._fill_block(record, when)
        self._at(max(record.end, when), functools.partial(self._end_block, record))

    def _fill_block(self, record: FutureReservation, when: datetime) -> None:
        """Google has delivered the block's units into its reservation: FULFILLED."""
        if record.alive and record.procurement == "PROVISIONING" and record.reservation_live:
            record.filled = True
            record.procurement = "FULFILLED"

    def _end_block(self, record: FutureReservation, when: datetime) -> None:
        if record.alive and record.reservation_live:
            self._counters["calendar_ended"] += 1
            self._release_block(record)

    def _release_block(self, record: FutureReservation) -> None:
        """Delete the block's reservation and everything consuming it; its units return."""
        for instance in self._vm_consumers(record):
            self._remove_instance(instance)
        for queued in self._queued_on(record):
            self._remove_queued_resource(queued)
        record.reservation_id = None
        record.filled = False
        if record.holds_stock:
            record.holds_stock = False
            self._give_back(record.zone, record.shape, record.count)

    def _refuse_taken_name(self, project: str, zone: str, reservation: str) -> None:
        """One reservation name belongs to one block not yet over in a zone."""
        for other in self._project(project).future_reservations.values():
            if (other.zone, other.reservation_name) == (zone, reservation) and (
                other.procurement in (PENDING, *PROMISED) or other.reservation_live
            ):
                raise CloudError.already_exists(
                    zonal_path(project, zone, "reservations", reservation)
                )

    def _future(self, project: str, zone: str, block_name: str) -> FutureReservation:
        record = self._project(project).future_reservations.get((zone, block_name))
        if record is None:
            raise CloudError.not_found(zonal_path(project, zone, "futureReservations", block_name))
        return record

    # ------------------------------------------------------------------ advice

    def _advice_spec(self, spec: object, region: str, where: str) -> AdviceSpec:
        """Validate one FutureResourcesSpec; its zones are the allowed ones, or every zone of
        the region the world has stock of the shape in but the denied ones."""
        if not isinstance(spec, dict):
            raise CloudError.invalid(f"Invalid value for field '{where}': must be an object")
        _deployment_type(get(spec, "deploymentType"), f"{where}.deploymentType")
        target = get(spec, "targetResources")
        sku = get(target, "specificSkuResources")
        aggregate = get(target, "aggregateResources")
        if (sku is None) == (aggregate is None):
            raise CloudError.invalid(
                f"Invalid value for field '{where}.targetResources': exactly one of "
                "specificSkuResources and aggregateResources is needed"
            )
        tpu = aggregate is not None
        if tpu:
            shape = _tpu_type(get(aggregate, "vmFamily"), f"{where}.aggregateResources.vmFamily")
            _workload_type(get(aggregate, "workloadType"), f"{where}.aggregateResources")
            units = integer(
                get(aggregate, "acceleratorCount"), f"{where}.aggregateResources.acceleratorCount"
            )
        else:
            machine = get(sku, "machineType")
            if not isinstance(machine, str) or not machine:
                raise CloudError.invalid(
                    f"Invalid value for field '{where}.specificSkuResources.machineType'"
                )
            shape = last(machine)
            units = integer(
                get(sku, "instanceCount"), f"{where}.specificSkuResources.instanceCount"
            )
        counted = (
            "aggregateResources.acceleratorCount" if tpu else "specificSkuResources.instanceCount"
        )
        _counted(tpu, units, f"{where}.targetResources.{counted}")
        earliest, latest, span = self._time_range(
            get(spec, "timeRangeSpec"), lead_of(tpu), f"{where}.timeRangeSpec"
        )
        zones = self._advice_zones(get(spec, "locationPolicy"), region, shape, where)
        return AdviceSpec(shape, units, earliest, latest, span, zones)

    def _time_range(
        self, spec: object, lead: Lead, where: str
    ) -> tuple[datetime, datetime, timedelta]:
        """(earliest start, latest start, duration) of a FlexibleTimeRange within the lead."""
        now = self.clock.now()
        earliest, latest = now + lead.earliest, now + lead.latest
        if get(spec, "startTimeNotEarlierThan") is not None:
            asked = timestamp(
                get(spec, "startTimeNotEarlierThan"), f"{where}.startTimeNotEarlierThan"
            )
            earliest = max(earliest, asked)
        if get(spec, "startTimeNotLaterThan") is not None:
            asked = timestamp(get(spec, "startTimeNotLaterThan"), f"{where}.startTimeNotLaterThan")
            latest = min(latest, asked)
        field = "maxDuration" if get(spec, "maxDuration") is not None else "minDuration"
        if get(spec, field) is None:
            raise CloudError.invalid(
                f"Invalid value for field '{where}': minDuration or maxDuration is needed"
            )
        span = _block_span(duration(get(spec, field), f"{where}.{field}"), f"{where}.{field}")
        return earliest, latest, span

    def _advice_zones(self, policy: object, region: str, shape: str, where: str) -> tuple[str, ...]:
        locations = get(policy, "locations") or {}
        if not isinstance(locations, dict):
            raise CloudError.invalid(f"Invalid value for field '{where}.locationPolicy.locations'")
        allowed: list[str] = []
        denied: set[str] = set()
        for location, choice in locations.items():
            zone = re.fullmatch(r"zones/([a-z0-9-]+)", str(location))
            if zone is None or not zone.group(1).startswith(f"{region}-"):
                raise CloudError.invalid(
                    f"Invalid value for field '{where}.locationPolicy.locations': {location!r} "
                    f"is not zones/ZONE of region {region}"
                )
            preference = get(choice, "preference") or "ALLOW"
            if preference not in PREFERENCES:
                raise CloudError.invalid(
                    f"Invalid value for field '{where}.locationPolicy.locations[{location}]"
                    f".preference': {preference!r}"
                )
            if preference == "ALLOW":
                allowed.append(zone.group(1))
            else:
                denied.add(zone.group(1))
        if allowed:
            return tuple(allowed)
        known = sorted({z for z, s in self._stock if s == shape and z.startswith(f"{region}-")})
        return tuple(z for z in known if z not in denied)

    def _recommend(self, spec: AdviceSpec) -> list[JSON]:
        """Up to three recommendations, earliest first (see the module docstring)."""
        if spec.earliest > spec.latest:
            return []
        offered = [z for z in spec.zones if (z, spec.shape) in self._stock]
        keys = [(z, spec.shape) for z in offered]
        later = [end for end in self._promised_ends(keys) if spec.earliest < end <= spec.latest]
        recommendations: list[JSON] = []
        for start in sorted({spec.earliest, *later}):
            end = start + spec.span
            fitting = [z for z in offered if self._fits((z, spec.shape), start, end, spec.units)]
            if not fitting:
                continue
            others = {
                f"zones/{z}": {
                    "status": "RECOMMENDED"
                    if z in fitting
                    else ("NO_CAPACITY" if z in offered else "NOT_SUPPORTED")
                }
                for z in spec.zones
                if z != fitting[0]
            }
            recommendations.append({
                "recommendationId": f"{spec.shape}-{fitting[0]}-{int(start.timestamp())}",
                "recommendationType": "FUTURE_RESERVATION",
                "startTime": rfc3339(start),
                "endTime": rfc3339(end),
                "location": f"zones/{fitting[0]}",
                "otherLocations": others,
            })  # fmt: skip
            if len(recommendations) == MAX_RECOMMENDATIONS:
                break
        return recommendations

    # ------------------------------------------------------------------ views

    def _reservation_view(self, record: FutureReservation) -> JSON:
        view: JSON = {
            "kind": "compute#reservation",
            "id": str(record.reservation_id),
            "name": record.reservation_name,
            "zone": scope_url(record.project, record.zone),
            "creationTimestamp": stamp(record.start),
            "selfLink": _reservation_url(record),
            "specificReservationRequired": True,
            "status": "READY",
            "deleteAtTime": stamp(record.end),
        }
        if record.tpu:
            aggregate = get(record.body, "aggregateReservation") or {}
            chip = TPU_COMPUTE_ACCELERATORS.get(record.shape, "")
            accelerator = f"{scope_url(record.project, record.zone)}/acceleratorTypes/{chip}"
            view["aggregateReservation"] = {
                "vmFamily": TPU_VM_FAMILIES.get(record.shape, ""),
                "workloadType": get(aggregate, "workloadType") or "BATCH",
                "reservedResources": [_chips(record.count, accelerator)],
                "inUseResources": [_chips(self._in_use(record), accelerator)],
            }
        else:
            view["specificReservation"] = {
                "count": str(record.count),
                "inUseCount": str(self._in_use(record)),
                # "how many instances are actually usable currently" (CP
                # AllocationSpecificSKUReservation.assured_count): none until it is filled.
                "assuredCount": str(record.usable),
                "instanceProperties": {"machineType": record.shape},
            }
        return view


# ---------------------------------------------------------------------- validation


def _block_request(body: JSON, block_name: str, zone: str, now: datetime) -> BlockRequest:
    """Validate an insert (see the module docstring): what it reserves, when, and the name of
    the reservation it will create."""
    mode = get(body, "reservationMode")
    if mode != "CALENDAR":
        raise CloudError.invalid(
            f"Invalid value for field 'resource.reservationMode': {mode!r}. Only CALENDAR "
            "future reservations are simulated"
        )
    _deployment_type(get(body, "deploymentType"), "resource.deploymentType")
    scheduling = get(body, "schedulingType")
    if scheduling is not None and scheduling not in SCHEDULING_TYPES:
        raise CloudError.invalid(
            f"Invalid value for field 'resource.schedulingType': {scheduling!r}. It must be "
            f"one of {', '.join(SCHEDULING_TYPES)}"
        )
    planning = get(body, "planningStatus")
    if planning is not None and planning != "SUBMITTED":
        raise CloudError.invalid(
            f"Invalid value for field 'resource.planningStatus': {planning!r}. Only SUBMITTED "
            "requests are reviewed (drafts are not simulated)"
        )
    if get(body, "autoDeleteAutoCreatedReservations") is False:
        raise CloudError.invalid(
            "Invalid value for field 'resource.autoDeleteAutoCreatedReservations': false. A "
            "calendar-mode request must auto-delete its reservation at its end"
        )
    sku, aggregate = get(body, "specificSkuProperties"), get(body, "aggregateReservation")
    if (sku is None) == (aggregate is None):
        raise CloudError.invalid(
            "Invalid value for field 'resource': exactly one of specificSkuProperties (GPU VMs) "
            "and aggregateReservation (TPU chips) is needed"
        )
    tpu = aggregate is not None
    shape, count = _tpu_chips(aggregate, zone) if tpu else _gpu_vms(sku)
    counted = (
        "aggregateReservation.reservedResources" if tpu else "specificSkuProperties.totalCount"
    )
    _counted(tpu, count, f"resource.{counted}")
    start, end = _window(get(body, "timeWindow"))
    lead = lead_of(tpu)
    if not now + lead.earliest <= start <= now + lead.latest:
        kind = "TPU" if tpu else "GPU"
        raise CloudError.invalid(
            f"Invalid value for field 'resource.timeWindow.startTime': {stamp(start)}. A {kind} "
            f"calendar block starts {_days(lead.earliest)} to {_days(lead.latest)} from now"
        )
    reservation = get(body, "reservationName")
    reservation_name = block_name if reservation is None else name(reservation, "reservationName")
    return BlockRequest(shape, count, tpu, start, end, reservation_name)


def _gpu_vms(sku: object) -> tuple[str, int]:
    count = integer(get(sku, "totalCount") or 0, "resource.specificSkuProperties.totalCount")
    machine_type = get(get(sku, "instanceProperties") or {}, "machineType")
    if not isinstance(machine_type, str) or not machine_type:
        raise CloudError.invalid(
            "Invalid value for field "
            "'resource.specificSkuProperties.instanceProperties.machineType': it is required"
        )
    return last(machine_type), count


def _tpu_chips(aggregate: object, zone: str) -> tuple[str, int]:
    """(TPU API type, chips) of an AllocationAggregateReservation in ``zone``.

    ``acceleratorType``, if given, is a "Full or partial URL to accelerator type" (CP
    ``AllocationAggregateReservationReservedResourceInfoAccelerator``): a bare name is
    malformed (gcloud sends none: the VM family says which chip). The generation must be one
    calendar mode reserves in ``zone``, as the workload type the zone serves, and a v5e
    SERVING block holds 1, 4 or 8 chips (catalog.TPU_CALENDAR_ZONES, TPU_SERVING_CHIPS)."""
    where = "resource.aggregateReservation"
    shape = _tpu_type(get(aggregate, "vmFamily"), f"{where}.vmFamily")
    workload = get(aggregate, "workloadType")
    _workload_type(workload, where)
    resources = get(aggregate, "reservedResources")
    if not isinstance(resources, list) or not resources:
        raise CloudError.invalid(
            f"Invalid value for field '{where}.reservedResources': at least one accelerator"
        )
    chips = 0
    for index, resource in enumerate(resources):
        accelerator = get(resource, "accelerator")
        field = f"{where}.reservedResources[{index}].accelerator"
        kind = get(accelerator, "acceleratorType")
        if kind is not None:
            _accelerator_type(str(kind), shape, zone, f"{field}.acceleratorType")
        chips += integer(get(accelerator, "acceleratorCount"), f"{field}.acceleratorCount")
    _calendar_zone(shape, zone, workload or "BATCH", chips, where)
    return shape, chips


def _accelerator_type(kind: str, shape: str, zone: str, field: str) -> None:
    """A reserved accelerator's type: a URL of the chip of ``shape`` in ``zone``."""
    match = re.fullmatch(
        r"(?:https://(?:www|compute)\.googleapis\.com/compute/(?:v1|beta)/)?"
        r"(?:projects/[^/]+/)?zones/(?P<zone>[^/]+)/acceleratorTypes/(?P<type>[-a-z0-9]+)",
        kind,
    )
    if match is None:
        raise CloudError.invalid(
            f"Invalid value for field '{field}': {kind!r}. The URL is malformed (a full or "
            "partial URL, zones/ZONE/acceleratorTypes/TYPE)."
        )
    if match["zone"] != zone or match["type"] != TPU_COMPUTE_ACCELERATORS[shape]:
        raise CloudError.invalid(
            f"Invalid value for field '{field}': {kind!r}. The VM family "
            f"{TPU_VM_FAMILIES[shape]} reserves {TPU_COMPUTE_ACCELERATORS[shape]} chips in {zone}"
        )


def _calendar_zone(shape: str, zone: str, workload: str, chips: int, where: str) -> None:
    """Refuse a TPU block Google does not reserve in ``zone`` (tpu/docs/calendar-mode-reservation,
    "Limitations"), or as another workload type than the zone's."""
    accelerator = TPU_ACCELERATOR_OF_API_TYPE[shape]
    zones = TPU_CALENDAR_ZONES.get(accelerator, {})
    served = zones.get(zone)
    if served is None:
        listed = ", ".join(f"{z} ({w})" for z, w in sorted(zones.items()))
        raise CloudError.invalid(
            f"Invalid value for field '{where}.vmFamily': calendar mode reserves "
            f"{accelerator} only in {listed}, not in {zone}"
        )
    if workload != served:
        raise CloudError.invalid(
            f"Invalid value for field '{where}.workloadType': {workload!r}. Calendar mode "
            f"reserves {accelerator} in {zone} for {served} workloads"
        )
    if served == "SERVING" and chips not in TPU_SERVING_CHIPS:
        raise CloudError.invalid(
            f"Invalid value for field '{where}.reservedResources': a SERVING block of "
            f"{accelerator} holds {', '.join(map(str, sorted(TPU_SERVING_CHIPS)))} chips, "
            f"not {chips}"
        )


def _tpu_type(family: object, where: str) -> str:
    """The TPU API type (the stock key's shape) of a calendar-mode VM family."""
    if not isinstance(family, str) or family not in TPU_TYPE_OF_VM_FAMILY:
        allowed = ", ".join(sorted(TPU_TYPE_OF_VM_FAMILY))
        raise CloudError.invalid(
            f"Invalid value for field '{where}': {family!r}. It must be one of {allowed}"
        )
    shape = TPU_TYPE_OF_VM_FAMILY[family]
    if shape not in CALENDAR_TPU_TYPES:
        # tpu/docs/calendar-mode-reservation: only v6e, v5p and v5e can be reserved.
        raise CloudError.invalid(
            f"Invalid value for field '{where}': {family!r}. Calendar mode reserves TPU "
            f"{', '.join(TPU_VM_FAMILIES[t] for t in CALENDAR_TPU_TYPES)} only"
        )
    return shape


def _workload_type(value: object, where: str) -> None:
    if value is not None and value not in WORKLOAD_TYPES:
        raise CloudError.invalid(
            f"Invalid value for field '{where}.workloadType': {value!r}. It must be one of "
            f"{', '.join(WORKLOAD_TYPES)}"
        )


def _deployment_type(value: object, where: str) -> None:
    """Compute v1's ``deploymentType`` has only DENSE."""
    if value is not None and value != "DENSE":
        raise CloudError.invalid(f"Invalid value for field '{where}': {value!r}. It must be DENSE")


def _counted(tpu: bool, units: int, where: str) -> None:
    problem = count_problem(tpu, units)
    if problem is not None:
        raise CloudError.invalid(f"Invalid value for field '{where}': {problem}")


def _window(window: object) -> tuple[datetime, datetime]:
    """(start, end) of a future reservation's timeWindow (an end time or a duration)."""
    if not isinstance(window, dict) or get(window, "startTime") is None:
        raise CloudError.invalid(
            "Invalid value for field 'resource.timeWindow.startTime': it is required"
        )
    start = timestamp(get(window, "startTime"), "resource.timeWindow.startTime")
    if get(window, "endTime") is not None:
        end = timestamp(get(window, "endTime"), "resource.timeWindow.endTime")
        field = "resource.timeWindow.endTime"
    elif get(window, "duration") is not None:
        end = start + duration(get(window, "duration"), "resource.timeWindow.duration")
        field = "resource.timeWindow.duration"
    else:
        raise CloudError.invalid(
            "Invalid value for field 'resource.timeWindow': endTime or duration is needed"
        )
    _block_span(end - start, field)
    return start, end


def _block_span(span: timedelta, where: str) -> timedelta:
    """A calendar block's length: ``CALENDAR_MIN_RUN`` to ``CALENDAR_MAX_RUN``."""
    if not CALENDAR_MIN_RUN <= span <= CALENDAR_MAX_RUN:
        raise CloudError.invalid(
            f"Invalid value for field '{where}': a calendar block lasts "
            f"{_days(CALENDAR_MIN_RUN)} to {_days(CALENDAR_MAX_RUN)}, not {span}"
        )
    return span


def _days(span: timedelta) -> str:
    days = span / timedelta(days=1)
    return f"{days:g} day" + ("" if days == 1 else "s")


def _cannot_cancel(record: FutureReservation, why: str) -> CloudError:
    return CloudError.invalid(f"Future reservation {record.name} cannot be cancelled: {why}")


# ---------------------------------------------------------------------- views


def _chips(count: int, accelerator: str) -> JSON:
    return {"accelerator": {"acceleratorCount": count, "acceleratorType": accelerator}}


def _future_url(record: FutureReservation) -> str:
    return f"{scope_url(record.project, record.zone)}/futureReservations/{record.name}"


def _reservation_url(record: FutureReservation) -> str:
    return f"{scope_url(record.project, record.zone)}/reservations/{record.reservation_name}"


def _future_view(record: FutureReservation) -> JSON:
    """The block as the API shows it. ``autoCreatedReservations`` names the reservation while
    it exists (none once Google deleted it at the end: a FULFILLED block without one is over);
    ``fulfilledCount`` stays once it was fulfilled."""
    status: JSON = {"procurementStatus": record.procurement}
    if record.lock_time is not None:
        status["lockTime"] = stamp(record.lock_time)
    if record.reservation_live:
        status["autoCreatedReservations"] = [_reservation_url(record)]
    if record.procurement == "FULFILLED":
        status["fulfilledCount"] = str(record.count)
    elif record.procurement == "PROVISIONING":
        # "the fulfilled capacity so far. This is set during PROVISIONING state" (CP
        # FutureReservationStatus.fulfilled_count).
        status["fulfilledCount"] = "0"
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
