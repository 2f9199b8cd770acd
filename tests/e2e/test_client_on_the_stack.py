"""``opendws.Client`` against the local stack (``dws up``), as the README's notebook example
drives it: a request submitted from Python reaches ACTIVE with a callback per event, is
released and shows in the usage; a bad request is refused before anything is published."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from opendws import Client
from opendws.client import InvalidRequest, UnknownRequest, Waited
from opendws.domain.states import RequestState
from opendws.ports import StatusEvent
from tests.e2e.test_local_stack import stack  # noqa: F401  (the dws up fixture)

S = RequestState
H100 = {"vm_count": 2, "machine_type": "a3-highgpu-8g", "accelerator": "nvidia-h100-80gb"}


@pytest.fixture
def dws(stack: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Client:  # noqa: F811
    """A client where ``dws up`` said: its exported variables in this process's environment
    (the Google clients read the emulators' hosts from there), on the stack's project."""
    for name, value in stack.items():
        if not name.startswith("url:"):
            monkeypatch.setenv(name, value)
    return Client(project=stack["OPENDWS_PROJECT"])


def until(dws: Client, request_id: str, state: RequestState, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if dws.status(request_id).state is state:
            return
        time.sleep(0.5)
    raise AssertionError(f"{request_id} is {dws.status(request_id).state}, not {state}")


def test_the_readme_example_runs_on_the_local_stack(dws: Client) -> None:
    request_id = dws.submit(
        request_id="client-train", tenant="vision", mode="flex_start", gang=H100,
        locations=["us-central1-a"], run_duration=timedelta(hours=1), max_wait="1h",
    )  # fmt: skip
    assert request_id == "client-train"
    seen: list[StatusEvent] = []
    result = dws.wait(request_id, timeout=60, on_event=seen.append)
    assert result.outcome is Waited.ACTIVE
    assert [event.state for event in seen] == [S.PENDING, S.PROVISIONING, S.ACTIVE]
    assert [entry.request_id for entry in dws.queue()] == []
    assert any(span.request_id == request_id for spans in dws.timeline().values()
               for span in spans)  # fmt: skip

    dws.release(request_id, tenant="vision")
    until(dws, request_id, S.RELEASED)
    rows = [(row.tenant, row.accelerator, dict(row.outcomes)) for row in dws.usage("vision")]
    assert rows == [("vision", "nvidia-h100-80gb", {"RELEASED": 1})]
    # Waited on again once released: it ran, so it counts as ACTIVE (dws wait's exit 0).
    assert dws.wait(request_id, timeout=1).outcome is Waited.ACTIVE


def published_on(project: str, topic: str) -> Callable[[], list[dict[str, Any]]]:
    """Every message published on ``topic`` from now on, as far as pulled so far (a pull
    subscription of its own: Pub/Sub gives each subscription a copy of every message)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import pubsub_v1

    subscriber = pubsub_v1.SubscriberClient(credentials=AnonymousCredentials())
    name = subscriber.subscription_path(project, "e2e-client-watch")
    subscriber.create_subscription(
        request={"name": name, "topic": f"projects/{project}/topics/{topic}"}
    )
    seen: list[dict[str, Any]] = []

    def pull() -> list[dict[str, Any]]:
        reply = subscriber.pull(request={"subscription": name, "max_messages": 100}, timeout=5)
        seen.extend(json.loads(m.message.data) for m in reply.received_messages)
        if reply.received_messages:
            ack_ids = [m.ack_id for m in reply.received_messages]
            subscriber.acknowledge(request={"subscription": name, "ack_ids": ack_ids})
        return seen

    return pull


def test_a_bad_request_is_never_published(dws: Client) -> None:
    """The bad request, then a good one: the tenant's topic carries the good one only."""
    published = published_on(dws.container.settings.project, "capacity-requests-vision")
    with pytest.raises(InvalidRequest) as refused:
        dws.submit(
            request_id="client-bad", tenant="vision", mode="flex_start",
            gang={**H100, "vm_count": 0}, locations=["us-central1-a"], run_duration="1h",
        )  # fmt: skip
    assert str(refused.value) == (
        "the request is not valid: gang.vm_count: Input should be greater than or equal to 1"
    )
    dws.submit(request_id="client-good", tenant="vision", mode="flex_start", gang=H100,
               locations=["us-central1-a"], run_duration="1h")  # fmt: skip
    deadline = time.monotonic() + 30
    while not any(m["request_id"] == "client-good" for m in published()):
        assert time.monotonic() < deadline, "the good request was not seen on its topic"
    assert [m["request_id"] for m in published()] == ["client-good"]
    with pytest.raises(UnknownRequest, match="client-bad"):
        dws.status("client-bad")
