"""The incremental planner: which changes it applies without a full pass, and which make it
plan in full (its decisions are compared with ``admit`` on random change sequences in
tests/property/test_incremental_properties.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opendws.domain import Outcome, Snapshot, admit
from opendws.domain.incremental import IncrementalPlanner
from opendws.domain.model import PolicySettings
from tests.builders import HOUR, MINUTE, NOW, calendar, flex, grant, pool, quota, tenant
from tests.builders import snapshot as build_snapshot
from tests.property.test_admission_properties import applied


def busy() -> Snapshot:
    """One pool of 8 VMs, half of it running for two hours, and a queue behind it."""
    return build_snapshot(
        pools=[pool(capacity=8)],
        tenants=[tenant("t", quota(nominal=1024))],
        grants=[grant("g1", units=4, start_at=NOW - HOUR, hours=3)],
        pending=[flex(f"r{index}", vm_count=2 + index % 3, hours=1 + index) for index in range(8)],
    )


def test_an_arrival_is_planned_incrementally_with_the_same_plan() -> None:
    planner = IncrementalPlanner()
    first = busy()
    assert planner.plan(first, NOW) == admit(first, NOW)
    assert planner.last_pass.full
    second = replace(first, pending=(*first.pending, flex("late", vm_count=1, hours=1)))
    assert planner.plan(second, NOW) == admit(second, NOW)
    assert not planner.last_pass.full
    assert planner.last_pass.walked >= 1


def test_a_release_moves_the_held_slots_earlier_as_a_full_plan_does() -> None:
    planner = IncrementalPlanner()
    first = busy()
    before = planner.plan(first, NOW)
    released = replace(first, grants=())
    after = planner.plan(released, NOW)
    assert after == admit(released, NOW)
    assert not planner.last_pass.full
    assert len(after.having(Outcome.ADMIT)) > len(before.having(Outcome.ADMIT))


def test_a_departure_is_planned_incrementally() -> None:
    planner = IncrementalPlanner()
    first = busy()
    planner.plan(first, NOW)
    fewer = replace(first, pending=first.pending[1:])
    assert planner.plan(fewer, NOW) == admit(fewer, NOW)
    assert not planner.last_pass.full


def test_an_admission_carried_out_is_planned_incrementally() -> None:
    planner = IncrementalPlanner()
    first = busy()
    plan = planner.plan(first, NOW)
    carried = applied(first, plan)
    assert planner.plan(carried, NOW) == admit(carried, NOW)
    assert not planner.last_pass.full
    assert planner.last_pass.searched == 0  # every grant holds the slot its request took


def test_a_new_grant_elsewhere_is_planned_incrementally() -> None:
    planner = IncrementalPlanner()
    first = busy()
    planner.plan(first, NOW)
    more = replace(first, grants=(*first.grants, grant("g2", units=2, start_at=NOW + HOUR)))
    assert planner.plan(more, NOW) == admit(more, NOW)
    assert not planner.last_pass.full


def test_an_equal_request_read_again_is_no_change() -> None:
    planner = IncrementalPlanner()
    first = busy()
    planner.plan(first, NOW)
    again = replace(first, pending=tuple(replace(request) for request in first.pending))
    assert planner.plan(again, NOW) == admit(again, NOW)
    assert not planner.last_pass.full
    assert planner.last_pass.walked == 0


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda s: s, "the clock moved"),
        (lambda s: replace(s, pools=(pool(capacity=9),)), "the pools changed"),
        (lambda s: replace(s, policy=PolicySettings(race_width=1)), "the policy changed"),
        (
            lambda s: replace(s, pending=(*s.pending, calendar("block"))),
            "a calendar request arrived",
        ),
    ],
)
def test_broad_changes_plan_in_full_and_say_why(change: object, why: str) -> None:
    planner = IncrementalPlanner()
    first = busy()
    planner.plan(first, NOW)
    assert callable(change)
    changed: Snapshot = change(first)
    now = NOW + MINUTE if why == "the clock moved" else NOW
    assert planner.plan(changed, now) == admit(changed, now)
    assert planner.last_pass.full
    assert planner.last_pass.why.startswith(why)
