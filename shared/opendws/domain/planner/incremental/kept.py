"""What the incremental planner keeps from one pass to the next (:class:`KeptPass`): its kept
queue (the entries and every index over them, :mod:`.queue`) and what the phases keep
besides; with the shapes the phases share (:class:`PlanReport`, :class:`NeedFullPass`, a
commitment's first slot) and the small rules they read (an entry planned again from its key,
a grant's cells, "admission carried out")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import numpy.typing as npt

from opendws.domain.model import Commitment, Grant, Snapshot
from opendws.domain.planner.incremental.full import _Entry, _FlexState, _Keys
from opendws.domain.planner.incremental.queue import KeptQueue, _Slot
from opendws.domain.planner.shapes import Candidate
from opendws.domain.planner.verdicts import Reason, rebuild
from opendws.domain.quotas import LimitKey
from opendws.domain.timeline import covering

# Below this many flex requests, a later now plans in full unless commitments are held.
# None by default: on the Philly replay's largest cluster (about a hundred queued in one
# pool; first 4.5 days, the same decisions either way), carrying every pass over took 0.70×
# the time of planning short queues in full without commitments (compiled; 0.79× in plain
# Python), and 0.97× with the default horizon's (when no commitment is held); over 20 days,
# 0.94×. A 10,000-request snapshot plans 3–4× faster carried over.
CLOCK_FLOOR = 0


@dataclass(frozen=True, slots=True)
class PlanReport:
    """How the last plan was made: in full (and why), or incrementally (from which rank, how
    many requests were visited, how many of them were tested and how many searched again, the
    others taking their slot again, and how many calendar blocks were decided again)."""

    full: bool
    why: str = ""  # full: the reason
    from_rank: int = 0  # incremental: 1-based rank of the first request a change reached
    walked: int = 0  # incremental: requests visited (those on a rolled-back row)
    searched: int = 0  # incremental: of those, searched again
    tested: int = 0  # incremental: of those, tested first for whether their slot stands
    redecided: int = 0  # incremental: pending calendar blocks decided again (a grant reached
    # one of their rows)

    def __reduce__(self) -> tuple[object, ...]:
        return rebuild(self)


class NeedFullPass(Exception):
    """An incremental pass cannot bring the kept pass up to the snapshot, for ``reason``: the
    plan is made in full instead (its :class:`PlanReport` says why). Raised by a phase part-way;
    the full pass rebuilds whatever the phases changed by then."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# A commitment's first slot, kept (see first_slot): (commitment,
# candidate, deadline minute, slot's first minute, (cells, pool row, needs) or None).
_FirstSlot = tuple[
    Commitment, Candidate, int, int, tuple[int, int, tuple[tuple[int, int], ...]] | None
]


# Minutes are counted from here where a kept cell must outlive the grid's origin.
_SLOTS_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)

# A row of the calendar ledger: a pool's row, or a quota limit's key.
_Resource = int | LimitKey


class KeptPass(KeptQueue):
    """What an incremental planner keeps between passes: its kept queue (the entries and their
    indexes, :class:`~.queue.KeptQueue`), and what the phases keep besides (the commitments as
    last seen, their first slots, the calendar blocks' readers and bookings, the keys). The
    phases, in the modules beside this one, read and change it through the planner they are
    given."""

    def __init__(self, *, clock_floor: int = CLOCK_FLOOR) -> None:
        """``clock_floor``: below this many flex requests (and no commitment held) a later
        now plans in full; by default none does (see :data:`CLOCK_FLOOR`)."""
        super().__init__()
        self._clock_floor = clock_floor
        self._snapshot: Snapshot | None = None
        # Where the last pass moved commitments earlier (None: not known, after a full pass):
        # request id → (the slot it was held at, the slot it moved to). What the next pass
        # tests them against differs there, unless that pass holds it where it moved (see
        # rehold).
        self._moves: dict[str, tuple[_Slot, _Slot]] | None = None
        # The commitments by request as the last look at them found them (the last one told for
        # each), the tuple they were read from, whether one request had two, and those that
        # started beyond the horizon then, by start: see looked_at (None: read them all).
        self._promised: dict[str, Commitment] | None = None
        self._promised_of: tuple[Commitment, ...] = ()
        self._twice = False
        self._beyond: list[tuple[datetime, int, Commitment]] = []
        # Strict-FIFO commitment's request id → the floor its reason was last judged from
        # (see rehold).
        self._judged_floors: dict[str, int] = {}
        # Request id → (commitment, candidate, deadline minute, first slot's minute, (its
        # cells, pool row, needs) or None), minutes counted from _SLOTS_EPOCH (see first_slot).
        self._first_slots: dict[str, _FirstSlot] = {}
        # ledger row → the pending calendar blocks whose decision reads it, in calendar order
        self._block_readers: dict[_Resource, list[Candidate]] = {}
        self._booked: dict[str, Grant] = {}  # calendar request id → the grant it was confirmed
        self._latest_submitted = datetime.min.replace(tzinfo=UTC)  # of any request kept
        # Why the last plan kept nothing (None: it kept its pass, or there was none): it held
        # commitments elsewhere than promised (COMMITMENTS_HELD), or it raised (PLAN_FAILED).
        self._unkept: str | None = None
        # The last full pass's policy keys, for the next full pass (see KeepingPass's keys).
        self._keys: _Keys = {}
        # Zeroed rows of the grid's length for the walk's deltas, kept from pass to pass: a
        # fresh one a rolled row costs its pages again (the walk zeroes what it changed).
        self._spare: list[npt.NDArray[np.int32]] = []
        self.last_pass = PlanReport(full=True, why="no pass yet")
        # Plans made so far, and the requests whose decision the last one set anew or dropped,
        # other than for a new place in line (None: any may have, after a full pass):
        # whoever carries plans out may look at those alone, if it saw the plan before (see
        # ReconcileService; a place in line alone is no news).
        self.plans = 0
        self.changed: set[str] | None = None

    def _carried_out(
        self,
        entry: _Entry,
        slot_of: Callable[[_Entry], tuple[int, int]],
        cells: tuple[int, int],
        row: int | None,
        needs: Sequence[tuple[int, int]],
    ) -> bool:
        """Whether what came for ``entry``'s request (a grant, or a commitment held at
        ``cells`` on ``row`` with ``needs``) holds exactly the slot the last pass placed it in
        (``slot_of``: its cells in the grid now): an admission, or a move, carried out. Not
        when a request ahead of it is held in the same pool by quota: that one sees the pool
        fuller now (what came counts from its start), and its reason may turn to capacity."""
        return (
            entry.best is not None
            and slot_of(entry) == cells
            and entry.row == row
            and sorted(needs) == sorted(entry.needs)
            and not any(
                other.reason is Reason.QUOTA and other.key < entry.key
                for other in self._by_pool.get(entry.row, ())
            )
        )


def _unheld(held: _Entry) -> _Entry:
    """A walk entry searched again from its key, as an arrival: for a commitment no longer
    held, or a request whose start came and went (the clock's restarts)."""
    return _Entry(
        held.key, held.candidate, held.length, held.first, held.last, 0, None, -1, (), None
    )


def _grant_cells(flex: _FlexState, grant: Grant) -> tuple[int, int]:
    """The grid cells ``grant`` covers, rounded outward as commitments are: (first, count)."""
    first, last = covering(grant.start_at, grant.end_at, flex.grid.origin, flex.cells)
    return first, max(0, last - first)
