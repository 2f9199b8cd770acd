"""The EventBus on Cloud Pub/Sub (google-cloud-pubsub): every event is published on
``capacity-events`` as its JSON, with ``request_id``, ``tenant`` and ``state`` as attributes."""

from __future__ import annotations

import json

from google.api_core.exceptions import NotFound
from google.cloud.pubsub_v1 import PublisherClient

from opendws.ports import (
    EVENTS_TOPIC,
    SHARED_REQUESTS_TOPIC,
    StatusEvent,
    UnknownTopic,
    requests_topic,
)

REQUESTS_TOPIC = SHARED_REQUESTS_TOPIC  # the shared topic (off unless configured)


class PubSubEventBus:
    """EventBus over a publisher client (the emulator when PUBSUB_EMULATOR_HOST is set)."""

    def __init__(self, publisher: PublisherClient, project: str, topic: str = EVENTS_TOPIC) -> None:
        self._publisher = publisher
        self._topic = publisher.topic_path(project, topic)

    def publish(self, event: StatusEvent, timeout: float = 30.0) -> None:
        data = json.dumps(event.to_json(), separators=(",", ":")).encode()
        future = self._publisher.publish(
            self._topic,
            data,
            request_id=event.request_id,
            tenant=event.tenant,
            state=event.state.value,
        )
        future.result(timeout=timeout)


TICKS_TOPIC = "reconcile-ticks"


class PubSubNudger:
    """Nudger over a publisher client: a small JSON message on ``reconcile-ticks`` (the same
    topic Cloud Scheduler ticks on; the reconciler does not read the content)."""

    def __init__(self, publisher: PublisherClient, project: str, topic: str = TICKS_TOPIC) -> None:
        self._publisher = publisher
        self._topic = publisher.topic_path(project, topic)

    def nudge(self, reason: str) -> None:
        """Send without waiting for the acknowledgement: a nudge is best effort (the tick is
        the backstop), and waiting would add a round trip to every intake and release."""
        data = json.dumps({"nudge": reason}, separators=(",", ":")).encode()
        self._publisher.publish(self._topic, data, kind="nudge")


class PubSubRequestPublisher:
    """Publishes request messages (submit, cancel, release) as their tenant's publishers do —
    the CLI, a CI hook: each on the topic of the tenant it names (``capacity-requests-{tenant}``;
    the topic is who the message speaks for), or on one fixed ``topic`` when given (the admins'
    topic, the shared one)."""

    def __init__(self, publisher: PublisherClient, project: str, topic: str | None = None) -> None:
        self._publisher = publisher
        self._project = project
        self._topic = None if topic is None else publisher.topic_path(project, topic)

    def publish(self, message: dict[str, object], timeout: float = 30.0) -> str:
        """Publish one message; returns the Pub/Sub message id once it is accepted."""
        topic = self._topic
        if topic is None:
            tenant = message.get("tenant")
            if not isinstance(tenant, str) or not tenant:
                raise ValueError(
                    "tenant: a request message names its tenant, whose topic it goes on"
                )
            topic = self._publisher.topic_path(self._project, requests_topic(tenant))
        data = json.dumps(message, separators=(",", ":")).encode()
        try:
            message_id: str = self._publisher.publish(topic, data).result(timeout=timeout)
        except NotFound as error:
            raise UnknownTopic(topic.rpartition("/")[2]) from error
        return message_id
