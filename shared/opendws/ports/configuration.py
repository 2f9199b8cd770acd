"""What operators configure (pools, tenants, policy, prices, CI mappings, who may call the
API with a Google identity), and the port where it lives."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from opendws.domain.model import Mode, PolicySettings, Pool, Tenant


@dataclass(frozen=True, slots=True, kw_only=True)
class Price:
    """What one accelerator-hour of a type costs, and the discount factors of the two modes
    (flex-start and calendar capacity are billed below on-demand)."""

    accelerator: str
    per_hour: float  # on-demand price of one accelerator for one hour
    flex_factor: float = 1.0  # multiplier for flex_start runs
    calendar_factor: float = 1.0  # multiplier for calendar blocks

    def cost(self, mode: Mode, accelerator_hours: float) -> float:
        """The estimated cost of ``accelerator_hours`` used in ``mode``."""
        factor = self.calendar_factor if mode is Mode.CALENDAR else self.flex_factor
        return accelerator_hours * self.per_hour * factor


@dataclass(frozen=True, slots=True, kw_only=True)
class CiMapping:
    """Which CI jobs get capacity, and what they ask for: a job of ``provider`` whose labels
    (GitHub ``runs-on``, GitLab tags) include every one of ``labels`` is submitted as
    ``template`` (the fields of a submit message but its id, which comes from the job)."""

    provider: str  # github, gitlab or generic
    labels: frozenset[str]
    template: dict[str, Any] = field(hash=False)


# The ``tenant`` of an access rule whose principal acts as an admin (as the admins' API key).
ADMIN_ACCESS = "admin"
# How an access rule names every account of a domain.
DOMAIN_PREFIX = "domain:"


@dataclass(frozen=True, slots=True, kw_only=True)
class AccessRule:
    """One row of the access table: a Google identity that may call the API, and the tenant it
    acts as (:data:`ADMIN_ACCESS`: an admin).

    ``principal`` is an email (``alice@example.com``: that account only) or a domain
    (``domain:example.com``: every account of that domain), lowercase; the schema accepts
    ``*@example.com`` for the latter and writes it this way."""

    principal: str
    tenant: str

    @property
    def domain(self) -> str | None:
        """The domain a domain rule names; None for an email rule."""
        if self.principal.startswith(DOMAIN_PREFIX):
            return self.principal.removeprefix(DOMAIN_PREFIX)
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Configuration:
    """What the operators configure: pools, tenants with their quotas, policy knobs, and the
    price table usage is costed with."""

    pools: tuple[Pool, ...] = ()
    tenants: tuple[Tenant, ...] = ()
    policy: PolicySettings = field(default_factory=PolicySettings)
    prices: tuple[Price, ...] = ()
    ci: tuple[CiMapping, ...] = ()  # CI jobs that get capacity
    # Take request messages from the shared ``capacity-requests`` topic, trusting every
    # publisher's claimed tenant (small single-team installs). Off: only tenants' own topics
    # and the admins' are heard.
    shared_requests_topic: bool = False
    # Which Google identities (IAP's signed header, ID tokens) act as which tenant at the API.
    access: tuple[AccessRule, ...] = ()
    # (tenant, prefix): the Secret Manager names a tenant's runs may take secrets from, e.g.
    # projects/P/secrets/vision- (domain.run.check_secret_prefix); a tenant without one may
    # use no secrets.
    secret_prefixes: tuple[tuple[str, str], ...] = ()

    def secret_prefix(self, tenant: str) -> str | None:
        """Where ``tenant``'s runs may take secrets from (None: nowhere)."""
        return next((prefix for name, prefix in self.secret_prefixes if name == tenant), None)

    def price(self, accelerator: str) -> Price | None:
        """The price of ``accelerator``, if configured."""
        return next((p for p in self.prices if p.accelerator == accelerator), None)


class ConfigStore(Protocol):
    """Where the configuration lives (Firestore ``config/``)."""

    def load(self) -> Configuration:
        """The current configuration (empty if none was saved)."""
        ...

    def save(self, configuration: Configuration) -> None:
        """Replace the configuration, atomically."""
        ...
