"""End to end on one machine: publish to ``capacity-requests`` on the Pub/Sub emulator, whose
push subscription (with a dead-letter policy) delivers to the ``intake`` function running under
functions-framework; the request appears in the Firestore emulator and its event on
``capacity-events``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from emulators import Emulators, free_port

from tests.unit.test_request_schema import DESIGN_EXAMPLE

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def intake_server(official_emulators: Emulators, emulator_project: str) -> Iterator[str]:
    """The intake function served by functions-framework in its own process group."""
    port = free_port()
    log = open(os.devnull, "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "functions_framework",
            "--target",
            "intake",
            "--source",
            str(ROOT / "functions" / "main.py"),
            "--signature-type",
            "cloudevent",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env={**os.environ, **official_emulators.environment(), "OPENDWS_PROJECT": emulator_project},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url, timeout=1)  # any HTTP answer means it is up
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(10)
        log.close()


def test_a_published_request_lands_in_firestore(intake_server: str, emulator_project: str) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore, pubsub_v1
    from google.pubsub_v1.types import DeadLetterPolicy, PushConfig

    from opendws.adapters.firestore import FirestoreRequestStore

    credentials = AnonymousCredentials()
    publisher = pubsub_v1.PublisherClient(credentials=credentials)
    subscriber = pubsub_v1.SubscriberClient(credentials=credentials)
    topics = {
        name: publisher.topic_path(emulator_project, name)
        for name in ("capacity-requests", "capacity-events", "capacity-requests-dead-letter")
    }
    for path in topics.values():
        publisher.create_topic(name=path)
    subscriber.create_subscription(
        request={
            "name": subscriber.subscription_path(emulator_project, "intake"),
            "topic": topics["capacity-requests"],
            "push_config": PushConfig(push_endpoint=intake_server),
            "dead_letter_policy": DeadLetterPolicy(
                dead_letter_topic=topics["capacity-requests-dead-letter"], max_delivery_attempts=5
            ),
        }
    )
    events = subscriber.subscription_path(emulator_project, "events-e2e")
    subscriber.create_subscription(request={"name": events, "topic": topics["capacity-events"]})

    publisher.publish(topics["capacity-requests"], json.dumps(DESIGN_EXAMPLE).encode()).result(30)

    store = FirestoreRequestStore(
        firestore.Client(project=emulator_project, credentials=credentials)
    )
    deadline = time.monotonic() + 60
    record = None
    while record is None and time.monotonic() < deadline:
        record = store.get("train-42")
        time.sleep(0.2)
    assert record is not None, "the request never reached Firestore"
    assert record.state.value == "PENDING"
    reply = subscriber.pull(request={"subscription": events, "max_messages": 10}, timeout=30)
    assert [json.loads(m.message.data)["state"] for m in reply.received_messages] == ["PENDING"]
    subscriber.close()
