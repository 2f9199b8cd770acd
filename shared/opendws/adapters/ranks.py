"""The RankStore (opendws.ports.runs) on Cloud Firestore, and in memory for tests.

Layout: ``requests/{request_id}/ranks/{rank}`` holds one rank's document, and
``requests/{request_id}/run/stop`` the run's stop order. Each call reads the document and
writes what the pure rule of :mod:`opendws.ports.runs` makes of it in one transaction, so two
reports at once (a heartbeat and an exit) never lose one another, and a repeat writes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

from opendws.ports.runs import (
    RankReport,
    RankState,
    Registration,
    StopOrder,
    exited,
    heartbeat,
    latest,
    registered,
    runner_handed,
    stop_ordered,
)

T = TypeVar("T")


class MemoryRankStore:
    """A RankStore in memory (one lock: each call is atomic, as a transaction is)."""

    def __init__(self) -> None:
        self._ranks: dict[tuple[str, int], RankReport] = {}
        self._stops: dict[str, StopOrder] = {}
        self._lock = threading.Lock()
        self.writes = 0  # how many documents were written (a repeat writes none)

    def register(self, registration: Registration) -> RankReport:
        key = (registration.request_id, registration.rank)
        with self._lock:
            report = self._put(key, registered(self._ranks.get(key), registration))
        assert report is not None  # a registration always leaves a document
        return report

    def heartbeat(
        self, request_id: str, attempt: int, rank: int, state: RankState, at: datetime
    ) -> RankReport | None:
        key = (request_id, rank)
        with self._lock:
            return self._put(key, heartbeat(self._ranks.get(key), attempt, state, at))

    def exited(
        self, request_id: str, attempt: int, rank: int, code: int, stopped: bool, at: datetime
    ) -> RankReport | None:
        key = (request_id, rank)
        with self._lock:
            return self._put(key, exited(self._ranks.get(key), attempt, code, stopped, at))

    def runner_handed(
        self, request_id: str, attempt: int, rank: int, runner_id: str, at: datetime
    ) -> RankReport | None:
        key = (request_id, rank)
        with self._lock:
            return self._put(key, runner_handed(self._ranks.get(key), attempt, runner_id, at))

    def of_vm(self, vm: str) -> RankReport | None:
        with self._lock:
            return latest([report for report in self._ranks.values() if report.vm == vm])

    def ranks(self, request_id: str) -> list[RankReport]:
        with self._lock:
            found = [report for (rid, _), report in self._ranks.items() if rid == request_id]
        return sorted(found, key=lambda report: report.rank)

    def order_stop(self, order: StopOrder) -> StopOrder:
        with self._lock:
            after = stop_ordered(self._stops.get(order.request_id), order)
            if after is not None:
                self._stops[order.request_id] = after
                self.writes += 1
            return self._stops[order.request_id]

    def stop_order(self, request_id: str) -> StopOrder | None:
        with self._lock:
            return self._stops.get(request_id)

    def _put(self, key: tuple[str, int], after: RankReport | None) -> RankReport | None:
        if after is not None:
            self._ranks[key] = after
            self.writes += 1
        return self._ranks.get(key)


class FirestoreRankStore:
    """A RankStore on Cloud Firestore (see the module docstring)."""

    def __init__(self, client: firestore.Client) -> None:
        self._db = client

    def register(self, registration: Registration) -> RankReport:
        ref = self._rank(registration.request_id, registration.rank)
        report = self._apply(ref, lambda current: registered(current, registration))
        assert report is not None  # a registration always leaves a document
        return report

    def heartbeat(
        self, request_id: str, attempt: int, rank: int, state: RankState, at: datetime
    ) -> RankReport | None:
        ref = self._rank(request_id, rank)
        return self._apply(ref, lambda current: heartbeat(current, attempt, state, at))

    def exited(
        self, request_id: str, attempt: int, rank: int, code: int, stopped: bool, at: datetime
    ) -> RankReport | None:
        ref = self._rank(request_id, rank)
        return self._apply(ref, lambda current: exited(current, attempt, code, stopped, at))

    def runner_handed(
        self, request_id: str, attempt: int, rank: int, runner_id: str, at: datetime
    ) -> RankReport | None:
        ref = self._rank(request_id, rank)
        return self._apply(ref, lambda current: runner_handed(current, attempt, runner_id, at))

    def of_vm(self, vm: str) -> RankReport | None:
        """A collection-group query on ``vm`` (its single-field index of collection-group
        scope is declared in infra/modules/firestore)."""
        query = self._db.collection_group("ranks").where(filter=FieldFilter("vm", "==", vm))
        return latest([RankReport.from_document(doc.to_dict() or {}) for doc in query.stream()])

    def ranks(self, request_id: str) -> list[RankReport]:
        collection = self._db.collection("requests").document(request_id).collection("ranks")
        found = [RankReport.from_document(doc.to_dict() or {}) for doc in collection.stream()]
        return sorted(found, key=lambda report: report.rank)

    def order_stop(self, order: StopOrder) -> StopOrder:
        ref = self._stop(order.request_id)

        @firestore.transactional
        def apply(transaction: firestore.Transaction) -> StopOrder:
            snapshot = ref.get(transaction=transaction)
            current = _stop_of(snapshot.to_dict())
            after = stop_ordered(current, order)
            if after is None:
                assert current is not None
                return current
            transaction.set(ref, after.to_document())
            return after

        result: StopOrder = apply(self._db.transaction())
        return result

    def stop_order(self, request_id: str) -> StopOrder | None:
        snapshot = self._stop(request_id).get()
        return _stop_of(snapshot.to_dict())

    def _rank(self, request_id: str, rank: int) -> firestore.DocumentReference:
        requests = self._db.collection("requests").document(request_id)
        ref: firestore.DocumentReference = requests.collection("ranks").document(str(rank))
        return ref

    def _stop(self, request_id: str) -> firestore.DocumentReference:
        requests = self._db.collection("requests").document(request_id)
        ref: firestore.DocumentReference = requests.collection("run").document("stop")
        return ref

    def _apply(
        self,
        ref: firestore.DocumentReference,
        rule: Callable[[RankReport | None], RankReport | None],
    ) -> RankReport | None:
        """Read the rank's document, apply ``rule``, write what it returns (if anything), in
        one transaction; the document as it stands after."""

        @firestore.transactional
        def apply(transaction: firestore.Transaction) -> RankReport | None:
            snapshot = ref.get(transaction=transaction)
            current = _rank_of(snapshot.to_dict())
            after = rule(current)
            if after is None:
                return current
            transaction.set(ref, after.to_document())
            return after

        result: RankReport | None = apply(self._db.transaction())
        return result


def _rank_of(document: dict[str, Any] | None) -> RankReport | None:
    return None if document is None else RankReport.from_document(document)


def _stop_of(document: dict[str, Any] | None) -> StopOrder | None:
    return None if document is None else StopOrder.from_document(document)


__all__ = ["FirestoreRankStore", "MemoryRankStore"]
