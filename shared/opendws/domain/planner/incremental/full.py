"""The incremental planner's full pass (:class:`KeepingPass`): the admission pass
(``admission._Pass``), keeping what the next plan starts from through the pass's hooks: each
flex request's entry (:class:`_Entry`: its key, window, floor, slot, needs, reason, and the
reason its run a cell longer would be held for), the commitments held and where the plan put
them, the grid a day longer with each row's least free amount before any placement
(:class:`_FlexState`), and the policy keys for the next full pass. ``admit`` alone keeps
none of it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from opendws.domain.admission import _Flex, _Pass
from opendws.domain.model import CapacityRequest, Snapshot
from opendws.domain.planner.commitments import Kept, undo
from opendws.domain.planner.search import Option, ShapeKey, longer_reason
from opendws.domain.planner.shapes import Candidate
from opendws.domain.planner.verdicts import Reason
from opendws.domain.policy import FlexKey, flex_key
from opendws.domain.quotas import LimitKey
from opendws.domain.timeline import MinuteGrid

# Cells a kept grid reaches beyond what its pass searches, so that later passes can move its
# origin with the clock (a larger grid decides nothing differently: every run searched still
# ends by its own deadline plus its length).
KEPT_SLACK_CELLS = 24 * 60


class _Entry:
    """One flex request in policy order and what its search found, kept by a planner that
    plans again (see :mod:`opendws.domain.planner.incremental`)."""

    __slots__ = (
        "alt",
        "best",
        "candidate",
        "clear",
        "first",
        "floor",
        "key",
        "last",
        "length",
        "needs",
        "reason",
        "row",
    )

    def __init__(
        self,
        key: FlexKey,
        candidate: Candidate,
        length: int,
        first: int,
        last: int,
        floor: int,
        best: int | None,
        row: int,
        needs: tuple[tuple[int, int], ...],
        reason: Reason | None,
    ) -> None:
        self.key = key
        self.candidate = candidate
        self.length = length  # run, in cells, from a whole minute
        self.first = first  # run, in cells, from now (cell 0): at most one more
        self.last = last  # latest start cell (its deadline)
        self.floor = floor  # the strict-FIFO floor its search started from
        self.best = best  # start cell, None if no slot opens in its window
        self.row = row  # pool row it is placed in (-1 if none)
        self.needs = needs  # what it took in the grid from ``best`` for ``length`` cells
        self.reason = reason  # why it is held (None if admitted or waiting)
        # Why it would be held were its run from now a cell longer, while it takes ``length``
        # cells (``first == length``), judged in the same view: the clock moving within a
        # minute changes only ``first`` (see longer_reason).
        self.alt = reason
        # Bit ``i`` set: the pool of its ``i``-th option (see options) alone has no room, in
        # its view, for a run of ``length`` cells from any start that could win (from that
        # option's earliest start, and its floor, up to its deadline if it has no slot, else
        # up to its slot: the slot itself included for a more preferred pool, which wins a
        # tie). Proved and kept by the incremental planner (see its stands.stands); none at first.
        self.clear = 0

    @property
    def span(self) -> int:
        """Cells its placement takes: from now, or from a whole minute."""
        return self.first if self.best == 0 else self.length


@dataclass(kw_only=False, slots=True)
class _FlexState:
    """What a flex step leaves for the next plan: the grid after every placement, its rows,
    and each request's entry in policy order."""

    entries: list[_Entry]
    grid: MinuteGrid
    limits: list[int]
    limit_row: dict[LimitKey, int]
    binding: list[bool]
    lowest: list[int]  # per row, its least free amount from commitments alone
    short: list[int]
    cells: int
    # Each request shape's options (see options): binding, limit_row and short stay as they
    # are while the state lives (a change to any of them plans in full), so these hold too.
    shapes: dict[ShapeKey, tuple[Option, ...]]
    # The commitments held before the policy order (``hold_commitments``), or None if one
    # was not held at its first slot. The grid holds each at its slot (``held_slots``: id →
    # its Kept), not where the plan moved it earlier; each entry (in policy order, none of
    # ``entries``) says where the plan put it (best, row) and why it waits.
    held: list[_Entry] | None = None
    held_slots: dict[str, Kept] = field(default_factory=dict)


_Keys = dict[str, tuple[CapacityRequest, bool, timedelta, FlexKey]]


class KeepingPass(_Pass):
    """The admission pass, keeping what the incremental planner's next plan starts from (see
    the module docstring)."""

    def __init__(self, snapshot: Snapshot, now: datetime, *, keys: _Keys) -> None:
        """``keys``: the policy keys the last full pass worked out (see :attr:`keys`); one is
        taken again only for the same request object, strictness and half-life."""
        super().__init__(snapshot, now)
        self.flex: _FlexState | None = None
        # request id → (request, strict, half-life, policy key) of each flex request planned
        # and stamped by now: its key does not move with the clock (policy.flex_key), so the
        # next full pass may take it from here.
        self._keys_before = keys
        self.keys: _Keys = {}
        self._lowest: list[int] = []
        self._entries: list[_Entry] = []
        self._held_entries: list[_Entry] = []  # the commitments held, in policy order

    def _policy_key(
        self, request: CapacityRequest, strict: bool, now: datetime, half_life: timedelta
    ) -> FlexKey:
        known = self._keys_before.get(request.request_id)
        if (
            known is not None
            and known[0] is request
            and known[1] is strict
            and known[2] == half_life
        ):
            self.keys[request.request_id] = known
            return known[3]
        key = flex_key(request, strict=strict, now=now, half_life=half_life)
        if request.submitted_at <= now:  # a later stamp ages from now: not kept
            self.keys[request.request_id] = (request, strict, half_life, key)
        return key

    def _grid_slack(self) -> int:
        return KEPT_SLACK_CELLS

    def _grid_made(self, grid: MinuteGrid, rows: int) -> None:
        self._lowest = [grid.lowest(row) for row in range(rows)]

    def _promised(
        self, key: FlexKey, candidate: Candidate, length: int, first: int, last: int,
        cell: int, row: int, needs: tuple[tuple[int, int], ...],
    ) -> None:  # fmt: skip
        self._held_entries.append(
            _Entry(key, candidate, length, first, last, 0, cell, row, needs, None)
        )

    def _searched(
        self, grid: MinuteGrid, short: Sequence[int], key: FlexKey, candidate: Candidate,
        length: int, first: int, last: int, floor: int, best: int | None, row: int,
        needs: tuple[tuple[int, int], ...], reason: Reason | None,
    ) -> None:  # fmt: skip
        entry = _Entry(key, candidate, length, first, last, floor, best, row, needs, reason)
        if best:
            entry.alt = longer_reason(
                grid, row, candidate.request.gang.units, best, floor, short[row], length,
                first, reason,
            )  # fmt: skip
        self._entries.append(entry)

    def _finished(self, flex: _Flex, all_first: bool) -> None:
        held = self._held_entries
        if held:
            # The kept grid holds each commitment where it was promised (a later pass moves
            # them earlier again from there); each entry says where it went.
            undo(flex.grid, flex.moves)
            final = {candidate.request.request_id: (row, cell, reason)
                     for row, cell, _, candidate, reason in flex.placed}  # fmt: skip
            for entry in held:
                entry.row, entry.best, entry.reason = final[entry.candidate.request.request_id]
        self.flex = _FlexState(
            self._entries,
            flex.grid,
            flex.limits,
            flex.limit_row,
            flex.binding,
            self._lowest,
            flex.short,
            flex.cells,
            flex.shapes,
            held if all_first else None,
            flex.kept,
        )
