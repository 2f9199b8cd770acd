"""The incremental planner against a full plan on a busy grid: the planner benchmark's
snapshots (200 pools, 20 tenants in 4 cohorts, two of them strict FIFO, calendar blocks and
running grants), where long queues wait behind one another in shared pools and quota rows.

The snapshots of ``test_incremental_properties`` hold at most a few dozen requests, too few
for a change to ripple through queues that share pools and quota rows; here 2,000 pending
requests make each change reach hundreds of held slots, most of which the walk settles
without a search (see ``opendws.domain.planner.incremental.stands.stands``): every step must
still give exactly ``admit``. (A version of that test that read rows not yet rolled back kept
slots a search would have moved; this test fails on it within a few steps, the small one did
not.)
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opendws.domain import Mode, Snapshot, admit
from tests.bench_modules import load_bench
from tests.property.checked import checked


@pytest.fixture(scope="module")
def planner_bench() -> ModuleType:
    return load_bench("planner", "bench_planner")


def changed(bench: ModuleType, snapshot: Snapshot, rng: random.Random, index: int) -> Snapshot:
    """One random change: a flex arrival, a flex request leaving, or a running grant ending
    (an arrival when there is no such request or grant left: a snapshot carried out from a
    plan may hold no grant that started before NOW)."""
    kind = rng.random()
    flex = [r for r in snapshot.pending if r.mode is Mode.FLEX_START]
    running = [g for g in snapshot.grants if g.start_at < bench.NOW]
    if 0.4 <= kind < 0.7 and flex:
        gone = rng.choice(flex)
        return replace(snapshot, pending=tuple(r for r in snapshot.pending if r is not gone))
    if kind >= 0.7 and running:
        ended = rng.choice(running)
        return replace(snapshot, grants=tuple(g for g in snapshot.grants if g is not ended))
    request = bench.build_request(rng, 700_000 + index)
    if request.mode is Mode.FLEX_START:
        return replace(snapshot, pending=(*snapshot.pending, request))
    return snapshot


# How far the clock moves when it does (seconds): within a minute, to the next, and beyond.
TICKS = (20, 60, 61, 600, 3_600, 4 * 3_600)


@settings(max_examples=4)
@given(seed=st.integers(0, 10_000), ticking=st.booleans())
def test_incremental_plans_equal_full_plans_on_a_busy_grid(
    planner_bench: ModuleType, seed: int, ticking: bool
) -> None:
    """With ``ticking``, the clock also moves before a third of the changes, from the queue
    the reconciler leaves after a pass: admissions carried out (now grants), calendar blocks
    decided (a pending block's verdict depends on now, so the planner plans in full while one
    is pending; in service they are booked or refused at once)."""
    snapshot = planner_bench.build_snapshot(2000, seed=seed)
    if ticking:  # as the reconciler leaves it: admissions carried out, blocks decided
        flex = tuple(r for r in snapshot.pending if r.mode is Mode.FLEX_START)
        plan = admit(snapshot, planner_bench.NOW)
        snapshot = planner_bench.carried_out(replace(snapshot, pending=flex), plan)
    now = planner_bench.NOW
    planner = checked(clock_floor=0)
    planner.plan(snapshot, now)
    rng = random.Random(seed)
    incremental = 0
    for index in range(30):
        snapshot = changed(planner_bench, snapshot, rng, index)
        if ticking and rng.random() < 1 / 3:
            now += timedelta(seconds=rng.choice(TICKS))
        assert planner.plan(snapshot, now) == admit(snapshot, now), (index, planner.last_pass)
        incremental += not planner.last_pass.full
    assert incremental > 0  # the walk, not only full passes, was compared
