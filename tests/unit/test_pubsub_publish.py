"""Every Pub/Sub publish (events, nudges, request messages) returns only once Pub/Sub has
confirmed it, and gives up after a bounded time with an error naming the topic.

The client publishes from a background thread; once a function has answered, its CPU is
"disabled or severely limited" and Google asks to "make sure all asynchronous operations
finish before you deliver your response" (https://cloud.google.com/run/docs/tips/general,
"Avoid background activities if using request-based billing"). A publisher whose future
completes late stands for Pub/Sub here: the real client's futures are
``concurrent.futures.Future`` subclasses (google-cloud-pubsub ``publisher/futures.py``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from google.cloud.pubsub_v1.publisher.futures import Future

from opendws.adapters.pubsub import (
    PublishUnconfirmed,
    PubSubEventBus,
    PubSubNudger,
    PubSubRequestPublisher,
)
from opendws.domain import RequestState
from opendws.ports import StatusEvent
from tests.builders import NOW

LATE = 0.3  # seconds until the late publisher's futures complete


class LatePublisher:
    """A publisher client whose publishes Pub/Sub confirms ``delay`` seconds later (never, for
    None); it keeps every future it returned."""

    def __init__(self, delay: float | None) -> None:
        self._delay = delay
        self.futures: list[Future] = []
        self.topics: list[str] = []

    def topic_path(self, project: str, topic: str) -> str:
        return f"projects/{project}/topics/{topic}"

    def publish(self, topic: str, data: bytes, **attributes: str) -> Future:
        future = Future()
        self.futures.append(future)
        self.topics.append(topic)
        if self._delay is not None:
            message_id = str(len(self.futures))
            timer = threading.Timer(self._delay, future.set_result, (message_id,))
            timer.daemon = True
            timer.start()
        return future


def event() -> StatusEvent:
    return StatusEvent(
        request_id="train", tenant="vision", state=RequestState.PENDING, previous_state=None,
        at=NOW, reason="", message="accepted",
    )  # fmt: skip


WAYS = {  # how each adapter publishes → the topic it publishes on
    "event": "capacity-events",
    "nudge": "reconcile-ticks",
    "request": "capacity-requests-vision",
}


def publish(way: str, publisher: LatePublisher, **timeout: float) -> None:
    """Publish once through the adapter named ``way`` (``timeout``: its own by default)."""
    client: Any = publisher  # stands for google-cloud-pubsub's PublisherClient
    match way:
        case "event":
            PubSubEventBus(client, "p").publish(event(), **timeout)
        case "nudge":
            PubSubNudger(client, "p").nudge("train accepted", **timeout)
        case "request":
            message: dict[str, object] = {
                "action": "release",
                "request_id": "train",
                "tenant": "vision",
            }
            assert PubSubRequestPublisher(client, "p").publish(message, **timeout) == "1"


def test_a_nudge_returns_only_once_pubsub_has_confirmed_it() -> None:
    publisher = LatePublisher(LATE)
    started = time.monotonic()
    publish("nudge", publisher)
    [future] = publisher.futures
    assert future.done(), "the nudge returned before Pub/Sub confirmed it"
    assert time.monotonic() - started >= LATE


@pytest.mark.parametrize("way", sorted(WAYS))
def test_every_publish_returns_only_once_pubsub_has_confirmed_it(way: str) -> None:
    publisher = LatePublisher(LATE)
    publish(way, publisher)
    [future] = publisher.futures
    assert future.done(), f"the {way} publish returned before Pub/Sub confirmed it"
    assert publisher.topics == [f"projects/p/topics/{WAYS[way]}"]


@pytest.mark.parametrize("way", sorted(WAYS))
def test_a_publish_pubsub_never_confirms_fails_in_bounded_time_naming_its_topic(
    way: str,
) -> None:
    publisher = LatePublisher(None)
    started = time.monotonic()
    with pytest.raises(PublishUnconfirmed, match=rf"'{WAYS[way]}' within 0\.2 s") as raised:
        publish(way, publisher, timeout=0.2)
    assert raised.value.topic == WAYS[way]
    assert time.monotonic() - started < 5
