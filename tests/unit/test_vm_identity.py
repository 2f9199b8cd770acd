"""The agent function's check of a VM's identity token (opendws.adapters.vm_identity), with
tokens the metadata server emulator would hand its VM (emulators.metadata.identity_claims,
signed by an emulators.signing.LocalSigner), and the binding of that VM to its order and rank.

Sources: compute/docs/instances/verifying-instance-identity — the token's claims (``iss``,
``aud``, ``exp`` an hour after ``iat``, ``google.compute_engine``: ``project_id``,
``project_number``, ``zone``, ``instance_id``, ``instance_name``,
``instance_creation_timestamp`` with ``format=full``), verified against Google's certificates;
its claims table: "instance_name ... can be reused by several instances over time, so use the
instance_id value to identify a unique instance". google-auth-library-python#889/#894 for the
clock skew (see tests/unit/test_oidc.py).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from emulators.metadata import ISSUER, Instance, identity_claims
from emulators.signing import LocalSigner
from opendws.adapters.oidc import CLOCK_SKEW, GOOGLE_ISSUERS
from opendws.adapters.vm_identity import (
    EMULATOR_ISSUER,
    Forbidden,
    Unauthorized,
    VmIdentity,
    VmIdentityVerifier,
    bind,
)

AUDIENCE = "https://opendws-agent-123456789012.us-central1.run.app"
PROJECT = "my-project"
ORDER = "dws-0123456789abcdef-a1"
ZONE = "us-central1-a"
ORDER_VMS = {f"{ORDER}-0": (ZONE, "4340508760561261530"), f"{ORDER}-1": (ZONE, "71")}


def vm(name: str = f"{ORDER}-1", **overrides: object) -> Instance:
    fields: dict[str, object] = {
        "name": name, "instance_id": ORDER_VMS.get(name, (ZONE, "99"))[1], "zone": ZONE,
        "project_id": PROJECT, "project_number": 123456789012, "internal_ip": "127.0.0.3",
        "service_account": f"opendws-vm@{PROJECT}.iam.gserviceaccount.com",
        "created_at": datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
    }  # fmt: skip
    fields.update(overrides)
    return Instance(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def signer() -> LocalSigner:
    return LocalSigner(ISSUER, datetime.now(UTC))


def token(
    signer: LocalSigner, instance: Instance | None = None, *, audience: str = AUDIENCE,
    token_format: str = "full", at: datetime | None = None,
) -> str:  # fmt: skip
    """The identity token the emulator hands ``instance`` (issued ``at``, now by default)."""
    now = at if at is not None else datetime.now(UTC)
    claims = identity_claims(instance or vm(), audience, token_format, now)
    return signer.sign(claims)


def verifier(signer: LocalSigner, **overrides: object) -> VmIdentityVerifier:
    settings: dict[str, object] = {
        "audience": AUDIENCE, "project_id": PROJECT, "certs": signer.certs,
        "issuers": frozenset({EMULATOR_ISSUER}),
    }  # fmt: skip
    settings.update(overrides)
    return VmIdentityVerifier(**settings)  # type: ignore[arg-type]


def test_the_verifier_takes_the_emulators_issuer_and_no_other() -> None:
    """The adapter cannot import the emulators: its copy of their issuer must not drift."""
    assert EMULATOR_ISSUER == ISSUER
    assert ISSUER not in GOOGLE_ISSUERS


def test_a_vms_full_token_names_the_vm(signer: LocalSigner) -> None:
    identity = verifier(signer).verify(f"Bearer {token(signer)}")
    assert identity == VmIdentity(
        project_id=PROJECT, project_number=123456789012, zone=ZONE,
        instance_name=f"{ORDER}-1", instance_id="71",
        instance_creation_timestamp=int(datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()),
        email=f"opendws-vm@{PROJECT}.iam.gserviceaccount.com",
    )  # fmt: skip
    assert identity.order == ORDER


def test_a_token_signed_by_another_key_is_unauthorized(signer: LocalSigner) -> None:
    """A forged local token: the right claims, signed by a key the verifier was not given —
    under a key id it does not know, or under its own key's id."""
    forger = LocalSigner(ISSUER, datetime.now(UTC))
    with pytest.raises(Unauthorized, match=r"invalid token: Certificate for key id .* not found"):
        verifier(signer).verify(f"Bearer {token(forger)}")
    forger.kid = signer.kid
    with pytest.raises(Unauthorized, match="invalid token: Could not verify token signature"):
        verifier(signer).verify(f"Bearer {token(forger)}")


def test_an_expired_token_is_unauthorized(signer: LocalSigner) -> None:
    """Tokens live an hour; past ``exp`` by more than the skew, one is refused."""
    issued = datetime.now(UTC) - timedelta(hours=1) - CLOCK_SKEW - timedelta(seconds=5)
    with pytest.raises(Unauthorized, match=r"clock skew of 10 s: Token expired"):
        verifier(signer).verify(f"Bearer {token(signer, at=issued)}")
    within = datetime.now(UTC) - timedelta(hours=1) - CLOCK_SKEW + timedelta(seconds=5)
    assert verifier(signer).verify(f"Bearer {token(signer, at=within)}").instance_id == "71"


def test_a_token_of_an_issuer_not_trusted_is_unauthorized(signer: LocalSigner) -> None:
    """The emulator's tokens are never accepted where Google's are expected."""
    google = verifier(signer, issuers=GOOGLE_ISSUERS)
    with pytest.raises(Unauthorized, match=r"issuer 'opendws-metadata-emulator' is not accepted"):
        google.verify(f"Bearer {token(signer)}")


@pytest.mark.parametrize("header", [None, "", "Bearer ", "Basic abc", "Bearer not.a.jwt"])
def test_a_missing_or_malformed_token_is_unauthorized(
    signer: LocalSigner, header: str | None
) -> None:
    with pytest.raises(Unauthorized, match=r"missing bearer token|invalid token"):
        verifier(signer).verify(header)


def test_a_token_of_another_project_is_forbidden(signer: LocalSigner) -> None:
    elsewhere = vm(project_id="someone-else")
    with pytest.raises(Forbidden, match=r"is in project 'someone-else', not 'my-project'"):
        verifier(signer).verify(f"Bearer {token(signer, elsewhere)}")


def test_a_token_for_another_audience_is_forbidden(signer: LocalSigner) -> None:
    other = "https://elsewhere.example.com"
    with pytest.raises(Forbidden, match=rf"audience '{other}', not '{AUDIENCE}'"):
        verifier(signer).verify(f"Bearer {token(signer, audience=other)}")


def test_a_standard_token_names_no_vm_and_is_forbidden(signer: LocalSigner) -> None:
    """Without ``format=full`` the token carries no ``google.compute_engine``."""
    with pytest.raises(Forbidden, match=r"no google.compute_engine claims.*format=full"):
        verifier(signer).verify(f"Bearer {token(signer, token_format='standard')}")


def identity(**overrides: object) -> VmIdentity:
    fields: dict[str, object] = {
        "project_id": PROJECT, "project_number": 1, "zone": ZONE,
        "instance_name": f"{ORDER}-1", "instance_id": "71", "instance_creation_timestamp": 0,
        "email": "vm@p.iam.gserviceaccount.com",
    }  # fmt: skip
    fields.update(overrides)
    return VmIdentity(**fields)  # type: ignore[arg-type]


def test_bind_gives_a_vm_of_the_order_its_rank() -> None:
    assert bind(identity(), ORDER_VMS) == 1
    assert bind(identity(instance_name=f"{ORDER}-0", instance_id="4340508760561261530"),
                ORDER_VMS) == 0  # fmt: skip


def test_bind_refuses_another_orders_vm() -> None:
    other = identity(instance_name="dws-fedcba9876543210-a1-1")
    with pytest.raises(Forbidden, match=r"'dws-fedcba9876543210-a1-1' is not one of the order"):
        bind(other, ORDER_VMS)
    with pytest.raises(Forbidden, match=r"not one of the order's VMs \(none\)"):
        bind(identity(), {})


def test_bind_refuses_an_earlier_vm_of_the_same_name() -> None:
    """A VM deleted and made again under the same name has a new instance id: the token of
    the earlier one no longer stands for the name."""
    earlier = identity(instance_id="70")
    with pytest.raises(Forbidden, match=r"instance id 70, but Compute Engine reports 71"):
        bind(earlier, ORDER_VMS)


def test_bind_refuses_a_vm_of_another_zone() -> None:
    with pytest.raises(Forbidden, match=r"in zone 'us-east5-a', but the order's is 'us-cent"):
        bind(identity(zone="us-east5-a"), ORDER_VMS)
