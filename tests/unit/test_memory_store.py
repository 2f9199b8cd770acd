"""The memory store's write log (what :meth:`changes` reads): one entry per request, moved to
the end by each write, so it stays as large as the store however many writes a long replay or
a local stack makes, and a read from a watermark still returns each request written since
once, in the order of their latest writes."""

from __future__ import annotations

from opendws.adapters.memory import MemoryRequestStore
from opendws.domain.states import RequestState
from opendws.ports import Change
from tests.contract.test_request_store import event_of, record_of

S = RequestState


def test_the_write_log_keeps_one_entry_per_request_and_reads_each_once_in_write_order() -> None:
    store = MemoryRequestStore()
    for request_id in ("r1", "r2", "r3"):
        record = record_of(request_id)
        store.create(record, event_of(record, S.PENDING, None))
    start = store.changes(None).watermark
    for count in range(2, 200):
        store.mark_announced("r1", count)  # 198 writes of one request
    store.mark_announced("r3", 1)
    store.mark_announced("r3", 2)
    store.mark_announced("r2", 1)
    assert len(store._log) == 3
    since = store.changes(start)
    assert [r.request_id for r in since.records] == ["r1", "r3", "r2"]
    assert [r.announced for r in since.records] == [199, 2, 1]
    record = record_of("r1")
    store.change(
        "r1",
        Change(
            expected_version=1, state=S.CANCELLED, event=event_of(record, S.CANCELLED, S.PENDING)
        ),
    )
    later = store.changes(since.watermark)
    assert [(r.request_id, r.state) for r in later.records] == [("r1", S.CANCELLED)]
    assert store.changes(later.watermark).records == ()


def test_count_in_and_unordered_listing_see_what_in_states_sees() -> None:
    """The replay's loop asks the memory store how many requests are live and for the pending
    ones in no order (no sort a pass): both follow every write as :meth:`in_states` does."""
    store = MemoryRequestStore()
    for request_id in ("r1", "r2", "r3"):
        record = record_of(request_id)
        store.create(record, event_of(record, S.PENDING, None))
    assert store.count_in(S.PENDING, S.PROVISIONING) == 3
    assert store.count_in(S.PENDING, S.PENDING) == 3  # a state named twice counts once
    record = record_of("r2")
    store.change(
        "r2",
        Change(
            expected_version=1, state=S.CANCELLED, event=event_of(record, S.CANCELLED, S.PENDING)
        ),
    )
    assert store.count_in(S.PENDING) == 2
    assert store.count_in(S.CANCELLED) == 1
    assert store.count_in(S.ACTIVE) == 0
    for states in ((S.PENDING,), (S.PENDING, S.CANCELLED), (S.ACTIVE,)):
        unordered = store.in_states_unordered(*states)
        assert sorted(r.request_id for r in unordered) == [
            r.request_id for r in store.in_states(*states)
        ]
