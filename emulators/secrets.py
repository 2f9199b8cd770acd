"""A Secret Manager stand-in: Google's REST API for one project's secrets
(secret-manager/docs/reference/rest/v1), enough for the agent function to read a run's secrets
with Google's own client (``SecretManagerServiceClient(transport="rest",
client_options={"api_endpoint": URL})``) and for the local stack to put them there.

Served (JSON as Google's, camelCase; errors ``{"error": {"code", "message", "status"}}``):

- ``GET /v1/projects/P/secrets/S/versions/V:access`` → ``{"name", "payload": {"data":
  base64, "dataCrc32c": "decimal"}}`` (``V`` a number or ``latest``);
- ``POST /v1/projects/P/secrets?secretId=S`` (create) → the Secret;
- ``POST /v1/projects/P/secrets/S:addVersion`` with ``{"payload": {"data": base64,
  "dataCrc32c"?}}`` → the SecretVersion (a checksum that does not match the data is refused);
- ``POST /v1/projects/P/secrets/S/versions/V:disable`` / ``:enable`` / ``:destroy`` → the
  SecretVersion.

The rules (numbering, ``latest``, states, refusals) are
:class:`opendws.adapters.secrets.SecretVersions`'; :attr:`SecretManagerEmulator.versions` is
that store, for a local caller to add versions directly. Not emulated: regional secrets
(``projects/P/locations/L/…``), listing, IAM, labels, replication, rotation, expiry, etags;
no credentials are checked.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from werkzeug.wrappers import Request, Response

from emulators.official import HOST
from emulators.serving import BackgroundServer
from opendws.adapters.secrets import SecretRefused, SecretVersions, crc32c

_ACCESS = re.compile(r"/v1/(projects/[^/]+/secrets/[^/]+/versions/[^/:]+):access")
_CREATE = re.compile(r"/v1/projects/(?P<project>[^/]+)/secrets")
_ADD = re.compile(r"/v1/projects/(?P<project>[^/]+)/secrets/(?P<secret>[^/:]+):addVersion")
_STATE = re.compile(r"/v1/(projects/[^/]+/secrets/[^/]+/versions/[^/:]+):(disable|enable|destroy)")
_STATES = {"disable": "DISABLED", "enable": "ENABLED", "destroy": "DESTROYED"}


class _Application:
    def __init__(self, versions: SecretVersions) -> None:
        self.versions = versions

    def __call__(self, environ: Any, start_response: Any) -> Any:
        request = Request(environ)
        try:
            status, body = self._answer(request)
        except SecretRefused as refused:
            status = refused.code
            body = {"error": {"code": refused.code, "message": refused.message,
                              "status": refused.status}}  # fmt: skip
        response = Response(json.dumps(body), status, content_type="application/json")
        return response(environ, start_response)

    def _answer(self, request: Request) -> tuple[int, dict[str, Any]]:
        path, method = request.path, request.method
        if method == "GET" and (match := _ACCESS.fullmatch(path)):
            name, data = self.versions.access(match[1])
            payload = {"data": base64.b64encode(data).decode(), "dataCrc32c": str(crc32c(data))}
            return 200, {"name": name, "payload": payload}
        if method == "POST" and (match := _ADD.fullmatch(path)):
            self._own(match["project"])
            data = _payload(_json(request))
            name = self.versions.add_version(match["secret"], data)
            return 200, {"name": name, "state": "ENABLED"}
        if method == "POST" and (match := _CREATE.fullmatch(path)):
            self._own(match["project"])
            secret = request.args.get("secretId", "")
            name = self.versions.create(secret)
            return 200, {"name": name, "replication": {"automatic": {}}}
        if method == "POST" and (match := _STATE.fullmatch(path)):
            name = self.versions.set_state(match[1], _STATES[match[2]])
            return 200, {"name": name, "state": _STATES[match[2]]}
        raise SecretRefused(404, "NOT_FOUND", f"{method} {path} is not served by this stand-in")

    def _own(self, project: str) -> None:
        if project not in (self.versions.project_id, str(self.versions.project_number)):
            raise SecretRefused(
                403, "PERMISSION_DENIED",
                f"Permission denied on resource project {project} (or it may not exist).",
            )  # fmt: skip


def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(request.get_data() or b"{}")
    except ValueError:
        raise SecretRefused(400, "INVALID_ARGUMENT", "the request body is not JSON") from None
    if not isinstance(body, dict):
        raise SecretRefused(400, "INVALID_ARGUMENT", "the request body must be a JSON object")
    return body


def _payload(body: dict[str, Any]) -> bytes:
    """An addVersion request's ``payload.data``, checked against its ``dataCrc32c``."""
    payload = body.get("payload")
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), str):
        raise SecretRefused(400, "INVALID_ARGUMENT", "payload.data: base64 data is required")
    try:
        data = base64.b64decode(payload["data"], validate=True)
    except binascii.Error:
        raise SecretRefused(400, "INVALID_ARGUMENT", "payload.data: not base64") from None
    checksum = payload.get("dataCrc32c")
    if checksum is not None and str(checksum) != str(crc32c(data)):
        raise SecretRefused(
            400, "INVALID_ARGUMENT",
            "payload.dataCrc32c does not match the data: it was corrupted on the way",
        )  # fmt: skip
    return data


class SecretManagerEmulator(BackgroundServer):
    """The stand-in on a background thread (``url`` is the client's ``api_endpoint``); a
    context manager."""

    def __init__(
        self, project_id: str, project_number: int, *, host: str = HOST, port: int = 0
    ) -> None:
        super().__init__(host, port, what="the Secret Manager stand-in",
                         thread_name="secret-manager")  # fmt: skip
        self.versions = SecretVersions(project_id, project_number)

    def application(self) -> _Application:
        return _Application(self.versions)

    @property
    def url(self) -> str:
        return f"http://{self.address}"
