"""The timeline: minute rounding, exact step profiles, feasible starts and the minute grid.

Only public behaviour is tested. ``MinuteGrid.earliest_fit`` is compared against a brute-force
oracle over many seeded random grids, with takes between (and after) queries, because the grid
remembers what earlier searches proved and must still answer exactly after further takes.
"""

from __future__ import annotations

import copy
import pickle
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest

from opendws.domain.timeline import (
    FOREVER,
    MinuteGrid,
    StepProfile,
    ceil_cells,
    feasible_starts,
    floor_cells,
)
from tests.builders import DAY, MINUTE, NOW

SECOND = timedelta(seconds=1)
MICRO = timedelta(microseconds=1)
MINUTE_US = 60_000_000

Needs = Sequence[tuple[int, int]]

# --- floor_cells / ceil_cells --------------------------------------------------------------------

CELLS = {
    "zero": (timedelta(0), 0, 0),
    "1 microsecond": (MICRO, 0, 1),
    "1 second": (SECOND, 0, 1),
    "just under a minute": (MINUTE - MICRO, 0, 1),
    "exactly a minute": (MINUTE, 1, 1),
    "just over a minute": (MINUTE + MICRO, 1, 2),
    "90 seconds": (90 * SECOND, 1, 2),
    "just under two minutes": (2 * MINUTE - MICRO, 1, 2),
    "exactly two minutes": (2 * MINUTE, 2, 2),
    "exactly 7 days": (7 * DAY, 7 * 24 * 60, 7 * 24 * 60),
    "7 days and a second": (7 * DAY + SECOND, 7 * 24 * 60, 7 * 24 * 60 + 1),
    "minus 1 microsecond": (-MICRO, -1, 0),
    "minus 30 seconds": (-30 * SECOND, -1, 0),
    "minus a minute": (-MINUTE, -1, -1),
    "minus a minute and a microsecond": (-MINUTE - MICRO, -2, -1),
}


@pytest.mark.parametrize(("offset", "floor", "ceil"), CELLS.values(), ids=CELLS.keys())
def test_floor_and_ceil_cells(offset: timedelta, floor: int, ceil: int) -> None:
    assert floor_cells(offset) == floor
    assert ceil_cells(offset) == ceil


# --- StepProfile ---------------------------------------------------------------------------------

ONE = [(10, 20, 3)]
OVERLAP = [(0, 10, 2), (5, 15, 3)]
TOUCHING = [(0, 10, 2), (10, 20, 2)]

# (intervals, window start, window end, peak)
PEAKS = {
    "empty profile": ([], -100, 100, 0),
    "window ends where the interval starts": (ONE, 0, 10, 0),
    "window ends a microsecond into the interval": (ONE, 0, 11, 3),
    "window starts at the interval's start": (ONE, 10, 11, 3),
    "window is the interval": (ONE, 10, 20, 3),
    "window inside the interval": (ONE, 12, 15, 3),
    "window covers the interval": (ONE, -50, 50, 3),
    "window starts in the interval's last microsecond": (ONE, 19, 30, 3),
    "window starts where the interval ends": (ONE, 20, 30, 0),
    "window wholly before": (ONE, -10, 5, 0),
    "window wholly after": (ONE, 25, 30, 0),
    "overlap: before the second starts": (OVERLAP, 0, 5, 2),
    "overlap: across the second's start": (OVERLAP, 4, 6, 5),
    "overlap: the overlap alone": (OVERLAP, 5, 10, 5),
    "overlap: last microsecond of the overlap": (OVERLAP, 9, 10, 5),
    "overlap: after the first ends": (OVERLAP, 10, 15, 3),
    "overlap: after both": (OVERLAP, 15, 20, 0),
    "touching intervals do not add up": (TOUCHING, 0, 20, 2),
    "touching: across the joint": (TOUCHING, 9, 11, 2),
    "empty interval is ignored": ([(5, 5, 7), (6, 4, 7)], 0, 10, 0),
    "same interval twice adds up": ([(0, 10, 2), (0, 10, 2)], 3, 4, 4),
    "intervals given out of order": ([(30, 40, 1), (0, 50, 1), (10, 35, 1)], 0, 50, 3),
}


@pytest.mark.parametrize(("intervals", "start", "end", "peak"), PEAKS.values(), ids=PEAKS.keys())
def test_step_profile_peak(
    intervals: list[tuple[int, int, int]], start: int, end: int, peak: int
) -> None:
    assert StepProfile(intervals).peak(start, end) == peak


@pytest.mark.parametrize(("intervals", "start", "end", "peak"), PEAKS.values(), ids=PEAKS.keys())
def test_step_profile_peak_after_adding_one_by_one(
    intervals: list[tuple[int, int, int]], start: int, end: int, peak: int
) -> None:
    profile = StepProfile()
    for interval in intervals:
        profile.add(*interval)
    assert profile.peak(start, end) == peak


# (intervals, threshold, spans above it)
ABOVE = {
    "empty profile, threshold 0": ([], 0, []),
    "one interval above 0": (ONE, 0, [(10, 20)]),
    "one interval, threshold just under it": (ONE, 2, [(10, 20)]),
    "one interval, threshold equal to it": (ONE, 3, []),
    "overlap above 2": (OVERLAP, 2, [(5, 15)]),
    "overlap above 3": (OVERLAP, 3, [(5, 10)]),
    "overlap above 1": (OVERLAP, 1, [(0, 15)]),
    "touching intervals merge": (TOUCHING, 1, [(0, 20)]),
    "touching intervals at the threshold": (TOUCHING, 2, []),
    "separate intervals stay apart": ([(0, 10, 2), (11, 20, 2)], 1, [(0, 10), (11, 20)]),
    "a dip below the threshold splits": (
        [(0, 10, 2), (10, 20, 1), (20, 30, 2)],
        1,
        [(0, 10), (20, 30)],
    ),
}


@pytest.mark.parametrize(("intervals", "threshold", "spans"), ABOVE.values(), ids=ABOVE.keys())
def test_step_profile_above(
    intervals: list[tuple[int, int, int]], threshold: int, spans: list[tuple[int, int]]
) -> None:
    assert StepProfile(intervals).above(threshold) == spans


@pytest.mark.parametrize("intervals", [[], ONE, OVERLAP], ids=["empty", "one", "overlap"])
def test_step_profile_above_a_negative_threshold_is_always(
    intervals: list[tuple[int, int, int]],
) -> None:
    assert StepProfile(intervals).above(-1) == [(-FOREVER, FOREVER)]


def test_step_profile_add_changes_only_its_interval() -> None:
    profile = StepProfile(OVERLAP)
    profile.add(12, 30, 4)
    profile.add(40, 40, 9)  # empty: ignored
    profile.add(41, 40, 9)  # reversed: ignored
    assert [profile.peak(t, t + 1) for t in (0, 5, 10, 12, 15, 29, 30, 40)] == [
        2,
        5,
        3,
        7,
        4,
        4,
        0,
        0,
    ]
    assert profile.above(3) == [(5, 10), (12, 30)]


def usage_at(intervals: Sequence[tuple[int, int, int]], time: int) -> int:
    return sum(amount for start, end, amount in intervals if start <= time < end)


def spans_where(flags: Sequence[bool], origin: int) -> list[tuple[int, int]]:
    """Maximal [start, end) runs of True in ``flags`` (index i is time origin + i)."""
    spans: list[tuple[int, int]] = []
    open_at = None
    for index, flag in enumerate([*flags, False]):
        if flag and open_at is None:
            open_at = origin + index
        elif not flag and open_at is not None:
            spans.append((open_at, origin + index))
            open_at = None
    return spans


@pytest.mark.parametrize("seed", range(100), ids=[f"seed-{seed}" for seed in range(100)])
def test_step_profile_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    intervals: list[tuple[int, int, int]] = []
    for _ in range(rng.randint(0, 8)):
        start = rng.randint(-20, 60)
        intervals.append((start, start + rng.randint(1, 30), rng.randint(1, 5)))
    profile = StepProfile(intervals)
    for _ in range(rng.randint(0, 6)):
        start = rng.randint(-20, 60)
        added = (start, start + rng.randint(0, 30), rng.randint(1, 5))
        profile.add(*added)
        intervals.append(added)
    times = range(-40, 100)
    usage = [usage_at(intervals, time) for time in times]
    for _ in range(60):
        start = rng.randint(-30, 90)
        end = start + rng.randint(1, 40)
        expected = max(usage[start - times.start : end - times.start])
        assert profile.peak(start, end) == expected, (start, end)
    for threshold in range(max(usage) + 1):
        expected_spans = spans_where([level > threshold for level in usage], times.start)
        assert profile.above(threshold) == expected_spans, threshold


@pytest.mark.parametrize("seed", range(50), ids=[f"seed-{seed}" for seed in range(50)])
def test_step_profile_breakpoints_given_up_front_change_no_answer(seed: int) -> None:
    """Breakpoints of no change (the times blocks may later be committed at) answer as the
    same profile without them, before and after intervals are added there and elsewhere."""
    rng = random.Random(seed)
    intervals = [(start, start + rng.randint(1, 30), rng.randint(1, 5)) for start in
                 (rng.randint(-20, 60) for _ in range(rng.randint(0, 8)))]  # fmt: skip
    later = [(start, start + rng.randint(1, 30), rng.randint(1, 5)) for start in
             (rng.randint(-20, 60) for _ in range(rng.randint(0, 6)))]  # fmt: skip
    breakpoints = [time for start, end, _ in later for time in (start, end)]
    breakpoints += [rng.randint(-30, 90) for _ in range(5)]
    plain, seeded = StepProfile(intervals), StepProfile(intervals, breakpoints)
    for step in range(len(later) + 1):
        for _ in range(20):
            start = rng.randint(-30, 90)
            end = start + rng.randint(1, 40)
            assert seeded.peak(start, end) == plain.peak(start, end), (step, start, end)
        for threshold in range(-1, 12):
            assert seeded.above(threshold) == plain.above(threshold), (step, threshold)
        if step < len(later):
            plain.add(*later[step])
            seeded.add(*later[step])


# --- feasible_starts -----------------------------------------------------------------------------

# (blocked spans, duration, lo, hi, closed ranges of starts)
FEASIBLE = {
    "nothing blocked": ([], 5, 0, 30, [(0, 30)]),
    "hi below lo": ([], 5, 10, 9, []),
    "lo equals hi": ([], 5, 7, 7, [(7, 7)]),
    "window may end where a block begins": ([(10, 20)], 5, 0, 30, [(0, 5), (20, 30)]),
    "window may begin where a block ends": ([(0, 10)], 5, 0, 30, [(10, 30)]),
    "single-point gap": ([(0, 10), (15, 25)], 5, 0, 40, [(10, 10), (25, 40)]),
    "gap one short": ([(0, 10), (14, 25)], 5, 0, 40, [(25, 40)]),
    "gap one long": ([(0, 10), (16, 25)], 5, 0, 40, [(10, 11), (25, 40)]),
    "block of one microsecond": ([(10, 11)], 5, 0, 30, [(0, 5), (11, 30)]),
    "lo inside the first range": ([(10, 20)], 5, 3, 30, [(3, 5), (20, 30)]),
    "lo at the last start before a block": ([(10, 20)], 5, 5, 30, [(5, 5), (20, 30)]),
    "lo among ruled-out starts": ([(10, 20)], 5, 6, 30, [(20, 30)]),
    "lo where the block ends": ([(10, 20)], 5, 20, 30, [(20, 30)]),
    "hi before the block rules anything out": ([(10, 20)], 5, 0, 4, [(0, 4)]),
    "hi at the last start before the block": ([(10, 20)], 5, 0, 5, [(0, 5)]),
    "hi among ruled-out starts": ([(10, 20)], 5, 0, 19, [(0, 5)]),
    "hi where the block ends": ([(10, 20)], 5, 0, 20, [(0, 5), (20, 20)]),
    "unsorted overlapping blocks": ([(30, 40), (10, 20), (15, 35)], 5, 0, 60, [(0, 5), (40, 60)]),
    "nested blocks": ([(10, 50), (20, 30)], 5, 0, 60, [(0, 5), (50, 60)]),
    "blocked always": ([(-FOREVER, FOREVER)], 5, 0, 100, []),
    "block wholly before lo": ([(-50, -10)], 5, 0, 10, [(0, 10)]),
    "block ending at lo": ([(-50, 0)], 5, 0, 10, [(0, 10)]),
    "block starting at hi + duration": ([(15, 20)], 5, 0, 10, [(0, 10)]),
    "block just inside hi + duration": ([(14, 20)], 5, 0, 10, [(0, 9)]),
    "duration longer than every gap": ([(10, 20), (30, 40)], 11, 0, 60, [(40, 60)]),
    "negative lo": ([(0, 10)], 5, -20, 20, [(-20, -5), (10, 20)]),
}


@pytest.mark.parametrize(
    ("blocked", "duration", "lo", "hi", "expected"), FEASIBLE.values(), ids=FEASIBLE.keys()
)
def test_feasible_starts(
    blocked: list[tuple[int, int]],
    duration: int,
    lo: int,
    hi: int,
    expected: list[tuple[int, int]],
) -> None:
    assert feasible_starts(blocked, duration, lo, hi) == expected


def closed_runs(flags: Sequence[bool], origin: int) -> list[tuple[int, int]]:
    return [(start, end - 1) for start, end in spans_where(flags, origin)]


@pytest.mark.parametrize("seed", range(100), ids=[f"seed-{seed}" for seed in range(100)])
def test_feasible_starts_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    blocked = []
    for _ in range(rng.randint(0, 6)):
        start = rng.randint(-10, 80)
        blocked.append((start, start + rng.randint(1, 15)))
    duration = rng.randint(1, 12)
    lo = rng.randint(-15, 40)
    hi = rng.randint(lo - 3, 90)
    ok = [
        all(max(start, a) >= min(start + duration, b) for a, b in blocked)
        for start in range(lo, hi + 1)
    ]
    assert feasible_starts(blocked, duration, lo, hi) == closed_runs(ok, lo)


# --- MinuteGrid: construction, free, lowest, fits, take ------------------------------------------


def at(minutes: float) -> datetime:
    return NOW + timedelta(minutes=minutes)


# (commitments on a one-row grid of 5 cells with limit 10, free amount per cell)
ROUNDING = {
    "none": ([], [10, 10, 10, 10, 10]),
    "00:00:30-00:01:30 occupies cells 0 and 1": ([(at(0.5), at(1.5), 3)], [7, 7, 10, 10, 10]),
    "exact minutes": ([(at(1), at(3), 3)], [10, 7, 7, 10, 10]),
    "one microsecond past a minute": (
        [(at(1) + MICRO, at(2) + MICRO, 3)],
        [10, 7, 7, 10, 10],
    ),
    "one microsecond before a minute": ([(at(1) - MICRO, at(2) - MICRO, 3)], [7, 7, 10, 10, 10]),
    "one second inside a cell": ([(at(2) + SECOND, at(2) + 2 * SECOND, 4)], [10, 10, 6, 10, 10]),
    "starts before the origin": ([(at(-5), at(0.5), 3)], [7, 10, 10, 10, 10]),
    "ends after the grid": ([(at(3.5), at(60), 3)], [10, 10, 10, 7, 7]),
    "covers the whole grid": ([(at(-1), at(6), 2)], [8, 8, 8, 8, 8]),
    "wholly before the origin": ([(at(-10), at(0), 3)], [10, 10, 10, 10, 10]),
    "wholly after the grid": ([(at(5), at(9), 3)], [10, 10, 10, 10, 10]),
    "overlapping commitments add up": (
        [(at(0), at(3), 3), (at(2), at(4), 4)],
        [7, 7, 3, 6, 10],
    ),
    "touching commitments on whole minutes do not overlap": (
        [(at(0), at(2), 3), (at(2), at(4), 4)],
        [7, 7, 6, 6, 10],
    ),
    "touching commitments inside a minute share it": (
        [(at(0), at(1.5), 3), (at(1.5), at(4), 4)],
        [7, 3, 6, 6, 10],
    ),
    "overcommitted goes negative": ([(at(0), at(1), 6), (at(0), at(1), 6)], [-2, 10, 10, 10, 10]),
}


@pytest.mark.parametrize(("commitments", "free"), ROUNDING.values(), ids=ROUNDING.keys())
def test_minute_grid_rounds_commitments_outward(
    commitments: list[tuple[datetime, datetime, int]], free: list[int]
) -> None:
    grid = MinuteGrid(NOW, 5, [10], [(0, start, end, amount) for start, end, amount in commitments])
    assert [grid.free(0, cell) for cell in range(5)] == free
    assert grid.lowest(0) == min(free)


def test_minute_grid_rows_are_independent() -> None:
    grid = MinuteGrid(
        NOW, 4, [5, 8, 3], [(1, at(1), at(2), 8), (2, at(0), at(4), 1), (0, at(3), at(9), 5)]
    )
    assert [[grid.free(row, cell) for cell in range(4)] for row in range(3)] == [
        [5, 5, 5, 0],
        [8, 0, 8, 8],
        [2, 2, 2, 2],
    ]
    assert [grid.lowest(row) for row in range(3)] == [0, 0, 2]


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copied_minute_grid_is_its_own_and_searches_its_own_cells(how: str) -> None:
    """A copy (by ``copy`` or ``pickle``) holds the same free amounts and facts, searches its
    own cells, and shares nothing with the grid it came from: the per-row views and the
    comparison buffer alias the grid's own arrays, which copying each one apart would undo."""
    grid = MinuteGrid(NOW, 100, [4, 6])
    grid.take([(0, 4)], 10, 20)
    grid.advance(5)  # a grid moved with the clock is a view of a larger one
    assert grid.earliest_fit([(0, 3)], 0, 60, 10) == 25  # a fact the copy keeps
    copied = copy.deepcopy(grid) if how == "deepcopy" else pickle.loads(pickle.dumps(grid))
    assert (copied.origin, copied.cells) == (grid.origin, grid.cells)
    assert [copied.free(0, cell) for cell in range(95)] == [
        grid.free(0, cell) for cell in range(95)
    ]
    assert copied.earliest_fit([(0, 3)], 0, 60, 10) == 25
    copied.take([(0, 1), (1, 6)], 25, 40)  # the copy's cells change, the grid's do not
    assert copied.earliest_fit([(0, 4)], 0, 90, 10) == 65
    assert copied.earliest_fit([(0, 1), (1, 1)], 20, 90, 5) == 65
    assert copied.lowest(1) == 0
    assert grid.earliest_fit([(0, 4)], 0, 90, 10) == 25
    assert grid.earliest_fit([(0, 1), (1, 1)], 20, 90, 5) == 25
    assert grid.lowest(1) == 6


def test_minute_grid_at_and_size() -> None:
    grid = MinuteGrid(NOW, 3000, [1])
    assert grid.origin == NOW
    assert grid.cells == 3000
    assert grid.at(0) == NOW
    assert grid.at(1) == NOW + MINUTE
    assert grid.at(2999) == NOW + 2999 * MINUTE


def test_minute_grid_take_commits_every_need() -> None:
    grid = MinuteGrid(NOW, 200, [10, 20, 30])
    grid.take([(0, 3), (2, 7)], 60, 70)  # crosses the block boundary at 64 and 128
    grid.take([(0, 2)], 125, 10)
    assert [grid.free(0, cell) for cell in (59, 60, 124, 125, 129, 130, 134, 135)] == [
        10,
        7,
        7,
        5,
        5,
        8,
        8,
        10,
    ]
    assert [grid.free(1, cell) for cell in range(200)] == [20] * 200
    assert [grid.free(2, cell) for cell in (59, 60, 129, 130)] == [30, 23, 23, 30]
    assert [grid.lowest(row) for row in range(3)] == [5, 20, 23]


def test_minute_grid_take_up_to_the_last_cell() -> None:
    grid = MinuteGrid(NOW, 100, [4])
    grid.take([(0, 4)], 90, 10)
    assert grid.free(0, 99) == 0
    assert grid.lowest(0) == 0
    assert grid.earliest_fit([(0, 1)], 0, 100, 91) is None
    assert grid.earliest_fit([(0, 1)], 0, 100, 90) == 0


def test_probe_answers_the_start_itself_or_jumps_past_the_first_short_need() -> None:
    # Row 0 (the pool): limit 4, 1 free over [10, 20). Row 1 (a quota): limit 5, 0 free at 30.
    grid = MinuteGrid(NOW, 100, [4, 5], [(0, at(10), at(20), 3), (1, at(30), at(31), 5)])
    assert grid.probe([(0, 2), (1, 5)], 0, 10) == 0  # both free over [0, 10)
    assert grid.probe([(0, 2), (1, 5)], 0, 15) == 15  # the pool is short over [10, 15)
    assert grid.probe([(0, 1), (1, 5)], 25, 10) == 31  # the pool fits; the quota is short at 30
    assert grid.probe([(0, 2), (1, 1)], 5, 30) == 20  # the first short need decides


# One row of 300 cells, limit 4, free 1 over [100, 110) and 0 at cell 200.
FITS_GRID = ((0, at(100), at(110), 3), (0, at(200), at(201), 4))
# (amount, start, length, fits)
FITS = {
    "before the busy stretch": (2, 0, 100, True),
    "running into the busy stretch": (2, 0, 101, False),
    "starting in the last busy cell": (2, 109, 5, False),
    "starting where it frees up": (2, 110, 90, True),
    "running into the empty cell": (1, 110, 91, False),
    "amount still free in the busy stretch": (1, 50, 100, True),
    "the whole limit": (4, 0, 100, True),
    "over the limit": (5, 0, 1, False),
    "up to the grid's end": (4, 201, 99, True),
    "past the grid's end": (4, 201, 100, False),
    "before the grid's start": (1, -1, 5, False),
    "whole grid, nothing needed": (0, 0, 300, True),
}


@pytest.mark.parametrize(("amount", "start", "length", "fits"), FITS.values(), ids=FITS.keys())
def test_minute_grid_fits(amount: int, start: int, length: int, fits: bool) -> None:
    grid = MinuteGrid(NOW, 300, [4], FITS_GRID)
    assert grid.fits(0, amount, start, length) is fits


@pytest.mark.parametrize("seed", range(40))
def test_room_runs_says_where_there_is_room_and_the_longest_stretch_so_far(seed: int) -> None:
    """``room_runs(needs, start, stop)`` gives, per cell of ``[start, stop)`` up to the grid's
    end, whether every need's amount is free there (as ``may_start`` over that one cell) and
    the longest stretch of such cells ending at or before it: admission's test of whether a
    commitment could start earlier reads both."""
    rng = random.Random(seed)
    cells = rng.randint(1, 60)
    commitments = [
        (row, NOW + rng.randint(0, cells) * MINUTE, NOW + rng.randint(0, cells) * MINUTE, amount)
        for row in (0, 1)
        for amount in (rng.randint(1, 3) for _ in range(rng.randint(0, 6)))
    ]
    grid = MinuteGrid(NOW, cells, [4, 6], commitments)
    for _ in range(20):
        needs = [(0, rng.randint(0, 5))] + ([(1, rng.randint(0, 7))] if rng.random() < 0.5 else [])
        start = rng.randint(0, cells + 2)
        stop = rng.randint(0, cells + 5)
        room, longest = grid.room_runs(needs, start, stop)
        expected = [
            grid.may_start(needs, cell, cell + 1) for cell in range(start, min(stop, cells))
        ]
        assert list(room) == expected
        stretch = best = 0
        for index, free in enumerate(expected):
            stretch = stretch + 1 if free else 0
            best = max(best, stretch)
            assert longest[index] == best, (needs, start, stop, index)


def _free_cells(grid: MinuteGrid, rows: int) -> list[list[int]]:
    return [[grid.free(row, cell) for cell in range(grid.cells)] for row in range(rows)]


@pytest.mark.parametrize("seed", range(200))
def test_take_all_takes_all_exactly_when_each_fits_in_turn(seed: int) -> None:
    """``take_all`` is ``fits`` then ``take`` for each item in turn when every item fits so,
    and leaves the grid untouched otherwise (also for runs off the grid, amounts of zero and
    rows that start over their limit): admission holds a pass's commitments with it."""
    rng = random.Random(seed)
    cells = rng.randint(1, 40)
    rows = 3
    grants = [
        (rng.randrange(rows), NOW + rng.randint(0, cells) * MINUTE,
         NOW + rng.randint(0, cells) * MINUTE, rng.randint(0, 4))
        for _ in range(rng.randint(0, 5))
    ]  # fmt: skip
    takes = []
    for _ in range(rng.randint(0, 6)):
        needs = [(row, rng.randint(0, 3)) for row in rng.sample(range(rows), rng.randint(0, 2))]
        takes.append((needs, rng.randint(-1, cells), rng.randint(0, cells // 2 + 1)))
    grid = MinuteGrid(NOW, cells, [4, 5, 3], grants)
    shadow = MinuteGrid(NOW, cells, [4, 5, 3], grants)
    before = _free_cells(grid, rows)
    each_fits = True
    for needs, start, length in takes:
        if not all(shadow.fits(row, amount, start, length) for row, amount in needs):
            each_fits = False
            break
        shadow.take(needs, start, length)
    assert grid.take_all(takes) is each_fits
    assert _free_cells(grid, rows) == (_free_cells(shadow, rows) if each_fits else before)


def test_take_all_refuses_an_item_that_fits_only_before_a_later_one() -> None:
    """Two runs of 3 where 4 are free: the second does not fit once the first is taken, so
    neither is taken (judged in turn, not each against the grid alone)."""
    grid = MinuteGrid(NOW, 10, [4])
    assert grid.take_all([([(0, 3)], 0, 5), ([(0, 3)], 2, 5)]) is False
    assert [grid.free(0, cell) for cell in range(10)] == [4] * 10
    assert grid.take_all([([(0, 3)], 0, 5), ([(0, 1)], 2, 5)]) is True
    assert [grid.free(0, cell) for cell in range(10)] == [1, 1, 0, 0, 0, 3, 3, 4, 4, 4]


# --- MinuteGrid.earliest_fit: named cases --------------------------------------------------------

# Row 0: a pool of 4 over 300 cells, 1 free over [100, 110) and none at 200.
# Row 1: a quota of 10, 2 free over [150, 160).
# Row 2: a quota of 3, nothing free over [0, 20).
FIT_GRID = (
    (0, at(100), at(110), 3),
    (0, at(200), at(201), 4),
    (1, at(150), at(160), 8),
    (2, at(0), at(20), 3),
)
# (needs, lo, hi, length, earliest start)
EARLIEST = {
    "fits at lo": ([(0, 1)], 0, 300, 10, 0),
    "small amount fits through the busy stretch": ([(0, 1)], 0, 300, 200, 0),
    "window ends where the busy stretch begins": ([(0, 2)], 20, 300, 80, 20),
    "window one cell into the busy stretch: starts after it": ([(0, 2)], 20, 300, 81, 110),
    "lo inside the busy stretch": ([(0, 2)], 105, 300, 5, 110),
    "lo just before the busy stretch": ([(0, 2)], 99, 300, 1, 99),
    "hi stops one short of the fit": ([(0, 2)], 20, 109, 81, None),
    "hi exactly at the fit": ([(0, 2)], 20, 110, 81, 110),
    "window across the empty cell: starts after it": ([(0, 2)], 150, 300, 60, 201),
    "run after the empty cell ends exactly at the grid's end": ([(0, 1)], 150, 300, 99, 201),
    "whole grid but the empty cell": ([(0, 1)], 0, 300, 200, 0),
    "no window avoids both the stretch and the empty cell": ([(0, 2)], 0, 300, 101, None),
    "run past the grid's end": ([(0, 1)], 250, 300, 51, None),
    "run exactly to the grid's end": ([(0, 1)], 250, 300, 50, 250),
    "whole limit": ([(0, 4)], 0, 300, 90, 0),
    "whole limit, longer than any free stretch": ([(0, 4)], 0, 300, 150, None),
    "whole limit after the busy stretches": ([(0, 4)], 101, 300, 91, 201),
    "over the limit": ([(0, 5)], 0, 300, 1, None),
    "hi below lo": ([(0, 1)], 10, 9, 1, None),
    "lo equals hi, busy there": ([(0, 2)], 105, 105, 1, None),
    "lo equals hi, free there": ([(0, 2)], 110, 110, 1, 110),
    "lo beyond the last possible start": ([(0, 1)], 295, 1000, 10, None),
    "hi far beyond the grid": ([(0, 2)], 190, 10**9, 20, 201),
    "pool and quota": ([(0, 2), (2, 1)], 0, 300, 10, 20),
    "quota blocks the pool's free stretch": ([(0, 2), (1, 3)], 140, 300, 15, 160),
    "pool and quota busy stretches chain": ([(0, 2), (1, 3)], 90, 300, 45, 201),
    "quota alone": ([(1, 3)], 140, 300, 15, 160),
    "every row": ([(0, 1), (1, 2), (2, 3)], 0, 300, 180, 20),
}


@pytest.mark.parametrize(
    ("needs", "lo", "hi", "length", "expected"), EARLIEST.values(), ids=EARLIEST.keys()
)
def test_earliest_fit(needs: Needs, lo: int, hi: int, length: int, expected: int | None) -> None:
    grid = MinuteGrid(NOW, 300, [4, 10, 3], FIT_GRID)
    assert grid.earliest_fit(needs, lo, hi, length) == expected


# Runs of 128 cells and more, with busy cells at and around multiples of 64 (where a search that
# summarises rows in blocks would change block) and fits that start or end right at them.
# (busy cells, length, hi, earliest start) on one row of 1024 cells where a busy cell has 1 of 2
# free and the run needs 2.
LONG = {
    "busy 127, length 128": ((127,), 128, 1024, 128),
    "busy 128, length 128": ((128,), 128, 1024, 0),
    "busy 127, length 127": ((127,), 127, 1024, 0),
    "busy 63, length 128": ((63,), 128, 1024, 64),
    "busy 64, length 128": ((64,), 128, 1024, 65),
    "busy 0, length 256": ((0,), 256, 1024, 1),
    "busy 255, length 256": ((255,), 256, 1024, 256),
    "busy 256, length 256": ((256,), 256, 1024, 0),
    "busy 200, length 200": ((200,), 200, 1024, 0),
    "busy 200, length 201": ((200,), 201, 1024, 201),
    "busy 10, length 1000": ((10,), 1000, 1024, 11),
    "busy 999, length 1000": ((999,), 1000, 1024, None),
    "busy 1000, length 1000": ((1000,), 1000, 1024, 0),
    "busy 500, length 523": ((500,), 523, 1024, 501),
    "busy 500, length 524": ((500,), 524, 1024, None),
    "busy 1023, length 1023": ((1023,), 1023, 1024, 0),
    "busy 1022, length 1000": ((1022,), 1000, 1024, 0),
    "fit ends just before a block's last cell": ((126, 255), 128, 1024, 127),
    "fit ends just before a block's last cell, hi one short": ((126, 255), 128, 126, None),
    "fit ends just before a block's last cell, hi at it": ((126, 255), 128, 127, 127),
    "fit is exactly two blocks": ((127, 256), 128, 1024, 128),
    "gap one cell short of two blocks": ((127, 255), 128, 1024, 256),
    "fit starts just after a block's first cell": ((64, 193), 128, 1024, 65),
    "gap one short after a block's first cell": ((64, 192), 128, 1024, 193),
    "fit from a block's last cell": ((62, 191), 128, 1024, 63),
    "fit of five blocks between edges": ((0, 321), 320, 1024, 1),
    "gap one short of five blocks": ((0, 320), 320, 1024, 321),
    "fit of six blocks from a block's start": ((63, 448), 384, 1024, 64),
    "fit of six blocks, off the edges": ((65, 450), 384, 1024, 66),
    "fit between a block's last cell and the next edge": ((100, 191, 320), 128, 1024, 192),
    "gap one short between edges": ((100, 191, 319), 128, 1024, 320),
}


@pytest.mark.parametrize(("busy", "length", "hi", "expected"), LONG.values(), ids=LONG.keys())
def test_earliest_fit_long_runs_around_block_boundaries(
    busy: tuple[int, ...], length: int, hi: int, expected: int | None
) -> None:
    grid = MinuteGrid(NOW, 1024, [2], [(0, at(cell), at(cell + 1), 1) for cell in busy])
    assert grid.earliest_fit([(0, 2)], 0, hi, length) == expected


@pytest.mark.parametrize("length", [1, 10, 64, 127, 128, 129, 200], ids=lambda n: f"length-{n}")
def test_earliest_fit_after_a_busy_prefix_of_every_length(length: int) -> None:
    """Wherever a busy stretch from cell 0 ends, the fit starts right there: searches skip
    ahead over busy cells in steps, and no step may skip a start."""
    cells = 1600
    answers = []
    for busy in range(0, cells - length + 2):
        grid = MinuteGrid(NOW, cells, [3], [(0, NOW, at(busy), 2)] if busy else [])
        answers.append(grid.earliest_fit([(0, 2)], 0, cells, length))
    assert answers == [*range(cells - length + 1), None]


# Each step is (needs, lo, hi, length, earliest start, take the fit?) on 200 cells: row 0 a pool
# of 2 with nothing committed, rows 1 and 2 two tenants' quotas of 4, the first one used up over
# [0, 50). Later answers must not be spoiled by what earlier searches proved.
SEQUENCES = {
    "fill a pool in pairs": [
        ([(0, 1)], 0, 200, 10, 0, True),
        ([(0, 1)], 0, 200, 10, 0, True),
        ([(0, 1)], 0, 200, 10, 10, True),
        ([(0, 1)], 0, 200, 10, 10, True),
        ([(0, 1)], 0, 200, 10, 20, True),
        ([(0, 2)], 0, 200, 5, 30, False),
    ],
    "a later lo proves nothing about an earlier one": [
        ([(0, 1)], 50, 200, 10, 50, False),
        ([(0, 1)], 0, 200, 10, 0, False),
    ],
    "a longer run proves nothing about a shorter one": [
        ([(0, 2)], 0, 200, 30, 0, True),
        ([(0, 1)], 0, 200, 300, None, False),
        ([(0, 2)], 0, 200, 150, 30, False),
        ([(0, 2)], 0, 200, 171, None, False),
        ([(0, 2)], 0, 200, 170, 30, False),
        ([(0, 2)], 0, 200, 5, 30, False),
    ],
    "a narrow hi proves nothing past it": [
        ([(0, 2)], 0, 200, 30, 0, True),
        ([(0, 2)], 0, 20, 10, None, False),
        ([(0, 2)], 0, 200, 10, 30, False),
    ],
    "hi one short of the fit proves nothing about the fit": [
        ([(0, 2)], 0, 200, 30, 0, True),
        ([(0, 2)], 0, 29, 10, None, False),
        ([(0, 2)], 0, 30, 10, 30, False),
        ([(0, 2)], 0, 29, 10, None, False),
        ([(0, 2)], 5, 200, 20, 30, False),
    ],
    "takes after a query move the next answer": [
        ([(0, 2)], 0, 200, 20, 0, False),
        ([(0, 1)], 10, 200, 5, 10, True),
        ([(0, 2)], 0, 200, 20, 15, False),
        ([(0, 2)], 0, 200, 20, 15, True),
        ([(0, 2)], 0, 200, 20, 35, False),
        ([(0, 1)], 0, 200, 5, 0, False),
    ],
    "one tenant's quota does not hold another back in the same pool": [
        ([(0, 2), (1, 4)], 0, 200, 10, 50, False),
        ([(0, 2), (2, 4)], 0, 200, 10, 0, True),
        ([(0, 2), (1, 4)], 0, 200, 10, 50, False),
        ([(0, 2), (2, 1)], 0, 200, 10, 10, False),
        ([(0, 2)], 0, 200, 10, 10, False),
        ([(0, 1), (1, 1)], 0, 200, 10, 50, False),
        ([(0, 1), (2, 4)], 0, 200, 10, 10, False),
        ([(0, 1)], 0, 200, 10, 10, False),
    ],
    "a quota-bound search proves nothing about the pool alone": [
        ([(0, 2), (1, 4)], 0, 200, 60, 50, True),
        ([(0, 2), (1, 1)], 0, 200, 10, 110, False),
        ([(0, 1), (2, 1)], 0, 200, 10, 0, False),
        ([(0, 2)], 0, 200, 50, 0, False),
    ],
    "the same query after a take elsewhere": [
        ([(0, 1)], 0, 200, 150, 0, True),
        ([(0, 1)], 0, 200, 150, 0, True),
        ([(0, 1)], 0, 200, 150, None, False),
        ([(0, 2)], 0, 200, 50, 150, True),
        ([(0, 1)], 0, 200, 50, None, False),
        ([(0, 1)], 0, 200, 1, None, False),
    ],
}


@pytest.mark.parametrize("steps", SEQUENCES.values(), ids=SEQUENCES.keys())
def test_earliest_fit_sequence(steps: list[tuple[Needs, int, int, int, int | None, bool]]) -> None:
    grid = MinuteGrid(NOW, 200, [2, 4, 4], [(1, at(0), at(50), 4)])
    answers = []
    for needs, lo, hi, length, _, take in steps:
        found = grid.earliest_fit(needs, lo, hi, length)
        answers.append(found)
        if take and found is not None:
            grid.take(needs, found, length)
    assert answers == [step[4] for step in steps]


# --- MinuteGrid.earliest_fit against a brute-force oracle ----------------------------------------


def free_cells(free: list[list[int]], needs: Needs) -> list[bool]:
    """Per cell, whether every need is free in it."""
    ok = [True] * len(free[0])
    for row, amount in needs:
        ok = [was_ok and cell >= amount for was_ok, cell in zip(ok, free[row], strict=True)]
    return ok


def first_run(ok: list[bool], lo: int, hi: int, length: int) -> int | None:
    """The first start k in [lo, hi] whose window [k, k + length) lies in the grid and is free
    at every cell: a plain loop."""
    for start in range(lo, hi + 1):
        if start + length > len(ok):
            return None
        if all(ok[start : start + length]):
            return start
    return None


def oracle_earliest_fit(
    free: list[list[int]], needs: Needs, lo: int, hi: int, length: int
) -> int | None:
    return first_run(free_cells(free, needs), lo, hi, length)


@dataclass
class Shadow:
    """The free amounts a grid should hold, kept in plain lists."""

    free: list[list[int]]
    stats: dict[str, int] = field(default_factory=dict)

    def commit(self, row: int, first: int, last: int, amount: int) -> None:
        for cell in range(max(0, first), min(len(self.free[row]), last)):
            self.free[row][cell] -= amount

    def take(self, needs: Needs, start: int, length: int) -> None:
        for row, amount in needs:
            self.commit(row, start, start + length, amount)


# The grid summarises rows in blocks of 64 cells; runs of two blocks or more use the summaries.
BLOCK_CELLS = 64
LENGTHS = (
    *(1, 2, 7, 10, 33, 60, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257),
    *(319, 320, 321, 383, 384, 385, 500, 640, 1024),
)


def random_grid(rng: random.Random) -> tuple[MinuteGrid, Shadow, list[int]]:
    """2-4 rows of 50-3000 cells, each with random commitments at microsecond precision: single
    minutes, short and long stretches, some of them past either end of the grid."""
    rows = rng.randint(2, 4)
    cells = rng.choice((rng.randint(50, 200), rng.randint(200, 1000), rng.randint(1000, 3000)))
    limits = [rng.randint(1, 12) for _ in range(rows)]
    shadow = Shadow([[limit] * cells for limit in limits])
    commitments = []
    for row in range(rows):
        for _ in range(rng.randint(0, 8)):
            start_us = rng.randint(-20 * MINUTE_US, (cells + 20) * MINUTE_US)
            span = rng.choice((MINUTE_US, 10 * MINUTE_US, 100 * MINUTE_US, cells * MINUTE_US // 8))
            end_us = start_us + rng.randint(1, span)
            amount = rng.randint(1, rng.choice((1, limits[row])))
            commitments.append((row, NOW + start_us * MICRO, NOW + end_us * MICRO, amount))
            # Rounded outward to whole minutes: floor the start, ceil the end.
            shadow.commit(row, start_us // MINUTE_US, -(-end_us // MINUTE_US), amount)
        # Busy minutes at block edges, where long searches change from block to block.
        for _ in range(rng.choice((0, 0, 2, 6))):
            cell = min(cells - 1, max(0, BLOCK_CELLS * rng.randint(0, cells // BLOCK_CELLS)))
            cell = min(cells - 1, max(0, cell + rng.choice((-1, 0, 1))))
            amount = rng.randint(1, limits[row])
            commitments.append((row, at(cell), at(cell + 1), amount))
            shadow.commit(row, cell, cell + 1, amount)
    rng.shuffle(commitments)
    return MinuteGrid(NOW, cells, limits, commitments), shadow, limits


def random_need(rng: random.Random, row: int, limits: list[int], shadow: Shadow) -> tuple[int, int]:
    """An amount of ``row`` near its limit, near what is free, small, or (rarely) too much."""
    limit = limits[row]
    lowest = min(shadow.free[row])
    amount = rng.choice((1, 1, 2, limit // 2, limit - 1, limit, lowest, lowest + 1))
    if rng.random() < 0.05:
        amount = limit + 1  # never fits
    return row, max(1, amount)


def random_needs(
    rng: random.Random, limits: list[int], shadow: Shadow, pool: tuple[int, int] | None = None
) -> tuple[tuple[int, int], ...]:
    """A pool need (``pool`` if given) and 0-2 limit needs on other rows."""
    if pool is None:
        pool = random_need(rng, rng.randrange(len(limits)), limits, shadow)
    others = [row for row in range(len(limits)) if row != pool[0]]
    rows = rng.sample(others, rng.randint(0, min(2, len(others))))
    return (pool, *(random_need(rng, row, limits, shadow) for row in rows))


def random_window(rng: random.Random, cells: int, lengths: Sequence[int]) -> tuple[int, int, int]:
    """A run length and a range of starts: from the grid's start or inside it, up to the grid's
    end, past it, exactly at the last start that fits, just around it, or below lo."""
    length = rng.choice(lengths) if rng.random() < 0.9 else rng.randint(1, cells)
    lo = rng.choice(
        (
            0,
            0,
            0,
            rng.randint(0, min(60, cells)),
            rng.randint(0, cells // 2),
            rng.randint(0, cells),
            max(0, cells - length),
        )
    )
    hi = rng.choice(
        (
            cells,
            cells,
            10**9,
            cells - length,
            cells - length - 1,
            cells - length + 1,
            lo,
            lo - 1,
            lo + rng.randint(0, 300),
            rng.randint(lo, max(lo, cells)),
        )
    )
    return lo, hi, length


# Kinds of answers the random scenarios count: no start to search, a fit at lo, a later fit (also
# for runs of at least two blocks of 64 cells), no fit, and takes at the found start.
KINDS = ("empty range", "at lo", "later", "long later", "none", "taken")


def run_scenario(seed: int) -> tuple[list[str], dict[str, int]]:
    """Queries, takes at the found start (as admission does) and unrelated takes on one random
    grid; returns every disagreement with the oracle and counts of the kinds of answers."""
    rng = random.Random(seed)
    grid, shadow, limits = random_grid(rng)
    cells = grid.cells
    lengths = [length for length in LENGTHS if length <= cells // 2]
    lengths = [*rng.sample(lengths, min(4, len(lengths))), cells // 3]
    # A few request shapes recur, so what the grid remembers per shape gets reused, and several
    # share a pool need (the same gang in the same pool, for different tenants' quotas).
    pools = [random_need(rng, rng.randrange(len(limits)), limits, shadow) for _ in range(2)]
    shapes = [random_needs(rng, limits, shadow, rng.choice(pools)) for _ in range(4)]
    mismatches: list[str] = []
    stats = dict.fromkeys(KINDS, 0)
    for step in range(60):
        if rng.random() < 0.2:
            needs = tuple(
                (row, rng.randint(1, max(1, limits[row] // 3))) for row, _ in rng.choice(shapes)
            )
            start = rng.randrange(cells)
            length = rng.randint(1, min(cells - start, rng.choice((1, 10, 64, cells // 4))))
            grid.take(needs, start, length)
            shadow.take(needs, start, length)
            continue
        if rng.random() < 0.8:
            needs = rng.choice(shapes)
        else:
            needs = random_needs(rng, limits, shadow, rng.choice((*pools, None)))
        lo, hi, length = random_window(rng, cells, lengths)
        query = f"seed {seed} step {step}: ({needs}, lo={lo}, hi={hi}, length={length})"
        pool_ok = free_cells(shadow.free, needs[:1])
        ok = free_cells(shadow.free, needs) if len(needs) > 1 else pool_ok
        expected = first_run(ok, lo, hi, length)
        # What the grid says it proved must hold: no fit starts before the bounds.
        unbounded = first_run(ok, lo, cells, length)
        pool_unbounded = first_run(pool_ok, lo, cells, length)
        bounds = grid.bounds(needs, lo, length)
        lower_bound = grid.lower_bound(needs, lo, length)
        if pool_unbounded is not None and bounds[0] > pool_unbounded:
            mismatches.append(f"{query}: pool bound {bounds[0]}, pool fits at {pool_unbounded}")
        if unbounded is not None and bounds[1] > unbounded:
            mismatches.append(f"{query}: bound {bounds[1]}, fits at {unbounded}")
        if lower_bound < lo or (unbounded is not None and lower_bound > unbounded):
            mismatches.append(f"{query}: lower_bound {lower_bound}, fits at {unbounded}")
        # Callers may pass in the bounds they just asked for.
        if rng.random() < 0.5:
            actual = grid.earliest_fit(needs, lo, hi, length, bounds)
        else:
            actual = grid.earliest_fit(needs, lo, hi, length)
        if actual != expected:
            mismatches.append(f"{query} on {cells} cells: earliest_fit {actual}, oracle {expected}")
        if lo > min(hi, cells - length):
            stats["empty range"] += 1
        elif expected is None:
            stats["none"] += 1
        elif expected == lo:
            stats["at lo"] += 1
        else:
            stats["later"] += 1
            stats["long later"] += length >= 128
        if expected is not None and rng.random() < 0.5:
            grid.take(needs, expected, length)
            shadow.take(needs, expected, length)
            stats["taken"] += 1
    for row in range(len(limits)):
        if [grid.free(row, cell) for cell in range(cells)] != shadow.free[row]:
            mismatches.append(f"seed {seed}: free amounts of row {row} differ")
        if grid.lowest(row) != min(shadow.free[row]):
            mismatches.append(f"seed {seed}: lowest of row {row} differs")
    return mismatches, stats


SEEDS = range(200)


@pytest.mark.parametrize("seed", SEEDS, ids=[f"seed-{seed}" for seed in SEEDS])
def test_earliest_fit_matches_brute_force(seed: int) -> None:
    mismatches, _ = run_scenario(seed)
    assert mismatches == []


def test_random_scenarios_cover_every_kind_of_answer() -> None:
    """The oracle test is only as good as its mix: fits at lo, later fits (also for runs of at
    least two blocks), no fit at all, and takes at the found start."""
    totals = dict.fromkeys(KINDS, 0)
    for seed in range(0, 200, 10):
        _, stats = run_scenario(seed)
        for kind, count in stats.items():
            totals[kind] += count
    assert all(count >= 20 for count in totals.values()), totals
