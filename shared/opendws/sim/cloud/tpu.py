"""Cloud TPU queued resources, over the REST ``v2`` and ``v2alpha1`` APIs.

Google's behaviour, as modelled (tpu/docs/queued-resources; tpu/docs/request-using-flex-start;
the ``v2alpha1`` discovery document):
- Every queued resource — guaranteed, spot or flex-start — waits in ``WAITING_FOR_RESOURCES``
  (which replaced ``ACCEPTED``) in Google's queue of its zone and TPU type "until there are
  sufficient free resources ... or the allocation interval elapses": a stockout never fails it.
  When its ``validUntil`` passes unserved it goes ``FAILED`` and "remains in the queue until it is
  explicitly deleted". Served, it is ``ACTIVE`` holding its chips.
- Flex-start exists only in ``v2alpha1``: ``provisioningModel=FLEX_START`` with
  ``runDuration{maxRunDuration | terminationTime}`` (at most 7 days), documented for v6e and v5e
  only; other generations are refused. At the end of its run duration the service deletes its
  TPU VMs: the queued resource is ``SUSPENDED`` ("the resources specified in the request have
  been deleted"), ``stateInitiator=SERVICE``, and its chips are free again. The ``v2`` message
  has neither field: there they are unknown names, refused (400).
- Without ``force`` only a ``FAILED`` or ``SUSPENDED`` queued resource can be deleted.
- A queued resource naming ``reservationName: projects/P/locations/Z/reservations/R``
  consumes that reservation (tpu/docs/calendar-mode-reservation: a calendar block is consumed
  "by provisioning TPUs using ... the Queued Resources API"; tpu/docs/consume-reservation; the
  v2alpha1 REST reference: ``reservationName`` "Name of the reservation in which the resource
  should be provisioned", ``Guaranteed.reserved`` "Specifies the request should be scheduled
  on reserved capacity"). Every reservation here is a calendar block's, and "for future
  reservations created in calendar mode, you must also set the --provisioning-model flag to
  reservation-bound" (tpu/docs/consume-reservation): ``provisioningModel=RESERVATION_BOUND``,
  which only ``v2alpha1`` has; ``guaranteed.reserved`` alone is refused (400), and the ``v2``
  ``Guaranteed`` has no ``reserved`` (an unknown name, refused). It does not queue: if the
  reservation is live in its zone, of its TPU type, with its chips delivered and free, it takes
  them at once and is ``PROVISIONING``, then ``ACTIVE`` one provisioning latency later;
  otherwise it is ``FAILED`` at once, ``failedData`` saying why (an approved block's
  reservation exists, empty, until Google fills it from the block's start).
  When the reservation ends, Google deletes the TPUs consuming it; the queued resource goes
  with them (what is left of it is not documented).
- Its create and delete are long-running operations that are done after the world's operation
  latency: a created queued resource is there at once; a deleted one goes when the delete is
  done.
- **Nodes** (tpu/docs/reference/rest/v2/projects.locations.nodes, and the ``v2alpha1``
  equivalent; tpu/docs/queued-resources): a queued resource's nodes exist while it is
  ``ACTIVE`` — made when it becomes ``ACTIVE``, gone when it is deleted, ``SUSPENDED`` (the
  end of a flex-start run deletes the TPU VMs) or its reservation ends. A node spec names one
  node by ``nodeId`` (``^[A-Za-z0-9_.~+%-]+$``; when absent, the queued resource's id: Google
  does not say) or ``nodeCount`` (> 1) nodes by ``multisliceParams`` (``v2``) /
  ``multiNodeParams`` (``v2alpha1``) ``{nodeCount, nodeIdPrefix}``: "If node_count = 3 and
  node_id_prefix = "np", node ids of nodes created will be "np-0", "np-1", "np-2". If this
  field is not provided we use queued_resource_id as the node_id_prefix"; "It's an error to
  specify both node_id and multi_node_params". Each node is ``READY`` with one network
  endpoint (port 8470) per TPU VM ("worker"): ``catalog.tpu_hosts`` of its slice, addresses
  from the world's internal range as VMs get theirs. The node's ``metadata`` (map of string to
  string), ``labels`` (likewise) and ``serviceAccount`` (``{email, scope[]}``) are Google's
  ``Node`` fields: another JSON shape is refused (400), as is an unknown field name in
  ``serviceAccount``. A node whose spec names no ``serviceAccount`` shows none (the local VM
  host gives its workers the default account, as it does VMs).
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable
from datetime import datetime, timedelta

from opendws.catalog import (
    TPU_ACCELERATOR_OF_API_TYPE,
    TPU_API_TYPES,
    TPU_FLEX_START,
    tpu_hosts,
)
from opendws.sim.cloud.errors import CloudError
from opendws.sim.cloud.parsing import (
    JSON,
    bounded_duration,
    duration,
    get,
    integer,
    name,
    refuse_unknown,
    rfc3339,
    timestamp,
)
from opendws.sim.cloud.world import (
    STOCKOUT,
    FutureReservation,
    QueuedResource,
    TpuNode,
    World,
    by_name,
    settled,
)

API_VERSIONS = ("v2", "v2alpha1")
# Flex-start is documented for v6e and v5e only (catalog.TPU_FLEX_START).
FLEX_TYPES = tuple(sorted(TPU_API_TYPES[accelerator] for accelerator in TPU_FLEX_START))
MAX_RUN = timedelta(days=7)
PROVISIONING_MODELS = (
    "PROVISIONING_MODEL_UNSPECIFIED", "STANDARD", "SPOT", "RESERVATION_BOUND", "FLEX_START",
)  # fmt: skip

# google.rpc.Code values used in failedData errors.
RPC_DEADLINE_EXCEEDED = 4
RPC_RESOURCE_EXHAUSTED = 8
RPC_FAILED_PRECONDITION = 9
RPC_INTERNAL = 13

# TPU v2 AcceleratorConfig.Type: the TPU client sends enums as integers.
TPU_TYPE_NUMBERS = {2: "V2", 4: "V3", 7: "V4", 9: "V5LITE_POD", 10: "V5P", 11: "V6E"}
# acceleratorType prefixes ("v5litepod-16"): the type and how many TensorCores one chip has
# (the number in v2/v3/v4/v5p names counts cores, in v5litepod/v6e names it counts chips).
TPU_FAMILIES = {
    "v2": ("V2", 2),
    "v3": ("V3", 2),
    "v4": ("V4", 2),
    "v5p": ("V5P", 2),
    "v5litepod": ("V5LITE_POD", 1),
    "v6e": ("V6E", 1),
}
_FINISHED = ("FAILED", "SUSPENDED")
# A TPU VM's network endpoint port (Node.networkEndpoints[].port, as Google reports it).
TPU_ENDPOINT_PORT = 8470
_NODE_ID = re.compile(r"[A-Za-z0-9_.~+%-]+")
_ACCOUNT_FIELDS = ("email", "scope")


class TpuApi(World):
    """The queuedResources calls and TPU operations."""

    @settled
    def create_queued_resource(
        self, project: str, zone: str, name: str, body: JSON, api_version: str = "v2"
    ) -> JSON:
        """Accept a queued resource into Google's queue (``WAITING_FOR_RESOURCES``); it is
        tried no sooner than creation + the provisioning latency (or its ``validAfter``). One
        naming a reservation is placed on it at once, or fails (see the module docstring).
        Returns a google.longrunning Operation, done after the operation latency."""
        if api_version not in API_VERSIONS:
            raise ValueError(f"api_version must be one of {API_VERSIONS}, not {api_version!r}")
        qr_path = f"projects/{project}/locations/{zone}/queuedResources/{name}"
        if not name:
            raise CloudError.invalid("queuedResourceId is required")
        _qr_name(name)
        state = self._project(project)
        if (zone, name) in state.queued_resources:
            raise CloudError(409, "alreadyExists", f"Resource '{qr_path}' already exists")
        shape, chips = _tpu_request(body)
        _planned_nodes(body, name, api_version)
        now = self.clock.now()
        flex, run, termination = _provisioning(body, api_version, shape, now)
        reservation = _reservation_reference(body, api_version)
        valid_after, valid_until = _queueing(get(body, "queueingPolicy") or {}, now)
        record = QueuedResource(
            project, zone, name, self._new_id(), now, body, shape=shape, chips=chips,
            valid_until=valid_until, api_version=api_version, flex=flex, run_duration=run,
            termination_time=termination,
        )  # fmt: skip
        state.queued_resources[(zone, name)] = record
        self._created["queuedResources"][name] += 1
        if reservation is not None:
            self._place_on_reservation(record, *reservation)
        else:
            self._queue_for_chips(record, valid_after, valid_until, run)
        response = {
            "@type": f"type.googleapis.com/google.cloud.tpu.{api_version}.QueuedResource",
            **queued_view(record),
        }
        return self._tpu_operation(project, zone, qr_path, "create", response, api_version)

    def _queue_for_chips(
        self,
        record: QueuedResource,
        valid_after: datetime | None,
        valid_until: datetime | None,
        run: timedelta | None,
    ) -> None:
        """Put a queued resource in Google's queue of its zone and TPU type."""
        now = record.created_at
        self._enqueue(
            record, "queuedResource", record.shape, record.chips,
            max(now + self._latency, valid_after or now), run if record.flex else None,
            on_served=functools.partial(self._serve_queued, record),
            on_attempt=_no_record,
            on_fatal=functools.partial(self._fail_queued, record),
        )  # fmt: skip
        if valid_until is not None:
            self._at(valid_until, functools.partial(self._expire_queued, record))

    def _place_on_reservation(
        self, record: QueuedResource, project: str, zone: str, reservation: str
    ) -> None:
        """Take a live reservation's chips for a queued resource, or fail it (module
        docstring)."""
        path = f"projects/{project}/locations/{zone}/reservations/{reservation}"
        block = self._live_block(project, zone, reservation)
        if zone != record.zone:
            problem = (
                RPC_FAILED_PRECONDITION,
                f"Reservation '{path}' is not in zone {record.zone}",
            )
        elif block is None:
            problem = (
                RPC_FAILED_PRECONDITION,
                f"Reservation '{path}' is not active: it does not exist, has not started yet "
                "or has ended",
            )
        elif not block.tpu or block.shape != record.shape:
            problem = (
                RPC_FAILED_PRECONDITION,
                f"TPU type {record.shape} does not match reservation '{path}' ({block.shape})",
            )
        elif block.usable - self._in_use(block) < record.chips:
            problem = (
                RPC_RESOURCE_EXHAUSTED,
                f"Reservation '{path}' has {max(block.usable - self._in_use(block), 0)} of "
                f"{block.count} chips free ({block.usable} delivered so far); the queued "
                f"resource needs {record.chips}",
            )
        else:
            record.block = block
            record.state = "PROVISIONING"
            when = record.created_at + self._latency
            self._at(when, functools.partial(self._activate_on_reservation, record, block))
            return
        record.state = "FAILED"
        record.failed = {"code": problem[0], "message": problem[1]}

    def _activate_on_reservation(
        self, record: QueuedResource, block: FutureReservation, when: datetime
    ) -> None:
        if record.alive and record.state == "PROVISIONING" and block.reservation_live:
            record.state = "ACTIVE"
            self._make_nodes(record, when)

    def _make_nodes(self, record: QueuedResource, when: datetime) -> None:
        """The nodes of a queued resource that has just become ``ACTIVE``."""
        record.nodes = []
        for index, (node_name, spec) in enumerate(
            _planned_nodes(record.body, record.name, record.api_version)
        ):
            shape, chips = _tpu_node(spec)
            accelerator = TPU_ACCELERATOR_OF_API_TYPE.get(shape, shape)
            workers = tpu_hosts(accelerator, chips)
            record.nodes.append(TpuNode(
                node_name, self._new_id(), index, spec, shape, _accelerator_type(spec, shape),
                _topology(spec, shape, chips),
                [self._new_addresses({})[0] for _ in range(workers)], when,
            ))  # fmt: skip

    @settled
    def get_node(self, project: str, zone: str, node_name: str) -> JSON:
        """A TPU node (``Node``), while its queued resource is ``ACTIVE``; 404 otherwise."""
        for record, node in self._nodes(project, zone):
            if node.name == node_name:
                return node_view(record, node)
        raise CloudError.not_found(f"projects/{project}/locations/{zone}/nodes/{node_name}")

    @settled
    def list_nodes(self, project: str, zone: str) -> list[JSON]:
        """The TPU nodes of ``zone``, by name."""
        found = sorted(self._nodes(project, zone), key=lambda pair: pair[1].name)
        return [node_view(record, node) for record, node in found]

    @settled
    def project_nodes(self, project: str) -> list[JSON]:
        """Every TPU node of ``project``, in every zone (by zone, then name)."""
        found = sorted(self._nodes(project), key=lambda pair: (pair[0].zone, pair[1].name))
        return [node_view(record, node) for record, node in found]

    def _nodes(self, project: str, zone: str | None = None) -> list[tuple[QueuedResource, TpuNode]]:
        """The nodes of ``project`` (in ``zone``, or in every zone), with their queued
        resource."""
        return [
            (record, node)
            for record in self._project(project).queued_resources.values()
            if zone in (None, record.zone) and record.alive and record.state == "ACTIVE"
            for node in record.nodes
        ]

    @settled
    def get_queued_resource(self, project: str, zone: str, name: str) -> JSON:
        return queued_view(self._queued_resource(project, zone, name))

    @settled
    def list_queued_resources(self, project: str, zone: str) -> list[JSON]:
        records = [q for q in self._project(project).queued_resources.values() if q.zone == zone]
        return [queued_view(q) for q in sorted(records, key=by_name)]

    @settled
    def delete_queued_resource(
        self, project: str, zone: str, name: str, force: bool, api_version: str = "v2"
    ) -> JSON:
        """Delete a queued resource, returning its chips. Without ``force`` only a ``FAILED``
        or ``SUSPENDED`` one can be deleted."""
        record = self._queued_resource(project, zone, name)
        if not force and record.state not in _FINISHED:
            raise CloudError(
                400,
                "failedPrecondition",
                f"Queued resource '{name}' is {record.state}: only FAILED or SUSPENDED queued "
                "resources can be deleted without force",
            )
        qr_path = f"projects/{project}/locations/{zone}/queuedResources/{name}"
        response = {"@type": "type.googleapis.com/google.protobuf.Empty"}
        return self._tpu_operation(
            project, zone, qr_path, "delete", response, api_version,
            on_done=lambda when: self._remove_queued_resource(record),
        )  # fmt: skip

    @settled
    def get_tpu_operation(self, project: str, zone: str, name: str) -> JSON:
        operation = self._project(project).tpu_operations.get((zone, name))
        if operation is None:
            raise CloudError.not_found(f"projects/{project}/locations/{zone}/operations/{name}")
        return copy.deepcopy(operation)

    def _serve_queued(self, record: QueuedResource, when: datetime) -> None:
        record.state = "ACTIVE"
        record.holds_stock = True
        self._make_nodes(record, when)
        if record.flex:
            ends = record.termination_time
            if ends is None and record.run_duration is not None:
                ends = when + record.run_duration
            if ends is not None:
                record.ends_at = max(ends, when)
                self._at(record.ends_at, functools.partial(self._end_flex, record))

    def _end_flex(self, record: QueuedResource, when: datetime) -> None:
        """The end of a flex-start run: the service deletes the TPU VMs."""
        if record.alive and record.state == "ACTIVE":
            self._counters["auto_deleted"] += 1
            record.state = "SUSPENDED"
            record.initiator = "SERVICE"
            record.nodes = []
            self._release_chips(record)

    def _fail_queued(self, record: QueuedResource, when: datetime) -> None:
        record.state = "FAILED"
        record.failed = {
            "code": RPC_INTERNAL,
            "message": "An internal error occurred while provisioning "
            "(RESOURCE_OPERATION_RATE_EXCEEDED)",
        }

    def _expire_queued(self, record: QueuedResource, when: datetime) -> None:
        if record.alive and record.state == "WAITING_FOR_RESOURCES":
            self._counters["expired"] += 1
            self._dequeue(record)
            record.state = "FAILED"
            record.failed = {
                "code": RPC_DEADLINE_EXCEEDED,
                "message": "The queueing policy's validUntil time passed before the resources "
                f"were available ({STOCKOUT})",
            }

    def _release_chips(self, record: QueuedResource) -> None:
        if record.holds_stock:
            record.holds_stock = False
            self._give_back(record.zone, record.shape, record.chips)

    def _tpu_operation(
        self,
        project: str,
        zone: str,
        target: str,
        verb: str,
        response: JSON,
        api_version: str,
        *,
        on_done: Callable[[datetime], None] | None = None,
    ) -> JSON:
        """Record a google.longrunning Operation and return a copy: done (with ``response``)
        after the operation latency, at once when that is zero; ``on_done`` runs then."""
        now = self.clock.now()
        operation_name = f"operation-{int(now.timestamp() * 1000)}-{self._new_id():x}"
        operation: JSON = {
            "name": f"projects/{project}/locations/{zone}/operations/{operation_name}",
            "metadata": {
                "@type": f"type.googleapis.com/google.cloud.tpu.{api_version}.OperationMetadata",
                "createTime": rfc3339(now),
                "endTime": rfc3339(now),
                "target": target,
                "verb": verb,
                "apiVersion": api_version,
            },
            "done": True,
            "response": response,
        }
        self._project(project).tpu_operations[(zone, operation_name)] = operation
        done = functools.partial(_finish_tpu_operation, operation, response, on_done)
        if self._operation_latency <= timedelta(0):
            done(now)
            return copy.deepcopy(operation)
        operation["done"] = False
        del operation["response"], operation["metadata"]["endTime"]
        self._at(now + self._operation_latency, done)
        return copy.deepcopy(operation)

    def _queued_resource(self, project: str, zone: str, qr_name: str) -> QueuedResource:
        record = self._project(project).queued_resources.get((zone, qr_name))
        if record is None:
            raise CloudError.not_found(
                f"projects/{project}/locations/{zone}/queuedResources/{qr_name}"
            )
        return record


def _finish_tpu_operation(
    operation: JSON,
    response: JSON,
    on_done: Callable[[datetime], None] | None,
    when: datetime,
) -> None:
    """A TPU operation is done: its effect lands, its response is given."""
    if on_done is not None:
        on_done(when)
    operation["done"] = True
    operation["response"] = response
    operation["metadata"]["endTime"] = rfc3339(when)


def _no_record(code: str, message: str) -> None:
    """A waiting queued resource shows no per-attempt error: it stays WAITING_FOR_RESOURCES."""


def _qr_name(value: str) -> None:
    name(value, "queuedResourceId")


def _reservation_reference(body: JSON, api_version: str) -> tuple[str, str, str] | None:
    """(project, zone, reservation) a queued resource names in ``reservationName``, or None
    (see the module docstring for what else it must say)."""
    guaranteed = get(body, "guaranteed")
    if api_version == "v2":
        refuse_unknown(guaranteed, "reserved", "queued_resource.guaranteed")
    reference = get(body, "reservationName")
    if reference is None:
        return None
    match = re.fullmatch(r"projects/([^/]+)/locations/([^/]+)/reservations/([^/]+)", str(reference))
    if match is None:
        raise CloudError.invalid(
            f"Invalid value at 'queued_resource.reservation_name': {reference!r} (format: "
            "projects/{project}/locations/{zone}/reservations/{reservation})"
        )
    # Every reservation here is a calendar block's: consuming one takes the reservation-bound
    # provisioning model, which only v2alpha1 has (guaranteed.reserved alone is not enough).
    if get(body, "provisioningModel") != "RESERVATION_BOUND":
        raise CloudError.invalid(
            f"A queued resource consuming the calendar-mode reservation {reference!r} must be "
            "reservation-bound: provisioningModel RESERVATION_BOUND (v2alpha1; gcloud's "
            "--provisioning-model=reservation-bound)"
        )
    project, zone, reservation = match.groups()
    return project, zone, reservation


def _provisioning(
    body: JSON, api_version: str, shape: str, now: datetime
) -> tuple[bool, timedelta | None, datetime | None]:
    """(flex-start?, max run duration, termination time) of a queued resource request."""
    if api_version == "v2":
        refuse_unknown(body, "provisioningModel", "queued_resource")
        refuse_unknown(body, "runDuration", "queued_resource")
        return False, None, None
    model = get(body, "provisioningModel")
    if model is not None and model not in PROVISIONING_MODELS:
        raise CloudError.invalid(
            f"Invalid value at 'queued_resource.provisioning_model': {model!r}"
        )
    run_spec = get(body, "runDuration")
    if model != "FLEX_START":
        return False, None, None
    if shape not in FLEX_TYPES:
        raise CloudError.invalid(
            f"Flex-start is not available for TPU type {shape}: only v6e and v5e can be "
            "requested with provisioningModel FLEX_START"
        )
    if not isinstance(run_spec, dict) or not (
        get(run_spec, "maxRunDuration") or get(run_spec, "terminationTime")
    ):
        raise CloudError.invalid(
            "A FLEX_START queued resource needs runDuration.maxRunDuration or "
            "runDuration.terminationTime (at most 7 days)"
        )
    if get(run_spec, "maxRunDuration") is not None:
        run = bounded_duration(
            get(run_spec, "maxRunDuration"), "runDuration.maxRunDuration",
            timedelta(seconds=1), MAX_RUN,
        )  # fmt: skip
        return True, run, None
    ends = timestamp(get(run_spec, "terminationTime"), "runDuration.terminationTime")
    if not now < ends <= now + MAX_RUN:
        raise CloudError.invalid("runDuration.terminationTime must be within the next 7 days")
    return True, ends - now, ends


def _tpu_request(body: JSON) -> tuple[str, int]:
    """The (AcceleratorConfig type name, chips) a queued resource asks for, over all its node
    specs (a multislice or multi-node spec counts ``nodeCount`` slices)."""
    tpu = get(body, "tpu") or {}
    specs = get(tpu, "nodeSpec") if isinstance(tpu, dict) else None
    if not isinstance(specs, list) or not specs:
        raise CloudError.invalid("A queued resource needs tpu.nodeSpec with at least one node")
    shapes: set[str] = set()
    chips = 0
    for index, spec in enumerate(specs):
        node = get(spec, "node") if isinstance(spec, dict) else None
        if not isinstance(node, dict):
            raise CloudError.invalid("Every tpu.nodeSpec entry needs a node")
        shape, slice_chips = _tpu_node(node)
        _node_fields(node, f"queued_resource.tpu.node_spec[{index}].node")
        multi = get(spec, "multisliceParams") or get(spec, "multiNodeParams") or {}
        slices = integer(get(multi, "nodeCount") or 1, "nodeSpec.nodeCount")
        shapes.add(shape)
        chips += slice_chips * slices
    if len(shapes) != 1:
        raise CloudError.invalid("All node specs of a queued resource must use one TPU type")
    return shapes.pop(), chips


def _planned_nodes(body: JSON, qr_name: str, api_version: str) -> list[tuple[str, JSON]]:
    """(name, the spec's ``node``) of every node a queued resource makes, in spec order;
    refuses names Google refuses (the module docstring)."""
    multi_field = "multisliceParams" if api_version == "v2" else "multiNodeParams"
    other_field = "multiNodeParams" if api_version == "v2" else "multisliceParams"
    planned: list[tuple[str, JSON]] = []
    for index, spec in enumerate(get(get(body, "tpu"), "nodeSpec")):
        where = f"queued_resource.tpu.node_spec[{index}]"
        refuse_unknown(spec, other_field, where)
        node, node_id, multi = get(spec, "node"), get(spec, "nodeId"), get(spec, multi_field)
        if multi is None:
            planned.append((_node_id(node_id or qr_name, f"{where}.node_id"), node))
            continue
        if node_id:
            raise CloudError.invalid(
                f"Invalid value at '{where}': it's an error to specify both node_id and "
                f"{multi_field}"
            )
        count = integer(get(multi, "nodeCount"), f"{where}.{multi_field}.node_count")
        if count <= 1:
            raise CloudError.invalid(
                f"Invalid value at '{where}.{multi_field}.node_count': {count} (it needs to be > 1)"
            )
        prefix = _node_id(
            get(multi, "nodeIdPrefix") or qr_name, f"{where}.{multi_field}.node_id_prefix"
        )
        planned.extend((f"{prefix}-{i}", node) for i in range(count))
    names = [node_name for node_name, _ in planned]
    if len(set(names)) != len(names):
        raise CloudError.invalid(f"The node ids of a queued resource must differ: {names}")
    return planned


def _node_id(value: object, where: str) -> str:
    if not isinstance(value, str) or not _NODE_ID.fullmatch(value):
        raise CloudError.invalid(
            f"Invalid value at '{where}': {value!r} (must follow ^[A-Za-z0-9_.~+%-]+$)"
        )
    return value


def _node_fields(node: JSON, where: str) -> None:
    """Refuse a node's ``metadata`` or ``labels`` that is not a map of string to string, and
    a ``serviceAccount`` that is not ``{email: string, scope: [string]}`` (Google's ``Node``,
    ``ServiceAccount``)."""
    for field_name, proto in (("metadata", "metadata"), ("labels", "labels")):
        mapping = get(node, field_name)
        if mapping is None:
            continue
        if not isinstance(mapping, dict):
            raise CloudError.invalid(
                f"Invalid value at '{where}.{proto}' (type.googleapis.com/"
                f"google.cloud.tpu.v2.Node.{field_name.capitalize()}Entry), {mapping!r}: "
                "a map of string to string"
            )
        for key, value in mapping.items():
            if not isinstance(value, str):
                raise CloudError.invalid(
                    f"Invalid value at '{where}.{proto}[{key!r}].value' (TYPE_STRING), {value!r}"
                )
    account = get(node, "serviceAccount")
    if account is None:
        return
    if not isinstance(account, dict):
        raise CloudError.invalid(
            f"Invalid value at '{where}.service_account' "
            f"(type.googleapis.com/google.cloud.tpu.v2.ServiceAccount), {account!r}"
        )
    for key in account:
        if key not in _ACCOUNT_FIELDS:
            raise CloudError.invalid(
                f'Invalid JSON payload received. Unknown name "{key}" at '
                f"'{where}.service_account': Cannot find field."
            )
    email, scope = account.get("email"), account.get("scope")
    if email is not None and not isinstance(email, str):
        raise CloudError.invalid(
            f"Invalid value at '{where}.service_account.email' (TYPE_STRING), {email!r}"
        )
    if scope is not None and (
        not isinstance(scope, list) or not all(isinstance(s, str) for s in scope)
    ):
        raise CloudError.invalid(
            f"Invalid value at '{where}.service_account.scope' (TYPE_STRING), {scope!r}: "
            "a list of strings"
        )


def _accelerator_type(node: JSON, shape: str) -> str:
    """The node's ``acceleratorType``: as sent, or named from its AcceleratorConfig
    (``v5litepod-16``: v2/v3/v4/v5p names count TensorCores, v5litepod/v6e names chips)."""
    sent = get(node, "acceleratorType")
    if isinstance(sent, str) and sent and get(node, "acceleratorConfig") is None:
        return sent
    family, cores = next((f, c) for f, (s, c) in TPU_FAMILIES.items() if s == shape)
    _, chips = _tpu_node(node)
    return f"{family}-{chips * cores}"


def _topology(node: JSON, shape: str, chips: int) -> str:
    """The node's topology: as its AcceleratorConfig says, else the usual shape of ``chips``
    chips (2D for v5e/v6e: 2x4, 4x4, 4x8, …; 3D for the others: 2x2x1, 2x2x2, 2x2x4, …)."""
    config = get(node, "acceleratorConfig")
    if isinstance(config, dict) and get(config, "topology"):
        return str(get(config, "topology"))
    dimensions = [1, 1] if shape in ("V5LITE_POD", "V6E") else [1, 1, 1]
    left, turn = chips, 0
    while left > 1 and left % 2 == 0:
        dimensions[turn % len(dimensions)] *= 2
        left //= 2
        turn += 1
    dimensions[-1] *= left
    ones = [d for d in dimensions if d == 1]
    return "x".join(map(str, sorted(d for d in dimensions if d != 1) + ones))


def node_view(record: QueuedResource, node: TpuNode) -> JSON:
    """A node as Google's ``Node`` JSON shows it (empty maps and false omitted, as proto3 JSON
    omits them)."""
    spec = node.spec
    view: JSON = {
        "name": f"projects/{record.project}/locations/{record.zone}/nodes/{node.name}",
        "id": str(node.id),
        "acceleratorType": node.accelerator_type,
        "acceleratorConfig": {"type": node.shape, "topology": node.topology},
        "state": "READY",
        "runtimeVersion": str(get(spec, "runtimeVersion") or ""),
        "networkEndpoints": [
            {"ipAddress": address, "port": TPU_ENDPOINT_PORT} for address in node.addresses
        ],
        "queuedResource": (
            f"projects/{record.project}/locations/{record.zone}/queuedResources/{record.name}"
        ),
        "createTime": rfc3339(node.created_at),
    }
    for field_name in ("metadata", "labels"):
        if get(spec, field_name):
            view[field_name] = dict(get(spec, field_name))
    account = get(spec, "serviceAccount")
    if account:
        view["serviceAccount"] = copy.deepcopy(account)
    if len(record.nodes) > 1:
        view["multisliceNode"] = True
    return view


def _tpu_node(node: JSON) -> tuple[str, int]:
    config = get(node, "acceleratorConfig")
    if isinstance(config, dict):
        kind = get(config, "type")
        shape = TPU_TYPE_NUMBERS.get(kind, "") if isinstance(kind, int) else str(kind or "")
        if shape not in TPU_TYPE_NUMBERS.values():
            raise CloudError.invalid(f"Unsupported acceleratorConfig.type {kind!r}")
        topology = str(get(config, "topology") or "")
        if not re.fullmatch(r"\d+(x\d+)*", topology):
            raise CloudError.invalid(f"Invalid acceleratorConfig.topology {topology!r}")
        return shape, functools.reduce(lambda a, b: a * b, map(int, topology.split("x")))
    accelerator = get(node, "acceleratorType")
    match = re.fullmatch(r"([a-z0-9]+)-(\d+)", accelerator or "")
    if match is None or match.group(1) not in TPU_FAMILIES:
        raise CloudError.invalid(
            f"Unsupported node: needs acceleratorConfig or a known acceleratorType, not "
            f"{accelerator!r}"
        )
    shape, cores_per_chip = TPU_FAMILIES[match.group(1)]
    return shape, max(1, int(match.group(2)) // cores_per_chip)


def _queueing(policy: JSON, now: datetime) -> tuple[datetime | None, datetime | None]:
    """(valid after, valid until) of a TPU queueing policy."""
    after: datetime | None = None
    until: datetime | None = None
    if get(policy, "validAfterDuration") is not None:
        after = now + duration(get(policy, "validAfterDuration"), "validAfterDuration")
    if get(policy, "validAfterTime") is not None:
        after = timestamp(get(policy, "validAfterTime"), "validAfterTime")
    if get(policy, "validUntilDuration") is not None:
        until = now + duration(get(policy, "validUntilDuration"), "validUntilDuration")
    if get(policy, "validUntilTime") is not None:
        until = timestamp(get(policy, "validUntilTime"), "validUntilTime")
    interval = get(policy, "validInterval")
    if isinstance(interval, dict):
        if get(interval, "startTime") is not None:
            after = timestamp(get(interval, "startTime"), "validInterval.startTime")
        if get(interval, "endTime") is not None:
            until = timestamp(get(interval, "endTime"), "validInterval.endTime")
    return after, until


def queued_view(record: QueuedResource) -> JSON:
    state: JSON = {"state": record.state}
    if record.failed is not None:
        state["failedData"] = {"error": dict(record.failed)}
    if record.initiator is not None:
        state["stateInitiator"] = record.initiator
    return {
        **record.body,
        "name": f"projects/{record.project}/locations/{record.zone}/queuedResources/{record.name}",
        "createTime": rfc3339(record.created_at),
        "state": state,
    }
