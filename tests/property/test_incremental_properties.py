"""The incremental planner against a full plan from scratch.

Random sequences of changes (flex and calendar arrivals, departures, releases, admissions
carried out, a held slot booked as a grant, the clock moving, a pool resized, the same
requests and grants read again in another order and as equal copies) are applied to
a random snapshot; after each step the planner that kept the previous passes must give
exactly ``admit(snapshot, now)``, and the admission properties must hold for its plan too.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from opendws.domain import Outcome, Plan, Snapshot, admit
from opendws.domain.model import CapacityRequest, Commitment, Grant, PolicySettings
from opendws.domain.planner.incremental.diff import identity_changes
from tests.builders import (
    A3,
    HOUR,
    MINUTE,
    calendar,
    flex,
    grant,
    grant_of,
    pool,
    quota,
    tenant,
)
from tests.builders import snapshot as build_snapshot
from tests.property.checked import checked
from tests.property.test_admission_properties import (
    NOW,
    applied,
    planned_grants,
    request_strategy,
    snapshots,
    violations,
)

STEPS = (
    "arrive", "arrive", "arrive", "leave", "leave", "release", "release", "apply", "book", "tick",
    "commit", "reread",
)  # fmt: skip
DAY = timedelta(days=1)
ZONE_A, ZONE_B = "us-central1-a", "us-central1-b"


def check(snapshot: Snapshot, now: datetime, plan: Plan) -> None:
    """The incremental plan is the full plan, and it keeps every limit."""
    assert plan == admit(snapshot, now)
    assert [d.request_id for d in plan.decisions] == sorted(r.request_id for r in snapshot.pending)
    # From now on: a calendar block whose start passed while it waited (the clock moved)
    # overlaps grants that ended before now, which hold nothing any more.
    assert violations(snapshot, planned_grants(snapshot, plan), since=now) == []


def committed(snapshot: Snapshot, plan: Plan, stale: bool) -> Snapshot:
    """``snapshot`` after the reconciler committed every slot ``plan`` holds (with ``stale``,
    the commitments it had stay listed before them: the last one for a request counts)."""
    told = tuple(
        Commitment(request_id=d.request_id, pool_id=d.pool_id, start_at=d.start_at)
        for d in plan.having(Outcome.HOLD)
        if d.pool_id is not None and d.start_at is not None
    )
    return replace(snapshot, commitments=(*snapshot.commitments, *told) if stale else told)


@st.composite
def step(draw: st.DrawFn, snapshot: Snapshot, plan: Plan, index: int) -> tuple[Snapshot, int]:
    """One change to ``snapshot`` (the last plan was ``plan``), and how far the clock moves
    (in seconds)."""
    kind = draw(st.sampled_from(STEPS))
    if kind == "arrive":
        names = [tenant.name for tenant in snapshot.tenants]
        request = draw(request_strategy(100 + index, names, list(snapshot.pools)))
        return replace(snapshot, pending=(*snapshot.pending, request)), 0
    if kind == "leave" and snapshot.pending:
        gone = draw(st.sampled_from(snapshot.pending))
        return replace(snapshot, pending=tuple(r for r in snapshot.pending if r is not gone)), 0
    if kind == "release" and snapshot.grants:
        gone_grant = draw(st.sampled_from(snapshot.grants))
        grants = tuple(g for g in snapshot.grants if g is not gone_grant)
        return replace(snapshot, grants=grants), 0
    if kind == "apply":
        return applied(snapshot, plan), 0
    if kind == "reread":
        # The store read again: the same requests and grants in another order, some as new
        # objects equal to the old (no change at all), as a mirror refreshed from Firestore
        # gives them.
        order = draw(st.permutations(snapshot.pending))
        shuffled = draw(st.permutations(snapshot.grants))
        copies = draw(st.lists(st.booleans(), min_size=len(order) + len(shuffled)))
        return replace(
            snapshot,
            pending=tuple(
                replace(r) if copy else r for r, copy in zip(order, copies, strict=False)
            ),
            grants=tuple(
                replace(g) if copy else g
                for g, copy in zip(shuffled, copies[len(order) :], strict=False)
            ),
        ), 0
    held = plan.having(Outcome.HOLD)
    if kind == "book" and held:
        # A held slot becomes a grant ahead (its request leaves the queue): a grant that
        # comes in the future, on rows pending calendar blocks may read.
        decision = draw(st.sampled_from(held))
        assert decision.pool_id is not None
        assert decision.start_at is not None
        request = next(r for r in snapshot.pending if r.request_id == decision.request_id)
        booked = Grant.of(request, decision.pool_id, decision.start_at)
        pending = tuple(r for r in snapshot.pending if r is not request)
        return replace(snapshot, pending=pending, grants=(*snapshot.grants, booked)), 0
    if kind == "tick":
        # Within the minute (a run from now may reach one cell further: see clock.move_within)
        # or to a later one (the cells move).
        return snapshot, draw(st.sampled_from([1, 13, 29, 47, 59, 60, 61, 600, 3600]))
    if kind == "commit":
        # As the reconciler does: every held slot becomes a commitment, near or far (only
        # those less than the horizon ahead are held; the others change no plan).
        return committed(snapshot, plan, stale=False), 0
    return snapshot, 0


@given(snapshots(), st.data())
def test_incremental_plans_equal_full_plans_after_every_change(
    snapshot: Snapshot, data: st.DataObject
) -> None:
    # Racing eagerly always plans in full; keep it rare so the incremental path is exercised.
    eager = data.draw(st.sampled_from([False, False, False, True]))
    # A commitment horizon with no commitment (or only ones beyond it) changes nothing; one
    # within it is held before the policy order, carried from pass to pass. The "commit"
    # step makes them.
    horizon = data.draw(st.sampled_from([None, timedelta(hours=2), timedelta(minutes=20)]))
    snapshot = replace(
        snapshot, policy=replace(snapshot.policy, race_eagerly=eager, commit_within=horizon)
    )
    planner = checked(clock_floor=0)
    now = NOW
    plan = planner.plan(snapshot, now)
    check(snapshot, now, plan)
    for index in range(data.draw(st.integers(1, 12))):
        snapshot, seconds = data.draw(step(snapshot, plan, index))
        now += timedelta(seconds=seconds)
        plan = planner.plan(snapshot, now)
        check(snapshot, now, plan)


@given(snapshots(), st.data())
def test_incremental_plans_as_the_clock_moves_by_seconds_equal_full_plans(
    snapshot: Snapshot, data: st.DataObject
) -> None:
    """Passes come seconds apart in service (each at its own now), most within one minute:
    the planner then touches only the requests whose run from now grew a cell, those that
    start now and those whose max_wait passed (see its clock.move_within), and
    each held request whose run grew is held for the reason it kept for the longer run.
    Between the ticks the queue changes as it does in service; every pass must still be
    ``admit``'s, under commitments too."""
    horizon = data.draw(st.sampled_from([None, timedelta(hours=2)]))
    snapshot = replace(snapshot, policy=replace(snapshot.policy, commit_within=horizon))
    planner = checked(clock_floor=0)
    now = NOW + timedelta(seconds=data.draw(st.integers(0, 59)))
    plan = planner.plan(snapshot, now)
    check(snapshot, now, plan)
    for index in range(data.draw(st.integers(1, 16))):
        if data.draw(st.booleans()):
            # Seconds later, and now and then past the minute, at any microsecond.
            now += timedelta(
                seconds=data.draw(st.integers(0, 70)),
                microseconds=data.draw(st.integers(1, 999_999)),
            )
        else:
            snapshot, seconds = data.draw(step(snapshot, plan, index))
            now += timedelta(seconds=seconds)
        plan = planner.plan(snapshot, now)
        check(snapshot, now, plan)


@st.composite
def quota_waits(draw: st.DrawFn) -> tuple[Snapshot, int]:
    """A pool of 8 VMs that b books whole from minute ``edge`` on (and now and then a little
    elsewhere), and requests of a and c, whose quotas (4 VMs each) are in use elsewhere for a
    while: each waits for quota if the pool has room over the cells its run from now covers,
    else for the pool. Runs mostly end near ``edge`` and last odd seconds, so a run from now
    reaches ``edge``'s cell from some instant of the minute on, and the reason turns. Also
    returns ``edge``, for the runs of arrivals."""
    other = "us-central1-b"
    edge = draw(st.integers(14, 90))
    grants = [
        grant(
            f"q{name}", tenant=name, pool_id=f"{other}/{A3}", units=4, accelerator_units=32,
            start_at=NOW - HOUR, end_at=NOW + timedelta(minutes=draw(st.integers(2, 240))),
        )
        for name in ("a", "c")
    ]  # fmt: skip
    grants.append(
        grant(
            "edge", tenant="b", units=8, start_at=NOW + timedelta(minutes=edge),
            hours=draw(st.integers(1, 20)) / 60,
        )
    )  # fmt: skip
    if draw(st.booleans()):  # the pool full in the first minute or two: a run from now
        # compared from cell 0 lacks room, one compared from cell 1 (later in the minute)
        # may not
        until = NOW + timedelta(minutes=draw(st.integers(1, 2)))
        grants.append(grant("now", tenant="b", units=8, start_at=NOW - HOUR, end_at=until))
    if draw(st.booleans()):  # a little of the pool booked before it
        before = draw(st.integers(3, edge - 2))  # after the first minutes, which may be full
        grants.append(
            grant(
                "little", tenant="b", units=draw(st.integers(1, 4)),
                start_at=NOW + timedelta(minutes=before), end_at=NOW + timedelta(minutes=edge),
            )
        )  # fmt: skip
    pending = [
        flex(
            f"r{index}",
            tenant=draw(st.sampled_from("aacb")),
            vm_count=draw(st.integers(1, 4)),
            run=draw(runs(edge)),
            max_wait=timedelta(seconds=draw(st.sampled_from([86_400, 61, 97, 150, 299]))),
        )
        for index in range(draw(st.integers(1, 8)))
    ]
    snapshot = build_snapshot(
        pools=[pool(capacity=8), pool(zone=other, capacity=64)],
        tenants=[
            tenant("a", quota(nominal=32)),
            tenant("b", quota(nominal=10_000)),
            tenant("c", quota(nominal=32)),
        ],
        grants=grants,
        pending=pending,
    )
    return snapshot, edge


def runs(edge: int) -> st.SearchStrategy[timedelta]:
    """A run that mostly takes ``edge`` cells or one or two fewer from a whole minute (odd
    seconds), else any from 10 minutes to 1.5 hours."""
    near = st.builds(
        lambda minutes, seconds: timedelta(minutes=minutes, seconds=seconds),
        st.integers(edge - 3, edge - 1),
        st.integers(1, 59),
    )
    return st.one_of(near, near, near, st.integers(600, 5400).map(lambda s: timedelta(seconds=s)))


@given(quota_waits(), st.data())
def test_reasons_as_the_clock_moves_by_seconds_equal_full_plans(
    waits: tuple[Snapshot, int], data: st.DataObject
) -> None:
    """Requests held by quota or by the pool, as the clock moves by seconds (a held request
    whose run from now grows a cell may change its reason: see _Entry.alt), arrivals and
    admissions carried out in between: every pass is ``admit``'s."""
    snapshot, edge = waits
    planner = checked(clock_floor=0)
    now = NOW
    plan = planner.plan(snapshot, now)
    check(snapshot, now, plan)
    for index in range(data.draw(st.integers(1, 16))):
        kind = data.draw(st.sampled_from(["tick", "tick", "tick", "arrive", "apply"]))
        if kind == "tick":
            now += timedelta(
                seconds=data.draw(st.integers(0, 70)),
                microseconds=data.draw(st.integers(1, 999_999)),
            )
        elif kind == "apply":
            snapshot = applied(snapshot, plan)
        else:
            request = flex(
                f"n{index}",
                tenant=data.draw(st.sampled_from("acb")),
                vm_count=data.draw(st.integers(1, 4)),
                run=data.draw(runs(edge)),
                submitted_at=NOW,
                # Now and then one that gives up within minutes, at an odd second.
                max_wait=data.draw(
                    st.one_of(
                        st.just(DAY),
                        st.integers(60, 600).map(lambda seconds: timedelta(seconds=seconds)),
                    )
                ),
            )
            snapshot = replace(snapshot, pending=(*snapshot.pending, request))
        plan = planner.plan(snapshot, now)
        check(snapshot, now, plan)


@given(snapshots(), st.data())
def test_an_eta_never_gets_later_when_a_request_behind_it_arrives_incrementally(
    snapshot: Snapshot, data: st.DataObject
) -> None:
    snapshot = replace(snapshot, policy=PolicySettings(race_width=1))
    planner = checked(clock_floor=0)
    before = planner.plan(snapshot, NOW)
    names = [tenant.name for tenant in snapshot.tenants]
    request = data.draw(request_strategy(99, names, list(snapshot.pools)))
    grown = replace(snapshot, pending=(*snapshot.pending, request))
    after = planner.plan(grown, NOW)
    assert after == admit(grown, NOW)
    new = after.decision(request.request_id)
    for decision in before.having(Outcome.HOLD, Outcome.ADMIT):
        later = after.decision(decision.request_id)
        new_rank = after.rank(new.request_id)
        rank = after.rank(decision.request_id)
        ahead = new_rank is not None and rank is not None and rank < new_rank
        if later.outcome in (Outcome.HOLD, Outcome.ADMIT) and ahead:
            assert later.start_at == decision.start_at


@given(snapshots(), st.data())
def test_incremental_plans_over_commitments_equal_full_plans(
    snapshot: Snapshot, data: st.DataObject
) -> None:
    """As a reconciler runs under a horizon: after most passes every held slot is committed,
    so the next pass holds those within the horizon before the policy order, and the planner
    carries them over (moved, dropped, new, or no longer fitting) instead of planning in
    full. Every pass must still be ``admit``'s."""
    horizon = data.draw(st.sampled_from([timedelta(hours=2), timedelta(minutes=20), DAY]))
    snapshot = replace(
        snapshot, policy=replace(snapshot.policy, race_eagerly=False, commit_within=horizon)
    )
    planner = checked(clock_floor=0)
    now = NOW
    plan = planner.plan(snapshot, now)
    check(snapshot, now, plan)
    for index in range(data.draw(st.integers(1, 14))):
        kind = data.draw(st.integers(0, 5))
        if kind <= 2:
            snapshot = committed(snapshot, plan, stale=data.draw(st.booleans()))
        elif kind == 3 and snapshot.commitments:
            # A commitment told elsewhere (a cold instance's announced ETA, a pool moved):
            # earlier or later, off the minute, or into another pool; it may not fit there.
            moved = data.draw(st.sampled_from(snapshot.commitments))
            seconds = data.draw(st.sampled_from([-7200, -600, -60, 30, 60, 600, 3600, 90_000]))
            pool_id = data.draw(
                st.sampled_from([moved.pool_id, *(p.pool_id for p in snapshot.pools)])
            )
            elsewhere = replace(
                moved, pool_id=pool_id, start_at=moved.start_at + timedelta(seconds=seconds)
            )
            others = tuple(c for c in snapshot.commitments if c is not moved)
            snapshot = replace(snapshot, commitments=(*others, elsewhere))
        else:
            snapshot, seconds = data.draw(step(snapshot, plan, index))
            now += timedelta(seconds=seconds)
        plan = planner.plan(snapshot, now)
        check(snapshot, now, plan)


@st.composite
def crowded(draw: st.DrawFn) -> Snapshot:
    """One busy pool (its runs are tenant t's) and a queue of flex requests behind them (of
    two tenants, u under a tight quota), so that most passes hold commitments and a release
    moves some earlier."""
    capacity = draw(st.integers(4, 8))
    tight = draw(st.integers(2, 6)) * 8  # accelerators: 8 per VM
    grants = [
        grant(f"g{index}", units=units,
              start_at=NOW - HOUR, hours=1 + draw(st.integers(1, 12)) / 4)
        for index, units in enumerate(draw(st.lists(st.integers(1, 2), min_size=2, max_size=4)))
    ]  # fmt: skip
    if sum(g.units for g in grants) > capacity:
        grants = grants[:2]
    pending = [
        flex(f"r{index}", tenant=draw(st.sampled_from(["t", "u"])),
             vm_count=draw(st.integers(1, capacity)), hours=draw(st.integers(1, 12)) / 4,
             priority=draw(st.integers(0, 1)), submitted_at=NOW - index * MINUTE)
        for index in range(draw(st.integers(3, 10)))
    ]  # fmt: skip
    return build_snapshot(
        pools=[pool(capacity=capacity)],
        tenants=[tenant("t", quota(nominal=1024)), tenant("u", quota(nominal=tight))],
        grants=grants,
        pending=pending,
        policy=PolicySettings(commit_within=DAY),
    )


@given(crowded(), st.data())
def test_moves_carried_out_plan_as_full_plans(snapshot: Snapshot, data: st.DataObject) -> None:
    """The reconciler's rhythm under a horizon: something frees room (a grant ends, a request
    leaves), so a pass moves commitments earlier; the next pass finds that pass carried out
    (its admissions as grants, every slot it held committed, where it moved them) and holds
    each mover there, as the last pass left it (or, now and then, one is told elsewhere).
    Every pass must still be ``admit``'s."""
    planner = checked(clock_floor=0)
    plan = planner.plan(snapshot, NOW)
    check(snapshot, NOW, plan)
    for _ in range(data.draw(st.integers(1, 6))):
        before = {c.request_id: c.start_at for c in snapshot.commitments}
        snapshot = committed(applied(snapshot, plan), plan, stale=False)
        if len(snapshot.commitments) > 0 and data.draw(st.booleans()):
            # One told elsewhere than the plan put it (as an ETA told before a move is),
            # most often one the plan moved.
            movers = [c for c in snapshot.commitments if before.get(c.request_id, c.start_at)
                      != c.start_at]  # fmt: skip
            choices: list[Commitment] = movers or list(snapshot.commitments)
            told = data.draw(st.sampled_from(choices))
            seconds = data.draw(st.sampled_from([-900, -60, 60, 900, 3600]))
            elsewhere = replace(told, start_at=told.start_at + timedelta(seconds=seconds))
            others = tuple(c for c in snapshot.commitments if c is not told)
            snapshot = replace(snapshot, commitments=(*others, elsewhere))
        plan = planner.plan(snapshot, NOW)
        check(snapshot, NOW, plan)
        if snapshot.grants and (not snapshot.pending or data.draw(st.booleans())):
            ended = data.draw(st.sampled_from(snapshot.grants))
            snapshot = replace(snapshot, grants=tuple(g for g in snapshot.grants if g is not ended))
        elif snapshot.pending:
            gone = data.draw(st.sampled_from(snapshot.pending))
            pending = tuple(r for r in snapshot.pending if r is not gone)
            snapshot = replace(snapshot, pending=pending)
        plan = planner.plan(snapshot, NOW)
        check(snapshot, NOW, plan)


@given(seed=st.integers(0, 1_000_000))
def test_requests_between_two_pools_and_a_binding_quota_plan_as_full_plans(seed: int) -> None:
    """Requests that may go to either of two pools (or one), of a tenant whose quota binds and
    of one whose quota does not, while runs end and requests arrive. A release frees quota and
    room in one pool; the walk then tests each queued request's other pool as that request sees
    it, with the takes of the requests after it given back (see
    ``opendws.domain.planner.incremental.stands.past_unrolled``). Every step must give exactly
    ``admit``. (Versions that did not give those takes back, or that went on past a short cell
    further than its run, kept slots a search would have moved: this test fails on both, the
    tests above did not.)"""
    rng = random.Random(seed)
    zones = ("us-central1-a", "us-central1-b")
    where = [zones[:1], zones[1:], zones, zones[::-1]]

    def queued(name: str) -> CapacityRequest:
        return flex(
            name,
            tenant=rng.choice(["bound", "free"]),
            vm_count=1 if rng.random() < 0.6 else 2,
            hours=rng.randint(1, 4),
            locations=rng.choice(where),
        )

    snapshot = build_snapshot(
        pools=[pool(zone=zone, capacity=rng.randint(1, 3)) for zone in zones],
        tenants=[
            tenant("bound", quota(nominal=8 * rng.randint(1, 3))),  # one to three VMs' GPUs
            tenant("free", quota(nominal=1024)),
        ],
        grants=[
            grant(
                f"g{index}",
                tenant=rng.choice(["bound", "free"]),
                pool_id=f"{rng.choice(zones)}/{A3}",
                start_at=NOW - HOUR,
                hours=rng.randint(1, 4),
            )
            for index in range(rng.randint(1, 3))
        ],
        pending=[queued(f"r{index}") for index in range(rng.randint(2, 8))],
    )
    planner = checked(clock_floor=0)
    assert planner.plan(snapshot, NOW) == admit(snapshot, NOW)
    for index in range(4):
        if snapshot.grants and rng.random() < 0.5:
            ended = rng.choice(snapshot.grants)
            snapshot = replace(snapshot, grants=tuple(g for g in snapshot.grants if g is not ended))
        else:
            snapshot = replace(snapshot, pending=(*snapshot.pending, queued(f"a{index}")))
        assert planner.plan(snapshot, NOW) == admit(snapshot, NOW), index


class _Item:
    """An object compared by identity only (as requests are first told apart)."""


@given(
    st.integers(0, 600),
    st.lists(
        st.tuples(st.sampled_from(["insert", "remove", "move", "replace"]), st.integers(0, 10**6)),
        max_size=40,
    ),
    st.booleans(),
)
def test_identity_changes_name_every_item_that_came_or_left(
    size: int, edits: list[tuple[str, int]], shuffle: bool
) -> None:
    """Whatever the edits (in place, far moves, or the whole order shuffled), every item only
    the old sequence holds is named as left and every one only the new holds as came; an item
    both hold is named in both lists or in neither (a value comparison cancels it); none is
    named twice in one list."""
    old = tuple(_Item() for _ in range(size))
    new = list(old)
    for kind, where in edits:
        at = where % (len(new) + 1)
        if kind == "insert" or not new:
            new.insert(at, _Item())
        elif kind == "remove":
            del new[at % len(new)]
        elif kind == "move":
            new.insert(where % len(new), new.pop(at % len(new)))
        else:
            new[at % len(new)] = _Item()
    if shuffle:
        random.Random(size).shuffle(new)
    left, came = identity_changes(old, tuple(new))
    olds, news = {id(item) for item in old}, {id(item) for item in new}
    lefts, cames = [id(item) for item in left], [id(item) for item in came]
    assert len(set(lefts)) == len(lefts)
    assert len(set(cames)) == len(cames)
    assert set(lefts) <= olds
    assert set(cames) <= news
    assert olds - news <= set(lefts)
    assert news - olds <= set(cames)
    both = olds & news
    assert both & set(lefts) == both & set(cames)


@given(seed=st.integers(0, 1_000_000))
def test_calendar_blocks_coming_and_going_plan_as_full_plans(seed: int) -> None:
    """Calendar blocks crowding two pools and a cohort's quota, beside a flex queue, while
    blocks arrive (in any place in calendar order), leave (refused, confirmed and withdrawn,
    or reserved as the grant they booked) and grants come and go. A block whose booking
    changes reaches the blocks after it, which may change in turn (see
    ``opendws.domain.planner.incremental.blocks.recalendar``); the flex grid takes and gives
    back what the blocks book. Every step must give exactly ``admit``."""
    rng = random.Random(seed)
    zones = (ZONE_A, ZONE_B)
    tenants = [
        tenant("t", quota(nominal=rng.choice([48, 64, 1024])), cohort="c"),
        tenant("u", quota(nominal=rng.choice([32, 64, 1024])), cohort="c"),
        tenant("g", quota(nominal=1024)),
    ]
    names = iter(range(1_000_000))

    def block() -> CapacityRequest:
        return calendar(
            f"b{next(names)}", tenant=rng.choice("tu"), vm_count=rng.randint(1, 8),
            start_at=NOW + rng.randint(1, 96) * HOUR, days=rng.choice([1, 2, 3]),
            locations=rng.sample(zones, rng.randint(1, 2)),
            submitted_at=NOW - rng.randint(0, 600) * MINUTE, priority=int(rng.random() < 0.2),
        )  # fmt: skip

    def run(grants: Sequence[Grant]) -> Grant | None:
        """A run of tenant g (outside the cohort), if it fits its pool beside ``grants``."""
        made = grant(
            f"g{next(names)}", tenant="g", units=rng.randint(1, 4),
            pool_id=f"{rng.choice(zones)}/{A3}", start_at=NOW + rng.randint(-2, 72) * HOUR,
            hours=rng.randint(1, 30),
        )  # fmt: skip
        beside = sum(
            g.units
            for g in grants
            if g.pool_id == made.pool_id and g.start_at < made.end_at and made.start_at < g.end_at
        )
        return made if beside + made.units <= 8 else None

    runs: list[Grant] = []
    for _ in range(rng.randint(0, 4)):
        made = run(runs)
        if made is not None:
            runs.append(made)
    snapshot = build_snapshot(
        pools=[pool(zone=zone, capacity=8) for zone in zones],
        tenants=tenants,
        grants=runs,
        pending=[
            *(block() for _ in range(rng.randint(2, 8))),
            *(
                flex(f"f{index}", tenant=rng.choice("tu"), vm_count=rng.randint(1, 8),
                     hours=rng.randint(1, 40), max_wait=3 * DAY,
                     locations=rng.sample(zones, rng.randint(1, 2)))
                for index in range(rng.randint(0, 5))
            ),
        ],
    )  # fmt: skip
    planner = checked(clock_floor=0)
    plan = planner.plan(snapshot, NOW)
    check(snapshot, NOW, plan)
    for _ in range(8):
        blocks = [r for r in snapshot.pending if r.start_at is not None]
        kind = rng.choice(["arrive", "arrive", "leave", "reserve", "release", "grant"])
        if kind == "arrive":
            snapshot = replace(snapshot, pending=(*snapshot.pending, block()))
        elif kind == "leave" and blocks:
            gone = rng.choice(blocks)
            snapshot = replace(
                snapshot, pending=tuple(r for r in snapshot.pending if r is not gone)
            )
        elif kind == "reserve" and plan.having(Outcome.CONFIRM):
            decision = rng.choice(plan.having(Outcome.CONFIRM))
            request = next(r for r in snapshot.pending if r.request_id == decision.request_id)
            assert decision.pool_id is not None
            booked = grant_of(request, pool_id=decision.pool_id)
            snapshot = replace(
                snapshot,
                pending=tuple(r for r in snapshot.pending if r is not request),
                grants=(*snapshot.grants, booked),
            )
        elif kind == "release" and snapshot.grants:
            ended = rng.choice(snapshot.grants)
            snapshot = replace(snapshot, grants=tuple(g for g in snapshot.grants if g is not ended))
        else:
            made = run(snapshot.grants)
            if made is not None:
                snapshot = replace(snapshot, grants=(*snapshot.grants, made))
        plan = planner.plan(snapshot, NOW)
        check(snapshot, NOW, plan)
