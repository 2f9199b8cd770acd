"""Admission latency on the local stack: publish a request → its ADMITTED event (PROVISIONING,
reason ADMITTED) on ``capacity-events``, with free capacity, driven by nudges.

Each probe is 1 TPU chip of tenant ``vision`` in the stack's 64-chip pool and is released as
soon as it is admitted, so capacity stays free; probes go one at a time. The baseline, measured
in the same run just before the probes, is a bare Pub/Sub round trip on the same emulator
(publish → a streaming-pull subscriber receives it).

``--backlog N`` first queues N held requests in another pool, so that every pass has them to
read and plan: a blocker (8 × a3-highgpu-8g of ``vision`` in us-central1-a, 3 days, through
intake like any request) fills that pool and is waited for until ACTIVE; then N requests of
tenant ``speech`` for 1 × a3-highgpu-8g in us-central1-a only (1 h, max_wait 7 d) are written
straight into Firestore through the real adapter — ``FirestoreRequestStore.create`` of
``ports.accepted``, the record and first event intake writes, then ``mark_announced`` as intake
does — several at a time. They stay PENDING: held behind the blocker with an ETA, or waiting
for a slot within max_wait. Written directly, not published, because publishing N would go
through intake (whose throughput bench/intake.py measures) and send N nudges, a storm of
passes; the stored requests are the same. One tick then makes the reconciler plan them (one
PENDING event with a reason each), and the probes start once every one has been planned.
With a backlog the tick is the deployed one, every minute (a nudge lost while a pass runs is
then made up within a minute, as in Google Cloud); without one it is 10 minutes, so it never
helps.

    python bench/latency.py                    # 100 probes, no backlog
    python bench/latency.py --backlog 10000    # 30 probes behind 10,000 held requests
    python bench/latency.py --quick            # 15 probes, no backlog (CI keeps it working)
    python bench/latency.py --json             # ...and one JSON object as the last line:
        {"backlog": N, "n": samples, "p50_s": …, "p95_s": …, "baseline_p95_s": …, ...}

Target (DESIGN.md, issue 17): p95 under 2 s, also at N = 10,000.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emulators import missing_reason  # noqa: E402
from emulators.stack import local_stack  # noqa: E402

BACKLOG_TENANT = "speech"
BLOCKED_POOL = ("us-central1-a", "a3-highgpu-8g", "nvidia-h100-80gb", 8)  # zone, shape, gpu, VMs
WRITERS = 8  # threads that write the backlog
PROBE_TIMEOUT = 150.0  # seconds: longer than a tick and a pass
PLAN_TIMEOUT = 1800.0  # seconds for the reconciler to plan the whole backlog


class Arrivals:
    """When each awaited message arrived, by key."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.condition = threading.Condition()

    def record(self, key: str) -> None:
        with self.condition:
            self.at.setdefault(key, time.perf_counter())
            self.condition.notify_all()

    def wait(self, key: str, timeout: float) -> float | None:
        deadline = time.perf_counter() + timeout
        with self.condition:
            while key not in self.at:
                left = deadline - time.perf_counter()
                if left <= 0:
                    return None
                self.condition.wait(left)
            return self.at[key]


class Planned:
    """Backlog requests the reconciler has planned: a PENDING event with a reason."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.condition = threading.Condition()

    def record(self, request_id: str) -> None:
        with self.condition:
            self.ids.add(request_id)
            self.condition.notify_all()

    def wait(self, count: int, timeout: float, progress: Callable[[int], None]) -> int:
        deadline = time.perf_counter() + timeout
        shown = time.perf_counter()
        with self.condition:
            while len(self.ids) < count:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self.condition.wait(min(left, 5.0))
                if time.perf_counter() - shown >= 30:
                    progress(len(self.ids))
                    shown = time.perf_counter()
            return len(self.ids)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def submission(request_id: str, tenant: str, gang: dict[str, Any], locations: list[str],
               run_duration: str, max_wait: str) -> dict[str, Any]:  # fmt: skip
    return {
        "schema": "opendws.request/v1", "action": "submit", "request_id": request_id,
        "tenant": tenant, "mode": "flex_start", "gang": gang, "locations": locations,
        "run_duration": run_duration, "max_wait": max_wait,
    }  # fmt: skip


def held_gang() -> dict[str, Any]:
    _, shape, accelerator, _ = BLOCKED_POOL
    return {"vm_count": 1, "machine_type": shape, "accelerator": accelerator,
            "accelerators_per_vm": 8}  # fmt: skip


def write_backlog(project: str, request_ids: list[str]) -> float:
    """Store the held requests as intake does (see the module docstring); seconds taken."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    from opendws.adapters.firestore import FirestoreRequestStore
    from opendws.clock import SystemClock
    from opendws.ports import accepted
    from opendws.schema.request import Submit, parse_message, to_capacity_request

    client = firestore.Client(project=project, credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    store = FirestoreRequestStore(client)
    zone = BLOCKED_POOL[0]

    def one(request_id: str) -> None:
        message = parse_message(
            submission(request_id, BACKLOG_TENANT, held_gang(), [zone], "1h", "7d")
        )
        assert isinstance(message, Submit)
        now = SystemClock().now()
        request = to_capacity_request(message, default_request_id=request_id, submitted_at=now)
        record, event = accepted(request, now)
        store.create(record, event)
        store.mark_announced(request_id, 1)

    started = time.perf_counter()
    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(one, request_ids))
    client.close()  # type: ignore[no-untyped-call]
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="15 probes")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--backlog", type=int, default=0, help="held requests queued first")
    parser.add_argument(
        "--count", type=int, default=None, help="probes (default 100; 30 with a backlog)"
    )
    parser.add_argument(
        "--tick", type=float, default=None,
        help="seconds between reconcile ticks (default 600; 60 with a backlog)",
    )  # fmt: skip
    args = parser.parse_args()
    reason = missing_reason()
    if reason is not None:
        print(f"latency: skipped ({reason})")
        return 0
    backlog = max(0, args.backlog)
    count = args.count or (15 if args.quick else 30 if backlog else 100)
    tick = timedelta(seconds=args.tick or (60 if backlog else 600))
    setup: dict[str, float] = {}
    with local_stack(tick=tick, latency=timedelta(seconds=5)) as stack:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import pubsub_v1

        credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
        publisher = pubsub_v1.PublisherClient(credentials=credentials)
        subscriber = pubsub_v1.SubscriberClient(credentials=credentials)
        project = stack.project
        admitted, echoes, active, planned = Arrivals(), Arrivals(), Arrivals(), Planned()

        def on_event(message: Any) -> None:
            event = json.loads(message.data)
            state, request_id = event.get("state"), event.get("request_id", "")
            if state == "PROVISIONING" and event.get("reason") == "ADMITTED":
                admitted.record(request_id)
            elif state == "ACTIVE":
                active.record(request_id)
            elif state == "PENDING" and event.get("reason") and request_id.startswith("held-"):
                planned.record(request_id)
            message.ack()

        def on_echo(message: Any) -> None:
            echoes.record(message.data.decode())
            message.ack()

        events = subscriber.subscription_path(project, "bench-latency-events")
        subscriber.create_subscription(
            request={"name": events, "topic": publisher.topic_path(project, "capacity-events")}
        )
        echo_topic = publisher.topic_path(project, "bench-latency-echo")
        publisher.create_topic(name=echo_topic)
        echo = subscriber.subscription_path(project, "bench-latency-echo")
        subscriber.create_subscription(request={"name": echo, "topic": echo_topic})
        streams = [subscriber.subscribe(events, on_event), subscriber.subscribe(echo, on_echo)]
        requests_topic = publisher.topic_path(project, "capacity-requests-vision")  # its own

        if backlog:
            started = time.perf_counter()
            zone, _, _, vms = BLOCKED_POOL
            blocker = f"blocker-{uuid.uuid4().hex[:6]}"
            gang = {**held_gang(), "vm_count": vms}
            message = submission(blocker, "vision", gang, [zone], "3d", "1h")
            publisher.publish(requests_topic, json.dumps(message).encode()).result(30)
            if active.wait(blocker, 120) is None:
                print("latency: the blocker did not become ACTIVE within 120 s")
                return 1
            setup["blocker_s"] = time.perf_counter() - started
            print(f"blocker {blocker} ACTIVE after {setup['blocker_s']:.1f} s", flush=True)
            held = [f"held-{index:06d}-{uuid.uuid4().hex[:4]}" for index in range(backlog)]
            setup["write_s"] = write_backlog(project, held)
            print(f"{backlog:,} held requests written in {setup['write_s']:.1f} s", flush=True)
            started = time.perf_counter()
            ticks = publisher.topic_path(project, "reconcile-ticks")
            publisher.publish(ticks, json.dumps({"tick": True}).encode()).result(30)
            done = planned.wait(
                backlog, PLAN_TIMEOUT,
                lambda n: print(f"  {n:,} of {backlog:,} planned", flush=True),
            )  # fmt: skip
            setup["plan_s"] = time.perf_counter() - started
            print(f"{done:,} of {backlog:,} planned in {setup['plan_s']:.1f} s", flush=True)

        baseline: list[float] = []
        for index in range(count):
            key = f"echo-{index}-{uuid.uuid4().hex[:6]}"
            started = time.perf_counter()
            publisher.publish(echo_topic, key.encode()).result(30)
            arrived = echoes.wait(key, 30)
            if arrived is not None:
                baseline.append(arrived - started)

        latencies: list[float] = []
        missed = 0
        for index in range(count):
            request_id = f"latency-{index}-{uuid.uuid4().hex[:6]}"
            message = {
                "schema": "opendws.request/v1", "action": "submit", "request_id": request_id,
                "tenant": "vision", "mode": "flex_start",
                "gang": {"vm_count": 1, "accelerator": "tpu-v5e", "topology": "1x1"},
                "locations": ["us-west4-a"], "run_duration": "1h", "max_wait": "1h",
            }  # fmt: skip
            started = time.perf_counter()
            publisher.publish(requests_topic, json.dumps(message).encode()).result(30)
            arrived = admitted.wait(request_id, PROBE_TIMEOUT)
            if arrived is None:
                missed += 1
                continue
            latencies.append(arrived - started)
            release = {"schema": "opendws.request/v1", "action": "release",
                       "request_id": request_id, "tenant": "vision"}  # fmt: skip
            publisher.publish(requests_topic, json.dumps(release).encode()).result(30)
            time.sleep(0.2)  # let the release land before the next request
        for stream in streams:
            stream.cancel()
        subscriber.close()

    if not latencies:
        print(f"publish → ADMITTED: none of {count} probes admitted within {PROBE_TIMEOUT} s")
        return 1
    p50, p95 = statistics.median(latencies), percentile(latencies, 0.95)
    b50, b95 = statistics.median(baseline), percentile(baseline, 0.95)
    print(
        f"publish → ADMITTED behind {backlog:,} held requests, {len(latencies)} of {count} "
        f"probes: p50 {p50:.3f} s, p95 {p95:.3f} s, max {max(latencies):.3f} s (target: p95 "
        f"under 2 s); missed {missed}; tick every {tick.total_seconds():.0f} s"
    )
    print(f"baseline Pub/Sub round trip: p50 {b50:.3f} s, p95 {b95:.3f} s → "
          f"admission p50 = {p50 / b50:.1f}x, p95 = {p95 / b95:.1f}x the round trip")  # fmt: skip
    if args.json:
        result = {
            "backlog": backlog, "n": len(latencies), "p50_s": round(p50, 4),
            "p95_s": round(p95, 4), "max_s": round(max(latencies), 4), "missed": missed,
            "baseline_p50_s": round(b50, 4), "baseline_p95_s": round(b95, 4),
            "tick_s": tick.total_seconds(),
            "setup_s": {name: round(value, 1) for name, value in setup.items()},
        }  # fmt: skip
        print(json.dumps(result))
    return 0 if missed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
