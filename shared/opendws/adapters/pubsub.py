"""The EventBus on Cloud Pub/Sub (google-cloud-pubsub): every event is published on
``capacity-events`` as its JSON, with ``request_id``, ``tenant`` and ``state`` as attributes."""

from __future__ import annotations

import json

from google.cloud.pubsub_v1 import PublisherClient

from opendws.ports import StatusEvent

EVENTS_TOPIC = "capacity-events"


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


REQUESTS_TOPIC = "capacity-requests"


class PubSubRequestPublisher:
    """Publishes request messages (submit, cancel, release) on ``capacity-requests``, as any
    publisher — the CLI, a CI hook — does."""

    def __init__(
        self, publisher: PublisherClient, project: str, topic: str = REQUESTS_TOPIC
    ) -> None:
        self._publisher = publisher
        self._topic = publisher.topic_path(project, topic)

    def publish(self, message: dict[str, object], timeout: float = 30.0) -> str:
        """Publish one message; returns the Pub/Sub message id once it is accepted."""
        data = json.dumps(message, separators=(",", ":")).encode()
        message_id: str = self._publisher.publish(self._topic, data).result(timeout=timeout)
        return message_id
