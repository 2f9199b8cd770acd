"""What operators configure (pools, tenants, policy, prices, CI mappings, who may call the
API with a Google identity), and the port where it lives."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
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


# A runner that takes no job within this of being handed to its VM is deleted and the VM
# released (a mapping's idle_timeout); GitHub gives a queued job 24 hours to find a runner.
DEFAULT_IDLE_TIMEOUT = timedelta(minutes=10)


@dataclass(frozen=True, slots=True, kw_only=True)
class GitHubRunners:
    """A GitHub App that makes just-in-time runners for a mapping's jobs: its id, the
    installation it acts as, the Secret Manager version holding its private key (read by the
    agent function when it mints a runner, never stored), and where its runners live — an
    organization (``organization``) or one repository (``repository``, ``owner/name``) — in
    ``runner_group_id``. ``api_url`` is GitHub's REST API (``https://HOST/api/v3`` for GitHub
    Enterprise Server)."""

    app_id: int
    installation_id: int
    private_key_secret: str
    organization: str | None = None
    repository: str | None = None
    runner_group_id: int = 1  # every organization's Default group; a repository's runners'
    api_url: str = "https://api.github.com"
    allow_public_repositories: bool = False  # self-hosted runners run strangers' code there

    def reaches(self, repository: str) -> bool:
        """Whether a job of ``owner/name`` can take this App's runners."""
        if self.repository is not None:
            return repository.lower() == self.repository.lower()
        owner = repository.partition("/")[0]
        return self.organization is not None and owner.lower() == self.organization.lower()


@dataclass(frozen=True, slots=True, kw_only=True)
class GitLabRunners:
    """A GitLab that makes one-job runners for a mapping's jobs: its URL, the Secret Manager
    version holding a token with ``create_runner`` and ``manage_runner``, and for group
    runners the group (else each runner is the job's project's)."""

    url: str = "https://gitlab.com"
    token_secret: str
    group_id: int | None = None
    executor: str = "shell"  # run-single's --executor: shell or docker
    allow_public_projects: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class CiMapping:
    """Which CI jobs get capacity, and what they ask for: a job of ``provider`` whose labels
    (GitHub ``runs-on``, GitLab tags) include every one of ``labels`` is submitted as
    ``template`` (the fields of a submit message but its id, which comes from the job).

    With ``github`` (or ``gitlab``) the VM a job gets runs it: it becomes a one-job runner, and
    lives as long as its runner (the runner's exit ends the run; a runner that takes no job
    within ``idle_timeout`` is deleted and the VM released). Without, the capacity is the
    job's to use, released when the job completes. ``max_vms`` caps the VMs the mapping's
    requests hold at once (None: no cap)."""

    provider: str  # github, gitlab or generic
    labels: frozenset[str]
    template: dict[str, Any] = field(hash=False)
    github: GitHubRunners | None = None
    gitlab: GitLabRunners | None = None
    max_vms: int | None = None
    idle_timeout: timedelta = DEFAULT_IDLE_TIMEOUT

    @property
    def runs_jobs(self) -> bool:
        """Whether the mapping's VMs run their jobs (as one-job runners)."""
        return self.github is not None or self.gitlab is not None

    @property
    def tenant(self) -> str:
        return str(self.template.get("tenant", ""))


def ci_mapping(
    mappings: tuple[CiMapping, ...], provider: str, labels: frozenset[str] | tuple[str, ...]
) -> CiMapping | None:
    """The first mapping of ``provider`` all of whose labels a job asking for ``labels`` has."""
    asked = frozenset(labels)
    for mapping in mappings:
        if mapping.provider == provider and mapping.labels <= asked:
            return mapping
    return None


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
