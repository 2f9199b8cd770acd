"""Obtaining scarce capacity: how soon a gang runs, how many give up, and what racing wastes —
the old one-zone-at-a-time with a 15-minute cancel, waiting in one zone, and racing K zones.

The world: the simulated cloud (``opendws.sim.SimulatedCloud``, Google's behaviour: a resize
request short of stock stays ACCEPTED, with ZONE_RESOURCE_POOL_EXHAUSTED in its last attempt,
and is served first come first served as stock frees) served by the Compute emulator to the
real providers (``opendws.bootstrap.capacity_providers``: MigFlexProvider on the real
google-cloud-compute clients over HTTP). Three zones of a3-highgpu-8g whose free stock is moved
by seeded stock processes (other customers; different bounds, steps and seeds per zone). The
pools' configured capacity and the tenant's quota are ample: Google's stock, not the
organisation's budget, is what binds. The reconciler is the real ``ReconcileService`` over
in-memory stores, on the cloud's own frozen clock, which the driver moves: a pass every
simulated minute and one after each arrival. Runs end by themselves (the cloud deletes
flex-start VMs at their requested run duration; the next pass sees them ENDED).

The stream (seeded, the same for every strategy): arrivals over 2 simulated days, a Poisson
process whose mean rate (1.5 an hour) follows a day — rising from the start, 1.8× at its peak
6 h in, 0.2× at its trough 18 h in — so demand exceeds what other customers free at the peaks
and not in the troughs; each request 1–4 VMs for 1–6 h (half-hour steps), max_wait 8 h,
allowed in all three zones; its preferred zone order rotates from one request to the next
(request i prefers zone i mod 3, then the next two), or with ``--fixed-order`` every request
prefers a, b, c.

The stock (``STOCK``): per zone, a seeded walk of the free units (``set_stock_process``) —
a: 0..10, ±2 every 15 min; b: 0..8, ±2 every 20 min; c: 0..6, ±1 every 30 min — each off the
minute by a few seconds, so Google serves between passes as it would. Units our VMs hold are
not free; returned, they go to the next waiting request first. The calendar provider is left
out (the stream has no calendar blocks; observing future reservations would double a pass's
HTTP calls for nothing); the MIG provider is the real one.

Strategies (one run each, on the same stream and the same stock walk):

- ``sequential_15m``: race_width 1, ReconcileSettings.give_up_after 15 min — the old
  one-zone-at-a-time: an order Google has not served after 15 min is cancelled, its pool
  marked short for 10 min, and the request goes back in line for its next zone;
- ``wait_one_zone``: race_width 1, no give-up: the order waits in Google's queue until max_wait;
- ``race_k2``, ``race_k3``: lazy racing (the default behaviour): a request whose orders all
  wait in pools Google reported short is offered to more of its pools, up to K in all;
- ``race_k2_eager``: K = 2, raced at admission already (``race_eagerly``).

Measured per strategy: over the requests that became ACTIVE, the time from admission (the
first PENDING → PROVISIONING) to ACTIVE — mean, p50, p95 in seconds — and, for context, from
submission to ACTIVE (admission itself waits while every allowed pool is marked short, and a
request kept PENDING holds no place in Google's queue, so the two can rank strategies
differently); the requests that TIMED_OUT; and the gang-minutes wasted by double wins. A
double win is an order that Google served beside its race's winner (``PassReport.double_wins``);
its VMs are released in the pass that sees it. Waste is measured on the simulated cloud: for
each such order, every VM's lifetime from its creation (``creationTimestamp``: the moment Google
served the order, between passes) to its deletion (the pass that released it), in VM-minutes —
what Google bills for nothing. Each figure is shown with its ratio to ``wait_one_zone``.
Strategies run in parallel processes (``--workers``), each with its own emulator.

    python bench/obtain.py                 # 2 days, 89 requests: about 4 min
    python bench/obtain.py --quick         # 3 h of arrivals, max_wait 90 min (CI)
    python bench/obtain.py --json          # ...and one JSON object as the last line
    python bench/obtain.py --seed 7        # another stream and stock walk
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opendws.adapters.memory import (  # noqa: E402
    MemoryConfigStore,
    MemoryEventBus,
    MemoryRequestStore,
)
from opendws.domain.model import (  # noqa: E402
    CapacityRequest,
    GangShape,
    Mode,
    PolicySettings,
    Pool,
    Provider,
    Quota,
    Tenant,
)
from opendws.domain.states import RequestState  # noqa: E402
from opendws.ports import (  # noqa: E402
    Advised,
    Configuration,
    Observed,
    Order,
    Providers,
    Withdrawal,
    accepted,
)
from opendws.service.reconcile import ReconcileService, ReconcileSettings  # noqa: E402

S = RequestState
START = datetime(2026, 12, 1, tzinfo=UTC)
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c")
MACHINE_TYPE = "a3-highgpu-8g"
ACCELERATOR = "nvidia-h100-80gb"
PER_VM = 8
TENANT = "research"
PROJECT = "bench-obtain"
PASS_EVERY = timedelta(minutes=1)
LATENCY = timedelta(seconds=20)
MAX_WAIT = timedelta(hours=8)
BUDGET = 1_000  # VMs per pool: the organisation's budget never binds here
# Other customers, per zone: (phase, initial free, low, high, step, every). Different bounds,
# steps and paces; each walk is seeded by --seed and the zone. The phase (seconds past the
# minute) keeps Google's serving off the passes' minute marks, as on the real cloud.
STOCK = {
    "us-central1-a": (7, 4, 0, 10, 2, timedelta(minutes=15)),
    "us-central1-b": (23, 2, 0, 8, 2, timedelta(minutes=20)),
    "us-central1-c": (41, 1, 0, 6, 1, timedelta(minutes=30)),
}
STREAM_START = START + timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class Load:
    """A stream's size: arrivals over ``days`` at ``per_hour`` on average, each waiting at most
    ``max_wait``."""

    days: float
    per_hour: float
    max_wait: timedelta


FULL = Load(days=2.0, per_hour=1.5, max_wait=MAX_WAIT)
QUICK = Load(days=1 / 8, per_hour=2.0, max_wait=timedelta(minutes=90))


@dataclass(frozen=True, slots=True)
class Strategy:
    name: str
    race_width: int
    give_up_after: timedelta | None = None
    race_eagerly: bool = False

    def policy(self) -> PolicySettings:
        return PolicySettings(race_width=self.race_width, race_eagerly=self.race_eagerly)

    def settings(self) -> ReconcileSettings:
        return ReconcileSettings(give_up_after=self.give_up_after)


STRATEGIES = (
    Strategy("sequential_15m", 1, give_up_after=timedelta(minutes=15)),
    Strategy("wait_one_zone", 1),
    Strategy("race_k2", 2),
    Strategy("race_k3", 3),
    Strategy("race_k2_eager", 2, race_eagerly=True),
)
BASELINE = "wait_one_zone"


# The stream -----------------------------------------------------------------------------------


def stream(
    seed: int, days: float, per_hour: float, *, rotate: bool = True, max_wait: timedelta = MAX_WAIT
) -> list[CapacityRequest]:
    """Seeded arrivals over ``days`` from STREAM_START (thinned Poisson, rate ``per_hour`` ×
    (1 + 0.8 sin) over a day, peak 6 h in), 1–4 VMs, 1–6 h in half-hour steps, waiting at
    most ``max_wait``, all three zones (preferred order rotating unless not ``rotate``)."""
    rng = random.Random(f"obtain-stream/{seed}")
    end = STREAM_START + timedelta(days=days)
    peak = per_hour * 1.8
    at = STREAM_START
    requests: list[CapacityRequest] = []
    while True:
        at += timedelta(hours=rng.expovariate(peak))
        if at >= end:
            return requests
        hour = (at - STREAM_START).total_seconds() / 3600
        if rng.random() > (1 + 0.8 * math.sin(2 * math.pi * hour / 24)) / 1.8:
            continue  # thinned: the rate follows the day
        index = len(requests)
        first = index % len(ZONES) if rotate else 0
        requests.append(
            CapacityRequest(
                request_id=f"req-{index:04d}",
                tenant=TENANT,
                mode=Mode.FLEX_START,
                gang=GangShape(
                    vm_count=rng.randint(1, 4),
                    machine_type=MACHINE_TYPE,
                    accelerator=ACCELERATOR,
                    accelerators_per_vm=PER_VM,
                ),
                locations=ZONES[first:] + ZONES[:first],
                run_duration=timedelta(minutes=30 * rng.randint(2, 12)),
                submitted_at=at.replace(microsecond=0),
                max_wait=max_wait,
            )
        )


def configuration(strategy: Strategy, requests: Sequence[CapacityRequest]) -> Configuration:
    pools = tuple(
        Pool(
            pool_id=f"{zone}/{MACHINE_TYPE}",
            zone=zone,
            shape=MACHINE_TYPE,
            accelerator=ACCELERATOR,
            provider=Provider.MIG,
            capacity=BUDGET,
        )
        for zone in ZONES
    )
    quota = Quota(accelerator=ACCELERATOR, nominal=BUDGET * len(ZONES) * PER_VM)
    return Configuration(
        pools=pools, tenants=(Tenant(name=TENANT, quotas=(quota,)),), policy=strategy.policy()
    )


# One strategy's run ---------------------------------------------------------------------------


@dataclass
class Outcome:
    """One strategy's figures (seconds, counts, VM-minutes)."""

    name: str
    admission_to_active: list[float] = field(default_factory=list)
    submit_to_active: list[float] = field(default_factory=list)
    timed_out: int = 0
    double_wins: int = 0
    wasted_gang_minutes: float = 0.0
    leaks: int = 0
    passes: int = 0
    wall_s: float = 0.0

    def figures(self) -> dict[str, Any]:
        """The JSON figures: admission → ACTIVE, timed out, wasted gang-minutes."""
        return {
            **summary(self.admission_to_active),
            "timed_out": self.timed_out,
            "wasted_gang_minutes": round(self.wasted_gang_minutes, 1),
        }

    def submit_figures(self) -> dict[str, float | None]:
        """Submission → ACTIVE, for context."""
        return summary(self.submit_to_active)


def summary(waits: Sequence[float]) -> dict[str, float | None]:
    """Mean, p50 and p95 of ``waits`` (None when there are none)."""
    if not waits:
        return {"mean_s": None, "p50_s": None, "p95_s": None}
    return {
        "mean_s": round(statistics.fmean(waits), 1),
        "p50_s": round(percentile(waits, 50), 1),
        "p95_s": round(percentile(waits, 95), 1),
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile, linear between closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def run_strategy(strategy: Strategy, requests: Sequence[CapacityRequest], seed: int) -> Outcome:
    """Drive one strategy over ``requests`` on its own simulated cloud and emulator."""
    from emulators import ComputeEmulator
    from opendws.bootstrap import capacity_providers
    from opendws.clock import ManualClock
    from opendws.sim import SimulatedCloud

    started = time.perf_counter()
    clock = ManualClock(START)
    # Simulated time on a frozen clock: operations are DONE at once (what is compared is how
    # the strategies obtain capacity, not how long Compute's operations take).
    cloud = SimulatedCloud(clock, provisioning_latency=LATENCY, operation_latency=timedelta(0))
    for zone, (phase, initial, low, high, step, every) in STOCK.items():
        cloud.advance(START + timedelta(seconds=phase) - clock.now())
        cloud.set_stock(zone, MACHINE_TYPE, initial)
        cloud.set_stock_process(
            zone, MACHINE_TYPE, low=low, high=high, step=step, every=every, seed=seed
        )
    outcome = Outcome(strategy.name)
    with ComputeEmulator(cloud) as emulator:
        store = MemoryRequestStore()
        bus = MemoryEventBus()
        real = capacity_providers(PROJECT, endpoint=emulator.endpoint)
        providers = Providers(mig_flex=real.mig_flex, tpu=real.tpu, calendar=NoCalendar())
        reconciler = ReconcileService(
            store, MemoryConfigStore(configuration(strategy, requests)), providers, bus, clock,
            holder="bench-obtain", settings=strategy.settings(),
        )  # fmt: skip
        arrivals = sorted(requests, key=lambda r: (r.submitted_at, r.request_id))
        cursor = 0
        born: dict[str, datetime] = {}  # VM name → creation, as the cloud reports it
        doomed: dict[str, datetime] = {}  # VMs of double wins, until the cloud deleted them
        live = 0
        tick = STREAM_START
        while cursor < len(arrivals) or live:
            arrival = arrivals[cursor].submitted_at if cursor < len(arrivals) else None
            moment = min(tick, arrival) if arrival is not None else tick
            cloud.advance(moment - clock.now())
            while cursor < len(arrivals) and arrivals[cursor].submitted_at <= moment:
                record, event = accepted(arrivals[cursor], arrivals[cursor].submitted_at)
                store.create(record, event)
                store.mark_announced(record.request_id, 1)
                cursor += 1
                live += 1
            if moment == tick:
                tick += PASS_EVERY
            born.update(_vms(cloud))
            report = reconciler.run_pass()
            outcome.passes += 1
            outcome.leaks += len(report.leaks)
            for order in report.double_wins:
                outcome.double_wins += 1
                prefix = f"{order}-"
                doomed.update({vm: at for vm, at in born.items() if vm.startswith(prefix)})
            if doomed:
                alive = _vms(cloud)
                for vm in [vm for vm in doomed if vm not in alive]:
                    lived = clock.now() - doomed.pop(vm)
                    outcome.wasted_gang_minutes += lived.total_seconds() / 60
            live = len(store.in_states(S.PENDING, S.PROVISIONING))
    _account(outcome, bus.published, {r.request_id: r for r in requests})
    outcome.wall_s = time.perf_counter() - started
    return outcome


class NoCalendar:
    """The calendar provider, left out: the stream has no calendar blocks, and observing
    future reservations in every zone would double the HTTP calls of a pass for nothing."""

    def observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        return {}

    def reserve(self, order: Order) -> None:
        raise AssertionError("no calendar block in this benchmark")

    provision = reserve

    def release(self, name: str, pool: Pool) -> None:
        raise AssertionError("no calendar block in this benchmark")

    def advise(
        self, request: CapacityRequest, pools: Sequence[Pool], *, earliest: datetime,
        latest: datetime,
    ) -> tuple[Advised, ...]:  # fmt: skip
        raise AssertionError("no calendar block in this benchmark")

    def withdraw(self, name: str, pool: Pool) -> Withdrawal:
        raise AssertionError("no calendar block in this benchmark")


def _vms(cloud: Any) -> dict[str, datetime]:
    """Every VM of the project now, with its creation time."""
    return {
        vm["name"]: datetime.fromisoformat(vm["creationTimestamp"])
        for zone in ZONES
        for vm in cloud.list_instances(PROJECT, zone)
    }


def _account(outcome: Outcome, events: Sequence[Any], requests: dict[str, CapacityRequest]) -> None:
    admitted: dict[str, datetime] = {}
    for event in events:
        request_id = event.request_id
        if event.state is S.PROVISIONING and event.previous_state is S.PENDING:
            admitted.setdefault(request_id, event.at)
        elif event.state is S.ACTIVE and event.previous_state is S.PROVISIONING:
            outcome.admission_to_active.append((event.at - admitted[request_id]).total_seconds())
            submitted = requests[request_id].submitted_at
            outcome.submit_to_active.append((event.at - submitted).total_seconds())
        elif event.state is S.TIMED_OUT:
            outcome.timed_out += 1


# The report -----------------------------------------------------------------------------------


def ratio(value: float | None, baseline: float | None) -> str:
    """``value`` against ``baseline`` as "0.58x"; "-" where it has no meaning."""
    if value is None or baseline is None or baseline == 0:
        return "-"
    return f"{value / baseline:.2f}x"


def show(outcomes: dict[str, Outcome], requests: int) -> None:
    base = outcomes[BASELINE].figures()
    base_submit = outcomes[BASELINE].submit_figures()
    print(f"\n{requests} requests; [ratio to {BASELINE}]; times in seconds")
    print(
        f"{'strategy':15} {'ACTIVE':>6} | {'admission → ACTIVE: mean':>24} {'p50':>7} "
        f"{'p95':>16} | {'submit → ACTIVE: mean':>21} {'p95':>7} | {'timed out':>9} "
        f"{'double wins':>11} {'wasted gang-min':>15} | {'wall':>5}"
    )
    for name, outcome in outcomes.items():
        mine, submit = outcome.figures(), outcome.submit_figures()
        mean = f"{_num(mine['mean_s'])} [{ratio(mine['mean_s'], base['mean_s'])}]"
        p95 = f"{_num(mine['p95_s'])} [{ratio(mine['p95_s'], base['p95_s'])}]"
        submit_mean = f"{_num(submit['mean_s'])} [{ratio(submit['mean_s'], base_submit['mean_s'])}]"
        print(
            f"{name:15} {len(outcome.admission_to_active):6} | {mean:>24} "
            f"{_num(mine['p50_s']):>7} {p95:>16} | {submit_mean:>21} "
            f"{_num(submit['p95_s']):>7} | {outcome.timed_out:9} {outcome.double_wins:11} "
            f"{outcome.wasted_gang_minutes:15,.1f} | {outcome.wall_s:4.0f}s"
        )
    leaks = {name: o.leaks for name, o in outcomes.items() if o.leaks}
    if leaks:
        print(f"leaks released by the sweep: {leaks}")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="3 h of arrivals, max_wait 90 min (CI)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object as the last line")
    parser.add_argument("--seed", type=int, default=1, help="the stream's and stock's seed")
    parser.add_argument(
        "--fixed-order", action="store_true", help="every request prefers zone a, then b, then c"
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    load = QUICK if args.quick else FULL
    requests = stream(
        args.seed, load.days, load.per_hour, rotate=not args.fixed_order,
        max_wait=load.max_wait,
    )  # fmt: skip
    print(
        f"{len(requests)} requests over {load.days * 24:.0f} h, max_wait "
        f"{load.max_wait.total_seconds() / 3600:g} h (seed {args.seed}, "
        f"{'fixed' if args.fixed_order else 'rotating'} zone order), "
        f"{len(STRATEGIES)} strategies, {args.workers} workers",
        flush=True,
    )
    started = time.perf_counter()
    if args.workers <= 1:
        results = [run_strategy(s, requests, args.seed) for s in STRATEGIES]
    else:
        with ProcessPoolExecutor(max_workers=args.workers) as executor:
            futures = [executor.submit(run_strategy, s, requests, args.seed) for s in STRATEGIES]
            results = [future.result() for future in futures]
    outcomes = {outcome.name: outcome for outcome in results}
    show(outcomes, len(requests))
    print(f"whole benchmark: {time.perf_counter() - started:.1f} s")
    if args.json:
        document = {
            "strategies": {name: o.figures() for name, o in outcomes.items()},
            "requests": len(requests),
        }
        print(json.dumps(document))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
