"""The API's checks of Google-signed tokens (opendws.adapters.identity), with tokens signed
here by keys made for the test: IAP's signed header (ES256, PEM public keys by key id, as IAP
publishes them) and Google ID tokens (RS256, certificates by key id, as Google publishes them).

Sources: iap/docs/signed-headers-howto (the header ``x-goog-iap-jwt-assertion``; ``alg``
ES256; ``kid`` one of the keys at https://www.gstatic.com/iap/verify/public_key or its JWK
form; ``exp`` and ``iat`` with "a 30-second skew"; ``aud``
/projects/PROJECT_NUMBER/global/backendServices/SERVICE_ID behind a load balancer and
/projects/PROJECT_NUMBER/locations/REGION/services/SERVICE_NAME for Cloud Run; ``iss``
https://cloud.google.com/iap; the identity in ``email``, and ``hd`` "if an account belongs to
a hosted domain"); identity/sign-in/web/backend-auth (an ID token's ``iss`` is
accounts.google.com or https://accounts.google.com, its ``aud`` must be ours, ``exp`` not past,
``hd`` names a Google Workspace or Cloud Identity account's domain; Google's keys rotate, and
the response's Cache-Control says when to fetch them again); run/docs/configuring/
custom-audiences (a caller's ID token names the receiving service's URL as its audience)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import google.auth.transport.requests
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.auth import crypt, jwt

from opendws.adapters.identity import (
    GOOGLE_CERTS_URL,
    IAP_CERTS_URL,
    IAP_CLOCK_SKEW,
    IAP_ISSUER,
    REFETCH_AFTER,
    GoogleIdentityVerifier,
    KeySet,
    KeysUnavailable,
)
from opendws.ports import Forbidden, Principal, TokenKind, Unauthorized
from tests.unit.test_oidc import Signer as RsaSigner

API_URL = "https://opendws-api-123456789012.us-central1.run.app"
FUNCTION_URL = "https://us-central1-p.cloudfunctions.net/opendws-api"
IAP_AUDIENCE = "/projects/123456789012/global/backendServices/4567890123456789"
USER = "alice@example.com"
WORKLOAD = "trainer@p.iam.gserviceaccount.com"


class IapSigner:
    """An ES256 key, its public key as IAP publishes it (``{kid: PEM public key}``), and
    signed headers as IAP makes them."""

    def __init__(self, key_id: str = "iap-test-key") -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()  # fmt: skip
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.keys = {key_id: public.decode()}
        self._signer = crypt.ES256Signer.from_string(pem, key_id=key_id)

    def assertion(self, **overrides: Any) -> str:
        """A header valid for ten minutes from now (IAP's longest), with ``overrides`` (None
        drops a claim)."""
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": IAP_ISSUER, "aud": IAP_AUDIENCE, "sub": "accounts.google.com:1234567890",
            "email": USER, "hd": "example.com", "iat": now, "exp": now + 600,
            "google": {"access_levels": []},
        }  # fmt: skip
        claims.update(overrides)
        claims = {name: value for name, value in claims.items() if value is not None}
        encoded: bytes = jwt.encode(self._signer, claims)
        return encoded.decode()


def id_token(signer: RsaSigner, **overrides: Any) -> str:
    """A workload's Google ID token for the api's URL."""
    claims: dict[str, Any] = {"aud": API_URL, "email": WORKLOAD, **overrides}
    return signer.token(**claims)


@pytest.fixture(scope="module")
def iap() -> IapSigner:
    return IapSigner()


@pytest.fixture(scope="module")
def accounts() -> RsaSigner:
    return RsaSigner()


@pytest.fixture
def verifier(iap: IapSigner, accounts: RsaSigner) -> GoogleIdentityVerifier:
    return GoogleIdentityVerifier(
        id_token_audiences=frozenset({API_URL, FUNCTION_URL}), iap_audience=IAP_AUDIENCE,
        iap_keys=iap.keys, google_keys=accounts.certs,
    )  # fmt: skip


# IAP's signed header ---------------------------------------------------------------------------


def test_a_signed_header_as_iap_makes_it_names_its_user_and_domain(
    iap: IapSigner, verifier: GoogleIdentityVerifier
) -> None:
    assert verifier.from_iap(iap.assertion()) == Principal(USER, "example.com", TokenKind.IAP)
    # A consumer account, or a service account through IAP, has no hosted domain.
    assert verifier.from_iap(iap.assertion(email=WORKLOAD, hd=None)).hosted_domain is None
    assert verifier.from_iap(iap.assertion(email="Bob@Example.com")).email == "bob@example.com"


def test_the_cloud_run_audience_form_is_checked_the_same_way(iap: IapSigner) -> None:
    """signed-headers-howto: with IAP on the Cloud Run service itself the audience is
    /projects/PROJECT_NUMBER/locations/REGION/services/SERVICE_NAME."""
    on_run = "/projects/123456789012/locations/us-central1/services/opendws-api"
    verifier = GoogleIdentityVerifier(
        id_token_audiences=frozenset(), iap_audience=on_run, iap_keys=iap.keys
    )
    assert verifier.from_iap(iap.assertion(aud=on_run)).email == USER
    with pytest.raises(Forbidden, match=rf"audience '{IAP_AUDIENCE}', not '{on_run}'"):
        verifier.from_iap(iap.assertion())


def test_iap_allows_thirty_seconds_of_skew_and_no_more(
    iap: IapSigner, verifier: GoogleIdentityVerifier
) -> None:
    """signed-headers-howto: ``exp`` in the future and ``iat`` in the past, "a 30-second skew
    is allowed"."""
    assert timedelta(seconds=30) == IAP_CLOCK_SKEW
    now = int(time.time())
    verifier.from_iap(iap.assertion(iat=now + 20, exp=now + 620))
    verifier.from_iap(iap.assertion(iat=now - 620, exp=now - 20))
    with pytest.raises(Unauthorized, match=r"clock skew of 30 s: Token expired"):
        verifier.from_iap(iap.assertion(iat=now - 700, exp=now - 60))
    with pytest.raises(Unauthorized, match=r"clock skew of 30 s: Token used too early"):
        verifier.from_iap(iap.assertion(iat=now + 60, exp=now + 660))


@pytest.mark.parametrize("issuer", ["https://accounts.google.com", "https://evil.example", None])
def test_a_header_from_another_issuer_is_unauthorized(
    iap: IapSigner, verifier: GoogleIdentityVerifier, issuer: str | None
) -> None:
    with pytest.raises(Unauthorized, match=r"IAP header issuer .* is not 'https://cloud.google"):
        verifier.from_iap(iap.assertion(iss=issuer))


def test_a_header_for_another_backend_is_forbidden(
    iap: IapSigner, verifier: GoogleIdentityVerifier
) -> None:
    """One backend's header replayed at another: the audience names the backend service."""
    other = "/projects/123456789012/global/backendServices/999"
    with pytest.raises(Forbidden, match=rf"IAP header is for audience '{other}', not"):
        verifier.from_iap(iap.assertion(aud=other))


def test_a_forged_or_rs256_or_malformed_header_is_unauthorized(
    iap: IapSigner, accounts: RsaSigner, verifier: GoogleIdentityVerifier
) -> None:
    """signed-headers-howto: the header's ``alg`` is ES256 and its signature is by the key
    its ``kid`` names."""
    forged = IapSigner().assertion()  # same key id, another key
    with pytest.raises(Unauthorized, match="invalid token: Could not verify token signature"):
        verifier.from_iap(forged)
    with pytest.raises(Unauthorized, match=r"signed with 'RS256', not ES256"):
        verifier.from_iap(accounts.token(iss=IAP_ISSUER, aud=IAP_AUDIENCE))
    with pytest.raises(Unauthorized, match="invalid token"):
        verifier.from_iap("not.a.jwt")


def test_a_header_without_an_email_is_forbidden(
    iap: IapSigner, verifier: GoogleIdentityVerifier
) -> None:
    with pytest.raises(Forbidden, match=r"IAP signed header names no email"):
        verifier.from_iap(iap.assertion(email=None))


def test_without_an_iap_audience_the_header_is_refused(iap: IapSigner) -> None:
    verifier = GoogleIdentityVerifier(
        id_token_audiences=frozenset({API_URL}), iap_audience=None, iap_keys=iap.keys
    )
    with pytest.raises(Unauthorized, match=r"no IAP audience is configured"):
        verifier.from_iap(iap.assertion())


# Google ID tokens ----------------------------------------------------------------------------


def test_a_workloads_id_token_for_either_api_url_names_its_service_account(
    accounts: RsaSigner, verifier: GoogleIdentityVerifier
) -> None:
    assert verifier.from_id_token(id_token(accounts)) == Principal(
        WORKLOAD, None, TokenKind.ID_TOKEN
    )
    assert verifier.from_id_token(id_token(accounts, aud=FUNCTION_URL)).email == WORKLOAD
    # Both spellings of Google's issuer (backend-auth); a Workspace user's token carries hd.
    user = id_token(accounts, iss="accounts.google.com", email=USER, hd="example.com")
    assert verifier.from_id_token(user) == Principal(USER, "example.com", TokenKind.ID_TOKEN)


def test_an_id_token_for_another_audience_is_forbidden(
    accounts: RsaSigner, verifier: GoogleIdentityVerifier
) -> None:
    """custom-audiences: a token names the service it is for; one minted for another service
    (or gcloud's default audience, its own client id) is not for us."""
    elsewhere = "https://other-123456789012.us-central1.run.app"
    with pytest.raises(Forbidden, match=rf"audience '{elsewhere}', not this API's \("):
        verifier.from_id_token(id_token(accounts, aud=elsewhere))


def test_an_expired_id_token_is_unauthorized(
    accounts: RsaSigner, verifier: GoogleIdentityVerifier
) -> None:
    now = int(time.time())
    with pytest.raises(Unauthorized, match=r"clock skew of 10 s: Token expired"):
        verifier.from_id_token(id_token(accounts, iat=now - 3700, exp=now - 60))


@pytest.mark.parametrize("issuer", [IAP_ISSUER, "https://evil.example", None])
def test_an_id_token_from_another_issuer_is_unauthorized(
    accounts: RsaSigner, verifier: GoogleIdentityVerifier, issuer: str | None
) -> None:
    with pytest.raises(Unauthorized, match=r"ID token issuer .* is not accepted \(expected acc"):
        verifier.from_id_token(id_token(accounts, iss=issuer))


@pytest.mark.parametrize("verified", [False, "false", None])
def test_an_id_token_with_an_unverified_email_is_forbidden(
    accounts: RsaSigner, verifier: GoogleIdentityVerifier, verified: object
) -> None:
    with pytest.raises(Forbidden, match=r"email .* is not verified \(email_verified is"):
        verifier.from_id_token(id_token(accounts, email_verified=verified))


def test_an_es256_or_forged_id_token_is_unauthorized(
    iap: IapSigner, verifier: GoogleIdentityVerifier
) -> None:
    with pytest.raises(Unauthorized, match=r"signed with 'ES256', not RS256"):
        verifier.from_id_token(iap.assertion(iss="https://accounts.google.com", aud=API_URL))
    with pytest.raises(Unauthorized, match="Could not verify token signature"):
        verifier.from_id_token(id_token(RsaSigner()))


def test_without_audiences_id_tokens_are_refused(accounts: RsaSigner) -> None:
    verifier = GoogleIdentityVerifier(
        id_token_audiences=frozenset(), iap_audience=IAP_AUDIENCE, google_keys=accounts.certs
    )
    with pytest.raises(Unauthorized, match=r"ID tokens are not accepted here"):
        verifier.from_id_token(id_token(accounts))


def test_no_error_repeats_the_token(
    iap: IapSigner, accounts: RsaSigner, verifier: GoogleIdentityVerifier
) -> None:
    now = int(time.time())
    tokens = [
        (verifier.from_id_token, id_token(accounts, aud="https://elsewhere.example")),
        (verifier.from_id_token, id_token(accounts, iat=now - 3700, exp=now - 60)),
        (verifier.from_iap, iap.assertion(iss="https://evil.example")),
        (verifier.from_iap, IapSigner().assertion()),
    ]
    for verify, token in tokens:
        with pytest.raises(PermissionError) as refused:
            verify(token)
        assert token not in str(refused.value)
        assert token.split(".")[2] not in str(refused.value)  # not even its signature


# Google's keys ---------------------------------------------------------------------------------


@dataclass
class FakeResponse:
    data: bytes
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Published:
    """Google's key endpoint, as a google-auth transport request answers it."""

    keys: dict[str, str]
    cache_control: str = "public, max-age=3600"
    status: int = 200
    fetched: list[str] = field(default_factory=list)

    def __call__(self, url: str, method: str = "GET") -> FakeResponse:
        assert method == "GET"
        self.fetched.append(url)
        return FakeResponse(json.dumps(self.keys).encode(), self.status,
                            {"cache-control": self.cache_control})  # fmt: skip


class Monotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_keys_are_kept_as_long_as_cache_control_says(iap: IapSigner) -> None:
    """backend-auth: Google's keys rotate; the response's Cache-Control says when to fetch
    them again."""
    published, clock = Published(iap.keys, "public, max-age=600"), Monotonic()
    keys = KeySet(IAP_CERTS_URL, request=published, monotonic=clock)
    verifier = GoogleIdentityVerifier(
        id_token_audiences=frozenset(), iap_audience=IAP_AUDIENCE, iap_keys=keys
    )
    for _ in range(3):
        verifier.from_iap(iap.assertion())
    assert published.fetched == [IAP_CERTS_URL]
    clock.now += 601
    verifier.from_iap(iap.assertion())
    assert published.fetched == [IAP_CERTS_URL] * 2


def test_a_new_key_id_fetches_the_keys_again_at_most_once_a_minute(iap: IapSigner) -> None:
    rotated = IapSigner(key_id="iap-new-key")
    published, clock = Published(dict(iap.keys)), Monotonic()
    keys = KeySet(IAP_CERTS_URL, request=published, monotonic=clock)
    verifier = GoogleIdentityVerifier(
        id_token_audiences=frozenset(), iap_audience=IAP_AUDIENCE, iap_keys=keys
    )
    verifier.from_iap(iap.assertion())
    published.keys.update(rotated.keys)  # Google publishes a new key
    with pytest.raises(Unauthorized, match="Certificate for key id iap-new-key not found"):
        verifier.from_iap(rotated.assertion())  # fetched less than a minute ago
    clock.now += REFETCH_AFTER.total_seconds()
    assert verifier.from_iap(rotated.assertion()).email == USER
    assert len(published.fetched) == 2


def test_keys_google_cannot_give_are_a_server_error_not_the_callers(iap: IapSigner) -> None:
    keys = KeySet(IAP_CERTS_URL, request=Published(iap.keys, status=503))
    verifier = GoogleIdentityVerifier(
        id_token_audiences=frozenset(), iap_audience=IAP_AUDIENCE, iap_keys=keys
    )
    with pytest.raises(KeysUnavailable, match=r"HTTP 503"):
        verifier.from_iap(iap.assertion())


def test_by_default_the_keys_come_from_googles_urls(
    iap: IapSigner, accounts: RsaSigner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """IAP's keys as PEM by key id (public_key; its JWK form would take google-auth's PyJWT
    path, which ignores the clock skew), Google's ID-token certificates from oauth2/v1/certs."""
    fetched: list[str] = []

    def answer(self: object, url: str, method: str = "GET", **_: object) -> FakeResponse:
        fetched.append(url)
        keys = iap.keys if url == IAP_CERTS_URL else accounts.certs
        return FakeResponse(json.dumps(keys).encode())

    monkeypatch.setattr(google.auth.transport.requests.Request, "__call__", answer)
    verifier = GoogleIdentityVerifier(
        id_token_audiences=frozenset({API_URL}), iap_audience=IAP_AUDIENCE
    )
    verifier.from_iap(iap.assertion())
    verifier.from_id_token(id_token(accounts))
    assert fetched == [IAP_CERTS_URL, GOOGLE_CERTS_URL]
    assert IAP_CERTS_URL == "https://www.gstatic.com/iap/verify/public_key"
    assert GOOGLE_CERTS_URL == "https://www.googleapis.com/oauth2/v1/certs"


def test_google_auth_asks_the_metadata_server_for_a_token_that_names_its_email(
    accounts: RsaSigner, verifier: GoogleIdentityVerifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    """infra/README.md tells workloads on Google Cloud to use google-auth's fetch_id_token,
    whose Compute Engine credentials ask the metadata server's identity endpoint for the
    caller's audience in ``format=full`` (the fuller of its two token formats, gcloud's
    ``--token-format``); the token that comes back is one the api takes."""
    from google.auth import compute_engine
    from google.auth.compute_engine import _metadata

    asked: list[dict[str, str]] = []
    minted = id_token(accounts)

    def metadata_get(request: object, path: str, params: dict[str, str], **_: object) -> Any:
        if path == "instance/service-accounts/default/":  # who the instance runs as
            return {"email": WORKLOAD, "aliases": ["default"], "scopes": []}
        assert path == "instance/service-accounts/default/identity"
        asked.append(params)
        return minted

    monkeypatch.setattr(_metadata, "get", metadata_get)
    credentials = compute_engine.IDTokenCredentials(
        object(), API_URL, use_metadata_identity_endpoint=True
    )
    credentials.refresh(object())
    assert asked == [{"audience": API_URL, "format": "full"}]
    assert verifier.from_id_token(str(credentials.token)).email == WORKLOAD
