"""The EventBus contract, on the in-memory fake and on Pub/Sub over the official emulator: what
is published can be read back whole, in order, with its attributes."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from opendws.adapters.memory import MemoryEventBus
from opendws.domain import RequestState
from opendws.ports import EventBus, StatusEvent
from tests.builders import NOW
from tests.pubsub import pull

Received = list[tuple[StatusEvent, dict[str, str]]]


@pytest.fixture(params=["memory", "pubsub"])
def bus(request: pytest.FixtureRequest) -> Iterator[tuple[EventBus, Callable[[int], Received]]]:
    if request.param == "memory":
        memory = MemoryEventBus()

        def read_memory(count: int) -> Received:
            return [
                (e, {"request_id": e.request_id, "tenant": e.tenant, "state": e.state.value})
                for e in memory.published[:count]
            ]

        yield memory, read_memory
        return
    project: str = request.getfixturevalue("emulator_project")
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import pubsub_v1

    from opendws.adapters.pubsub import PubSubEventBus
    from opendws.ports import EVENTS_TOPIC

    publisher = pubsub_v1.PublisherClient(credentials=AnonymousCredentials())
    subscriber = pubsub_v1.SubscriberClient(credentials=AnonymousCredentials())
    topic = publisher.topic_path(project, EVENTS_TOPIC)
    subscription = subscriber.subscription_path(project, "events-reader")
    publisher.create_topic(name=topic)
    subscriber.create_subscription(
        request={"name": subscription, "topic": topic, "enable_message_ordering": False}
    )

    def read_pubsub(count: int) -> Received:
        received = [
            (StatusEvent.from_json(json.loads(message.data)), dict(message.attributes))
            for message in pull(subscriber, subscription, count)
        ]
        return sorted(received, key=lambda item: item[0].at)

    yield PubSubEventBus(publisher, project), read_pubsub
    subscriber.close()


def event(index: int, state: RequestState) -> StatusEvent:
    return StatusEvent(
        request_id=f"r{index}",
        tenant="vision",
        state=state,
        previous_state=None if state is RequestState.PENDING else RequestState.PENDING,
        at=NOW + timedelta(seconds=index),
        reason="NO_CAPACITY_UNTIL" if state is RequestState.PENDING else None,
        message="waiting for 16 × nvidia-h100-80gb",
        eta=NOW + timedelta(hours=index),
        position=index,
        pool="us-central1-a/a3-highgpu-8g",
    )


def test_published_events_come_back_whole_with_their_attributes(
    bus: tuple[EventBus, Callable[[int], Received]],
) -> None:
    publisher, read = bus
    sent = [event(1, RequestState.PENDING), event(2, RequestState.PROVISIONING)]
    for item in sent:
        publisher.publish(item)
    received = read(len(sent))
    assert [item for item, _ in received] == sent
    assert [attributes for _, attributes in received] == [
        {"request_id": "r1", "tenant": "vision", "state": "PENDING"},
        {"request_id": "r2", "tenant": "vision", "state": "PROVISIONING"},
    ]


def test_the_event_json_is_the_public_contract() -> None:
    assert event(3, RequestState.PENDING).to_json() == {
        "schema": "opendws.event/v1",
        "request_id": "r3",
        "tenant": "vision",
        "state": "PENDING",
        "previous_state": None,
        "at": "2026-12-01T00:00:03+00:00",
        "reason": "NO_CAPACITY_UNTIL",
        "message": "waiting for 16 × nvidia-h100-80gb",
        "eta": "2026-12-01T03:00:00+00:00",
        "ready_eta": None,
        "ready_eta_p90": None,
        "position": 3,
        "pool": "us-central1-a/a3-highgpu-8g",
    }
