"""In-memory implementations of the ports, for fast tests and simulations. They keep the same
contract as the real adapters (the contract suites run on both)."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime

from opendws.domain.states import RequestState, transition
from opendws.ports import CreateOutcome, RequestRecord, StaleWrite, StatusEvent, UnknownRequest


class MemoryRequestStore:
    """A RequestStore in a dict, safe to share between threads."""

    def __init__(self) -> None:
        self._records: dict[str, RequestRecord] = {}
        self._events: dict[str, list[StatusEvent]] = {}
        self._lock = threading.Lock()

    def create(self, record: RequestRecord, event: StatusEvent) -> CreateOutcome:
        with self._lock:
            existing = self._records.get(record.request_id)
            if existing is not None:
                same = existing.digest == record.digest
                return CreateOutcome.DUPLICATE if same else CreateOutcome.CONFLICT
            self._records[record.request_id] = record
            self._events[record.request_id] = [event]
            return CreateOutcome.CREATED

    def get(self, request_id: str) -> RequestRecord | None:
        with self._lock:
            return self._records.get(request_id)

    def change(
        self, request_id: str, *, expected_version: int, state: RequestState, event: StatusEvent,
        reason: str | None = None, message: str = "", pool: str | None = None,
        eta: datetime | None = None,
    ) -> RequestRecord:  # fmt: skip
        with self._lock:
            record = self._records.get(request_id)
            if record is None:
                raise UnknownRequest(request_id)
            if record.version != expected_version:
                raise StaleWrite(
                    f"{request_id} is at version {record.version}, not {expected_version}"
                )
            changed = replace(
                record,
                state=transition(record.state, state),
                version=record.version + 1,
                updated_at=event.at,
                reason=reason,
                message=message,
                pool=pool,
                eta=eta,
            )
            self._records[request_id] = changed
            self._events[request_id].append(event)
            return changed

    def events(self, request_id: str) -> list[StatusEvent]:
        with self._lock:
            return list(self._events.get(request_id, []))

    def mark_announced(self, request_id: str, count: int) -> None:
        with self._lock:
            record = self._records.get(request_id)
            if record is None:
                raise UnknownRequest(request_id)
            if count > record.announced:
                self._records[request_id] = replace(record, announced=count)

    def in_states(self, *states: RequestState) -> list[RequestRecord]:
        with self._lock:
            found = [record for record in self._records.values() if record.state in states]
        return sorted(found, key=lambda r: (r.request.submitted_at, r.request_id))


class MemoryEventBus:
    """An EventBus that keeps what was published, in order."""

    def __init__(self) -> None:
        self.published: list[StatusEvent] = []
        self._lock = threading.Lock()

    def publish(self, event: StatusEvent) -> None:
        with self._lock:
            self.published.append(event)
