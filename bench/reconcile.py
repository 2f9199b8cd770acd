"""Reconcile pass cost: the whole service around the admission core, against the core alone.

On the planner benchmark's synthetic load (200 pools, 20 tenants; pending requests only — live
grants would need live records), in one run:

1. in memory (store, configuration, fake cloud and event bus): the first pass over N pending
   requests — every admission, confirmation, held ETA and rejection written with its event and
   every order sent to the fake cloud — and a second, steady pass (nothing new to write), each
   against the baseline of ``admit()`` alone on the same snapshot;
2. with ``--emulators``: a first pass over E pending requests on Firestore (official emulator)
   and the real Compute/TPU clients over the project's emulator, against E raw Firestore
   transactional writes in the same run (a pass makes about one transaction per request);
3. with ``--emulators``, steady passes on the same emulators: N requests submitted as intake
   stores them (``FirestoreRequestStore.create`` of ``ports.accepted``), a first pass and up to
   SETTLE_PASSES more until one writes nothing, then for k = 0, 1, 100 in turn: k new arrivals
   written by someone else (created through the store as intake does), then one pass — the
   Firestore documents it read and its wall time. Documents read are every document snapshot
   the two stores read during the pass (the lease, the configuration, pool status, queries, the
   reads inside each transaction): the stores' own ``documents_read`` when they count it, else
   a counter on the Firestore client's reads (the run says which). Target (issue 17): reads ≈ k
   + a constant, not ≈ the backlog.
4. with ``--emulators``, what the providers cost a steady pass: how many pools each pass
   observed (ReconcileSettings.observe_all_every: those of live orders, and those where
   something ended or was released, rather than all configured), and one observation of
   every pool against one of the live orders' pools only, each listing up to 8 zones at once
   (CloudSettings.observe_workers) and one zone at a time, in the same minutes. The load of
   part 3 keeps live orders in almost every pool, so the same is measured once more with
   1,000 requests located in one region of the ten (20 of the 200 pools).

    python bench/reconcile.py                  # N = 1,000 and 10,000 in memory
    python bench/reconcile.py --quick          # N = 1,000 (CI keeps it working)
    python bench/reconcile.py --emulators      # ...and E = 300, steady N = 1,000 and 10,000
    python bench/reconcile.py --quick --emulators  # ...steady N = 1,000 only
    python bench/reconcile.py --json           # ...and one JSON object as the last line:
        {"memory": …, "emulators": …, "steady_reads": {"1000": {"0": n, "1": n, "100": n},
         "10000": …}, "steady_pass_s": {same shape}, "steady_backlog": {"1000": {"pending":
         n, "live": n}, …}, "reads_counted_by": "…", "steady_observe": {"1000": {
         "pools_all", "pools_live", "all_s", "live_s", "all_one_zone_at_a_time_s",
         "live_one_zone_at_a_time_s", "round_trip_0.05_s": {the same four},
         "observed_pools": {"0": n, …}}, …,
         "1000 in us-central1": {…}}}  (the last five with --emulators)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opendws.adapters.memory import (  # noqa: E402
    MemoryCapacityProvider,
    MemoryConfigStore,
    MemoryEventBus,
    MemoryRequestStore,
)
from opendws.catalog import TPU_API_TYPES, tpu_mode_problem  # noqa: E402
from opendws.clock import ManualClock  # noqa: E402
from opendws.domain import Provider, RequestState, Snapshot, admit  # noqa: E402
from opendws.ports import (  # noqa: E402
    ConfigStore,
    Configuration,
    Providers,
    RequestStore,
    submitted,
)
from opendws.service.reconcile import PassReport, ReconcileService  # noqa: E402
from planner import NOW, REGIONS, build_snapshot  # noqa: E402
from tests.world import submit  # noqa: E402


def pending_only(size: int, region: str | None = None) -> Snapshot:
    """``size`` pending requests of the planner's load, only ones intake accepts: that load
    also asks for flex-start TPU v5p, which Google does not serve (catalog.tpu_mode_problem)
    and intake refuses. With ``region``, only requests located in it (the configuration keeps
    all 200 pools: the work sits in that region's 20)."""
    snapshot = build_snapshot(size * (30 if region else 3) // 2)
    accepted = [
        request
        for request in snapshot.pending
        if tpu_mode_problem(request.gang.accelerator, request.mode) is None
        and (region is None or all(where.startswith(region) for where in request.locations))
    ][:size]
    assert len(accepted) == size, f"the load has {len(accepted)} acceptable requests, not {size}"
    return Snapshot(pools=snapshot.pools, tenants=snapshot.tenants, pending=tuple(accepted))


def best_of(repeats: int, run: Callable[[], object]) -> float:
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def service(
    snapshot: Snapshot, store: RequestStore, config: ConfigStore, providers: Providers
) -> ReconcileService:
    for request in snapshot.pending:
        submit(store, request)
    config.save(Configuration(pools=snapshot.pools, tenants=snapshot.tenants))
    return ReconcileService(
        store, config, providers, MemoryEventBus(), ManualClock(NOW), holder="bench"
    )


def in_memory(size: int) -> dict[str, Any]:
    snapshot = pending_only(size)
    clock = ManualClock(NOW)
    cloud = MemoryCapacityProvider(clock)
    for pool in snapshot.pools:
        cloud.set_stock(pool.zone, pool.shape, pool.capacity)
    providers = Providers(mig_flex=cloud, tpu=cloud, calendar=cloud)
    reconciler = service(snapshot, MemoryRequestStore(), MemoryConfigStore(), providers)
    started = time.perf_counter()
    first: PassReport = reconciler.run_pass()
    first_s = time.perf_counter() - started
    steady_s = best_of(3, reconciler.run_pass)
    admit_s = best_of(3, lambda: admit(snapshot, NOW))
    writes = sum(first.transitions.values()) + first.revisions
    print(
        f"{size:>6,} pending in memory: first pass {first_s:6.3f} s ({writes:,} writes, "
        f"{len(first.provisioned):,} orders) = {first_s / admit_s:4.1f}x admit alone "
        f"({admit_s:.3f} s); steady pass {steady_s:6.3f} s = {steady_s / admit_s:4.1f}x",
        flush=True,
    )
    return {
        "first_pass_s": round(first_s, 4),
        "steady_pass_s": round(steady_s, 4),
        "admit_s": round(admit_s, 4),
        "writes": writes,
    }


@contextlib.contextmanager
def emulated(snapshot: Snapshot, name: str) -> Iterator[tuple[Any, Providers, Providers, Any]]:
    """The official Firestore emulator and the Compute/TPU emulator over a simulated cloud
    stocked as ``snapshot``'s pools: a Firestore client of a fresh project, the capacity
    providers on the emulator, the same listing one zone at a time (observe_workers=1), and
    the Compute emulator itself."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    from emulators import ComputeEmulator, running
    from opendws.adapters.gce import CloudSettings
    from opendws.bootstrap import capacity_providers
    from opendws.sim import SimulatedCloud

    cloud = SimulatedCloud(ManualClock(NOW))
    for pool in snapshot.pools:
        shape = TPU_API_TYPES[pool.shape] if pool.provider is Provider.TPU else pool.shape
        cloud.set_stock(pool.zone, shape, pool.capacity)
    with running() as emulators, ComputeEmulator(cloud) as compute:
        os.environ.update(emulators.environment())
        project = f"bench-{name}-{uuid.uuid4().hex[:6]}"
        credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]  # untyped here
        client = firestore.Client(project=project, credentials=credentials)
        try:
            one_at_a_time = CloudSettings(project=project, observe_workers=1)
            yield (
                client, capacity_providers(project, endpoint=compute.endpoint),
                capacity_providers(project, endpoint=compute.endpoint, cloud=one_at_a_time),
                compute,
            )  # fmt: skip
        finally:
            client.close()  # type: ignore[no-untyped-call]


def on_emulators(size: int) -> dict[str, Any] | None:
    from emulators import missing_reason

    reason = missing_reason()
    if reason is not None:
        print(f"emulators: skipped ({reason})")
        return None
    from opendws.adapters.firestore import FirestoreConfigStore, FirestoreRequestStore

    snapshot = pending_only(size)
    with emulated(snapshot, "reconcile") as (client, providers, _, _):
        raw_s = raw_transactions(client, size)
        reconciler = service(
            snapshot,
            FirestoreRequestStore(client),
            FirestoreConfigStore(client),
            providers,
        )
        started = time.perf_counter()
        report = reconciler.run_pass()
        pass_s = time.perf_counter() - started
    writes = sum(report.transitions.values()) + report.revisions
    print(
        f"{size:>6,} pending on the emulators: first pass {pass_s:6.2f} s ({writes:,} writes, "
        f"{len(report.provisioned):,} orders) = {pass_s / raw_s:4.2f}x {size:,} raw Firestore "
        f"transactions ({raw_s:.2f} s)",
        flush=True,
    )
    return {"n": size, "pass_s": round(pass_s, 3), "raw_transactions_s": round(raw_s, 3)}


def raw_transactions(client: Any, count: int) -> float:
    """Seconds for ``count`` sequential read-then-update transactions on small documents."""
    from google.cloud import firestore

    collection = client.collection(f"raw-{uuid.uuid4().hex[:8]}")
    for index in range(count):
        collection.document(f"doc-{index:06d}").set({"version": 1})

    @firestore.transactional
    def bump(transaction: Any, document: Any) -> None:
        snapshot = document.get(transaction=transaction)
        transaction.update(document, {"version": snapshot.get("version") + 1})

    started = time.perf_counter()
    for index in range(count):
        bump(client.transaction(), collection.document(f"doc-{index:06d}"))
    return time.perf_counter() - started


# Steady passes: documents read when k requests changed -----------------------------------

STEADY_SIZES = (1_000, 10_000)
SETTLE_PASSES = 5  # at most, before the k passes
ROUND_TRIP = 0.05  # seconds: a stand-in for one call's round trip to Google (observe_cost)
CHANGES = (0, 1, 100)
WRITERS = 8  # threads that submit the backlog (setup only, not measured)


class Reads:
    """Firestore documents read by ``stores``, which share ``client``.

    The stores' own ``documents_read`` (every document snapshot an adapter reads: gets,
    query streams, listeners) when every one of them has it; otherwise a counter put on the
    client library's reads for as long as the ``counting`` block lasts, limited to
    ``client``: ``DocumentReference.get`` (plain or in a transaction) counts one snapshot,
    ``Query.stream`` each snapshot it yields."""

    def __init__(self, client: Any, stores: Sequence[Any]) -> None:
        self._client = client
        self._stores = stores
        self.own = all(isinstance(getattr(s, "documents_read", None), int) for s in stores)
        self.source = (
            "the stores' documents_read" if self.own else "a counter on the Firestore client"
        )
        self._counted = 0

    def total(self) -> int:
        if self.own:
            return sum(int(store.documents_read) for store in self._stores)
        return self._counted

    @contextlib.contextmanager
    def counting(self) -> Iterator[Reads]:
        if self.own:
            yield self
            return
        from google.cloud.firestore_v1.document import DocumentReference
        from google.cloud.firestore_v1.query import Query

        get, stream = DocumentReference.get, Query.stream
        client = self._client

        def counting_get(reference: Any, *args: Any, **kwargs: Any) -> Any:
            if reference._client is client:
                self._counted += 1
            return get(reference, *args, **kwargs)

        def counting_stream(query: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            ours = query._client is client
            for snapshot in stream(query, *args, **kwargs):
                if ours:
                    self._counted += 1
                yield snapshot

        # Put on the classes: the stores build their references and queries themselves.
        DocumentReference.get = counting_get  # type: ignore[method-assign,assignment]
        Query.stream = counting_stream  # type: ignore[method-assign,assignment]
        try:
            yield self
        finally:
            DocumentReference.get = get  # type: ignore[method-assign]
            Query.stream = stream  # type: ignore[method-assign]


def arrivals(snapshot: Snapshot, round_: int, count: int) -> list[Any]:
    """``count`` new requests like the first ones of the load, under new ids, arriving now."""
    return [
        replace(request, request_id=f"arrival-{round_}-{index:04d}", submitted_at=NOW)
        for index, request in enumerate(snapshot.pending[:count])
    ]


def submit_all(store: RequestStore, requests: Sequence[Any]) -> None:
    """Store ``requests`` as intake does, several at a time (setup: not measured)."""
    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(lambda request: submit(store, request), requests))


def steady(size: int, region: str | None = None) -> dict[str, Any] | None:
    """Documents read and wall time of one pass after k changes, k in CHANGES, over ``size``
    submitted requests on the emulators (see the module docstring, part 3); the pools each
    pass observed; and, after the last, the time to observe every configured pool against
    the pools of live orders only (part 4)."""
    from emulators import missing_reason

    reason = missing_reason()
    if reason is not None:
        print(f"steady passes: skipped ({reason})")
        return None
    from opendws.adapters.firestore import FirestoreConfigStore, FirestoreRequestStore

    snapshot = pending_only(size, region)
    with emulated(snapshot, "steady") as (client, providers, one_at_a_time, compute):
        store, config = FirestoreRequestStore(client), FirestoreConfigStore(client)
        started = time.perf_counter()
        submit_all(store, snapshot.pending)
        submit_s = time.perf_counter() - started
        config.save(Configuration(pools=snapshot.pools, tenants=snapshot.tenants))
        reconciler = ReconcileService(
            store, config, providers, MemoryEventBus(), ManualClock(NOW), holder="bench",
        )  # fmt: skip
        reads = Reads(client, (store, config))
        with reads.counting():
            started = time.perf_counter()
            reconciler.run_pass()
            first_s = time.perf_counter() - started
            first_reads = reads.total()
            # Settle what the first pass left moving (on this load the second pass revises
            # a few hundred ETAs), so that the k = 0 pass follows one that wrote nothing:
            # every write is read back once by the next pass's delta read.
            settling = 0
            while settling < SETTLE_PASSES:
                settling += 1
                settled = reconciler.run_pass()
                if not (settled.transitions or settled.revisions):
                    break
            pending = len(store.in_states(RequestState.PENDING))
            live = len(
                store.in_states(RequestState.PROVISIONING, RequestState.ACTIVE, RequestState.BOOKED)
            )
            counts: dict[str, int] = {}
            times: dict[str, float] = {}
            looked: dict[str, int] = {}
            for round_, changed in enumerate(CHANGES):
                submit_all(store, arrivals(snapshot, round_, changed))
                before = reads.total()
                started = time.perf_counter()
                report = reconciler.run_pass()
                times[str(changed)] = round(time.perf_counter() - started, 4)
                counts[str(changed)] = reads.total() - before
                looked[str(changed)] = report.observed_pools
                if not report.ran:
                    print(f"  k = {changed}: the pass did not run ({report.outcome})")
            observe = observe_cost(store, providers, one_at_a_time, snapshot, compute)
    shown = ", ".join(
        f"k = {k}: {counts[k]:,} reads in {times[k]:.2f} s, {looked[k]} pools observed"
        for k in counts
    )
    where = f" in {region}" if region else ""
    held = ", ".join(f"{k} {v:.2f}" for k, v in observe[f"round_trip_{ROUND_TRIP}_s"].items())
    print(
        f"{size:>6,} submitted{where} on the emulators ({pending:,} pending, {live:,} live after "
        f"the first pass {first_s:.1f} s, {first_reads:,} reads, {settling} more to settle; "
        f"setup {submit_s:.1f} s): "
        f"steady pass after k changes: {shown}; observing all {observe['pools_all']} pools "
        f"{observe['all_s']:.3f} s ({observe['all_one_zone_at_a_time_s']:.3f} s one zone at a "
        f"time), the {observe['pools_live']} of live orders {observe['live_s']:.3f} s "
        f"({observe['live_one_zone_at_a_time_s']:.3f} s); with a {ROUND_TRIP * 1000:.0f} ms "
        f"round trip: {held}",
        flush=True,
    )
    return {
        "reads": counts, "pass_s": times, "backlog": {"pending": pending, "live": live},
        "first_pass_s": round(first_s, 3), "first_pass_reads": first_reads,
        "settle_passes": settling, "source": reads.source, "observed_pools": looked,
        "observe": observe,
    }  # fmt: skip


def observe_cost(
    store: Any, providers: Providers, one_at_a_time: Providers, snapshot: Snapshot, compute: Any
) -> dict[str, Any]:
    """Best of 3 wall times of one observation of every configured pool (what each pass
    did before ReconcileSettings.observe_all_every) and of the pools of live orders only
    (what a steady pass observes), each listing up to 8 zones at once (the default) and one
    zone at a time, in the same minutes. The emulator runs in this process and answers at
    once, so its calls contend for one interpreter and do not overlap; the same four are
    timed once more (once each) with every answer held back ROUND_TRIP seconds, a stand-in
    for the network and Google's own time (an assumption, not a measurement of Google)."""
    live = store.in_states(RequestState.PROVISIONING, RequestState.ACTIVE, RequestState.BOOKED)
    live += [r for r in store.in_states(RequestState.PENDING) if submitted(r)]
    wanted = {lane.pool for record in live for lane in record.orders}
    these = [pool for pool in snapshot.pools if pool.pool_id in wanted]
    every = list(snapshot.pools)
    return {
        "pools_all": len(every), "pools_live": len(these),
        "all_s": round(best_of(3, lambda: providers.observe(every)), 4),
        "live_s": round(best_of(3, lambda: providers.observe(these)), 4),
        "all_one_zone_at_a_time_s": round(best_of(3, lambda: one_at_a_time.observe(every)), 4),
        "live_one_zone_at_a_time_s": round(best_of(3, lambda: one_at_a_time.observe(these)), 4),
        f"round_trip_{ROUND_TRIP}_s": held_back(providers, one_at_a_time, every, these, compute),
    }  # fmt: skip


def held_back(
    providers: Providers, one_at_a_time: Providers, every: list[Any], these: list[Any],
    compute: Any,
) -> dict[str, float]:  # fmt: skip
    """The four observations of observe_cost with every answer held back ROUND_TRIP s."""
    compute.round_trip = ROUND_TRIP
    try:
        return {
            "all_s": round(best_of(1, lambda: providers.observe(every)), 3),
            "live_s": round(best_of(1, lambda: providers.observe(these)), 3),
            "all_one_zone_at_a_time_s": round(best_of(1, lambda: one_at_a_time.observe(every)), 3),
            "live_one_zone_at_a_time_s": round(best_of(1, lambda: one_at_a_time.observe(these)), 3),
        }
    finally:
        compute.round_trip = 0.0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="N = 1,000 only")
    parser.add_argument("--emulators", action="store_true", help="also time passes on them")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args()
    sizes = [1_000] if args.quick else [1_000, 10_000]
    result: dict[str, Any] = {"memory": {str(size): in_memory(size) for size in sizes}}
    if args.emulators:
        result["emulators"] = on_emulators(300)
        measured = {
            size: steady(size) for size in (STEADY_SIZES[:1] if args.quick else STEADY_SIZES)
        }
        passes = {str(size): found for size, found in measured.items() if found is not None}
        if passes:
            result["steady_reads"] = {size: found["reads"] for size, found in passes.items()}
            result["steady_pass_s"] = {size: found["pass_s"] for size, found in passes.items()}
            result["steady_backlog"] = {
                size: {**found["backlog"], "first_pass_s": found["first_pass_s"],
                       "first_pass_reads": found["first_pass_reads"]}
                for size, found in passes.items()
            }  # fmt: skip
            result["reads_counted_by"] = next(iter(passes.values()))["source"]
            concentrated = steady(1_000, REGIONS[0])
            if concentrated is not None:
                passes[f"1000 in {REGIONS[0]}"] = concentrated
            result["steady_observe"] = {
                size: {**found["observe"], "observed_pools": found["observed_pools"]}
                for size, found in passes.items()
            }
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
