"""Jobs on the local stack: how fast a gang's job starts once the gang runs, and how fast its
capacity goes back once the job ends.

``N`` gangs of 1 to 4 H100 VMs (cycling 1, 2, 3, 4) of tenant ``vision`` run ``true``, a few at a
time (the stack's 12 H100 VMs in two zones). Each VM the simulated cloud brings up runs the
agent as a process of its own (emulators.vms); the agents register, meet at the barrier, run
the job and report its exit; the run is released as JOB_SUCCEEDED. Per gang:

- start: from ACTIVE (the reconciler saw every VM running, the ACTIVE event's time) to every
  rank's job done (its exit as recorded; ``true`` takes milliseconds, so this bounds the start
  from above);
- release: from the last rank's exit to RELEASED (the event's time).

The baseline, measured in the same run before the jobs: the same release path without a job —
a capacity-only gang of 1 VM released with ``Client.release`` (publish → RELEASED).

    python bench/jobs.py             # 20 gangs
    python bench/jobs.py --quick     # 4 gangs (CI keeps it working)
    python bench/jobs.py --json      # ...and one JSON object as the last line:
        {"n", "start_p50_s", "start_p95_s", "release_p50_s", "release_p95_s",
         "baseline_release_p50_s", "baseline_release_p95_s"}

Target (issue 48): both p95 under 10 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emulators import missing_reason  # noqa: E402
from emulators.stack import local_stack  # noqa: E402

GANG = {"machine_type": "a3-highgpu-8g", "accelerator": "nvidia-h100-80gb",
        "accelerators_per_vm": 8}  # fmt: skip
AT_ONCE = 3  # gangs in flight (the stack has 12 H100 VMs)
TIMEOUT = 120.0  # seconds for one gang, submit to RELEASED


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _when(events: list[Any], state: str) -> datetime | None:
    return next((e.at for e in events if e.state.value == state), None)


def run(count: int) -> dict[str, Any]:
    from opendws import bootstrap
    from opendws.client import Client

    with local_stack(tick=timedelta(minutes=10), latency=timedelta(seconds=2)):
        container = bootstrap.Container(bootstrap.Settings.from_environment())
        dws = Client(container=container)
        store = container.adapters.store
        ranks = container.adapters.ranks
        assert ranks is not None
        baseline: list[float] = []
        for index in range(max(3, count // 4)):
            request_id = f"bench-capacity-{index}"
            dws.submit(request_id=request_id, tenant="vision", mode="flex_start",
                       gang={"vm_count": 1, **GANG}, locations=["us-central1-a"],
                       run_duration="1h", max_wait="1h")  # fmt: skip
            dws.wait(request_id, timeout=TIMEOUT)
            dws.release(request_id, tenant="vision")
            record = _until_final(store, request_id)
            events = store.events(request_id)
            active, released = _when(events, "ACTIVE"), _when(events, "RELEASED")
            assert record.state.value == "RELEASED"
            assert active
            assert released
            asked = max(e.at for e in events if e.state.value == "ACTIVE")
            baseline.append((released - asked).total_seconds())
        starts: list[float] = []
        releases: list[float] = []
        pending = [(f"bench-job-{index}", 1 + index % 4) for index in range(count)]
        while pending:
            batch, pending = pending[:AT_ONCE], pending[AT_ONCE:]
            for request_id, vms in batch:
                dws.submit(request_id=request_id, tenant="vision", mode="flex_start",
                           gang={"vm_count": vms, **GANG},
                           locations=["us-central1-a", "us-central1-b"], run_duration="1h",
                           max_wait="1h", run={"command": ["true"]})  # fmt: skip
            for request_id, vms in batch:
                record = _until_final(store, request_id)
                events = store.events(request_id)
                if record.reason != "JOB_SUCCEEDED":
                    raise SystemExit(f"{request_id} ended {record.state} {record.reason}")
                active, released = _when(events, "ACTIVE"), _when(events, "RELEASED")
                exits = [r.exited_at for r in ranks.ranks(request_id) if r.exited_at]
                assert active
                assert released
                assert len(exits) == vms
                last = max(exits)
                starts.append((last - active).total_seconds())
                releases.append((released - last).total_seconds())
        return {
            "n": count,
            "start_p50_s": round(statistics.median(starts), 3),
            "start_p95_s": round(percentile(starts, 0.95), 3),
            "release_p50_s": round(statistics.median(releases), 3),
            "release_p95_s": round(percentile(releases, 0.95), 3),
            "baseline_release_p50_s": round(statistics.median(baseline), 3),
            "baseline_release_p95_s": round(percentile(baseline, 0.95), 3),
        }


def _until_final(store: Any, request_id: str) -> Any:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        record = store.get(request_id)
        if record is not None and record.state.is_final:
            return record
        time.sleep(0.2)
    raise SystemExit(f"{request_id} did not end within {TIMEOUT} s")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="4 gangs")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    options = parser.parse_args()
    reason = missing_reason()
    if reason is not None:
        print(f"skipped: official emulators unavailable: {reason}")
        return 0
    result = run(4 if options.quick else 20)
    print(
        f"{result['n']} gangs: start p50 {result['start_p50_s']} s, p95 "
        f"{result['start_p95_s']} s; release p50 {result['release_p50_s']} s, p95 "
        f"{result['release_p95_s']} s (baseline release without a job: p50 "
        f"{result['baseline_release_p50_s']} s, p95 {result['baseline_release_p95_s']} s)"
    )
    if options.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
