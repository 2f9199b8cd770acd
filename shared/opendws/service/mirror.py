"""The reconciler's mirror of the store: the requests not yet final, kept in memory between
passes and brought up to date by reading only what changed since the last pass.

Why a watermark read and not a Firestore listener: a Cloud Functions instance is idle between
invocations (a listener's stream would stall or reconnect, and bill, when the instance is
frozen), the replay and the tests run without any listener, and one indexed query per pass
(:meth:`~opendws.ports.store.Requests.changes`) works alike on Firestore and on the memory
fake. A cold instance reads everything once.

Invariant: the mirror is only ever a view. Every write the reconciler makes is guarded by the
record's version and the lease's fence, so a stale copy can cause a refused write (then the
next read brings the newer one), never a wrong one. A copy is replaced only by a newer version
of itself; a request that reached a final state leaves the mirror, and the pools of its
orders are noted (:meth:`RequestMirror.take_ended_pools`): whoever released them, the
reconciler looks there next for what the release left behind.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime

from opendws.domain.states import RequestState
from opendws.ports import RequestRecord, Requests, Watermark, order_name, submitted

# Who reads the changes (see RequestMirror.take_changed): the snapshot's parts, the sweep,
# the look at the plan's decisions.
CHANNELS = ("parts", "sweep", "due")


@dataclass(frozen=True, slots=True)
class Held:
    """What a refresh gives a pass: every request not yet final, and those it sweeps."""

    records: dict[str, RequestRecord]  # by id, oldest submission first (the pass's own copy)
    # Those not simply waiting in the queue: live ones and calendar blocks at Google's
    # review, in the order they became so.
    live: dict[str, RequestRecord]
    in_flight: int  # how many of them Google is still to serve (see in_flight)
    wanted: set[str]  # the names of their orders (an order by any other name is unwanted)
    # Jobs into calendar blocks not yet final, oldest submission first: stepped by
    # opendws.domain.block_jobs, never swept nor admitted.
    jobs: tuple[RequestRecord, ...] = ()


def in_flight(record: RequestRecord) -> bool:
    """Whether Google is still to serve ``record``: an order being created, or a calendar
    block under review."""
    return record.state is RequestState.PROVISIONING or submitted(record)


def _swept(record: RequestRecord) -> bool:
    """Whether a pass sweeps ``record``: live, or a calendar block under Google's review —
    never a job into a block, which has no order of its own (see Held.jobs)."""
    if record.request.block is not None:
        return False
    return record.state is not RequestState.PENDING or submitted(record)


class RequestMirror:
    """The requests not yet final, by id; safe to share between the passes of one process."""

    def __init__(self) -> None:
        # In submission order (then id), the order refresh returns: a newcomer usually comes
        # last, so the order is kept by appending and restored by a sort only when it did not.
        self._records: dict[str, RequestRecord] = {}
        self._in_order = True
        # Those a pass sweeps (see Held.live), in the order they became so, and the ids of
        # those of them Google is still to serve: kept as records come and go, so a pass
        # need not sort every request to find them.
        self._live: dict[str, RequestRecord] = {}
        self._flying: set[str] = set()
        self._jobs: dict[str, RequestRecord] = {}  # jobs into blocks (see Held.jobs)
        # Per live one, the names of its orders; and all of them.
        self._names: dict[str, tuple[str, ...]] = {}
        self._wanted: set[str] = set()
        self._watermark: Watermark | None = None
        # Pools of the orders of requests that became final since the last take.
        self._ended_pools: set[str] = set()
        # Per reader, the requests whose copy came, was replaced or left since its last take;
        # None: any may have (nothing taken since a read of everything).
        self._changed: dict[str, set[str] | None] = dict.fromkeys(CHANNELS)
        self._lock = threading.Lock()

    def refresh(self, store: Requests) -> Held:
        """Read what changed since the last refresh (everything, the first time) and return
        every request not yet final, oldest submission first (the order the store's queries
        give), and those a pass sweeps."""
        with self._lock:
            since = self._watermark
        changes = store.changes(since)
        with self._lock:
            if since is None:
                self._records, self._in_order = {}, True
                self._live, self._flying, self._jobs = {}, set(), {}
                self._names, self._wanted = {}, set()
                self._changed = dict.fromkeys(CHANNELS)
            for record in changes.records:
                self._keep(record)
            self._watermark = changes.watermark
            if not self._in_order:
                self._records = dict(
                    sorted(self._records.items(), key=lambda item: _submission(item[1]))
                )
                self._in_order = True
            return Held(
                dict(self._records),
                dict(self._live),
                len(self._flying),
                set(self._wanted),
                tuple(sorted(self._jobs.values(), key=_submission)),
            )

    def record(self, record: RequestRecord) -> None:
        """Keep what a write of this process stored (a final state leaves the mirror)."""
        with self._lock:
            self._keep(record)

    def current(self) -> list[RequestRecord]:
        """Every request not yet final, as the mirror holds it now (no read)."""
        with self._lock:
            return list(self._records.values())

    def get(self, request_id: str) -> RequestRecord | None:
        """The request's copy, if it is not final."""
        return self._records.get(request_id)  # one dict read: atomic, no lock needed

    def take_changed(self, channel: str) -> set[str] | None:
        """The requests whose copy came, was replaced or left since ``channel``'s last call
        (by a refresh or a :meth:`record`), and forget them for it; None if any may have (its
        first call, and its first after a read of everything). ``channel``: one of
        CHANNELS, each reader taking its own."""
        with self._lock:
            changed, self._changed[channel] = self._changed[channel], set()
        return changed

    def take_ended_pools(self) -> set[str]:
        """The pools where a request that left the mirror since the last call had orders (its
        last copy here, and its final record: either may name them), and forget them. A
        final record read again at the watermark, once gone, notes nothing more."""
        with self._lock:
            ended, self._ended_pools = self._ended_pools, set()
        return ended

    def _keep(self, record: RequestRecord) -> None:
        request_id = record.request_id
        held = self._records.get(request_id)
        if held is not None and held.version > record.version:
            return  # an older copy (read again at the watermark): the newer one stays
        if held is not record:
            for changed in self._changed.values():
                if changed is not None:
                    changed.add(request_id)
        if record.request.block is not None and not record.state.is_final:
            self._jobs[request_id] = record
        else:
            self._jobs.pop(request_id, None)
        if record.state.is_final:
            gone = self._records.pop(request_id, None)
            self._unlive(request_id)
            self._flying.discard(request_id)
            if gone is not None:
                self._ended_pools.update(lane.pool for lane in (*gone.orders, *record.orders))
            return
        if _swept(record):
            self._live[request_id] = record  # a dict keeps its place
            names = tuple(order_name(request_id, lane.attempt) for lane in record.orders)
            if self._names.get(request_id) != names:
                self._wanted.difference_update(self._names.get(request_id, ()))
                self._names[request_id] = names
                self._wanted.update(names)
        else:
            self._unlive(request_id)
        if in_flight(record):
            self._flying.add(request_id)
        else:
            self._flying.discard(request_id)
        if held is None and self._in_order and self._records:
            last = self._records[next(reversed(self._records))]
            if _submission(record) < _submission(last):
                self._in_order = False  # the next refresh sorts the mirror again
        self._records[request_id] = record  # a dict keeps its place

    def _unlive(self, request_id: str) -> None:
        """``request_id`` is no longer swept (final, or back in the queue)."""
        self._live.pop(request_id, None)
        self._wanted.difference_update(self._names.pop(request_id, ()))


def _submission(record: RequestRecord) -> tuple[datetime, str]:
    """Where ``record`` stands in the mirror's order."""
    return (record.request.submitted_at, record.request_id)
