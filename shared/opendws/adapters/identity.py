"""The Google-signed tokens the API accepts in place of an API key, checked as Google documents
them (the approach of :mod:`opendws.adapters.oidc`, for two kinds of token):

- IAP's signed header ``x-goog-iap-jwt-assertion`` (iap/docs/signed-headers-howto): ``alg``
  ES256, signed by a key of https://www.gstatic.com/iap/verify/public_key (the same keys as
  ``public_key-jwk``, as PEM public keys by key id: google-auth's JWK path needs PyJWT and
  ignores the clock skew), ``iat`` and ``exp`` within 30 s of our clock, ``iss``
  ``https://cloud.google.com/iap``, ``aud`` the configured audience
  (``/projects/PROJECT_NUMBER/global/backendServices/SERVICE_ID`` behind a load balancer,
  ``/projects/PROJECT_NUMBER/locations/REGION/services/SERVICE_NAME`` for IAP on Cloud Run),
  and the principal in ``email`` (``hd`` for a Workspace or Cloud Identity account);
- a Google-signed ID token in ``Authorization: Bearer`` (a workload's service account:
  ``gcloud auth print-identity-token --audiences=URL``, google-auth's ``fetch_id_token``):
  signed by a key of https://www.googleapis.com/oauth2/v1/certs, ``iat`` and ``exp`` within
  :data:`~opendws.adapters.oidc.CLOCK_SKEW`, ``iss`` ``accounts.google.com`` or
  ``https://accounts.google.com``, ``aud`` one of the configured audiences (the api's URLs),
  ``email_verified`` true.

A malformed, forged, expired or foreign-issued token is Unauthorized (HTTP 401); a genuine one
for another audience, or with an unverified email, is Forbidden (HTTP 403). Each error says
which check failed and never repeats the token.

Google's keys are fetched once and kept as long as the response's ``Cache-Control: max-age``
says (Google rotates them and says when to fetch them again), and fetched again sooner when a
token names a key id they lack, at most every :data:`REFETCH_AFTER`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Protocol

import google.auth.exceptions
import google.auth.transport.requests
from google.auth import jwt

from opendws.adapters.oidc import CLOCK_SKEW, GOOGLE_ISSUERS, invalid_token
from opendws.ports import Forbidden, Principal, TokenKind, Unauthorized

IAP_ISSUER = "https://cloud.google.com/iap"
IAP_ALGORITHM = "ES256"
# Google signs its ID tokens with RS256 (its published keys are RSA certificates).
ID_TOKEN_ALGORITHM = "RS256"
IAP_CERTS_URL = "https://www.gstatic.com/iap/verify/public_key"
GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"
# iap/docs/signed-headers-howto: "a 30-second skew is allowed" for exp and iat.
IAP_CLOCK_SKEW = timedelta(seconds=30)
# How long keys are kept when the response does not say.
DEFAULT_KEEP = timedelta(hours=1)
# How soon a token naming an unknown key id makes the keys be fetched again.
REFETCH_AFTER = timedelta(minutes=1)

_MAX_AGE = re.compile(r"max-age=(\d+)")


class KeysUnavailable(RuntimeError):
    """Google's keys could not be fetched: the call cannot be checked now (a server error, not
    the caller's)."""


class _Response(Protocol):
    """What a google-auth transport request answers."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def data(self) -> bytes: ...


class KeySet:
    """The public keys Google publishes at one URL (``{key id: PEM}``), kept as the response's
    ``Cache-Control: max-age`` says (:data:`DEFAULT_KEEP` without one).

    ``request``: a google-auth transport request (called as ``request(url, method="GET")``);
    ``monotonic``: the clock the keeping is measured with."""

    def __init__(
        self,
        url: str,
        *,
        request: Callable[..., _Response] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = url
        self._request = request
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._keys: dict[str, str] = {}
        self._fresh_until = float("-inf")
        self._fetched_at = float("-inf")

    def keys(self, key_id: str | None) -> dict[str, str]:
        """The keys, fetched again when they are stale, or when ``key_id`` is not among them
        and they were fetched more than :data:`REFETCH_AFTER` ago."""
        with self._lock:
            now = self._monotonic()
            missing = key_id is not None and key_id not in self._keys
            if now >= self._fresh_until or (
                missing and now - self._fetched_at >= REFETCH_AFTER.total_seconds()
            ):
                self._fetch(now)
            return self._keys

    def _fetch(self, now: float) -> None:
        request = self._request or google.auth.transport.requests.Request()
        response = request(self._url, method="GET")
        if response.status != 200:
            raise KeysUnavailable(
                f"could not fetch Google's keys at {self._url} (HTTP {response.status})"
            )
        keys = json.loads(response.data.decode("utf-8"))
        if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
            raise KeysUnavailable(f"Google's keys at {self._url} are not a map of key id to PEM")
        found = _MAX_AGE.search(str(response.headers.get("cache-control", "")))
        keep = int(found.group(1)) if found else DEFAULT_KEEP.total_seconds()
        self._keys, self._fetched_at, self._fresh_until = dict(keys), now, now + keep


class GoogleIdentityVerifier:
    """Verifies IAP's signed header and Google-signed ID tokens (the module docstring).

    ``id_token_audiences``: the audiences an ID token may name (empty: ID tokens are refused);
    ``iap_audience``: the signed header's audience (None: the header is refused);
    ``iap_keys`` / ``google_keys``: where the signing keys come from (Google's URLs by
    default; a test gives its own :class:`KeySet` or ``{key id: PEM}``)."""

    def __init__(
        self,
        *,
        id_token_audiences: frozenset[str],
        iap_audience: str | None,
        iap_keys: KeySet | Mapping[str, str] | None = None,
        google_keys: KeySet | Mapping[str, str] | None = None,
        clock_skew: timedelta = CLOCK_SKEW,
        iap_clock_skew: timedelta = IAP_CLOCK_SKEW,
    ) -> None:
        self._audiences = id_token_audiences
        self._iap_audience = iap_audience or None
        self._iap_keys = iap_keys if iap_keys is not None else KeySet(IAP_CERTS_URL)
        self._google_keys = google_keys if google_keys is not None else KeySet(GOOGLE_CERTS_URL)
        self._skew = int(clock_skew.total_seconds())
        self._iap_skew = int(iap_clock_skew.total_seconds())

    def from_iap(self, assertion: str) -> Principal:
        """The principal of IAP's signed header (see the module docstring)."""
        if self._iap_audience is None:
            raise Unauthorized(
                "IAP's signed header came, but no IAP audience is configured "
                "(OPENDWS_API_IAP_AUDIENCE), so it cannot be verified"
            )
        claims = _verified(assertion.strip(), self._iap_keys, self._iap_skew, IAP_ALGORITHM)
        issuer = claims.get("iss")
        if issuer != IAP_ISSUER:
            raise Unauthorized(f"IAP header issuer {issuer!r} is not {IAP_ISSUER!r}")
        audience = claims.get("aud")
        if audience != self._iap_audience:
            raise Forbidden(f"IAP header is for audience {audience!r}, not {self._iap_audience!r}")
        return _principal(claims, TokenKind.IAP)

    def from_id_token(self, token: str) -> Principal:
        """The principal of a Google-signed ID token (see the module docstring)."""
        if not self._audiences:
            raise Unauthorized(
                "Google ID tokens are not accepted here: no audience is configured "
                "(OPENDWS_API_AUDIENCES); give an API key"
            )
        claims = _verified(token.strip(), self._google_keys, self._skew, ID_TOKEN_ALGORITHM)
        issuer = claims.get("iss")
        if issuer not in GOOGLE_ISSUERS:
            raise Unauthorized(
                f"ID token issuer {issuer!r} is not accepted "
                f"(expected {' or '.join(sorted(GOOGLE_ISSUERS))})"
            )
        audience = claims.get("aud")
        if audience not in self._audiences:
            expected = " or ".join(sorted(self._audiences))
            raise Forbidden(
                f"ID token is for audience {audience!r}, not this API's ({expected}); "
                "mint it with --audiences set to the API's URL"
            )
        if claims.get("email_verified") not in (True, "true"):
            raise Forbidden(
                f"ID token's email {claims.get('email')!r} is not verified (email_verified is "
                f"{claims.get('email_verified')!r}, must be true; a service account's token "
                "carries it with --include-email)"
            )
        return _principal(claims, TokenKind.ID_TOKEN)


def _verified(
    token: str, keys: KeySet | Mapping[str, str], skew: int, algorithm: str
) -> dict[str, Any]:
    """The claims of ``token`` once its algorithm, signature, ``iat`` and ``exp`` hold;
    Unauthorized saying which did not."""
    try:
        header = jwt.decode_header(token)  # type: ignore[no-untyped-call]
    except (ValueError, google.auth.exceptions.GoogleAuthError) as error:
        raise Unauthorized(invalid_token(error, skew)) from None
    if header.get("alg") != algorithm:
        raise Unauthorized(f"invalid token: signed with {header.get('alg')!r}, not {algorithm}")
    # Outside the try: keys Google cannot give now are our failure, not the caller's.
    certs = keys.keys(header.get("kid")) if isinstance(keys, KeySet) else dict(keys)
    try:
        claims: dict[str, Any] = jwt.decode(  # type: ignore[no-untyped-call]
            token, certs=certs, verify=True, audience=None, clock_skew_in_seconds=skew
        )
    except (ValueError, google.auth.exceptions.GoogleAuthError) as error:
        raise Unauthorized(invalid_token(error, skew)) from None
    return claims


def _principal(claims: Mapping[str, Any], kind: TokenKind) -> Principal:
    email = claims.get("email")
    if not isinstance(email, str) or "@" not in email:
        raise Forbidden(f"the {kind} names no email (its email claim is {email!r})")
    hosted = claims.get("hd")
    return Principal(
        email=email.lower(),
        hosted_domain=hosted.lower() if isinstance(hosted, str) and hosted else None,
        kind=kind,
    )
