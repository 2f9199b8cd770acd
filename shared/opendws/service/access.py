"""Google identities at the API: which tenant a caller acts as when it presents IAP's signed
header or a Google-signed ID token instead of an API key.

- IAP's signed header (:data:`IAP_HEADER`): when present, it names the caller, whatever else
  the call carries (IAP in front of the api adds it to every call it lets through, and strips a
  client's own ``x-goog-*`` headers);
- otherwise a bearer credential that is a JWT (:func:`looks_like_jwt`: three base64url parts,
  the first a JSON header naming its ``alg``) is a Google ID token; any other bearer credential
  is an API key (opendws.service.api).

The verifier (a :class:`~opendws.ports.PrincipalVerifier`) checks the token; the
configuration's access table (:class:`~opendws.ports.AccessRule`) maps the principal it names
to a tenant or to the admins. An email rule names one account; a domain rule names every
account of a Google Workspace or Cloud Identity domain (the token's ``hd`` claim, which only
such accounts carry: an email address alone does not prove that the domain manages the
account) and, for a service-account domain (``…gserviceaccount.com``, addresses only Google
issues), every service account whose email ends in it. An email rule wins over a domain rule.

The access table is read from the configuration at most every :data:`ACCESS_TTL`, and again
at once (but not more than every :data:`MISS_RELOAD`) when a verified principal is not in it,
so a rule an admin just applied holds within seconds. Tokens are never logged nor echoed.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from datetime import datetime, timedelta

from opendws.ports import (
    AccessRule,
    Clock,
    ConfigStore,
    Forbidden,
    Principal,
    PrincipalVerifier,
    Unauthorized,
)

IAP_HEADER = "x-goog-iap-jwt-assertion"
# How long the access table is kept between calls.
ACCESS_TTL = timedelta(seconds=30)
# How soon an unknown principal makes the table be read again.
MISS_RELOAD = timedelta(seconds=5)
# The domains of Google's service-account addresses (SA@PROJECT.iam.gserviceaccount.com,
# PROJECT_NUMBER-compute@developer.gserviceaccount.com, PROJECT@appspot.gserviceaccount.com).
SERVICE_ACCOUNT_DOMAIN = "gserviceaccount.com"

_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")


def looks_like_jwt(credential: str) -> bool:
    """Whether a bearer credential is a JWT: three non-empty base64url parts, the first a JSON
    object with an ``alg`` (an API key is one random string and never decodes so)."""
    parts = credential.split(".")
    if len(parts) != 3 or not all(_BASE64URL.fullmatch(part) for part in parts):
        return False
    try:
        header = json.loads(base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4)))
    except (ValueError, binascii.Error):
        return False
    return isinstance(header, dict) and "alg" in header


def rule_for(principal: Principal, rules: tuple[AccessRule, ...]) -> AccessRule | None:
    """The access rule ``principal`` falls under (see the module docstring), or None."""
    email = principal.email.lower()
    exact = next((rule for rule in rules if rule.principal == email), None)
    if exact is not None:
        return exact
    email_domain = email.rpartition("@")[2]
    for rule in rules:
        domain = rule.domain
        if domain is None:
            continue
        if principal.hosted_domain is not None and principal.hosted_domain.lower() == domain:
            return rule
        if _is_service_account_domain(domain) and email_domain == domain:
            return rule
    return None


def _is_service_account_domain(domain: str) -> bool:
    return domain == SERVICE_ACCOUNT_DOMAIN or domain.endswith("." + SERVICE_ACCOUNT_DOMAIN)


class GoogleAccess:
    """Resolves a call's Google identity to the tenant it acts as (``admin``: an admin)."""

    def __init__(self, verifier: PrincipalVerifier, config: ConfigStore, clock: Clock) -> None:
        self._verifier = verifier
        self._config = config
        self._clock = clock
        self._kept: tuple[datetime, tuple[AccessRule, ...]] | None = None

    def tenant(self, *, assertion: str | None, token: str | None) -> str:
        """The tenant of the principal IAP's ``assertion`` names (when given), else of the ID
        ``token``'s. Unauthorized for a token that does not verify, Forbidden for a verified
        principal the access table lacks; each says why."""
        if assertion is not None:
            principal = self._verifier.from_iap(assertion)
        elif token is not None:
            principal = self._verifier.from_id_token(token)
        else:
            raise Unauthorized("no Google identity: neither IAP's signed header nor an ID token")
        rule = self._rule(principal)
        if rule is None:
            raise Forbidden(_unlisted(principal, self._rules()))
        return rule.tenant

    def _rule(self, principal: Principal) -> AccessRule | None:
        now = self._clock.now()
        rules = self._rules(now)
        rule = rule_for(principal, rules)
        kept = self._kept
        if rule is None and kept is not None and now - kept[0] >= MISS_RELOAD:
            rule = rule_for(principal, self._load(now))  # it may have just been added
        return rule

    def _rules(self, now: datetime | None = None) -> tuple[AccessRule, ...]:
        now = self._clock.now() if now is None else now
        kept = self._kept
        if kept is None or now - kept[0] >= ACCESS_TTL:
            return self._load(now)
        return kept[1]

    def _load(self, now: datetime) -> tuple[AccessRule, ...]:
        rules = self._config.load().access
        self._kept = (now, rules)
        return rules


def _unlisted(principal: Principal, rules: tuple[AccessRule, ...]) -> str:
    """Why ``principal`` is refused: no rule names it (and, where a domain rule names its
    email's domain, why that rule does not admit it)."""
    text = (
        f"{principal.email} (verified from the {principal.kind}) is in no rule of the "
        "configuration's access table; an admin adds one (access: principal, tenant) with "
        "dws config apply"
    )
    email_domain = principal.email.rpartition("@")[2].lower()
    if any(rule.domain == email_domain for rule in rules) and principal.hosted_domain is None:
        text += (
            f"; the rule for domain:{email_domain} admits accounts that domain manages "
            "(Google Workspace or Cloud Identity, whose tokens carry hd), and this token "
            "carries no hd"
        )
    return text
