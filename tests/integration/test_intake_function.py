"""The ``intake`` function in-process (functions-framework's test client) with a saved
Eventarc Pub/Sub envelope, on Firestore and Pub/Sub over the official emulators."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emulators import Emulators
from tests.pubsub import pull

ROOT = Path(__file__).resolve().parents[2]
ENVELOPE = json.loads((ROOT / "tests" / "data" / "pubsub_message_published.json").read_text())


@pytest.fixture
def wired(official_emulators: Emulators, emulator_project: str) -> Iterator[tuple[Any, Any, str]]:
    """A functions-framework test client for ``intake``, wired to a fresh emulator project
    with a ``capacity-events`` topic and a subscription to read it, and tenant ``vision``
    configured."""
    del official_emulators
    from functions_framework import create_app
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore, pubsub_v1

    from opendws import bootstrap
    from opendws.adapters.firestore import FirestoreConfigStore
    from opendws.ports import Configuration
    from tests.builders import tenant

    FirestoreConfigStore(
        firestore.Client(project=emulator_project, credentials=AnonymousCredentials())
    ).save(Configuration(tenants=(tenant("vision"),)))

    settings = bootstrap.Settings(project=emulator_project, on_emulators=True)
    previous = bootstrap.use(bootstrap.Container(settings))
    publisher = pubsub_v1.PublisherClient(credentials=AnonymousCredentials())
    subscriber = pubsub_v1.SubscriberClient(credentials=AnonymousCredentials())
    topic = publisher.topic_path(emulator_project, "capacity-events")
    subscription = subscriber.subscription_path(emulator_project, "events-check")
    publisher.create_topic(name=topic)
    subscriber.create_subscription(request={"name": subscription, "topic": topic})
    client = create_app("intake", str(ROOT / "functions" / "main.py"), "cloudevent").test_client()
    yield client, subscriber, subscription
    bootstrap.use(previous)
    subscriber.close()


def post(
    client: Any,
    payload: dict[str, Any] | bytes | None = None,
    message_id: str = "",
    topic: str = "capacity-requests-vision",
) -> Any:
    """The saved envelope, its message replaced, as Eventarc delivers it from ``topic`` (the
    envelope was saved from the shared topic; ``source`` names the topic)."""
    envelope = copy.deepcopy(ENVELOPE)
    envelope["source"] = f"//pubsub.googleapis.com/projects/demo-opendws/topics/{topic}"
    if payload is not None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        envelope["data"]["message"]["data"] = base64.b64encode(data).decode()
    if message_id:
        envelope["id"] = envelope["data"]["message"]["messageId"] = message_id
    return client.post("/", json=envelope, headers={"Content-Type": "application/cloudevents+json"})


def events(subscriber: Any, subscription: str, count: int) -> list[dict[str, Any]]:
    return [json.loads(message.data) for message in pull(subscriber, subscription, count)]


def test_the_saved_envelope_lands_in_firestore_once(wired: tuple[Any, Any, str]) -> None:
    client, subscriber, subscription = wired
    assert post(client).status_code == 200
    assert post(client, message_id="22222222222222").status_code == 200  # the same request again
    from opendws.bootstrap import container

    store = container().intake._store
    record = store.get("train-42")
    assert record is not None
    assert record.state.value == "PENDING"
    assert record.request.submitted_at.isoformat() == "2026-11-29T12:00:00.123000+00:00"
    assert len(store.events("train-42")) == 1
    received = events(subscriber, subscription, 1)
    assert [(e["state"], e["request_id"], e["tenant"]) for e in received] == [
        ("PENDING", "train-42", "vision")
    ]


def test_bad_input_is_acknowledged_with_a_rejected_event(wired: tuple[Any, Any, str]) -> None:
    client, subscriber, subscription = wired
    response = post(client, b'{"schema": "opendws.request/v1", "action": "submit"}')
    assert response.status_code == 200
    [event] = events(subscriber, subscription, 1)
    assert (event["state"], event["reason"]) == ("REJECTED", "INVALID_REQUEST")
    assert "tenant: Field required" in event["message"]


def test_the_source_topic_is_who_the_message_speaks_for(wired: tuple[Any, Any, str]) -> None:
    """Eventarc's Pub/Sub CloudEvent ``source`` is
    ``//pubsub.googleapis.com/projects/P/topics/T`` (eventarc/docs/cloudevents): the saved
    envelope's own topic, the shared ``capacity-requests``, is not heard by default, and the
    topic of a tenant that is not configured (speech, here) is not heard at all."""
    client, subscriber, subscription = wired
    assert post(client, topic="capacity-requests").status_code == 200
    assert post(client, topic="capacity-requests-speech", message_id="3").status_code == 200
    reasons = [event["reason"] for event in events(subscriber, subscription, 2)]
    assert sorted(reasons) == ["UNKNOWN_TOPIC", "UNTRUSTED_TOPIC"]
    from opendws.bootstrap import container

    assert container().intake._store.get("train-42") is None
