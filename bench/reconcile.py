"""Reconcile pass cost: the whole service around the admission core, against the core alone.

On the planner benchmark's synthetic load (200 pools, 20 tenants; pending requests only — live
grants would need live records), in one run:

1. in memory (store, configuration, fake cloud and event bus): the first pass over N pending
   requests — every admission, confirmation, held ETA and rejection written with its event and
   every order sent to the fake cloud — and a second, steady pass (nothing new to write), each
   against the baseline of ``admit()`` alone on the same snapshot;
2. with ``--emulators``: a first pass over E pending requests on Firestore (official emulator)
   and the real Compute/TPU clients over the project's emulator, against E raw Firestore
   transactional writes in the same run (a pass makes about one transaction per request).

    python bench/reconcile.py                  # N = 1,000 and 10,000 in memory
    python bench/reconcile.py --quick          # N = 1,000 (CI keeps it working)
    python bench/reconcile.py --emulators      # ...and E = 300 on the emulators
    python bench/reconcile.py --json           # ...and one JSON object as the last line
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import uuid
from collections.abc import Callable
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
from opendws.catalog import TPU_API_TYPES  # noqa: E402
from opendws.clock import ManualClock  # noqa: E402
from opendws.domain import Provider, Snapshot, admit  # noqa: E402
from opendws.ports import (  # noqa: E402
    ConfigStore,
    Configuration,
    Providers,
    RequestStore,
)
from opendws.service.reconcile import PassReport, ReconcileService  # noqa: E402
from planner import NOW, build_snapshot  # noqa: E402
from tests.world import submit  # noqa: E402


def pending_only(size: int) -> Snapshot:
    snapshot = build_snapshot(size)
    return Snapshot(pools=snapshot.pools, tenants=snapshot.tenants, pending=snapshot.pending)


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


def on_emulators(size: int) -> dict[str, Any] | None:
    from emulators import ComputeEmulator, missing_reason, running

    reason = missing_reason()
    if reason is not None:
        print(f"emulators: skipped ({reason})")
        return None
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    from opendws.adapters.firestore import FirestoreConfigStore, FirestoreRequestStore
    from opendws.bootstrap import capacity_providers
    from opendws.sim import SimulatedCloud

    snapshot = pending_only(size)
    cloud = SimulatedCloud(ManualClock(NOW))
    for pool in snapshot.pools:
        shape = TPU_API_TYPES[pool.shape] if pool.provider is Provider.TPU else pool.shape
        cloud.set_stock(pool.zone, shape, pool.capacity)
    with running() as emulators, ComputeEmulator(cloud) as compute:
        os.environ.update(emulators.environment())
        project = f"bench-reconcile-{uuid.uuid4().hex[:6]}"
        credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]  # untyped here
        client = firestore.Client(project=project, credentials=credentials)
        raw_s = raw_transactions(client, size)
        reconciler = service(
            snapshot,
            FirestoreRequestStore(client),
            FirestoreConfigStore(client),
            capacity_providers(project, endpoint=compute.endpoint),
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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="N = 1,000 only")
    parser.add_argument("--emulators", action="store_true", help="also time a pass on them")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args()
    sizes = [1_000] if args.quick else [1_000, 10_000]
    result: dict[str, Any] = {"memory": {str(size): in_memory(size) for size in sizes}}
    if args.emulators:
        result["emulators"] = on_emulators(300)
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
