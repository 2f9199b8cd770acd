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
from opendws.domain.model import CALENDAR_MAX_LEAD, CALENDAR_MAX_RUN
from opendws.domain.readiness import KEPT_SAMPLES, ReadySample
from opendws.ports import (
    FINISHED_FIRST,
    LEASE_FREE,
    Change,
    CreateOutcome,
    Fenced,
    Lane,
    RequestRecord,
    RequestStore,
    StaleWrite,
    StatusEvent,
    UnknownRequest,
    accepted,
    content_digest,
    finished_first,
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


def test_a_request_recorded_ended_makes_its_submission_a_duplicate(store: RequestStore) -> None:
    """A CI job that finished before its queued webhook came (``finished_first``): stored
    CANCELLED at once; the late submission finds it and changes nothing, and it waits in no
    queue."""
    request = record_of().request
    record, event = finished_first(request, NOW)
    assert store.create(record, event) is CreateOutcome.CREATED
    late, queued = accepted(replace(request, submitted_at=NOW + timedelta(minutes=1)), NOW)
    assert store.create(late, queued) is CreateOutcome.DUPLICATE
    stored = store.get("r1")
    assert stored is not None
    assert (stored.state, stored.reason, stored.version) == (S.CANCELLED, FINISHED_FIRST, 1)
    assert store.events("r1") == [event]
    assert store.in_states(S.PENDING) == []


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
        "r1",
        Change(
            expected_version=1,
            state=S.PROVISIONING,
            event=event,
            reason="ADMITTED",
            message="admitted",
            pool="us-central1-a/a3-highgpu-8g",
        ),
    )
    assert (changed.state, changed.version, changed.pool) == (S.PROVISIONING, 2, event.pool)
    assert store.get("r1") == changed
    assert [e.state for e in store.events("r1")] == [S.PENDING, S.PROVISIONING]


def test_a_stale_version_is_refused_and_changes_nothing(store: RequestStore) -> None:
    record = record_of()
    store.create(record, event_of(record, S.PENDING, None))
    store.change(
        "r1",
        Change(
            expected_version=1,
            state=S.PROVISIONING,
            event=event_of(record, S.PROVISIONING, S.PENDING),
        ),
    )
    with pytest.raises(StaleWrite):
        store.change(
            "r1",
            Change(
                expected_version=1,
                state=S.CANCELLED,
                event=event_of(record, S.CANCELLED, S.PENDING),
            ),
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
            "r1",
            Change(expected_version=1, state=S.ACTIVE, event=event_of(record, S.ACTIVE, S.PENDING)),
        )
    assert len(store.events("r1")) == 1


def test_changing_an_unknown_request_says_so(store: RequestStore) -> None:
    record = record_of("ghost")
    with pytest.raises(UnknownRequest):
        store.change(
            "ghost",
            Change(
                expected_version=1,
                state=S.CANCELLED,
                event=event_of(record, S.CANCELLED, S.PENDING),
            ),
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
        "c1",
        Change(expected_version=1, state=S.BOOKED, event=event_of(booked, S.BOOKED, S.PENDING)),
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


def test_a_revision_keeps_the_state_and_its_since_but_records_an_event(
    store: RequestStore,
) -> None:
    record = record_of()
    store.create(record, event_of(record, S.PENDING, None))
    admitted = event_of(record, S.PROVISIONING, S.PENDING)
    first = store.change(
        "r1", Change(expected_version=1, state=S.PROVISIONING, event=admitted, attempt=1, pool="p")
    )
    assert (first.since, first.attempt, first.events) == (admitted.at, 1, 2)
    later = replace(admitted, at=admitted.at + timedelta(minutes=7), previous_state=S.PROVISIONING)
    revised = store.change(
        "r1",
        Change(
            expected_version=2,
            state=S.PROVISIONING,
            event=later,
            reason="RETRY",
            pool="p",
            eta=NOW,
            position=4,
        ),
    )
    assert (revised.state, revised.version, revised.since) == (S.PROVISIONING, 3, admitted.at)
    assert (revised.attempt, revised.reason, revised.position, revised.events) == (
        1, "RETRY", 4, 3,
    )  # fmt: skip
    assert store.get("r1") == revised
    assert len(store.events("r1")) == 3


def test_lanes_are_stored_kept_by_a_revision_and_cleared_back_in_line(
    store: RequestStore,
) -> None:
    """A request racing several pools has one open order (lane) per pool: they survive a
    revision that does not name them, are replaced when given, and a request back in line
    (PENDING) has none."""
    record = record_of()
    store.create(record, event_of(record, S.PENDING, None))
    racing = (Lane("us-a", 1), Lane("us-b", 2))
    admitted = event_of(record, S.PROVISIONING, S.PENDING)
    first = store.change(
        "r1",
        Change(
            expected_version=1,
            state=S.PROVISIONING,
            event=admitted,
            attempt=2,
            pool="us-a",
            lanes=racing,
        ),
    )
    assert first.lanes == racing
    assert first.orders == racing
    revised = store.change(
        "r1", Change(expected_version=2, state=S.PROVISIONING, event=admitted, pool="us-a")
    )
    assert store.get("r1") == revised
    assert revised.lanes == racing
    won = store.change(
        "r1",
        Change(
            expected_version=3,
            state=S.ACTIVE,
            event=admitted,
            pool="us-b",
            lanes=(Lane("us-b", 2),),
        ),
    )
    assert store.get("r1") == won
    assert won.orders == (Lane("us-b", 2),)
    back = event_of(record, S.PENDING, S.PROVISIONING)
    fresh = store.create(record_of("r2"), event_of(record_of("r2"), S.PENDING, None))
    assert fresh is CreateOutcome.CREATED
    store.change(
        "r2",
        Change(
            expected_version=1,
            state=S.PROVISIONING,
            event=admitted,
            attempt=2,
            pool="us-a",
            lanes=racing,
        ),
    )
    pending = store.change("r2", Change(expected_version=2, state=S.PENDING, event=back, attempt=2))
    assert pending.lanes == ()
    assert store.get("r2") == pending


def test_the_lease_goes_to_one_holder_at_a_time(store: RequestStore) -> None:
    ttl = timedelta(minutes=2)
    first = store.acquire_lease("a", NOW, ttl)
    assert first is not None
    assert (first.holder, first.token, first.expires_at) == ("a", 1, NOW + ttl)
    assert store.acquire_lease("b", NOW + timedelta(minutes=1), ttl) is None
    renewed = store.acquire_lease("a", NOW + timedelta(minutes=1), ttl)
    assert renewed is not None
    assert (renewed.token, renewed.expires_at) == (1, NOW + timedelta(minutes=3))
    taken = store.acquire_lease("b", NOW + timedelta(minutes=4), ttl)
    assert taken is not None
    assert (taken.holder, taken.token) == ("b", 2)
    store.release_lease(first)  # no longer a's: nothing happens
    assert store.acquire_lease("a", NOW + timedelta(minutes=5), ttl) is None
    store.release_lease(taken)
    again = store.acquire_lease("a", NOW + timedelta(minutes=5), ttl)
    assert again is not None
    assert again.token == 3


def test_a_fenced_write_is_refused_once_the_lease_changed_hands(store: RequestStore) -> None:
    record = record_of()
    store.create(record, event_of(record, S.PENDING, None))
    old = store.acquire_lease("old", NOW, timedelta(minutes=2))
    assert old is not None
    changed = store.change(
        "r1",
        Change(
            expected_version=1,
            state=S.PROVISIONING,
            event=event_of(record, S.PROVISIONING, S.PENDING),
        ),
        fence=old,
    )
    assert changed.version == 2
    assert store.acquire_lease("new", NOW + timedelta(minutes=3), timedelta(minutes=2))
    with pytest.raises(Fenced, match="held by new"):
        store.change(
            "r1",
            Change(
                expected_version=2,
                state=S.ACTIVE,
                event=event_of(changed, S.ACTIVE, S.PROVISIONING),
            ),
            fence=old,
        )
    with pytest.raises(Fenced):
        store.mark_pool_short("p1", NOW + timedelta(hours=1), old)
    assert store.get("r1") == changed
    assert len(store.events("r1")) == 2
    assert store.pool_shortages() == {}


def test_a_pool_cool_down_only_ever_grows(store: RequestStore) -> None:
    pool_id = "us-central1-a/a3-highgpu-8g"
    store.mark_pool_short(pool_id, NOW + timedelta(minutes=10))
    store.mark_pool_short(pool_id, NOW + timedelta(minutes=5))
    store.mark_pool_short("europe-west4-b/tpu-v5e", NOW)
    assert store.pool_shortages() == {
        pool_id: NOW + timedelta(minutes=10),
        "europe-west4-b/tpu-v5e": NOW,
    }
    store.mark_pool_short(pool_id, NOW + timedelta(minutes=20))
    assert store.pool_shortages()[pool_id] == NOW + timedelta(minutes=20)


def test_ready_samples_are_kept_per_pool_once_per_request_and_beside_a_cool_down(
    store: RequestStore,
) -> None:
    """A pool keeps its newest samples, one per request (a repeated pass records nothing
    twice), and its cool-down and its samples live in one document without erasing each
    other: each is written with ``set(..., merge=True)``, which updates only the fields given
    (firestore/docs/manage-data/add-data, "Set a document": merge)."""
    pool_id = "us-central1-a/a3-highgpu-8g"
    first = ReadySample(request_id="r1", at=NOW, took=timedelta(minutes=7, microseconds=5))
    store.record_ready(pool_id, first)
    store.mark_pool_short(pool_id, NOW + timedelta(minutes=10))
    store.record_ready(pool_id, replace(first, took=timedelta(hours=1)))  # the same request
    second = ReadySample(request_id="r2", at=NOW + timedelta(minutes=1), took=timedelta(0))
    store.record_ready(pool_id, second)
    assert store.ready_samples() == {pool_id: (first, second)}
    assert store.pool_shortages() == {pool_id: NOW + timedelta(minutes=10)}
    for index in range(KEPT_SAMPLES):
        store.record_ready(
            pool_id,
            ReadySample(
                request_id=f"n{index:03d}", at=NOW + timedelta(hours=1, seconds=index),
                took=timedelta(seconds=index),
            ),
        )  # fmt: skip
    kept = store.ready_samples()[pool_id]
    assert len(kept) == KEPT_SAMPLES
    assert [sample.request_id for sample in kept] == [f"n{i:03d}" for i in range(KEPT_SAMPLES)]


def test_a_passs_ready_samples_of_a_pool_are_recorded_in_one_write(store: RequestStore) -> None:
    """A pass records what it learned of a pool at once (one document: Firestore sustains
    about one write a second to one, firestore/docs/best-practices, "Hotspots"); the rule is
    the same as one at a time, a request recorded twice keeps its first sample."""
    pool_id = "us-central1-b/a3-highgpu-8g"
    first = ReadySample(request_id="r1", at=NOW, took=timedelta(minutes=3))
    again = replace(first, took=timedelta(hours=2))
    second = ReadySample(request_id="r2", at=NOW + timedelta(seconds=1), took=timedelta(0))
    store.record_ready(pool_id, first, again, second)
    assert store.ready_samples() == {pool_id: (first, second)}
    store.record_ready(pool_id, again)  # nothing new: nothing written
    assert store.ready_samples() == {pool_id: (first, second)}


def test_a_fenced_ready_sample_is_refused(store: RequestStore) -> None:
    old = store.acquire_lease("old", NOW, timedelta(minutes=2))
    assert old is not None
    assert store.acquire_lease("new", NOW + timedelta(minutes=3), timedelta(minutes=2))
    with pytest.raises(Fenced):
        store.record_ready("p1", ReadySample(request_id="r", at=NOW, took=timedelta(0)), fence=old)
    assert store.ready_samples() == {}


def test_changes_wait_in_the_outbox_until_their_events_are_announced(
    store: RequestStore,
) -> None:
    record = record_of()
    store.create(record, event_of(record, S.PENDING, None))
    other = record_of("r2")
    store.create(other, event_of(other, S.PENDING, None))
    assert store.unannounced() == []  # creations are announced by intake's redelivery
    changed = store.change(
        "r1",
        Change(
            expected_version=1, state=S.CANCELLED, event=event_of(record, S.CANCELLED, S.PENDING)
        ),
    )
    assert [r.request_id for r in store.unannounced()] == ["r1"]
    store.mark_announced("r1", changed.events - 1)
    assert [r.request_id for r in store.unannounced()] == ["r1"]
    store.mark_announced("r1", changed.events)
    assert store.unannounced() == []


def test_a_final_change_stores_its_usage_in_the_same_write(store: RequestStore) -> None:
    from opendws.domain.model import Mode
    from opendws.ports import UsageEntry

    for request_id, tenant, ended in (("r1", "vision", 6), ("r2", "speech", 3)):
        request = flex(request_id, tenant=tenant, vm_count=2, hours=6)
        record = record_of(request_id, request=request, digest=content_digest(request))
        store.create(record, event_of(record, S.PENDING, None))
        usage = UsageEntry(
            request_id=request_id, tenant=tenant, accelerator="nvidia-h100-80gb",
            mode=Mode.FLEX_START, outcome=S.CANCELLED, granted_hours=0.0, used_hours=0.0,
            started_at=None, ended_at=NOW + timedelta(minutes=ended), cost=None,
        )  # fmt: skip
        store.change(
            request_id,
            Change(
                expected_version=1,
                state=S.CANCELLED,
                usage=usage,
                event=event_of(record, S.CANCELLED, S.PENDING),
            ),
        )
    assert [u.request_id for u in store.usage()] == ["r2", "r1"]  # oldest end first
    [vision] = store.usage("vision")
    assert (vision.outcome, vision.mode, vision.started_at, vision.cost) == (
        S.CANCELLED, Mode.FLEX_START, None, None,
    )  # fmt: skip
    assert vision.ended_at == NOW + timedelta(minutes=6)
    # A refused write stores no usage either.
    with pytest.raises(StaleWrite):
        store.change(
            "r1",
            Change(
                expected_version=1,
                state=S.CANCELLED,
                usage=vision,
                event=event_of(record_of("r1"), S.CANCELLED, S.PENDING),
            ),
        )
    assert len(store.usage()) == 2


def test_firestore_event_records_carry_their_ttl_timestamp(
    official_emulators: Emulators, emulator_project: str
) -> None:
    """Each event document has ``expire_at``, a timestamp (TTL policies ignore text) that lies
    past any request's life: infra/modules/firestore's TTL policy deletes events after it."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    from opendws.adapters.firestore import (
        EVENT_EXPIRY_FIELD,
        EVENT_RETENTION,
        EVENTS,
        REQUESTS,
        FirestoreRequestStore,
    )

    del official_emulators
    client = firestore.Client(project=emulator_project, credentials=AnonymousCredentials())
    store = FirestoreRequestStore(client)
    record = record_of()
    first = event_of(record, S.PENDING, None)
    store.create(record, first)
    second = event_of(replace(record, version=2), S.PROVISIONING, S.PENDING)
    store.change(
        "r1", Change(expected_version=1, state=S.PROVISIONING, event=second, pool=second.pool)
    )
    documents = client.collection(REQUESTS).document("r1").collection(EVENTS).order_by("seq")
    expiries = [snapshot.get(EVENT_EXPIRY_FIELD) for snapshot in documents.stream()]
    assert expiries == [first.at + EVENT_RETENTION, second.at + EVENT_RETENTION]
    assert CALENDAR_MAX_LEAD + CALENDAR_MAX_RUN < EVENT_RETENTION  # a block's whole life
    assert store.events("r1") == [first, second]
    client.close()


def test_a_first_read_of_changes_is_every_request_not_final_and_then_only_what_changed(
    store: RequestStore,
) -> None:
    """What the reconciler's mirror reads (issue: a pass costs what changed): a first read
    returns the requests not yet final; each later read returns what was written since —
    creations, changes (final ones too, so a reader drops them) and announcements — and
    nothing else but, at most, the newest write before the watermark, read again (Firestore:
    ``changed_at >= the newest seen``, where ``changed_at`` is the server timestamp of the
    write's commit; the Firestore v1 API, ``CommitResponse.commit_time``: "any read with an
    equal or greater read_time is guaranteed to see the effects of the commit")."""
    for request_id in ("r1", "r2", "r3"):
        record = record_of(request_id)
        store.create(record, event_of(record, S.PENDING, None))
    ended = record_of("r3")
    store.change(
        "r3",
        Change(
            expected_version=1, state=S.CANCELLED, event=event_of(ended, S.CANCELLED, S.PENDING)
        ),
    )
    first = store.changes(None)
    assert sorted(r.request_id for r in first.records) == ["r1", "r2"]
    quiet = store.changes(first.watermark)
    assert {r.request_id for r in quiet.records} <= {"r3"}  # nothing new: at most the newest
    record = record_of("r4")
    store.create(record, event_of(record, S.PENDING, None))
    admitted = store.change(
        "r1",
        Change(
            expected_version=1,
            state=S.PROVISIONING,
            event=event_of(record_of("r1"), S.PROVISIONING, S.PENDING),
            pool="p",
            attempt=1,
        ),
    )
    delta = store.changes(quiet.watermark)
    by_id = {r.request_id: r for r in delta.records}
    assert {"r1", "r4"} <= set(by_id) <= {"r1", "r3", "r4"}
    assert by_id["r1"] == admitted
    store.mark_announced("r4", 1)
    announced = store.changes(delta.watermark)
    assert {"r4"} <= {r.request_id for r in announced.records} <= {"r1", "r4"}
    assert next(r for r in announced.records if r.request_id == "r4").announced == 1


def test_a_pass_asked_for_while_the_lease_is_held_is_owed_once_by_its_holder(
    store: RequestStore,
) -> None:
    """Nudges that arrive during a pass are coalesced into one more pass, never dropped: a
    refused acquire that asks again makes the holder's release say so; the next holder's
    acquire clears the ask, a renewal keeps it."""
    ttl = timedelta(minutes=2)
    holder = store.acquire_lease("a#1", NOW, ttl)
    assert holder is not None
    assert store.acquire_lease("b#1", NOW, ttl) is None  # no ask: nothing owed
    assert store.acquire_lease("b#2", NOW, ttl, ask_again=True) is None
    assert store.acquire_lease("b#3", NOW, ttl, ask_again=True) is None  # one ask, coalesced
    renewed = store.acquire_lease("a#1", NOW + timedelta(seconds=30), ttl)
    assert renewed is not None
    assert store.release_lease(renewed) is True
    following = store.acquire_lease("a#2", NOW + timedelta(minutes=1), ttl)
    assert following is not None
    assert store.release_lease(following) is False  # its acquire served the ask
    taken = store.acquire_lease("c#1", NOW + timedelta(minutes=1), ttl)
    assert taken is not None
    assert store.release_lease(holder) is False  # no longer a's: nothing released, nothing owed


def test_the_lease_view_says_when_the_passes_started_and_which_one_served(
    store: RequestStore,
) -> None:
    """One read of the lease (``lease_view``) shows its holder, the ask, when the holder's
    pass took it (a renewal keeps that time) and the start of the last pass that gave it up
    having read the requests (``served``); a release without it keeps what was said before."""
    ttl = timedelta(minutes=2)
    assert store.lease_view().fence is None
    first = store.acquire_lease("a#1", NOW, ttl)
    assert first is not None
    assert store.acquire_lease("b#1", NOW, ttl, ask_again=True) is None
    renewed = store.acquire_lease("a#1", NOW + timedelta(seconds=30), ttl)
    assert renewed is not None
    view = store.lease_view()
    assert (view.fence, view.again, view.started_at, view.served_from) == (
        renewed, True, NOW, None,
    )  # fmt: skip
    assert store.release_lease(renewed, served=True) is True
    view = store.lease_view()
    assert view.fence is not None
    assert (view.fence.expires_at, view.started_at, view.served_from) == (LEASE_FREE, NOW, NOW)
    later = NOW + timedelta(minutes=1)
    failed = store.acquire_lease("a#2", later, ttl)
    assert failed is not None
    assert (store.lease_view().started_at, store.lease_view().again) == (later, False)
    store.release_lease(failed)  # it did not read the requests: it serves nothing
    assert store.lease_view().served_from == NOW
    taken = store.acquire_lease("c#1", later, ttl)
    assert taken is not None
    assert store.release_lease(renewed, served=True) is False  # no longer a's: nothing changes
    view = store.lease_view()
    assert (view.fence, view.started_at, view.served_from) == (taken, later, NOW)
