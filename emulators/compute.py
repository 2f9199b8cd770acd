"""A Compute Engine v1 (and beta resize requests) and Cloud TPU v2 / v2alpha1 REST emulator
over ``opendws.sim.SimulatedCloud``.

It serves the URL paths the real ``google-cloud-compute``, ``google-cloud-compute-v1beta`` and
``google-cloud-tpu`` (REST transport) clients call, so they can point at it with
``client_options={"api_endpoint": emulator.endpoint}`` and anonymous credentials. Every answer is
JSON shaped like the real API's: resources, Operations (Compute: finished, with an ``error`` when
the mutation failed; TPU: finished google.longrunning Operations) and errors
(``{"error": {"code", "message", "errors": [{"reason"}], "status"}}``).

Every served call is one row of ``_ROUTES``: (method, path pattern, a one-line call into the
cloud). The TPU ``v2alpha1`` paths (flex-start queued resources, which the google-cloud-tpu
types lack) are plain REST JSON beside the ``v2`` ones. Resize requests are served on
``/compute/v1`` and ``/compute/beta``; only ``beta`` takes named VMs (``instances``, a Preview
field: the simulated cloud's ``migs`` module says why).

An admin API under ``/admin`` steers the simulated cloud for tests and the local stack:
``POST /admin/stock`` (an explicit stock, which stays as set), ``GET /admin/stock``,
``POST /admin/stock-process`` (other customers moving the free units: ``zone``, ``shape``,
``low``, ``high``, optional ``step``, ``every_seconds``, ``seed``), ``POST /admin/inject``,
``POST /admin/latency``, ``GET``/``POST /admin/calendar`` (calendar blocks: optional
``reviewDelaySeconds``, the simulated time from insert to Google's review, and
``cancellationRule``, ``windows`` or ``never``; answers both), ``POST /admin/advance``,
``POST /admin/reset``, ``GET /admin/state`` (resources, stock, processes and Google's queues),
``POST /admin/operation-latency`` (``{"seconds": x}``: how long Compute operations take) and
``POST /admin/rate-quotas`` (``{"enabled": true}`` with optional per-minute limits
``{"write": n, "read": n, "list": n, "operation_read": n, "operation_wait": n}``; Google's
defaults otherwise; ``{"enabled": false}`` turns them off). ``EmulatorAdmin`` is its client.

Every Compute call (not the TPU ones, nor the admin API) is counted against the simulated
cloud's rate quotas (``opendws.sim.cloud.quotas``), in its project and region (``global`` for
global calls), by kind: a call over its quota is answered 403 ``rateLimitExceeded``
(domain ``usageLimits``) as Google answers it. ``POST .../operations/{name}/wait`` waits as
Google's does: until the operation is DONE or about 2 minutes have gone by
(compute/docs/reference/rest/v1/zoneOperations/wait), polling the simulated cloud without
holding it; on a frozen clock it answers at once with the operation as it is.

The Advice API's ``POST .../regions/{region}/advice/calendarMode`` is served from the same
capacity model that reviews calendar blocks.

``python -m emulators.compute [--port N] [--stock ZONE/SHAPE=UNITS ...]
[--stock-process ZONE/SHAPE=LOW:HIGH ...] [--seed N] [--stock-every SECONDS]
[--latency SECONDS] [--operation-latency SECONDS] [--rate-quotas] [--review-delay SECONDS]
[--cancellation-rule windows|never]`` serves it standalone until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from datetime import timedelta
from types import FrameType
from typing import Any, NamedTuple

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.wrappers import Request, Response

from emulators.official import HOST, EmulatorError
from emulators.serving import BackgroundServer
from opendws.domain.calendar import CancellationRule
from opendws.sim import FAILURE_KINDS, CloudError, SimulatedCloud
from opendws.sim.cloud import CREATED_KINDS, OPERATION_LATENCY, REVIEW_DELAY, CallKind, RateQuotas

JSON = dict[str, Any]
Handler = Callable[[SimulatedCloud, Request, dict[str, str]], object]

_COMPUTE = "/compute/v1/projects/<project>"
_GLOBAL = _COMPUTE + "/global"
_ZONE = _COMPUTE + "/zones/<zone>"
_MIG = _ZONE + "/instanceGroupManagers/<igm>"
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "ALREADY_EXISTS",
    500: "INTERNAL",
}
_DEFAULT_PAGE = 500
# zoneOperations.wait "waits for no more than the 2 minute deadline" (seconds), polling the
# simulated cloud every WAIT_STEP seconds meanwhile.
WAIT_DEADLINE = 120.0
WAIT_STEP = 0.05


class _AdminInputError(Exception):
    """Bad input to the admin API: answered with 400 and this message."""


# ---------------------------------------------------------------------- request helpers


def _body(request: Request) -> JSON:
    raw = request.get_data()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as error:
        raise CloudError.invalid(f"The request body is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise CloudError.invalid("The request body must be a JSON object")
    return body


def _page(request: Request, items: list[JSON], *, size_param: str) -> tuple[list[JSON], str]:
    """One page of ``items`` (after a ``name eq REGEX`` filter) and the next page token; tokens
    are offsets."""
    items = _filtered(items, request.args.get("filter", ""))
    try:
        start = int(request.args.get("pageToken") or 0)
        size = int(request.args.get(size_param) or _DEFAULT_PAGE)
    except ValueError:
        raise CloudError.invalid("pageToken and page sizes must be integers") from None
    size = size if size > 0 else _DEFAULT_PAGE
    end = start + size
    return items[start:end], (str(end) if end < len(items) else "")


def _filtered(items: list[JSON], expression: str) -> list[JSON]:
    """Apply a Compute filter of the form ``name eq REGEX`` / ``name = "NAME"``; any other
    filter is ignored (callers must not rely on it)."""
    match = re.fullmatch(r'\s*\(?\s*name\s*(eq|=)\s*"?([^"]*?)"?\s*\)?\s*', expression)
    if match is None:
        return items
    operator, value = match.groups()
    if operator == "=":
        return [item for item in items if item.get("name") == value]
    try:
        pattern = re.compile(value)
    except re.error:
        raise CloudError.invalid(f"Invalid filter regular expression {value!r}") from None
    return [item for item in items if pattern.fullmatch(str(item.get("name", "")))]


def _compute_list(kind: str, request: Request, items: list[JSON]) -> JSON:
    page, token = _page(request, items, size_param="maxResults")
    answer: JSON = {"kind": kind, "id": kind, "items": page, "selfLink": request.base_url}
    if token:
        answer["nextPageToken"] = token
    return answer


def _true(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


# ---------------------------------------------------------------------- list answers


def _managed(request: Request, items: list[JSON]) -> JSON:
    page, token = _page(request, items, size_param="maxResults")
    return {"managedInstances": page, **({"nextPageToken": token} if token else {})}


def _queued_page(request: Request, items: list[JSON]) -> JSON:
    page, token = _page(request, items, size_param="pageSize")
    return {"queuedResources": page, **({"nextPageToken": token} if token else {})}


def _nodes_page(request: Request, items: list[JSON]) -> JSON:
    page, token = _page(request, items, size_param="pageSize")
    return {"nodes": page, **({"nextPageToken": token} if token else {})}


def _queued_id(request: Request) -> str:
    return request.args.get("queuedResourceId") or request.args.get("queued_resource_id") or ""


# ---------------------------------------------------------------------- admin handlers


def _admin_body(request: Request) -> JSON:
    try:
        body = json.loads(request.get_data() or b"{}")
    except ValueError as error:
        raise _AdminInputError(f"the body is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise _AdminInputError("the body must be a JSON object")
    return body


def _text(body: JSON, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise _AdminInputError(f"{key!r} must be a non-empty string, got {value!r}")
    return value


def _whole(body: JSON, key: str, default: int | None = None) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _AdminInputError(f"{key!r} must be an integer, got {value!r}")
    return value


def _seconds(body: JSON) -> timedelta:
    value = body.get("seconds")
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise _AdminInputError(f"'seconds' must be a number ≥ 0, got {value!r}")
    return timedelta(seconds=value)


def _admin_stock(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    if request.method == "GET":
        zone, shape = request.args.get("zone", ""), request.args.get("shape", "")
        if not zone or not shape:
            raise _AdminInputError("GET /admin/stock needs ?zone=...&shape=...")
        return {"zone": zone, "shape": shape, "units": cloud.stock(zone, shape)}
    body = _admin_body(request)
    zone, shape, units = _text(body, "zone"), _text(body, "shape"), _whole(body, "units")
    cloud.set_stock(zone, shape, units)
    return {"zone": zone, "shape": shape, "units": cloud.stock(zone, shape)}


def _admin_stock_process(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    body = _admin_body(request)
    every = body.get("every_seconds", 300)
    if isinstance(every, bool) or not isinstance(every, int | float) or every <= 0:
        raise _AdminInputError(f"'every_seconds' must be a number > 0, got {every!r}")
    zone, shape = _text(body, "zone"), _text(body, "shape")
    cloud.set_stock_process(
        zone, shape, low=_whole(body, "low"), high=_whole(body, "high"),
        step=_whole(body, "step", 1), every=timedelta(seconds=every), seed=_whole(body, "seed", 0),
    )  # fmt: skip
    return {"zone": zone, "shape": shape, "units": cloud.stock(zone, shape)}


def _admin_inject(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    body = _admin_body(request)
    kind = _text(body, "kind")
    if kind not in FAILURE_KINDS:
        raise _AdminInputError(f"'kind' must be one of {', '.join(FAILURE_KINDS)}, got {kind!r}")
    cloud.inject(_text(body, "zone"), _text(body, "shape"), kind, _whole(body, "count", 1))
    return {}


def _admin_latency(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    cloud.set_latency(_seconds(_admin_body(request)))
    return {}


def _admin_operation_latency(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    cloud.set_operation_latency(_seconds(_admin_body(request)))
    return {"seconds": cloud.operation_latency.total_seconds()}


def _admin_rate_quotas(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    """Turn the rate quotas on (Google's default limits, or those given) or off; answers the
    limits now (``null``: off)."""
    body = _admin_body(request)
    enabled = body.pop("enabled", True)
    if not isinstance(enabled, bool):
        raise _AdminInputError(f"'enabled' must be true or false, got {enabled!r}")
    cloud.set_rate_quotas(RateQuotas.from_view(body) if enabled else None)
    quotas = cloud.rate_quotas
    return {"quotas": None if quotas is None else quotas.view()}


def _admin_calendar(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    """Set (POST) and read the calendar settings: the review delay, the fill delay (how long
    after a block's start Google fills its reservation) and the cancellation rule."""
    if request.method == "POST":
        body = _admin_body(request)
        if "reviewDelaySeconds" in body:
            cloud.set_review_delay(_delay(body, "reviewDelaySeconds"))
        if "fillDelaySeconds" in body:
            cloud.set_fill_delay(_delay(body, "fillDelaySeconds"))
        if "cancellationRule" in body:
            cloud.set_cancellation_rule(_text(body, "cancellationRule"))
    return {
        "reviewDelaySeconds": cloud.review_delay.total_seconds(),
        "fillDelaySeconds": cloud.fill_delay.total_seconds(),
        "cancellationRule": cloud.cancellation_rule.value,
    }


def _delay(body: JSON, key: str) -> timedelta:
    """A number of seconds ≥ 0 from an admin body, or _AdminInputError naming ``key``."""
    delay = body[key]
    if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
        raise _AdminInputError(f"{key!r} must be a number ≥ 0, got {delay!r}")
    return timedelta(seconds=delay)


def _admin_advance(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    cloud.advance(_seconds(_admin_body(request)))
    return {"now": cloud.clock.now().isoformat()}


def _admin_reset(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    cloud.reset()
    return {}


# ---------------------------------------------------------------------- routing


def _resize_request_routes(version: str) -> list[tuple[str, str, Handler]]:
    """The instanceGroupManagerResizeRequests rows of one Compute API version (``v1``, or
    ``beta``, which takes named VMs: the simulated cloud's ``migs`` module; the same resources
    behind both). ``beta`` also serves the zonal operations its clients poll."""
    mig = f"/compute/{version}/projects/<project>/zones/<zone>/instanceGroupManagers/<igm>"
    rows: list[tuple[str, str, Handler]] = [
        ("POST", mig + "/resizeRequests",
         lambda c, r, a: c.insert_resize_request(a["project"], a["zone"], a["igm"], _body(r),
                                                 version)),
        ("GET", mig + "/resizeRequests",
         lambda c, r, a: _compute_list("compute#instanceGroupManagerResizeRequestList", r,
                                       c.list_resize_requests(a["project"], a["zone"],
                                                              a["igm"]))),
        ("GET", mig + "/resizeRequests/<name>",
         lambda c, r, a: c.get_resize_request(a["project"], a["zone"], a["igm"], a["name"])),
        ("DELETE", mig + "/resizeRequests/<name>",
         lambda c, r, a: c.delete_resize_request(a["project"], a["zone"], a["igm"], a["name"])),
        ("POST", mig + "/resizeRequests/<name>/cancel",
         lambda c, r, a: c.cancel_resize_request(a["project"], a["zone"], a["igm"], a["name"])),
    ]  # fmt: skip
    if version == "v1":  # v1's zonal operations are rows of their own, beside v1's other calls
        return rows
    operation = f"/compute/{version}/projects/<project>/zones/<zone>/operations/<name>"
    return [
        *rows,
        ("GET", operation, lambda c, r, a: c.get_operation(a["project"], a["zone"], a["name"])),
        ("POST", operation + "/wait",
         lambda c, r, a: _wait(c, lambda: c.get_operation(a["project"], a["zone"], a["name"]))),
    ]  # fmt: skip


def _tpu_routes(version: str) -> list[tuple[str, str, Handler]]:
    """The queuedResources and nodes rows of one TPU API version (``v2``, or ``v2alpha1`` for
    flex-start; the same resources behind both). Nodes are read only: a queued resource makes
    them (``opendws.sim.cloud.tpu``)."""
    base = f"/{version}/projects/<project>/locations/<zone>"
    return [
        ("POST", base + "/queuedResources",
         lambda c, r, a: c.create_queued_resource(a["project"], a["zone"], _queued_id(r),
                                                  _body(r), version)),
        ("GET", base + "/queuedResources",
         lambda c, r, a: _queued_page(r, c.list_queued_resources(a["project"], a["zone"]))),
        ("GET", base + "/queuedResources/<name>",
         lambda c, r, a: c.get_queued_resource(a["project"], a["zone"], a["name"])),
        ("DELETE", base + "/queuedResources/<name>",
         lambda c, r, a: c.delete_queued_resource(a["project"], a["zone"], a["name"],
                                                  _true(r.args.get("force")), version)),
        ("GET", base + "/operations/<name>",
         lambda c, r, a: c.get_tpu_operation(a["project"], a["zone"], a["name"])),
        ("GET", base + "/nodes",
         lambda c, r, a: _nodes_page(r, c.list_nodes(a["project"], a["zone"]))),
        ("GET", base + "/nodes/<name>",
         lambda c, r, a: c.get_node(a["project"], a["zone"], a["name"])),
    ]  # fmt: skip


_ROUTES: list[tuple[str, str, Handler]] = [
    # Compute: instance templates and global operations
    ("POST", _GLOBAL + "/instanceTemplates",
     lambda c, r, a: c.insert_instance_template(a["project"], _body(r))),
    ("GET", _GLOBAL + "/instanceTemplates",
     lambda c, r, a: _compute_list("compute#instanceTemplateList", r,
                                   c.list_instance_templates(a["project"]))),
    ("GET", _GLOBAL + "/instanceTemplates/<name>",
     lambda c, r, a: c.get_instance_template(a["project"], a["name"])),
    ("DELETE", _GLOBAL + "/instanceTemplates/<name>",
     lambda c, r, a: c.delete_instance_template(a["project"], a["name"])),
    ("GET", _GLOBAL + "/operations/<name>",
     lambda c, r, a: c.get_operation(a["project"], "global", a["name"])),
    ("POST", _GLOBAL + "/operations/<name>/wait",
     lambda c, r, a: _wait(c, lambda: c.get_operation(a["project"], "global", a["name"]))),
    # Compute: managed instance groups and their resize requests
    ("POST", _ZONE + "/instanceGroupManagers",
     lambda c, r, a: c.insert_instance_group_manager(a["project"], a["zone"], _body(r))),
    ("GET", _ZONE + "/instanceGroupManagers",
     lambda c, r, a: _compute_list("compute#instanceGroupManagerList", r,
                                   c.list_instance_group_managers(a["project"], a["zone"]))),
    ("GET", _MIG, lambda c, r, a: c.get_instance_group_manager(a["project"], a["zone"], a["igm"])),
    ("PATCH", _MIG,
     lambda c, r, a: c.patch_instance_group_manager(a["project"], a["zone"], a["igm"], _body(r))),
    ("DELETE", _MIG,
     lambda c, r, a: c.delete_instance_group_manager(a["project"], a["zone"], a["igm"])),
    ("POST", _MIG + "/listManagedInstances",
     lambda c, r, a: _managed(r, c.list_managed_instances(a["project"], a["zone"], a["igm"]))),
    ("POST", _MIG + "/deleteInstances",
     lambda c, r, a: c.delete_managed_instances(a["project"], a["zone"], a["igm"], _body(r))),
    # Resize requests on v1 and beta (named VMs: beta only)
    *[
        row
        for version in ("v1", "beta")
        for row in _resize_request_routes(version)
    ],
    # Compute: instances, future reservations, reservations, zonal operations
    ("POST", _ZONE + "/instances",
     lambda c, r, a: c.insert_instance(a["project"], a["zone"], _body(r))),
    ("GET", _ZONE + "/instances",
     lambda c, r, a: _compute_list("compute#instanceList", r,
                                   c.list_instances(a["project"], a["zone"]))),
    ("GET", _ZONE + "/instances/<name>",
     lambda c, r, a: c.get_instance(a["project"], a["zone"], a["name"])),
    ("DELETE", _ZONE + "/instances/<name>",
     lambda c, r, a: c.delete_instance(a["project"], a["zone"], a["name"])),
    ("POST", _ZONE + "/futureReservations",
     lambda c, r, a: c.insert_future_reservation(a["project"], a["zone"], _body(r))),
    ("GET", _ZONE + "/futureReservations",
     lambda c, r, a: _compute_list("compute#futureReservationsListResponse", r,
                                   c.list_future_reservations(a["project"], a["zone"]))),
    ("GET", _ZONE + "/futureReservations/<name>",
     lambda c, r, a: c.get_future_reservation(a["project"], a["zone"], a["name"])),
    ("DELETE", _ZONE + "/futureReservations/<name>",
     lambda c, r, a: c.delete_future_reservation(a["project"], a["zone"], a["name"])),
    ("POST", _ZONE + "/futureReservations/<name>/cancel",
     lambda c, r, a: c.cancel_future_reservation(a["project"], a["zone"], a["name"])),
    ("GET", _ZONE + "/reservations",
     lambda c, r, a: _compute_list("compute#reservationList", r,
                                   c.list_reservations(a["project"], a["zone"]))),
    ("GET", _ZONE + "/reservations/<name>",
     lambda c, r, a: c.get_reservation(a["project"], a["zone"], a["name"])),
    ("POST", _COMPUTE + "/regions/<region>/advice/calendarMode",
     lambda c, r, a: c.calendar_mode_advice(a["project"], a["region"], _body(r))),
    ("GET", _ZONE + "/operations/<name>",
     lambda c, r, a: c.get_operation(a["project"], a["zone"], a["name"])),
    ("POST", _ZONE + "/operations/<name>/wait",
     lambda c, r, a: _wait(c, lambda: c.get_operation(a["project"], a["zone"], a["name"]))),
    # Cloud TPU v2 and v2alpha1 (flex-start) queued resources
    *[
        row
        for version in ("v2", "v2alpha1")
        for row in _tpu_routes(version)
    ],
    # Admin
    ("POST", "/admin/stock", _admin_stock),
    ("GET", "/admin/stock", _admin_stock),
    ("POST", "/admin/stock-process", _admin_stock_process),
    ("POST", "/admin/inject", _admin_inject),
    ("POST", "/admin/latency", _admin_latency),
    ("POST", "/admin/operation-latency", _admin_operation_latency),
    ("POST", "/admin/rate-quotas", _admin_rate_quotas),
    ("POST", "/admin/calendar", _admin_calendar),
    ("GET", "/admin/calendar", _admin_calendar),
    ("POST", "/admin/advance", _admin_advance),
    ("POST", "/admin/reset", _admin_reset),
    ("GET", "/admin/state", lambda c, r, a: c.state()),
]  # fmt: skip


def _wait(cloud: SimulatedCloud, read: Callable[[], JSON]) -> JSON:
    """zoneOperations/globalOperations.wait: the operation once DONE, or as it is after
    ``WAIT_DEADLINE``; at once on a frozen clock (waiting would change nothing). ``read``
    takes the cloud's lock only while it reads."""
    deadline = time.monotonic() + WAIT_DEADLINE
    operation = read()
    while operation.get("status") != "DONE" and time.monotonic() < deadline:
        before = cloud.clock.now()
        time.sleep(WAIT_STEP)
        if cloud.clock.now() == before:
            return read()
        operation = read()
    return operation


class _Route(NamedTuple):
    """A routing table row's endpoint: its handler and the rate quota group it counts in."""

    handler: Handler
    kind: CallKind | None


def call_kind(method: str, path: str) -> CallKind | None:
    """The rate quota group of a Compute call (compute/docs/api-rate-limits), by its method
    and path pattern; None for calls no Compute quota counts (TPU, admin)."""
    if not path.startswith("/compute/"):
        return None
    if path.endswith("/wait"):
        return CallKind.OPERATION_WAIT
    if method == "GET" and "/operations/" in path:
        return CallKind.OPERATION_READ
    if method == "GET":
        return CallKind.READ if path.endswith(">") else CallKind.LIST
    # Mutations, and listManagedInstances, which Google counts with them.
    return CallKind.WRITE


def _location(arguments: Mapping[str, Any]) -> str:
    """Where a call's quota is counted: its zone's region, its region, or ``global``."""
    if "zone" in arguments:
        return str(arguments["zone"]).rsplit("-", 1)[0]
    return str(arguments.get("region", "global"))


def _url_map() -> Map:
    rules = [
        Rule(path, methods=[method], endpoint=_Route(handler, call_kind(method, path)))
        for method, path, handler in _ROUTES
    ]
    # Trailing slashes are not part of the real APIs; no redirects.
    return Map(rules, strict_slashes=False, merge_slashes=False)


def _json(status: int, payload: object) -> Response:
    return Response(json.dumps(payload), status=status, mimetype="application/json")


def _error(status: int, reason: str, message: str, domain: str = "global") -> Response:
    """An error answer as Google APIs give it; api_core maps the status to its exception."""
    error = {
        "code": status,
        "message": message,
        "errors": [{"message": message, "domain": domain, "reason": reason}],
        "status": _STATUS_NAMES.get(status, "UNKNOWN"),
    }
    if reason in ("resourceNotReady", "failedPrecondition", "resourceInUseByAnotherResource"):
        error["status"] = "FAILED_PRECONDITION"
    return _json(status, {"error": error})


class _Application:
    """The WSGI application: route, call the simulated cloud, answer JSON."""

    def __init__(self, cloud: SimulatedCloud) -> None:
        self.cloud = cloud
        self._map = _url_map()
        self.round_trip = 0.0  # seconds added to every answer (ComputeEmulator.round_trip)

    def __call__(self, environ: Any, start_response: Any) -> Any:
        response = self._dispatch(Request(environ))
        if self.round_trip > 0:
            time.sleep(self.round_trip)  # outside the cloud's lock: calls overlap as on Google
        return response(environ, start_response)

    def _dispatch(self, request: Request) -> Response:
        try:
            route, arguments = self._map.bind_to_environ(request.environ).match()
        except HTTPException as error:
            status = error.code or 404
            return _error(status, "notFound", f"{request.method} {request.path}: {error.name}")
        try:
            if route.kind is not None:
                self.cloud.charge(arguments["project"], _location(arguments), route.kind)
            return _json(200, route.handler(self.cloud, request, arguments))
        except CloudError as error:
            return _error(error.http_status, error.reason, error.message, error.domain)
        except (_AdminInputError, ValueError) as error:
            return _error(400, "invalid", str(error))
        except Exception as error:
            # A bug in the emulator: answer JSON so the client's error names it.
            return _error(500, "backendError", f"{type(error).__name__}: {error}")


class ComputeEmulator(BackgroundServer):
    """The Compute/TPU REST emulator on a background thread; a context manager.

    ``endpoint`` (``http://HOST:PORT``) is what clients pass as ``api_endpoint``; ``cloud`` is
    the simulated cloud behind it, to steer directly from Python.
    """

    def __init__(
        self, cloud: SimulatedCloud | None = None, host: str = HOST, port: int = 0
    ) -> None:
        super().__init__(host, port, what="the Compute emulator", thread_name="compute-emulator")
        self.cloud = cloud if cloud is not None else SimulatedCloud()
        self._application = _Application(self.cloud)

    def application(self) -> _Application:
        return self._application

    @property
    def round_trip(self) -> float:
        """Seconds every answer is held back: 0 (the default) answers at once; a benchmark
        sets a stand-in for the network and Google's own time, to see what overlaps."""
        return self._application.round_trip

    @round_trip.setter
    def round_trip(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"round_trip: {seconds} s is negative")
        self._application.round_trip = seconds

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}"


class EmulatorAdmin:
    """An HTTP client of the emulator's admin API, with the steering methods of
    ``SimulatedCloud``. Input the emulator refuses raises ``ValueError`` with its message."""

    def __init__(self, endpoint: str, timeout: float = 30.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._timeout = timeout

    def set_stock(self, zone: str, shape: str, units: int) -> None:
        self._call("POST", "/admin/stock", {"zone": zone, "shape": shape, "units": units})

    def stock(self, zone: str, shape: str) -> int:
        query = urllib.parse.urlencode({"zone": zone, "shape": shape})
        units = self._call("GET", f"/admin/stock?{query}")["units"]
        assert isinstance(units, int)
        return units

    def set_stock_process(
        self,
        zone: str,
        shape: str,
        *,
        low: int,
        high: int,
        step: int = 1,
        every: timedelta = timedelta(minutes=5),
        seed: int = 0,
    ) -> None:
        """``SimulatedCloud.set_stock_process`` over ``POST /admin/stock-process``."""
        body = {
            "zone": zone, "shape": shape, "low": low, "high": high, "step": step,
            "every_seconds": every.total_seconds(), "seed": seed,
        }  # fmt: skip
        self._call("POST", "/admin/stock-process", body)

    def inject(self, zone: str, shape: str, kind: str, count: int = 1) -> None:
        body = {"zone": zone, "shape": shape, "kind": kind, "count": count}
        self._call("POST", "/admin/inject", body)

    def set_latency(self, latency: timedelta) -> None:
        self._call("POST", "/admin/latency", {"seconds": latency.total_seconds()})

    def set_operation_latency(self, latency: timedelta) -> None:
        """``SimulatedCloud.set_operation_latency`` over ``POST /admin/operation-latency``."""
        self._call("POST", "/admin/operation-latency", {"seconds": latency.total_seconds()})

    def set_rate_quotas(self, quotas: RateQuotas | None) -> None:
        """``SimulatedCloud.set_rate_quotas`` over ``POST /admin/rate-quotas``."""
        body: JSON = {"enabled": False} if quotas is None else {"enabled": True, **quotas.view()}
        self._call("POST", "/admin/rate-quotas", body)

    def set_calendar(
        self,
        *,
        review_delay: timedelta | None = None,
        fill_delay: timedelta | None = None,
        cancellation_rule: CancellationRule | str | None = None,
    ) -> JSON:
        """``set_review_delay`` / ``set_fill_delay`` / ``set_cancellation_rule`` over
        ``POST /admin/calendar`` (each only if given); returns the settings now."""
        body: JSON = {}
        if review_delay is not None:
            body["reviewDelaySeconds"] = review_delay.total_seconds()
        if fill_delay is not None:
            body["fillDelaySeconds"] = fill_delay.total_seconds()
        if cancellation_rule is not None:
            body["cancellationRule"] = CancellationRule(cancellation_rule).value
        return self._call("POST", "/admin/calendar", body)

    def advance(self, delta: timedelta) -> None:
        self._call("POST", "/admin/advance", {"seconds": delta.total_seconds()})

    def reset(self) -> None:
        self._call("POST", "/admin/reset", {})

    def state(self) -> dict[str, object]:
        return self._call("GET", "/admin/state")

    def created(self, kind: str) -> dict[str, int]:
        if kind not in CREATED_KINDS:
            raise ValueError(f"kind must be one of {', '.join(CREATED_KINDS)}, not {kind!r}")
        counters = self.state()["created"]
        assert isinstance(counters, dict)
        return dict(counters.get(kind, {}))

    def _call(self, method: str, path: str, body: JSON | None = None) -> JSON:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.endpoint + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as reply:
                answer = json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as error:
            message = _error_message(error.read())
            if error.code == 400:
                raise ValueError(message) from None
            raise EmulatorError(f"{method} {path}: HTTP {error.code}: {message}") from None
        except OSError as error:
            raise EmulatorError(f"{method} {path}: {error}") from None
        if not isinstance(answer, dict):
            raise EmulatorError(f"{method} {path}: the answer is not a JSON object")
        return answer


def _error_message(raw: bytes) -> str:
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return raw.decode(errors="replace")
    return str(message)


# ---------------------------------------------------------------------- standalone


def _stock_entry(text: str) -> tuple[str, str, int]:
    zone_shape, _, units = text.partition("=")
    zone, _, shape = zone_shape.partition("/")
    if not zone or not shape or not units.isdigit():
        raise argparse.ArgumentTypeError(f"expected ZONE/SHAPE=UNITS, got {text!r}")
    return zone, shape, int(units)


def _process_entry(text: str) -> tuple[str, str, int, int]:
    zone_shape, _, bounds = text.partition("=")
    zone, _, shape = zone_shape.partition("/")
    low, _, high = bounds.partition(":")
    if not zone or not shape or not low.isdigit() or not high.isdigit() or int(low) > int(high):
        raise argparse.ArgumentTypeError(f"expected ZONE/SHAPE=LOW:HIGH (LOW ≤ HIGH), got {text!r}")
    return zone, shape, int(low), int(high)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m emulators.compute",
        description="Serve the Compute Engine v1 / Cloud TPU v2 and v2alpha1 emulator until "
        "interrupted.",
    )
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--stock",
        type=_stock_entry,
        action="append",
        default=[],
        metavar="ZONE/SHAPE=UNITS",
        help="free units of a shape in a zone (repeatable)",
    )
    parser.add_argument(
        "--stock-process",
        type=_process_entry,
        action="append",
        default=[],
        metavar="ZONE/SHAPE=LOW:HIGH",
        help="let other customers move the free units of a shape in a zone within LOW..HIGH "
        "(a seeded random walk from LOW, one unit at a time; repeatable)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the stock processes")
    parser.add_argument(
        "--stock-every", type=float, default=300.0, help="seconds between stock process steps"
    )
    parser.add_argument("--latency", type=float, default=20.0, help="provisioning latency, s")
    parser.add_argument(
        "--operation-latency",
        type=float,
        default=OPERATION_LATENCY.total_seconds(),
        help="seconds a Compute operation takes to be DONE",
    )
    parser.add_argument(
        "--rate-quotas",
        action="store_true",
        help="enforce Google's default Compute Engine API rate quotas",
    )
    parser.add_argument(
        "--review-delay",
        type=float,
        default=REVIEW_DELAY.total_seconds(),
        help="seconds from a calendar block's insert to Google's review of it",
    )
    parser.add_argument(
        "--fill-delay",
        type=float,
        default=0.0,
        help="seconds from a calendar block's start to Google filling its reservation "
        "(Google: up to 24 h)",
    )
    parser.add_argument(
        "--cancellation-rule",
        choices=[rule.value for rule in CancellationRule],
        default=CancellationRule.WINDOWS.value,
        help="which of Google's pages approved calendar blocks are cancelled by",
    )
    options = parser.parse_args(argv)
    if options.latency < 0:
        parser.error("--latency cannot be negative")
    if options.operation_latency < 0:
        parser.error("--operation-latency cannot be negative")
    if options.stock_every <= 0:
        parser.error("--stock-every must be positive")
    if options.review_delay < 0:
        parser.error("--review-delay cannot be negative")
    if options.fill_delay < 0:
        parser.error("--fill-delay cannot be negative")
    cloud = SimulatedCloud(
        provisioning_latency=timedelta(seconds=options.latency),
        review_delay=timedelta(seconds=options.review_delay),
        fill_delay=timedelta(seconds=options.fill_delay),
        cancellation_rule=CancellationRule(options.cancellation_rule),
        operation_latency=timedelta(seconds=options.operation_latency),
    )
    if options.rate_quotas:
        cloud.set_rate_quotas(RateQuotas.google_defaults())
    for zone, shape, low, high in options.stock_process:
        cloud.set_stock(zone, shape, low)
        cloud.set_stock_process(
            zone, shape, low=low, high=high, every=timedelta(seconds=options.stock_every),
            seed=options.seed,
        )  # fmt: skip
    for zone, shape, units in options.stock:
        cloud.set_stock(zone, shape, units)  # an explicit stock stays as set
    stopped = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    with ComputeEmulator(cloud, host=options.host, port=options.port) as emulator:
        print(f"COMPUTE_EMULATOR_ENDPOINT={emulator.endpoint}", flush=True)
        while not stopped.wait(1.0):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
