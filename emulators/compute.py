"""A Compute Engine v1 and Cloud TPU v2 REST emulator over ``opendws.sim.SimulatedCloud``.

It serves the URL paths the real ``google-cloud-compute`` and ``google-cloud-tpu`` (REST
transport) clients call, so they can point at it with
``client_options={"api_endpoint": emulator.endpoint}`` and anonymous credentials. Every answer is
JSON shaped like the real API's: resources, Operations (Compute: finished, with an ``error`` when
the mutation failed; TPU: finished google.longrunning Operations) and errors
(``{"error": {"code", "message", "errors": [{"reason"}], "status"}}``).

An admin API under ``/admin`` steers the simulated cloud (stock, failure injection, latency, the
clock) for tests and the local stack; ``EmulatorAdmin`` is its client.

``python -m emulators.compute [--port N] [--stock ZONE/SHAPE=UNITS ...] [--latency SECONDS]``
serves it standalone until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import timedelta
from types import FrameType, TracebackType
from typing import Any, Self

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

from emulators.official import HOST, EmulatorError
from opendws.sim import FAILURE_KINDS, CloudError, SimulatedCloud
from opendws.sim.cloud import CREATED_KINDS

JSON = dict[str, Any]
Handler = Callable[[SimulatedCloud, Request, dict[str, str]], object]

_COMPUTE = "/compute/v1/projects/<project>"
_ZONE = _COMPUTE + "/zones/<zone>"
_MIG = _ZONE + "/instanceGroupManagers/<igm>"
_TPU = "/v2/projects/<project>/locations/<zone>"
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "ALREADY_EXISTS",
    500: "INTERNAL",
}
_DEFAULT_PAGE = 500


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


# ---------------------------------------------------------------------- Compute handlers


def _template_insert(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.insert_instance_template(a["project"], _body(request))


def _template_get(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.get_instance_template(a["project"], a["name"])


def _template_list(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    items = cloud.list_instance_templates(a["project"])
    return _compute_list("compute#instanceTemplateList", request, items)


def _template_delete(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.delete_instance_template(a["project"], a["name"])


def _mig_insert(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.insert_instance_group_manager(a["project"], a["zone"], _body(request))


def _mig_get(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.get_instance_group_manager(a["project"], a["zone"], a["igm"])


def _mig_list(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    items = cloud.list_instance_group_managers(a["project"], a["zone"])
    return _compute_list("compute#instanceGroupManagerList", request, items)


def _mig_delete(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.delete_instance_group_manager(a["project"], a["zone"], a["igm"])


def _mig_managed(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    items = cloud.list_managed_instances(a["project"], a["zone"], a["igm"])
    page, token = _page(request, items, size_param="maxResults")
    answer: JSON = {"managedInstances": page}
    if token:
        answer["nextPageToken"] = token
    return answer


def _mig_delete_instances(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.delete_managed_instances(a["project"], a["zone"], a["igm"], _body(request))


def _resize_insert(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.insert_resize_request(a["project"], a["zone"], a["igm"], _body(request))


def _resize_get(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.get_resize_request(a["project"], a["zone"], a["igm"], a["name"])


def _resize_list(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    items = cloud.list_resize_requests(a["project"], a["zone"], a["igm"])
    return _compute_list("compute#instanceGroupManagerResizeRequestList", request, items)


def _resize_delete(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.delete_resize_request(a["project"], a["zone"], a["igm"], a["name"])


def _resize_cancel(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.cancel_resize_request(a["project"], a["zone"], a["igm"], a["name"])


def _instance_insert(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.insert_instance(a["project"], a["zone"], _body(request))


def _instance_get(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.get_instance(a["project"], a["zone"], a["name"])


def _instance_list(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    items = cloud.list_instances(a["project"], a["zone"])
    return _compute_list("compute#instanceList", request, items)


def _instance_delete(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.delete_instance(a["project"], a["zone"], a["name"])


def _future_insert(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.insert_future_reservation(a["project"], a["zone"], _body(request))


def _future_get(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.get_future_reservation(a["project"], a["zone"], a["name"])


def _future_list(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    items = cloud.list_future_reservations(a["project"], a["zone"])
    return _compute_list("compute#futureReservationsListResponse", request, items)


def _future_delete(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.delete_future_reservation(a["project"], a["zone"], a["name"])


def _future_cancel(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.cancel_future_reservation(a["project"], a["zone"], a["name"])


def _reservation_get(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.get_reservation(a["project"], a["zone"], a["name"])


def _reservation_list(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    items = cloud.list_reservations(a["project"], a["zone"])
    return _compute_list("compute#reservationList", request, items)


def _zone_operation(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.get_operation(a["project"], a["zone"], a["name"])


def _global_operation(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.get_operation(a["project"], "global", a["name"])


# ---------------------------------------------------------------------- TPU handlers


def _queued_create(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    name = request.args.get("queuedResourceId") or request.args.get("queued_resource_id") or ""
    return cloud.create_queued_resource(a["project"], a["zone"], name, _body(request))


def _queued_get(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.get_queued_resource(a["project"], a["zone"], a["name"])


def _queued_list(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    items = cloud.list_queued_resources(a["project"], a["zone"])
    page, token = _page(request, items, size_param="pageSize")
    answer: JSON = {"queuedResources": page}
    if token:
        answer["nextPageToken"] = token
    return answer


def _queued_delete(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    force = _true(request.args.get("force"))
    return cloud.delete_queued_resource(a["project"], a["zone"], a["name"], force)


def _tpu_operation(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.get_tpu_operation(a["project"], a["zone"], a["name"])


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


def _admin_advance(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    cloud.advance(_seconds(_admin_body(request)))
    return {"now": cloud.clock.now().isoformat()}


def _admin_reset(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    cloud.reset()
    return {}


def _admin_state(cloud: SimulatedCloud, request: Request, a: dict[str, str]) -> object:
    return cloud.state()


# ---------------------------------------------------------------------- routing

_ROUTES: list[tuple[str, str, Handler]] = [
    ("POST", _COMPUTE + "/global/instanceTemplates", _template_insert),
    ("GET", _COMPUTE + "/global/instanceTemplates", _template_list),
    ("GET", _COMPUTE + "/global/instanceTemplates/<name>", _template_get),
    ("DELETE", _COMPUTE + "/global/instanceTemplates/<name>", _template_delete),
    ("GET", _COMPUTE + "/global/operations/<name>", _global_operation),
    ("POST", _COMPUTE + "/global/operations/<name>/wait", _global_operation),
    ("POST", _ZONE + "/instanceGroupManagers", _mig_insert),
    ("GET", _ZONE + "/instanceGroupManagers", _mig_list),
    ("GET", _MIG, _mig_get),
    ("DELETE", _MIG, _mig_delete),
    ("POST", _MIG + "/listManagedInstances", _mig_managed),
    ("POST", _MIG + "/deleteInstances", _mig_delete_instances),
    ("POST", _MIG + "/resizeRequests", _resize_insert),
    ("GET", _MIG + "/resizeRequests", _resize_list),
    ("GET", _MIG + "/resizeRequests/<name>", _resize_get),
    ("DELETE", _MIG + "/resizeRequests/<name>", _resize_delete),
    ("POST", _MIG + "/resizeRequests/<name>/cancel", _resize_cancel),
    ("POST", _ZONE + "/instances", _instance_insert),
    ("GET", _ZONE + "/instances", _instance_list),
    ("GET", _ZONE + "/instances/<name>", _instance_get),
    ("DELETE", _ZONE + "/instances/<name>", _instance_delete),
    ("POST", _ZONE + "/futureReservations", _future_insert),
    ("GET", _ZONE + "/futureReservations", _future_list),
    ("GET", _ZONE + "/futureReservations/<name>", _future_get),
    ("DELETE", _ZONE + "/futureReservations/<name>", _future_delete),
    ("POST", _ZONE + "/futureReservations/<name>/cancel", _future_cancel),
    ("GET", _ZONE + "/reservations", _reservation_list),
    ("GET", _ZONE + "/reservations/<name>", _reservation_get),
    ("GET", _ZONE + "/operations/<name>", _zone_operation),
    ("POST", _ZONE + "/operations/<name>/wait", _zone_operation),
    ("POST", _TPU + "/queuedResources", _queued_create),
    ("GET", _TPU + "/queuedResources", _queued_list),
    ("GET", _TPU + "/queuedResources/<name>", _queued_get),
    ("DELETE", _TPU + "/queuedResources/<name>", _queued_delete),
    ("GET", _TPU + "/operations/<name>", _tpu_operation),
    ("POST", "/admin/stock", _admin_stock),
    ("GET", "/admin/stock", _admin_stock),
    ("POST", "/admin/inject", _admin_inject),
    ("POST", "/admin/latency", _admin_latency),
    ("POST", "/admin/advance", _admin_advance),
    ("POST", "/admin/reset", _admin_reset),
    ("GET", "/admin/state", _admin_state),
]


def _url_map() -> Map:
    rules = [Rule(path, methods=[method], endpoint=handler) for method, path, handler in _ROUTES]
    # Trailing slashes are not part of the real APIs; no redirects.
    return Map(rules, strict_slashes=False, merge_slashes=False)


def _json(status: int, payload: object) -> Response:
    return Response(json.dumps(payload), status=status, mimetype="application/json")


def _error(status: int, reason: str, message: str) -> Response:
    """An error answer as Google APIs give it; api_core maps the status to its exception."""
    error = {
        "code": status,
        "message": message,
        "errors": [{"message": message, "domain": "global", "reason": reason}],
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

    def __call__(self, environ: Any, start_response: Any) -> Any:
        response = self._dispatch(Request(environ))
        return response(environ, start_response)

    def _dispatch(self, request: Request) -> Response:
        try:
            handler, arguments = self._map.bind_to_environ(request.environ).match()
        except HTTPException as error:
            status = error.code or 404
            return _error(status, "notFound", f"{request.method} {request.path}: {error.name}")
        try:
            return _json(200, handler(self.cloud, request, arguments))
        except CloudError as error:
            return _error(error.http_status, error.reason, error.message)
        except (_AdminInputError, ValueError) as error:
            return _error(400, "invalid", str(error))
        except Exception as error:
            # A bug in the emulator: answer JSON so the client's error names it.
            return _error(500, "backendError", f"{type(error).__name__}: {error}")


class _QuietHandler(WSGIRequestHandler):
    """Do not log every request to stderr."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        return None


class ComputeEmulator:
    """The Compute/TPU REST emulator on a background thread; a context manager.

    ``endpoint`` (``http://HOST:PORT``) is what clients pass as ``api_endpoint``; ``cloud`` is
    the simulated cloud behind it, to steer directly from Python.
    """

    def __init__(
        self, cloud: SimulatedCloud | None = None, host: str = HOST, port: int = 0
    ) -> None:
        self.cloud = cloud if cloud is not None else SimulatedCloud()
        self._host = host
        self._port = port
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise EmulatorError("the Compute emulator is not running")
        return f"http://{self._host}:{self._server.server_port}"

    def start(self) -> Self:
        if self._server is not None:
            return self
        server = make_server(
            self._host,
            self._port,
            _Application(self.cloud),
            threaded=True,
            request_handler=_QuietHandler,
        )
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="compute-emulator", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server, self._thread = None, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


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

    def inject(self, zone: str, shape: str, kind: str, count: int = 1) -> None:
        body = {"zone": zone, "shape": shape, "kind": kind, "count": count}
        self._call("POST", "/admin/inject", body)

    def set_latency(self, latency: timedelta) -> None:
        self._call("POST", "/admin/latency", {"seconds": latency.total_seconds()})

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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m emulators.compute",
        description="Serve the Compute Engine v1 / Cloud TPU v2 emulator until interrupted.",
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
    parser.add_argument("--latency", type=float, default=20.0, help="provisioning latency, s")
    options = parser.parse_args(argv)
    if options.latency < 0:
        parser.error("--latency cannot be negative")
    cloud = SimulatedCloud(provisioning_latency=timedelta(seconds=options.latency))
    for zone, shape, units in options.stock:
        cloud.set_stock(zone, shape, units)
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
