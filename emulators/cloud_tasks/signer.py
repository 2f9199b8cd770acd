"""The emulator's OIDC token issuer: the bearer tokens Cloud Tasks puts on tasks that carry an
``oidc_token``, signed by a key the emulator makes when it is built (:mod:`emulators.signing`).

Tokens are RS256 JWTs shaped like Google's (``aud``, ``azp``, ``email``, ``email_verified``, a
21-digit ``sub``, an hour's lifetime) but issued by :data:`ISSUER`, which is not Google's, so
that a verifier configured for real Google tokens never accepts one. They are dated by the
instant the caller passes (the emulator's clock), never by the wall clock.
"""

from __future__ import annotations

from datetime import datetime

from emulators.signing import TOKEN_LIFETIME, LocalSigner, account_id

# The ``iss`` of the tokens the emulator signs: deliberately not Google's, so that a verifier
# configured for real Google tokens never accepts one.
ISSUER = "opendws-cloud-tasks-emulator"

__all__ = ["ISSUER", "TOKEN_LIFETIME", "TokenSigner"]


class TokenSigner(LocalSigner):
    """A local signer (its certificate is published by the emulator's ``certs()``) of Cloud
    Tasks' OIDC tokens."""

    def __init__(self, now: datetime) -> None:
        super().__init__(ISSUER, now)

    def token(self, email: str, audience: str, now: datetime) -> str:
        """A signed RS256 JWT for ``email``, for ``audience``, valid for an hour from ``now``."""
        issued = int(now.timestamp())
        return self.sign({
            "iss": ISSUER,
            "aud": audience,
            "azp": email,
            "email": email,
            "email_verified": True,
            "sub": account_id(email),
            "iat": issued,
            "exp": issued + int(TOKEN_LIFETIME.total_seconds()),
        })  # fmt: skip
