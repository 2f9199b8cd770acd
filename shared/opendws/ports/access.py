"""Who calls the API with a Google identity: the principal a verified token names, the port
that verifies the tokens, and the two ways a call is refused.

Two kinds of Google-signed token name a principal: IAP's signed header
(``x-goog-iap-jwt-assertion``, a user or workload that passed Identity-Aware Proxy in front of
the api) and a Google-signed ID token in ``Authorization: Bearer`` (a workload's service
account calling the api directly). An adapter verifies them (signature, issuer, audience,
validity period, verified email); the access table of the configuration
(:class:`~opendws.ports.configuration.AccessRule`) says which tenant a principal acts as.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class Unauthorized(PermissionError):
    """No valid credential: the caller is not known (HTTP 401). The message says which check
    failed, never the token."""


class Forbidden(PermissionError):
    """A valid credential, but not for this service or from a caller allowed here (HTTP 403).
    The message says which check failed, never the token."""


class TokenKind(StrEnum):
    """Which Google-signed token named the principal."""

    IAP = "IAP signed header"
    ID_TOKEN = "Google ID token"


@dataclass(frozen=True, slots=True)
class Principal:
    """A Google identity a verified token names: its email (lowercase) and, for a Google
    Workspace or Cloud Identity account, the domain that account belongs to (the token's
    ``hd`` claim; None for other accounts and for service accounts)."""

    email: str
    hosted_domain: str | None
    kind: TokenKind


class PrincipalVerifier(Protocol):
    """Verifies the Google-signed tokens the API accepts."""

    def from_iap(self, assertion: str) -> Principal:
        """The principal of IAP's signed header; Unauthorized or Forbidden saying why not."""
        ...

    def from_id_token(self, token: str) -> Principal:
        """The principal of a Google-signed ID token; Unauthorized or Forbidden saying why
        not."""
        ...
