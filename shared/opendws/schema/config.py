"""The configuration document's parts: policy, pools, tenants with their quotas, prices, CI
mappings, the API's access table, and the whole document (:class:`ConfigSpec`).

A what-if scenario describes the same pools, tenants and policy (``opendws.schema.scenario``
reuses these parts). Each part builds its domain value; a broken domain rule raises
:class:`~opendws.domain.InvalidModel`, which :func:`~opendws.schema.common.build_items` names.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field, StrictBool, StrictInt, field_validator, model_validator

from opendws.domain import (
    InvalidModel,
    PolicySettings,
    Pool,
    Provider,
    QueueingStrategy,
    Quota,
    Tenant,
)
from opendws.domain.calendar import CancellationRule
from opendws.domain.run import SECRET_VERSION, SECRET_VERSION_RULE, check_secret_prefix
from opendws.ports import AccessRule, CiMapping, Price
from opendws.ports.configuration import (
    DEFAULT_IDLE_TIMEOUT,
    DOMAIN_PREFIX,
    GitHubRunners,
    GitLabRunners,
)
from opendws.schema.common import Document, Duration, ScenarioError, Spec, Timestamp


class PolicySpec(Spec):
    """``policy``: knobs of the admission order."""

    aging_half_life: Duration | None = None  # None: the domain's default
    race_width: StrictInt | None = None  # None: the domain's default (pools raced at once)
    race_eagerly: StrictBool | None = None  # None: the domain's default (race once a pool is short)
    # None: the domain's default (Google's newest cancellation rule for calendar blocks).
    calendar_cancellation: CancellationRule | None = None
    # Announced ETAs less than this far ahead are commitments; false: none (every ETA is an
    # estimate); None: the domain's default.
    commit_within: Literal[False] | Duration | None = None


class PoolSpec(Spec):
    """``pools[i]``: capacity of one shape in one zone."""

    pool_id: str
    zone: str
    shape: str
    accelerator: str
    provider: Provider
    capacity: StrictInt
    short_until: Timestamp | None = None

    def build(self) -> Pool:
        """The domain pool."""
        return Pool(
            pool_id=self.pool_id,
            zone=self.zone,
            shape=self.shape,
            accelerator=self.accelerator,
            provider=self.provider,
            capacity=self.capacity,
            short_until=self.short_until,
        )


class QuotaSpec(Spec):
    """``tenants[i].quotas[j]``: a tenant's share of one accelerator type."""

    accelerator: str
    nominal: StrictInt
    borrowing_limit: StrictInt | None = None


class TenantSpec(Spec):
    """``tenants[i]``: a team, its cohort and its quotas."""

    name: str
    cohort: str | None = None
    queueing: QueueingStrategy = QueueingStrategy.BEST_EFFORT
    quotas: list[QuotaSpec] = Field(default_factory=list)
    # Where its runs may take secrets from (projects/P/secrets/ and the start of their ids);
    # None: its runs may use no secrets.
    secret_prefix: str | None = None

    @field_validator("secret_prefix")
    @classmethod
    def _secret_prefix(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                check_secret_prefix(value)
            except InvalidModel as error:
                raise ValueError(error.rule) from None
        return value

    def build(self) -> Tenant:
        """The domain tenant (quota rules are checked here too)."""
        quotas = tuple(
            Quota(
                accelerator=quota.accelerator,
                nominal=quota.nominal,
                borrowing_limit=quota.borrowing_limit,
            )
            for quota in self.quotas
        )
        return Tenant(name=self.name, quotas=quotas, cohort=self.cohort, queueing=self.queueing)


class PriceSpec(Spec):
    """``prices[i]``: the on-demand price of one accelerator-hour and the modes' factors."""

    accelerator: str
    per_hour: float = Field(ge=0)
    flex_factor: float = Field(default=1.0, ge=0)
    calendar_factor: float = Field(default=1.0, ge=0)

    def build(self) -> Price:
        return Price(
            accelerator=self.accelerator,
            per_hour=self.per_hour,
            flex_factor=self.flex_factor,
            calendar_factor=self.calendar_factor,
        )


# A secret's version as the agent function reads it (projects/P/secrets/S/versions/V).
_SECRET_RULE = SECRET_VERSION_RULE


def _secret_version(value: str) -> str:
    if SECRET_VERSION.fullmatch(value) is None:
        raise ValueError(f"{value!r} {_SECRET_RULE}")
    return value


def _api_url(value: str) -> str:
    """An https URL (http only for a loopback host: the local fakes), without a trailing /."""
    parsed = urlsplit(value)
    loopback = parsed.hostname in ("localhost", "127.0.0.1", "::1")
    if parsed.scheme != "https" and not (parsed.scheme == "http" and loopback):
        raise ValueError(f"{value!r} must be an https:// URL")
    if not parsed.hostname or parsed.query or parsed.fragment:
        raise ValueError(f"{value!r} must be a URL such as https://api.github.com")
    return value.rstrip("/")


class GitHubSpec(Spec):
    """``ci[i].github``: the GitHub App that makes the mapping's just-in-time runners."""

    app_id: StrictInt = Field(gt=0)
    installation_id: StrictInt = Field(gt=0)
    private_key_secret: str
    organization: str | None = Field(default=None, pattern=r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})$")
    repository: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9-]{1,39}/[A-Za-z0-9._-]{1,100}$"
    )
    runner_group_id: StrictInt = Field(default=1, gt=0)
    api_url: str = "https://api.github.com"
    allow_public_repositories: StrictBool = False

    _key = field_validator("private_key_secret")(_secret_version)
    _url = field_validator("api_url")(_api_url)

    @model_validator(mode="after")
    def _one_scope(self) -> GitHubSpec:
        if (self.organization is None) == (self.repository is None):
            raise ValueError(
                "give organization (organization runners) or repository (owner/name: that "
                "repository's runners), exactly one"
            )
        return self

    def build(self) -> GitHubRunners:
        return GitHubRunners(
            app_id=self.app_id, installation_id=self.installation_id,
            private_key_secret=self.private_key_secret, organization=self.organization,
            repository=self.repository, runner_group_id=self.runner_group_id,
            api_url=self.api_url, allow_public_repositories=self.allow_public_repositories,
        )  # fmt: skip


class GitLabSpec(Spec):
    """``ci[i].gitlab``: the GitLab that makes the mapping's one-job runners."""

    url: str = "https://gitlab.com"
    token_secret: str
    group_id: StrictInt | None = Field(default=None, gt=0)
    executor: Literal["shell", "docker"] = "shell"
    allow_public_projects: StrictBool = False

    _token = field_validator("token_secret")(_secret_version)
    _url = field_validator("url")(_api_url)

    def build(self) -> GitLabRunners:
        return GitLabRunners(
            url=self.url, token_secret=self.token_secret, group_id=self.group_id,
            executor=self.executor, allow_public_projects=self.allow_public_projects,
        )  # fmt: skip


class CiSpec(Spec):
    """``ci[i]``: CI jobs that get capacity and the request they make; with ``github`` or
    ``gitlab``, the VM runs the job as a one-job runner."""

    provider: Literal["github", "gitlab", "generic"]
    labels: list[str] = Field(min_length=1)
    request: dict[str, Any]
    github: GitHubSpec | None = None
    gitlab: GitLabSpec | None = None
    max_vms: StrictInt | None = Field(default=None, gt=0)
    idle_timeout: Duration = DEFAULT_IDLE_TIMEOUT

    @model_validator(mode="after")
    def _runner_of_its_provider(self) -> CiSpec:
        for name, block in (("github", self.github), ("gitlab", self.gitlab)):
            if block is not None and self.provider != name:
                raise ValueError(f"{name}: a {self.provider} mapping's runners cannot be {name}'s")
        if self.idle_timeout < timedelta(minutes=1) or self.idle_timeout > timedelta(hours=24):
            raise ValueError("idle_timeout: between 1 minute and 24 hours")
        if self.max_vms is not None and not self.runs_jobs:
            raise ValueError(
                "max_vms: caps the VMs of a mapping whose VMs run its jobs; give a github or "
                "gitlab block (the runners), or cap the tenant's quota instead"
            )
        if self.runs_jobs and "run" in self.request:
            raise ValueError(
                "request.run: a mapping with github or gitlab runs the job itself (the VM "
                "becomes its runner); give no run"
            )
        return self

    @property
    def runs_jobs(self) -> bool:
        return self.github is not None or self.gitlab is not None

    def build(self) -> CiMapping:
        return CiMapping(
            provider=self.provider, labels=frozenset(self.labels), template=dict(self.request),
            github=None if self.github is None else self.github.build(),
            gitlab=None if self.gitlab is None else self.gitlab.build(),
            max_vms=self.max_vms, idle_timeout=self.idle_timeout,
        )  # fmt: skip


# A DNS name: labels of letters, digits and inner hyphens, and a top-level label of letters.
_DOMAIN = re.compile(r"(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}")
_LOCAL_PART = re.compile(r"[^@\s*:]+")
_FORMS = "an email (alice@example.com) or a domain (*@example.com or domain:example.com)"


def access_principal(text: str) -> str:
    """An access rule's principal in its stored form: a lowercase email, or ``domain:`` and a
    lowercase domain (``*@example.com`` is taken for ``domain:example.com``). ValueError
    saying what is wrong with anything else."""
    given = text.strip().lower()
    kind, colon, rest = given.partition(":")
    if colon and kind == "group":
        raise ValueError(
            f"{text!r}: groups cannot be matched: neither IAP's signed header nor an ID token "
            "says which groups an account is in; give the members' emails or their domain "
            "(grant the group IAP access in Terraform's api_iap.members instead)"
        )
    if colon and kind in ("user", "serviceaccount"):
        raise ValueError(f"{text!r}: give the email alone, without the IAM prefix {kind!r}")
    if colon and kind == DOMAIN_PREFIX.rstrip(":"):
        domain = rest
    elif given.startswith("*@"):
        domain = given.removeprefix("*@")
    else:
        local, at, domain = given.rpartition("@")
        if at and _LOCAL_PART.fullmatch(local) and _DOMAIN.fullmatch(domain):
            return given
        raise ValueError(f"{text!r} is not {_FORMS}")
    if not _DOMAIN.fullmatch(domain):
        raise ValueError(f"{text!r}: {domain!r} is not a domain name such as example.com")
    return DOMAIN_PREFIX + domain


class AccessSpec(Spec):
    """``access[i]``: a Google identity that may call the API (IAP's signed header, or a
    Google-signed ID token) and the tenant it acts as (``admin``: an admin)."""

    principal: str
    tenant: str

    @field_validator("principal")
    @classmethod
    def _principal(cls, value: str) -> str:
        return access_principal(value)

    def build(self) -> AccessRule:
        return AccessRule(principal=self.principal, tenant=self.tenant)


class ConfigSpec(Document):
    """The whole configuration document."""

    item_keys: ClassVar[dict[str, str]] = {
        "pools": "pool_id", "tenants": "name", "access": "principal",
    }  # fmt: skip

    policy: PolicySpec | None = None
    # Take requests from the shared capacity-requests topic, trusting every publisher's
    # claimed tenant (small single-team installs only); off: tenants' own topics only.
    shared_requests_topic: StrictBool = False
    prices: list[PriceSpec] = Field(default_factory=list)
    ci: list[CiSpec] = Field(default_factory=list)
    pools: list[PoolSpec] = Field(default_factory=list)
    tenants: list[TenantSpec] = Field(default_factory=list)
    access: list[AccessSpec] = Field(default_factory=list)


def build_policy(spec: PolicySpec | None, source: str) -> PolicySettings:
    """The policy a document sets, the domain's defaults where it is silent."""
    if spec is None:
        return PolicySettings()
    given: dict[str, Any] = {}
    if spec.aging_half_life is not None:
        given["aging_half_life"] = spec.aging_half_life
    if spec.race_width is not None:
        given["race_width"] = spec.race_width
    if spec.race_eagerly is not None:
        given["race_eagerly"] = spec.race_eagerly
    if spec.calendar_cancellation is not None:
        given["calendar_cancellation"] = spec.calendar_cancellation
    if spec.commit_within is not None:
        given["commit_within"] = None if spec.commit_within is False else spec.commit_within
    try:
        return PolicySettings(**given)
    except InvalidModel as error:
        raise ScenarioError(f"{source}: policy: {error.field}: {error.rule}") from None
