"""Which VM is calling: the identity token a gang VM's agent presents, checked as Google
documents it (compute/docs/instances/verifying-instance-identity), and the binding of that VM
to its order and rank.

:class:`VmIdentityVerifier` checks a ``Authorization: Bearer`` VM identity token:

- the signature, against Google's public certificates ("verify the signature against Google's
  public Oauth2 certificates"; on one machine: the metadata server emulator's, whose
  certificates are given instead), and ``iat``/``exp`` within a small clock skew
  (:data:`~opendws.adapters.oidc.CLOCK_SKEW`; "each token expires within one hour");
- ``iss``: Google's (the emulator's tokens carry its own issuer, :data:`EMULATOR_ISSUER`,
  which a verifier of Google's tokens never accepts);
- ``aud``: the configured audience (the agent function's URL, which the VM named when it asked
  for the token);
- ``google.compute_engine``: present (the token was asked for with ``format=full``), its
  ``project_id`` the deployment's project.

A missing, malformed, forged, expired or foreign-issued token is Unauthorized (HTTP 401); a
valid token for another audience, without the VM's claims or of another project is Forbidden
(HTTP 403). Each error says which check failed.

:func:`bind` then holds the VM to what Compute Engine reports for its order (the page's
table: "instance_name ... can be reused by several instances over time, so use the
instance_id value to identify a unique instance"): its name one of the order's VMs, its zone
the order's, its instance id the one Compute Engine reports for that name — a token of an
earlier VM of the same name is refused. Its rank is the ``i`` of its name ``{order}-{i}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from opendws.adapters.oidc import (
    CLOCK_SKEW,
    GOOGLE_ISSUERS,
    bearer_token,
    check_issuer,
    signed_claims,
)
from opendws.ports.access import Forbidden, Unauthorized
from opendws.ports.runs import VmIdentity, bind

# The ``iss`` of the metadata server emulator's identity tokens (emulators.metadata.ISSUER).
EMULATOR_ISSUER = "opendws-metadata-emulator"

__all__ = [
    "EMULATOR_ISSUER", "GOOGLE_ISSUERS", "Forbidden", "Unauthorized", "VmIdentity",
    "VmIdentityVerifier", "bind",
]  # fmt: skip


class VmIdentityVerifier:
    """Checks the ``Authorization: Bearer`` header of an agent's registration.

    ``audience``: the agent function's URL. ``project_id``: the deployment's project, the only
    one whose VMs are served. ``certs``: ``{key id: certificate PEM}`` to verify signatures
    with; None: Google's own. ``issuers``: the accepted ``iss`` values (Google's by default).
    """

    def __init__(
        self,
        *,
        audience: str,
        project_id: str,
        certs: Mapping[str, str] | None = None,
        issuers: frozenset[str] = GOOGLE_ISSUERS,
        clock_skew: timedelta = CLOCK_SKEW,
    ) -> None:
        if not audience:
            raise ValueError("audience: the agent function's URL")
        if not project_id:
            raise ValueError("project_id: the deployment's project")
        if not issuers:
            raise ValueError("issuers: at least one accepted token issuer")
        self._audience = audience
        self._project_id = project_id
        self._certs = dict(certs) if certs is not None else None
        self._issuers = issuers
        self._skew = int(clock_skew.total_seconds())

    def verify(self, authorization: str | None, *, own_project: bool = True) -> VmIdentity:
        """The calling VM, or Unauthorized / Forbidden saying which check failed.
        ``own_project`` False: the VM's project is not checked (a TPU worker's token, whose
        project Google does not document; the caller holds it to its TPU node instead)."""
        token = bearer_token(authorization, "VM identity token")
        claims = signed_claims(token, self._certs, self._skew)
        check_issuer(claims, self._issuers)
        audience = claims.get("aud")
        if audience != self._audience:
            raise Forbidden(f"token is for audience {audience!r}, not {self._audience!r}")
        identity = _identity(claims)
        if own_project and identity.project_id != self._project_id:
            raise Forbidden(
                f"VM {identity.instance_name!r} is in project {identity.project_id!r}, "
                f"not {self._project_id!r}"
            )
        return identity


def _identity(claims: Mapping[str, Any]) -> VmIdentity:
    """The VM the ``google.compute_engine`` claims name; Forbidden when they are missing."""
    google = claims.get("google")
    engine = google.get("compute_engine") if isinstance(google, Mapping) else None
    if not isinstance(engine, Mapping):
        raise Forbidden(
            "token names no VM (no google.compute_engine claims: a VM's identity token "
            "asked for with format=full)"
        )
    texts = ("project_id", "zone", "instance_name", "instance_id")
    numbers = ("project_number", "instance_creation_timestamp")
    bad = [k for k in texts if not isinstance(engine.get(k), str) or not engine[k]] + [
        k for k in numbers if not isinstance(engine.get(k), int) or isinstance(engine[k], bool)
    ]
    if bad:
        raise Forbidden(f"token's google.compute_engine lacks a valid {', '.join(bad)}")
    return VmIdentity(
        project_id=engine["project_id"],
        project_number=engine["project_number"],
        zone=engine["zone"],
        instance_name=engine["instance_name"],
        instance_id=engine["instance_id"],
        instance_creation_timestamp=engine["instance_creation_timestamp"],
        email=str(claims.get("email", "")),
    )
