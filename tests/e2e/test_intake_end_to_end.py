"""End to end on one machine: publish on ``capacity-requests-vision`` (the tenant's own topic)
on the Pub/Sub emulator, whose push subscription (with a dead-letter policy) delivers to the
``intake`` function running under functions-framework at a path naming the topic (which
functions-framework turns into the CloudEvent's ``source``, as Eventarc sets it); the request
appears in the Firestore emulator and its event on ``capacity-events``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from emulators import Emulators
from emulators.functions import serving
from tests.pubsub import pull
from tests.unit.test_request_schema import DESIGN_EXAMPLE


@pytest.fixture
def intake_server(official_emulators: Emulators, emulator_project: str) -> Iterator[str]:
    """The intake function served by functions-framework in its own process group."""
    environment = {**official_emulators.environment(), "OPENDWS_PROJECT": emulator_project}
    with serving("intake", "cloudevent", environment) as url:
        yield url


def test_a_published_request_lands_in_firestore(intake_server: str, emulator_project: str) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore, pubsub_v1
    from google.pubsub_v1.types import DeadLetterPolicy, PushConfig

    from opendws.adapters.firestore import FirestoreConfigStore, FirestoreRequestStore
    from opendws.ports import Configuration
    from tests.builders import tenant

    credentials = AnonymousCredentials()
    client = firestore.Client(project=emulator_project, credentials=credentials)
    FirestoreConfigStore(client).save(Configuration(tenants=(tenant("vision"),)))
    publisher = pubsub_v1.PublisherClient(credentials=credentials)
    subscriber = pubsub_v1.SubscriberClient(credentials=credentials)
    requests = "capacity-requests-vision"
    topics = {
        name: publisher.topic_path(emulator_project, name)
        for name in (requests, "capacity-events", "capacity-requests-dead-letter")
    }
    for path in topics.values():
        publisher.create_topic(name=path)
    subscriber.create_subscription(
        request={
            "name": subscriber.subscription_path(emulator_project, "intake"),
            "topic": topics[requests],
            "push_config": PushConfig(
                push_endpoint=f"{intake_server.rstrip('/')}/{topics[requests]}"
            ),
            "dead_letter_policy": DeadLetterPolicy(
                dead_letter_topic=topics["capacity-requests-dead-letter"], max_delivery_attempts=5
            ),
        }
    )
    events = subscriber.subscription_path(emulator_project, "events-e2e")
    subscriber.create_subscription(request={"name": events, "topic": topics["capacity-events"]})

    publisher.publish(topics[requests], json.dumps(DESIGN_EXAMPLE).encode()).result(30)

    store = FirestoreRequestStore(client)
    deadline = time.monotonic() + 60
    record = None
    while record is None and time.monotonic() < deadline:
        record = store.get("train-42")
        time.sleep(0.2)
    assert record is not None, "the request never reached Firestore"
    assert record.state.value == "PENDING"
    assert [json.loads(m.data)["state"] for m in pull(subscriber, events, 1)] == ["PENDING"]
    subscriber.close()


def test_a_message_that_keeps_failing_goes_to_the_dead_letter_topic(
    official_emulators: Emulators, emulator_project: str
) -> None:
    """With no ``capacity-events`` topic every announcement fails (a transient fault raises, so
    Pub/Sub retries); after the policy's attempts the message lands on the dead-letter topic."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import pubsub_v1
    from google.protobuf.duration_pb2 import Duration  # type: ignore[import-untyped]
    from google.pubsub_v1.types import DeadLetterPolicy, PushConfig, RetryPolicy

    credentials = AnonymousCredentials()
    publisher = pubsub_v1.PublisherClient(credentials=credentials)
    subscriber = pubsub_v1.SubscriberClient(credentials=credentials)
    requests = publisher.topic_path(emulator_project, "capacity-requests")
    dead = publisher.topic_path(emulator_project, "capacity-requests-dead-letter")
    for path in (requests, dead):
        publisher.create_topic(name=path)
    dead_reader = subscriber.subscription_path(emulator_project, "dead-reader")
    subscriber.create_subscription(request={"name": dead_reader, "topic": dead})
    environment = {**official_emulators.environment(), "OPENDWS_PROJECT": emulator_project}
    with serving("intake", "cloudevent", environment) as url:
        subscriber.create_subscription(
            request={
                "name": subscriber.subscription_path(emulator_project, "intake"),
                "topic": requests,
                "push_config": PushConfig(push_endpoint=url),
                "dead_letter_policy": DeadLetterPolicy(
                    dead_letter_topic=dead, max_delivery_attempts=5
                ),
                "retry_policy": RetryPolicy(
                    minimum_backoff=Duration(seconds=1), maximum_backoff=Duration(seconds=1)
                ),
            }
        )
        publisher.publish(requests, json.dumps(DESIGN_EXAMPLE).encode()).result(30)
        dead_letters = pull(subscriber, dead_reader, 1, attempts=12)
    assert [json.loads(m.data)["request_id"] for m in dead_letters] == ["train-42"]
    subscriber.close()
