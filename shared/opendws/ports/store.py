"""The store, as narrow ports: each service asks only for what it uses.

One backend (Firestore ``requests/``, ``leases/``, ``pool_status/``, ``usage/``; or the memory
fake) implements them all, because a change and its usage entry, and a fenced write and the
lease it checks, must land in one atomic write; but no service sees more than it needs:

- :class:`Requests` — requests and their event records (intake, queries, the API);
- :class:`Outbox` — which events are published yet (whoever announces);
- :class:`ReconcilerLease` — the one reconciler's lease and its fence;
- :class:`PoolStatus` — pools that stocked out, and until when; how long Google took lately
  to serve an admitted request in each;
- :class:`UsageLedger` — what finished requests used.

The rules of each write live once, as pure functions beside the records
(:mod:`opendws.ports.records`); an adapter reads, applies them, and persists.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol

from opendws.domain.readiness import ReadySample
from opendws.domain.states import RequestState
from opendws.ports.records import (
    Change,
    Changes,
    CreateOutcome,
    Fence,
    LeaseView,
    RequestRecord,
    StatusEvent,
    UsageEntry,
    Watermark,
)


class Requests(Protocol):
    """Requests and their event records (Firestore ``requests/{id}`` and
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
        self, request_id: str, change: Change, *, fence: Fence | None = None
    ) -> RequestRecord:
        """Apply ``change`` (:meth:`Change.apply`) and append its event, in one atomic write
        guarded by the change's expected version and by ``fence``, when given; the change's
        usage entry, for a final state, lands in the same write (under the request's id).
        Raises StaleWrite if the stored version differs, Fenced if the fence's lease was taken
        over, UnknownRequest if there is none, and IllegalTransition if the life cycle
        forbids it."""
        ...

    def events(self, request_id: str) -> list[StatusEvent]:
        """Every event recorded for the request, oldest first."""
        ...

    def in_states(self, *states: RequestState) -> list[RequestRecord]:
        """Every request currently in one of ``states``, oldest submission first."""
        ...

    def changes(self, since: Watermark | None) -> Changes:
        """What changed since ``since``: every request created or written after it, in any
        state (a write landing while the read runs comes now or next time: it is never lost).
        ``None`` is a first read: every request not in a final state. Reads cost what
        changed, not what is stored (an index on the write time; a write log in memory)."""
        ...


class Outbox(Protocol):
    """Which of a request's events are published (an outbox cursor per request)."""

    def mark_announced(self, request_id: str, count: int) -> None:
        """Record that the request's first ``count`` events have been published (never moves
        back). Raises UnknownRequest if there is no such request."""
        ...

    def unannounced(self) -> list[RequestRecord]:
        """Every request with a change whose event is not yet marked published (an outbox a
        restarted reconciler drains), oldest submission first."""
        ...


class ReconcilerLease(Protocol):
    """The reconciler lease (Firestore ``leases/reconciler``): one pass at a time, and a fence
    that refuses the writes of a holder that lost it (:func:`~opendws.ports.records.next_lease`,
    :meth:`~opendws.ports.records.Fence.admits`)."""

    def acquire_lease(
        self, holder: str, now: datetime, ttl: timedelta, *, ask_again: bool = False
    ) -> Fence | None:
        """Take or renew the lease for ``ttl`` as :func:`next_lease` rules, atomically. None
        if another holder's lease is still running — and then, with ``ask_again``, ask that
        holder for one more pass when its own ends (:func:`asked_again`: coalesced, in the
        same atomic write)."""
        ...

    def release_lease(self, fence: Fence, *, served: bool = False) -> bool:
        """Give the lease up at once if ``fence`` still holds it (else do nothing). True when
        another pass was asked for while it held the lease: the caller runs one (whose
        acquire clears the ask). ``served``: the pass read the requests (it ended, completed
        or stopped on a stale view, rather than failed), so the nudges published before it
        started are served (:func:`~opendws.ports.records.served_after_release`)."""
        ...

    def lease_view(self) -> LeaseView:
        """The lease as stored now, in one read (no transaction, nothing written): what
        :func:`~opendws.ports.records.nudge_served` judges a nudge by."""
        ...


class PoolStatus(Protocol):
    """What the reconciler learned of pools (Firestore ``pool_status/``)."""

    def mark_pool_short(self, pool_id: str, until: datetime, fence: Fence | None = None) -> None:
        """Record that ``pool_id`` stocked out: nothing new starts there before ``until``.
        Never shortens a cool-down already recorded (:func:`cooldown_after`). Raises Fenced
        as :meth:`Requests.change` does."""
        ...

    def pool_shortages(self) -> dict[str, datetime]:
        """Every recorded cool-down, by pool id (past ones included; callers compare)."""
        ...

    def record_ready(self, pool_id: str, *samples: ReadySample, fence: Fence | None = None) -> None:
        """Record that orders admitted in ``pool_id`` became ACTIVE after each sample's
        ``took``, in one write. The pool keeps what
        :func:`~opendws.domain.readiness.samples_after` says (its newest samples, one per
        request: a repeat is a no-op). Raises Fenced as :meth:`Requests.change` does."""
        ...

    def ready_samples(self) -> dict[str, tuple[ReadySample, ...]]:
        """Every pool's kept samples, oldest first, by pool id (pools without any absent)."""
        ...


class UsageLedger(Protocol):
    """What finished requests used (Firestore ``usage/{id}``, written with the final state)."""

    def usage(self, tenant: str | None = None) -> list[UsageEntry]:
        """Every usage entry (of one tenant, if given), oldest end first."""
        ...


class RequestStore(Requests, Outbox, ReconcilerLease, PoolStatus, UsageLedger, Protocol):
    """The whole store, as one backend implements it: what the composition root builds and
    the contract suites check. Services take the narrow ports instead."""


class AnnouncedRequests(Requests, Outbox, Protocol):
    """Requests whose events the holder also publishes (intake, the end service)."""


class ReconcilerStore(Requests, Outbox, ReconcilerLease, PoolStatus, Protocol):
    """What a reconcile pass reads and writes: everything but the usage ledger (usage is
    written with a final change)."""
