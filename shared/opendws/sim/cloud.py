"""A simulated Compute Engine and Cloud TPU: per-zone stock of each accelerator shape, a
provisioning latency, injected failures, and the resources opendws provisions through —
instance templates, managed instance groups with flex-start resize requests, instances,
calendar-mode future reservations with their auto-created reservations, and TPU queued
resources.

Resources and operations are JSON dictionaries shaped like the real REST APIs (camelCase field
names) so that the emulator in ``emulators/compute.py`` can serve them to the real client
libraries unchanged; requests are read in camelCase or snake_case.

Invariants:
- Stock is physical: it is shared by all projects, keyed by zone and shape. A shape is a machine
  type name for Compute (units are VMs) or a TPU AcceleratorConfig type name (units are chips).
  Every unit is either free (in ``stock``) or held by exactly one instance, future reservation or
  queued resource; releasing a holder returns its units exactly once.
- The world is settled lazily and deterministically: every call first runs the scheduled events
  that are due at ``clock.now()``, in time order (ties in scheduling order), each at its own
  scheduled moment. Moving the clock is all it takes to make things happen.
- One re-entrant lock guards everything, so the emulator may serve requests from many threads.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import random
import re
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Concatenate, ParamSpec, TypeVar

JSON = dict[str, Any]

FAILURE_KINDS = ("stockout", "hang", "error")
CREATED_KINDS = ("resizeRequests", "queuedResources", "futureReservations", "instances")
COMPUTE_BASE = "https://www.googleapis.com/compute/v1"
STOCKOUT = "ZONE_RESOURCE_POOL_EXHAUSTED"
RATE_EXCEEDED = "RESOURCE_OPERATION_RATE_EXCEEDED"

# google.rpc.Code values used in TPU failedData errors.
RPC_DEADLINE_EXCEEDED = 4
RPC_RESOURCE_EXHAUSTED = 8
RPC_INTERNAL = 13

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_FIRST_ID = 1_000_000_000_000_000_001
_PENDING_RESIZE = ("ACCEPTED", "CREATING")
_WAITING_QUEUED = ("ACCEPTED", "WAITING_FOR_RESOURCES")

# TPU v2 AcceleratorConfig.Type: the TPU client sends enums as integers.
_TPU_TYPE_NUMBERS = {2: "V2", 4: "V3", 7: "V4", 9: "V5LITE_POD", 10: "V5P", 11: "V6E"}
# acceleratorType prefixes ("v5litepod-16"): the type and how many TensorCores one chip has
# (the number in v2/v3/v4/v5p names counts cores, in v5litepod/v6e names it counts chips).
_TPU_FAMILIES = {
    "v2": ("V2", 2),
    "v3": ("V3", 2),
    "v4": ("V4", 2),
    "v5p": ("V5P", 2),
    "v5litepod": ("V5LITE_POD", 1),
    "v6e": ("V6E", 1),
}


class SimClock:
    """The simulated world's clock, always timezone-aware UTC.

    Running (``frozen=False``), it is wall time plus an offset that ``advance``/``set`` move;
    frozen, only ``advance``/``set`` move it. It never goes backwards: events already settled
    cannot be undone.
    """

    def __init__(self, start: datetime | None = None, *, frozen: bool = False) -> None:
        wall = datetime.now(UTC)
        begin = wall if start is None else _utc(start)
        self._lock = threading.Lock()
        self._frozen = frozen
        self._frozen_at = begin
        self._offset = begin - wall

    def now(self) -> datetime:
        with self._lock:
            if self._frozen:
                return self._frozen_at
            return datetime.now(UTC) + self._offset

    def advance(self, delta: timedelta) -> None:
        if delta < timedelta(0):
            raise ValueError(f"the clock only moves forward, not by {delta}")
        with self._lock:
            self._frozen_at += delta
            self._offset += delta

    def set(self, moment: datetime) -> None:
        self.advance(_utc(moment) - self.now())


class CloudError(Exception):
    """An error the API answers with: an HTTP status, a Compute-style ``reason`` (``notFound``,
    ``alreadyExists``, ``invalid``, ``resourceNotReady``, ``resourceInUseByAnotherResource``) and
    a message naming the resource."""

    def __init__(self, http_status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.reason = reason
        self.message = message

    @classmethod
    def not_found(cls, resource: str) -> CloudError:
        return cls(404, "notFound", f"The resource '{resource}' was not found")

    @classmethod
    def already_exists(cls, resource: str) -> CloudError:
        return cls(409, "alreadyExists", f"The resource '{resource}' already exists")

    @classmethod
    def invalid(cls, message: str) -> CloudError:
        return cls(400, "invalid", message)

    @classmethod
    def not_ready(cls, message: str) -> CloudError:
        return cls(400, "resourceNotReady", message)


@dataclass(eq=False)
class _Record:
    """What every simulated resource has; ``alive`` turns false when it is deleted, so events
    scheduled for it do nothing."""

    project: str
    zone: str
    name: str
    id: int
    created_at: datetime
    body: JSON
    alive: bool = field(default=True, init=False)


@dataclass(eq=False)
class _Template(_Record):
    machine_type: str = ""


@dataclass(eq=False)
class _Mig(_Record):
    template: str = ""
    base_name: str = ""


@dataclass(eq=False)
class _ResizeRequest(_Record):
    mig: str = ""
    shape: str = ""
    count: int = 0
    names: list[str] = field(default_factory=list)
    run_duration: timedelta | None = None
    state: str = "ACCEPTED"
    errors: list[JSON] = field(default_factory=list)


@dataclass(eq=False)
class _Instance(_Record):
    shape: str = ""
    status: str = "PROVISIONING"
    mig: str | None = None
    reservation: str | None = None
    holds_stock: bool = False


@dataclass(eq=False)
class _FutureReservation(_Record):
    shape: str = ""
    count: int = 0
    start: datetime = _EPOCH
    end: datetime = _EPOCH
    auto_delete: bool = True
    procurement: str = "APPROVED"
    reservation_id: int | None = None
    holds_stock: bool = False

    @property
    def reservation_live(self) -> bool:
        return self.reservation_id is not None


@dataclass(eq=False)
class _QueuedResource(_Record):
    shape: str = ""
    chips: int = 0
    state: str = "ACCEPTED"
    valid_until: datetime | None = None
    failed: JSON | None = None
    holds_stock: bool = False


@dataclass
class _Project:
    templates: dict[str, _Template] = field(default_factory=dict)
    migs: dict[tuple[str, str], _Mig] = field(default_factory=dict)
    resize_requests: dict[tuple[str, str, str], _ResizeRequest] = field(default_factory=dict)
    instances: dict[tuple[str, str], _Instance] = field(default_factory=dict)
    future_reservations: dict[tuple[str, str], _FutureReservation] = field(default_factory=dict)
    queued_resources: dict[tuple[str, str], _QueuedResource] = field(default_factory=dict)
    operations: dict[tuple[str, str], JSON] = field(default_factory=dict)
    tpu_operations: dict[tuple[str, str], JSON] = field(default_factory=dict)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _settled(
    method: Callable[Concatenate[SimulatedCloud, _P], _R],
) -> Callable[Concatenate[SimulatedCloud, _P], _R]:
    """Run ``method`` under the cloud's lock, after settling the world up to ``clock.now()``."""

    @functools.wraps(method)
    def wrapper(self: SimulatedCloud, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._lock:
            self._settle()
            return method(self, *args, **kwargs)

    return wrapper


class SimulatedCloud:
    """The simulated Compute Engine and Cloud TPU. See the module docstring for invariants.

    Steering (tests, the admin endpoint): ``set_stock``, ``inject``, ``set_latency``,
    ``advance``, ``reset``; reading: ``stock``, ``state``, ``created``. The remaining public
    methods are the API calls the emulator serves; they raise ``CloudError`` for requests the
    real API refuses and return the JSON the real API answers with.
    """

    def __init__(
        self,
        clock: SimClock | None = None,
        *,
        provisioning_latency: timedelta = timedelta(seconds=20),
    ) -> None:
        if provisioning_latency < timedelta(0):
            raise ValueError("the provisioning latency cannot be negative")
        self.clock = clock if clock is not None else SimClock()
        self._lock = threading.RLock()
        self._latency = provisioning_latency
        self._ids = itertools.count(_FIRST_ID)
        self._clear()

    def _clear(self) -> None:
        self._projects: dict[str, _Project] = {}
        self._stock: dict[tuple[str, str], int] = {}
        self._injections: dict[tuple[str, str], deque[str]] = {}
        self._events: list[tuple[datetime, int, Callable[[datetime], None]]] = []
        self._sequence = itertools.count()
        # A seeded generator keeps generated VM names the same from run to run.
        self._random = random.Random(0)
        self._created: dict[str, Counter[str]] = {kind: Counter() for kind in CREATED_KINDS}
        self._counters: Counter[str] = Counter()

    # ------------------------------------------------------------------ steering

    @_settled
    def set_stock(self, zone: str, shape: str, units: int) -> None:
        """Set the free units of ``shape`` in ``zone`` (units held by resources are not counted)."""
        if isinstance(units, bool) or not isinstance(units, int) or units < 0:
            raise ValueError(f"units must be a whole number ≥ 0, not {units!r}")
        self._stock[(_nonempty(zone, "zone"), _nonempty(shape, "shape"))] = units

    @_settled
    def stock(self, zone: str, shape: str) -> int:
        """The free units of ``shape`` in ``zone`` now."""
        return self._stock.get((zone, shape), 0)

    @_settled
    def inject(self, zone: str, shape: str, kind: str, count: int = 1) -> None:
        """Make the next ``count`` provisionings of ``shape`` in ``zone`` fail as ``kind``:
        ``stockout`` (no capacity), ``hang`` (waits forever) or ``error`` (an API error)."""
        if kind not in FAILURE_KINDS:
            raise ValueError(f"kind must be one of {', '.join(FAILURE_KINDS)}, not {kind!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be a whole number ≥ 1, not {count!r}")
        key = (_nonempty(zone, "zone"), _nonempty(shape, "shape"))
        self._injections.setdefault(key, deque()).extend([kind] * count)

    @_settled
    def set_latency(self, latency: timedelta) -> None:
        """Set the provisioning latency of resources created from now on."""
        if latency < timedelta(0):
            raise ValueError(f"the latency cannot be negative, not {latency}")
        self._latency = latency

    def advance(self, delta: timedelta) -> None:
        """Move the clock forward by ``delta`` and settle everything that became due."""
        with self._lock:
            self.clock.advance(delta)
            self._settle()

    def reset(self) -> None:
        """Forget all resources, operations, stock, injections and counters. The clock and the
        provisioning latency (configuration, not state) are kept."""
        with self._lock:
            self._clear()

    @_settled
    def created(self, kind: str) -> dict[str, int]:
        """For ``kind`` in ``CREATED_KINDS``: name → how many times a create of that name was
        accepted (a resource came into being). Instances count whether inserted directly or made
        by a resize request."""
        if kind not in self._created:
            raise ValueError(f"kind must be one of {', '.join(CREATED_KINDS)}, not {kind!r}")
        return dict(self._created[kind])

    @_settled
    def state(self) -> dict[str, object]:
        """A JSON-friendly dump: time, latency, stock, pending injections, every resource (as the
        API shows it) per project, ``created`` counters and event counters."""
        resources: dict[str, object] = {}
        for name, project in sorted(self._projects.items()):
            resources[name] = {
                "instanceTemplates": [self._template_view(t) for t in project.templates.values()],
                "instanceGroupManagers": [self._mig_view(m) for m in project.migs.values()],
                "resizeRequests": [self._resize_view(r) for r in project.resize_requests.values()],
                "instances": [self._instance_view(i) for i in project.instances.values()],
                "futureReservations": [
                    self._future_view(f) for f in project.future_reservations.values()
                ],
                "reservations": [
                    self._reservation_view(f)
                    for f in project.future_reservations.values()
                    if f.reservation_live
                ],
                "queuedResources": [
                    self._queued_view(q) for q in project.queued_resources.values()
                ],
            }
        return {
            "now": _stamp(self.clock.now()),
            "latency_seconds": self._latency.total_seconds(),
            "stock": [
                {"zone": zone, "shape": shape, "units": units}
                for (zone, shape), units in sorted(self._stock.items())
            ],
            "injections": [
                {"zone": zone, "shape": shape, "kinds": list(kinds)}
                for (zone, shape), kinds in sorted(self._injections.items())
                if kinds
            ],
            "resources": resources,
            "created": {kind: dict(names) for kind, names in self._created.items()},
            "counters": dict(self._counters),
        }

    # ------------------------------------------------------------------ settling

    def _settle(self) -> None:
        now = self.clock.now()
        while self._events and self._events[0][0] <= now:
            when, _, action = heapq.heappop(self._events)
            action(when)

    def _at(self, when: datetime, action: Callable[[datetime], None]) -> None:
        heapq.heappush(self._events, (when, next(self._sequence), action))

    def _provision(self, zone: str, shape: str, units: int) -> str:
        """Decide one provisioning: ``ok`` (the units are taken), or a failure kind. A pending
        injection is consumed first; otherwise it is a stockout when too few units are free."""
        pending = self._injections.get((zone, shape))
        if pending:
            outcome = pending.popleft()
        elif self._stock.get((zone, shape), 0) < units:
            outcome = "stockout"
        else:
            self._stock[(zone, shape)] = self._stock.get((zone, shape), 0) - units
            outcome = "ok"
        self._counters[{"ok": "provisioned"}.get(outcome, outcome)] += 1
        return outcome

    def _give_back(self, zone: str, shape: str, units: int) -> None:
        self._stock[(zone, shape)] = self._stock.get((zone, shape), 0) + units

    def _project(self, project: str) -> _Project:
        return self._projects.setdefault(project, _Project())

    def _new_id(self) -> int:
        return next(self._ids)

    # ------------------------------------------------------------------ operations

    def _operation(
        self,
        record: _Record,
        operation_type: str,
        target: str,
        *,
        scope: str | None = None,
        error: tuple[int, str, str] | None = None,
    ) -> JSON:
        """Record and return a finished Compute Operation on ``target`` (a selfLink); ``error``
        is (HTTP status, error code, message) when the mutation failed."""
        now = self.clock.now()
        operation_id = self._new_id()
        name = f"operation-{int(now.timestamp() * 1000)}-{operation_id:x}"
        where = scope if scope is not None else record.zone
        base = _scope_url(record.project, where)
        operation: JSON = {
            "kind": "compute#operation",
            "id": str(operation_id),
            "name": name,
            "operationType": operation_type,
            "targetLink": target,
            "targetId": str(record.id),
            "status": "DONE",
            "progress": 100,
            "user": "opendws-emulator",
            "insertTime": _stamp(now),
            "startTime": _stamp(now),
            "endTime": _stamp(now),
            "selfLink": f"{base}/operations/{name}",
        }
        if where != "global":
            operation["zone"] = base
        if error is not None:
            status, code, message = error
            operation["error"] = {"errors": [{"code": code, "message": message}]}
            operation["httpErrorStatusCode"] = status
            operation["httpErrorMessage"] = _HTTP_MESSAGES.get(status, "ERROR")
        self._project(record.project).operations[(where, name)] = operation
        return operation

    @_settled
    def get_operation(self, project: str, scope: str, name: str) -> JSON:
        """A Compute operation; ``scope`` is a zone name or ``global``."""
        operation = self._project(project).operations.get((scope, name))
        if operation is None:
            raise CloudError.not_found(f"projects/{project}/{_scope_path(scope)}/operations/{name}")
        return operation

    # ------------------------------------------------------------------ instance templates

    @_settled
    def insert_instance_template(self, project: str, body: JSON) -> JSON:
        name = _name(body.get("name"), "instance template name")
        store = self._project(project).templates
        if name in store:
            raise CloudError.already_exists(f"projects/{project}/global/instanceTemplates/{name}")
        properties = _get(body, "properties") or {}
        machine_type = _get(properties, "machineType") if isinstance(properties, dict) else None
        if not isinstance(machine_type, str) or not machine_type:
            raise CloudError.invalid("Invalid value for field 'resource.properties.machineType'")
        template = _Template(
            project, "global", name, self._new_id(), self.clock.now(), body, _last(machine_type)
        )
        store[name] = template
        return self._operation(template, "insert", self._template_url(template))

    @_settled
    def get_instance_template(self, project: str, name: str) -> JSON:
        return self._template_view(self._template(project, name))

    @_settled
    def list_instance_templates(self, project: str) -> list[JSON]:
        templates = self._project(project).templates.values()
        return [self._template_view(t) for t in sorted(templates, key=_by_name)]

    @_settled
    def delete_instance_template(self, project: str, name: str) -> JSON:
        template = self._template(project, name)
        users = [m.name for m in self._project(project).migs.values() if m.template == name]
        if users:
            raise CloudError(
                400,
                "resourceInUseByAnotherResource",
                f"The instance_template resource '{self._template_url(template)}' is already "
                f"being used by instance group manager '{users[0]}'",
            )
        template.alive = False
        del self._project(project).templates[name]
        return self._operation(template, "delete", self._template_url(template))

    def _template(self, project: str, name: str) -> _Template:
        template = self._project(project).templates.get(name)
        if template is None:
            raise CloudError.not_found(f"projects/{project}/global/instanceTemplates/{name}")
        return template

    def _template_url(self, template: _Template) -> str:
        return f"{_scope_url(template.project, 'global')}/instanceTemplates/{template.name}"

    def _template_view(self, template: _Template) -> JSON:
        return {
            **template.body,
            "kind": "compute#instanceTemplate",
            "id": str(template.id),
            "name": template.name,
            "creationTimestamp": _stamp(template.created_at),
            "selfLink": self._template_url(template),
        }

    # ------------------------------------------------------------------ managed instance groups

    @_settled
    def insert_instance_group_manager(self, project: str, zone: str, body: JSON) -> JSON:
        name = _name(body.get("name"), "instance group manager name")
        store = self._project(project).migs
        if (zone, name) in store:
            raise CloudError.already_exists(
                self._path(project, zone, "instanceGroupManagers", name)
            )
        template_ref = _get(body, "instanceTemplate")
        if (
            not isinstance(template_ref, str)
            or _last(template_ref) not in self._project(project).templates
        ):
            raise CloudError.invalid(
                f"Invalid value for field 'resource.instanceTemplate': {template_ref!r}: "
                "no such global instance template in this project"
            )
        if _int(_get(body, "targetSize") or 0, "targetSize") != 0:
            raise CloudError.invalid(
                "The emulator supports only targetSize 0: capacity is added by resize requests"
            )
        base_name = _get(body, "baseInstanceName") or name
        mig = _Mig(
            project,
            zone,
            name,
            self._new_id(),
            self.clock.now(),
            body,
            template=_last(template_ref),
            base_name=_name(base_name, "baseInstanceName"),
        )
        store[(zone, name)] = mig
        return self._operation(mig, "insert", self._mig_url(mig))

    @_settled
    def get_instance_group_manager(self, project: str, zone: str, name: str) -> JSON:
        return self._mig_view(self._mig(project, zone, name))

    @_settled
    def list_instance_group_managers(self, project: str, zone: str) -> list[JSON]:
        migs = [m for m in self._project(project).migs.values() if m.zone == zone]
        return [self._mig_view(m) for m in sorted(migs, key=_by_name)]

    @_settled
    def delete_instance_group_manager(self, project: str, zone: str, name: str) -> JSON:
        """Delete a MIG with its VMs (returning their stock) and its resize requests."""
        mig = self._mig(project, zone, name)
        state = self._project(project)
        for instance in self._mig_instances(mig):
            self._remove_instance(instance)
        for key, request in list(state.resize_requests.items()):
            if key[:2] == (zone, name):
                request.alive = False
                del state.resize_requests[key]
        mig.alive = False
        del state.migs[(zone, name)]
        return self._operation(mig, "delete", self._mig_url(mig))

    @_settled
    def list_managed_instances(self, project: str, zone: str, name: str) -> list[JSON]:
        mig = self._mig(project, zone, name)
        return [
            {
                "instance": self._instance_url(instance),
                "id": str(instance.id),
                "name": instance.name,
                "instanceStatus": instance.status,
                "currentAction": "NONE" if instance.status == "RUNNING" else "CREATING",
            }
            for instance in self._mig_instances(mig)
        ]

    @_settled
    def delete_managed_instances(self, project: str, zone: str, name: str, body: JSON) -> JSON:
        """Delete the named VMs of a MIG, returning their stock. Names not in the MIG are an
        error (nothing is deleted) unless ``skipInstancesOnValidationError`` is true."""
        mig = self._mig(project, zone, name)
        references = _get(body, "instances") or []
        if not isinstance(references, list) or not all(isinstance(r, str) for r in references):
            raise CloudError.invalid("'instances' must be a list of instance URLs or names")
        members = {i.name: i for i in self._mig_instances(mig)}
        unknown = [r for r in references if _last(r) not in members]
        if unknown and not _get(body, "skipInstancesOnValidationError"):
            raise CloudError.invalid(
                f"Instances {', '.join(unknown)} are not members of instance group manager "
                f"'{self._mig_url(mig)}'"
            )
        for reference in references:
            instance = members.pop(_last(reference), None)
            if instance is not None:
                self._remove_instance(instance)
        return self._operation(
            mig, "compute.instanceGroupManagers.deleteInstances", self._mig_url(mig)
        )

    def _mig(self, project: str, zone: str, name: str) -> _Mig:
        mig = self._project(project).migs.get((zone, name))
        if mig is None:
            raise CloudError.not_found(self._path(project, zone, "instanceGroupManagers", name))
        return mig

    def _mig_instances(self, mig: _Mig) -> list[_Instance]:
        instances = self._project(mig.project).instances.values()
        members = [i for i in instances if i.zone == mig.zone and i.mig == mig.name]
        return sorted(members, key=_by_name)

    def _mig_url(self, mig: _Mig) -> str:
        return f"{_scope_url(mig.project, mig.zone)}/instanceGroupManagers/{mig.name}"

    def _mig_view(self, mig: _Mig) -> JSON:
        members = self._mig_instances(mig)
        creating = sum(1 for i in members if i.status != "RUNNING")
        return {
            **mig.body,
            "kind": "compute#instanceGroupManager",
            "id": str(mig.id),
            "name": mig.name,
            "zone": _scope_url(mig.project, mig.zone),
            "creationTimestamp": _stamp(mig.created_at),
            "selfLink": self._mig_url(mig),
            "instanceTemplate": f"{_scope_url(mig.project, 'global')}/instanceTemplates/"
            f"{mig.template}",
            "instanceGroup": f"{_scope_url(mig.project, mig.zone)}/instanceGroups/{mig.name}",
            "baseInstanceName": mig.base_name,
            "targetSize": len(members),
            "currentActions": {"none": len(members) - creating, "creating": creating},
            "status": {"isStable": creating == 0},
        }

    # ------------------------------------------------------------------ resize requests

    @_settled
    def insert_resize_request(self, project: str, zone: str, mig_name: str, body: JSON) -> JSON:
        """Accept a flex-start resize request (``ACCEPTED``); it is decided at creation +
        latency: ``SUCCEEDED`` with its VMs running, ``FAILED``, or (hang) never."""
        mig = self._mig(project, zone, mig_name)
        name = _name(body.get("name"), "resize request name")
        state = self._project(project)
        if (zone, mig_name, name) in state.resize_requests:
            raise CloudError.already_exists(self._resize_path(project, zone, mig_name, name))
        names = self._requested_names(project, zone, body)
        resize_by = _int(_get(body, "resizeBy") or 0, "resizeBy")
        if names and resize_by and resize_by != len(names):
            raise CloudError.invalid(
                f"resizeBy ({resize_by}) must equal the number of instances ({len(names)})"
            )
        count = len(names) or resize_by
        if count <= 0:
            raise CloudError.invalid("A resize request needs resizeBy > 0 or a list of instances")
        run = _get(body, "requestedRunDuration")
        run_duration = None if run is None else _duration(run, "requestedRunDuration")
        if run_duration is not None and run_duration <= timedelta(0):
            raise CloudError.invalid("requestedRunDuration must be positive")
        request = _ResizeRequest(
            project,
            zone,
            name,
            self._new_id(),
            self.clock.now(),
            body,
            mig=mig_name,
            shape=state.templates[mig.template].machine_type,
            count=count,
            names=names,
            run_duration=run_duration,
        )
        state.resize_requests[(zone, mig_name, name)] = request
        self._created["resizeRequests"][name] += 1
        self._at(request.created_at + self._latency, functools.partial(self._decide, request))
        return self._operation(request, "insert", self._resize_url(request))

    @_settled
    def get_resize_request(self, project: str, zone: str, mig: str, name: str) -> JSON:
        return self._resize_view(self._resize_request(project, zone, mig, name))

    @_settled
    def list_resize_requests(self, project: str, zone: str, mig: str) -> list[JSON]:
        self._mig(project, zone, mig)
        requests = [
            r for k, r in self._project(project).resize_requests.items() if k[:2] == (zone, mig)
        ]
        return [self._resize_view(r) for r in sorted(requests, key=_by_name)]

    @_settled
    def cancel_resize_request(self, project: str, zone: str, mig: str, name: str) -> JSON:
        """Cancel a request that is still waiting (``CANCELLED``); a decided one cannot be."""
        request = self._resize_request(project, zone, mig, name)
        if request.state not in _PENDING_RESIZE:
            raise CloudError.not_ready(
                f"The resize request '{name}' is {request.state} and can no longer be cancelled"
            )
        request.state = "CANCELLED"
        return self._operation(request, "cancel", self._resize_url(request))

    @_settled
    def delete_resize_request(self, project: str, zone: str, mig: str, name: str) -> JSON:
        """Delete a decided request. Its VMs stay: deleting VMs is a separate call, as in GCE."""
        request = self._resize_request(project, zone, mig, name)
        if request.state in _PENDING_RESIZE:
            raise CloudError.not_ready(
                f"The resize request '{name}' is {request.state}: cancel it before deleting it"
            )
        request.alive = False
        del self._project(project).resize_requests[(zone, mig, name)]
        return self._operation(request, "delete", self._resize_url(request))

    def _requested_names(self, project: str, zone: str, body: JSON) -> list[str]:
        entries = _get(body, "instances") or []
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise CloudError.invalid("'instances' must be a list of {\"name\": ...} objects")
        names = [_name(entry.get("name"), "instance name") for entry in entries]
        if len(set(names)) != len(names):
            raise CloudError.invalid("The instance names of a resize request must be distinct")
        taken = [n for n in names if (zone, n) in self._project(project).instances]
        if taken:
            raise CloudError.invalid(f"Instances already exist in zone {zone}: {', '.join(taken)}")
        return names

    def _decide(self, request: _ResizeRequest, when: datetime) -> None:
        if not request.alive or request.state not in _PENDING_RESIZE:
            return
        instances = self._project(request.project).instances
        names = request.names or self._generated_names(request)
        if any((request.zone, n) in instances for n in names):
            request.state = "FAILED"
            request.errors = [
                {"code": "RESOURCE_ALREADY_EXISTS", "message": "An instance name is taken"}
            ]
            return
        outcome = self._provision(request.zone, request.shape, request.count)
        if outcome == "hang":
            return
        if outcome != "ok":
            request.state = "FAILED"
            code, message = _compute_failure(outcome, request.project, request.zone)
            request.errors = [{"code": code, "message": message}]
            return
        mig = self._project(request.project).migs[(request.zone, request.mig)]
        for name in names:
            instance = self._add_instance(
                mig.project, mig.zone, name, request.shape, when, {}, mig=mig.name
            )
            instance.status = "RUNNING"
            instance.holds_stock = True
            if request.run_duration is not None:
                self._at(when + request.run_duration, functools.partial(self._expire, instance))
        request.state = "SUCCEEDED"

    def _generated_names(self, request: _ResizeRequest) -> list[str]:
        base = self._project(request.project).migs[(request.zone, request.mig)].base_name
        instances = self._project(request.project).instances
        names: list[str] = []
        while len(names) < request.count:
            suffix = "".join(self._random.choices("abcdefghijklmnopqrstuvwxyz", k=4))
            candidate = f"{base}-{suffix}"
            if (request.zone, candidate) not in instances and candidate not in names:
                names.append(candidate)
        return names

    def _resize_request(self, project: str, zone: str, mig: str, name: str) -> _ResizeRequest:
        self._mig(project, zone, mig)
        request = self._project(project).resize_requests.get((zone, mig, name))
        if request is None:
            raise CloudError.not_found(self._resize_path(project, zone, mig, name))
        return request

    def _resize_path(self, project: str, zone: str, mig: str, name: str) -> str:
        return self._path(project, zone, "instanceGroupManagers", mig) + f"/resizeRequests/{name}"

    def _resize_url(self, request: _ResizeRequest) -> str:
        return f"{COMPUTE_BASE}/" + self._resize_path(
            request.project, request.zone, request.mig, request.name
        )

    def _resize_view(self, request: _ResizeRequest) -> JSON:
        status: JSON = {}
        if request.errors:
            status = {
                "error": {"errors": list(request.errors)},
                "lastAttempt": {"error": {"errors": list(request.errors)}},
            }
        return {
            **request.body,
            "kind": "compute#instanceGroupManagerResizeRequest",
            "id": str(request.id),
            "name": request.name,
            "zone": _scope_url(request.project, request.zone),
            "creationTimestamp": _stamp(request.created_at),
            "selfLink": self._resize_url(request),
            "resizeBy": request.count,
            "state": request.state,
            "status": status,
        }

    # ------------------------------------------------------------------ instances

    @_settled
    def insert_instance(self, project: str, zone: str, body: JSON) -> JSON:
        """Insert a VM: from a specific reservation (its free count) or from stock. It is
        ``PROVISIONING`` until insert + latency, then ``RUNNING``. No capacity → the operation
        fails with ``ZONE_RESOURCE_POOL_EXHAUSTED`` and no VM exists."""
        name = _name(body.get("name"), "instance name")
        state = self._project(project)
        if (zone, name) in state.instances:
            raise CloudError.already_exists(self._path(project, zone, "instances", name))
        machine_type = _get(body, "machineType")
        if not isinstance(machine_type, str) or not machine_type:
            raise CloudError.invalid("Invalid value for field 'resource.machineType'")
        shape = _last(machine_type)
        now = self.clock.now()
        reservation = self._consumed_reservation(project, zone, body, shape)
        probe = _Record(project, zone, name, 0, now, body)
        target = f"{COMPUTE_BASE}/{self._path(project, zone, 'instances', name)}"
        if reservation is not None:
            if self._in_use(reservation) >= reservation.count:
                message = (
                    f"The reservation '{reservation.name}' has no free capacity for "
                    f"{shape} (all {reservation.count} in use)"
                )
                return self._operation(probe, "insert", target, error=(503, STOCKOUT, message))
            outcome = "ok"
        else:
            outcome = self._provision(zone, shape, 1)
            if outcome in ("stockout", "error"):
                code, message = _compute_failure(outcome, project, zone)
                return self._operation(probe, "insert", target, error=(503, code, message))
        instance = self._add_instance(project, zone, name, shape, now, body)
        instance.reservation = None if reservation is None else reservation.name
        instance.holds_stock = reservation is None and outcome == "ok"
        if outcome == "ok":
            self._at(now + self._latency, functools.partial(self._start_instance, instance))
            run = _get(_get(body, "scheduling") or {}, "maxRunDuration")
            if run is not None:
                ends = now + self._latency + _duration(run, "scheduling.maxRunDuration")
                self._at(ends, functools.partial(self._expire, instance))
        return self._operation(instance, "insert", self._instance_url(instance))

    @_settled
    def get_instance(self, project: str, zone: str, name: str) -> JSON:
        return self._instance_view(self._instance(project, zone, name))

    @_settled
    def list_instances(self, project: str, zone: str) -> list[JSON]:
        instances = [i for i in self._project(project).instances.values() if i.zone == zone]
        return [self._instance_view(i) for i in sorted(instances, key=_by_name)]

    @_settled
    def delete_instance(self, project: str, zone: str, name: str) -> JSON:
        """Delete a VM, returning its unit to stock (or to the reservation it consumed)."""
        instance = self._instance(project, zone, name)
        self._remove_instance(instance)
        return self._operation(instance, "delete", self._instance_url(instance))

    def _add_instance(
        self,
        project: str,
        zone: str,
        name: str,
        shape: str,
        when: datetime,
        body: JSON,
        *,
        mig: str | None = None,
    ) -> _Instance:
        instance = _Instance(project, zone, name, self._new_id(), when, body, shape=shape, mig=mig)
        self._project(project).instances[(zone, name)] = instance
        self._created["instances"][name] += 1
        return instance

    def _remove_instance(self, instance: _Instance) -> None:
        if not instance.alive:
            return
        instance.alive = False
        del self._project(instance.project).instances[(instance.zone, instance.name)]
        if instance.holds_stock:
            instance.holds_stock = False
            self._give_back(instance.zone, instance.shape, 1)

    def _start_instance(self, instance: _Instance, when: datetime) -> None:
        if instance.alive and instance.status == "PROVISIONING":
            instance.status = "RUNNING"

    def _expire(self, instance: _Instance, when: datetime) -> None:
        """The end of a VM's run time (flex-start ``instanceTerminationAction=DELETE``)."""
        if instance.alive:
            self._counters["auto_deleted"] += 1
            self._remove_instance(instance)

    def _consumed_reservation(
        self, project: str, zone: str, body: JSON, shape: str
    ) -> _FutureReservation | None:
        affinity = _get(body, "reservationAffinity") or {}
        if _get(affinity, "consumeReservationType") != "SPECIFIC_RESERVATION":
            return None
        values = _get(affinity, "values") or []
        if not isinstance(values, list) or len(values) != 1 or not isinstance(values[0], str):
            raise CloudError.invalid("A specific reservation affinity needs exactly one value")
        name = _last(values[0])
        reservation = self._project(project).future_reservations.get((zone, name))
        if reservation is None or not reservation.reservation_live:
            raise CloudError.invalid(
                f"Specified reservation '{self._path(project, zone, 'reservations', name)}' "
                "does not exist"
            )
        if reservation.shape != shape:
            raise CloudError.invalid(
                f"Machine type {shape} does not match reservation '{name}' ({reservation.shape})"
            )
        return reservation

    def _instance(self, project: str, zone: str, name: str) -> _Instance:
        instance = self._project(project).instances.get((zone, name))
        if instance is None:
            raise CloudError.not_found(self._path(project, zone, "instances", name))
        return instance

    def _instance_url(self, instance: _Instance) -> str:
        return f"{_scope_url(instance.project, instance.zone)}/instances/{instance.name}"

    def _instance_view(self, instance: _Instance) -> JSON:
        zone_url = _scope_url(instance.project, instance.zone)
        view: JSON = {
            **instance.body,
            "kind": "compute#instance",
            "id": str(instance.id),
            "name": instance.name,
            "zone": zone_url,
            "machineType": f"{zone_url}/machineTypes/{instance.shape}",
            "status": instance.status,
            "creationTimestamp": _stamp(instance.created_at),
            "selfLink": self._instance_url(instance),
        }
        if instance.mig is not None:
            creator = f"{zone_url}/instanceGroupManagers/{instance.mig}"
            view["metadata"] = {"items": [{"key": "created-by", "value": creator}]}
        return view

    # ------------------------------------------------------------------ future reservations

    @_settled
    def insert_future_reservation(self, project: str, zone: str, body: JSON) -> JSON:
        """Book a calendar block. It is approved when its units are free now, counting those
        promised to other approved blocks whose windows overlap its own; otherwise the
        operation fails with ``ZONE_RESOURCE_POOL_EXHAUSTED`` and nothing is created. Its units
        are taken from stock at ``startTime`` (at once if that has come) and held until its end
        or its deletion; from then a reservation of the same name exists for instances to
        consume. A block whose units are gone by its start fails (procurement ``FAILED``)."""
        name = _name(body.get("name"), "future reservation name")
        state = self._project(project)
        if (zone, name) in state.future_reservations:
            raise CloudError.already_exists(self._path(project, zone, "futureReservations", name))
        sku = _get(body, "specificSkuProperties") or {}
        count = _int(_get(sku, "totalCount") or 0, "specificSkuProperties.totalCount")
        machine_type = _get(_get(sku, "instanceProperties") or {}, "machineType")
        if count <= 0 or not isinstance(machine_type, str) or not machine_type:
            raise CloudError.invalid(
                "specificSkuProperties needs totalCount > 0 and instanceProperties.machineType"
            )
        start, end = _window(_get(body, "timeWindow"))
        now = self.clock.now()
        record = _FutureReservation(
            project,
            zone,
            name,
            self._new_id(),
            now,
            body,
            shape=_last(machine_type),
            count=count,
            start=start,
            end=end,
            auto_delete=_get(body, "autoDeleteAutoCreatedReservations") is not False,
        )
        target = f"{COMPUTE_BASE}/{self._path(project, zone, 'futureReservations', name)}"
        outcome = (
            self._approve(record) if start > now else self._provision(zone, record.shape, count)
        )
        if outcome in ("stockout", "error"):
            code, message = _compute_failure(outcome, project, zone)
            return self._operation(record, "insert", target, error=(503, code, message))
        state.future_reservations[(zone, name)] = record
        self._created["futureReservations"][name] += 1
        if outcome == "hang":
            record.procurement = "PENDING_APPROVAL"
        else:
            record.holds_stock = start <= now  # a future block takes its units at its start
            self._at(start, functools.partial(self._begin_block, record))
            self._at(end, functools.partial(self._end_block, record))
        return self._operation(record, "insert", target)

    @_settled
    def get_future_reservation(self, project: str, zone: str, name: str) -> JSON:
        return self._future_view(self._future(project, zone, name))

    @_settled
    def list_future_reservations(self, project: str, zone: str) -> list[JSON]:
        records = [f for f in self._project(project).future_reservations.values() if f.zone == zone]
        return [self._future_view(f) for f in sorted(records, key=_by_name)]

    @_settled
    def cancel_future_reservation(self, project: str, zone: str, name: str) -> JSON:
        """Cancel a block: ``CANCELLED``, its reservation and VMs deleted, its units returned."""
        record = self._future(project, zone, name)
        self._release_block(record)
        record.procurement = "CANCELLED"
        return self._operation(record, "cancel", self._future_url(record))

    @_settled
    def delete_future_reservation(self, project: str, zone: str, name: str) -> JSON:
        """Delete a block; early, its reservation and the VMs consuming it go with it."""
        record = self._future(project, zone, name)
        self._release_block(record)
        record.alive = False
        del self._project(project).future_reservations[(zone, name)]
        return self._operation(record, "delete", self._future_url(record))

    @_settled
    def get_reservation(self, project: str, zone: str, name: str) -> JSON:
        record = self._project(project).future_reservations.get((zone, name))
        if record is None or not record.reservation_live:
            raise CloudError.not_found(self._path(project, zone, "reservations", name))
        return self._reservation_view(record)

    @_settled
    def list_reservations(self, project: str, zone: str) -> list[JSON]:
        records = [
            f
            for f in self._project(project).future_reservations.values()
            if f.zone == zone and f.reservation_live
        ]
        return [self._reservation_view(f) for f in sorted(records, key=_by_name)]

    def _approve(self, record: _FutureReservation) -> str:
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

    def _begin_block(self, record: _FutureReservation, when: datetime) -> None:
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

    def _end_block(self, record: _FutureReservation, when: datetime) -> None:
        # Without auto-delete the reservation outlives the window, as in GCE, until deleted.
        if record.alive and record.auto_delete and record.holds_stock:
            self._release_block(record)

    def _release_block(self, record: _FutureReservation) -> None:
        for instance in self._consumers(record):
            self._remove_instance(instance)
        record.reservation_id = None
        if record.holds_stock:
            record.holds_stock = False
            self._give_back(record.zone, record.shape, record.count)

    def _consumers(self, record: _FutureReservation) -> list[_Instance]:
        instances = self._project(record.project).instances.values()
        return [i for i in instances if i.zone == record.zone and i.reservation == record.name]

    def _in_use(self, record: _FutureReservation) -> int:
        return len(self._consumers(record))

    def _future(self, project: str, zone: str, name: str) -> _FutureReservation:
        record = self._project(project).future_reservations.get((zone, name))
        if record is None:
            raise CloudError.not_found(self._path(project, zone, "futureReservations", name))
        return record

    def _future_url(self, record: _FutureReservation) -> str:
        return f"{_scope_url(record.project, record.zone)}/futureReservations/{record.name}"

    def _reservation_url(self, record: _FutureReservation) -> str:
        return f"{_scope_url(record.project, record.zone)}/reservations/{record.name}"

    def _future_view(self, record: _FutureReservation) -> JSON:
        status: JSON = {"procurementStatus": record.procurement}
        if record.reservation_live:
            status["autoCreatedReservations"] = [self._reservation_url(record)]
            status["fulfilledCount"] = str(record.count)
        return {
            **record.body,
            "kind": "compute#futureReservation",
            "id": str(record.id),
            "name": record.name,
            "zone": _scope_url(record.project, record.zone),
            "creationTimestamp": _stamp(record.created_at),
            "selfLink": self._future_url(record),
            "status": status,
        }

    def _reservation_view(self, record: _FutureReservation) -> JSON:
        return {
            "kind": "compute#reservation",
            "id": str(record.reservation_id),
            "name": record.name,
            "zone": _scope_url(record.project, record.zone),
            "creationTimestamp": _stamp(record.start),
            "selfLink": self._reservation_url(record),
            "specificReservationRequired": True,
            "status": "READY",
            "specificReservation": {
                "count": str(record.count),
                "inUseCount": str(self._in_use(record)),
                "assuredCount": str(record.count),
                "instanceProperties": {"machineType": record.shape},
            },
        }

    # ------------------------------------------------------------------ TPU queued resources

    @_settled
    def create_queued_resource(self, project: str, zone: str, name: str, body: JSON) -> JSON:
        """Accept a queued resource (``ACCEPTED``); decided at creation + latency (or its
        ``validAfter``): ``ACTIVE`` holding its chips, ``FAILED``, or (hang)
        ``WAITING_FOR_RESOURCES``; ``FAILED`` when ``validUntil`` passes while waiting.
        Returns a finished google.longrunning Operation."""
        qr_path = f"projects/{project}/locations/{zone}/queuedResources/{name}"
        if not name:
            raise CloudError.invalid("queuedResourceId is required")
        _name(name, "queuedResourceId")
        state = self._project(project)
        if (zone, name) in state.queued_resources:
            raise CloudError(409, "alreadyExists", f"Resource '{qr_path}' already exists")
        shape, chips = _tpu_request(body)
        now = self.clock.now()
        valid_after, valid_until = _queueing(_get(body, "queueingPolicy") or {}, now)
        record = _QueuedResource(
            project, zone, name, self._new_id(), now, body, shape=shape, chips=chips
        )
        record.valid_until = valid_until
        state.queued_resources[(zone, name)] = record
        self._created["queuedResources"][name] += 1
        decide_at = max(now + self._latency, valid_after or now)
        self._at(decide_at, functools.partial(self._decide_queued, record))
        if valid_until is not None:
            self._at(valid_until, functools.partial(self._expire_queued, record))
        response = {
            "@type": "type.googleapis.com/google.cloud.tpu.v2.QueuedResource",
            **self._queued_view(record),
        }
        return self._tpu_operation(project, zone, qr_path, "create", response)

    @_settled
    def get_queued_resource(self, project: str, zone: str, name: str) -> JSON:
        return self._queued_view(self._queued(project, zone, name))

    @_settled
    def list_queued_resources(self, project: str, zone: str) -> list[JSON]:
        records = [q for q in self._project(project).queued_resources.values() if q.zone == zone]
        return [self._queued_view(q) for q in sorted(records, key=_by_name)]

    @_settled
    def delete_queued_resource(self, project: str, zone: str, name: str, force: bool) -> JSON:
        """Delete a queued resource, returning its chips. Without ``force`` only a ``FAILED`` or
        ``SUSPENDED`` one can be deleted."""
        record = self._queued(project, zone, name)
        if not force and record.state not in ("FAILED", "SUSPENDED"):
            raise CloudError(
                400,
                "failedPrecondition",
                f"Queued resource '{name}' is {record.state}: only FAILED or SUSPENDED queued "
                "resources can be deleted without force",
            )
        if record.holds_stock:
            record.holds_stock = False
            self._give_back(zone, record.shape, record.chips)
        record.alive = False
        del self._project(project).queued_resources[(zone, name)]
        qr_path = f"projects/{project}/locations/{zone}/queuedResources/{name}"
        response = {"@type": "type.googleapis.com/google.protobuf.Empty"}
        return self._tpu_operation(project, zone, qr_path, "delete", response)

    @_settled
    def get_tpu_operation(self, project: str, zone: str, name: str) -> JSON:
        operation = self._project(project).tpu_operations.get((zone, name))
        if operation is None:
            raise CloudError.not_found(f"projects/{project}/locations/{zone}/operations/{name}")
        return operation

    def _decide_queued(self, record: _QueuedResource, when: datetime) -> None:
        if not record.alive or record.state not in _WAITING_QUEUED:
            return
        if record.valid_until is not None and when >= record.valid_until:
            return  # the expiry event fails it
        outcome = self._provision(record.zone, record.shape, record.chips)
        if outcome == "hang":
            record.state = "WAITING_FOR_RESOURCES"
        elif outcome == "ok":
            record.state = "ACTIVE"
            record.holds_stock = True
        elif outcome == "stockout":
            record.state = "FAILED"
            record.failed = {
                "code": RPC_RESOURCE_EXHAUSTED,
                "message": f'There is no more capacity in the zone "{record.zone}"; you can '
                f"try in another zone where Cloud TPU Nodes are offered ({STOCKOUT})",
            }
        else:
            record.state = "FAILED"
            record.failed = {
                "code": RPC_INTERNAL,
                "message": f"An internal error occurred while provisioning ({RATE_EXCEEDED})",
            }

    def _expire_queued(self, record: _QueuedResource, when: datetime) -> None:
        if record.alive and record.state in _WAITING_QUEUED:
            self._counters["expired"] += 1
            record.state = "FAILED"
            record.failed = {
                "code": RPC_DEADLINE_EXCEEDED,
                "message": "The queueing policy's validUntil time passed before the resources "
                "were available",
            }

    def _tpu_operation(
        self, project: str, zone: str, target: str, verb: str, response: JSON
    ) -> JSON:
        now = self.clock.now()
        name = f"operation-{int(now.timestamp() * 1000)}-{self._new_id():x}"
        operation: JSON = {
            "name": f"projects/{project}/locations/{zone}/operations/{name}",
            "metadata": {
                "@type": "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata",
                "createTime": _rfc3339(now),
                "endTime": _rfc3339(now),
                "target": target,
                "verb": verb,
                "apiVersion": "v2",
            },
            "done": True,
            "response": response,
        }
        self._project(project).tpu_operations[(zone, name)] = operation
        return operation

    def _queued(self, project: str, zone: str, name: str) -> _QueuedResource:
        record = self._project(project).queued_resources.get((zone, name))
        if record is None:
            raise CloudError.not_found(
                f"projects/{project}/locations/{zone}/queuedResources/{name}"
            )
        return record

    def _queued_view(self, record: _QueuedResource) -> JSON:
        state: JSON = {"state": record.state}
        if record.failed is not None:
            state["failedData"] = {"error": dict(record.failed)}
        return {
            **record.body,
            "name": f"projects/{record.project}/locations/{record.zone}/queuedResources/"
            f"{record.name}",
            "createTime": _rfc3339(record.created_at),
            "state": state,
        }

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _path(project: str, zone: str, collection: str, name: str) -> str:
        return f"projects/{project}/zones/{zone}/{collection}/{name}"


_HTTP_MESSAGES = {400: "BAD REQUEST", 409: "CONFLICT", 503: "SERVICE UNAVAILABLE"}


def _compute_failure(outcome: str, project: str, zone: str) -> tuple[str, str]:
    """The Compute error (code, message) of a failed provisioning outcome."""
    if outcome == "stockout":
        return (
            STOCKOUT,
            f"The zone 'projects/{project}/zones/{zone}' does not have enough resources "
            "available to fulfill the request.  Try a different zone, or try again later.",
        )
    return RATE_EXCEEDED, "Operation rate exceeded for resource; try again later."


def _tpu_request(body: JSON) -> tuple[str, int]:
    """The (AcceleratorConfig type name, chips) a queued resource asks for, over all its node
    specs (a multislice node spec counts ``nodeCount`` slices)."""
    tpu = _get(body, "tpu") or {}
    specs = _get(tpu, "nodeSpec") if isinstance(tpu, dict) else None
    if not isinstance(specs, list) or not specs:
        raise CloudError.invalid("A queued resource needs tpu.nodeSpec with at least one node")
    shapes: set[str] = set()
    chips = 0
    for spec in specs:
        node = _get(spec, "node") if isinstance(spec, dict) else None
        if not isinstance(node, dict):
            raise CloudError.invalid("Every tpu.nodeSpec entry needs a node")
        shape, slice_chips = _tpu_node(node)
        multislice = _get(spec, "multisliceParams") or {}
        slices = _int(_get(multislice, "nodeCount") or 1, "multisliceParams.nodeCount")
        shapes.add(shape)
        chips += slice_chips * slices
    if len(shapes) != 1:
        raise CloudError.invalid("All node specs of a queued resource must use one TPU type")
    return shapes.pop(), chips


def _tpu_node(node: JSON) -> tuple[str, int]:
    config = _get(node, "acceleratorConfig")
    if isinstance(config, dict):
        kind = _get(config, "type")
        shape = _TPU_TYPE_NUMBERS.get(kind, "") if isinstance(kind, int) else str(kind or "")
        if shape not in _TPU_TYPE_NUMBERS.values():
            raise CloudError.invalid(f"Unsupported acceleratorConfig.type {kind!r}")
        topology = str(_get(config, "topology") or "")
        if not re.fullmatch(r"\d+(x\d+)*", topology):
            raise CloudError.invalid(f"Invalid acceleratorConfig.topology {topology!r}")
        return shape, functools.reduce(lambda a, b: a * b, map(int, topology.split("x")))
    accelerator = _get(node, "acceleratorType")
    match = re.fullmatch(r"([a-z0-9]+)-(\d+)", accelerator or "")
    if match is None or match.group(1) not in _TPU_FAMILIES:
        raise CloudError.invalid(
            f"Unsupported node: needs acceleratorConfig or a known acceleratorType, not "
            f"{accelerator!r}"
        )
    shape, cores_per_chip = _TPU_FAMILIES[match.group(1)]
    return shape, max(1, int(match.group(2)) // cores_per_chip)


def _queueing(policy: JSON, now: datetime) -> tuple[datetime | None, datetime | None]:
    """(valid after, valid until) of a TPU queueing policy."""
    after: datetime | None = None
    until: datetime | None = None
    if _get(policy, "validAfterDuration") is not None:
        after = now + _duration(_get(policy, "validAfterDuration"), "validAfterDuration")
    if _get(policy, "validAfterTime") is not None:
        after = _timestamp(_get(policy, "validAfterTime"), "validAfterTime")
    if _get(policy, "validUntilDuration") is not None:
        until = now + _duration(_get(policy, "validUntilDuration"), "validUntilDuration")
    if _get(policy, "validUntilTime") is not None:
        until = _timestamp(_get(policy, "validUntilTime"), "validUntilTime")
    interval = _get(policy, "validInterval")
    if isinstance(interval, dict):
        if _get(interval, "startTime") is not None:
            after = _timestamp(_get(interval, "startTime"), "validInterval.startTime")
        if _get(interval, "endTime") is not None:
            until = _timestamp(_get(interval, "endTime"), "validInterval.endTime")
    return after, until


def _window(window: object) -> tuple[datetime, datetime]:
    """(start, end) of a future reservation's timeWindow (an end time or a duration)."""
    if not isinstance(window, dict) or _get(window, "startTime") is None:
        raise CloudError.invalid("timeWindow.startTime is required")
    start = _timestamp(_get(window, "startTime"), "timeWindow.startTime")
    if _get(window, "endTime") is not None:
        end = _timestamp(_get(window, "endTime"), "timeWindow.endTime")
    elif _get(window, "duration") is not None:
        end = start + _duration(_get(window, "duration"), "timeWindow.duration")
    else:
        raise CloudError.invalid("timeWindow needs endTime or duration")
    if end <= start:
        raise CloudError.invalid("timeWindow must end after it starts")
    return start, end


def _get(body: object, camel: str) -> Any:
    """A field of a request object, by its camelCase or its snake_case name."""
    if not isinstance(body, dict):
        return None
    if camel in body:
        return body[camel]
    return body.get(re.sub(r"([A-Z])", r"_\1", camel).lower())


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise CloudError.invalid(
            f"Invalid value for {what}: {value!r} (must match [a-z]([-a-z0-9]*[a-z0-9])?, "
            "at most 63 characters)"
        )
    return value


def _nonempty(value: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, not {value!r}")
    return value


def _int(value: object, what: str) -> int:
    """An integer field; int64 fields arrive as strings of digits in JSON."""
    if isinstance(value, bool):
        raise CloudError.invalid(f"{what} must be an integer, not {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value):
        return int(value)
    raise CloudError.invalid(f"{what} must be an integer, not {value!r}")


def _duration(value: object, what: str) -> timedelta:
    """A protobuf Duration: ``"3600s"`` (JSON form), ``{"seconds": ..., "nanos": ...}`` (Compute's
    Duration message) or a number of seconds."""
    if isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?s", value):
        return timedelta(seconds=float(value[:-1]))
    if isinstance(value, dict):
        seconds = _int(value.get("seconds", 0), f"{what}.seconds")
        nanos = _int(value.get("nanos", 0), f"{what}.nanos")
        return timedelta(seconds=seconds, microseconds=nanos // 1000)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    raise CloudError.invalid(f"{what} must be a duration, not {value!r}")


def _timestamp(value: object, what: str) -> datetime:
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if moment.tzinfo is not None:
                return moment.astimezone(UTC)
    raise CloudError.invalid(f"{what} must be an RFC 3339 time with an offset, not {value!r}")


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError(f"a simulated time must be timezone-aware, not {moment!r}")
    return moment.astimezone(UTC)


def _stamp(moment: datetime) -> str:
    """Compute's creationTimestamp form: RFC 3339 with milliseconds and an offset."""
    return moment.isoformat(timespec="milliseconds")


def _rfc3339(moment: datetime) -> str:
    """A protobuf Timestamp in JSON: RFC 3339 in UTC with a ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _last(reference: str) -> str:
    """The name at the end of a resource URL or partial path."""
    return reference.rstrip("/").rsplit("/", 1)[-1]


def _scope_path(scope: str) -> str:
    return "global" if scope == "global" else f"zones/{scope}"


def _scope_url(project: str, scope: str) -> str:
    return f"{COMPUTE_BASE}/projects/{project}/{_scope_path(scope)}"


def _by_name(record: _Record) -> str:
    return record.name
