"""The EventBus on Cloud Pub/Sub (google-cloud-pubsub): every event is published on
``capacity-events`` as its JSON, with ``request_id``, ``tenant`` and ``state`` as attributes.

Every publish here (events, nudges, request messages) returns only once Pub/Sub has confirmed
it, within a bounded time: the client publishes from a background thread, and a function's
CPU is disabled or severely limited once it has answered (Cloud Run, "Avoid background
activities if using request-based billing": https://cloud.google.com/run/docs/tips/general),
so a message still in the client's batch when the function answers may go out late or never."""

from __future__ import annotations

import concurrent.futures
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
PUBLISH_TIMEOUT = 30.0  # seconds an event or a request message waits for Pub/Sub
NUDGE_TIMEOUT = 10.0  # seconds a nudge waits: best effort, the tick is the backstop


class PublishUnconfirmed(TimeoutError):
    """Pub/Sub did not confirm a publish in time: the message may still go out, or not."""

    def __init__(self, topic: str, timeout: float) -> None:
        self.topic = topic
        self.timeout = timeout
        super().__init__(
            f"Pub/Sub did not confirm the message on {topic!r} within {timeout:g} s"
            " (it may still be published, or not)"
        )


def confirmed(future: concurrent.futures.Future[str], topic: str, timeout: float) -> str:
    """Wait for a publish ``future`` (google-cloud-pubsub's futures are concurrent ones) and
    return its message id; :class:`PublishUnconfirmed` after ``timeout`` seconds, or what the
    publish raised."""
    try:
        return future.result(timeout=timeout)
    except concurrent.futures.TimeoutError as error:
        raise PublishUnconfirmed(topic.rpartition("/")[2], timeout) from error


class PubSubEventBus:
    """EventBus over a publisher client (the emulator when PUBSUB_EMULATOR_HOST is set)."""

    def __init__(self, publisher: PublisherClient, project: str, topic: str = EVENTS_TOPIC) -> None:
        self._publisher = publisher
        self._topic = publisher.topic_path(project, topic)

    def publish(self, event: StatusEvent, timeout: float = PUBLISH_TIMEOUT) -> None:
        data = json.dumps(event.to_json(), separators=(",", ":")).encode()
        future = self._publisher.publish(
            self._topic,
            data,
            request_id=event.request_id,
            tenant=event.tenant,
            state=event.state.value,
        )
        confirmed(future, self._topic, timeout)


TICKS_TOPIC = "reconcile-ticks"


class PubSubNudger:
    """Nudger over a publisher client: a small JSON message on ``reconcile-ticks`` (the same
    topic Cloud Scheduler ticks on; the reconciler does not read the content)."""

    def __init__(self, publisher: PublisherClient, project: str, topic: str = TICKS_TOPIC) -> None:
        self._publisher = publisher
        self._topic = publisher.topic_path(project, topic)

    def nudge(self, reason: str, timeout: float = NUDGE_TIMEOUT) -> None:
        """Send, and wait until Pub/Sub has it (see the module docstring);
        :class:`PublishUnconfirmed` after ``timeout`` seconds. A nudge is best effort: its
        callers log a failure and go on (the tick is the backstop)."""
        data = json.dumps({"nudge": reason}, separators=(",", ":")).encode()
        confirmed(self._publisher.publish(self._topic, data, kind="nudge"), self._topic, timeout)


class PubSubRequestPublisher:
    """Publishes request messages (submit, cancel, release) as their tenant's publishers do —
    the CLI, a CI hook: each on the topic of the tenant it names (``capacity-requests-{tenant}``;
    the topic is who the message speaks for), or on one fixed ``topic`` when given (the admins'
    topic, the shared one)."""

    def __init__(self, publisher: PublisherClient, project: str, topic: str | None = None) -> None:
        self._publisher = publisher
        self._project = project
        self._topic = None if topic is None else publisher.topic_path(project, topic)

    def publish(self, message: dict[str, object], timeout: float = PUBLISH_TIMEOUT) -> str:
        """Publish one message; returns the Pub/Sub message id once it is accepted
        (:class:`PublishUnconfirmed` after ``timeout`` seconds)."""
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
            message_id = confirmed(self._publisher.publish(topic, data), topic, timeout)
        except NotFound as error:
            raise UnknownTopic(topic.rpartition("/")[2]) from error
        return message_id
