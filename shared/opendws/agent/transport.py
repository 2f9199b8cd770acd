"""JSON over HTTP/1.1 to the agent function, and reads from the metadata server.

An answer is one of three things: a JSON object (2xx), :class:`Refused` (a 4xx other than 408
and 429: a definite no, with the server's ``error`` text), or :class:`Unreachable` (no
connection, a timeout, a 5xx, 408 or 429, or a body that is not a JSON object: try again
later)."""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

TIMEOUT_S = 10.0
METADATA_HOST = "metadata.google.internal"  # compute/docs/metadata/querying-metadata
AGENT_URL_ATTRIBUTE = "opendws-agent-url"
RETRIED_STATUSES = frozenset({408, 429})

# The metadata server is reached directly, never through a proxy the environment names.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_DEFAULT = urllib.request.build_opener()


class Unreachable(Exception):
    """The other side could not be reached or asked to be asked again later."""


class Refused(Exception):
    """A definite answer other than success: the HTTP status and the server's error text."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(f"HTTP {status}: {error}")
        self.status = status
        self.error = error


def _error_text(body: bytes) -> str:
    try:
        value = json.loads(body.decode("utf-8"))
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:500]
    if isinstance(value, dict) and isinstance(value.get("error"), str):
        return str(value["error"])
    return json.dumps(value)[:500]


def _send(
    opener: urllib.request.OpenerDirector, request: urllib.request.Request, timeout_s: float
) -> bytes:
    try:
        with opener.open(request, timeout=timeout_s) as response:
            body: bytes = response.read()
            return body
    except urllib.error.HTTPError as error:
        body = error.read()
        if error.code >= 500 or error.code in RETRIED_STATUSES:
            raise Unreachable(f"HTTP {error.code} from {request.full_url}") from None
        raise Refused(error.code, _error_text(body)) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        raise Unreachable(f"{request.full_url}: {error}") from None


def post(
    url: str, body: Mapping[str, Any], bearer: str, timeout_s: float = TIMEOUT_S
) -> dict[str, Any]:
    """POST ``body`` as JSON with ``Authorization: Bearer``; the reply's JSON object ({} for
    an empty reply, as 204 has)."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode("utf-8"),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + bearer},
    )
    raw = _send(_DEFAULT, request, timeout_s)
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw.decode("utf-8"))
    except ValueError:
        raise Unreachable(f"{url} answered with a body that is not JSON") from None
    if not isinstance(value, dict):
        raise Unreachable(f"{url} answered with JSON that is not an object")
    return value


def metadata_base() -> str:
    """The metadata server's base URL: ``$GCE_METADATA_HOST`` (host[:port]) where set."""
    host = os.environ.get("GCE_METADATA_HOST") or METADATA_HOST
    return "http://" + host + "/computeMetadata/v1/"


def metadata(path: str, query: Mapping[str, str] | None = None) -> str:
    """GET a metadata value (``Metadata-Flavor: Google``), as text."""
    url = metadata_base() + path
    if query:
        url += "?" + urllib.parse.urlencode(query)
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    return _send(_DIRECT, request, TIMEOUT_S).decode("utf-8").strip()


def identity_token(audience: str) -> str:
    """This VM's identity token for ``audience``, with the instance's details (format=full;
    compute/docs/instances/verifying-instance-identity)."""
    return metadata(
        "instance/service-accounts/default/identity",
        {"audience": audience, "format": "full"},
    )


def agent_url_attribute() -> str:
    """The agent function's URL from the instance attribute ``opendws-agent-url``."""
    return metadata("instance/attributes/" + AGENT_URL_ATTRIBUTE)


# What Google's TPU VMs serve of their slice (Ray's and JAX's TPU code read the same keys:
# ray/_private/accelerators/tpu.py, jax/_src/clusters/cloud_tpu_cluster.py).
TPU_WORKER_ATTRIBUTE = "agent-worker-number"
TPU_ENV_ATTRIBUTE = "tpu-env"
TPU_ORDER_KEY_ATTRIBUTE = "opendws-order-key"  # opendws.ports.runs.TPU_ORDER_KEY


def tpu_env_value(text: str, key: str) -> str | None:
    """A value of ``tpu-env``, whose lines are ``KEY: 'value'`` (as JAX reads it)."""
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == key:
            return value.strip().strip("'\"")
    return None


def tpu_claim() -> dict[str, Any] | None:
    """On a TPU VM, what the agent says of itself when it registers: its node (``tpu-env``'s
    ``NODE_ID``), worker number (``agent-worker-number``) and the order's key (the node
    metadata item ``opendws-order-key``); None on a VM that is not a TPU worker (no
    ``agent-worker-number``). Unreachable when a TPU worker's metadata lacks the rest."""
    try:
        worker = metadata("instance/attributes/" + TPU_WORKER_ATTRIBUTE)
    except Refused as refused:
        if refused.status == 404:
            return None
        raise Unreachable(f"metadata {TPU_WORKER_ATTRIBUTE}: {refused}") from None
    try:
        env = metadata("instance/attributes/" + TPU_ENV_ATTRIBUTE)
        key = metadata("instance/attributes/" + TPU_ORDER_KEY_ATTRIBUTE)
    except Refused as refused:
        raise Unreachable(f"a TPU worker's metadata lacks a value: {refused}") from None
    node = tpu_env_value(env, "NODE_ID")
    if node is None or not worker.isdigit():
        raise Unreachable(f"a TPU worker's metadata: NODE_ID {node!r}, worker {worker!r}")
    return {"node": node, "worker": int(worker), "key": key}
