"""The ``reconcile`` function in-process (functions-framework's test client), triggered by a
saved Eventarc Pub/Sub envelope as a tick, on Firestore and Pub/Sub over the official
emulators and the Compute Engine API over the project's emulator."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from emulators import ComputeEmulator, Emulators
from opendws.clock import ManualClock
from opendws.domain.states import RequestState
from opendws.ports import Configuration, RequestStore
from opendws.sim import SimulatedCloud
from tests.builders import A3, H100, flex, pool
from tests.pubsub import pull
from tests.world import submit, tenants_for

ROOT = Path(__file__).resolve().parents[2]
ENVELOPE = json.loads((ROOT / "tests" / "data" / "pubsub_message_published.json").read_text())
ZONE = "us-central1-a"
IDLE_ZONE = "us-central1-b"  # a configured pool no request asks for


@dataclass
class Wired:
    client: Any
    store: RequestStore
    subscriber: Any
    subscription: str


@pytest.fixture
def wired(official_emulators: Emulators, emulator_project: str) -> Iterator[Wired]:
    del official_emulators
    from functions_framework import create_app
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore, pubsub_v1

    from opendws import bootstrap
    from opendws.adapters.firestore import FirestoreConfigStore, FirestoreRequestStore

    cloud = SimulatedCloud(
        ManualClock(running=True),
        provisioning_latency=timedelta(0),
        operation_latency=timedelta(0),
    )
    cloud.set_stock(ZONE, A3, 4)
    with ComputeEmulator(cloud) as emulator:
        settings = bootstrap.Settings(
            project=emulator_project, compute_endpoint=emulator.endpoint, on_emulators=True
        )
        previous = bootstrap.use(bootstrap.Container(settings))
        publisher = pubsub_v1.PublisherClient(credentials=AnonymousCredentials())
        subscriber = pubsub_v1.SubscriberClient(credentials=AnonymousCredentials())
        topic = publisher.topic_path(emulator_project, "capacity-events")
        subscription = subscriber.subscription_path(emulator_project, "events-check")
        publisher.create_topic(name=topic)
        subscriber.create_subscription(request={"name": subscription, "topic": topic})
        db = firestore.Client(project=emulator_project, credentials=AnonymousCredentials())
        FirestoreConfigStore(db).save(
            Configuration(
                pools=(pool(zone=ZONE, capacity=4), pool(zone=IDLE_ZONE, capacity=4)),
                tenants=tenants_for(H100),
            )
        )
        client = create_app(
            "reconcile", str(ROOT / "functions" / "main.py"), "cloudevent"
        ).test_client()
        yield Wired(client, FirestoreRequestStore(db), subscriber, subscription)
        bootstrap.use(previous)
        subscriber.close()
        db.close()


def tick(client: Any, message_id: str, publish_time: str | None = None) -> Any:
    """A ``reconcile-ticks`` message pushed as Eventarc does; published when the saved
    envelope says, or at ``publish_time``."""
    envelope = copy.deepcopy(ENVELOPE)
    envelope["id"] = envelope["data"]["message"]["messageId"] = message_id
    envelope["data"]["message"]["data"] = ""  # a tick carries nothing
    if publish_time is not None:
        envelope["data"]["message"]["publishTime"] = publish_time
    return client.post("/", json=envelope, headers={"Content-Type": "application/cloudevents+json"})


def test_one_tick_admits_and_follows_the_request_up_to_active(
    wired: Wired, caplog: pytest.LogCaptureFixture
) -> None:
    now = datetime.now(UTC)
    submit(wired.store, flex("train", vm_count=2, hours=1, locations=(ZONE,), submitted_at=now))
    with caplog.at_level(logging.INFO, logger="opendws.functions"):
        assert tick(wired.client, "tick-1").status_code == 200
    passes = [
        getattr(r, "fields", {})
        for r in caplog.records
        if r.getMessage() == "reconcile pass: COMPLETED"
    ]
    # The instance's first pass observes both configured pools; its follow-up, only the pool
    # of the live order.
    observed = [(f["observed_all"], f["observed_pools"]) for f in passes[:2]]
    assert observed == [(True, 2), (False, 1)]
    # The pass admitted it; with the request provisioning, the same invocation followed up
    # a couple of seconds later and saw it ready.
    record = wired.store.get("train")
    assert record is not None
    assert (record.state, record.pool) == (RequestState.ACTIVE, f"{ZONE}/{A3}")
    received = [json.loads(m.data) for m in pull(wired.subscriber, wired.subscription, 2)]
    assert sorted((e["state"], e["reason"]) for e in received) == [
        ("ACTIVE", "READY"),
        ("PROVISIONING", "ADMITTED"),
    ]
    assert record.announced == record.events == 3
    assert tick(wired.client, "tick-2").status_code == 200  # nothing left to do: one pass
    again = wired.store.get("train")
    assert again is not None
    assert again.version == record.version


def test_follow_up_ends_when_its_time_is_up(wired: Wired) -> None:
    from opendws import bootstrap

    settings = replace(bootstrap.container().settings, reconcile_follow_up=timedelta(0))
    bootstrap.use(bootstrap.Container(settings))  # the fixture puts the previous one back
    now = datetime.now(UTC)
    submit(wired.store, flex("train", vm_count=2, hours=1, locations=(ZONE,), submitted_at=now))
    assert tick(wired.client, "tick-1").status_code == 200
    record = wired.store.get("train")
    assert record is not None
    assert record.state is RequestState.PROVISIONING  # one pass, no follow-up


def test_a_follow_up_that_stops_while_requests_move_hands_itself_on(
    wired: Wired, emulator_project: str
) -> None:
    """A nudge that a pass has served starts no pass (already_served), so the invocation that
    stops following up while requests still provision, after passes that moved some, publishes
    one nudge for a fresh invocation to follow up; one that leaves nothing provisioning hands
    nothing on."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import pubsub_v1

    from opendws import bootstrap

    publisher = pubsub_v1.PublisherClient(credentials=AnonymousCredentials())
    topic = publisher.topic_path(emulator_project, "reconcile-ticks")
    subscription = wired.subscriber.subscription_path(emulator_project, "ticks-check")
    publisher.create_topic(name=topic)
    wired.subscriber.create_subscription(request={"name": subscription, "topic": topic})
    settings = replace(bootstrap.container().settings, reconcile_follow_up=timedelta(0))
    bootstrap.use(bootstrap.Container(settings))  # the fixture puts the previous one back
    now = datetime.now(UTC)
    submit(wired.store, flex("train", vm_count=2, hours=1, locations=(ZONE,), submitted_at=now))
    assert tick(wired.client, "tick-1").status_code == 200
    (message,) = pull(wired.subscriber, subscription, 1)
    assert json.loads(message.data) == {"nudge": "follow-up: 1 provisioning"}
    record = wired.store.get("train")
    assert record is not None
    assert record.state is RequestState.PROVISIONING
    # Delivered, the nudge is no nudge a pass has served: it runs one (the request is served
    # by the cloud by then), which leaves nothing provisioning and hands nothing on.
    published = message.publish_time.isoformat().replace("+00:00", "Z")
    assert tick(wired.client, "follow-up-1", published).status_code == 200
    record = wired.store.get("train")
    assert record is not None
    assert record.state is RequestState.ACTIVE
    assert pull(wired.subscriber, subscription, 1, attempts=2) == []
