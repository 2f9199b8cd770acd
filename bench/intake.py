"""Intake throughput: Pub/Sub → intake → Firestore, against the raw write rate of Firestore.

On the official emulators, in one run:

1. the baseline: N ``create()`` calls straight to the Firestore emulator, one after another;
2. intake: N valid requests published to ``capacity-requests-bench``, pushed by the Pub/Sub emulator
   to the ``intake`` function under functions-framework, timed until all N are stored.

Reports both rates and their ratio (target: intake ≥ 0.5 × raw).

    python bench/intake.py             # N = 2,000
    python bench/intake.py --quick     # N = 300 (CI keeps it working)
    python bench/intake.py --json      # ...and one JSON object as the last line
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

from google.auth.credentials import AnonymousCredentials
from google.cloud import firestore, pubsub_v1
from google.pubsub_v1.types import PushConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from emulators import Emulators, missing_reason, running  # noqa: E402
from emulators.functions import serving  # noqa: E402

PROJECT = "bench-intake"


def request_message(index: int) -> bytes:
    return json.dumps(
        {
            "schema": "opendws.request/v1",
            "action": "submit",
            "request_id": f"bench-{index:06d}",
            "tenant": "bench",
            "mode": "flex_start",
            "gang": {
                "vm_count": 1,
                "machine_type": "a3-highgpu-8g",
                "accelerator": "nvidia-h100-80gb",
            },
            "locations": ["us-central1"],
            "run_duration": "1h",
        }
    ).encode()


def raw_creates(client: firestore.Client, count: int) -> float:
    """Seconds for ``count`` sequential create() calls of request-sized documents."""
    collection = client.collection(f"raw-{uuid.uuid4().hex[:8]}")
    document = {"request": json.loads(request_message(0)), "state": "PENDING", "version": 1}
    started = time.perf_counter()
    for index in range(count):
        collection.document(f"doc-{index:06d}").create(document)
    return time.perf_counter() - started


def intake_run(emulators: Emulators, client: firestore.Client, count: int) -> float:
    """Seconds from the first publish until all ``count`` requests are stored."""
    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]  # untyped here
    publisher = pubsub_v1.PublisherClient(credentials=credentials)
    subscriber = pubsub_v1.SubscriberClient(credentials=credentials)
    # The tenant's own topic (who a message speaks for), its tenant configured, pushed to
    # intake at a path naming the topic: as the local stack and Eventarc deliver it.
    from opendws.adapters.firestore import FirestoreConfigStore
    from opendws.domain.model import Tenant
    from opendws.ports import Configuration

    FirestoreConfigStore(client).save(Configuration(tenants=(Tenant(name="bench"),)))
    requests_topic = publisher.topic_path(PROJECT, "capacity-requests-bench")
    publisher.create_topic(name=requests_topic)
    publisher.create_topic(name=publisher.topic_path(PROJECT, "capacity-events"))
    intake = serving(
        "intake", "cloudevent", {**emulators.environment(), "OPENDWS_PROJECT": PROJECT}
    )
    with intake as url:
        subscriber.create_subscription(
            request={
                "name": subscriber.subscription_path(PROJECT, "intake"),
                "topic": requests_topic,
                "push_config": PushConfig(push_endpoint=f"{url.rstrip('/')}/{requests_topic}"),
            }
        )
        requests = client.collection("requests")
        started = time.perf_counter()
        futures = [publisher.publish(requests_topic, request_message(i)) for i in range(count)]
        for future in futures:
            future.result(60)
        deadline = time.monotonic() + 600
        stored = 0
        while time.monotonic() < deadline:
            stored = requests.count().get()[0][0].value  # type: ignore[no-untyped-call]
            if stored >= count:
                subscriber.close()
                return time.perf_counter() - started
            time.sleep(0.2)
    subscriber.close()
    raise RuntimeError(f"only {stored} of {count} requests were stored within 10 minutes")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="N = 300")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("-n", type=int, default=None, help="requests (default 2,000)")
    args = parser.parse_args()
    count = args.n or (300 if args.quick else 2_000)
    reason = missing_reason()
    if reason is not None:
        print(f"intake benchmark skipped: {reason}", file=sys.stderr)
        return 0
    with running() as emulators:
        os.environ.update(emulators.environment())
        emulators.reset(PROJECT)
        credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]  # untyped here
        client = firestore.Client(project=PROJECT, credentials=credentials)
        raw_seconds = raw_creates(client, count)
        intake_seconds = intake_run(emulators, client, count)
    raw_rate, intake_rate = count / raw_seconds, count / intake_seconds
    ratio = intake_rate / raw_rate
    print(f"raw create():            {count:,} in {raw_seconds:6.2f} s = {raw_rate:7.1f}/s")
    print(f"Pub/Sub → intake → store: {count:,} in {intake_seconds:6.2f} s = {intake_rate:7.1f}/s")
    print(f"ratio intake / raw: {ratio:.2f} (target ≥ 0.5)")
    if args.json:
        print(
            json.dumps(
                {
                    "n": count,
                    "intake_per_s": round(intake_rate, 1),
                    "raw_create_per_s": round(raw_rate, 1),
                    "ratio": round(ratio, 3),
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
