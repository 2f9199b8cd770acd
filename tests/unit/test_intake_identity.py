"""Who a request message speaks for: the topic it arrived on, never its body.

Pub/Sub does not tell a subscriber who published a message (pubsub/docs/publisher: a message
carries data, attributes, an id and a publish time), so a claimed ``tenant`` cannot be checked
after the fact; a topic's publisher IAM (pubsub/docs/access-control, roles/pubsub.publisher per
topic) says who may publish there. Each tenant publishes on ``capacity-requests-{tenant}``,
the admins on ``capacity-admin-requests``; the shared ``capacity-requests`` trusts every
publisher and is heard only when the configuration says so.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from opendws.adapters.memory import MemoryRequestPublisher
from opendws.ports import (
    ADMIN_REQUESTS_TOPIC,
    SHARED_REQUESTS_TOPIC,
    Configuration,
    Speaker,
    event_filter,
    identity_of_topic,
    passes_event_filter,
    requests_topic,
    topic_of_source,
)
from opendws.service.intake import CONFIG_TTL, Delivery, IntakeOutcome, IntakeService
from tests.builders import H100, NOW, pool
from tests.unit.test_request_schema import DESIGN_EXAMPLE
from tests.world import World, memory_world, tenants_for

VISION, SPEECH = "vision", "speech"


@pytest.fixture
def world() -> World:
    configuration = Configuration(
        pools=(pool(capacity=4),), tenants=tenants_for(H100, names=(VISION, SPEECH))
    )
    built, cloud = memory_world((), (), timers=True, configuration=configuration)
    cloud.set_stock("us-central1-a", "a3-highgpu-8g", 4)
    return built


def intake(world: World) -> IntakeService:
    return IntakeService(
        world.store, world.bus, world.clock, config=world.config, ending=world.ending
    )


def on(topic: str | None, message: dict[str, Any], number: int = 1) -> Delivery:
    return Delivery(
        data=json.dumps({"schema": "opendws.request/v1", **message}).encode(),
        message_id=f"m-{number}", published_at=NOW, attributes={}, topic=topic,
    )  # fmt: skip


def submit(tenant: str, request_id: str = "train-42") -> dict[str, Any]:
    return {**DESIGN_EXAMPLE, "request_id": request_id, "tenant": tenant,
            "locations": ["us-central1-a"]}  # fmt: skip


def test_a_tenant_submits_on_its_own_topic(world: World) -> None:
    result = intake(world).handle(on(requests_topic(VISION), submit(VISION)))
    assert result.outcome is IntakeOutcome.ACCEPTED
    assert world.record("train-42").tenant == VISION


def test_a_body_claiming_another_tenant_is_refused_and_nothing_is_stored(world: World) -> None:
    result = intake(world).handle(on(requests_topic(SPEECH), submit(VISION)))
    assert result.outcome is IntakeOutcome.REFUSED
    assert world.store.get("train-42") is None
    event = world.bus.published[-1]
    assert (event.reason, event.tenant) == ("TENANT_MISMATCH", SPEECH)
    assert "'vision' is not the tenant of topic 'capacity-requests-speech'" in event.message


def test_a_cancel_of_another_tenants_request_on_your_own_topic_is_refused(world: World) -> None:
    service = intake(world)
    service.handle(on(requests_topic(VISION), submit(VISION)))
    world.run()
    before = world.record("train-42")
    # speech claims vision in its body: refused at the topic.
    claimed = service.handle(
        on(requests_topic(SPEECH), {"action": "cancel", "request_id": "train-42",
                                    "tenant": VISION}, 2)
    )  # fmt: skip
    assert (claimed.outcome, world.bus.published[-1].reason) == (
        IntakeOutcome.REFUSED, "TENANT_MISMATCH",
    )  # fmt: skip
    # speech as itself: not its request.
    honest = service.handle(
        on(requests_topic(SPEECH), {"action": "cancel", "request_id": "train-42",
                                    "tenant": SPEECH}, 3)
    )  # fmt: skip
    assert (honest.outcome, world.bus.published[-1].reason) == (
        IntakeOutcome.REFUSED, "NOT_YOUR_REQUEST",
    )  # fmt: skip
    after = world.record("train-42")
    assert (after.state, after.version) == (before.state, before.version)
    mine = service.handle(
        on(requests_topic(VISION), {"action": "cancel", "request_id": "train-42",
                                    "tenant": VISION}, 4)
    )  # fmt: skip
    assert mine.outcome is IntakeOutcome.APPLIED
    assert world.record("train-42").state.value == "CANCELLED"


def test_the_admins_topic_acts_for_any_tenant(world: World) -> None:
    service = intake(world)
    assert service.handle(on(ADMIN_REQUESTS_TOPIC, submit(VISION))).outcome is (
        IntakeOutcome.ACCEPTED
    )
    cancel = {"action": "cancel", "request_id": "train-42", "tenant": SPEECH}
    assert service.handle(on(ADMIN_REQUESTS_TOPIC, cancel, 2)).outcome is IntakeOutcome.APPLIED
    assert world.record("train-42").state.value == "CANCELLED"
    assert world.store.events("train-42")[-1].message == "cancelled by an admin"


def test_the_shared_topic_is_not_heard_unless_the_configuration_trusts_it(world: World) -> None:
    assert Configuration().shared_requests_topic is False  # off by default
    service = intake(world)
    for topic in (SHARED_REQUESTS_TOPIC, None):
        result = service.handle(on(topic, submit(VISION)))
        assert result.outcome is IntakeOutcome.REFUSED
        assert world.bus.published[-1].reason == "UNTRUSTED_TOPIC"
        assert "publish on your tenant's topic" in result.message
    assert world.store.get("train-42") is None
    world.config.save(replace(world.config.load(), shared_requests_topic=True))
    world.clock.advance(CONFIG_TTL)
    assert service.handle(on(SHARED_REQUESTS_TOPIC, submit(VISION))).outcome is (
        IntakeOutcome.ACCEPTED
    )


def test_a_topic_of_no_configured_tenant_is_refused_never_accepted(world: World) -> None:
    for topic in (requests_topic("ghost"), "some-other-topic"):
        result = intake(world).handle(on(topic, submit("ghost")))
        assert result.outcome is IntakeOutcome.REFUSED
        assert world.bus.published[-1].reason == "UNKNOWN_TOPIC"
    assert world.store.get("train-42") is None


def test_a_tenant_just_added_is_heard_at_once_despite_the_cached_configuration(
    world: World,
) -> None:
    service = intake(world)
    service.handle(on(requests_topic(VISION), submit(VISION, "first")))  # caches the config
    configuration = world.config.load()
    world.config.save(
        replace(configuration, tenants=(*configuration.tenants, *tenants_for(H100, names=("nlp",))))
    )
    world.clock.advance(timedelta(seconds=1))  # well within CONFIG_TTL
    assert service.handle(on(requests_topic("nlp"), submit("nlp", "second"), 2)).outcome is (
        IntakeOutcome.ACCEPTED
    )


def test_topic_names_and_sources() -> None:
    """Eventarc's Pub/Sub CloudEvents carry ``source`` =
    ``//pubsub.googleapis.com/projects/P/topics/T`` (eventarc/docs/cloudevents)."""
    assert requests_topic(VISION) == "capacity-requests-vision"
    assert topic_of_source(
        "//pubsub.googleapis.com/projects/p/topics/capacity-requests-vision"
    ) == ("capacity-requests-vision")
    assert topic_of_source("//pubsub.googleapis.com/projects/p/subscriptions/intake") is None
    assert topic_of_source("") is None
    tenants = [VISION, SPEECH]
    assert identity_of_topic(requests_topic(VISION), tenants, shared_trusted=False).tenant == VISION
    assert identity_of_topic(ADMIN_REQUESTS_TOPIC, tenants, shared_trusted=False).speaker is (
        Speaker.ADMIN
    )
    assert identity_of_topic(None, tenants, shared_trusted=True).speaker is Speaker.SHARED


def test_the_event_filter_lets_through_only_the_tenants_events() -> None:
    """pubsub/docs/subscription-message-filter: ``attributes.KEY = "VALUE"``."""
    assert event_filter(VISION) == 'attributes.tenant = "vision"'
    assert passes_event_filter(VISION, {"tenant": VISION, "state": "PENDING"})
    assert not passes_event_filter(VISION, {"tenant": SPEECH})
    assert not passes_event_filter(VISION, {})


def test_the_publisher_puts_each_message_on_its_tenants_topic() -> None:
    publisher = MemoryRequestPublisher()
    publisher.publish({"action": "release", "request_id": "r", "tenant": SPEECH})
    assert publisher.topics == ["capacity-requests-speech"]
    with pytest.raises(ValueError, match="names its tenant"):
        publisher.publish({"action": "release", "request_id": "r"})
