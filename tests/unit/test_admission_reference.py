"""The flex planner against a plain reference planner on busy random snapshots.

The reference follows the same rules (policy order, minute cells rounded outward, earliest start
in any allowed pool, preferred pool on ties, strict-FIFO floors, stockout cool-downs, quotas)
with none of the machinery that makes ``admit`` fast: plain lists, a full scan for every
request, no remembered facts. Many requests of repeated shapes share few pools, so every cache
in the real grid is exercised and any stale fact shows up as a different plan.
"""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from opendws.domain import CapacityRequest, Outcome, QueueingStrategy, Snapshot, admit
from opendws.domain.policy import flex_key
from opendws.domain.quotas import QuotaBook
from opendws.domain.timeline import ceil_cells, floor_cells
from tests.builders import (
    A3,
    DAY,
    H100,
    HOUR,
    MINUTE,
    NOW,
    REGION,
    flex,
    grant,
    pool,
    quota,
    snapshot,
    tenant,
)

ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f")

Placement = tuple[Outcome, str | None, timedelta | None]


def reference_plan(snap: Snapshot) -> dict[str, Placement]:
    """Flex decisions by brute force (the snapshot holds only valid flex requests)."""
    pools = sorted(snap.pools, key=lambda p: p.pool_id)
    book = QuotaBook(snap.tenants)
    requests = list(snap.pending)
    cells = 1 + max(
        floor_cells(r.submitted_at + (r.max_wait or timedelta(0)) - NOW)
        + ceil_cells(r.run_duration)
        for r in requests
    )
    free: dict[object, list[int]] = {p.pool_id: [p.capacity] * cells for p in pools}
    for request in requests:
        for limit in book.limits(request.tenant, request.gang.accelerator):
            free.setdefault(limit.key, [limit.amount] * cells)

    def commit(key: object, first: int, last: int, amount: int) -> None:
        if key in free:
            for cell in range(max(first, 0), min(last, cells)):
                free[key][cell] -= amount

    for g in snap.grants:
        first, last = floor_cells(g.start_at - NOW), ceil_cells(g.end_at - NOW)
        commit(g.pool_id, first, last, g.units)
        for limit in book.limits(g.tenant, g.accelerator):
            commit(limit.key, first, last, g.accelerator_units)

    strict = {t.name for t in snap.tenants if t.queueing is QueueingStrategy.STRICT_FIFO}
    order = sorted(
        requests,
        key=lambda r: flex_key(
            r, strict=r.tenant in strict, now=NOW, half_life=snap.policy.aging_half_life
        ),
    )
    floors: dict[str, int] = {}
    result: dict[str, Placement] = {}
    for request in order:
        length = ceil_cells(request.run_duration)
        last = floor_cells(request.submitted_at + (request.max_wait or timedelta(0)) - NOW)
        floor = floors.get(request.tenant, 0) if request.tenant in strict else 0
        limits = book.limits(request.tenant, request.gang.accelerator)
        needs = [(limit.key, request.accelerator_units) for limit in limits]
        allowed = sorted(
            (p for p in pools if p.serves(request)),
            key=lambda p: (request.preference(p.zone), p.pool_id),
        )
        if (
            not allowed
            or request.units > max(p.capacity for p in allowed)
            or request.accelerator_units > book.ceiling(request.tenant, request.gang.accelerator)
        ):
            result[request.request_id] = (Outcome.REJECT, None, None)
            continue
        best: tuple[int, str] | None = None
        for candidate in allowed:
            short = 0
            if candidate.short_until is not None and candidate.short_until > NOW:
                short = ceil_cells(candidate.short_until - NOW)
            all_needs = [(candidate.pool_id, request.units), *needs]
            run = 0
            for cell in range(max(floor, short), min(last + length, cells)):
                ok = all(free[key][cell] >= amount for key, amount in all_needs)
                run = run + 1 if ok else 0
                if run == length:
                    start = cell - length + 1
                    if best is None or start < best[0]:
                        best = (start, candidate.pool_id)
                    break
        if best is None:
            if request.tenant in strict:
                floors[request.tenant] = max(floor, last)
            result[request.request_id] = (Outcome.WAIT, None, None)
            continue
        start, pool_id = best
        commit(pool_id, start, start + length, request.units)
        for key, amount in needs:
            commit(key, start, start + length, amount)
        if request.tenant in strict:
            floors[request.tenant] = start
        outcome = Outcome.ADMIT if start == 0 else Outcome.HOLD
        result[request.request_id] = (outcome, pool_id, start * MINUTE)
    return result


def random_snapshot(seed: int) -> Snapshot:
    rng = random.Random(seed)
    pools = [
        pool(zone=zone, capacity=rng.choice([2, 4, 8]), short_until=None)
        for zone in ZONES[: rng.randint(1, 4)]
    ]
    if rng.random() < 0.3:
        pools[0] = pool(
            zone=pools[0].zone,
            capacity=pools[0].capacity,
            short_until=NOW + rng.randint(1, 300) * MINUTE + timedelta(seconds=rng.randint(0, 59)),
        )
    tenants = [
        tenant("a", quota(H100, rng.choice([32, 64, 128])), cohort="c"),
        tenant(
            "b",
            quota(H100, rng.choice([16, 64]), borrowing_limit=rng.choice([None, 8, 32])),
            cohort="c",
        ),
        tenant("s", quota(H100, rng.choice([24, 48])), strict_fifo=True),
    ]
    grants = []
    for index in range(rng.randint(0, 6)):
        start = NOW + timedelta(seconds=rng.randint(-3 * 3600, 6 * 3600))
        grants.append(
            grant(
                f"g{index}",
                tenant=rng.choice("abs"),
                pool_id=rng.choice(pools).pool_id,
                units=rng.randint(1, 2),
                start_at=start,
                end_at=max(start + 10 * MINUTE, NOW + rng.randint(1, 600) * MINUTE),
            )
        )
    lengths = [
        10 * MINUTE,
        45 * MINUTE,
        2 * HOUR,
        2 * HOUR + 30 * MINUTE,
        3 * HOUR + 7 * timedelta(seconds=1),
    ]
    pending: list[CapacityRequest] = []
    for index in range(rng.randint(20, 110)):
        zone = rng.choice(pools).zone
        max_wait = rng.choice([HOUR, 6 * HOUR, 12 * HOUR, DAY])
        waited = timedelta(seconds=rng.randint(0, int(min(4 * HOUR, max_wait).total_seconds())))
        pending.append(
            flex(
                f"r{index:02d}",
                tenant=rng.choice("aabs"),
                vm_count=rng.choice([1, 1, 2, 4]),
                run=rng.choice(lengths),
                max_wait=max_wait,
                submitted_at=NOW - waited,
                locations=rng.choice([(zone,), (REGION,), (zone, REGION)]),
                priority=rng.choice([0, 0, 0, 1]),
            )
        )
    return snapshot(pools=pools, tenants=tenants, grants=grants, pending=pending)


@pytest.mark.parametrize("seed", range(120))
def test_flex_plan_matches_the_reference(seed: int) -> None:
    snap = random_snapshot(seed)
    plan = admit(snap, NOW)
    actual = {
        d.request_id: (d.outcome, d.pool_id, None if d.start_at is None else d.start_at - NOW)
        for d in plan.decisions
    }
    assert actual == reference_plan(snap)
    assert {d.pool_id for d in plan.decisions if d.pool_id} <= {f"{z}/{A3}" for z in ZONES}
