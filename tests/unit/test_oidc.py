"""The timer function's token checks (opendws.adapters.oidc) with tokens signed here, by a key
made for the test: what Google says a receiver of its services' OIDC tokens must check, and
the clock skew google-auth leaves to the caller; and, behind Cloud Run's invoker check, the
claims of a token whose signature Cloud Run removed.

Sources: pubsub/docs/authenticate-push-subscriptions (the claims of a Google-signed push token:
``iss`` https://accounts.google.com, ``aud``, ``email``, ``email_verified: true``; "must also
verify the iss claim"); tasks v2 ``HttpRequest.oidc_token`` (the same kind of token, for the
task's audience and service account); google-auth-library-python#889 (google-auth 2.1.0 dropped
its built-in 10 s skew, so tokens a second early were refused) and #894
(``clock_skew_in_seconds``, google-auth 2.3.2 per its CHANGELOG); run/docs/authenticating/
service-to-service and run/docs/troubleshooting#signature-removed (Cloud Run checks the ID
token of a call to a service that requires authentication and hands it on with its signature
replaced by ``SIGNATURE_REMOVED_BY_GOOGLE``; einride/iam-go ``iamgoogle/signature.go``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt, jwt
from google.oauth2 import id_token

from opendws.adapters.oidc import (
    CLOCK_SKEW,
    EMULATOR_ISSUER,
    GOOGLE_ISSUERS,
    REMOVED_SIGNATURE,
    Forbidden,
    OidcVerifier,
    Unauthorized,
)

AUDIENCE = "https://opendws-timer-123456789012.us-central1.run.app"
INVOKER = "opendws-tasks@p.iam.gserviceaccount.com"
KEY_ID = "test-key"


class Signer:
    """An RSA key, its self-signed certificate (``{kid: PEM}``, as Google publishes its
    certificates) and RS256 tokens signed with it."""

    def __init__(self, key_id: str = KEY_ID) -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "opendws-test")])
        now = datetime.now(UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=1))
            .sign(key, hashes.SHA256())
        )
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()  # fmt: skip
        self.certs = {key_id: certificate.public_bytes(serialization.Encoding.PEM).decode()}
        self._signer = crypt.RSASigner.from_string(pem, key_id=key_id)

    def token(self, **overrides: Any) -> str:
        """A token as Cloud Tasks sends it, valid for an hour from now, with ``overrides``
        (a value of None drops the claim)."""
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": "https://accounts.google.com",
            "aud": AUDIENCE,
            "azp": "113774264463038321964",
            "sub": "113774264463038321964",
            "email": INVOKER,
            "email_verified": True,
            "iat": now,
            "exp": now + 3600,
        }
        claims.update(overrides)
        claims = {name: value for name, value in claims.items() if value is not None}
        encoded: bytes = jwt.encode(self._signer, claims)
        return encoded.decode()


@pytest.fixture(scope="module")
def signer() -> Signer:
    return Signer()


@pytest.fixture
def verifier(signer: Signer) -> OidcVerifier:
    """Google's issuers, checked against the test key's certificate."""
    return OidcVerifier(audience=AUDIENCE, callers=frozenset({INVOKER}), certs=signer.certs)


def bearer(token: str) -> str:
    return f"Bearer {token}"


def test_a_token_as_cloud_tasks_sends_it_is_accepted(
    signer: Signer, verifier: OidcVerifier
) -> None:
    claims = verifier.verify(bearer(signer.token()))
    assert claims["email"] == INVOKER
    # Both spellings of Google's issuer (pubsub/docs/authenticate-push-subscriptions).
    assert verifier.verify(bearer(signer.token(iss="accounts.google.com")))["aud"] == AUDIENCE
    assert {"accounts.google.com", "https://accounts.google.com"} == GOOGLE_ISSUERS


def test_the_allowed_clock_skew_is_about_ten_seconds() -> None:
    """google-auth-library-python#889: the skew google-auth had before 2.1.0."""
    assert timedelta(seconds=10) == CLOCK_SKEW


def test_a_token_issued_slightly_ahead_of_our_clock_is_accepted(
    signer: Signer, verifier: OidcVerifier
) -> None:
    """#889: a token "used too early" by a second or so, because the issuer's clock runs a
    little ahead, is genuine; within 10 s it is accepted."""
    now = int(time.time())
    verifier.verify(bearer(signer.token(iat=now + 5, exp=now + 3605)))


def test_a_token_issued_beyond_the_skew_ahead_is_refused(
    signer: Signer, verifier: OidcVerifier
) -> None:
    now = int(time.time())
    with pytest.raises(Unauthorized, match=r"clock skew of 10 s: Token used too early"):
        verifier.verify(bearer(signer.token(iat=now + 30, exp=now + 3630)))


def test_a_token_expired_within_the_skew_is_accepted(
    signer: Signer, verifier: OidcVerifier
) -> None:
    now = int(time.time())
    verifier.verify(bearer(signer.token(iat=now - 3605, exp=now - 5)))


def test_a_token_expired_beyond_the_skew_is_refused(signer: Signer, verifier: OidcVerifier) -> None:
    now = int(time.time())
    with pytest.raises(Unauthorized, match=r"clock skew of 10 s: Token expired"):
        verifier.verify(bearer(signer.token(iat=now - 3630, exp=now - 30)))


@pytest.mark.parametrize("verified", [False, "false", None])
def test_an_unverified_email_is_refused(
    signer: Signer, verifier: OidcVerifier, verified: object
) -> None:
    """pubsub/docs/authenticate-push-subscriptions: Google's tokens carry
    ``email_verified: true``; without it the email claim proves nothing."""
    with pytest.raises(Forbidden, match=r"email .* is not verified \(email_verified is"):
        verifier.verify(bearer(signer.token(email_verified=verified)))


def test_a_token_for_another_audience_is_refused(signer: Signer, verifier: OidcVerifier) -> None:
    """The audience is the task's URL unless set (tasks v2 ``OidcToken.audience``): a token
    minted for the cloudfunctions.net URL, or for another service, is not for us."""
    elsewhere = "https://us-central1-p.cloudfunctions.net/opendws-timer"
    with pytest.raises(Forbidden, match=rf"audience '{elsewhere}', not '{AUDIENCE}'"):
        verifier.verify(bearer(signer.token(aud=elsewhere)))


@pytest.mark.parametrize("issuer", ["https://evil.example", EMULATOR_ISSUER, None])
def test_a_token_from_another_issuer_is_refused(
    signer: Signer, verifier: OidcVerifier, issuer: str | None
) -> None:
    """pubsub/docs/authenticate-push-subscriptions: the receiver must verify ``iss``; the
    emulator's tokens are never taken for Google's."""
    with pytest.raises(
        Unauthorized,
        match=r"issuer .* is not accepted \(expected accounts.google.com or https://accounts",
    ):
        verifier.verify(bearer(signer.token(iss=issuer)))


def test_a_token_from_another_service_account_is_refused(
    signer: Signer, verifier: OidcVerifier
) -> None:
    other = "someone@p.iam.gserviceaccount.com"
    with pytest.raises(Forbidden, match=rf"caller '{other}' may not call .* \(only {INVOKER}\)"):
        verifier.verify(bearer(signer.token(email=other)))


def test_without_configured_callers_any_verified_google_caller_passes(signer: Signer) -> None:
    verifier = OidcVerifier(audience=AUDIENCE, callers=frozenset(), certs=signer.certs)
    verifier.verify(bearer(signer.token(email="anyone@p.iam.gserviceaccount.com")))
    with pytest.raises(Forbidden, match="not verified"):
        verifier.verify(bearer(signer.token(email_verified=False)))


def test_a_missing_malformed_or_forged_token_is_unauthorized(
    signer: Signer, verifier: OidcVerifier
) -> None:
    with pytest.raises(Unauthorized, match="missing bearer token"):
        verifier.verify(None)
    with pytest.raises(Unauthorized, match="missing bearer token"):
        verifier.verify("Basic abc")
    with pytest.raises(Unauthorized, match="invalid token"):
        verifier.verify(bearer("not-a-jwt"))
    forged = Signer().token()  # same claims and key id, another key
    with pytest.raises(Unauthorized, match="invalid token: Could not verify token signature"):
        verifier.verify(bearer(forged))


def test_the_emulator_verifier_takes_only_the_emulators_issuer(signer: Signer) -> None:
    """Locally (OPENDWS_TIMER_CERTS) the Cloud Tasks emulator signs with its own issuer."""
    from emulators.cloud_tasks import ISSUER

    assert EMULATOR_ISSUER == ISSUER
    local = OidcVerifier(
        audience=AUDIENCE, callers=frozenset({INVOKER}), certs=signer.certs,
        issuers=frozenset({EMULATOR_ISSUER}),
    )  # fmt: skip
    local.verify(bearer(signer.token(iss=EMULATOR_ISSUER)))
    with pytest.raises(Unauthorized, match=r"issuer 'https://accounts\.google\.com' is not"):
        local.verify(bearer(signer.token()))


def test_bootstrap_picks_the_emulators_issuer_only_with_the_emulators_certs(
    signer: Signer, tmp_path: Any
) -> None:
    import json

    from opendws.bootstrap import Container, Settings

    certs = tmp_path / "certs.json"
    certs.write_text(json.dumps(signer.certs))
    local = Settings(project="p", timer_url=AUDIENCE, timer_service_account=INVOKER,
                     timer_certs=str(certs))  # fmt: skip
    verifier = Container(local).verifier
    verifier.verify(bearer(signer.token(iss=EMULATOR_ISSUER)))
    with pytest.raises(Unauthorized, match="issuer"):
        verifier.verify(bearer(signer.token()))
    google = Container(
        Settings(project="p", timer_url=AUDIENCE, timer_service_account=INVOKER)
    ).verifier
    assert google._issuers == GOOGLE_ISSUERS
    assert google._certs is None


def test_against_googles_certificates_the_skew_is_passed_to_google_auth(
    signer: Signer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without given certificates the token is checked by google.oauth2.id_token.verify_token
    (Google's certificates, fetched here from the test key instead) with the skew."""
    fetched: list[str] = []

    def certs(request: object, url: str) -> dict[str, str]:
        fetched.append(url)
        return signer.certs

    monkeypatch.setattr(id_token, "_fetch_certs", certs)  # what oidc verifies with
    verifier = OidcVerifier(audience=AUDIENCE, callers=frozenset({INVOKER}))
    now = int(time.time())
    verifier.verify(bearer(signer.token(iat=now + 5, exp=now + 3605)))
    assert fetched == ["https://www.googleapis.com/oauth2/v1/certs"]
    with pytest.raises(Unauthorized, match="Token used too early"):
        verifier.verify(bearer(signer.token(iat=now + 30, exp=now + 3630)))
    with pytest.raises(Unauthorized, match="issuer"):
        verifier.verify(bearer(signer.token(iss=EMULATOR_ISSUER)))


# Behind Cloud Run's invoker check (OPENDWS_INVOKER_CHECKED_BY_RUN).


def stripped(token: str) -> str:
    """``token`` as Cloud Run hands it on after its invoker check: its signature replaced."""
    header, claims, _signature = token.split(".")
    return f"{header}.{claims}.{REMOVED_SIGNATURE}"


@pytest.fixture
def behind_run() -> OidcVerifier:
    """The timer's reader of the claims Cloud Run has checked (no certificates: none needed)."""
    return OidcVerifier(audience=AUDIENCE, callers=frozenset({INVOKER}), checked_by_run=True)


def test_behind_cloud_run_a_token_whose_signature_cloud_run_removed_is_read(
    signer: Signer, behind_run: OidcVerifier
) -> None:
    """run/docs/authenticating/service-to-service and run/docs/troubleshooting#signature-removed
    (einride/iam-go ``iamgoogle/signature.go``): a service that requires authentication gets
    the caller's ID token with its signature replaced by ``SIGNATURE_REMOVED_BY_GOOGLE``; the
    timer reads its claims instead of refusing every timer as unverifiable."""
    assert REMOVED_SIGNATURE == "SIGNATURE_REMOVED_BY_GOOGLE"
    claims = behind_run.verify(bearer(stripped(signer.token())))
    assert (claims["email"], claims["aud"]) == (INVOKER, AUDIENCE)
    now = int(time.time())  # the same skew as when verifying
    behind_run.verify(bearer(stripped(signer.token(iat=now + 5, exp=now + 3605))))
    behind_run.verify(bearer(stripped(signer.token(iat=now - 3605, exp=now - 5))))


@pytest.mark.parametrize(
    ("claims", "refusal", "match"),
    [
        ({"iss": "https://evil.example"}, Unauthorized, r"issuer 'https://evil\.example'"),
        ({"iss": EMULATOR_ISSUER}, Unauthorized, r"issuer 'opendws-cloud-tasks-emulator'"),
        ({"aud": "https://elsewhere.run.app"}, Forbidden, r"audience 'https://elsewhere"),
        ({"email": "someone@p.iam.gserviceaccount.com"}, Forbidden, r"caller 'someone@"),
        ({"email_verified": False}, Forbidden, r"is not verified"),
        ({"exp": -30}, Unauthorized, r"clock skew of 10 s: Token expired"),  # s from now
        ({"iat": 30}, Unauthorized, r"clock skew of 10 s: Token used too"),
        ({"exp": None}, Unauthorized, r"lacks a numeric iat or exp"),
    ],
)
def test_behind_cloud_run_the_claims_are_checked_all_the_same(
    signer: Signer, behind_run: OidcVerifier, claims: dict[str, Any],
    refusal: type[Exception], match: str,
) -> None:  # fmt: skip
    """Cloud Run's invoker check says the caller may invoke the service (the tasks account,
    and whoever else holds run.invoker on it); the issuer, audience, caller, verified email
    and validity period are still the timer's to check, as for a verified token."""
    now = int(time.time())
    dated = {k: now + v if k in ("iat", "exp") and v is not None else v for k, v in claims.items()}
    with pytest.raises(refusal, match=match):
        behind_run.verify(bearer(stripped(signer.token(**dated))))


def test_behind_cloud_run_a_token_with_its_signature_is_refused(
    signer: Signer, behind_run: OidcVerifier
) -> None:
    """Cloud Run replaces the signature of every token it checked (run/docs/troubleshooting
    #signature-removed): one still signed did not pass its check (the service takes
    unchecked calls), so its claims prove nothing and it is not read."""
    with pytest.raises(Unauthorized, match=r"signature is not SIGNATURE_REMOVED_BY_GOOGLE"):
        behind_run.verify(bearer(signer.token()))
    with pytest.raises(Unauthorized, match=r"3 parts"):
        behind_run.verify(bearer("not-a-jwt"))
    with pytest.raises(Unauthorized, match=r"not base64url JSON"):
        behind_run.verify(bearer(f"e30.%%%.{REMOVED_SIGNATURE}"))
    with pytest.raises(Unauthorized, match="missing bearer token"):
        behind_run.verify(None)


def test_verifying_the_signature_a_stripped_token_is_refused(
    signer: Signer, verifier: OidcVerifier
) -> None:
    """Without OPENDWS_INVOKER_CHECKED_BY_RUN the timer verifies signatures itself: a token
    whose signature was removed proves nothing there."""
    with pytest.raises(Unauthorized, match="invalid token"):
        verifier.verify(bearer(stripped(signer.token())))


def test_bootstrap_reads_claims_only_where_the_deployment_says_cloud_run_checked_them(
    signer: Signer,
) -> None:
    from opendws.bootstrap import Container, Settings

    base = {"OPENDWS_PROJECT": "p", "OPENDWS_TIMER_URL": AUDIENCE,
            "OPENDWS_TIMER_SERVICE_ACCOUNT": INVOKER}  # fmt: skip
    checked = Container(
        Settings.from_environment({**base, "OPENDWS_INVOKER_CHECKED_BY_RUN": "true"})
    ).verifier
    checked.verify(bearer(stripped(signer.token())))
    for unset in ({}, {"OPENDWS_INVOKER_CHECKED_BY_RUN": ""},
                  {"OPENDWS_INVOKER_CHECKED_BY_RUN": "false"}):  # fmt: skip
        verifying = Container(Settings.from_environment({**base, **unset})).verifier
        with pytest.raises(Unauthorized, match="invalid token"):
            verifying.verify(bearer(stripped(signer.token())))
    with pytest.raises(ValueError, match=r"OPENDWS_INVOKER_CHECKED_BY_RUN is 'yes'; it must be"):
        Settings.from_environment({**base, "OPENDWS_INVOKER_CHECKED_BY_RUN": "yes"})


def test_the_token_read_behind_cloud_run_is_the_one_cloud_run_checked() -> None:
    """X-Serverless-Authorization when present, else Authorization, names in any case
    (GoogleCloudPlatform/cloud-run-proxy#25)."""
    from opendws.adapters.oidc import invocation_token

    assert invocation_token({"authorization": "Bearer a"}) == "Bearer a"
    both = {"Authorization": "Bearer a", "x-serverless-authorization": "Bearer b"}
    assert invocation_token(both) == "Bearer b"
    assert invocation_token({}) is None
