"""Ports: what the services need from the outside world, as narrow Protocols, and the records
that cross them.

Adapters implement these for Google Cloud (``opendws.adapters``) and in memory (fakes for fast
tests); one contract suite per port runs on both, so a fake cannot drift from the real thing.
Every record is a frozen value; timestamps are timezone-aware UTC.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from opendws.domain.model import CapacityRequest, GangShape, Mode
from opendws.domain.states import RequestState

EVENT_SCHEMA = "opendws.event/v1"


class CreateOutcome(StrEnum):
    """What :meth:`RequestStore.create` did."""

    CREATED = "CREATED"  # the request is new and is now stored, with its first event
    DUPLICATE = "DUPLICATE"  # the same request (same content) was already stored: nothing changed
    CONFLICT = "CONFLICT"  # another request with this id but different content exists: refused


class StaleWrite(RuntimeError):
    """A guarded write found the record at another version than expected: someone else wrote
    first, so this writer's view is stale and its change is dropped."""


class UnknownRequest(KeyError):
    """No request with this id is stored."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusEvent:
    """One state change (or ETA change) of a request, as stored and as published on
    ``capacity-events`` (``opendws.event/v1``)."""

    request_id: str
    tenant: str
    state: RequestState
    previous_state: RequestState | None
    at: datetime
    reason: str | None = None  # machine-readable: a domain Reason or an intake rule
    message: str = ""  # one line a person can act on
    eta: datetime | None = None
    position: int | None = None
    pool: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The event as the public JSON object."""
        return {
            "schema": EVENT_SCHEMA,
            "request_id": self.request_id,
            "tenant": self.tenant,
            "state": self.state.value,
            "previous_state": None if self.previous_state is None else self.previous_state.value,
            "at": _iso(self.at),
            "reason": self.reason,
            "message": self.message,
            "eta": None if self.eta is None else _iso(self.eta),
            "position": self.position,
            "pool": self.pool,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StatusEvent:
        """Read back what :meth:`to_json` wrote."""
        previous = data.get("previous_state")
        eta = data.get("eta")
        return cls(
            request_id=data["request_id"],
            tenant=data["tenant"],
            state=RequestState(data["state"]),
            previous_state=None if previous is None else RequestState(previous),
            at=datetime.fromisoformat(data["at"]),
            reason=data.get("reason"),
            message=data.get("message", ""),
            eta=None if eta is None else datetime.fromisoformat(eta),
            position=data.get("position"),
            pool=data.get("pool"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """A stored request: what was asked, where it is in its life cycle, and a version that
    every guarded write checks and increments."""

    request: CapacityRequest
    state: RequestState
    version: int  # 1 when created; +1 on every change
    digest: str  # content fingerprint: tells a redelivery from a conflicting reuse of the id
    updated_at: datetime
    reason: str | None = None
    message: str = ""
    pool: str | None = None
    eta: datetime | None = None
    announced: int = 0  # how many of its events have been published (an outbox cursor)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def tenant(self) -> str:
        return self.request.tenant


class RequestStore(Protocol):
    """Where requests and their event records live (Firestore ``requests/{id}`` and
    ``requests/{id}/events/{seq}``)."""

    def create(self, record: RequestRecord, event: StatusEvent) -> CreateOutcome:
        """Store a new request and its first event together, only if no request with its id
        exists (create-if-absent). A second create of the same content changes nothing
        (DUPLICATE); of other content is refused (CONFLICT). Safe to repeat."""
        ...

    def get(self, request_id: str) -> RequestRecord | None:
        """The stored request, or None."""
        ...

    def change(
        self, request_id: str, *, expected_version: int, state: RequestState, event: StatusEvent,
        reason: str | None = None, message: str = "", pool: str | None = None,
        eta: datetime | None = None,
    ) -> RequestRecord:  # fmt: skip
        """Move the request to ``state`` and append ``event``, in one atomic write guarded by
        ``expected_version``. Raises StaleWrite if the stored version differs, UnknownRequest
        if there is none, and IllegalTransition if the life cycle forbids the move."""
        ...

    def events(self, request_id: str) -> list[StatusEvent]:
        """Every event recorded for the request, oldest first."""
        ...

    def mark_announced(self, request_id: str, count: int) -> None:
        """Record that the request's first ``count`` events have been published (never moves
        back). Raises UnknownRequest if there is no such request."""
        ...

    def in_states(self, *states: RequestState) -> list[RequestRecord]:
        """Every request currently in one of ``states``, oldest submission first."""
        ...


class EventBus(Protocol):
    """Where state changes are announced (Pub/Sub ``capacity-events``)."""

    def publish(self, event: StatusEvent) -> None:
        """Publish one event, with ``request_id``, ``tenant`` and ``state`` as attributes.
        Returns once the bus has accepted it; raises if it could not."""
        ...


class Clock(Protocol):
    """The only source of "now" outside tests."""

    def now(self) -> datetime:
        """The current instant, timezone-aware UTC."""
        ...


def request_to_document(request: CapacityRequest) -> dict[str, Any]:
    """The request as plain JSON-friendly values (durations in seconds, instants in ISO 8601)."""
    gang = request.gang
    return {
        "request_id": request.request_id,
        "tenant": request.tenant,
        "mode": request.mode.value,
        "gang": {
            "vm_count": gang.vm_count,
            "accelerator": gang.accelerator,
            "machine_type": gang.machine_type,
            "accelerators_per_vm": gang.accelerators_per_vm,
            "topology": gang.topology,
        },
        "locations": list(request.locations),
        "run_duration_s": request.run_duration.total_seconds(),
        "max_wait_s": None if request.max_wait is None else request.max_wait.total_seconds(),
        "start_at": None if request.start_at is None else _iso(request.start_at),
        "submitted_at": _iso(request.submitted_at),
        "priority": request.priority,
        "labels": dict(request.labels),
    }


def request_from_document(data: dict[str, Any]) -> CapacityRequest:
    """Read back what :func:`request_to_document` wrote."""
    gang = data["gang"]
    max_wait = data.get("max_wait_s")
    start_at = data.get("start_at")
    return CapacityRequest(
        request_id=data["request_id"],
        tenant=data["tenant"],
        mode=Mode(data["mode"]),
        gang=GangShape(
            vm_count=gang["vm_count"],
            accelerator=gang["accelerator"],
            machine_type=gang.get("machine_type"),
            accelerators_per_vm=gang.get("accelerators_per_vm"),
            topology=gang.get("topology"),
        ),
        locations=tuple(data["locations"]),
        run_duration=timedelta(seconds=data["run_duration_s"]),
        max_wait=None if max_wait is None else timedelta(seconds=max_wait),
        start_at=None if start_at is None else datetime.fromisoformat(start_at),
        submitted_at=datetime.fromisoformat(data["submitted_at"]),
        priority=data.get("priority", 0),
        labels=tuple(sorted(data.get("labels", {}).items())),
    )


def content_digest(request: CapacityRequest) -> str:
    """A fingerprint of what the request asks for — not of when it arrived — so that the same
    message delivered twice matches and a different request reusing the id does not."""
    document = request_to_document(request)
    del document["submitted_at"]
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _iso(at: datetime) -> str:
    return at.isoformat()
