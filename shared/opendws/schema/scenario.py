"""The what-if scenario document's own parts: grants and pending requests at one instant, and
the whole document (:class:`ScenarioSpec`), whose pools, tenants and policy are the
configuration's (``opendws.schema.config``).

A pending request without ``submitted_at`` was submitted at the scenario's ``now``, which the
document itself states: nothing here reads the clock.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import Field, StrictInt

from opendws.domain import CapacityRequest, GangShape, Grant, Mode
from opendws.schema.common import Document, Duration, Spec, Timestamp
from opendws.schema.config import ConfigSpec, PolicySpec, PoolSpec, TenantSpec


class GrantSpec(Spec):
    """``grants[i]``: capacity already committed over ``[start_at, end_at)``."""

    request_id: str
    tenant: str
    pool_id: str
    accelerator: str
    units: StrictInt
    accelerator_units: StrictInt
    start_at: Timestamp
    end_at: Timestamp

    def build(self) -> Grant:
        """The domain grant."""
        return Grant(
            request_id=self.request_id,
            tenant=self.tenant,
            pool_id=self.pool_id,
            accelerator=self.accelerator,
            units=self.units,
            accelerator_units=self.accelerator_units,
            start_at=self.start_at,
            end_at=self.end_at,
        )


class GangSpec(Spec):
    """``pending[i].gang``: VMs of one machine type, or TPU slices of one topology."""

    vm_count: StrictInt
    accelerator: str
    machine_type: str | None = None
    accelerators_per_vm: StrictInt | None = None
    topology: str | None = None


class PendingSpec(Spec):
    """``pending[i]``: a request awaiting a decision."""

    request_id: str
    tenant: str
    mode: Mode
    gang: GangSpec
    locations: list[str]
    run_duration: Duration
    max_wait: Duration | None = None
    start_at: Timestamp | None = None
    priority: StrictInt = 0
    labels: dict[str, str] = Field(default_factory=dict)
    submitted_at: Timestamp | None = None  # None: submitted at the scenario's now

    def build(self, now: datetime) -> CapacityRequest:
        """The domain request; ``now`` stands in for a missing ``submitted_at``."""
        gang = GangShape(
            vm_count=self.gang.vm_count,
            accelerator=self.gang.accelerator,
            machine_type=self.gang.machine_type,
            accelerators_per_vm=self.gang.accelerators_per_vm,
            topology=self.gang.topology,
        )
        return CapacityRequest(
            request_id=self.request_id,
            tenant=self.tenant,
            mode=self.mode,
            gang=gang,
            locations=tuple(self.locations),
            run_duration=self.run_duration,
            submitted_at=now if self.submitted_at is None else self.submitted_at,
            max_wait=self.max_wait,
            start_at=self.start_at,
            priority=self.priority,
            labels=tuple(sorted(self.labels.items())),
        )


class ScenarioSpec(Document):
    """The whole scenario document."""

    item_keys: ClassVar[dict[str, str]] = {
        **ConfigSpec.item_keys,
        "grants": "request_id",
        "pending": "request_id",
    }

    now: Timestamp
    policy: PolicySpec | None = None
    pools: list[PoolSpec]
    tenants: list[TenantSpec]
    grants: list[GrantSpec] = Field(default_factory=list)
    pending: list[PendingSpec] = Field(default_factory=list)
