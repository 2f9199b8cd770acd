"""Who may call the ``timer`` function: a Cloud Tasks OIDC token for the configured audience
and invoker service account, checked as Google documents it for the tokens its services send
(pubsub/docs/authenticate-push-subscriptions; Cloud Tasks' ``OidcToken`` makes the same kind
of Google-signed ID token):

- the signature, against Google's public certificates (on one machine: the Cloud Tasks
  emulator's, whose certificates are given instead) — unless Cloud Run has checked it (below);
- ``iat`` and ``exp``, allowing a small clock skew (:data:`CLOCK_SKEW`, 10 s): google-auth
  allowed none from 2.1.0 on, and tokens minted a second "in the future" by a clock slightly
  ahead were refused (google-auth-library-python#889); ``clock_skew_in_seconds`` is there
  since google-auth 2.3.2 (#894);
- ``iss``: ``https://accounts.google.com`` or ``accounts.google.com`` for Google's tokens
  (the emulator's tokens carry its own issuer, :data:`EMULATOR_ISSUER`, which a verifier of
  Google's tokens never accepts);
- ``aud``: the configured audience (the timer function's URL);
- ``email_verified`` true, and ``email`` one of the configured invoker accounts.

A missing, malformed, forged, expired or foreign-issued token is Unauthorized (HTTP 401); a
valid Google token for another audience, or from an unverified or other caller, is Forbidden
(HTTP 403). Each error says which check failed.

**Behind Cloud Run's invoker check** (``checked_by_run``; the deployment says so with
``OPENDWS_INVOKER_CHECKED_BY_RUN=true``, which Terraform sets on the timer function, whose Cloud
Run service only the tasks account may invoke): a Cloud Run service that requires
authentication checks the Google-signed ID token itself and passes the request on with the
token's signature replaced by ``SIGNATURE_REMOVED_BY_GOOGLE`` (run/docs/authenticating/
service-to-service; run/docs/troubleshooting#signature-removed: Google removes the signature
so that a non-public service cannot replay the tokens it receives; einride/iam-go
``iamgoogle/signature.go``). The signature can then not be verified again: the claims are read
as handed on and checked all the same (``iss``, ``aud``, ``email_verified``, ``email``, and
``iat``/``exp`` with the same skew). Cloud Run strips the signature of every token it checked
and leaves the header of a public service's calls as they came, so a token whose signature is
still there did not pass Cloud Run's check: it is refused (Unauthorized), never read
unverified. Without the setting, the signature is verified as above, and a stripped token is
refused as invalid.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import google.auth.exceptions
import google.auth.transport.requests
from google.auth import jwt
from google.oauth2 import id_token

# Unauthorized (HTTP 401) and Forbidden (HTTP 403), shared with the API's identity checks.
from opendws.ports.access import Forbidden, Unauthorized

GOOGLE_ISSUERS = frozenset({"accounts.google.com", "https://accounts.google.com"})
# The ``iss`` of the Cloud Tasks emulator's tokens (emulators.cloud_tasks.ISSUER).
EMULATOR_ISSUER = "opendws-cloud-tasks-emulator"
# How far the token's ``iat`` may be ahead of our clock, and its ``exp`` behind it.
CLOCK_SKEW = timedelta(seconds=10)
# What Cloud Run puts in place of the signature of a token it checked.
REMOVED_SIGNATURE = "SIGNATURE_REMOVED_BY_GOOGLE"

__all__ = [
    "CLOCK_SKEW", "EMULATOR_ISSUER", "GOOGLE_ISSUERS", "REMOVED_SIGNATURE", "Forbidden",
    "OidcVerifier", "Unauthorized", "bearer_token", "check_issuer", "invalid_token",
    "signed_claims",
]  # fmt: skip


class OidcVerifier:
    """Checks the ``Authorization: Bearer`` header of a timer call.

    ``callers``: the service-account emails allowed to call (empty: any verified email).
    ``certs``: ``{key id: certificate PEM}`` to verify signatures with; None: Google's own.
    ``issuers``: the accepted ``iss`` values (Google's by default).
    ``checked_by_run``: Cloud Run's invoker check has verified the token and stripped its
    signature (see the module docstring); the claims are read without verifying it again.
    """

    def __init__(
        self,
        *,
        audience: str,
        callers: frozenset[str],
        certs: Mapping[str, str] | None = None,
        issuers: frozenset[str] = GOOGLE_ISSUERS,
        clock_skew: timedelta = CLOCK_SKEW,
        checked_by_run: bool = False,
    ) -> None:
        if not audience:
            raise ValueError("audience: the timer function's URL (or configured audience)")
        if not issuers:
            raise ValueError("issuers: at least one accepted token issuer")
        self._audience = audience
        self._callers = callers
        self._certs = dict(certs) if certs is not None else None
        self._issuers = issuers
        self._skew = int(clock_skew.total_seconds())
        self._checked_by_run = checked_by_run

    def verify(self, authorization: str | None) -> dict[str, Any]:
        """The token's claims, or Unauthorized / Forbidden saying which check failed."""
        token = bearer_token(authorization, "OIDC token")
        claims = self._claims(token)
        check_issuer(claims, self._issuers)
        audience = claims.get("aud")
        if audience != self._audience:
            raise Forbidden(f"token is for audience {audience!r}, not {self._audience!r}")
        email = claims.get("email")
        if claims.get("email_verified") not in (True, "true"):
            raise Forbidden(
                f"token's email {email!r} is not verified "
                f"(email_verified is {claims.get('email_verified')!r}, must be true)"
            )
        if self._callers and email not in self._callers:
            allowed = ", ".join(sorted(self._callers))
            raise Forbidden(f"caller {email!r} may not call the timer function (only {allowed})")
        return claims

    def _claims(self, token: str) -> dict[str, Any]:
        """The claims of a token whose signature (or Cloud Run's check of it), ``iat`` and
        ``exp`` are valid; Unauthorized saying why not."""
        if not self._checked_by_run:
            return signed_claims(token, self._certs, self._skew)
        try:
            return checked_claims(token, self._skew)
        except ValueError as error:
            raise Unauthorized(invalid_token(error, self._skew)) from None


def bearer_token(authorization: str | None, kind: str) -> str:
    """The token of an ``Authorization: Bearer <kind>`` header; Unauthorized without one."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized(f"missing bearer token (Authorization: Bearer <{kind}>)")
    return token.strip()


def signed_claims(token: str, certs: Mapping[str, str] | None, skew: int) -> dict[str, Any]:
    """The claims of a token whose signature verifies — against ``certs`` (``{key id:
    certificate PEM}``), or Google's own when None — and whose ``iat`` and ``exp`` hold within
    ``skew`` seconds of now; Unauthorized saying which check failed."""
    try:
        if certs is None:
            verified = id_token.verify_token(
                token,
                google.auth.transport.requests.Request(),
                audience=None,  # each verifier checks it, with a message of its own
                clock_skew_in_seconds=skew,
            )
            return dict(verified)
        decoded: dict[str, Any] = jwt.decode(  # type: ignore[no-untyped-call]
            token, certs=dict(certs), verify=True, audience=None, clock_skew_in_seconds=skew
        )
        return decoded
    except (ValueError, google.auth.exceptions.GoogleAuthError) as error:
        raise Unauthorized(invalid_token(error, skew)) from None


def check_issuer(claims: Mapping[str, Any], issuers: frozenset[str]) -> None:
    """Unauthorized unless the token's ``iss`` is one of ``issuers``."""
    issuer = claims.get("iss")
    if issuer not in issuers:
        raise Unauthorized(
            f"token issuer {issuer!r} is not accepted (expected {' or '.join(sorted(issuers))})"
        )


def checked_claims(token: str, skew: int) -> dict[str, Any]:
    """The claims of a token Cloud Run has checked (its signature replaced by
    :data:`REMOVED_SIGNATURE`), whose ``iat`` and ``exp`` hold within ``skew`` seconds of now.
    ValueError (with google-auth's words for the dates) for any other token."""
    parts = token.split(".")
    if len(parts) != 3:
        raise ValueError(f"a token has 3 parts separated by dots, not {len(parts)}")
    if parts[2] != REMOVED_SIGNATURE:
        raise ValueError(
            f"the token's signature is not {REMOVED_SIGNATURE}: Cloud Run did not check this "
            "call (OPENDWS_INVOKER_CHECKED_BY_RUN is set, but the service takes unchecked calls)"
        )
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"the token's claims are not base64url JSON: {error}") from None
    if not isinstance(claims, dict):
        raise ValueError("the token's claims are not a JSON object")
    now = int(time.time())
    issued, expires = claims.get("iat"), claims.get("exp")
    if not isinstance(issued, int) or not isinstance(expires, int):
        raise ValueError("the token lacks a numeric iat or exp")
    if now < issued - skew:  # google-auth's words, so that invalid_token names the cause
        raise ValueError(
            f"Token used too early, {now} < {issued}. "
            "Check that your computer's clock is set correctly."
        )
    if expires + skew < now:
        raise ValueError(f"Token expired, {expires} < {now}")
    return claims


# The header Cloud Run checks instead of ``Authorization`` when a request carries it, leaving
# ``Authorization`` to the service (GoogleCloudPlatform/cloud-run-proxy#25: "If
# X-Serverless-Authorization and Authorization are both present, Cloud Run will use
# X-Serverless-Authorization"; IAP takes it too).
SERVERLESS_AUTHORIZATION = "X-Serverless-Authorization"


def invocation_header(headers: Mapping[str, str]) -> str:
    """The name of the header whose ID token Cloud Run's invoker check verifies (and whose
    signature it replaces): ``X-Serverless-Authorization`` when present, else
    ``Authorization`` (names in any case)."""
    present = {name.lower() for name in headers}
    serverless = SERVERLESS_AUTHORIZATION.lower() in present
    return SERVERLESS_AUTHORIZATION if serverless else "Authorization"


def invocation_token(headers: Mapping[str, str]) -> str | None:
    """The value of :func:`invocation_header`. Behind Cloud Run that is the token to read: the
    other header, if any, is the caller's own and was never checked."""
    wanted = invocation_header(headers).lower()
    return next((value for name, value in headers.items() if name.lower() == wanted), None)


def invalid_token(error: Exception, skew: int) -> str:
    """What to say of a token google-auth refused: its validity period, if that was why
    (with the clock skew allowed), else google-auth's own words."""
    text = str(error)
    if "Token expired" in text or "Token used too early" in text:
        return (
            f"token outside its validity period by more than the allowed clock skew of "
            f"{skew} s: {text}"
        )
    return f"invalid token: {text}"
