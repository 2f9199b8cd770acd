"""Who may speak for a tenant, end to end on the official Pub/Sub and Firestore emulators
(``dws up``): the topic a message is published on is its tenant, never the body.

Pub/Sub does not tell a subscriber who published a message (pubsub/docs/publisher); publisher
IAM is per topic (pubsub/docs/access-control), so each tenant publishes on its own
``capacity-requests-{tenant}``. Events reach a tenant through its own subscription filtered on
the ``tenant`` attribute (pubsub/docs/subscription-message-filter) — which the official
emulator ignores, so the filter is applied here as local readers apply it
(``ports.passes_event_filter``).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from opendws.ports import event_filter, passes_event_filter, requests_topic
from tests.e2e.test_local_stack import dws, stack  # noqa: F401  (the dws up fixture)

PROJECT = "demo-opendws"
H100 = {"machine_type": "a3-highgpu-8g", "accelerator": "nvidia-h100-80gb",
        "accelerators_per_vm": 8}  # fmt: skip


class Bus:
    """Raw Pub/Sub on the stack's emulator: publish on any topic, watch every event."""

    def __init__(self, environment: dict[str, str]) -> None:
        os.environ["PUBSUB_EMULATOR_HOST"] = environment["PUBSUB_EMULATOR_HOST"]
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import pubsub_v1

        credentials = AnonymousCredentials()
        self.publisher = pubsub_v1.PublisherClient(credentials=credentials)
        self.subscriber = pubsub_v1.SubscriberClient(credentials=credentials)
        self.watch = self.subscriber.subscription_path(PROJECT, "e2e-all-events")
        self.subscriber.create_subscription(
            request={"name": self.watch, "topic": self.topic("capacity-events")}
        )
        self.events: list[tuple[dict[str, Any], dict[str, str]]] = []

    def topic(self, name: str) -> str:
        return str(self.publisher.topic_path(PROJECT, name))

    def publish(self, topic: str, message: dict[str, Any]) -> None:
        data = json.dumps({"schema": "opendws.request/v1", **message}).encode()
        self.publisher.publish(self.topic(topic), data).result(timeout=30)

    def pull(self, subscription: str) -> list[tuple[dict[str, Any], dict[str, str]]]:
        reply = self.subscriber.pull(
            request={"subscription": subscription, "max_messages": 100}, timeout=5
        )
        if reply.received_messages:
            self.subscriber.acknowledge(
                request={
                    "subscription": subscription,
                    "ack_ids": [item.ack_id for item in reply.received_messages],
                }
            )
        return [
            (json.loads(item.message.data), dict(item.message.attributes))
            for item in reply.received_messages
        ]

    def event(self, request_id: str, reason: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.events += self.pull(self.watch)
            for event, _ in self.events:
                if event.get("request_id") == request_id and event.get("reason") == reason:
                    return event
            time.sleep(0.3)
        raise AssertionError(f"no {reason} event for {request_id}")


@pytest.fixture
def bus(stack: dict[str, str]) -> Iterator[Bus]:  # noqa: F811
    before = os.environ.get("PUBSUB_EMULATOR_HOST")
    watcher = Bus(stack)
    yield watcher
    watcher.subscriber.close()
    if before is None:  # leave the process's environment as it was
        os.environ.pop("PUBSUB_EMULATOR_HOST", None)
    else:
        os.environ["PUBSUB_EMULATOR_HOST"] = before


def status(environment: dict[str, str], request_id: str) -> dict[str, Any] | None:
    result = dws(environment, "status", request_id, "--json")
    return json.loads(result.stdout) if result.returncode == 0 else None


def until(environment: dict[str, str], request_id: str, *states: str) -> dict[str, Any]:
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        found = status(environment, request_id)
        if found is not None and found["state"] in states:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{request_id} never reached {states}")


def waiting(environment: dict[str, str], request_id: str) -> dict[str, Any]:
    """The status of ``request_id`` once an event says it waits for Google's capacity."""
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        found = status(environment, request_id)
        reasons = [event.get("reason") for event in (found or {}).get("events", [])]
        if found is not None and "WAITING_FOR_CAPACITY" in reasons:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{request_id} never said it waits for capacity")


def submit(request_id: str, tenant: str) -> dict[str, Any]:
    return {"action": "submit", "request_id": request_id, "tenant": tenant,
            "mode": "flex_start", "gang": {"vm_count": 1, **H100},
            "locations": ["us-central1-a"], "run_duration": "1h", "max_wait": "1h"}  # fmt: skip


def test_a_topic_speaks_for_its_tenant_only(stack: dict[str, str], bus: Bus) -> None:  # noqa: F811
    # A submit on speech's topic claiming vision: refused, nothing stored.
    bus.publish(requests_topic("speech"), submit("forged", "vision"))
    refused = bus.event("forged", "TENANT_MISMATCH")
    assert refused["state"] == "REJECTED"
    assert status(stack, "forged") is None
    # A vision run waiting at Google (no H100 free there): cancellable, but only by vision.
    urllib.request.urlopen(
        urllib.request.Request(
            stack["OPENDWS_COMPUTE_ENDPOINT"].rstrip("/") + "/admin/stock",
            json.dumps({"zone": "us-central1-a", "shape": "a3-highgpu-8g", "units": 0}).encode(),
            {"Content-Type": "application/json"},
        ),
        timeout=10,
    )
    bus.publish(requests_topic("vision"), submit("vision-run", "vision"))
    until(stack, "vision-run", "PROVISIONING")
    # Settled: Google's first attempt found no H100 and the request says it waits (its last
    # event of its own), so any event after this one is the cross-tenant messages'.
    before = waiting(stack, "vision-run")
    cancel = {"action": "cancel", "request_id": "vision-run"}
    bus.publish(requests_topic("speech"), {**cancel, "tenant": "vision"})
    bus.event("vision-run", "TENANT_MISMATCH")
    bus.publish(requests_topic("speech"), {**cancel, "tenant": "speech"})
    bus.event("vision-run", "NOT_YOUR_REQUEST")
    after = status(stack, "vision-run")
    assert after is not None
    assert (after["state"], len(after["events"])) == (before["state"], len(before["events"]))
    bus.publish(requests_topic("vision"), {**cancel, "tenant": "vision"})
    assert until(stack, "vision-run", "CANCELLED")["state"] == "CANCELLED"


def test_a_topic_of_no_configured_tenant_is_refused(stack: dict[str, str], bus: Bus) -> None:  # noqa: F811
    """A topic someone wired to intake by mistake: its messages are refused, never taken."""
    from google.pubsub_v1.types import PushConfig

    topic = requests_topic("ghost")
    bus.publisher.create_topic(name=bus.topic(topic))
    intake = stack["url:intake"].rstrip("/")
    bus.subscriber.create_subscription(
        request={
            "name": bus.subscriber.subscription_path(PROJECT, "intake-ghost"),
            "topic": bus.topic(topic),
            "push_config": PushConfig(push_endpoint=f"{intake}/projects/{PROJECT}/topics/{topic}"),
        }
    )
    bus.publish(topic, submit("ghostly", "ghost"))
    event = bus.event("ghostly", "UNKNOWN_TOPIC")
    assert "topic of no configured tenant" in event["message"]
    assert status(stack, "ghostly") is None


def test_each_tenant_reads_only_its_own_events(stack: dict[str, str], bus: Bus) -> None:  # noqa: F811
    subscription = bus.subscriber.subscription_path(PROJECT, "capacity-events-speech")
    configured = bus.subscriber.get_subscription(request={"subscription": subscription})
    assert configured.filter == event_filter("speech")
    bus.publish(requests_topic("vision"), submit("v-1", "vision"))
    bus.publish(requests_topic("speech"), submit("s-1", "speech"))
    until(stack, "v-1", "PROVISIONING", "ACTIVE")
    until(stack, "s-1", "PROVISIONING", "ACTIVE")
    seen: list[tuple[dict[str, Any], dict[str, str]]] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(e["request_id"] == "s-1" for e, _ in seen):
        seen += bus.pull(subscription)
    # The emulator ignores the filter; applied as Pub/Sub applies it, only speech's remain.
    speech = [event for event, attributes in seen if passes_event_filter("speech", attributes)]
    assert {event["request_id"] for event in speech} >= {"s-1"}
    assert all(event["tenant"] == "speech" for event in speech)
