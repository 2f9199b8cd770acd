"""A Compute Engine metadata server emulator: one per simulated VM, an HTTP server on the VM's
own address (``127.0.0.x:port`` locally) that speaks Google's metadata protocol, so that the
agent on the VM — and google-auth, pointed at it with ``GCE_METADATA_HOST`` and
``GCE_METADATA_IP`` — reads its identity as on Compute Engine.

What it serves, as Google documents it:

- **The protocol** (compute/docs/metadata/querying-metadata): everything lies under
  ``/computeMetadata/v1/``; a request without the header ``Metadata-Flavor: Google`` is
  refused (403), and so is one that carries ``X-Forwarded-For`` ("automatically rejected by the
  metadata server"); every answer carries ``Metadata-Flavor: Google`` (google-auth's
  ``_metadata.ping`` checks it, at the server's root, before trusting the server). A path
  ending in ``/`` is a directory: its entries one per line, a sub-directory's with a trailing
  ``/``; ``?recursive=true`` gives the whole directory as one JSON object (keys in camelCase,
  the attributes' keys as set), as google-auth reads ``instance/service-accounts/default/``.
  A directory asked for without its ``/`` is redirected (301) to it. An unknown path or a
  missing attribute is 404 (compute/docs/troubleshooting/troubleshoot-metadata-server: "404 Not
  Found: the requested endpoint doesn't exist").
- **The keys** (compute/docs/metadata/predefined-metadata-keys): ``instance/name``,
  ``instance/id``, ``instance/zone`` (``projects/PROJECT_NUMBER/zones/ZONE``),
  ``instance/hostname`` (the zonal DNS name ``VM.ZONE.c.PROJECT.internal``,
  compute/docs/internal-dns), ``instance/network-interfaces/0/ip``, ``instance/attributes/``
  (the VM's custom metadata), ``instance/service-accounts/{default,EMAIL}/{aliases,email,
  scopes}``, ``project/project-id``, ``project/numeric-project-id``.
- **Identity tokens** (compute/docs/instances/verifying-instance-identity):
  ``instance/service-accounts/default/identity?audience=AUD&format=standard|full`` answers an
  RS256 JWT of the VM's service account: ``aud``, ``azp`` and ``sub`` (the account's numeric
  id), ``email``, ``email_verified``, ``iat``, ``exp`` an hour later and, with
  ``format=full``, ``google.compute_engine`` — ``project_id``, ``project_number``, ``zone``,
  ``instance_id``, ``instance_name``, ``instance_creation_timestamp`` (and ``license_id``
  with ``licenses=TRUE``: none, locally). Without an audience the answer is 400 ("non-empty
  audience parameter required", as Google words it; troubleshoot-metadata-server: 400 when "a
  request has improper query parameters").

A TPU VM (a worker of a Cloud TPU node) is an :class:`Instance` too: its name, id, zone,
service account and attributes are the worker's (``emulators.vms`` says what a worker is
given), its ``project/project-id`` the user's project, and its identity token's
``google.compute_engine.project_id``/``project_number`` those of the Google tenant project
the TPU VM lives in (``token_project_id``/``token_project_number``; a Compute Engine VM's
token names its own project, the default).

Tokens are signed by a :class:`~emulators.signing.LocalSigner` shared by every VM of the local
cloud (Google signs every VM's token with its own keys) and carry :data:`ISSUER`, not Google's,
so a verifier of Google's tokens never accepts one; a verifier of these is given the signer's
``certs`` and :data:`ISSUER`. Tokens are dated by the injected clock.

Not emulated: access tokens (``.../token``), ``alt=`` (answered 400 naming it),
``wait-for-change``, guest attributes, project attributes, and every key not listed above.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from werkzeug.wrappers import Request, Response

from emulators.official import HOST
from emulators.serving import BackgroundServer
from emulators.signing import TOKEN_LIFETIME, LocalSigner, account_id
from opendws.clock import SystemClock
from opendws.ports import Clock

# The ``iss`` of the identity tokens the emulator signs: deliberately not Google's
# (``https://accounts.google.com``), so that a verifier of Google's tokens never accepts one.
ISSUER = "opendws-metadata-emulator"
ROOT = "/computeMetadata/v1/"
FLAVOR = ("Metadata-Flavor", "Google")
# The scope a VM's service account gets by default in opendws' templates.
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
_TEXT = "application/text"
_JSON = "application/json"
_FORMATS = ("standard", "full")


@dataclass(frozen=True)
class Instance:
    """What the metadata server knows of its VM (as Compute Engine reports it).

    ``token_project_id``/``token_project_number``: the project its identity token names,
    when not ``project_id``/``project_number`` (a TPU VM's tenant project; both or neither).
    """

    name: str
    instance_id: str  # Compute's ``id``: decimal digits, never reused
    zone: str
    project_id: str
    project_number: int
    internal_ip: str
    service_account: str  # the VM's service account's email
    created_at: datetime
    attributes: Mapping[str, str] = field(default_factory=dict)
    scopes: tuple[str, ...] = (CLOUD_PLATFORM,)
    token_project_id: str | None = None
    token_project_number: int | None = None

    def __post_init__(self) -> None:
        if not self.instance_id.isdigit():
            raise ValueError(f"instance_id {self.instance_id!r}: Compute's id, decimal digits")
        if self.project_number <= 0:
            raise ValueError(f"project_number {self.project_number}: a positive number")
        if self.created_at.tzinfo is None:
            raise ValueError(f"created_at {self.created_at!r}: timezone-aware")
        if "@" not in self.service_account:
            raise ValueError(f"service_account {self.service_account!r}: an email")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.attributes.items()):
            raise ValueError("attributes: strings by strings (custom metadata)")
        if (self.token_project_id is None) != (self.token_project_number is None):
            raise ValueError("token_project_id and token_project_number: both or neither")
        if self.token_project_id is not None and not self.token_project_id:
            raise ValueError("token_project_id: a project id, not empty")
        if self.token_project_number is not None and self.token_project_number <= 0:
            raise ValueError(f"token_project_number {self.token_project_number}: positive")

    @property
    def token_project(self) -> tuple[str, int]:
        """(project id, project number) its identity tokens name."""
        if self.token_project_id is not None and self.token_project_number is not None:
            return self.token_project_id, self.token_project_number
        return self.project_id, self.project_number

    @property
    def hostname(self) -> str:
        """The VM's zonal internal DNS name (compute/docs/internal-dns)."""
        return f"{self.name}.{self.zone}.c.{self.project_id}.internal"


@dataclass(frozen=True)
class _Leaf:
    """A value: its text (what a plain GET answers) and its JSON form (in a recursive GET)."""

    text: str
    value: object


@dataclass(frozen=True)
class _Folder:
    """A directory. ``verbatim``: its entries keep their names in JSON (attributes, accounts)
    instead of Google's camelCase for built-in keys; ``array``: its entries are numbered
    (network interfaces) and its JSON is a list."""

    entries: Mapping[str, _Node]
    verbatim: bool = False
    array: bool = False


@dataclass(frozen=True)
class _Token:
    """A value made at each request (an identity token): listed, never in recursive JSON."""


_Node = _Leaf | _Folder | _Token


def _camel(name: str) -> str:
    head, *rest = name.split("-")
    return head + "".join(part.capitalize() for part in rest)


def _json(node: _Folder) -> object:
    """The directory as a recursive GET answers it."""
    values = {
        name: _json(child) if isinstance(child, _Folder) else child.value
        for name, child in node.entries.items()
        if not isinstance(child, _Token)
    }
    if node.array:
        return list(values.values())
    return {name if node.verbatim else _camel(name): value for name, value in values.items()}


def _listing(node: _Folder) -> str:
    return "".join(
        f"{n}/\n" if isinstance(c, _Folder) else f"{n}\n" for n, c in node.entries.items()
    )


def _text(value: str | int) -> _Leaf:
    return _Leaf(str(value), value)


def tree(instance: Instance) -> _Folder:
    """The metadata of ``instance`` under ``/computeMetadata/v1/``."""
    account = _Folder({
        "aliases": _Leaf("default\n", ["default"]),
        "email": _text(instance.service_account),
        "identity": _Token(),
        "scopes": _Leaf("".join(f"{s}\n" for s in instance.scopes), list(instance.scopes)),
    })  # fmt: skip
    return _Folder({
        "instance": _Folder({
            "attributes": _Folder(
                {k: _text(v) for k, v in sorted(instance.attributes.items())}, verbatim=True
            ),
            "hostname": _text(instance.hostname),
            "id": _Leaf(instance.instance_id, int(instance.instance_id)),
            "name": _text(instance.name),
            "network-interfaces": _Folder(
                {"0": _Folder({"ip": _text(instance.internal_ip)})}, array=True
            ),
            "service-accounts": _Folder(
                {"default": account, instance.service_account: account}, verbatim=True
            ),
            "zone": _text(f"projects/{instance.project_number}/zones/{instance.zone}"),
        }),
        "project": _Folder({
            "numeric-project-id": _text(instance.project_number),
            "project-id": _text(instance.project_id),
        }),
    })  # fmt: skip


class _Refusal(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def identity_claims(
    instance: Instance, audience: str, token_format: str, now: datetime, *, licenses: bool = False
) -> dict[str, object]:
    """The claims of ``instance``'s identity token for ``audience`` at ``now``
    (compute/docs/instances/verifying-instance-identity)."""
    issued = int(now.timestamp())
    subject = account_id(instance.service_account)
    claims: dict[str, object] = {
        "iss": ISSUER,
        "aud": audience,
        "azp": subject,
        "sub": subject,
        "email": instance.service_account,
        "email_verified": True,
        "iat": issued,
        "exp": issued + int(TOKEN_LIFETIME.total_seconds()),
    }
    if token_format == "full":
        project_id, project_number = instance.token_project
        engine: dict[str, object] = {
            "project_id": project_id,
            "project_number": project_number,
            "zone": instance.zone,
            "instance_id": instance.instance_id,
            "instance_name": instance.name,
            "instance_creation_timestamp": int(instance.created_at.timestamp()),
        }
        if licenses:
            engine["license_id"] = []
        claims["google"] = {"compute_engine": engine}
    return claims


class _Application:
    """The WSGI application: check the request, walk the tree, answer."""

    def __init__(self, server: MetadataServer) -> None:
        self._server = server

    def __call__(self, environ: Any, start_response: Any) -> Any:
        request = Request(environ)
        try:
            response = self._answer(request)
        except _Refusal as refusal:
            response = Response(f"{refusal.message}\n", refusal.status, content_type=_TEXT)
        response.headers["Metadata-Flavor"] = "Google"
        response.headers["Server"] = "Metadata Server for VM"
        return response(environ, start_response)

    def _answer(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            raise _Refusal(405, f"{request.method} is not served: the metadata server is read "
                           "with GET")  # fmt: skip
        if request.headers.get("X-Forwarded-For") is not None:
            raise _Refusal(403, "Request containing X-Forwarded-For header is rejected.")
        if request.path == "/":
            return Response("computeMetadata/\n", content_type=_TEXT)
        flavor = request.headers.get("Metadata-Flavor")
        if flavor != "Google":
            raise _Refusal(403, 'Missing required header "Metadata-Flavor": "Google"'
                           + ("" if flavor is None else f" (got {flavor!r})"))  # fmt: skip
        if request.path in ("/computeMetadata", ROOT.rstrip("/")):
            return _redirect(request, request.path + "/")
        if request.path == "/computeMetadata/":
            return Response("v1/\n", content_type=_TEXT)
        if not request.path.startswith(ROOT):
            raise _Refusal(404, f"{request.path} was not found on this server")
        if "alt" in request.args:
            raise _Refusal(400, f"alt={request.args['alt']}: not emulated (plain or "
                           "recursive=true)")  # fmt: skip
        return self._walk(request)

    def _walk(self, request: Request) -> Response:
        rest = request.path[len(ROOT) :]
        directory = rest == "" or rest.endswith("/")
        node: _Node = self._server.tree
        names = [urllib.parse.unquote(n) for n in rest.strip("/").split("/") if n]
        for name in names:
            if not isinstance(node, _Folder) or name not in node.entries:
                raise _Refusal(404, f"{request.path} was not found on this server")
            node = node.entries[name]
        if isinstance(node, _Folder):
            if not directory:
                return _redirect(request, request.path + "/")
            if request.args.get("recursive", "").lower() == "true":
                return Response(json.dumps(_json(node)), content_type=_JSON)
            return Response(_listing(node), content_type=_TEXT)
        if directory:
            raise _Refusal(404, f"{request.path} was not found on this server")
        if isinstance(node, _Token):
            return Response(self._identity(request), content_type=_TEXT)
        return Response(node.text, content_type=_TEXT)

    def _identity(self, request: Request) -> str:
        audience = request.args.get("audience", "")
        if not audience:
            raise _Refusal(400, "non-empty audience parameter required")
        token_format = request.args.get("format", "standard")
        if token_format not in _FORMATS:
            raise _Refusal(400, f"format={token_format}: must be standard or full")
        licenses = request.args.get("licenses", "FALSE").upper()
        if licenses not in ("TRUE", "FALSE"):
            raise _Refusal(400, f"licenses={licenses}: must be TRUE or FALSE")
        server, full = self._server, token_format == "full"
        claims = identity_claims(server.instance, audience, token_format, server.clock.now(),
                                 licenses=full and licenses == "TRUE")  # fmt: skip
        return server.signer.sign(claims)


def _redirect(request: Request, path: str) -> Response:
    query = f"?{request.query_string.decode()}" if request.query_string else ""
    response = Response(f"{path}\n", 301, content_type="text/html")
    response.headers["Location"] = f"{request.host_url.rstrip('/')}{path}{query}"
    return response


class MetadataServer(BackgroundServer):
    """One VM's metadata server on a background thread; a context manager.

    ``signer``: the local signer of identity tokens, shared by the VMs of one local cloud (its
    ``certs`` are what the verifier trusts). ``clock``: what dates the tokens (the system clock
    unless given). ``host``: the VM's own address (``127.0.0.x`` locally; Linux routes all of
    127.0.0.0/8 to loopback). ``host_port`` is what ``GCE_METADATA_HOST`` and
    ``GCE_METADATA_IP`` are set to for google-auth.
    """

    def __init__(
        self,
        instance: Instance,
        signer: LocalSigner,
        *,
        clock: Clock | None = None,
        host: str = HOST,
        port: int = 0,
    ) -> None:
        super().__init__(host, port, what=f"the metadata server of {instance.name}",
                         thread_name=f"metadata-{instance.name}")  # fmt: skip
        self.instance = instance
        self.signer = signer
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.tree = tree(instance)

    def application(self) -> _Application:
        return _Application(self)

    @property
    def host_port(self) -> str:
        return self.address

    @property
    def url(self) -> str:
        """The metadata root, as ``http://metadata.google.internal/computeMetadata/v1/``."""
        return f"http://{self.host_port}{ROOT}"
