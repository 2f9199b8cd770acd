"""The ``intake`` function (functions-framework's test client, on the in-memory fakes): a
redelivery intake asks for by design is one WARNING line and a non-2xx answer, never an ERROR
with a traceback; a fault an operator must see still is one.

Pub/Sub redelivers a push message answered with any status but 102, 200, 201, 202 or 204
(https://cloud.google.com/pubsub/docs/push; Eventarc's Pub/Sub triggers retry as Pub/Sub does:
https://cloud.google.com/eventarc/docs/retry-events)."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from opendws import bootstrap
from opendws.adapters.memory import (
    MemoryConfigStore,
    MemoryEventBus,
    MemoryNudger,
    MemoryRequestPublisher,
    MemoryRequestStore,
)
from opendws.clock import ManualClock
from opendws.ports import Configuration, StatusEvent
from tests.builders import tenant

ROOT = Path(__file__).resolve().parents[2]
ENVELOPE = json.loads((ROOT / "tests" / "data" / "pubsub_message_published.json").read_text())
# The saved envelope's message, published when the clock below starts.
PUBLISHED = datetime.fromisoformat("2026-11-29T12:00:00.123+00:00")


class BusDownOnce(MemoryEventBus):
    """An event bus whose first publish fails (Pub/Sub unavailable for a moment)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True

    def publish(self, event: StatusEvent) -> None:
        if self.down:
            self.down = False
            raise ConnectionError("Pub/Sub unavailable")
        super().publish(event)


@pytest.fixture
def wired() -> Iterator[tuple[Any, MemoryRequestStore, ManualClock]]:
    """A test client for ``intake`` on in-memory adapters, tenant ``vision`` configured."""
    from functions_framework import create_app

    store, clock = MemoryRequestStore(), ManualClock(PUBLISHED)
    adapters = bootstrap.Adapters(
        store=store, config=MemoryConfigStore(Configuration(tenants=(tenant("vision"),))),
        events=BusDownOnce(), nudger=MemoryNudger(), publisher=MemoryRequestPublisher(),
        clock=clock,
    )  # fmt: skip
    settings = bootstrap.Settings(project="demo-opendws", metrics_export=())
    previous = bootstrap.use(bootstrap.Container(settings, adapters=adapters))
    client = create_app("intake", str(ROOT / "functions" / "main.py"), "cloudevent").test_client()
    yield client, store, clock
    bootstrap.use(previous)


def deliver(client: Any, message_id: str) -> Any:
    """The saved envelope as Eventarc delivers it from tenant vision's topic (a redelivery or
    a publisher's retry: another message id, the same request)."""
    envelope = copy.deepcopy(ENVELOPE)
    envelope["source"] = (
        "//pubsub.googleapis.com/projects/demo-opendws/topics/capacity-requests-vision"
    )
    envelope["id"] = envelope["data"]["message"]["messageId"] = message_id
    return client.post("/", json=envelope, headers={"Content-Type": "application/cloudevents+json"})


def test_a_duplicate_before_the_first_is_announced_is_one_warning_and_a_redelivery(
    wired: tuple[Any, MemoryRequestStore, ManualClock], caplog: pytest.LogCaptureFixture
) -> None:
    client, store, clock = wired
    # The first delivery stores the request, then fails to announce it: a transient fault,
    # which an operator may need to see (an ERROR, with its traceback), and Pub/Sub redelivers.
    caplog.set_level(logging.INFO)
    first = deliver(client, "1001")
    assert first.status_code == 500
    assert any(r.levelno >= logging.ERROR and r.exc_info for r in caplog.records)
    record = store.get("train-42")
    assert record is not None
    assert record.announced == 0
    # A duplicate at once: the first delivery may be announcing it right now, so intake asks
    # for a redelivery. Expected: no ERROR, no traceback, one WARNING line saying why.
    caplog.clear()
    again = deliver(client, "1002")
    assert not 200 <= again.status_code < 300
    assert again.status_code not in (102, 200, 201, 202, 204)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert [r for r in caplog.records if r.exc_info] == []
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.name == "opendws.functions"
    assert "\n" not in warning.getMessage()
    assert "train-42 is stored but not announced yet" in warning.getMessage()
    assert "1002" in warning.getMessage()
    # Redelivered later, it announces the request once.
    clock.advance(timedelta(minutes=1))
    assert deliver(client, "1002").status_code == 200
    record = store.get("train-42")
    assert record is not None
    assert record.announced == 1
