"""An incremental planner whose kept state is checked after every plan (see
:func:`opendws.domain.planner.incremental.check.check`): the property tests plan through it,
so an index that drifts from the entries fails the step where it drifted, not a plan some
steps later."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from opendws.domain import Plan, Snapshot
from opendws.domain.planner.incremental.check import check
from opendws.domain.planner.incremental.planner import IncrementalPlanner


class Checked:
    """``planner``, its kept state checked after each :meth:`plan`; everything else is the
    planner's own."""

    def __init__(self, planner: IncrementalPlanner) -> None:
        self.planner = planner

    def plan(self, snapshot: Snapshot, now: datetime) -> Plan:
        plan = self.planner.plan(snapshot, now)
        check(self.planner)
        return plan

    def __getattr__(self, name: str) -> Any:
        return getattr(self.planner, name)


def checked(*, clock_floor: int = 0) -> Checked:
    """A planner as the property tests make it (``clock_floor``), checked after every plan."""
    return Checked(IncrementalPlanner(clock_floor=clock_floor))
