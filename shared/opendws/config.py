"""The operators' configuration — pools, tenants with their quotas, policy knobs — as a document.

The same shape is read from a YAML/JSON file (``dws config apply``) and from Firestore
(``config/scheduler``), validated by the scenario file's pydantic specs, so a configuration that
loads is a valid one and a bad one is refused with a message that says where and what to fix.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field, StrictBool, ValidationError

from opendws.domain.model import PolicySettings, Pool, Tenant
from opendws.durations import format_duration
from opendws.ports import CiMapping, Configuration, Price
from opendws.scenario import (
    PolicySpec,
    PoolSpec,
    ScenarioError,
    Spec,
    TenantSpec,
    build_items,
    build_policy,
    describe_validation,
)
from opendws.schema.request import MessageError, Submit, parse_message, to_capacity_request


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


class CiSpec(Spec):
    """``ci[i]``: CI jobs that get capacity and the request they make."""

    provider: Literal["github", "gitlab", "generic"]
    labels: list[str] = Field(min_length=1)
    request: dict[str, Any]

    def build(self) -> CiMapping:
        return CiMapping(
            provider=self.provider, labels=frozenset(self.labels), template=dict(self.request)
        )


class ConfigSpec(Spec):
    """The whole configuration document."""

    policy: PolicySpec | None = None
    # Take requests from the shared capacity-requests topic, trusting every publisher's
    # claimed tenant (small single-team installs only); off: tenants' own topics only.
    shared_requests_topic: StrictBool = False
    prices: list[PriceSpec] = Field(default_factory=list)
    ci: list[CiSpec] = Field(default_factory=list)
    pools: list[PoolSpec] = Field(default_factory=list)
    tenants: list[TenantSpec] = Field(default_factory=list)


def configuration_from_document(data: object, *, source: str) -> Configuration:
    """Validate ``data`` and build the configuration; ScenarioError says what is wrong."""
    try:
        spec = ConfigSpec.model_validate(data)
    except ValidationError as error:
        raise ScenarioError(describe_validation(error, data, source)) from None
    pools: tuple[Pool, ...] = build_items(source, "pools", spec.pools, PoolSpec.build)
    tenants: tuple[Tenant, ...] = build_items(source, "tenants", spec.tenants, TenantSpec.build)
    policy: PolicySettings = build_policy(spec.policy, source)
    for section, names in (
        ("pools", [p.pool_id for p in pools]),
        ("tenants", [t.name for t in tenants]),
    ):
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ScenarioError(f"{source}: {section}: {duplicates[0]!r} appears twice")
    prices = tuple(price.build() for price in spec.prices)
    accelerators = [price.accelerator for price in prices]
    if len(set(accelerators)) != len(accelerators):
        raise ScenarioError(f"{source}: prices: one price per accelerator")
    ci = tuple(mapping.build() for mapping in spec.ci)
    for index, mapping in enumerate(ci):
        problem = template_problem(mapping.template)
        if problem is not None:
            raise ScenarioError(f"{source}: ci[{index}].request: {problem}")
    return Configuration(
        pools=pools, tenants=tenants, policy=policy, prices=prices, ci=ci,
        shared_requests_topic=spec.shared_requests_topic,
    )  # fmt: skip


def template_problem(template: dict[str, Any]) -> str | None:
    """What is wrong with a CI request template (None: a job's message will be valid)."""
    message = {"schema": "opendws.request/v1", "action": "submit", **template,
               "request_id": "ci-template-check"}  # fmt: skip
    try:
        submit = parse_message(json.dumps(message).encode())
        assert isinstance(submit, Submit)
        to_capacity_request(submit, default_request_id="ci", submitted_at=datetime.now(UTC))
    except MessageError as error:
        return str(error)
    return None


def configuration_to_document(configuration: Configuration) -> dict[str, Any]:
    """The configuration as plain values that :func:`configuration_from_document` reads back."""
    return {
        "policy": {
            "aging_half_life": format_duration(configuration.policy.aging_half_life),
            "race_width": configuration.policy.race_width,
            "race_eagerly": configuration.policy.race_eagerly,
            "calendar_cancellation": configuration.policy.calendar_cancellation.value,
        },
        "shared_requests_topic": configuration.shared_requests_topic,
        "pools": [_pool(pool) for pool in configuration.pools],
        "tenants": [_tenant(tenant) for tenant in configuration.tenants],
        "ci": [
            {"provider": m.provider, "labels": sorted(m.labels), "request": m.template}
            for m in configuration.ci
        ],
        "prices": [
            {
                "accelerator": price.accelerator,
                "per_hour": price.per_hour,
                "flex_factor": price.flex_factor,
                "calendar_factor": price.calendar_factor,
            }
            for price in configuration.prices
        ],
    }


def _pool(pool: Pool) -> dict[str, Any]:
    document: dict[str, Any] = {
        "pool_id": pool.pool_id,
        "zone": pool.zone,
        "shape": pool.shape,
        "accelerator": pool.accelerator,
        "provider": pool.provider.value,
        "capacity": pool.capacity,
    }
    if pool.short_until is not None:
        document["short_until"] = pool.short_until.isoformat()
    return document


def _tenant(tenant: Tenant) -> dict[str, Any]:
    return {
        "name": tenant.name,
        "cohort": tenant.cohort,
        "queueing": tenant.queueing.value,
        "quotas": [
            {
                "accelerator": quota.accelerator,
                "nominal": quota.nominal,
                "borrowing_limit": quota.borrowing_limit,
            }
            for quota in tenant.quotas
        ],
    }
