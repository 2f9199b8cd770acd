"""Intake over the in-memory fakes: exactly-once effect, announcements, refusals."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from opendws.adapters.memory import MemoryConfigStore, MemoryEventBus, MemoryRequestStore
from opendws.domain import RequestState
from opendws.ports import Configuration
from opendws.service.intake import (
    AnnouncementPending,
    Delivery,
    IntakeOutcome,
    IntakeService,
)
from tests.builders import NOW, tenant
from tests.unit.test_request_schema import DESIGN_EXAMPLE


@dataclass
class FixedClock:
    at: datetime = field(default=NOW)

    def now(self) -> datetime:
        return self.at


def delivery(payload: dict[str, Any] | bytes, message_id: str = "m-1") -> Delivery:
    """A message on the shared topic (no topic known), which :func:`trusting` trusts: these
    tests are about what intake does with a message's content; who may speak for which
    tenant is tests/unit/test_intake_identity.py's."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return Delivery(data=data, message_id=message_id, published_at=NOW, attributes={})


def trusting(configuration: Configuration | None = None) -> MemoryConfigStore:
    """A configuration that takes the shared topic's messages at their word (of the tenants
    these tests submit for: the design example's and "t")."""
    configuration = configuration or Configuration(tenants=(tenant("vision"), tenant("t")))
    return MemoryConfigStore(replace(configuration, shared_requests_topic=True))


@pytest.fixture
def parts() -> tuple[IntakeService, MemoryRequestStore, MemoryEventBus, FixedClock]:
    store, bus, clock = MemoryRequestStore(), MemoryEventBus(), FixedClock()
    return IntakeService(store, bus, clock, config=trusting()), store, bus, clock


Parts = tuple[IntakeService, MemoryRequestStore, MemoryEventBus, FixedClock]


def test_a_valid_request_is_stored_pending_and_announced(parts: Parts) -> None:
    service, store, bus, _ = parts
    result = service.handle(delivery(DESIGN_EXAMPLE))
    assert (result.outcome, result.request_id) == (IntakeOutcome.ACCEPTED, "train-42")
    record = store.get("train-42")
    assert record is not None
    assert (record.state, record.announced) == (RequestState.PENDING, 1)
    assert [(e.state, e.request_id, e.tenant) for e in bus.published] == [
        (RequestState.PENDING, "train-42", "vision")
    ]


def test_the_message_id_names_a_request_without_one(parts: Parts) -> None:
    service, store, _, _ = parts
    service.handle(delivery({k: v for k, v in DESIGN_EXAMPLE.items() if k != "request_id"}, "m-7"))
    assert store.get("m-7") is not None


def test_a_redelivery_changes_nothing_and_announces_nothing(parts: Parts) -> None:
    service, store, bus, _ = parts
    service.handle(delivery(DESIGN_EXAMPLE))
    again = service.handle(delivery(DESIGN_EXAMPLE, "m-2"))
    assert again.outcome is IntakeOutcome.DUPLICATE
    assert len(bus.published) == 1
    assert len(store.events("train-42")) == 1


def test_a_duplicate_of_an_unannounced_request_waits_then_announces(parts: Parts) -> None:
    service, store, bus, clock = parts

    class Down(RuntimeError):
        pass

    def broken(event: object) -> None:
        raise Down("bus unavailable")

    original = bus.publish
    bus.publish = broken  # type: ignore[method-assign]
    with pytest.raises(Down):
        service.handle(delivery(DESIGN_EXAMPLE))  # stored, not announced: Pub/Sub redelivers
    bus.publish = original  # type: ignore[method-assign]
    with pytest.raises(AnnouncementPending):
        service.handle(delivery(DESIGN_EXAMPLE))  # too soon: the first delivery may announce
    clock.at = NOW + timedelta(minutes=1)
    assert service.handle(delivery(DESIGN_EXAMPLE)).outcome is IntakeOutcome.DUPLICATE
    assert [e.state for e in bus.published] == [RequestState.PENDING]
    assert store.get("train-42").announced == 1  # type: ignore[union-attr]


def test_another_request_under_a_used_id_is_refused(parts: Parts) -> None:
    service, store, bus, _ = parts
    service.handle(delivery(DESIGN_EXAMPLE))
    other = {**DESIGN_EXAMPLE, "run_duration": "7h"}
    result = service.handle(delivery(other, "m-2"))
    assert result.outcome is IntakeOutcome.REFUSED
    last = bus.published[-1]
    assert (last.state, last.reason, last.request_id) == (
        RequestState.REJECTED,
        "ID_IN_USE",
        "train-42",
    )
    assert "request_id" in last.message
    assert store.get("train-42").request.run_duration == timedelta(hours=6)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (b"not json", "message"),
        ({**DESIGN_EXAMPLE, "tenant": None}, "tenant"),
        ({**DESIGN_EXAMPLE, "run_duration": "1m"}, "run_duration"),
        (
            {**DESIGN_EXAMPLE, "gang": {**DESIGN_EXAMPLE["gang"], "accelerator": "nvidia-k80"}},
            "gang.accelerator",
        ),
        (
            {
                **DESIGN_EXAMPLE,
                "mode": "calendar",
                "max_wait": None,
                "run_duration": "2d",
                "start_at": "2026-11-01T00:00:00Z",
            },
            "start_at",
        ),
        (
            # tpu/docs/request-using-flex-start: "You can only request Flex-start TPU v6e and
            # v5e" (catalog.tpu_mode_problem).
            {
                **DESIGN_EXAMPLE,
                "gang": {"vm_count": 1, "accelerator": "tpu-v5p", "topology": "2x2x1"},
            },
            "gang.accelerator",
        ),
    ],
    ids=[
        "not JSON",
        "no tenant",
        "too short",
        "unknown accelerator",
        "calendar start passed",
        "flex-start TPU v5p",
    ],
)
def test_bad_input_is_answered_with_a_rejected_event_naming_the_field(
    parts: Parts, payload: dict[str, Any] | bytes, field: str
) -> None:
    service, store, bus, _ = parts
    result = service.handle(delivery(payload))
    assert result.outcome is IntakeOutcome.REFUSED
    assert store.in_states(*RequestState) == []
    [event] = bus.published
    assert (event.state, event.reason) == (RequestState.REJECTED, "INVALID_REQUEST")
    assert event.message.startswith(f"{field}:") or f"; {field}:" in event.message, event.message


def test_cancel_is_refused_as_unsupported_by_an_intake_without_the_end_service(
    parts: Parts,
) -> None:
    service, _, bus, _ = parts
    message = {"schema": "opendws.request/v1", "action": "cancel", "request_id": "a", "tenant": "t"}
    assert service.handle(delivery(message)).outcome is IntakeOutcome.REFUSED
    assert bus.published[-1].reason == "UNSUPPORTED_ACTION"


def test_intake_takes_cancel_and_release_through_the_end_service() -> None:
    from opendws.ports import Configuration
    from opendws.service.timers import expiry_timer
    from tests.builders import H100, pool
    from tests.world import memory_world, tenants_for

    world, _ = memory_world(
        (pool(capacity=4),), (), timers=True,
        configuration=Configuration(pools=(pool(capacity=4),), tenants=tenants_for(H100)),
    )  # fmt: skip
    assert world.timers is not None
    service = IntakeService(
        world.store, world.bus, world.clock, config=trusting(world.config.load()),
        ending=world.ending, timers=world.timers,
    )  # fmt: skip
    submit = {**DESIGN_EXAMPLE, "tenant": "t", "locations": ["us-central1-a"]}
    assert service.handle(delivery(submit)).outcome is IntakeOutcome.ACCEPTED
    record = world.record("train-42")
    assert [t for t, _ in world.timers.armed()] == [expiry_timer(record)]
    # The same message again arms nothing new (the timer's name is already used).
    service.handle(delivery(submit, "m-2"))
    assert len(world.timers.armed()) == 1
    cancel = {"schema": "opendws.request/v1", "action": "cancel", "request_id": "train-42"}
    refused = service.handle(delivery({**cancel, "tenant": "intruder"}, "m-3"))
    assert refused.outcome is IntakeOutcome.REFUSED
    assert world.state("train-42") is RequestState.PENDING
    done = service.handle(delivery({**cancel, "tenant": "t"}, "m-4"))
    assert done.outcome is IntakeOutcome.APPLIED
    assert world.state("train-42") is RequestState.CANCELLED
    assert world.timers.armed() == []
    again = service.handle(delivery({**cancel, "tenant": "t"}, "m-4"))  # redelivered
    assert (again.outcome, again.message) == (IntakeOutcome.APPLIED, "already CANCELLED")
    release = {**cancel, "action": "release", "tenant": "t"}
    assert service.handle(delivery(release, "m-5")).outcome is IntakeOutcome.APPLIED


def test_an_accepted_request_nudges_the_reconciler_once() -> None:
    from opendws.adapters.memory import MemoryNudger

    store, bus, nudger = MemoryRequestStore(), MemoryEventBus(), MemoryNudger()
    service = IntakeService(store, bus, FixedClock(), config=trusting(), nudger=nudger)
    service.handle(delivery(DESIGN_EXAMPLE))
    service.handle(delivery(DESIGN_EXAMPLE, "m-2"))  # a redelivery: nothing new to admit
    assert nudger.reasons == ["train-42 accepted"]


def test_a_nudge_that_cannot_be_sent_loses_nothing() -> None:
    class Down:
        def nudge(self, reason: str) -> None:
            raise RuntimeError("reconcile-ticks unavailable")

    store, bus = MemoryRequestStore(), MemoryEventBus()
    result = IntakeService(store, bus, FixedClock(), config=trusting(), nudger=Down()).handle(
        delivery(DESIGN_EXAMPLE)
    )
    assert result.outcome is IntakeOutcome.ACCEPTED
    assert store.get("train-42") is not None


def test_a_submission_for_an_unknown_tenant_is_refused_naming_the_known_ones(
    parts: Parts,
) -> None:
    """Refused at intake, with nothing stored, rather than accepted and rejected a pass
    later; a tenant added to the configuration meanwhile is known at once."""
    service, store, bus, _ = parts
    result = service.handle(delivery({**DESIGN_EXAMPLE, "tenant": "speech"}))
    assert result.outcome is IntakeOutcome.REFUSED
    assert store.get("train-42") is None
    [event] = bus.published
    assert (event.state, event.reason) == (RequestState.REJECTED, "UNKNOWN_TENANT")
    assert event.message == (
        "tenant: 'speech' is not a configured tenant; the tenants are t, vision"
    )
    config = trusting(Configuration(tenants=(tenant("vision"), tenant("t"), tenant("speech"))))
    intake = IntakeService(store, bus, FixedClock(), config=config)
    intake.handle(delivery(DESIGN_EXAMPLE, "m-0"))  # the configuration is read and kept
    config.save(replace(config.load(), tenants=(*config.load().tenants, tenant("audio"))))
    added = intake.handle(delivery({**DESIGN_EXAMPLE, "request_id": "a1", "tenant": "audio"}))
    assert added.outcome is IntakeOutcome.ACCEPTED
