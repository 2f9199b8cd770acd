"""The RequestStore contract, run on the in-memory fake and on Firestore over the official
emulator: the same assertions, so the fake cannot drift from the real adapter."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

import pytest

from emulators import Emulators
from opendws.adapters.memory import MemoryRequestStore
from opendws.domain import IllegalTransition, RequestState
from opendws.ports import (
    CreateOutcome,
    RequestRecord,
    RequestStore,
    StaleWrite,
    StatusEvent,
    UnknownRequest,
    content_digest,
)
from tests.builders import NOW, calendar, flex

S = RequestState


@pytest.fixture(params=["memory", "firestore"])
def store(request: pytest.FixtureRequest) -> Iterator[RequestStore]:
    if request.param == "memory":
        yield MemoryRequestStore()
        return
    emulators: Emulators = request.getfixturevalue("official_emulators")
    project: str = request.getfixturevalue("emulator_project")
    del emulators
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    from opendws.adapters.firestore import FirestoreRequestStore

    client = firestore.Client(project=project, credentials=AnonymousCredentials())
    yield FirestoreRequestStore(client)
    client.close()


def record_of(request_id: str = "r1", **changes: object) -> RequestRecord:
    request = flex(request_id, tenant="vision", vm_count=2, hours=6, labels=(("ci", "github"),))
    record = RequestRecord(
        request=request,
        state=S.PENDING,
        version=1,
        digest=content_digest(request),
        updated_at=NOW,
        message="accepted",
    )
    return replace(record, **changes)  # type: ignore[arg-type]


def event_of(
    record: RequestRecord, state: RequestState, previous: RequestState | None
) -> StatusEvent:
    return StatusEvent(
        request_id=record.request_id,
        tenant=record.tenant,
        state=state,
        previous_state=previous,
        at=NOW + timedelta(minutes=record.version),
        reason="TEST",
        message=f"now {state}",
        eta=NOW + timedelta(hours=1),
        position=2,
        pool="us-central1-a/a3-highgpu-8g",
    )


def test_create_stores_the_request_and_its_first_event(store: RequestStore) -> None:
    record = record_of()
    event = event_of(record, S.PENDING, None)
    assert store.create(record, event) is CreateOutcome.CREATED
    assert store.get("r1") == record
    assert store.events("r1") == [event]


def test_the_same_request_twice_is_a_duplicate_that_changes_nothing(store: RequestStore) -> None:
    record = record_of()
    store.create(record, event_of(record, S.PENDING, None))
    later = replace(
        record, request=replace(record.request, submitted_at=NOW + timedelta(minutes=5))
    )
    assert store.create(later, event_of(later, S.PENDING, None)) is CreateOutcome.DUPLICATE
    assert store.get("r1") == record
    assert len(store.events("r1")) == 1


def test_other_content_under_the_same_id_is_a_conflict(store: RequestStore) -> None:
    record = record_of()
    store.create(record, event_of(record, S.PENDING, None))
    other_request = flex("r1", tenant="vision", vm_count=3)
    other = record_of(request=other_request, digest=content_digest(other_request))
    assert store.create(other, event_of(other, S.PENDING, None)) is CreateOutcome.CONFLICT
    assert store.get("r1") == record


def test_change_moves_the_state_appends_an_event_and_bumps_the_version(store: RequestStore) -> None:
    record = record_of()
    store.create(record, event_of(record, S.PENDING, None))
    event = event_of(record, S.PROVISIONING, S.PENDING)
    changed = store.change(
        "r1", expected_version=1, state=S.PROVISIONING, event=event, reason="ADMITTED",
        message="admitted", pool="us-central1-a/a3-highgpu-8g",
    )  # fmt: skip
    assert (changed.state, changed.version, changed.pool) == (S.PROVISIONING, 2, event.pool)
    assert store.get("r1") == changed
    assert [e.state for e in store.events("r1")] == [S.PENDING, S.PROVISIONING]


def test_a_stale_version_is_refused_and_changes_nothing(store: RequestStore) -> None:
    record = record_of()
    store.create(record, event_of(record, S.PENDING, None))
    store.change(
        "r1",
        expected_version=1,
        state=S.PROVISIONING,
        event=event_of(record, S.PROVISIONING, S.PENDING),
    )
    with pytest.raises(StaleWrite):
        store.change(
            "r1",
            expected_version=1,
            state=S.CANCELLED,
            event=event_of(record, S.CANCELLED, S.PENDING),
        )
    current = store.get("r1")
    assert current is not None
    assert current.state is S.PROVISIONING
    assert len(store.events("r1")) == 2


def test_an_illegal_transition_is_refused(store: RequestStore) -> None:
    record = record_of()
    store.create(record, event_of(record, S.PENDING, None))
    with pytest.raises(IllegalTransition, match="PENDING to ACTIVE"):
        store.change(
            "r1", expected_version=1, state=S.ACTIVE, event=event_of(record, S.ACTIVE, S.PENDING)
        )
    assert len(store.events("r1")) == 1


def test_changing_an_unknown_request_says_so(store: RequestStore) -> None:
    record = record_of("ghost")
    with pytest.raises(UnknownRequest):
        store.change(
            "ghost",
            expected_version=1,
            state=S.CANCELLED,
            event=event_of(record, S.CANCELLED, S.PENDING),
        )
    assert store.get("ghost") is None
    assert store.events("ghost") == []


def test_in_states_lists_requests_oldest_first(store: RequestStore) -> None:
    for index, offset in enumerate([30, 10, 20]):
        request = replace(flex(f"r{index}"), submitted_at=NOW - timedelta(minutes=offset))
        record = record_of(f"r{index}", request=request, digest=content_digest(request))
        store.create(record, event_of(record, S.PENDING, None))
    block = calendar("c1")
    booked = record_of("c1", request=block, digest=content_digest(block))
    store.create(booked, event_of(booked, S.PENDING, None))
    store.change(
        "c1", expected_version=1, state=S.BOOKED, event=event_of(booked, S.BOOKED, S.PENDING)
    )
    assert [r.request_id for r in store.in_states(S.PENDING)] == ["r0", "r2", "r1"]
    assert [r.request_id for r in store.in_states(S.BOOKED, S.ACTIVE)] == ["c1"]


def test_concurrent_creates_of_one_request_store_it_once(store: RequestStore) -> None:
    record = record_of()
    outcomes: list[CreateOutcome] = []
    lock = threading.Lock()

    def create() -> None:
        outcome = store.create(record, event_of(record, S.PENDING, None))
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == sorted([CreateOutcome.CREATED] + [CreateOutcome.DUPLICATE] * 7)
    assert len(store.events("r1")) == 1


def test_announced_counts_published_events_and_never_moves_back(store: RequestStore) -> None:
    record = record_of()
    store.create(record, event_of(record, S.PENDING, None))
    assert store.get("r1").announced == 0  # type: ignore[union-attr]
    store.mark_announced("r1", 1)
    store.mark_announced("r1", 0)
    assert store.get("r1").announced == 1  # type: ignore[union-attr]
    with pytest.raises(UnknownRequest):
        store.mark_announced("ghost", 1)
