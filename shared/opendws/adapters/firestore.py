"""The RequestStore on Cloud Firestore (google-cloud-firestore).

Layout: ``requests/{request_id}`` holds the request, its state and a version;
its queries' composite indexes are in ``infra/firestore.indexes.json``;
``requests/{request_id}/events/{seq}`` holds one event per state change, ``seq`` a zero-padded
counter so that document order is event order. Creation is one batch with create-if-absent
preconditions; every change is one transaction that checks the version it read.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from google.api_core.exceptions import AlreadyExists, NotFound
from google.cloud import firestore
from google.cloud.firestore_v1.base_query import FieldFilter

from opendws.domain.states import RequestState, transition
from opendws.ports import (
    CreateOutcome,
    RequestRecord,
    StaleWrite,
    StatusEvent,
    UnknownRequest,
    request_from_document,
    request_to_document,
)

REQUESTS = "requests"
EVENTS = "events"


def _event_id(seq: int) -> str:
    return f"{seq:08d}"


class FirestoreRequestStore:
    """RequestStore over a Firestore client (the emulator when FIRESTORE_EMULATOR_HOST is set)."""

    def __init__(self, client: firestore.Client, collection: str = REQUESTS) -> None:
        self._client = client
        self._requests = client.collection(collection)

    def create(self, record: RequestRecord, event: StatusEvent) -> CreateOutcome:
        document = self._requests.document(record.request_id)
        batch = self._client.batch()
        batch.create(document, {**_record_fields(record), "events": 1})
        batch.create(document.collection(EVENTS).document(_event_id(1)), _event_fields(event, 1))
        try:
            batch.commit()
        except AlreadyExists:
            existing = self.get(record.request_id)
            if existing is not None and existing.digest == record.digest:
                return CreateOutcome.DUPLICATE
            return CreateOutcome.CONFLICT
        return CreateOutcome.CREATED

    def get(self, request_id: str) -> RequestRecord | None:
        snapshot = self._requests.document(request_id).get()
        data = snapshot.to_dict() if snapshot.exists else None
        return None if data is None else _record(data)

    def change(
        self, request_id: str, *, expected_version: int, state: RequestState, event: StatusEvent,
        reason: str | None = None, message: str = "", pool: str | None = None,
        eta: datetime | None = None,
    ) -> RequestRecord:  # fmt: skip
        document = self._requests.document(request_id)

        @firestore.transactional
        def apply(transaction: firestore.Transaction) -> RequestRecord:
            snapshot = document.get(transaction=transaction)
            data = snapshot.to_dict() if snapshot.exists else None
            if data is None:
                raise UnknownRequest(request_id)
            if data["version"] != expected_version:
                raise StaleWrite(
                    f"{request_id} is at version {data['version']}, not {expected_version}"
                )
            transition(RequestState(data["state"]), state)
            seq = int(data.get("events", 0)) + 1
            fields = {
                "state": state.value,
                "version": expected_version + 1,
                "updated_at": event.at,
                "reason": reason,
                "message": message,
                "pool": pool,
                "eta": eta,
                "events": seq,
            }
            transaction.update(document, fields)
            transaction.create(
                document.collection(EVENTS).document(_event_id(seq)), _event_fields(event, seq)
            )
            return _record({**data, **fields})

        result: RequestRecord = apply(self._client.transaction())
        return result

    def events(self, request_id: str) -> list[StatusEvent]:
        stream = self._requests.document(request_id).collection(EVENTS).order_by("seq").stream()
        return [_event(snapshot.to_dict() or {}) for snapshot in stream]

    def mark_announced(self, request_id: str, count: int) -> None:
        # One write with a server-side maximum: monotonic without a read or a transaction.
        try:
            self._requests.document(request_id).update({"announced": firestore.Maximum(count)})
        except NotFound:
            raise UnknownRequest(request_id) from None

    def in_states(self, *states: RequestState) -> list[RequestRecord]:
        # Needs the composite index (state, submitted_at) of infra/firestore.indexes.json.
        query = self._requests.where(
            filter=FieldFilter("state", "in", [s.value for s in states])
        ).order_by("submitted_at")
        records = [_record(snapshot.to_dict() or {}) for snapshot in query.stream()]
        # Equal submission times come back in any order: settle them by id.
        return sorted(records, key=lambda r: (r.request.submitted_at, r.request_id))


def _record_fields(record: RequestRecord) -> dict[str, Any]:
    return {
        "request": request_to_document(record.request),
        "tenant": record.tenant,
        "submitted_at": record.request.submitted_at,
        "state": record.state.value,
        "version": record.version,
        "digest": record.digest,
        "updated_at": record.updated_at,
        "reason": record.reason,
        "message": record.message,
        "pool": record.pool,
        "eta": record.eta,
        "announced": record.announced,
    }


def _record(data: dict[str, Any]) -> RequestRecord:
    return RequestRecord(
        request=request_from_document(data["request"]),
        state=RequestState(data["state"]),
        version=int(data["version"]),
        digest=data["digest"],
        updated_at=data["updated_at"],
        reason=data.get("reason"),
        message=data.get("message", ""),
        pool=data.get("pool"),
        eta=data.get("eta"),
        announced=int(data.get("announced", 0)),
    )


def _event_fields(event: StatusEvent, seq: int) -> dict[str, Any]:
    return {**event.to_json(), "seq": seq}


def _event(data: dict[str, Any]) -> StatusEvent:
    return StatusEvent.from_json({key: value for key, value in data.items() if key != "seq"})
