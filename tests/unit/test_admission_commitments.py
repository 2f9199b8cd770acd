"""Held slots as commitments (``PolicySettings.commit_within``): a pending flex request keeps
the start it was told — a pass may move it earlier, never later — unless it no longer fits;
newcomers backfill only into what no commitment needs. Off by default: then a newcomer placed
first in policy order can push a held slot later (the case the commitments exist for)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from opendws.domain import Outcome, Reason, Snapshot, admit
from opendws.domain.model import Commitment, PolicySettings
from tests.builders import A3, DAY, H100, HOUR, MINUTE, NOW, ZONE, flex, grant, pool, quota, tenant
from tests.builders import snapshot as build_snapshot

POOL = f"{ZONE}/{A3}"
STICKY = PolicySettings(commit_within=14 * DAY)


def snapshot(**parts: object) -> Snapshot:
    parts.setdefault("tenants", [tenant("t", quota(H100, 1024))])
    parts.setdefault("pools", [pool(capacity=4)])
    return build_snapshot(**parts)  # type: ignore[arg-type]


# The pool is full for 2 h; ``big`` (4 VMs, 1 h) was told 2 h; ``small`` (1 VM, 10 min),
# smaller and so first in policy order, arrives now.
BLOCKER = grant("blocker", units=4, hours=2)
BIG = flex("big", vm_count=4, hours=1, submitted_at=NOW - MINUTE)
SMALL = flex("small", vm_count=1, run=10 * MINUTE)
TOLD = Commitment(request_id="big", pool_id=POOL, start_at=NOW + 2 * HOUR)


def starts(snap: Snapshot) -> dict[str, timedelta | None]:
    plan = admit(snap, NOW)
    return {d.request_id: None if d.start_at is None else d.start_at - NOW for d in plan.decisions}


def test_without_commitments_a_smaller_newcomer_pushes_a_held_slot_later() -> None:
    snap = snapshot(grants=[BLOCKER], pending=[BIG, SMALL])
    assert starts(replace(snap, commitments=(TOLD,))) == {
        "small": 2 * HOUR,
        "big": 2 * HOUR + 10 * MINUTE,
    }


def test_a_commitment_keeps_its_start_and_the_newcomer_backfills_around_it() -> None:
    snap = snapshot(grants=[BLOCKER], pending=[BIG, SMALL], policy=STICKY)
    plan = admit(replace(snap, commitments=(TOLD,)), NOW)
    big, small = plan.decision("big"), plan.decision("small")
    assert (big.outcome, big.start_at, big.pool_id) == (Outcome.HOLD, NOW + 2 * HOUR, POOL)
    assert small.start_at == NOW + 3 * HOUR  # after big: nothing before it is free of big's slot


def test_a_committed_request_moves_earlier_when_capacity_frees() -> None:
    """The blocker ended early (its grant is gone): small, which needs none of big's slot,
    starts now; then big moves from the 2 h it was told to the first start left, 10 min."""
    snap = snapshot(pending=[BIG, SMALL], policy=STICKY)
    plan = admit(replace(snap, commitments=(TOLD,)), NOW)
    assert plan.decision("small").outcome is Outcome.ADMIT
    big = plan.decision("big")
    assert (big.outcome, big.start_at) == (Outcome.HOLD, NOW + 10 * MINUTE)


def test_a_commitment_that_no_longer_fits_is_planned_again() -> None:
    """The blocker runs an hour longer than planned (it started late at Google): big's slot
    is gone, so big is planned like any other request — in policy order, after small."""
    late = grant("blocker", units=4, hours=3)
    snap = snapshot(grants=[late], pending=[BIG, SMALL], policy=STICKY)
    assert starts(replace(snap, commitments=(TOLD,))) == {
        "small": 3 * HOUR, "big": 3 * HOUR + 10 * MINUTE,
    }  # fmt: skip


def test_a_commitment_beyond_the_horizon_is_an_estimate() -> None:
    """With commitments only within an hour, a slot told 2 h away is planned again."""
    horizon = PolicySettings(commit_within=HOUR)
    snap = snapshot(grants=[BLOCKER], pending=[BIG, SMALL], policy=horizon)
    assert starts(replace(snap, commitments=(TOLD,))) == {
        "small": 2 * HOUR, "big": 2 * HOUR + 10 * MINUTE,
    }  # fmt: skip
    near = replace(TOLD, start_at=NOW + 50 * MINUTE)
    short = grant("blocker", units=4, end_at=NOW + 50 * MINUTE)
    snap = snapshot(grants=[short], pending=[BIG, SMALL], policy=horizon)
    assert starts(replace(snap, commitments=(near,))) == {
        "big": 50 * MINUTE, "small": 110 * MINUTE,
    }  # fmt: skip


def test_a_commitment_between_grid_minutes_is_kept_within_the_minute() -> None:
    """Told a start 30 s past a minute of this pass's grid: kept at the grid minute after it
    when the one before is still taken (the grid rounds commitments outward)."""
    told = replace(TOLD, start_at=NOW + 2 * HOUR + timedelta(seconds=30))
    blocker = grant("blocker", units=4, end_at=NOW + 2 * HOUR + timedelta(seconds=30))
    snap = snapshot(grants=[blocker], pending=[BIG], policy=STICKY)
    assert starts(replace(snap, commitments=(told,))) == {"big": 2 * HOUR + MINUTE}


def test_held_slots_lie_on_whole_minutes_of_the_clock_whatever_the_instant_of_the_pass() -> None:
    """The grid's cells are the clock's minutes, so a pass 30 s into a minute holds slots on
    the same boundaries as any other pass: a start now runs from now (and reserves through
    the minute its run ends in); a later start is at a whole minute."""
    now = NOW + timedelta(seconds=30)
    first = flex("first", vm_count=1, hours=1, submitted_at=NOW)
    second = flex("second", vm_count=1, hours=1, submitted_at=NOW + MINUTE)
    plan = admit(snapshot(pools=[pool(capacity=1)], pending=[first, second]), now)
    assert (plan.decision("first").outcome, plan.decision("first").start_at) == (
        Outcome.ADMIT, now,
    )  # fmt: skip
    # first runs to NOW + 1 h 30 s: second starts at the next whole minute.
    assert plan.decision("second").start_at == NOW + HOUR + MINUTE
    ended = grant("blocker", units=1, end_at=NOW + HOUR)
    plan = admit(snapshot(pools=[pool(capacity=1)], grants=[ended], pending=[second]), now)
    assert plan.decision("second").start_at == NOW + HOUR  # not now + 1 h: a whole minute


def test_a_held_commitment_names_the_same_reason_before_and_after_an_admission_is_carried_out() -> (
    None
):
    """``early`` (1 VM, 30 min) was told 1 h; ``late`` (1 VM, 1 h, larger and so later in
    policy order) was told now, and is admitted. The pool has one VM free: ``late`` takes it
    until 1 h, so that is what keeps ``early`` waiting — the pool's capacity, named the same
    whether ``late``'s run is this plan's admission or, one pass later, a grant. (Judged
    while commitments were still being held, before ``late`` took the VM, the pool looked
    free and ``early`` read QUOTA, with no quota anywhere near binding; the next pass read
    NO_CAPACITY_UNTIL, and every admission flipped the held requests' reasons back and forth,
    a write and an event each.)"""
    one_free = grant("blocker", units=1, hours=3)
    early = flex("early", vm_count=1, run=30 * MINUTE, submitted_at=NOW - HOUR)
    late = flex("late", vm_count=1, hours=1, submitted_at=NOW - HOUR)
    told_early = Commitment(request_id="early", pool_id=POOL, start_at=NOW + HOUR)
    told_late = Commitment(request_id="late", pool_id=POOL, start_at=NOW)
    base = snapshot(pools=[pool(capacity=2)], grants=[one_free], policy=STICKY)

    admitting = admit(
        replace(base, pending=(early, late), commitments=(told_early, told_late)), NOW
    )
    assert admitting.decision("late").outcome is Outcome.ADMIT
    carried_out = admit(
        replace(
            base,
            grants=(one_free, grant("late", units=1, hours=1)),
            pending=(early,),
            commitments=(told_early,),
        ),
        NOW,
    )
    for plan in (admitting, carried_out):
        held = plan.decision("early")
        assert (held.outcome, held.start_at) == (Outcome.HOLD, NOW + HOUR)
        assert held.reason is Reason.NO_CAPACITY_UNTIL


def test_a_strict_fifo_commitment_is_still_held_by_its_sibling() -> None:
    """A strict-FIFO tenant: ``head`` (2 VMs) waits for the pool until 1 h; ``next`` (1 VM,
    submitted after it) could start now in the one free VM but queues behind ``head``:
    FIFO_BLOCKED. Told 1 h, both become commitments; the next pass names the same reasons
    (judged with no floor, ``next`` read QUOTA: the pool had room, and no quota binds)."""
    strict = [tenant("t", quota(H100, 1024), strict_fifo=True)]
    one_free = grant("blocker", units=2, hours=1)
    head = flex("head", vm_count=2, run=30 * MINUTE, submitted_at=NOW - 2 * HOUR)
    behind = flex("next", vm_count=1, run=30 * MINUTE, submitted_at=NOW - HOUR)
    base = snapshot(
        tenants=strict, pools=[pool(capacity=3)], grants=[one_free], pending=[head, behind],
        policy=STICKY,
    )  # fmt: skip
    first = admit(base, NOW)
    told = tuple(
        Commitment(request_id=name, pool_id=POOL, start_at=NOW + HOUR) for name in ("head", "next")
    )
    again = admit(replace(base, commitments=told), NOW)
    for plan in (first, again):
        assert [
            (d.outcome, d.start_at, d.reason) for d in map(plan.decision, ("head", "next"))
        ] == [
            (Outcome.HOLD, NOW + HOUR, Reason.NO_CAPACITY_UNTIL),
            (Outcome.HOLD, NOW + HOUR, Reason.FIFO_BLOCKED),
        ]


def test_a_commitment_held_by_quota_reads_quota_where_its_pool_has_just_room() -> None:
    """The pool has exactly the one VM ``held`` needs free now; the tenant's quota (one VM's
    GPUs) is taken by ``other`` until 1 h. Told 1 h, ``held`` is a commitment, and what keeps
    it waiting is quota, not the pool: a pool with just the room a request needs has room."""
    one_vm = [tenant("t", quota(H100, 8))]
    other = grant("other", units=1, hours=1)
    held = flex("held", vm_count=1, run=30 * MINUTE, submitted_at=NOW - HOUR)
    base = snapshot(tenants=one_vm, pools=[pool(capacity=2)], grants=[other], pending=[held],
                    policy=STICKY)  # fmt: skip
    told = Commitment(request_id="held", pool_id=POOL, start_at=NOW + HOUR)
    for plan in (admit(base, NOW), admit(replace(base, commitments=(told,)), NOW)):
        decision = plan.decision("held")
        assert (decision.outcome, decision.start_at, decision.reason) == (
            Outcome.HOLD, NOW + HOUR, Reason.QUOTA,
        )  # fmt: skip


def test_a_commitment_moves_earlier_into_a_gap_exactly_as_long_as_its_run() -> None:
    """One VM; ``first`` holds it for 30 min and ``second`` from 1 h to 2 h, so it is free
    only over [30 min, 1 h). ``fits`` (30 min) was told 2 h: the gap holds its run exactly,
    though the minute just before its slot is busy, so it moves there."""
    grants = [
        grant("first", units=1, hours=0.5),
        grant("second", units=1, start_at=NOW + HOUR, hours=1),
    ]
    fits = flex("fits", vm_count=1, run=30 * MINUTE, submitted_at=NOW - HOUR)
    told = Commitment(request_id="fits", pool_id=POOL, start_at=NOW + 2 * HOUR)
    base = snapshot(pools=[pool(capacity=1)], grants=grants, pending=[fits], policy=STICKY)
    plan = admit(replace(base, commitments=(told,)), NOW)
    decision = plan.decision("fits")
    assert (decision.outcome, decision.start_at) == (Outcome.HOLD, NOW + 30 * MINUTE)


def test_a_commitment_moves_earlier_into_a_gap_shorter_than_its_run_that_reaches_its_slot() -> None:
    """One VM, held by ``first`` for 30 min and free after. ``long`` (2 h) was told 2 h: the
    90 free minutes before its slot are shorter than its run, but they reach its slot, which
    it gives back, so it moves to 30 min."""
    first = grant("first", units=1, hours=0.5)
    long = flex("long", vm_count=1, hours=2, submitted_at=NOW - HOUR)
    told = Commitment(request_id="long", pool_id=POOL, start_at=NOW + 2 * HOUR)
    base = snapshot(pools=[pool(capacity=1)], grants=[first], pending=[long], policy=STICKY)
    decision = admit(replace(base, commitments=(told,)), NOW).decision("long")
    assert (decision.outcome, decision.start_at) == (Outcome.HOLD, NOW + 30 * MINUTE)
