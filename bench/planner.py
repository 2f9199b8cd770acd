"""Planner scaling: one admission pass over synthetic but realistic snapshots.

200 pools (40 zones × 5 shapes, GPU VMs and TPU chips), 20 tenants in 4 cohorts (two queue
strict FIFO), gang sizes 1..64 skewed small, flex run times 10 min .. 7 days log-uniform (median
about 5 h), a fifth of the load calendar blocks (pending and booked), and active grants of 20%
of the pending count. Times ``admit(snapshot, now)`` at 1,000, 10,000 and 100,000 pending
requests and prints the growth ratios; the snapshot is built outside the timing.

    python bench/planner.py            # all sizes, best of 3 (100k: best of 2)
    python bench/planner.py --quick    # 1k and 10k only (CI runs this to keep it working)
    python bench/planner.py --json     # ...and one JSON object as the last line

Targets (DESIGN.md): 10k pending ≤ 0.25 s, 100k ≤ 3 s, t(100k)/t(10k) ≤ 12.

Then the incremental planner (``opendws.domain.planner.incremental``) at each size: after its full
pass, the pass that follows one flex arrival, and the one that follows one release (a running
grant ends early), at the same instant: 15 of each in a row at 10k (5 at 100k), the last
checked equal to ``admit`` from scratch. A change costs what it reaches, and that depends on
where it lands in policy order (one near the front of a busy pool moves every slot behind it),
so the median (``arrival``, ``release``: the figures the targets judge), the 90th percentile
(``*_p90``) and the slowest (``*_max``) are reported. Targets: ≤ 10 ms at 10k pending,
≤ 50 ms at 100k. Also the pass a minute later, the last pass's admissions carried out and
nothing else changed (``minute``, the median of three; no target), the pass after the
store was read again with nothing changed (``unchanged``, the median of five: what every
pass pays whatever changed; no target), and passes 7 s apart within one minute, each after
the last one's admissions were carried out (``seconds``, the median of six, and
``seconds_full``, how many planned in full: in service every pass plans at its own now, so
this is what the clock alone costs a pass; no target).

The snapshots above hold no commitments. Under the default policy (ETAs told less than
``commit_within`` ahead are kept as commitments, held before the policy order) the pass after
one arrival is timed there too, with every slot the last pass held committed after each pass,
as the reconciler commits them (``commitments_s``: the median and slowest, and the share
planned in full; no target: it shows what a steady pass's plan costs with the default policy),
the pass after the store was read again with nothing changed (``unchanged``: what holding
the commitments costs every pass, whatever changed), and passes 7 s apart (``seconds``, each
after the last one's admissions were carried out and its held slots committed).

Last, the pass after one calendar block arrives (``calendar_s``: 9 in a row at 10k, 5 at 100k;
the median, the slowest and the share planned in full, the last checked against ``admit``;
no target): the block is decided in its place in calendar order and, confirmed, its booking
holds the flex grid; one that changes which of the pending blocks are confirmed plans in full.
The synthetic queue keeps about a fifth of its requests as blocks pending at once, far more
than a reconciler sees (it submits or refuses each in the pass after it was decided), so
such a pass is more often planned in full here than in service.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from opendws.domain import (
    CapacityRequest,
    GangShape,
    Grant,
    Mode,
    Outcome,
    Plan,
    PolicySettings,
    Pool,
    Provider,
    QueueingStrategy,
    Quota,
    Snapshot,
    Tenant,
    admit,
)
from opendws.domain.calendar import count_problem, lead_of
from opendws.domain.model import Commitment
from opendws.domain.planner.incremental.planner import IncrementalPlanner
from opendws.domain.policy import flex_key
from opendws.native import compiled

NOW = datetime(2026, 12, 1, tzinfo=UTC)
# Arrivals and releases timed one after another on one planner (fewer at 100k, where a pass
# can take seconds).
INCREMENTAL_CHANGES = 15
INCREMENTAL_CHANGES_100K = 5
COMMITTED_CHANGES = 9  # arrivals timed under commitments, each committed after its pass
UNCHANGED_PASSES = 5  # passes timed after the store was read again with nothing changed
CALENDAR_CHANGES = 9  # calendar arrivals timed one after another (fewer at 100k)
CALENDAR_CHANGES_100K = 5
# Passes timed seconds apart within one minute (as a reconciler's passes come, each at its
# own now), and how far apart.
SECONDS_PASSES = 6
SECONDS_APART = 7
SETTLE_PASSES = 8  # at most, before those: until a pass changes no decision
REGIONS = [
    "us-central1", "us-east1", "us-east4", "us-west1", "us-west4",
    "europe-west1", "europe-west4", "asia-east1", "asia-northeast1", "asia-southeast1",
]  # fmt: skip
ZONES = [f"{region}-{suffix}" for region in REGIONS for suffix in "abcd"]


# (shape, accelerator, provider, accelerators per VM or None for TPU, capacity range in units)
SHAPES = [
    ("a3-highgpu-8g", "nvidia-h100-80gb", Provider.MIG, 8, (16, 128)),
    ("a2-ultragpu-8g", "nvidia-a100-80gb", Provider.MIG, 8, (16, 128)),
    ("g2-standard-48", "nvidia-l4", Provider.MIG, 4, (32, 256)),
    ("tpu-v5e", "tpu-v5e", Provider.TPU, None, (256, 1024)),
    ("tpu-v5p", "tpu-v5p", Provider.TPU, None, (256, 1024)),
]
TOPOLOGIES = ["1x1", "2x2", "2x4", "4x4", "4x8", "8x8"]
TENANTS = 20
COHORTS = 4


def build_pools(rng: random.Random) -> list[Pool]:
    return [
        Pool(
            pool_id=f"{zone}/{shape}",
            zone=zone,
            shape=shape,
            accelerator=accelerator,
            provider=provider,
            capacity=rng.randint(*capacity),
        )
        for zone in ZONES
        for shape, accelerator, provider, _, capacity in SHAPES
    ]


def build_tenants(pools: list[Pool]) -> list[Tenant]:
    per_accelerator = Counter[str]()
    for pool in pools:
        per_unit = next(s[3] for s in SHAPES if s[1] == pool.accelerator) or 1
        per_accelerator[pool.accelerator] += pool.capacity * per_unit
    tenants = []
    for index in range(TENANTS):
        # Quota slightly above capacity overall: capacity, not quota, usually binds.
        quotas = tuple(
            Quota(
                accelerator=accelerator,
                nominal=int(total * 1.2 / TENANTS),
                borrowing_limit=None if index % 3 else int(total * 0.1),
            )
            for accelerator, total in sorted(per_accelerator.items())
        )
        tenants.append(
            Tenant(
                name=f"team-{index:02d}",
                quotas=quotas,
                cohort=f"cohort-{index % COHORTS}",
                queueing=QueueingStrategy.STRICT_FIFO
                if index in (7, 13)
                else QueueingStrategy.BEST_EFFORT,
            )
        )
    return tenants


def gang(
    rng: random.Random, shape: tuple[str, str, Provider, int | None, tuple[int, int]]
) -> GangShape:
    machine, accelerator, provider, per_vm, _ = shape
    if provider is Provider.TPU:
        return GangShape(
            vm_count=1,
            accelerator=accelerator,
            topology=TOPOLOGIES[min(5, int(rng.paretovariate(1.2)) - 1)],
        )
    vms = min(64, int(rng.paretovariate(1.1)))  # 1..64, mostly 1-4
    return GangShape(
        vm_count=vms, accelerator=accelerator, machine_type=machine, accelerators_per_vm=per_vm
    )


def log_uniform(rng: random.Random, low: timedelta, high: timedelta) -> timedelta:
    seconds = math.exp(rng.uniform(math.log(low.total_seconds()), math.log(high.total_seconds())))
    return timedelta(seconds=round(seconds))


def locations(rng: random.Random) -> tuple[str, ...]:
    region = rng.choice(REGIONS)
    if rng.random() < 0.6:
        return (region,)
    return tuple(rng.sample([f"{region}-{s}" for s in "abcd"], rng.randint(1, 2)))


def build_request(rng: random.Random, index: int) -> CapacityRequest:
    shape = rng.choice(SHAPES)
    tenant = f"team-{min(TENANTS - 1, int(rng.expovariate(1 / 5))):02d}"
    submitted = NOW - timedelta(seconds=rng.randint(0, 3 * 86400))
    shape_of = gang(rng, shape)
    common: dict[str, Any] = {
        "request_id": f"req-{index:06d}",
        "tenant": tenant,
        "gang": shape_of,
        "locations": locations(rng),
        "submitted_at": submitted,
        "priority": 1 if rng.random() < 0.05 else 0,
    }
    calendar = rng.random() < 0.2
    run_days = min(90, int(rng.paretovariate(1.0))) if calendar else 0
    start = NOW + timedelta(hours=rng.randint(1, 24 * 110)) if calendar else NOW
    tpu = shape_of.provider is Provider.TPU
    # Within Google's calendar-mode limits (domain.calendar): lead per kind, units per block.
    if calendar and count_problem(tpu, shape_of.units) is None:
        lead = lead_of(tpu)
        start = min(max(start, submitted + lead.earliest), submitted + lead.latest)
        return CapacityRequest(
            mode=Mode.CALENDAR, run_duration=timedelta(days=run_days), start_at=start, **common
        )
    return CapacityRequest(
        mode=Mode.FLEX_START,
        run_duration=log_uniform(rng, timedelta(minutes=10), timedelta(days=7)),
        max_wait=timedelta(days=7),
        **common,
    )


def build_grants(rng: random.Random, pools: list[Pool], count: int) -> list[Grant]:
    """Active flex grants started in the past and booked calendar blocks ahead (1 in 5), each
    placed only where its pool still has room, so the snapshot is one a real system could reach."""
    grants: list[Grant] = []
    used: dict[str, list[tuple[datetime, datetime, int]]] = {pool.pool_id: [] for pool in pools}
    attempts = 0
    while len(grants) < count and attempts < count * 4:
        attempts += 1
        pool = rng.choice(pools)
        shape = next(s for s in SHAPES if s[0] == pool.shape)
        request = build_request(rng, 900_000 + attempts)
        g = gang(rng, shape)
        units = g.units
        if rng.random() < 0.2:
            start = NOW + timedelta(hours=rng.randint(1, 24 * 100))
            end = start + timedelta(days=min(30, int(rng.paretovariate(1.2))))
        else:
            start = NOW - log_uniform(rng, timedelta(minutes=1), timedelta(days=2))
            end = max(
                NOW + timedelta(minutes=1),
                start + log_uniform(rng, timedelta(minutes=10), timedelta(days=7)),
            )
        overlapping = sum(u for s, e, u in used[pool.pool_id] if s < end and start < e)
        if overlapping + units > pool.capacity * 0.8:
            continue
        used[pool.pool_id].append((start, end, units))
        grants.append(
            Grant(
                request_id=f"grant-{len(grants):06d}",
                tenant=request.tenant,
                pool_id=pool.pool_id,
                accelerator=pool.accelerator,
                units=units,
                accelerator_units=g.accelerator_units,
                start_at=start,
                end_at=end,
            )
        )
    return grants


def build_snapshot(pending: int, seed: int = 7) -> Snapshot:
    rng = random.Random(seed)
    pools = build_pools(rng)
    tenants = build_tenants(pools)
    grants = build_grants(rng, pools, pending // 5)
    requests = [build_request(rng, index) for index in range(pending)]
    return Snapshot(
        pools=tuple(pools), tenants=tuple(tenants), grants=tuple(grants), pending=tuple(requests)
    )


def time_plan(snapshot: Snapshot, repeats: int) -> tuple[float, Counter[str]]:
    """Best wall time of ``repeats`` admission passes, and the outcomes of the last."""
    best = math.inf
    outcomes: Counter[str] = Counter()
    for _ in range(repeats):
        started = time.perf_counter()
        plan = admit(snapshot, NOW)
        best = min(best, time.perf_counter() - started)
        outcomes = Counter(decision.outcome.value for decision in plan.decisions)
    return best, outcomes


def time_baseline(snapshot: Snapshot, repeats: int) -> float:
    """Best wall time to sort the pending requests by the policy key: a pure-Python pass over
    the same requests, measured in the same run, that calibrates for the machine's speed."""
    half_life = snapshot.policy.aging_half_life
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        sorted(
            snapshot.pending,
            key=lambda r: flex_key(r, strict=False, now=NOW, half_life=half_life),
        )
        best = min(best, time.perf_counter() - started)
    return best


def carried_out(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """``snapshot`` after the reconciler carried out ``plan``'s admissions: each admitted
    request left the queue, and its run holds a grant from now."""
    admitted = {decision.request_id: decision for decision in plan.admissions}
    grants = [
        Grant.of(request, admitted[request.request_id].pool_id or "", plan.now)
        for request in snapshot.pending
        if request.request_id in admitted
    ]
    pending = tuple(r for r in snapshot.pending if r.request_id not in admitted)
    return replace(snapshot, pending=pending, grants=(*snapshot.grants, *grants))


def flex_arrival(rng: random.Random, index: int) -> CapacityRequest:
    """A new flex request, numbered ``index`` (calendar ones drawn are drawn again)."""
    request = build_request(rng, index)
    while request.mode is not Mode.FLEX_START:
        request = build_request(rng, index)
    return request


def time_incremental(snapshot: Snapshot, changes: int) -> dict[str, float]:
    """Seconds of an incremental pass after one flex arrival and after one release, ``changes``
    of each in a row on one planner (median, 90th percentile and slowest: how far a change
    reaches varies with where it lands in policy order), and the median after the clock moved
    a minute (the queue without pending calendar blocks), three in a row; the last of each
    kind is checked against ``admit``."""
    planner = IncrementalPlanner()
    planner.plan(snapshot, NOW)
    gc.collect()
    gc.freeze()  # the planner's state is long-lived, like the snapshot
    rng = random.Random(11)
    timings: dict[str, list[float]] = {"arrival": [], "release": []}
    current = snapshot
    for index in range(changes):
        current = replace(current, pending=(*current.pending, flex_arrival(rng, 800_000 + index)))
        started = time.perf_counter()
        plan = planner.plan(current, NOW)
        timings["arrival"].append(time.perf_counter() - started)
        assert not planner.last_pass.full, planner.last_pass
    assert plan == admit(current, NOW), "incremental plan after arrivals differs"
    running = sorted(
        (grant for grant in current.grants if grant.start_at < NOW), key=lambda g: g.request_id
    )
    for grant in running[:changes]:
        current = replace(current, grants=tuple(g for g in current.grants if g is not grant))
        started = time.perf_counter()
        plan = planner.plan(current, NOW)
        timings["release"].append(time.perf_counter() - started)
        assert not planner.last_pass.full, planner.last_pass
    assert plan == admit(current, NOW), "incremental plan after releases differs"
    timings["unchanged"], current = time_unchanged(planner, current)
    # The clock moving: one minute, three times, each pass after the reconciler carried out
    # the last one's admissions (they became grants), and nothing else changed. Pending
    # calendar blocks are booked or refused in the pass that sees them (they leave the
    # queue), and a pending one makes a later pass plan in full, so they are left out here.
    flex_only = tuple(r for r in current.pending if r.mode is Mode.FLEX_START)
    current = carried_out(replace(current, pending=flex_only), admit(current, NOW))
    now = NOW
    plan = planner.plan(current, now)
    timings["minute"] = []
    timings["minute_full"] = []
    for _ in range(3):
        # The pass a minute later sees the last one's admissions carried out, as in service.
        current = carried_out(current, plan)
        now += timedelta(minutes=1)
        started = time.perf_counter()
        plan = planner.plan(current, now)
        timings["minute"].append(time.perf_counter() - started)
        # The admissions' grants may make a row bind that the grid never tracked: that pass
        # plans in full, as it must; how many did is reported.
        timings["minute_full"].append(float(planner.last_pass.full))
    assert plan == admit(current, now), "incremental plan after the clock moved differs"
    timings["seconds"], seconds_full = time_seconds_later(planner, current, plan, now)
    gc.unfreeze()
    figures = {kind: statistics.median(values) for kind, values in timings.items()}
    figures["minute_full"] = sum(timings["minute_full"])  # passes of the three planned in full
    figures["seconds_full"] = seconds_full  # of the passes seconds apart
    for kind in ("arrival", "release"):
        # Inclusive: interpolated between the timings themselves, never past the slowest
        # (the default method extrapolates beyond it for a handful of values).
        figures[f"{kind}_p90"] = statistics.quantiles(timings[kind], n=10, method="inclusive")[-1]
        figures[f"{kind}_max"] = max(timings[kind])
    return figures


def time_seconds_later(
    planner: IncrementalPlanner,
    current: Snapshot,
    plan: Plan,
    now: datetime,
    *,
    committing: bool = False,
) -> tuple[list[float], int]:
    """Seconds of ``SECONDS_PASSES`` passes ``SECONDS_APART`` seconds apart within the minute
    of ``now`` (a whole minute; ``plan``: the last pass's, at ``now``), each after the last
    one's admissions were carried out (and, ``committing``, its held slots committed), and
    nothing else changed: what the clock alone costs a pass in service, where each pass
    plans at its own now; and how many were planned in full (an admission's grant may make
    a row bind that the grid never tracked). Before them, passes at ``now`` carry out the
    last one (and commit its slots) until one changes no decision, as a reconciler's
    passes settle. The last is checked against ``admit``."""
    for _ in range(SETTLE_PASSES):
        if planner.changed is not None and not planner.changed:
            break
        current = carried_out(current, plan)
        if committing:
            current = commit_held(current, plan)
        plan = planner.plan(current, now)
    timings: list[float] = []
    full = 0
    for _ in range(SECONDS_PASSES):
        current = carried_out(current, plan)
        if committing:
            current = commit_held(current, plan)
        now += timedelta(seconds=SECONDS_APART)
        started = time.perf_counter()
        plan = planner.plan(current, now)
        timings.append(time.perf_counter() - started)
        full += planner.last_pass.full
    assert plan == admit(current, now), "plan seconds later differs"
    return timings, full


def time_unchanged(
    planner: IncrementalPlanner, current: Snapshot, *, committing: bool = False
) -> tuple[list[float], Snapshot]:
    """Seconds of ``UNCHANGED_PASSES`` passes after the store was read again and nothing
    changed: new tuples of the same objects, as the reconciler's mirror hands them over after
    a refresh (what every pass pays whatever changed); ``committing``: each pass's held slots
    committed again as they were. The last is checked against ``admit``; also returns the
    snapshot last planned."""
    timings: list[float] = []
    plan = None
    for _ in range(UNCHANGED_PASSES):
        current = replace(
            current,
            pending=(*current.pending,),
            grants=(*current.grants,),
            commitments=(*current.commitments,),
        )
        started = time.perf_counter()
        plan = planner.plan(current, NOW)
        timings.append(time.perf_counter() - started)
        assert not planner.last_pass.full, planner.last_pass
        assert planner.last_pass.walked == 0, planner.last_pass
        if committing:
            current = commit_held(current, plan)
    assert plan == admit(current, NOW), "plan after the store was read again differs"
    return timings, current


def time_with_commitments(snapshot: Snapshot, changes: int) -> dict[str, float]:
    """Seconds of the pass after one flex arrival under the default commitment horizon
    (``PolicySettings().commit_within``): after every pass, each slot it holds is committed
    as the reconciler commits them (a commitment object kept while its slot is the same, so
    those within the horizon are held before the policy order by the next pass). ``changes``
    arrivals in a row on one planner (median and slowest), the last checked against
    ``admit``; ``full``: the share planned in full; ``unchanged``: the median pass after
    the store was read again with nothing changed (new tuples of the same objects), what
    holding the commitments costs every pass."""
    horizon = PolicySettings().commit_within
    assert horizon is not None, "the default policy holds no commitments"
    current = replace(snapshot, policy=replace(snapshot.policy, commit_within=horizon))
    planner = IncrementalPlanner()
    current = commit_held(current, planner.plan(current, NOW))
    current = commit_held(current, planner.plan(current, NOW))
    held = sum(c.start_at < NOW + horizon for c in current.commitments)
    gc.collect()
    gc.freeze()
    rng = random.Random(13)
    timings: list[float] = []
    full = 0
    for index in range(changes):
        current = replace(current, pending=(*current.pending, flex_arrival(rng, 900_000 + index)))
        started = time.perf_counter()
        plan = planner.plan(current, NOW)
        timings.append(time.perf_counter() - started)
        full += planner.last_pass.full
        if index == changes - 1:
            assert plan == admit(current, NOW), "plan over commitments differs"
        current = commit_held(current, plan)
    # The last arrival's slots committed, once (that pass moves what they promise).
    current = commit_held(current, planner.plan(current, NOW))
    unchanged, current = time_unchanged(planner, current, committing=True)
    # Seconds apart, from a queue as the reconciler leaves it (see time_incremental).
    flex_only = tuple(r for r in current.pending if r.mode is Mode.FLEX_START)
    current = carried_out(replace(current, pending=flex_only), admit(current, NOW))
    now = NOW + timedelta(minutes=5)
    current = commit_held(current, planner.plan(current, now))
    seconds, seconds_full = time_seconds_later(
        planner, current, planner.plan(current, now), now, committing=True
    )
    gc.unfreeze()
    return {
        "arrival": statistics.median(timings),
        "unchanged": statistics.median(unchanged),
        "seconds": statistics.median(seconds),
        "seconds_full": seconds_full,
        "arrival_max": max(timings),
        "full": full / changes,
        "commitments": float(held),
    }


def calendar_arrival(rng: random.Random, index: int) -> CapacityRequest:
    """A calendar request drawn as the synthetic load draws its blocks (and within Google's
    limits, see build_request)."""
    while True:
        request = build_request(rng, index)
        if request.mode is Mode.CALENDAR:
            return request


def time_calendar(snapshot: Snapshot, changes: int) -> dict[str, float]:
    """Seconds of the pass after one calendar block arrives, ``changes`` in a row on one
    planner (median and slowest), the last checked against ``admit``; ``full``: the share
    planned in full (a block that changes which pending blocks are confirmed)."""
    planner = IncrementalPlanner()
    planner.plan(snapshot, NOW)
    gc.collect()
    gc.freeze()
    rng = random.Random(17)
    current = snapshot
    timings: list[float] = []
    full = 0
    for index in range(changes):
        current = replace(
            current, pending=(*current.pending, calendar_arrival(rng, 700_000 + index))
        )
        started = time.perf_counter()
        plan = planner.plan(current, NOW)
        timings.append(time.perf_counter() - started)
        full += planner.last_pass.full
    assert plan == admit(current, NOW), "plan after calendar arrivals differs"
    gc.unfreeze()
    return {
        "arrival": statistics.median(timings),
        "arrival_max": max(timings),
        "full": full / changes,
    }


def commit_held(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """``snapshot`` with every slot ``plan`` holds committed, as the reconciler commits them:
    the commitment it had is kept while its slot is the same."""
    before = {commitment.request_id: commitment for commitment in snapshot.commitments}
    told = []
    for decision in plan.decisions:
        if decision.outcome is not Outcome.HOLD or not decision.pool_id or not decision.start_at:
            continue
        kept = before.get(decision.request_id)
        if kept is None or (kept.pool_id, kept.start_at) != (decision.pool_id, decision.start_at):
            kept = Commitment(
                request_id=decision.request_id,
                pool_id=decision.pool_id,
                start_at=decision.start_at,
            )
        told.append(kept)
    return replace(snapshot, commitments=tuple(told))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1k and 10k only")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args()
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    kind = "compiled (mypyc)" if all(compiled().values()) else "plain Python"
    print(f"planner: {kind}", flush=True)
    seconds: dict[int, float] = {}
    baseline: dict[int, float] = {}
    for size in sizes:
        snapshot = build_snapshot(size)
        # The snapshot is long-lived input, as in the reconciler: keep the collector from
        # re-scanning its objects on every collection during the timed pass.
        gc.collect()
        gc.freeze()
        repeats = 2 if size >= 100_000 else 3
        seconds[size], outcomes = time_plan(snapshot, repeats)
        baseline[size] = time_baseline(snapshot, repeats)
        summary = ", ".join(f"{key.lower()} {value}" for key, value in sorted(outcomes.items()))
        print(
            f"{size:>7,} pending + {len(snapshot.grants):>6,} grants: {seconds[size]:7.3f} s"
            f" = {seconds[size] / baseline[size]:5.1f}x sorting the queue"
            f" ({baseline[size]:.3f} s)  [{summary}]",
            flush=True,
        )
    for small, large in itertools.pairwise(sizes):
        print(f"growth {small:,} -> {large:,}: {seconds[large] / seconds[small]:.2f}x")
    verdicts = [f"10k: {seconds[10_000]:.3f} s (target 0.25 s)"]
    if 100_000 in seconds:
        verdicts.append(f"100k: {seconds[100_000]:.3f} s (target 3 s)")
        verdicts.append(f"t(100k)/t(10k): {seconds[100_000] / seconds[10_000]:.2f} (target 12)")
    print("; ".join(verdicts))
    incremental: dict[int, dict[str, float]] = {}
    for size in sizes:
        if size < 10_000:
            continue
        changes = INCREMENTAL_CHANGES if size <= 10_000 else INCREMENTAL_CHANGES_100K
        figures = incremental[size] = time_incremental(build_snapshot(size), changes)
        target = 0.010 if size <= 10_000 else 0.050
        print(
            f"incremental {size:>7,} (target {target * 1000:.0f} ms; median, p90, slowest of"
            f" {changes}): after one arrival {figures['arrival'] * 1000:.1f},"
            f" {figures['arrival_p90'] * 1000:.1f}, {figures['arrival_max'] * 1000:.1f} ms;"
            f" after one release {figures['release'] * 1000:.1f},"
            f" {figures['release_p90'] * 1000:.1f}, {figures['release_max'] * 1000:.1f} ms;"
            f" a minute later {figures['minute'] * 1000:.1f} ms"
            f" ({figures['minute_full']:.0f} of 3 planned in full);"
            f" nothing changed {figures['unchanged'] * 1000:.2f} ms;"
            f" {SECONDS_APART} s later {figures['seconds'] * 1000:.2f} ms"
            f" ({figures['seconds_full']:.0f} of {SECONDS_PASSES} planned in full)",
            flush=True,
        )
    committed: dict[int, dict[str, float]] = {}
    for size in sizes:
        if size < 10_000:
            continue
        figures = committed[size] = time_with_commitments(build_snapshot(size), COMMITTED_CHANGES)
        print(
            f"with commitments {size:>7,} ({figures['commitments']:,.0f} slots within the"
            f" default horizon committed): after one arrival {figures['arrival'] * 1000:.1f} ms"
            f" (slowest of {COMMITTED_CHANGES} {figures['arrival_max'] * 1000:.1f} ms;"
            f" {figures['full']:.0%} planned in full); nothing changed"
            f" {figures['unchanged'] * 1000:.1f} ms; {SECONDS_APART} s later"
            f" {figures['seconds'] * 1000:.1f} ms ({figures['seconds_full']:.0f} of"
            f" {SECONDS_PASSES} planned in full)",
            flush=True,
        )
    calendars: dict[int, dict[str, float]] = {}
    for size in sizes:
        if size < 10_000:
            continue
        changes = CALENDAR_CHANGES if size <= 10_000 else CALENDAR_CHANGES_100K
        figures = calendars[size] = time_calendar(build_snapshot(size), changes)
        print(
            f"calendar {size:>7,}: after one block arrives {figures['arrival'] * 1000:.1f} ms"
            f" (slowest of {changes} {figures['arrival_max'] * 1000:.1f} ms;"
            f" {figures['full']:.0%} planned in full)",
            flush=True,
        )
    if args.json:
        result = {
            # The planner's modules as they ran: compiled with mypyc, or plain Python (setup.py).
            "planner_compiled": all(compiled().values()),
            "plan_seconds": {str(size): round(value, 4) for size, value in seconds.items()},
            "baseline_sort_seconds": {
                str(size): round(value, 4) for size, value in baseline.items()
            },
            "growth_10k_to_100k": (
                round(seconds[100_000] / seconds[10_000], 3) if 100_000 in seconds else None
            ),
            "incremental_s": {
                str(size): {kind: round(value, 4) for kind, value in timings.items()}
                for size, timings in incremental.items()
            },
            "commitments_s": {
                str(size): {kind: round(value, 4) for kind, value in figures.items()}
                for size, figures in committed.items()
            },
            "calendar_s": {
                str(size): {kind: round(value, 4) for kind, value in figures.items()}
                for size, figures in calendars.items()
            },
        }
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
