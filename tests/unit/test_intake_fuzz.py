"""Malformed messages through the intake function (decoding included): never an error status,
never a stored request, always a REJECTED event naming a field."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opendws.adapters.memory import (
    MemoryConfigStore,
    MemoryEventBus,
    MemoryNudger,
    MemoryRequestPublisher,
    MemoryRequestStore,
)
from opendws.domain import RequestState
from opendws.ports import Configuration
from tests.unit.test_intake_service import FixedClock
from tests.unit.test_request_schema import DESIGN_EXAMPLE

ROOT = Path(__file__).resolve().parents[2]
ENVELOPE = json.loads((ROOT / "tests" / "data" / "pubsub_message_published.json").read_text())
FIELDS = sorted(DESIGN_EXAMPLE)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def malformed(draw: st.DrawFn) -> bytes:
    """Bytes that are not a valid request: garbage, or the design's example with one field
    removed, retyped or added."""
    kind = draw(st.sampled_from(["bytes", "json", "drop", "retype", "extra", "gang"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "json":
        return json.dumps(draw(JSON_VALUES)).encode()
    message: dict[str, Any] = copy.deepcopy(DESIGN_EXAMPLE)
    if kind == "drop":
        del message[
            draw(
                st.sampled_from(
                    ["schema", "action", "tenant", "mode", "gang", "locations", "run_duration"]
                )
            )
        ]
    elif kind == "retype":
        field = draw(st.sampled_from(FIELDS))
        value = draw(JSON_VALUES.filter(lambda v: type(v) is not type(DESIGN_EXAMPLE[field])))
        message[field] = value
    elif kind == "extra":
        message[
            draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in DESIGN_EXAMPLE))
        ] = draw(JSON_VALUES)
    else:
        message["gang"][
            draw(st.sampled_from(["vm_count", "accelerator", "machine_type", "topology"]))
        ] = draw(JSON_VALUES)
    return json.dumps(message).encode()


@pytest.fixture(scope="module")
def wired() -> Any:
    from functions_framework import create_app

    from opendws import bootstrap

    store, bus = MemoryRequestStore(), MemoryEventBus()
    # The shared topic, trusted: the fuzz is about content, not who may speak for whom.
    config = MemoryConfigStore(Configuration(shared_requests_topic=True))
    adapters = bootstrap.Adapters(
        store=store, config=config, events=bus, nudger=MemoryNudger(),
        publisher=MemoryRequestPublisher(), clock=FixedClock(),
    )  # fmt: skip
    container = bootstrap.Container(bootstrap.Settings(project="fuzz"), adapters=adapters)
    previous = bootstrap.use(container)
    import sys

    sys.modules.pop("main", None)
    client = create_app("intake", str(ROOT / "functions" / "main.py"), "cloudevent").test_client()
    try:
        yield client, store, bus
    finally:
        bootstrap.use(previous)
        sys.modules.pop("main", None)


def claimed_id(payload: bytes, envelope: dict[str, Any]) -> str:
    """The id a valid request is stored under: its request_id, or without one (null or
    empty) the Pub/Sub message's id."""
    claimed = json.loads(payload).get("request_id")
    return (
        claimed
        if isinstance(claimed, str) and claimed
        else envelope["data"]["message"]["messageId"]
    )


@settings(
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(payload=malformed())
def test_malformed_payloads_are_rejected_with_a_field_named(wired: Any, payload: bytes) -> None:
    client, store, bus = wired
    before = len(bus.published)
    envelope = copy.deepcopy(ENVELOPE)
    envelope["data"]["message"]["data"] = base64.b64encode(payload).decode()
    response = client.post(
        "/", json=envelope, headers={"Content-Type": "application/cloudevents+json"}
    )
    assert response.status_code == 200
    new = bus.published[before:]
    if not new:  # a mutation can still be a valid request stored before: a duplicate
        assert store.get(claimed_id(payload, envelope)) is not None
        return
    [event] = new
    if event.state is RequestState.PENDING:
        return  # the mutation happened to be a valid, new request
    assert event.state is RequestState.REJECTED
    field, separator, rule = event.message.partition(": ")  # "<field>: <rule>; ..."
    assert separator, event.message
    assert field, event.message
    assert rule, event.message
