"""Who may call the ``timer`` function: a Cloud Tasks OIDC token for the configured audience
and invoker service account.

In Google Cloud the token is signed by Google (verified against Google's public certificates,
issuer ``accounts.google.com``); on one machine it is signed by the Cloud Tasks emulator's key,
whose certificates are given instead. A missing, malformed, forged or expired token is
Unauthorized (HTTP 401); a valid token for another audience or another caller is Forbidden
(HTTP 403).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import google.auth.exceptions
import google.auth.transport.requests
from google.auth import jwt
from google.oauth2 import id_token

GOOGLE_ISSUERS = frozenset({"accounts.google.com", "https://accounts.google.com"})


class Unauthorized(PermissionError):
    """No valid token: the caller is not known (HTTP 401)."""


class Forbidden(PermissionError):
    """A valid token, but not for this audience or from an allowed caller (HTTP 403)."""


class OidcVerifier:
    """Checks the ``Authorization: Bearer`` header of a timer call."""

    def __init__(
        self, *, audience: str, callers: frozenset[str], certs: Mapping[str, str] | None = None
    ) -> None:
        if not audience:
            raise ValueError("audience: the timer function's URL (or configured audience)")
        self._audience = audience
        self._callers = callers  # service account emails allowed to call
        self._certs = dict(certs) if certs is not None else None  # None: Google's own

    def verify(self, authorization: str | None) -> dict[str, Any]:
        """The token's claims, or Unauthorized / Forbidden saying why not."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("missing bearer token (Authorization: Bearer <OIDC token>)")
        try:
            claims = self._claims(token.strip())
        except (ValueError, google.auth.exceptions.GoogleAuthError) as error:
            raise Unauthorized(f"invalid token: {error}") from None
        audience = claims.get("aud")
        if audience != self._audience:
            raise Forbidden(f"token is for audience {audience!r}, not {self._audience!r}")
        email = claims.get("email")
        if email not in self._callers or claims.get("email_verified") is False:
            raise Forbidden(f"caller {email!r} may not call the timer function")
        return claims

    def _claims(self, token: str) -> dict[str, Any]:
        if self._certs is None:
            claims: dict[str, Any] = id_token.verify_oauth2_token(  # type: ignore[no-untyped-call]
                token, google.auth.transport.requests.Request(), audience=None
            )
            if claims.get("iss") not in GOOGLE_ISSUERS:
                raise ValueError(f"issuer {claims.get('iss')!r} is not Google")
            return claims
        decoded: dict[str, Any] = jwt.decode(token, certs=self._certs, verify=True, audience=None)  # type: ignore[no-untyped-call]
        return decoded
