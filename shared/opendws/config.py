"""The operators' configuration — pools, tenants with their quotas, policy knobs — as a document.

The same shape is read from a YAML/JSON file (``dws config apply``) and from Firestore
(``config/scheduler``), validated by the pydantic specs of ``opendws.schema.config`` (whose pools,
tenants and policy what-if scenarios share), so a configuration that loads is a valid one and a
bad one is refused with a message that says where and what to fix.

Loading never reads the clock: :func:`configuration_from_document` checks what holds whenever
the configuration is used. One rule depends on the time: a CI template with a ``start_at`` (a
calendar block) makes valid requests only while that start lies ahead within Google's lead
times. :func:`configuration_to_apply` checks it too, at the ``now`` its caller passes, where a
configuration is applied; after that, intake checks each request a CI job makes at its own now.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from opendws.domain.calendar import lead_of
from opendws.domain.model import PolicySettings, Pool, Tenant
from opendws.durations import format_duration
from opendws.ports import ADMIN_ACCESS, AccessRule, CiMapping, Configuration
from opendws.schema.common import ScenarioError, build_items, describe_validation
from opendws.schema.config import ConfigSpec, PoolSpec, TenantSpec, build_policy
from opendws.schema.request import MessageError, Submit, parse_message, to_capacity_request

# Any instant: a request without a start time obeys the same rules whenever it is submitted.
_ANY_TIME = datetime(2000, 1, 1, tzinfo=UTC)


def configuration_from_document(data: object, *, source: str) -> Configuration:
    """Validate ``data`` and build the configuration; ScenarioError says what is wrong. Checks
    every rule that does not depend on the time (see :func:`configuration_to_apply`)."""
    try:
        spec = ConfigSpec.model_validate(data)
    except ValidationError as error:
        raise ScenarioError(describe_validation(error, data, source, ConfigSpec)) from None
    pools: tuple[Pool, ...] = build_items(ConfigSpec, source, "pools", spec.pools, PoolSpec.build)
    tenants: tuple[Tenant, ...] = build_items(
        ConfigSpec, source, "tenants", spec.tenants, TenantSpec.build
    )
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
    _check_templates(ci, source, lasting_template_problem)
    access = tuple(rule.build() for rule in spec.access)
    _check_access(access, frozenset(t.name for t in tenants), source)
    secret_prefixes = tuple(
        (t.name, t.secret_prefix) for t in spec.tenants if t.secret_prefix is not None
    )
    return Configuration(
        pools=pools, tenants=tenants, policy=policy, prices=prices, ci=ci,
        shared_requests_topic=spec.shared_requests_topic, access=access,
        secret_prefixes=secret_prefixes,
    )  # fmt: skip


def configuration_to_apply(data: object, *, source: str, now: datetime) -> Configuration:
    """:func:`configuration_from_document`, and every CI template's requests valid if a job
    asks at ``now`` (a calendar template's start still ahead, within Google's lead times)."""
    configuration = configuration_from_document(data, source=source)
    _check_templates(configuration.ci, source, lambda template: template_problem(template, now=now))
    return configuration


def lasting_template_problem(template: dict[str, Any]) -> str | None:
    """What is wrong with a CI request template whenever a job asks (None: some instant makes
    its requests valid). A template without a start time obeys the same rules whenever a job
    asks; one with a start (a calendar block) is checked as asked at the latest instant
    Google's lead times allow for that start, so that only the start's distance from the
    instant a job asks is left unchecked."""
    try:
        submit = _submission(template)
        submitted_at = _ANY_TIME
        if submit.start_at is not None:
            tpu = submit.gang.machine_type is None  # a TPU slice, as GangShape.provider says
            submitted_at = submit.start_at - lead_of(tpu).earliest
        to_capacity_request(submit, default_request_id="ci", submitted_at=submitted_at)
    except MessageError as error:
        return str(error)
    return None


def template_problem(template: dict[str, Any], *, now: datetime) -> str | None:
    """What is wrong with a CI request template (None: a job's message will be valid) if a
    job asks at ``now``."""
    try:
        to_capacity_request(_submission(template), default_request_id="ci", submitted_at=now)
    except MessageError as error:
        return str(error)
    return None


def _submission(template: dict[str, Any]) -> Submit:
    """The submission a CI job's message makes from ``template``; MessageError if invalid."""
    message = {"schema": "opendws.request/v1", "action": "submit", **template,
               "request_id": "ci-template-check"}  # fmt: skip
    submit = parse_message(json.dumps(message).encode())
    assert isinstance(submit, Submit)
    return submit


def _check_templates(
    ci: tuple[CiMapping, ...], source: str, problem_of: Callable[[dict[str, Any]], str | None]
) -> None:
    """ScenarioError naming the first CI mapping whose template ``problem_of`` finds wrong."""
    for index, mapping in enumerate(ci):
        problem = problem_of(mapping.template)
        if problem is not None:
            raise ScenarioError(f"{source}: ci[{index}].request: {problem}")


def _check_access(access: tuple[AccessRule, ...], tenants: frozenset[str], source: str) -> None:
    """ScenarioError naming the first access rule for an unknown tenant, or for a principal an
    earlier rule already names (one principal acts as one tenant)."""
    seen: dict[str, int] = {}
    for index, rule in enumerate(access):
        where = f"{source}: access[{index}] ({rule.principal})"
        if rule.tenant != ADMIN_ACCESS and rule.tenant not in tenants:
            known = ", ".join([*sorted(tenants), ADMIN_ACCESS])
            raise ScenarioError(
                f"{where}: tenant: {rule.tenant!r} is no configured tenant (known: {known})"
            )
        if rule.principal in seen:
            raise ScenarioError(
                f"{where}: principal: access[{seen[rule.principal]}] names it already "
                "(a principal acts as one tenant)"
            )
        seen[rule.principal] = index


def configuration_to_document(configuration: Configuration) -> dict[str, Any]:
    """The configuration as plain values that :func:`configuration_from_document` reads back."""
    return {
        "policy": {
            "aging_half_life": format_duration(configuration.policy.aging_half_life),
            "race_width": configuration.policy.race_width,
            "race_eagerly": configuration.policy.race_eagerly,
            "calendar_cancellation": configuration.policy.calendar_cancellation.value,
            "commit_within": False
            if configuration.policy.commit_within is None
            else format_duration(configuration.policy.commit_within),
        },
        "shared_requests_topic": configuration.shared_requests_topic,
        "pools": [_pool(pool) for pool in configuration.pools],
        "tenants": [
            _tenant(tenant, configuration.secret_prefix(tenant.name))
            for tenant in configuration.tenants
        ],
        "access": [{"principal": r.principal, "tenant": r.tenant} for r in configuration.access],
        "ci": [_ci(mapping) for mapping in configuration.ci],
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


def _ci(mapping: CiMapping) -> dict[str, Any]:
    document: dict[str, Any] = {
        "provider": mapping.provider, "labels": sorted(mapping.labels),
        "request": mapping.template, "idle_timeout": format_duration(mapping.idle_timeout),
    }  # fmt: skip
    if mapping.max_vms is not None:
        document["max_vms"] = mapping.max_vms
    for name, block in (("github", mapping.github), ("gitlab", mapping.gitlab)):
        if block is not None:
            document[name] = {
                key: value for key, value in asdict(block).items() if value is not None
            }
    return document


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


def _tenant(tenant: Tenant, secret_prefix: str | None) -> dict[str, Any]:
    return {
        "name": tenant.name,
        **({} if secret_prefix is None else {"secret_prefix": secret_prefix}),
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
