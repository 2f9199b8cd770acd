"""Tenant quotas and cohort borrowing, as the limits a grant must respect at every instant.

A tenant outside a cohort uses at most its nominal quota. A tenant in a cohort may use idle
quota of its cohort: the cohort as a whole uses at most the sum of its members' nominal quotas,
and the tenant at most ``nominal + borrowing_limit`` (no tenant limit when the borrowing limit
is unset). Every grant has a known end, so a loan always ends by itself and a lender gets its
quota back without preemption.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from opendws.domain.model import Tenant


class Scope(StrEnum):
    """Who a limit belongs to."""

    TENANT = "tenant"
    COHORT = "cohort"


class LimitKey(NamedTuple):
    """Names one limited resource: a tenant's or a cohort's share of one accelerator.
    (A named tuple: it is a hot dictionary key in the planner.)"""

    scope: Scope
    owner: str  # tenant or cohort name
    accelerator: str


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``amount`` accelerators in use under ``key`` at any instant."""

    key: LimitKey
    amount: int


class QuotaBook:
    """The limits that apply to each tenant's use of each accelerator."""

    __slots__ = ("_cache", "_ceilings", "_cohort_nominal", "_tenants")

    def __init__(self, tenants: Iterable[Tenant]) -> None:
        self._tenants = {tenant.name: tenant for tenant in tenants}
        self._cohort_nominal: dict[tuple[str, str], int] = {}
        for tenant in self._tenants.values():
            if tenant.cohort is None:
                continue
            for quota in tenant.quotas:
                key = (tenant.cohort, quota.accelerator)
                self._cohort_nominal[key] = self._cohort_nominal.get(key, 0) + quota.nominal
        self._cache: dict[tuple[str, str], tuple[Limit, ...]] = {}
        self._ceilings: dict[tuple[str, str], int] = {}

    def knows(self, tenant: str) -> bool:
        """True if ``tenant`` is configured."""
        return tenant in self._tenants

    def tenant(self, name: str) -> Tenant | None:
        """The configured tenant called ``name``, if any."""
        return self._tenants.get(name)

    def limits(self, tenant_name: str, accelerator: str) -> tuple[Limit, ...]:
        """Every limit a grant of ``tenant_name`` on ``accelerator`` counts against (none for an
        unknown tenant), in a fixed order."""
        cached = self._cache.get((tenant_name, accelerator))
        if cached is not None:
            return cached
        tenant = self._tenants.get(tenant_name)
        limits: list[Limit] = []
        if tenant is not None:
            quota = tenant.quota(accelerator)
            own = LimitKey(Scope.TENANT, tenant.name, accelerator)
            if tenant.cohort is None:
                limits.append(Limit(own, quota.nominal))
            else:
                cohort_total = self._cohort_nominal.get((tenant.cohort, accelerator), 0)
                limits.append(
                    Limit(LimitKey(Scope.COHORT, tenant.cohort, accelerator), cohort_total)
                )
                if quota.borrowing_limit is not None:
                    limits.append(Limit(own, quota.nominal + quota.borrowing_limit))
        result = tuple(limits)
        self._cache[(tenant_name, accelerator)] = result
        return result

    def ceiling(self, tenant_name: str, accelerator: str) -> int:
        """The most of ``accelerator`` the tenant could ever hold at once (0 if unknown)."""
        ceiling = self._ceilings.get((tenant_name, accelerator))
        if ceiling is None:
            limits = self.limits(tenant_name, accelerator)
            ceiling = min((limit.amount for limit in limits), default=0)
            self._ceilings[(tenant_name, accelerator)] = ceiling
        return ceiling
