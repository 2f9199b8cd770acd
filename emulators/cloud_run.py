"""A local Cloud Run front: an HTTP reverse proxy put before one function, doing what Cloud Run
does with a request before the function's code sees it.

- **Ingress** (run/docs/securing/ingress). ``all`` takes every request. ``internal`` takes only
  requests from inside: Cloud Tasks, Pub/Sub, Eventarc, Cloud Scheduler and Workflows of the
  same project, and the project's VPC networks; the internet cannot reach the service. On one
  machine every caller is on 127.0.0.1, so "inside" is a listener of its own: the front
  listens twice, at :attr:`CloudRunFront.url` (the internet's way in) and at
  :attr:`CloudRunFront.internal_url` (Google's network: the local stack gives this URL to the
  Cloud Tasks emulator, and to nothing a user calls). An internal-only service answers 404 to
  everything that arrives at ``url``, as Cloud Run answers a request its ingress blocks
  (run/docs/troubleshooting).
- **Invoker check** (run/docs/securing/managing-access, run/docs/authenticating/
  service-to-service). A public service (``allUsers`` holds ``roles/run.invoker``) passes
  requests on untouched, ``Authorization`` included. A service that requires authentication
  takes a request only with ``Authorization: Bearer`` a Google-signed ID token: none is 401;
  one that does not verify (signature, ``iat``/``exp``, issuer), whose audience is not the
  service's, or whose verified ``email`` does not hold the invoker role is 403. The audiences
  Google accepts are the service's ``run.app`` URL (run/docs/configuring/custom-audiences:
  "by default ... the Google-generated URL for a service ending in run.app") and, for a
  function, its ``cloudfunctions.net`` URL (functions/docs/samples/functions-bearer-token:
  "for Cloud Functions, endpoint and audience are the same"). The request is then passed on
  with the token's signature replaced by ``SIGNATURE_REMOVED_BY_GOOGLE``
  (run/docs/troubleshooting#signature-removed; einride/iam-go ``iamgoogle/signature.go``).

Tokens are verified against the certificates given (the Cloud Tasks emulator's, whose tokens
carry its own issuer) or, with none, against Google's.

A request carrying ``X-Serverless-Authorization`` is checked on that header (its signature
replaced the same way) and its ``Authorization`` handed on untouched, as Cloud Run does
(:func:`opendws.adapters.oidc.invocation_token`). Not emulated: custom audiences, IAM
conditions, Cloud Run's own headers (``X-Cloud-Trace-Context`` and the like), request size and
time limits.
"""

from __future__ import annotations

import http.client
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import Any, Self

from werkzeug.wrappers import Request, Response

from emulators.official import HOST, EmulatorError
from emulators.serving import BackgroundServer
from opendws.adapters.oidc import invocation_header, invocation_token

# What Cloud Run puts in place of the signature of a token it checked.
REMOVED_SIGNATURE = "SIGNATURE_REMOVED_BY_GOOGLE"
GOOGLE_ISSUERS = frozenset({"accounts.google.com", "https://accounts.google.com"})
# How far a token's iat may be ahead of the front's clock, and its exp behind it.
CLOCK_SKEW_SECONDS = 10
# How long the front waits for the function's answer (Cloud Run's default request timeout).
FORWARD_TIMEOUT = 300.0
# Headers that belong to one connection, not to the request (RFC 9110 section 7.6.1).
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "host", "content-length",
})  # fmt: skip


class Ingress(Enum):
    """Who may reach the service at all (run/docs/securing/ingress)."""

    ALL = "all"
    INTERNAL = "internal"


def run_app_url(service: str, project_number: str, region: str) -> str:
    """A service's deterministic URL (run/docs/triggering/https-request):
    ``https://SERVICE-PROJECT_NUMBER.REGION.run.app``."""
    return f"https://{service}-{project_number}.{region}.run.app"


def function_url(function: str, project: str, region: str) -> str:
    """A function's URL (functions/docs/samples/functions-bearer-token):
    ``https://REGION-PROJECT.cloudfunctions.net/FUNCTION``."""
    return f"https://{region}-{project}.cloudfunctions.net/{function}"


@dataclass(frozen=True)
class Service:
    """What Cloud Run knows of one service: its ingress, and who holds ``roles/run.invoker``
    on it (None: ``allUsers``, a public service) with the audiences it accepts."""

    name: str
    ingress: Ingress = Ingress.ALL
    invokers: frozenset[str] | None = None
    audiences: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.invokers is not None and not self.audiences:
            raise ValueError(f"{self.name}: a service that requires authentication needs "
                             "its audiences (its run.app URL, its function URL)")  # fmt: skip


class Refusal(Exception):
    """What Cloud Run answers instead of passing the request on."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class InvokerCheck:
    """Cloud Run's check of a service's caller: the bearer ID token's signature, dates,
    issuer and audience, and the invoker role of its email."""

    def __init__(
        self, service: Service, *, certs: Mapping[str, str] | None = None,
        issuers: frozenset[str] = GOOGLE_ISSUERS,
    ) -> None:  # fmt: skip
        self._service = service
        self._certs = dict(certs) if certs is not None else None
        self._issuers = issuers

    def checked(self, authorization: str | None) -> str | None:
        """The ``Authorization`` header to hand on (a checked token without its signature;
        the header as it came for a public service), or Refusal."""
        invokers = self._service.invokers
        if invokers is None:
            return authorization
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Refusal(401, "The request was not authenticated: no bearer ID token.")
        claims = self._verified(token)
        if claims.get("iss") not in self._issuers:
            raise Refusal(403, f"token issuer {claims.get('iss')!r} is not accepted")
        if claims.get("aud") not in self._service.audiences:
            raise Refusal(403, f"token audience {claims.get('aud')!r} is not this service's "
                          f"({', '.join(sorted(self._service.audiences))})")  # fmt: skip
        email = claims.get("email")
        if claims.get("email_verified") is not True or email not in invokers:
            raise Refusal(403, f"{email!r} may not invoke {self._service.name} "
                          "(it lacks roles/run.invoker on the service)")  # fmt: skip
        header, payload, _signature = token.split(".")
        return f"Bearer {header}.{payload}.{REMOVED_SIGNATURE}"

    def _verified(self, token: str) -> dict[str, Any]:
        import google.auth.exceptions
        import google.auth.transport.requests
        from google.auth import jwt
        from google.oauth2 import id_token

        try:
            if self._certs is None:
                return dict(
                    id_token.verify_token(
                        token,
                        google.auth.transport.requests.Request(),
                        audience=None,
                        clock_skew_in_seconds=CLOCK_SKEW_SECONDS,
                    )
                )
            decoded: dict[str, Any] = jwt.decode(  # type: ignore[no-untyped-call]
                token, certs=self._certs, verify=True, audience=None,
                clock_skew_in_seconds=CLOCK_SKEW_SECONDS,
            )  # fmt: skip
            return decoded
        except (ValueError, google.auth.exceptions.GoogleAuthError) as error:
            raise Refusal(403, f"the ID token does not verify: {error}") from None


class _Application:
    """The front's WSGI application for one listener (internal or not)."""

    def __init__(self, front: CloudRunFront, *, internal: bool) -> None:
        self._front = front
        self._internal = internal

    def __call__(self, environ: Any, start_response: Any) -> Any:
        request = Request(environ)
        try:
            response = self._front.handle(request, internal=self._internal)
        except Refusal as refusal:
            response = Response(f"Error: {refusal.message}\n", refusal.status,
                                content_type="text/plain; charset=utf-8")  # fmt: skip
        return response(environ, start_response)


class CloudRunFront:
    """One service's Cloud Run front before the function at ``target`` (its URL), on two
    background listeners; a context manager. ``certs``/``issuers``: what the invoker check
    verifies tokens with (see :class:`InvokerCheck`)."""

    def __init__(
        self, target: str, service: Service, *, certs: Mapping[str, str] | None = None,
        issuers: frozenset[str] = GOOGLE_ISSUERS, host: str = HOST, port: int = 0,
        internal_port: int = 0,
    ) -> None:  # fmt: skip
        parts = urllib.parse.urlsplit(target)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"target {target!r}: an http://HOST:PORT/ URL")
        self.service = service
        self._target = (parts.hostname, parts.port)
        self._check = InvokerCheck(service, certs=certs, issuers=issuers)
        self._listeners = {
            internal: _Listener(self, host, listening, internal=internal)
            for internal, listening in ((False, port), (True, internal_port))
        }

    @property
    def url(self) -> str:
        """Where the internet reaches the service."""
        return self._url(internal=False)

    @property
    def internal_url(self) -> str:
        """Where Google's network (Cloud Tasks of the project, on one machine) reaches it."""
        return self._url(internal=True)

    def _url(self, *, internal: bool) -> str:
        return f"http://{self._listeners[internal].address}/"

    def handle(self, request: Request, *, internal: bool) -> Response:
        """Cloud Run's answer to ``request``: a refusal, or the function's answer."""
        if self.service.ingress is Ingress.INTERNAL and not internal:
            raise Refusal(404, f"Page not found: {self.service.name} takes internal requests "
                          "only (ingress internal)")  # fmt: skip
        # The header Cloud Run checks: X-Serverless-Authorization when given (then
        # Authorization is the service's own, handed on untouched), else Authorization.
        headers = dict(request.headers)
        checked = invocation_header(headers)
        authorization = self._check.checked(invocation_token(headers))
        return self._forward(request, checked, authorization)

    def _forward(self, request: Request, checked: str, authorization: str | None) -> Response:
        headers = {
            name: value for name, value in request.headers.items()
            if name.lower() not in _HOP_BY_HOP and name.lower() != checked.lower()
        }  # fmt: skip
        if authorization is not None:
            headers[checked] = authorization
        connection = http.client.HTTPConnection(*self._target, timeout=FORWARD_TIMEOUT)
        try:
            path = request.full_path if request.query_string else request.path
            connection.request(request.method, path, body=request.get_data(), headers=headers)
            with connection.getresponse() as answer:
                body = answer.read()
                kept = [(n, v) for n, v in answer.getheaders() if n.lower() not in _HOP_BY_HOP]
                return Response(body, answer.status, headers=kept)
        except (OSError, http.client.HTTPException) as error:
            raise Refusal(503, f"the function did not answer: {error}") from None
        finally:
            connection.close()

    def start(self) -> Self:
        try:
            for listener in self._listeners.values():
                listener.start()
        except EmulatorError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for listener in self._listeners.values():
            listener.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class _Listener(BackgroundServer):
    """One of the front's two listeners: the internet's, or Google's network's."""

    def __init__(self, front: CloudRunFront, host: str, port: int, *, internal: bool) -> None:
        where = "internal " if internal else ""
        super().__init__(
            host,
            port,
            what=f"the Cloud Run front of {front.service.name} ({where}listener)",
            thread_name=f"cloud-run-{front.service.name}",
        )
        self._front = front
        self._internal = internal

    def application(self) -> _Application:
        return _Application(self._front, internal=self._internal)
