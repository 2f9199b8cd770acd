"""Committed usage over time, in two exact-enough shapes.

:class:`MinuteGrid` answers "earliest start ≥ t where n units are free for d" for flex work. It
covers the flex horizon (at most 7 days of waiting plus 7 days of running) at one-minute
resolution, one row per resource (a pool, a tenant's quota, a cohort's quota). A search compares a
window of a row against the amount needed (vectorized), turns it into bytes and jumps over busy
stretches with ``bytes.find``/``rfind``, so its cost grows with the window, not with the number of
grants. Commitments are rounded *outward* to whole minutes, so a minute that looks free is free at
every instant in it: the grid may delay a start by under a minute, never overcommit.

:class:`StepProfile` is exact (integer microseconds) and long-ranged: calendar blocks reach 210
days ahead and must collide by one second, or touch end to start, exactly as asked.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

import numpy as np
import numpy.typing as npt

MINUTE = timedelta(minutes=1)
MICROSECOND = timedelta(microseconds=1)
# Above everything: far beyond any horizon in microseconds ("always"), and above every grid's
# cells ("no cell": the planner's sentinel for a cell not found yet).
FOREVER = 1 << 62

# After the first probe (the earliest start alone), a search window spans this many candidate
# starts (or the run length if more) and each miss widens it 4×: a near fit costs little and a far
# one at most about 4/3 of a full scan.
_FIRST_SPAN = 256
# Facts kept per request shape (see MinuteGrid._remember).


def floor_cells(offset: timedelta) -> int:
    """Whole minutes in ``offset``, rounded down (towards the past)."""
    return offset // MINUTE


def ceil_cells(offset: timedelta) -> int:
    """Whole minutes in ``offset``, rounded up (towards the future)."""
    return -((-offset) // MINUTE)


def covering(start_at: datetime, end_at: datetime, origin: datetime, cells: int) -> tuple[int, int]:
    """The cells of a grid (``cells`` long from ``origin``) that ``[start_at, end_at)`` covers,
    rounded outward to whole minutes as commitments are: ``(first, last)``, last exclusive
    (empty when last <= first)."""
    return max(0, floor_cells(start_at - origin)), min(cells, ceil_cells(end_at - origin))


class MinuteGrid:
    """Free amount per resource row per minute over ``[origin, origin + cells minutes)``.

    Cell ``k`` of row ``r`` holds what resource ``r`` has free over
    ``[origin + k min, origin + (k + 1) min)``. Free amounts only ever go down during a pass,
    so what a search learns stays true for the rest of the pass, and later searches start past
    it: per row and amount, a prefix of cells where that amount is never free; per pool need
    (shared by every tenant) and per whole set of needs, how far no run of a given length fits.

    Windows are compared into one reusable bytearray (through a numpy view, with no copy) and
    searched with ``bytearray.find``/``rfind``: every step is C code, so a request costs a
    handful of vectorized calls whatever the number of grants.
    """

    __slots__ = (
        "_busy_prefix",
        "_flags",
        "_free",
        "_no_fit",
        "_rows",
        "_scratch",
        "_scratch_view",
        "_view",
        "cells",
        "origin",
    )

    def __init__(
        self,
        origin: datetime,
        cells: int,
        limits: Sequence[int],
        commitments: Iterable[tuple[int, datetime, datetime, int]] = (),
    ) -> None:
        """Start every row at its limit, then subtract ``commitments`` given as
        ``(row, start_at, end_at, amount)``, each rounded outward to whole minutes."""
        self.origin = origin
        self.cells = cells
        limit_column = np.asarray(limits, dtype=np.int32)[:, np.newaxis]
        # Each commitment is a step up at its first cell and down after its last: add them
        # all into one difference array, then one running sum per row, in place and in int32
        # (a slice subtraction per commitment, or an int64 sum, costs several times more).
        rows: list[int] = []
        edges: list[int] = []
        amounts: list[int] = []
        first = last = 0
        start_was = end_was = None
        for row, start_at, end_at, amount in commitments:
            # One grant comes once per row it counts against, with the same times: round them
            # once (datetime arithmetic is most of this loop).
            if start_at is not start_was or end_at is not end_was:
                first, last = covering(start_at, end_at, origin, cells)
                start_was, end_was = start_at, end_at
            if last > first:
                rows += (row, row)
                edges += (first, last)
                amounts += (amount, -amount)
        self._free: npt.NDArray[np.int32]
        if rows:
            width = cells + 1
            steps = np.zeros((len(limits), width), dtype=np.int32)
            flat = np.asarray(rows, dtype=np.int64) * width + np.asarray(edges, dtype=np.int64)
            np.add.at(steps.reshape(-1), flat, np.asarray(amounts, dtype=np.int32))
            np.cumsum(steps, axis=1, out=steps)
            # Free = limit - usage, in the same buffer (no second grid-sized allocation); the
            # extra column past the last cell is never read.
            np.subtract(limit_column, steps, out=steps)
            self._free = steps[:, :cells]
        else:
            self._free = np.empty((len(limits), cells), dtype=np.int32)
            self._free[:] = limit_column
        # One 1-D view per row: slicing a row is then one cheap index, not a 2-D one.
        self._rows: list[npt.NDArray[np.int32]] = list(self._free)
        self._flags = bytearray(cells)
        self._view: npt.NDArray[np.bool_] = np.frombuffer(self._flags, dtype=np.bool_)
        self._scratch = bytearray(cells)
        self._scratch_view: npt.NDArray[np.bool_] = np.frombuffer(self._scratch, dtype=np.bool_)
        # (row, amount) → cells before this one never have that amount free again.
        self._busy_prefix: dict[tuple[int, int], int] = {}
        # needs → length bucket → (length, lo, n): from lo, no run of at least that length
        # fits before n. A fact also holds for every longer run: lookups use their own bucket
        # (checking the length) and the one below (always shorter). Keyed by needs first, so
        # a lookup hashes the needs once for both buckets.
        self._no_fit: dict[object, dict[int, tuple[int, int, int]]] = {}

    def __reduce__(self) -> tuple[object, ...]:
        """Copied and pickled as its origin, free amounts and what searches proved, and built
        again from them: the per-row views and the comparison buffer's view alias the grid's
        own arrays, and a copy of each would not (a copied grid would search stale cells)."""
        return (_restored_grid, (self.origin, self._free, self._busy_prefix, self._no_fit))

    def at(self, cell: int) -> datetime:
        """The instant where ``cell`` begins."""
        return self.origin + cell * MINUTE

    def free(self, row: int, cell: int) -> int:
        """Free amount of ``row`` during ``cell``."""
        return int(self._rows[row][cell])

    def free_over(self, row: int, start: int, stop: int) -> npt.NDArray[np.int32]:
        """A copy of the free amounts of ``row`` over cells ``[start, stop)``."""
        return self._rows[row][start:stop].copy()

    def lowest(self, row: int) -> int:
        """The least free amount of ``row`` at any cell of the grid."""
        return int(self._free[row].min())

    def fits(self, row: int, amount: int, start: int, length: int) -> bool:
        """True if ``amount`` is free in ``row`` over cells ``[start, start + length)``."""
        if start < 0 or start + length > self.cells:
            return False
        return length <= 0 or bool(self._rows[row][start : start + length].min() >= amount)

    def may_start(self, needs: Sequence[tuple[int, int]], start: int, stop: int) -> bool:
        """False if no cell of ``[start, stop)`` has every need's amount free: no run of
        ``needs`` can start there (a quick test that spares a search; True proves nothing)."""
        room = self._room(needs, start, min(stop, self.cells))
        return room is not None and bool(room.any())

    def room_runs(
        self, needs: Sequence[tuple[int, int]], start: int, stop: int
    ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
        """Over ``[start, stop)`` (at most the grid's end): per cell, whether every need's
        amount is free there, and the longest stretch of such cells that ends at or before it.
        Enough to tell, for any cell ``c`` in the range, whether a run of ``length`` could
        start before ``c``: it needs room in the cell just before ``c``, or a stretch of room
        of ``length`` cells before that."""
        room = self._room(needs, start, min(stop, self.cells))
        if room is None:
            return np.zeros(0, dtype=np.bool_), np.zeros(0, dtype=np.int64)
        index = np.arange(len(room))
        # Per cell, the last cell without room at or before it; a stretch's length is the
        # distance from there.
        last_short = np.maximum.accumulate(np.where(room, -1, index))
        return room, np.maximum.accumulate(index - last_short)

    def _room(
        self, needs: Sequence[tuple[int, int]], start: int, stop: int
    ) -> npt.NDArray[np.bool_] | None:
        """Per cell of ``[start, stop)``, whether every need's amount is free there (None for
        no cells)."""
        if start >= stop:
            return None
        rows = self._rows
        (row, amount), *rest = needs
        room = rows[row][start:stop] >= amount
        for row, amount in rest:
            np.logical_and(room, rows[row][start:stop] >= amount, out=room)
        return room

    def take(self, needs: Iterable[tuple[int, int]], start: int, length: int) -> None:
        """Commit every ``(row, amount)`` need over cells ``[start, start + length)``."""
        stop = start + length
        rows = self._rows
        for row, amount in needs:
            cells = rows[row][start:stop]
            np.subtract(cells, amount, cells)

    def take_all(self, takes: Sequence[tuple[Sequence[tuple[int, int]], int, int]]) -> bool:
        """Take every ``(needs, start, length)`` of ``takes``, as :meth:`take` one after the
        other would, if each :meth:`fits` (every need's amount free over its cells) once those
        before it are taken; True if so. Else take nothing and return False.

        Exact, in a few vectorized steps instead of a check and a take per item: if each fits
        in turn, every cell an item covers keeps a free amount of at least zero once all are
        taken (the last item on a cell left it so, and nothing after took from it); and if
        every covered cell does, each item had its amount free when its turn came (what the
        later ones took from its cells is still there to give back)."""
        rows: dict[int, int] = {}  # grid row → its index among the rows the takes touch
        stop = 0
        for needs, start, length in takes:
            if not needs:
                continue  # nothing to fit
            if start < 0 or start + length > self.cells:
                return False  # as fits: a run off the grid does not fit
            if length > 0:
                stop = max(stop, start + length)
                for row, _ in needs:
                    rows.setdefault(row, len(rows))
        if not rows:
            return True  # nothing is taken anywhere: everything fits
        width = stop + 1
        flat: list[int] = []
        amounts: list[int] = []
        for needs, start, length in takes:
            if length > 0:
                for row, amount in needs:
                    base = rows[row] * width
                    flat += (base + start, base + start + length)
                    amounts += (amount, -amount)
        index = np.asarray(flat, dtype=np.int64)
        usage = np.zeros((len(rows), width), dtype=np.int32)
        np.add.at(usage.reshape(-1), index, np.asarray(amounts, dtype=np.int32))
        np.cumsum(usage, axis=1, out=usage)
        covered = np.zeros((len(rows), width), dtype=np.int32)  # how many items cover a cell
        np.add.at(covered.reshape(-1), index, np.tile(np.asarray([1, -1], dtype=np.int32),
                                                      len(amounts) // 2))  # fmt: skip
        np.cumsum(covered, axis=1, out=covered)
        touched = list(rows)
        after = self._free[touched, :stop] - usage[:, :stop]
        if bool((after[covered[:, :stop] > 0] < 0).any()):
            return False
        self._free[touched, :stop] = after
        return True

    def give(self, needs: Iterable[tuple[int, int]], start: int, length: int) -> None:
        """Return every ``(row, amount)`` need over cells ``[start, start + length)`` (undo a
        :meth:`take`). Free amounts go up, so call :meth:`forget` before searching again."""
        stop = start + length
        rows = self._rows
        for row, amount in needs:
            cells = rows[row][start:stop]
            np.add(cells, amount, cells)

    def advance(self, cells: int) -> None:
        """Move the origin ``cells`` minutes later: the cells before it are past and dropped,
        the rest keep what they hold (the grid ends where it ended). What searches proved is
        forgotten: it was said from cells that moved."""
        if not 0 <= cells <= self.cells:
            raise ValueError(f"cannot advance a grid of {self.cells} cells by {cells}")
        self._free = self._free[:, cells:]
        self._rows = list(self._free)
        self.cells -= cells
        self.origin += cells * MINUTE
        self.forget()

    def forget(self) -> None:
        """Drop what searches proved: it holds only while free amounts go down."""
        self._busy_prefix.clear()
        self._no_fit.clear()

    def bounds(self, needs: Sequence[tuple[int, int]], lo: int, length: int) -> tuple[int, int]:
        """What earlier searches proved, from ``lo``, for a run of ``length``: no fit of the
        pool (``needs[0]``) alone starts before the first number, and no fit of all ``needs``
        before the second. A few lookups, no scan."""
        # The hottest call of a pass (several per request): the fact lookups are inlined.
        busy = self._busy_prefix
        bucket = length.bit_length()
        below = bucket - 1
        pool = needs[0]
        pool_lo = max(busy.get(pool, 0), lo)
        known = self._no_fit.get(pool)
        if known is not None:
            fact = known.get(bucket)
            if fact is not None and fact[0] <= length and fact[1] <= lo and fact[2] > pool_lo:
                pool_lo = fact[2]
            fact = known.get(below)
            if fact is not None and fact[1] <= lo and fact[2] > pool_lo:
                pool_lo = fact[2]  # a shorter bucket: its runs are always shorter
        if len(needs) == 1:
            return pool_lo, pool_lo
        # The pool's busy prefix is in ``pool_lo``; the quota needs' own prefixes are left
        # out: the facts of the whole needs already carry what their searches proved.
        start = pool_lo
        known = self._no_fit.get(needs)
        if known is not None:
            fact = known.get(bucket)
            if fact is not None and fact[0] <= length and fact[1] <= lo and fact[2] > start:
                start = fact[2]
            fact = known.get(below)
            if fact is not None and fact[1] <= lo and fact[2] > start:
                start = fact[2]
        return pool_lo, start

    def lower_bound(self, needs: Sequence[tuple[int, int]], lo: int, length: int) -> int:
        """A start no fit for ``needs`` from ``lo`` can precede (see :meth:`bounds`)."""
        return self.bounds(tuple(needs), lo, length)[1]

    def earliest_fit(
        self,
        needs: Sequence[tuple[int, int]],
        lo: int,
        hi: int,
        length: int,
        bounds: tuple[int, int] | None = None,
    ) -> int | None:
        """Earliest start cell ``k`` with ``lo ≤ k ≤ hi`` such that every ``(row, amount)`` of
        ``needs`` is free over ``[k, k + length)``; None if there is none (or it would run past
        the grid). ``needs[0]`` is the pool; the rest are quota limits. ``bounds`` may pass in
        what :meth:`bounds` returned for the same arguments.

        Starts past what earlier searches proved, probes that start alone (most requests fit
        there, or fail fast and jump past the short cell), then scans windows of candidate
        starts that widen 4× after each miss, pool first and then all needs combined.
        """
        hi = min(hi, self.cells - length)
        if lo > hi:
            return None
        needs = tuple(needs)  # part of the key of remembered facts (free if already a tuple)
        pool = needs[0]
        pool_lo, start = self.bounds(needs, lo, length) if bounds is None else bounds
        # The pool-only scan covers [pool_lo, ...) without gaps only if nothing else moved the
        # start; only then may its first fit become a fact shared by every tenant.
        pool_contiguous = start == pool_lo
        pool_first: int | None = None
        found: int | None = None
        # Probe the earliest start alone, unless earlier searches already moved past it: then
        # this need is contended and the first window of the scan covers that start anyway.
        if start <= hi and start == lo:
            past, failed = self._past_shortfall(needs, start, length)
            if failed != 0:
                pool_first = start
            if past == start:
                found = start
            start = past
        span = max(_FIRST_SPAN, length)
        while found is None and start <= hi:
            stop = min(hi, start + span)
            found, pool_fit = self._fit_in(needs, start, stop, length)
            if pool_first is None:
                pool_first = pool_fit
            start = stop + 1
            span *= 4
        if len(needs) > 1:
            self._remember(needs, length, lo, hi + 1 if found is None else found)
        if pool_contiguous:
            self._remember(pool, length, lo, hi + 1 if pool_first is None else pool_first)
        return found

    def _fit_in(
        self, needs: Sequence[tuple[int, int]], start: int, stop: int, length: int
    ) -> tuple[int | None, int | None]:
        """The earliest start in ``[start, stop]`` where every need is free over the run, and
        the earliest where the pool alone is: the pool is compared over the stretch, then each
        other need is combined into the same flags."""
        end = stop + length
        size = end - start
        view = self._view[:size]
        rows = self._rows
        flags = self._flags
        pool = needs[0]
        np.greater_equal(rows[pool[0]][start:end], pool[1], view)
        first = flags.find(b"\x01", 0, size)
        self._learn_prefix(pool, start, first if first >= 0 else size)
        pool_fit = _find_run(flags, size, length, first)
        if pool_fit < 0:
            return None, None
        if len(needs) == 1:
            return start + pool_fit, start + pool_fit
        # Only starts from the pool's first fit on can win: the other needs are compared from
        # there (a shorter stretch, the same answer).
        offset = start + pool_fit
        tail = view[pool_fit:]
        scratch = self._scratch_view[: size - pool_fit]
        for row, amount in needs[1:]:
            np.greater_equal(rows[row][offset:end], amount, scratch)
            np.logical_and(tail, scratch, tail)
        fit = _find_run(flags, size, length, flags.find(b"\x01", pool_fit, size))
        return (None if fit < 0 else start + fit), start + pool_fit

    def probe(self, needs: Sequence[tuple[int, int]], start: int, length: int) -> int:
        """``start`` if every need is free over ``[start, start + length)``; else a later
        start before which no fit of ``needs`` from ``start`` can begin (just past the last
        short cell of the first need that is short there). The run must lie in the grid."""
        return self._past_shortfall(needs, start, length)[0]

    def _past_shortfall(
        self, needs: Sequence[tuple[int, int]], start: int, length: int
    ) -> tuple[int, int]:
        """``(start, -1)`` if every need is free over ``[start, start + length)``; else the
        cell just past the last short cell of the first need that is not, and that need's
        index."""
        stop = start + length
        scratch = self._scratch
        view = self._scratch_view[:length]
        rows = self._rows
        for index, need in enumerate(needs):
            row, amount = need
            np.greater_equal(rows[row][start:stop], amount, view)
            short = scratch.rfind(b"\x00", 0, length)
            if short >= 0:
                first_free = scratch.find(b"\x01", 0, length)
                self._learn_prefix(need, start, first_free if first_free >= 0 else length)
                return start + short + 1, index
        return start, -1

    def _learn_prefix(self, need: tuple[int, int], start: int, busy_cells: int) -> None:
        """Record that ``need`` is not free over ``[start, start + busy_cells)`` when that
        extends the known busy prefix of its row (those cells never free up again)."""
        known = self._busy_prefix.get(need, 0)
        if start <= known < start + busy_cells:
            self._busy_prefix[need] = start + busy_cells

    def _remember(self, key: object, length: int, lo: int, no_fit_before: int) -> None:
        """Keep the fact "from ``lo``, no run of ``length`` fits ``key`` before
        ``no_fit_before``" in its length bucket, unless the one there already says more."""
        if no_fit_before <= lo:
            return
        bucket = length.bit_length()
        known = self._no_fit.get(key)
        if known is None:
            self._no_fit[key] = {bucket: (length, lo, no_fit_before)}
            return
        fact = known.get(bucket)
        if fact is None or no_fit_before >= fact[2] or (length <= fact[0] and lo <= fact[1]):
            known[bucket] = (length, lo, no_fit_before)


def _find_run(flags: bytearray, size: int, length: int, first: int) -> int:
    """Index of the first run of ``length`` one-bytes in ``flags[:size]``, searching from
    ``first`` (the index of a one-byte, or -1 if there is none): from each free cell, jump
    just past the last busy cell of the window it would need."""
    last_start = size - length
    pos = first
    while 0 <= pos <= last_start:
        busy = flags.rfind(b"\x00", pos, pos + length)
        if busy < 0:
            return pos
        pos = flags.find(b"\x01", busy + 1, size)
    return -1


def _restored_grid(
    origin: datetime,
    free: npt.NDArray[np.int32],
    busy_prefix: dict[tuple[int, int], int],
    no_fit: dict[object, dict[int, tuple[int, int, int]]],
) -> MinuteGrid:
    """A grid with these free amounts and facts, its views made afresh (see
    :meth:`MinuteGrid.__reduce__`)."""
    rows, cells = free.shape
    grid = MinuteGrid(origin, cells, [0] * rows)
    grid._free = np.array(free, dtype=np.int32)  # its own, C-ordered copy
    grid._rows = list(grid._free)
    grid._busy_prefix = dict(busy_prefix)
    grid._no_fit = {key: dict(known) for key, known in no_fit.items()}
    return grid


class StepProfile:
    """Usage of one resource as an exact step function of time.

    Times are integer microseconds from an origin the caller chooses. ``_levels[i]`` is the usage
    over ``[_times[i], _times[i + 1])``; before the first breakpoint and after the last the usage
    is zero (every interval added also adds its end). A breakpoint may repeat its neighbour's
    level: the step function, and so every answer, is the same with or without it.

    The levels are a numpy array: a long block raises, and a block's check scans, a slice of
    thousands of steps (a cohort's profile), in C rather than one Python object at a time.
    Breakpoints given up front (``breakpoints``) make a later :meth:`add` at those times a slice
    update; a time not yet a breakpoint is inserted (a copy of the levels).
    """

    __slots__ = ("_levels", "_peak", "_times")

    def __init__(
        self, intervals: Iterable[tuple[int, int, int]] = (), breakpoints: Iterable[int] = ()
    ) -> None:
        """Build from ``(start, end, amount)`` intervals in one sort-and-sum pass, with
        ``breakpoints`` (times later intervals will start or end at) as steps of no change."""
        deltas: dict[int, int] = dict.fromkeys(breakpoints, 0)
        for start, end, amount in intervals:
            if end > start:
                deltas[start] = deltas.get(start, 0) + amount
                deltas[end] = deltas.get(end, 0) - amount
        self._times = sorted(deltas)
        self._levels: npt.NDArray[np.int64] = np.cumsum(
            np.fromiter(map(deltas.__getitem__, self._times), np.int64, len(self._times))
        )
        # The highest level anywhere (zero outside the breakpoints), None until ``above`` needs
        # it again after an add: it answers a threshold nothing reaches without a scan.
        self._peak: int | None = None

    def add(self, start: int, end: int, amount: int) -> None:
        """Add ``amount`` over ``[start, end)``."""
        if end <= start:
            return
        first = self._split(start)
        last = self._split(end)
        raised = self._levels[first:last]
        raised += amount
        self._peak = None

    def peak(self, start: int, end: int) -> int:
        """Highest usage at any instant of ``[start, end)`` (zero where nothing is committed)."""
        times = self._times
        first = bisect.bisect_right(times, start) - 1
        last = bisect.bisect_left(times, end)
        if last <= max(first, 0):
            return 0
        peak = int(self._levels[max(first, 0) : last].max())
        return max(peak, 0) if first < 0 else peak

    def above(self, threshold: int) -> list[tuple[int, int]]:
        """Maximal intervals ``[start, end)`` where usage exceeds ``threshold``."""
        if threshold < 0:  # even zero usage exceeds it: blocked at every instant
            return [(-FOREVER, FOREVER)]
        if self._peak is None:
            self._peak = max(int(self._levels.max()), 0) if self._times else 0
        if self._peak <= threshold:
            return []
        # Each span opens at a breakpoint whose level exceeds the threshold after one that did
        # not (or none), and closes at the next breakpoint that does not; the last level is
        # zero, so every span closes.
        over = np.empty(len(self._times) + 1, dtype=np.int8)
        over[0] = 0
        np.greater(self._levels, threshold, out=over[1:].view(np.bool_))
        edges = np.diff(over)
        times = self._times
        opens = np.flatnonzero(edges == 1).tolist()
        closes = np.flatnonzero(edges == -1).tolist()
        return [(times[o], times[c]) for o, c in zip(opens, closes, strict=False)]

    def _split(self, time: int) -> int:
        """Make ``time`` a breakpoint (keeping the step function) and return its index."""
        times = self._times
        index = bisect.bisect_left(times, time)
        if index < len(times) and times[index] == time:
            return index
        level = int(self._levels[index - 1]) if index > 0 else 0
        times.insert(index, time)
        self._levels = np.insert(self._levels, index, level)
        return index


def feasible_starts(
    blocked: Iterable[tuple[int, int]], duration: int, lo: int, hi: int
) -> list[tuple[int, int]]:
    """Closed intervals ``[a, b]`` of starts ``s`` in ``[lo, hi]`` whose window
    ``[s, s + duration)`` meets no blocked interval ``[start, end)``.

    A blocked ``[start, end)`` rules out exactly the open interval of starts
    ``(start - duration, end)``: a window may end where a blocked span begins, or begin where it
    ends.
    """
    gaps: list[tuple[int, int]] = []
    cursor = lo
    for ruled_from, ruled_to in sorted((start - duration, end) for start, end in blocked):
        if ruled_from >= cursor and cursor <= hi:
            gaps.append((cursor, min(ruled_from, hi)))
        cursor = max(cursor, ruled_to)
    if cursor <= hi:
        gaps.append((cursor, hi))
    return gaps
