"""The RequestPublisher contract, on the in-memory fake and on Pub/Sub over the official
emulator: a message goes on its tenant's topic, and a tenant whose topic does not exist is
refused with :class:`~opendws.ports.UnknownTopic` naming the topic (Pub/Sub answers a publish
to a missing topic with NOT_FOUND: pubsub/docs/reference/error-codes), not with the
transport's own error."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from opendws.adapters.memory import MemoryRequestPublisher
from opendws.ports import RequestPublisher, UnknownTopic, requests_topic
from tests.pubsub import pull

MESSAGE: dict[str, object] = {
    "schema": "opendws.request/v1", "action": "cancel", "request_id": "train", "tenant": "vision",
}  # fmt: skip


@pytest.fixture(params=["memory", "pubsub"])
def publisher(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[RequestPublisher, Callable[[], list[dict[str, object]]]]]:
    """A publisher where only vision's topic exists, and a reader of what reached it."""
    if request.param == "memory":
        memory = MemoryRequestPublisher(existing=[requests_topic("vision")])
        yield memory, lambda: list(memory.messages)
        return
    project: str = request.getfixturevalue("emulator_project")
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import pubsub_v1

    from opendws.adapters.pubsub import PubSubRequestPublisher

    client = pubsub_v1.PublisherClient(credentials=AnonymousCredentials())
    subscriber = pubsub_v1.SubscriberClient(credentials=AnonymousCredentials())
    topic = client.topic_path(project, requests_topic("vision"))
    subscription = subscriber.subscription_path(project, "vision-reader")
    client.create_topic(name=topic)
    subscriber.create_subscription(request={"name": subscription, "topic": topic})

    def read() -> list[dict[str, object]]:
        return [json.loads(message.data) for message in pull(subscriber, subscription, 1)]

    yield PubSubRequestPublisher(client, project), read
    subscriber.close()


def test_a_message_goes_on_its_tenants_topic(
    publisher: tuple[RequestPublisher, Callable[[], list[dict[str, object]]]],
) -> None:
    sender, read = publisher
    assert sender.publish(MESSAGE)
    assert read() == [MESSAGE]


def test_a_tenant_without_a_topic_is_refused_naming_it(
    publisher: tuple[RequestPublisher, Callable[[], list[dict[str, object]]]],
) -> None:
    sender, _ = publisher
    with pytest.raises(UnknownTopic, match="capacity-requests-nobody") as refused:
        sender.publish({**MESSAGE, "tenant": "nobody"})
    assert refused.value.topic == "capacity-requests-nobody"
