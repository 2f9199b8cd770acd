"""The emulator's OIDC token issuer: the bearer tokens Cloud Tasks puts on tasks that carry an
``oidc_token``, signed by a key the emulator makes when it is built.

Tokens are RS256 JWTs shaped like Google's (``aud``, ``azp``, ``email``, ``email_verified``, a
21-digit ``sub``, an hour's lifetime) but issued by :data:`ISSUER`, which is not Google's, so
that a verifier configured for real Google tokens never accepts one. They are dated by the
instant the caller passes (the emulator's clock), never by the wall clock.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

# The ``iss`` of the tokens the emulator signs: deliberately not Google's, so that a verifier
# configured for real Google tokens never accepts one.
ISSUER = "opendws-cloud-tasks-emulator"
TOKEN_LIFETIME = timedelta(hours=1)


class TokenSigner:
    """An RSA key, its self-signed certificate (valid from a day before ``now`` for a year,
    published by the emulator's ``certs()``) and RS256 JWTs whose header names the key's
    ``kid``."""

    def __init__(self, now: datetime) -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.kid = hashlib.sha1(public).hexdigest()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=365))
            .sign(key, hashes.SHA256())
        )
        self.certificate = certificate.public_bytes(serialization.Encoding.PEM).decode()
        self._key = key

    def token(self, email: str, audience: str, now: datetime) -> str:
        """A signed RS256 JWT for ``email``, for ``audience``, valid for an hour from ``now``."""
        issued = int(now.timestamp())
        header = {"alg": "RS256", "typ": "JWT", "kid": self.kid}
        claims = {
            "iss": ISSUER,
            "aud": audience,
            "azp": email,
            "email": email,
            "email_verified": True,
            "sub": _subject(email),
            "iat": issued,
            "exp": issued + int(TOKEN_LIFETIME.total_seconds()),
        }
        signed = f"{_segment(header)}.{_segment(claims)}"
        signature = self._key.sign(signed.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
        return f"{signed}.{_base64url(signature)}"


def _base64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _segment(part: Mapping[str, object]) -> str:
    return _base64url(json.dumps(part, separators=(",", ":")).encode())


def _subject(email: str) -> str:
    """A stable numeric id per service account, shaped like Google's 21-digit ``sub``."""
    digest = int.from_bytes(hashlib.sha256(email.encode()).digest()[:9], "big")
    return "1" + str(digest).zfill(20)[-20:]
