"""Admission latency on the local stack: publish a request → its ADMITTED event (PROVISIONING,
reason ADMITTED) on ``capacity-events``, with free capacity, driven by nudges (the tick is set
to 10 minutes, so it never helps).

Each request is 1 TPU chip in the stack's 64-chip pool and is released as soon as it is
admitted, so capacity stays free. The baseline, measured in the same run, is a bare Pub/Sub
round trip on the same emulator (publish → a streaming-pull subscriber receives it).

    python bench/latency.py            # N = 100
    python bench/latency.py --quick    # N = 15 (CI keeps it working)
    python bench/latency.py --json     # ...and one JSON object as the last line:
                                       # {"n": …, "p50_s": …, "p95_s": …, ...}

Target (DESIGN.md): p50 and p95 under 2 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emulators import missing_reason  # noqa: E402
from emulators.stack import local_stack  # noqa: E402


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


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="N = 15")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    args = parser.parse_args()
    reason = missing_reason()
    if reason is not None:
        print(f"latency: skipped ({reason})")
        return 0
    count = 15 if args.quick else 100
    with local_stack(tick=timedelta(minutes=10), latency=timedelta(seconds=5)) as stack:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import pubsub_v1

        credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
        publisher = pubsub_v1.PublisherClient(credentials=credentials)
        subscriber = pubsub_v1.SubscriberClient(credentials=credentials)
        project = stack.project
        admitted, echoes = Arrivals(), Arrivals()

        def on_event(message: Any) -> None:
            event = json.loads(message.data)
            if event.get("state") == "PROVISIONING" and event.get("reason") == "ADMITTED":
                admitted.record(event["request_id"])
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
            arrived = admitted.wait(request_id, 60)
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

    p50, p95 = statistics.median(latencies), percentile(latencies, 0.95)
    b50, b95 = statistics.median(baseline), percentile(baseline, 0.95)
    print(
        f"publish → ADMITTED, {len(latencies)} of {count} requests: p50 {p50:.3f} s, "
        f"p95 {p95:.3f} s, max {max(latencies):.3f} s (target: under 2 s); missed {missed}"
    )
    print(f"baseline Pub/Sub round trip: p50 {b50:.3f} s, p95 {b95:.3f} s → "
          f"admission p50 = {p50 / b50:.1f}x, p95 = {p95 / b95:.1f}x the round trip")  # fmt: skip
    if args.json:
        result = {
            "n": len(latencies), "p50_s": round(p50, 4), "p95_s": round(p95, 4),
            "max_s": round(max(latencies), 4), "missed": missed,
            "baseline_p50_s": round(b50, 4), "baseline_p95_s": round(b95, 4),
        }  # fmt: skip
        print(json.dumps(result))
    return 0 if missed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
