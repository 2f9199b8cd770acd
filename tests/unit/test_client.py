"""``opendws.Client`` on the in-memory adapters: a request is checked before it is published
(a bad one publishes nothing and names its field), ``wait`` calls back once per event, oldest
first, and ends as ``dws wait`` does (ACTIVE, ended without running, timed out), a booked
block Google would keep is refused before any cancel is published, and the views return the
services' own values."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import opendws
from opendws import bootstrap
from opendws.adapters.memory import (
    MemoryConfigStore,
    MemoryEventBus,
    MemoryNudger,
    MemoryRequestPublisher,
    MemoryRequestStore,
)
from opendws.client import (
    Client,
    ClientError,
    InvalidRequest,
    NotCancellable,
    UnknownRequest,
    Waited,
    for_project,
)
from opendws.clock import ManualClock
from opendws.domain.model import CapacityRequest
from opendws.domain.states import RequestState
from opendws.ports import Change, Configuration, StatusEvent, accepted
from opendws.schema.request import Submit, parse_message, to_capacity_request
from opendws.service.api import ApiService, key_digest
from opendws.service.queries import QueueEntry
from opendws.service.usage import UsageRow, usage_of
from tests.builders import A3, DAY, HOUR, NOW, ZONE, calendar, flex

S = RequestState
ROOT = Path(__file__).resolve().parents[2]
TRAIN = {
    "request_id": "train", "tenant": "vision", "mode": "flex_start",
    "gang": {"vm_count": 2, "machine_type": A3, "accelerator": "nvidia-h100-80gb"},
    "locations": [ZONE], "run_duration": "6h",
}  # fmt: skip


class System:
    """A client on memory adapters, and those adapters."""

    def __init__(self, existing_topics: list[str] | None = None) -> None:
        self.clock = ManualClock(NOW)
        self.store = MemoryRequestStore()
        self.publisher = MemoryRequestPublisher(existing_topics)
        adapters = bootstrap.Adapters(
            store=self.store, config=MemoryConfigStore(Configuration()), events=MemoryEventBus(),
            nudger=MemoryNudger(), publisher=self.publisher, clock=self.clock,
        )  # fmt: skip
        container = bootstrap.Container(
            bootstrap.Settings(project="client-test"), adapters=adapters
        )
        self.client = Client(container=container)

    def stored(self, request: CapacityRequest) -> None:
        record, event = accepted(request, self.clock.now())
        self.store.create(record, event)

    def move(self, request_id: str, state: RequestState, **fields: object) -> StatusEvent:
        """Move the stored request to ``state`` now (a final state with its usage entry)."""
        record = self.store.get(request_id)
        assert record is not None
        now = self.clock.now()
        event = StatusEvent(
            request_id=request_id, tenant=record.tenant, state=state,
            previous_state=record.state, at=now, message=f"now {state}",
        )  # fmt: skip
        usage = usage_of(record, state, now, Configuration()) if state.is_final else None
        self.store.change(request_id, Change(
            expected_version=record.version, state=state, event=event, usage=usage,
            **fields,  # type: ignore[arg-type]  # the test's own Change fields
        ))  # fmt: skip
        return event


@pytest.fixture
def system() -> System:
    return System()


# submit -----------------------------------------------------------------------------------------


def test_a_request_from_a_mapping_is_published_on_its_tenants_topic(system: System) -> None:
    assert system.client.submit(TRAIN) == "train"
    (message,) = system.publisher.messages
    assert message == {"schema": "opendws.request/v1", "action": "submit", **TRAIN}
    assert system.publisher.topics == ["capacity-requests-vision"]


def test_a_file_a_mapping_and_keywords_combine_the_later_winning(
    system: System, tmp_path: Path
) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(
        "tenant: vision\nmode: flex_start\nrun_duration: 1h\nlocations: [us-central1-a]\n"
        "gang: {vm_count: 1, machine_type: a3-highgpu-8g, accelerator: nvidia-h100-80gb}\n"
    )
    request_id = system.client.submit(
        {"run_duration": "2h", "priority": 5}, file=path, run_duration=timedelta(hours=3)
    )
    assert request_id == "1"  # no request_id: the message id, which intake takes for it
    (message,) = system.publisher.messages
    assert (message["run_duration"], message["priority"], message["tenant"]) == ("3h", 5, "vision")


def test_times_and_durations_may_be_python_values(system: System) -> None:
    start = NOW + 10 * DAY
    system.client.submit(
        {**TRAIN, "mode": "calendar", "request_id": "block"},
        start_at=start, run_duration=timedelta(days=2), locations=(ZONE,),
    )  # fmt: skip
    (message,) = system.publisher.messages
    assert (message["start_at"], message["run_duration"], message["locations"]) == (
        start.isoformat(), "2d", [ZONE],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("change", "field"),
    [
        pytest.param(
            {"gang": {"machine_type": A3, "accelerator": "nvidia-h100-80gb"}},
            "gang.vm_count",
            id="schema-missing-field",
        ),
        pytest.param({"gpus": 8}, "gpus", id="schema-unknown-field"),
        pytest.param({"run_duration": "5m"}, "run_duration", id="mode-rule"),
        pytest.param(
            {"mode": "calendar", "start_at": (NOW - HOUR).isoformat()},
            "start_at",
            id="start-in-the-past",
        ),
        pytest.param({"action": "cancel"}, "action", id="not-a-submission"),
    ],
)
def test_a_bad_request_names_its_field_and_publishes_nothing(
    system: System, change: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        system.client.submit(TRAIN, **change)
    assert field in [name for name, _ in refused.value.problems]
    assert str(refused.value).startswith(f"the request is not valid: {field}: ")
    assert system.publisher.messages == []


def test_a_different_request_under_a_used_id_is_refused_and_the_same_one_is_a_retry(
    system: System,
) -> None:
    """Intake would refuse it (ID_IN_USE) in an event on no stored request, leaving the
    stored one as it was for ``status`` and ``wait`` to report as if it were the new one; the
    same request again is a retry, which intake takes as a duplicate."""
    message = parse_message({"schema": "opendws.request/v1", "action": "submit", **TRAIN})
    assert isinstance(message, Submit)
    system.stored(to_capacity_request(message, default_request_id="x", submitted_at=NOW))
    with pytest.raises(InvalidRequest, match="request_id: 'train' is already used by a diff"):
        system.client.submit(TRAIN, run_duration="2h")
    assert system.publisher.messages == []
    assert system.client.submit(TRAIN) == "train"  # the same request: published again
    assert len(system.publisher.messages) == 1


def test_a_missing_or_shapeless_file_is_refused_by_name(system: System, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="no such file; check the path"):
        system.client.submit(file=tmp_path / "missing.yaml")
    listed = tmp_path / "list.yaml"
    listed.write_text("- tenant: vision\n")
    with pytest.raises(InvalidRequest, match="a request is a mapping of fields"):
        system.client.submit(file=listed)
    assert system.publisher.messages == []


# status and wait --------------------------------------------------------------------------------


def test_status_is_the_record_its_events_and_its_json(system: System) -> None:
    system.stored(flex("train", tenant="vision"))
    eta = NOW + 2 * HOUR
    system.move("train", S.PENDING, reason="NO_CAPACITY_UNTIL", pool=f"{ZONE}/{A3}", eta=eta,
                position=1)  # fmt: skip
    shown = system.client.status("train")
    assert (shown.state, shown.tenant, shown.eta, shown.position, shown.reason) == (
        S.PENDING, "vision", eta, 1, "NO_CAPACITY_UNTIL",
    )  # fmt: skip
    assert [event.state for event in shown.events] == [S.PENDING, S.PENDING]
    assert shown.to_json()["eta"] == eta.isoformat(timespec="seconds")
    with pytest.raises(UnknownRequest, match="no request 'nothing'"):
        system.client.status("nothing")


def test_status_json_has_the_fields_of_the_apis_request(system: System) -> None:
    """``dws status --json`` and ``GET /requests/{id}`` describe a request with the same
    fields: a script moving from one to the other finds tenant, pool, position and reason."""
    system.stored(flex("train", tenant="vision"))
    system.move("train", S.PENDING, reason="NO_CAPACITY_UNTIL", pool=f"{ZONE}/{A3}",
                eta=NOW + 2 * HOUR, position=1, message="waiting")  # fmt: skip
    container = system.client.container
    api = ApiService(
        system.store, container.queries, container.usage, lambda: container.end, system.clock,
        {key_digest("admin-key"): "admin"},
    )  # fmt: skip
    answer = api.handle("GET", "/requests/train", {"Authorization": "Bearer admin-key"})
    assert isinstance(answer.body, dict)
    shown = system.client.status("train").to_json()
    assert set(shown) == set(answer.body)
    times = ("eta", "ready_eta", "ready_eta_p90", "events")  # the client's are to the second
    assert {k: v for k, v in shown.items() if k not in times} == {
        k: v for k, v in answer.body.items() if k not in times
    }
    assert (shown["tenant"], shown["pool"], shown["position"], shown["reason"]) == (
        "vision", f"{ZONE}/{A3}", 1, "NO_CAPACITY_UNTIL",
    )  # fmt: skip


@pytest.mark.parametrize("request_id", ["", "a/b", "-x", "x" * 129])
def test_an_id_no_request_can_have_is_unknown_at_once(system: System, request_id: str) -> None:
    """Asked as is, the store would fail on it (Firestore: a "/" is a path, "" no document);
    wait would wait its whole timeout for a request that can never come."""
    with pytest.raises(UnknownRequest, match=r"no request can have the id .*: ids are letters"):
        system.client.status(request_id)
    started = time.monotonic()
    with pytest.raises(UnknownRequest, match="no request can have the id"):
        system.client.wait(request_id, timeout=5)
    assert time.monotonic() - started < 1


def test_wait_calls_back_once_per_event_oldest_first_then_returns_active(
    system: System,
) -> None:
    system.stored(flex("train"))
    seen: list[RequestState] = []

    def provision_later() -> None:
        time.sleep(0.05)
        system.move("train", S.PROVISIONING)
        time.sleep(0.05)
        system.move("train", S.ACTIVE)

    mover = threading.Thread(target=provision_later)
    mover.start()
    result = system.client.wait(
        "train", timeout=10, on_event=lambda e: seen.append(e.state), poll=0.01
    )
    mover.join()
    assert result.outcome is Waited.ACTIVE
    assert result.state is S.ACTIVE
    assert seen == [S.PENDING, S.PROVISIONING, S.ACTIVE]
    assert [event.state for event in result.events] == seen


def test_wait_sees_the_event_of_a_state_that_lands_between_its_two_reads(
    system: System,
) -> None:
    """The request goes ACTIVE right after the client read its events: the state it returns
    comes with its event (on_event and the result), never without."""
    system.stored(flex("train"))
    system.move("train", S.PROVISIONING)
    events = system.store.events

    def events_then_active(request_id: str) -> list[StatusEvent]:
        read = events(request_id)
        if system.store.get(request_id).state is S.PROVISIONING:  # type: ignore[union-attr]
            system.move("train", S.ACTIVE)  # lands just after this read
        return read

    system.store.events = events_then_active  # type: ignore[method-assign]
    seen: list[RequestState] = []
    result = system.client.wait(
        "train", timeout=10, on_event=lambda e: seen.append(e.state), poll=0.01
    )
    assert result.outcome is Waited.ACTIVE
    assert seen == [S.PENDING, S.PROVISIONING, S.ACTIVE]
    assert [event.state for event in result.events] == seen


def test_wait_on_a_request_that_ended_without_running_says_so(system: System) -> None:
    system.stored(flex("train"))
    system.move("train", S.CANCELLED)
    result = system.client.wait("train", timeout=1)
    assert (result.outcome, result.state) == (Waited.ENDED, S.CANCELLED)


def test_wait_on_a_request_released_after_running_counts_as_active(system: System) -> None:
    system.stored(flex("train"))
    for state in (S.PROVISIONING, S.ACTIVE, S.RELEASED):
        system.move("train", state)
    assert system.client.wait("train", timeout=1).outcome is Waited.ACTIVE


def test_wait_times_out_on_time_with_the_state_it_saw(system: System) -> None:
    system.stored(flex("train"))
    started = time.monotonic()
    result = system.client.wait("train", timeout=timedelta(milliseconds=200), poll=0.05)
    took = time.monotonic() - started
    assert (result.outcome, result.state) == (Waited.TIMEOUT, S.PENDING)
    assert 0.2 <= took < 2
    unseen = system.client.wait("not-yet", timeout=0.05, poll=0.01)
    assert (unseen.outcome, unseen.state, unseen.events) == (Waited.TIMEOUT, None, ())


# cancel and release -----------------------------------------------------------------------------


def test_cancel_and_release_publish_on_the_tenants_topic(system: System) -> None:
    assert system.client.cancel("train", tenant="vision") == "1"  # the message ids
    assert system.client.release("train", tenant="vision") == "2"
    assert [(m["action"], m["request_id"], m["tenant"]) for m in system.publisher.messages] == [
        ("cancel", "train", "vision"), ("release", "train", "vision"),
    ]  # fmt: skip
    with pytest.raises(InvalidRequest, match="tenant"):
        system.client.cancel("train", tenant="not a name")


@pytest.mark.parametrize("action", ["cancel", "release"])
def test_another_tenants_request_is_refused_before_publishing(system: System, action: str) -> None:
    """Intake would refuse it (NOT_YOUR_REQUEST) in an event on a request the caller does not
    follow; the client says so at once and publishes nothing."""
    system.stored(flex("train", tenant="vision"))
    end = system.client.cancel if action == "cancel" else system.client.release
    with pytest.raises(InvalidRequest, match="'train' is not a request of tenant 'speech'"):
        end("train", tenant="speech")
    assert system.publisher.messages == []


def test_a_tenant_without_a_topic_is_refused_by_name() -> None:
    """A tenant this deployment lacks has no request topic (Pub/Sub: NOT_FOUND): submit,
    cancel and release raise InvalidRequest naming the tenant, not the transport's error."""
    system = System(existing_topics=["capacity-requests-vision"])
    with pytest.raises(InvalidRequest, match="tenant: 'visoin' is not a tenant of this") as error:
        system.client.submit(TRAIN, tenant="visoin")
    assert "capacity-requests-visoin" in str(error.value)
    with pytest.raises(InvalidRequest, match="'visoin' is not a tenant"):
        system.client.release("train", tenant="visoin")
    assert system.client.submit(TRAIN) == "train"  # a configured tenant's topic exists
    assert system.publisher.topics == ["capacity-requests-vision"]


@pytest.mark.parametrize("action", ["cancel", "release"])
def test_a_booked_block_google_would_keep_is_refused_before_publishing(
    system: System, action: str
) -> None:
    """Approved now and starting in two days: Google lets an approved block be cancelled only
    while its start is more than 30 days away, or within a day of its approval while its start
    is at least 4 days away (compute/docs/instances/delete-future-reservations-calendar-mode);
    this one it keeps and bills in full, so the client refuses at once (ending a booked block
    is cancelling it at Google, a release too)."""
    system.stored(calendar("block", tenant="speech", start_at=NOW + 2 * DAY))
    system.move("block", S.BOOKED, pool=f"{ZONE}/{A3}")
    end = system.client.cancel if action == "cancel" else system.client.release
    with pytest.raises(NotCancellable, match="'block' can no longer be cancelled"):
        end("block", tenant="speech")
    assert system.publisher.messages == []


# views ------------------------------------------------------------------------------------------


def test_queue_timeline_and_usage_are_the_services_values(system: System) -> None:
    system.stored(flex("waits", tenant="vision"))
    system.move("waits", S.PENDING, pool=f"{ZONE}/{A3}", eta=NOW + HOUR, position=1)
    system.stored(flex("ran", tenant="speech", hours=2))
    system.move("ran", S.PROVISIONING, pool=f"{ZONE}/{A3}")
    system.move("ran", S.ACTIVE, pool=f"{ZONE}/{A3}")
    (entry,) = system.client.queue()
    assert isinstance(entry, QueueEntry)
    assert (entry.request_id, entry.position, entry.eta) == ("waits", 1, NOW + HOUR)
    assert system.client.queue(tenant="speech") == []
    spans = system.client.timeline()[f"{ZONE}/{A3}"]
    assert [(s.request_id, s.state) for s in spans] == [("ran", "ACTIVE"), ("waits", "PENDING")]
    system.clock.advance(HOUR)
    system.move("ran", S.RELEASED, pool=f"{ZONE}/{A3}")
    (row,) = system.client.usage()
    assert isinstance(row, UsageRow)
    assert (row.tenant, row.used_hours, row.granted_hours) == ("speech", 8.0, 16.0)
    assert system.client.usage(tenant="vision") == []
    assert system.client.usage(until=system.clock.now()) == []  # it ended at that instant
    assert system.client.usage(since=system.clock.now()) == [row]


# building a client ------------------------------------------------------------------------------


def test_a_client_on_a_project_leaves_the_environment_alone() -> None:
    client = Client(project="real-project")
    assert client.container.settings.project == "real-project"
    assert for_project("p", {"OPENDWS_TPU_TIER": "spot"}).settings.tpu_tier == "spot"
    with pytest.raises(ValueError, match="a project or a container"):
        Client(project="p", container=client.container)


def test_without_arguments_a_client_is_on_the_process_container() -> None:
    mine = bootstrap.Container(bootstrap.Settings(project="mine"))
    previous = bootstrap.use(mine)
    try:
        assert Client().container is mine
    finally:
        bootstrap.use(previous)


def test_opendws_exports_the_client_without_loading_it_on_import() -> None:
    assert opendws.Client is Client
    probe = "import sys, opendws\nprint('opendws.bootstrap' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(ROOT / "shared"), "PATH": ""}, cwd=ROOT,
    )  # fmt: skip
    assert result.stdout.strip() == "False"


def test_every_refusal_is_a_client_error() -> None:
    for refusal in (InvalidRequest, UnknownRequest, NotCancellable):
        assert issubclass(refusal, ClientError)
