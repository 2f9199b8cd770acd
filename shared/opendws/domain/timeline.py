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
import functools
import itertools
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

import numpy as np
import numpy.typing as npt

MINUTE = timedelta(minutes=1)
MICROSECOND = timedelta(microseconds=1)
# Far beyond any horizon, in microseconds: "always".
FOREVER = 1 << 62

# After the first probe (the earliest start alone), a search window spans this many candidate
# starts (or the run length if more) and each miss widens it 4×: a near fit costs little and a far
# one at most about 4/3 of a full scan.
_FIRST_SPAN = 256
# Cells per block of the coarse summary (least free amount per block) that long searches use.
BLOCK = 64
# Facts kept per request shape (see MinuteGrid._remember).
_FACTS_PER_KEY = 6


def floor_cells(offset: timedelta) -> int:
    """Whole minutes in ``offset``, rounded down (towards the past)."""
    return offset // MINUTE


def ceil_cells(offset: timedelta) -> int:
    """Whole minutes in ``offset``, rounded up (towards the future)."""
    return -((-offset) // MINUTE)


class MinuteGrid:
    """Free amount per resource row per minute over ``[origin, origin + cells minutes)``.

    Cell ``k`` of row ``r`` holds what resource ``r`` has free over
    ``[origin + k min, origin + (k + 1) min)``. Beside the cells, each row keeps the least free
    amount of every block of ``BLOCK`` cells: a run of ``length`` cells must cover whole blocks
    whose least free amount is enough, so long searches scan only the stretches where such
    blocks line up, not every cell.

    Free amounts only ever go down during a pass, so what a search learns stays true: the grid
    remembers, per row and amount, a prefix of cells where that amount is not free, and per
    request shape how far a search found no fit; later searches start past both.

    Windows are compared into one reusable bytearray (through a numpy view, with no copy) and
    searched with ``bytearray.find``/``rfind``: every step is C code, so a request costs a
    handful of vectorized calls whatever the number of grants.
    """

    __slots__ = (
        "_block_flags",
        "_block_min",
        "_block_scratch",
        "_block_view",
        "_busy_prefix",
        "_flags",
        "_free",
        "_no_fit",
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
        blocks = -(-cells // BLOCK)
        # Padding cells past ``cells`` stay at the limit: no window reaches them.
        self._free: npt.NDArray[np.int32] = np.empty((len(limits), blocks * BLOCK), np.int32)
        self._free[:] = np.asarray(limits, dtype=np.int32)[:, np.newaxis]
        for row, start_at, end_at, amount in commitments:
            first = max(0, floor_cells(start_at - origin))
            last = min(cells, ceil_cells(end_at - origin))
            if last > first:
                self._free[row, first:last] -= amount
        self._block_min: npt.NDArray[np.int32] = self._free.reshape(len(limits), blocks, BLOCK).min(
            axis=2
        )
        self._flags = bytearray(blocks * BLOCK)
        self._view: npt.NDArray[np.bool_] = np.frombuffer(self._flags, dtype=np.bool_)
        self._scratch = bytearray(blocks * BLOCK)
        self._scratch_view: npt.NDArray[np.bool_] = np.frombuffer(self._scratch, dtype=np.bool_)
        self._block_flags = bytearray(blocks)
        self._block_view: npt.NDArray[np.bool_] = np.frombuffer(self._block_flags, np.bool_)
        self._block_scratch: npt.NDArray[np.bool_] = np.empty(blocks, dtype=np.bool_)
        # (row, amount) → cells before this one never have that amount free again.
        self._busy_prefix: dict[tuple[int, int], int] = {}
        # needs → facts (length, lo, n): no start in [lo, n) fits a run of at least length.
        self._no_fit: dict[tuple[object, ...], list[tuple[int, int, int]]] = {}

    def at(self, cell: int) -> datetime:
        """The instant where ``cell`` begins."""
        return self.origin + cell * MINUTE

    def free(self, row: int, cell: int) -> int:
        """Free amount of ``row`` during ``cell``."""
        return int(self._free[row, cell])

    def lowest(self, row: int) -> int:
        """The least free amount of ``row`` at any cell of the grid."""
        return int(self._block_min[row].min())

    def fits(self, row: int, amount: int, start: int, length: int) -> bool:
        """True if ``amount`` is free in ``row`` over cells ``[start, start + length)``."""
        if start < 0 or start + length > self.cells:
            return False
        return bool((self._free[row, start : start + length] >= amount).all())

    def take(self, needs: Iterable[tuple[int, int]], start: int, length: int) -> None:
        """Commit every ``(row, amount)`` need over cells ``[start, start + length)``."""
        stop = start + length
        first_block = start // BLOCK
        end_block = -(-stop // BLOCK)
        for row, amount in needs:
            free = self._free[row]
            cells = free[start:stop]
            np.subtract(cells, amount, cells)
            touched = free[first_block * BLOCK : end_block * BLOCK]
            touched.reshape(-1, BLOCK).min(axis=1, out=self._block_min[row, first_block:end_block])

    def earliest_fit(
        self, needs: Sequence[tuple[int, int]], lo: int, hi: int, length: int
    ) -> int | None:
        """Earliest start cell ``k`` with ``lo ≤ k ≤ hi`` such that every ``(row, amount)`` of
        ``needs`` is free over ``[k, k + length)``; None if there is none (or it would run past
        the grid).

        Probes the earliest possible start alone first (most requests fit there, or fail fast
        and jump past the last short cell); then scans stretches of candidate starts, chosen
        from the block summaries for long runs, with all needs combined into one set of flags.
        Facts proven on the way are remembered for later searches.
        """
        hi = min(hi, self.cells - length)
        if lo > hi:
            return None
        key = tuple(needs)
        start = max(
            lo,
            self._proven(key, lo, length),
            *(self._busy_prefix.get(need, 0) for need in needs),
        )
        found = None
        if start <= hi:
            past = self._past_shortfall(needs, start, length)
            if past == start:
                found = start
            start = past
        span = max(_FIRST_SPAN, length)
        while found is None and start <= hi:
            if length >= 2 * BLOCK:
                stretch = self._next_stretch(needs, start, hi, length)
                if stretch is None:
                    break
                start, stop = stretch
            else:
                stop = min(hi, start + span)
            found = self._fit_in(needs, start, stop, length)
            start = stop + 1
            span *= 4
        # Free amounts never grow back: where no start fits now, none will this pass.
        self._remember(key, length, lo, hi + 1 if found is None else found)
        return found

    def _fit_in(
        self, needs: Sequence[tuple[int, int]], start: int, stop: int, length: int
    ) -> int | None:
        """The earliest start ``k`` in ``[start, stop]`` where every need is free over
        ``[k, k + length)``: the needs are compared and combined over the stretch once, then
        the flags are searched with jumps over busy cells."""
        flags = self._flags
        size = stop + length - start
        view = self._view[:size]
        scratch = self._scratch_view[:size]
        for index, (row, amount) in enumerate(needs):
            cells = self._free[row, start : stop + length]
            if index == 0:
                np.greater_equal(cells, amount, view)
            else:
                np.greater_equal(cells, amount, scratch)
                np.logical_and(view, scratch, view)
        pos = flags.find(b"\x01", 0, size)
        last_start = size - length
        while 0 <= pos <= last_start:
            busy = flags.rfind(b"\x00", pos, pos + length)
            if busy < 0:
                return start + pos
            pos = flags.find(b"\x01", busy + 1, size)
        return None

    def _next_stretch(
        self, needs: Sequence[tuple[int, int]], start: int, hi: int, length: int
    ) -> tuple[int, int] | None:
        """The first range ``[a, b]`` of starts, ``start ≤ a ≤ b ≤ hi``, whose windows could
        fit: every block wholly inside a window of ``length`` cells must have every need free
        throughout, so candidate starts gather around runs of such blocks."""
        whole = length // BLOCK - 1  # blocks wholly inside any window of this length
        first_block = start // BLOCK
        end_block = min((hi + length) // BLOCK + 1, self._block_min.shape[1])
        count = end_block - first_block
        view = self._block_view[:count]
        scratch = self._block_scratch[:count]
        for index, (row, amount) in enumerate(needs):
            minima = self._block_min[row, first_block:end_block]
            if index == 0:
                np.greater_equal(minima, amount, view)
            else:
                np.greater_equal(minima, amount, scratch)
                np.logical_and(view, scratch, view)
        blocks = self._block_flags
        needle = _ones(whole)
        run = blocks.find(needle, 0, count)
        while run >= 0:
            run_end = blocks.find(b"\x00", run, count)
            run_end = count if run_end < 0 else run_end
            # Windows whose whole blocks all lie in [run, run_end): see the class docstring.
            low = max(start, (first_block + run - 1) * BLOCK + 1)
            high = min(hi, (first_block + run_end + 1) * BLOCK - length - 1)
            if low <= high:
                return low, high
            run = blocks.find(needle, run_end, count)
        return None

    def _past_shortfall(self, limits: Sequence[tuple[int, int]], start: int, length: int) -> int:
        """``start`` if every ``(row, amount)`` limit is free over ``[start, start + length)``,
        else the cell just past the last cell of that window where one is not."""
        stop = start + length
        scratch = self._scratch
        view = self._scratch_view[:length]
        for limit in limits:
            row, amount = limit
            np.greater_equal(self._free[row, start:stop], amount, view)
            short = scratch.rfind(b"\x00", 0, length)
            if short >= 0:
                first_free = scratch.find(b"\x01", 0, length)
                self._learn_prefix(limit, start, first_free if first_free >= 0 else length)
                return start + short + 1
        return start

    def _learn_prefix(self, need: tuple[int, int], start: int, busy_cells: int) -> None:
        """Record that ``need`` is not free over ``[start, start + busy_cells)`` when that
        extends the known busy prefix of its row (those cells never free up again)."""
        known = self._busy_prefix.get(need, 0)
        if start <= known < start + busy_cells:
            self._busy_prefix[need] = start + busy_cells

    def _proven(self, key: tuple[object, ...], lo: int, length: int) -> int:
        """A start before which an earlier search for the same needs proved no fit: a fact
        learned for a run no longer than ``length``, from a lower bound no later than ``lo``."""
        proven = 0
        for fact_length, fact_lo, no_fit_before in self._no_fit.get(key, ()):
            if fact_length <= length and fact_lo <= lo and no_fit_before > proven:
                proven = no_fit_before
        return proven

    def _remember(self, key: tuple[object, ...], length: int, lo: int, no_fit_before: int) -> None:
        """Keep the fact "no start in [lo, no_fit_before) fits a run of ``length``" for
        ``key``, dropping the facts it makes redundant (a few per key at most)."""
        facts = [
            fact
            for fact in self._no_fit.get(key, ())
            if not (length <= fact[0] and lo <= fact[1] and no_fit_before >= fact[2])
        ]
        facts.append((length, lo, no_fit_before))
        self._no_fit[key] = facts[-_FACTS_PER_KEY:]


@functools.cache
def _ones(count: int) -> bytes:
    """``count`` one-bytes: the needle for a run of that many free blocks."""
    return b"\x01" * max(count, 1)


class StepProfile:
    """Usage of one resource as an exact step function of time.

    Times are integer microseconds from an origin the caller chooses. ``_levels[i]`` is the usage
    over ``[_times[i], _times[i + 1])``; before the first breakpoint and after the last the usage
    is zero (every interval added also adds its end).
    """

    __slots__ = ("_levels", "_times")

    def __init__(self, intervals: Iterable[tuple[int, int, int]] = ()) -> None:
        """Build from ``(start, end, amount)`` intervals in one sort-and-sum pass."""
        deltas: dict[int, int] = {}
        for start, end, amount in intervals:
            if end > start:
                deltas[start] = deltas.get(start, 0) + amount
                deltas[end] = deltas.get(end, 0) - amount
        self._times = sorted(deltas)
        self._levels = list(itertools.accumulate(deltas[t] for t in self._times))

    def add(self, start: int, end: int, amount: int) -> None:
        """Add ``amount`` over ``[start, end)``."""
        if end <= start:
            return
        first = self._split(start)
        last = self._split(end)
        levels = self._levels
        for index in range(first, last):
            levels[index] += amount

    def peak(self, start: int, end: int) -> int:
        """Highest usage at any instant of ``[start, end)`` (zero where nothing is committed)."""
        times = self._times
        first = bisect.bisect_right(times, start) - 1
        last = bisect.bisect_left(times, end)
        peak = max(self._levels[max(first, 0) : last], default=0)
        return max(peak, 0) if first < 0 else peak

    def above(self, threshold: int) -> list[tuple[int, int]]:
        """Maximal intervals ``[start, end)`` where usage exceeds ``threshold``."""
        if threshold < 0:  # even zero usage exceeds it: blocked at every instant
            return [(-FOREVER, FOREVER)]
        spans: list[tuple[int, int]] = []
        open_at: int | None = None
        for time, level in zip(self._times, self._levels, strict=True):
            if level > threshold and open_at is None:
                open_at = time
            elif level <= threshold and open_at is not None:
                spans.append((open_at, time))
                open_at = None
        return spans

    def _split(self, time: int) -> int:
        """Make ``time`` a breakpoint (keeping the step function) and return its index."""
        times = self._times
        index = bisect.bisect_left(times, time)
        if index < len(times) and times[index] == time:
            return index
        level = self._levels[index - 1] if index > 0 else 0
        times.insert(index, time)
        self._levels.insert(index, level)
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
