"""The parts of the reconciler's snapshot, kept between passes and built again only for the
requests whose record changed (see :class:`SnapshotParts`).

A pass's snapshot is the queue, the grants the live requests hold and, with commitments on,
the slot each held request was promised. Most of them are the same from one pass to the next:
building each again reads every request not yet final, every pass. Here each request's part
is kept with the record it was built from, and a pass builds again only those of the requests
the mirror saw change (:meth:`~opendws.service.mirror.RequestMirror.take_changed`) and those
whose held slot moved. A part that moves with the clock (a run Google is still creating, a
race's lanes) is not kept: the reconciler works it out every pass. A quiet pass hands the
planner the very tuples of the last one, which it recognises as unchanged at once.

Invariant: the snapshot is the one a loop over every record would build (the same parts; the
grants and commitments in another order, which no decision reads).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from opendws.domain.model import CapacityRequest, Commitment, Grant
from opendws.domain.planner.verdicts import Reason
from opendws.domain.states import RequestState
from opendws.ports import RequestRecord, submitted

S = RequestState

GRANTED = frozenset((S.PROVISIONING, S.ACTIVE, S.BOOKED))  # live states that hold a grant
# The reasons of a request held at a slot (a commitment is made for it, see PolicySettings).
HELD = frozenset(
    {Reason.NO_CAPACITY_UNTIL, Reason.QUOTA, Reason.POOL_SHORT_UNTIL, Reason.FIFO_BLOCKED}
)

_V = TypeVar("_V")


def moves_with_clock(record: RequestRecord) -> bool:
    """Whether the record's grant may move with the clock: a run Google is still creating
    (held until it should have been served), or one held from now on (no start yet)."""
    return record.state is S.PROVISIONING or (
        record.since is None and record.request.start_at is None
    )


def racing(record: RequestRecord) -> bool:
    """A flex request racing several pools: every lane holds its own grant until one wins."""
    return record.state is S.PROVISIONING and len(record.lanes) > 1


@dataclass(frozen=True, slots=True)
class Parts:
    """What a pass's snapshot is built from: the queue, the grants that stay where they are,
    the records whose grants the pass works out (they move with the clock), and the
    commitments."""

    pending: tuple[CapacityRequest, ...]
    fixed: tuple[Grant, ...]
    moving: tuple[RequestRecord, ...]
    commitments: tuple[Commitment, ...]


class SnapshotParts:
    """Per request not yet final, its part of the snapshot, kept between passes; safe to share
    between the passes of one process (a pass whose lease ran out may still be building)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset(committing=False)

    def _reset(self, *, committing: bool) -> None:
        self._valid = False
        self._committing = committing
        self._built: dict[str, RequestRecord] = {}  # the record each part was built from
        self._pending: dict[str, CapacityRequest] = {}
        self._fixed: dict[str, Grant] = {}
        self._moving: dict[str, RequestRecord] = {}
        self._eligible: dict[str, RequestRecord] = {}  # held: a commitment is made for it
        self._promised: dict[str, Commitment] = {}
        self._held: Mapping[str, tuple[str, datetime]] = {}
        self._last: Parts | None = None

    def update(
        self,
        changed: set[str] | None,
        current: Callable[[], Iterable[RequestRecord]],
        lookup: Callable[[str], RequestRecord | None],
        grant_of: Callable[[RequestRecord], Grant],
        held: Mapping[str, tuple[str, datetime]],
        *,
        committing: bool,
    ) -> Parts:
        """Bring the parts up to date and return them.

        ``changed``: the requests whose record may differ from the one their part was built
        from (None: any may; everything is built again from ``current()``, every request not
        yet final); ``lookup``: a request's record now (None once final). ``grant_of``: a
        record's grant; ``held``: per request, the (pool, start) the last plan held it at
        (with ``committing``, its commitment; else the pool and ETA it was told). A part whose
        inputs did not change keeps its objects, and the tuples too when none did.
        """
        with self._lock:
            try:
                if changed is None or not self._valid or committing != self._committing:
                    self._reset(committing=committing)
                    records = {record.request_id: record for record in current()}
                    ids: Iterable[str] = records
                    lookup = records.get
                else:
                    ids = changed
                parts, again = self._apply(ids, lookup, grant_of)
                if self._promise(again, held):
                    parts.add("commitments")
                self._valid = True
                return self._parts(parts)
            except BaseException:
                self._reset(committing=committing)  # half done: built again next time
                raise

    def _apply(
        self,
        ids: Iterable[str],
        lookup: Callable[[str], RequestRecord | None],
        grant_of: Callable[[RequestRecord], Grant],
    ) -> tuple[set[str], set[str]]:
        """Build again the part of each of ``ids`` whose record changed; returns which parts
        changed ("pending", "fixed", "moving") and the requests whose commitment may have."""
        touched: set[str] = set()
        again: set[str] = set()
        built = self._built
        for request_id in ids:
            record = lookup(request_id)
            if record is not None and built.get(request_id) is record:
                continue
            pending: CapacityRequest | None = None
            fixed: Grant | None = None
            moving: RequestRecord | None = None
            eligible: RequestRecord | None = None
            if record is None:
                built.pop(request_id, None)
            elif record.request.block is not None:
                built[request_id] = record  # a job into a block: the block holds the capacity
            else:
                built[request_id] = record
                state = record.state
                if state is S.PENDING and submitted(record):
                    fixed = grant_of(record)  # held while Google reviews it
                elif state is S.PENDING:
                    pending = record.request
                    if self._committing and record.reason in HELD and record.eta and record.pool:
                        eligible = record
                elif state in GRANTED and record.pool:
                    if moves_with_clock(record):  # a race too: it is still PROVISIONING
                        moving = record
                    else:
                        fixed = grant_of(record)
            if _set(self._pending, request_id, pending):
                touched.add("pending")
            if _set(self._fixed, request_id, fixed):
                touched.add("fixed")
            if _set(self._moving, request_id, moving):
                touched.add("moving")
            _set(self._eligible, request_id, eligible)
            again.add(request_id)
        return touched, again

    def _promise(self, again: set[str], held: Mapping[str, tuple[str, datetime]]) -> bool:
        """Make again the commitment of each request in ``again`` and of each whose held slot
        moved; whether one changed."""
        if held is not self._held:
            # A C-speed set difference: the requests whose held slot came, went or moved.
            again.update(key for key, _ in held.items() ^ self._held.items())
            self._held = held
        eligible, promised = self._eligible, self._promised
        changed = False
        for request_id in again:
            record = eligible.get(request_id)
            if record is None:
                changed |= promised.pop(request_id, None) is not None
                continue
            assert record.pool is not None  # eligible: it has both
            assert record.eta is not None
            # The slot the last plan held (the slots of one plan fit together; an ETA told
            # earlier may not, when the plan moved it later by less than the tolerance); on
            # a cold instance, the ETA it was told. Within the horizon every later move is
            # announced, so what was told is what is held.
            pool_id, start_at = held.get(request_id, (record.pool, record.eta))
            commitment = promised.get(request_id)
            if commitment is None or (commitment.pool_id, commitment.start_at) != (
                pool_id,
                start_at,
            ):
                promised[request_id] = Commitment(
                    request_id=request_id, pool_id=pool_id, start_at=start_at
                )
                changed = True
        return changed

    def _parts(self, touched: set[str]) -> Parts:
        """The tuples, each the last pass's own object if its part did not change."""
        last = self._last
        parts = Parts(
            pending=(
                last.pending
                if last is not None and "pending" not in touched
                else tuple(self._pending.values())
            ),
            fixed=(
                last.fixed
                if last is not None and "fixed" not in touched
                else tuple(self._fixed.values())
            ),
            moving=(
                last.moving
                if last is not None and "moving" not in touched
                else tuple(self._moving.values())
            ),
            commitments=(
                last.commitments
                if last is not None and "commitments" not in touched
                else tuple(self._promised.values())
            ),
        )
        self._last = parts
        return parts


def _set(parts: dict[str, _V], key: str, value: _V | None) -> bool:
    """Put ``value`` (None: no part) as ``key``'s part; whether that changed anything. A
    part replaced keeps its place (a dict keeps a key's place), so the order is stable."""
    if value is None:
        return parts.pop(key, None) is not None
    if parts.get(key) is value:
        return False
    parts[key] = value
    return True
