"""The emulators' local token signer: an RSA key made when the signer is built, its self-signed
certificate (what a verifier is told to trust, as it trusts Google's published certificates)
and RS256 JWTs whose header names the key's ``kid``.

The Cloud Tasks emulator signs its tasks' OIDC tokens with one
(:mod:`emulators.cloud_tasks.signer`), the metadata server emulator its VMs' identity tokens
(:mod:`emulators.metadata`). Each says its own ``iss``, never Google's, so that a verifier
configured for real Google tokens never accepts one. Tokens are dated by the instant the caller
passes (the emulator's clock), never by the wall clock.
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

# How long Google's ID tokens live: "each token expires within one hour"
# (compute/docs/instances/verifying-instance-identity); Cloud Tasks' OIDC tokens alike.
TOKEN_LIFETIME = timedelta(hours=1)


class LocalSigner:
    """An RSA key, its self-signed certificate (named ``name``, valid from a day before
    ``now`` for a year) and RS256 JWTs signed with it."""

    def __init__(self, name: str, now: datetime) -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.kid = hashlib.sha1(public).hexdigest()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
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

    @property
    def certs(self) -> dict[str, str]:
        """``{kid: certificate PEM}``: what a verifier of these tokens is given to trust."""
        return {self.kid: self.certificate}

    def sign(self, claims: Mapping[str, object]) -> str:
        """``claims`` as an RS256 JWT signed by this key."""
        header = {"alg": "RS256", "typ": "JWT", "kid": self.kid}
        signed = f"{_segment(header)}.{_segment(claims)}"
        signature = self._key.sign(signed.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
        return f"{signed}.{_base64url(signature)}"


def account_id(email: str) -> str:
    """A stable numeric id per service account, shaped like Google's 21-digit ``sub``."""
    digest = int.from_bytes(hashlib.sha256(email.encode()).digest()[:9], "big")
    return "1" + str(digest).zfill(20)[-20:]


def _base64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _segment(part: Mapping[str, object]) -> str:
    return _base64url(json.dumps(part, separators=(",", ":")).encode())
