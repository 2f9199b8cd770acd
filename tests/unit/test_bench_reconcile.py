"""bench/reconcile.py's read counting: the stores' own ``documents_read`` when every store has
it, else a counter on the Firestore client's reads that is taken off again after the block;
and the arrivals it writes between steady passes."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import pytest
from google.cloud.firestore_v1.document import DocumentReference
from google.cloud.firestore_v1.query import Query

from tests.bench_modules import load_bench


@pytest.fixture(scope="module")
def reconcile() -> ModuleType:
    return load_bench("reconcile", "bench_reconcile")


@dataclass
class Counting:
    documents_read: int = 0


def test_the_stores_own_counts_are_summed(reconcile: ModuleType) -> None:
    first, second = Counting(), Counting()
    reads = reconcile.Reads(object(), (first, second))
    assert reads.own
    with reads.counting():
        first.documents_read += 3
        second.documents_read += 1
        assert reads.total() == 4
    assert DocumentReference.get.__name__ == "get"


def test_without_them_the_client_is_counted_and_left_as_it_was(reconcile: ModuleType) -> None:
    get, stream = DocumentReference.get, Query.stream
    reads = reconcile.Reads(object(), (Counting(), object()))
    assert not reads.own
    assert "counter" in reads.source
    with reads.counting():
        assert DocumentReference.get is not get
        assert Query.stream is not stream
        assert reads.total() == 0
    assert DocumentReference.get is get
    assert Query.stream is stream


def test_arrivals_are_new_requests_arriving_now(reconcile: ModuleType) -> None:
    snapshot = reconcile.pending_only(50)
    new = reconcile.arrivals(snapshot, 2, 10)
    assert len(new) == 10
    assert len({request.request_id for request in new}) == 10
    assert not {request.request_id for request in new} & {r.request_id for r in snapshot.pending}
    assert all(request.submitted_at == reconcile.NOW for request in new)
    assert reconcile.arrivals(snapshot, 0, 0) == []
