"""The GitHub App's JWT (opendws.adapters.github_app.app_jwt), decoded with the App's public
key.

Source:
docs.github.com/en/apps/creating-github-apps/authenticating-with-a-github-app/generating-a-json-web-token-jwt-for-a-github-app
— "Your JWT must be signed using the RS256 algorithm"; ``iat``: "we recommend that you set
this 60 seconds in the past"; ``exp``: "no more than 10 minutes into the future"; ``iss``: the
App's id.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from opendws.adapters.github_app import app_jwt

NOW = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)


def test_the_jwt_is_rs256_from_the_app_backdated_and_short_lived() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption()).decode()  # fmt: skip

    token = app_jwt(12345, private, NOW)

    head, body, signature = token.split(".")
    key.public_key().verify(  # raises InvalidSignature unless the App's key signed it
        _unpadded(signature), f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256()
    )
    assert json.loads(_unpadded(head))["alg"] == "RS256"
    claims = json.loads(_unpadded(body))
    now = int(NOW.timestamp())
    assert claims["iss"] == "12345"
    assert now - 60 <= claims["iat"] <= now  # backdated, by no more than 60 s
    assert claims["exp"] - claims["iat"] <= 600  # at most 10 minutes
    assert claims["exp"] - now <= 600  # and at most 10 minutes ahead of now


def _unpadded(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def test_a_key_that_is_not_rsa_pem_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="not an RSA PEM key"):
        app_jwt(1, "not a key", NOW)
