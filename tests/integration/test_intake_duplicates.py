"""Fifty concurrent deliveries of one request, on Firestore and Pub/Sub over the official
emulators: one document, one stored event, one announcement."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

from emulators import Emulators
from opendws.adapters.memory import MemoryConfigStore
from opendws.ports import Configuration, EventBus, StatusEvent, requests_topic
from opendws.service.intake import AnnouncementPending, Delivery, IntakeOutcome, IntakeService
from tests.builders import NOW, tenant
from tests.pubsub import pull
from tests.unit.test_intake_service import FixedClock
from tests.unit.test_request_schema import DESIGN_EXAMPLE


def test_fifty_concurrent_duplicates_make_one_request_and_one_event(
    official_emulators: Emulators, emulator_project: str
) -> None:
    del official_emulators
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore, pubsub_v1

    from opendws.adapters.firestore import FirestoreRequestStore
    from opendws.adapters.pubsub import PubSubEventBus

    credentials = AnonymousCredentials()
    publisher = pubsub_v1.PublisherClient(credentials=credentials)
    subscriber = pubsub_v1.SubscriberClient(credentials=credentials)
    topic = publisher.topic_path(emulator_project, "capacity-events")
    subscription = subscriber.subscription_path(emulator_project, "events-count")
    publisher.create_topic(name=topic)
    subscriber.create_subscription(request={"name": subscription, "topic": topic})
    store = FirestoreRequestStore(
        firestore.Client(project=emulator_project, credentials=credentials)
    )
    config = MemoryConfigStore(Configuration(tenants=(tenant("vision"),)))
    bus = CountingBus(PubSubEventBus(publisher, emulator_project))
    service = IntakeService(store, bus, FixedClock(), config=config)
    data = json.dumps(DESIGN_EXAMPLE).encode()
    pending = threading.Semaphore(0)

    def deliver(index: int) -> IntakeOutcome | None:
        delivery = Delivery(
            data=data, message_id=f"m-{index}", published_at=NOW, attributes={},
            topic=requests_topic("vision"),
        )  # fmt: skip
        try:
            return service.handle(delivery).outcome
        except AnnouncementPending:
            pending.release()  # Pub/Sub would redeliver this one later
            return None

    with ThreadPoolExecutor(max_workers=16) as pool:
        outcomes = list(pool.map(deliver, range(50)))
    assert outcomes.count(IntakeOutcome.ACCEPTED) == 1
    assert set(outcomes) <= {IntakeOutcome.ACCEPTED, IntakeOutcome.DUPLICATE, None}
    # The redeliveries of those handed back now find the request announced.
    while pending.acquire(blocking=False):
        assert deliver(99) is IntakeOutcome.DUPLICATE
    record = store.get("train-42")
    assert record is not None
    assert record.announced == 1
    assert len(store.events("train-42")) == 1
    # One announcement was accepted by Pub/Sub (every publish returns once it is: no later one
    # can still be on its way), and it is the one a subscriber receives.
    assert bus.accepted == 1
    received = [json.loads(message.data) for message in pull(subscriber, subscription, 1)]
    assert [(e["state"], e["request_id"]) for e in received] == [("PENDING", "train-42")]
    subscriber.close()


class CountingBus:
    """An event bus that counts the events Pub/Sub accepted (publish returned)."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self._lock = threading.Lock()
        self.accepted = 0

    def publish(self, event: StatusEvent) -> None:
        self._bus.publish(event)
        with self._lock:
            self.accepted += 1
