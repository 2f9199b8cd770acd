"""Properties of ``admit`` over random snapshots.

Each property is checked against an exact oracle written independently of the planner: sums of
``[start, end)`` intervals at every breakpoint, with real timestamps (the planner's minute grid
and its caches play no part in the checking).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from hypothesis import given
from hypothesis import strategies as st

from opendws.domain import (
    CapacityRequest,
    GangShape,
    Grant,
    Mode,
    Outcome,
    Plan,
    Pool,
    Provider,
    QueueingStrategy,
    Quota,
    Snapshot,
    Tenant,
    admit,
)
from opendws.domain.calendar import count_problem, lead_of
from opendws.domain.model import PolicySettings

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
T = TypeVar("T")
ZONES = ("us-central1-a", "us-central1-b", "europe-west4-a")
# (shape, accelerator, provider, accelerators per VM)
SHAPES = (
    ("a3-highgpu-8g", "nvidia-h100-80gb", Provider.MIG, 8),
    ("g2-standard-24", "nvidia-l4", Provider.MIG, 2),
    ("tpu-v5e", "tpu-v5e", Provider.TPU, 0),
)
TOPOLOGIES = ("1x1", "2x2", "2x4")

Interval = tuple[datetime, datetime, int]


# --- the exact oracle ------------------------------------------------------------------------


def peak(intervals: Iterable[Interval]) -> int:
    """Highest sum of amounts at any instant (intervals are [start, end))."""
    events: list[tuple[datetime, int]] = []
    for start, end, amount in intervals:
        events.append((start, amount))
        events.append((end, -amount))
    level = highest = 0
    for _, delta in sorted(events, key=lambda event: (event[0], event[1])):
        level += delta  # ends sort before starts at the same instant: [s, e) touching is fine
        highest = max(highest, level)
    return highest


def cohort_totals(tenants: Iterable[Tenant]) -> dict[tuple[str, str], int]:
    totals: dict[tuple[str, str], int] = defaultdict(int)
    for tenant in tenants:
        if tenant.cohort is not None:
            for quota in tenant.quotas:
                totals[(tenant.cohort, quota.accelerator)] += quota.nominal
    return totals


def violations(
    snapshot: Snapshot, holds: Iterable[Grant], since: datetime | None = None
) -> list[str]:
    """Every pool, tenant or cohort limit exceeded at some instant (from ``since`` on, if
    given: the past holds no capacity) by grants plus holds."""
    everything = [
        grant if since is None or grant.start_at >= since else replace(grant, start_at=since)
        for grant in (*snapshot.grants, *holds)
        if since is None or grant.end_at > since
    ]
    problems = []
    per_pool: dict[str, list[Interval]] = defaultdict(list)
    per_tenant: dict[tuple[str, str], list[Interval]] = defaultdict(list)
    per_cohort: dict[tuple[str, str], list[Interval]] = defaultdict(list)
    tenants = {tenant.name: tenant for tenant in snapshot.tenants}
    for grant in everything:
        per_pool[grant.pool_id].append((grant.start_at, grant.end_at, grant.units))
        interval = (grant.start_at, grant.end_at, grant.accelerator_units)
        per_tenant[(grant.tenant, grant.accelerator)].append(interval)
        cohort = tenants[grant.tenant].cohort
        if cohort is not None:
            per_cohort[(cohort, grant.accelerator)].append(interval)
    for pool in snapshot.pools:
        if peak(per_pool[pool.pool_id]) > pool.capacity:
            problems.append(f"pool {pool.pool_id} over capacity {pool.capacity}")
    totals = cohort_totals(snapshot.tenants)
    for (name, accelerator), intervals in per_tenant.items():
        tenant = tenants[name]
        quota = tenant.quota(accelerator)
        if tenant.cohort is None:
            limit: int | None = quota.nominal
        elif quota.borrowing_limit is None:
            limit = None
        else:
            limit = quota.nominal + quota.borrowing_limit
        if limit is not None and peak(intervals) > limit:
            problems.append(f"tenant {name} over its {accelerator} limit {limit}")
    for key, intervals in per_cohort.items():
        if peak(intervals) > totals[key]:
            problems.append(f"cohort {key} over {totals[key]}")
    return problems


# --- random snapshots ------------------------------------------------------------------------


@st.composite
def tenants_strategy(draw: st.DrawFn) -> list[Tenant]:
    count = draw(st.integers(1, 4))
    tenants = []
    for index in range(count):
        quotas = tuple(
            Quota(
                accelerator=accelerator,
                nominal=draw(st.integers(0, 96)),
                borrowing_limit=draw(st.none() | st.integers(0, 32)),
            )
            for _, accelerator, _, _ in SHAPES
            if draw(st.booleans()) or index == 0
        )
        tenants.append(
            Tenant(
                name=f"t{index}",
                quotas=quotas,
                cohort=draw(st.sampled_from([None, "c1", "c1", "c2"])),
                queueing=draw(st.sampled_from(list(QueueingStrategy))),
            )
        )
    return tenants


@st.composite
def pools_strategy(draw: st.DrawFn) -> list[Pool]:
    pools = []
    for zone in ZONES[: draw(st.integers(1, 3))]:
        for shape, accelerator, provider, _ in SHAPES:
            if draw(st.booleans()):
                short = draw(st.none() | st.integers(-60, 600))
                # Google's serve wait learned there (Pool.serve_wait): none, short, or long.
                wait = draw(st.sampled_from([0, 0, 0, 7, 45]))
                pools.append(
                    Pool(
                        pool_id=f"{zone}/{shape}",
                        zone=zone,
                        shape=shape,
                        accelerator=accelerator,
                        provider=provider,
                        capacity=draw(st.sampled_from([0, 2, 4, 6, 8, 12, 16])),
                        short_until=None if short is None else NOW + timedelta(minutes=short),
                        serve_wait=timedelta(minutes=wait),
                    )
                )
    if not pools:
        pools.append(
            Pool(
                pool_id=f"{ZONES[0]}/a3-highgpu-8g",
                zone=ZONES[0],
                shape="a3-highgpu-8g",
                accelerator="nvidia-h100-80gb",
                provider=Provider.MIG,
                capacity=draw(st.integers(1, 12)),
            )
        )
    return pools


@st.composite
def gang_strategy(draw: st.DrawFn, shape: str | None = None) -> GangShape:
    choices = [entry for entry in SHAPES if shape is None or entry[0] == shape]
    shape_name, accelerator, provider, per_vm = draw(st.sampled_from(choices))
    if provider is Provider.TPU:
        return GangShape(
            vm_count=draw(st.integers(1, 2)),
            accelerator=accelerator,
            topology=draw(st.sampled_from(TOPOLOGIES)),
        )
    return GangShape(
        vm_count=draw(st.integers(1, 5)),
        accelerator=accelerator,
        machine_type=shape_name,
        accelerators_per_vm=per_vm,
    )


def seconds(draw: st.DrawFn, low: int, high: int) -> timedelta:
    """A duration; often whole minutes, sometimes with odd seconds (grid rounding)."""
    whole = draw(st.booleans())
    value = draw(st.integers(low, high))
    return timedelta(seconds=value - value % 60 if whole else value)


@st.composite
def request_strategy(
    draw: st.DrawFn, index: int, tenant_names: list[str], pools: list[Pool]
) -> CapacityRequest:
    """Mostly requests some pool can serve (its shape, its zone or region, a preference order),
    sometimes anything at all, so that rejections stay covered too."""
    if pools and draw(st.integers(0, 9)) > 0:
        target = draw(st.sampled_from(pools))
        gang = draw(gang_strategy(target.shape))
        region = target.zone.rsplit("-", 1)[0]
        locations = draw(
            st.sampled_from(
                [(target.zone,), (region,), ("europe-west4", region), (target.zone, "us-central1")]
            )
        )
    else:
        gang = draw(gang_strategy())
        locations = draw(st.sampled_from([("us-central1",), ("europe-west4-a",)]))
    names = [*tenant_names, "ghost"] if index == 0 else tenant_names
    common: dict[str, Any] = {
        "request_id": f"r{index:02d}",
        "tenant": draw(st.sampled_from(names)),
        "gang": gang,
        "locations": tuple(dict.fromkeys(locations)),
        "priority": draw(st.integers(0, 2)),
    }
    tpu = gang.provider is Provider.TPU
    # A calendar block within Google's limits (domain.calendar: lead time, units per request).
    if draw(st.integers(0, 4)) == 0 and count_problem(tpu, gang.units) is None:
        submitted = NOW - seconds(draw, 0, 86_400)
        start = max(NOW + seconds(draw, -86_400, 10 * 86_400), submitted + lead_of(tpu).earliest)
        return CapacityRequest(
            mode=Mode.CALENDAR,
            run_duration=seconds(draw, 86_400, 4 * 86_400),
            start_at=start,
            submitted_at=submitted,
            **common,
        )
    return CapacityRequest(
        mode=Mode.FLEX_START,
        run_duration=seconds(draw, 600, 2 * 86_400),
        max_wait=seconds(draw, 60, 7 * 86_400),
        submitted_at=NOW - seconds(draw, 0, 4 * 3600) * draw(st.sampled_from([0, 1, 1, 1, 6])),
        **common,
    )


@st.composite
def grants_strategy(draw: st.DrawFn, pools: list[Pool], tenants: list[Tenant]) -> list[Grant]:
    """Grants a real system could hold: each is kept only if every limit still holds."""
    grants: list[Grant] = []
    base = Snapshot(pools=tuple(pools), tenants=tuple(tenants))
    for index in range(draw(st.integers(0, 10))):
        pool = draw(st.sampled_from(pools))
        per_vm = next(s[3] for s in SHAPES if s[1] == pool.accelerator) or 1
        units = draw(st.integers(1, 4))
        start = NOW + seconds(draw, -2 * 86_400, 5 * 86_400)
        end = start + seconds(draw, 600, 4 * 86_400)
        if end <= NOW:
            continue
        grant = Grant(
            request_id=f"g{index:02d}",
            tenant=draw(st.sampled_from(tenants)).name,
            pool_id=pool.pool_id,
            accelerator=pool.accelerator,
            units=units,
            accelerator_units=units * per_vm,
            start_at=start,
            end_at=end,
        )
        if not violations(replace(base, grants=(*grants, grant)), ()):
            grants.append(grant)
    return grants


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    tenants = draw(tenants_strategy())
    pools = draw(pools_strategy())
    grants = draw(grants_strategy(pools, tenants))
    names = [tenant.name for tenant in tenants]
    pending = [
        draw(request_strategy(index, names, pools)) for index in range(draw(st.integers(0, 14)))
    ]
    # Racing on or off: every property must hold with one lane per request and with several.
    policy = PolicySettings(
        race_width=draw(st.sampled_from([1, 2, 3])), race_eagerly=draw(st.booleans())
    )
    return Snapshot(
        pools=tuple(pools), tenants=tuple(tenants), grants=tuple(grants), pending=tuple(pending),
        policy=policy,
    )  # fmt: skip


# --- helpers ---------------------------------------------------------------------------------


def requests_by_id(snapshot: Snapshot) -> dict[str, CapacityRequest]:
    return {request.request_id: request for request in snapshot.pending}


def planned_grants(snapshot: Snapshot, plan: Plan) -> list[Grant]:
    """What the plan commits or holds: admissions, held slots and confirmed blocks."""
    requests = requests_by_id(snapshot)
    held = []
    for decision in plan.having(Outcome.ADMIT, Outcome.HOLD, Outcome.CONFIRM):
        assert decision.pool_id is not None
        assert decision.start_at is not None
        request = requests[decision.request_id]
        # A racing request holds a full grant in every pool it is offered to, to the slot's
        # end (a flex run's includes its pool's serve wait: Pool.serve_wait).
        for pool_id in (decision.pool_id, *decision.lanes):
            held.append(Grant.of(request, pool_id, decision.start_at, end_at=decision.end_at))
    return held


def applied(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """The snapshot after the reconciler carries out the plan's final decisions."""
    requests = requests_by_id(snapshot)
    new_grants = []
    for decision in plan.having(Outcome.ADMIT, Outcome.CONFIRM):
        assert decision.pool_id is not None
        assert decision.start_at is not None
        for pool_id in (decision.pool_id, *decision.lanes):
            request = requests[decision.request_id]
            # Held as the reconciler holds it: to the slot's end (hold_end with the serve wait).
            new_grants.append(Grant.of(request, pool_id, decision.start_at, end_at=decision.end_at))
    still_pending = tuple(
        request
        for request in snapshot.pending
        if plan.decision(request.request_id).outcome in (Outcome.HOLD, Outcome.WAIT)
    )
    return replace(snapshot, grants=(*snapshot.grants, *new_grants), pending=still_pending)


# --- properties ------------------------------------------------------------------------------


@given(snapshots())
def test_every_pending_request_gets_exactly_one_decision(snapshot: Snapshot) -> None:
    plan = admit(snapshot, NOW)
    assert [d.request_id for d in plan.decisions] == sorted(r.request_id for r in snapshot.pending)
    for decision in plan.decisions:
        if decision.outcome not in (Outcome.ADMIT, Outcome.CONFIRM):
            assert decision.reason is not None, decision


@given(snapshots())
def test_no_pool_tenant_or_cohort_limit_is_ever_exceeded(snapshot: Snapshot) -> None:
    plan = admit(snapshot, NOW)
    assert violations(snapshot, planned_grants(snapshot, plan)) == []


@given(snapshots())
def test_gangs_are_whole_in_one_allowed_pool_within_their_window(snapshot: Snapshot) -> None:
    plan = admit(snapshot, NOW)
    pools = {pool.pool_id: pool for pool in snapshot.pools}
    requests = requests_by_id(snapshot)
    for decision in plan.having(Outcome.ADMIT, Outcome.HOLD, Outcome.CONFIRM):
        request = requests[decision.request_id]
        assert decision.pool_id is not None
        assert decision.start_at is not None
        pool = pools[decision.pool_id]
        assert pool.serves(request)
        assert request.units <= pool.capacity
        # A flex slot holds the largest serve wait of the pools that serve it, then its run
        # (Pool.serve_wait); a block holds its window.
        wait = max(p.serve_wait for p in snapshot.pools if p.serves(request))
        if request.mode is Mode.CALENDAR:
            wait = timedelta(0)
        assert decision.end_at == decision.start_at + wait + request.run_duration
        if request.mode is Mode.CALENDAR:
            assert decision.start_at == request.start_at  # a block is never moved
            continue
        assert request.deadline is not None
        assert NOW <= decision.start_at <= request.deadline
        assert (decision.start_at == NOW) == (decision.outcome is Outcome.ADMIT)
        if pool.short_until is not None and pool.short_until > NOW:
            assert decision.start_at >= pool.short_until


@given(snapshots())
def test_racing_lanes_are_other_allowed_pools_of_an_admission_within_the_width(
    snapshot: Snapshot,
) -> None:
    """Extra lanes go only with an admission now, to distinct allowed pools other than the
    chosen one, never to a pool cooling down after a stockout, at most race_width in all."""
    plan = admit(snapshot, NOW)
    pools = {pool.pool_id: pool for pool in snapshot.pools}
    requests = requests_by_id(snapshot)
    for decision in plan.decisions:
        if not decision.lanes:
            continue
        assert decision.outcome is Outcome.ADMIT
        raced = (decision.pool_id, *decision.lanes)
        assert len(set(raced)) == len(raced) <= snapshot.policy.race_width
        for pool_id in decision.lanes:
            pool = pools[pool_id]
            assert pool.serves(requests[decision.request_id])
            assert pool.short_until is None or pool.short_until <= NOW


@given(snapshots())
def test_racing_never_delays_anyone(snapshot: Snapshot) -> None:
    """Lanes take only what the plan left free: every decision but the lanes themselves is
    the same with racing off."""
    raced = admit(snapshot, NOW)
    single = admit(replace(snapshot, policy=replace(snapshot.policy, race_width=1)), NOW)
    assert [replace(d, lanes=()) for d in raced.decisions] == list(single.decisions)


@given(snapshots(), st.randoms(use_true_random=False))
def test_the_plan_is_the_same_for_any_input_order(snapshot: Snapshot, rng: random.Random) -> None:
    def shuffled(items: tuple[T, ...]) -> tuple[T, ...]:
        copy = list(items)
        rng.shuffle(copy)
        return tuple(copy)

    # Shuffled in this order (keyword arguments are evaluated left to right).
    permuted = replace(
        snapshot,
        pools=shuffled(snapshot.pools),
        tenants=shuffled(snapshot.tenants),
        grants=shuffled(snapshot.grants),
        pending=shuffled(snapshot.pending),
    )
    assert admit(permuted, NOW).decisions == admit(snapshot, NOW).decisions


@given(snapshots())
def test_applying_a_plan_then_planning_again_admits_nothing_new(snapshot: Snapshot) -> None:
    first = admit(snapshot, NOW)
    after = applied(snapshot, first)
    assert not violations(after, ())
    second = admit(after, NOW)
    assert second.having(Outcome.ADMIT, Outcome.CONFIRM) == ()
    for decision in second.decisions:
        before = first.decision(decision.request_id)
        assert (decision.outcome, decision.start_at, decision.pool_id) == (
            before.outcome,
            before.start_at,
            before.pool_id,
        )


@given(snapshots(), st.data())
def test_an_eta_never_gets_later_when_a_request_behind_it_arrives(
    snapshot: Snapshot, data: st.DataObject
) -> None:
    before = admit(snapshot, NOW)
    tenant_names = [tenant.name for tenant in snapshot.tenants]
    newcomer = data.draw(
        request_strategy(99, tenant_names, list(snapshot.pools)).filter(
            lambda r: r.mode is Mode.FLEX_START
        )
    )
    lowest = min((request.priority for request in snapshot.pending), default=0)
    newcomer = replace(newcomer, priority=lowest - 1)  # behind everyone in policy order
    after = admit(replace(snapshot, pending=(*snapshot.pending, newcomer)), NOW)
    for old in before.having(Outcome.ADMIT, Outcome.HOLD):
        new = after.decision(old.request_id)
        assert new.outcome in (Outcome.ADMIT, Outcome.HOLD)
        assert new.start_at is not None
        assert old.start_at is not None
        assert new.start_at <= old.start_at


@given(snapshots())
def test_flex_work_never_changes_a_calendar_decision(snapshot: Snapshot) -> None:
    """Calendar blocks are taken off the timeline first: whatever flex work is pending, every
    block gets the decision it would get alone."""
    calendar_only = replace(
        snapshot, pending=tuple(r for r in snapshot.pending if r.mode is Mode.CALENDAR)
    )
    alone = admit(calendar_only, NOW)
    mixed = admit(snapshot, NOW)
    for decision in alone.decisions:
        assert mixed.decision(decision.request_id) == decision
