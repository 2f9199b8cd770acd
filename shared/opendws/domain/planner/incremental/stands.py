"""Whether a request the walk visits keeps its last slot without a search (:func:`stands`),
judged from how the free amounts of its rows differ from last pass; a row the walk has not
rolled back is read as the request sees it (:func:`as_seen`, :func:`past_unrolled`,
:func:`no_room_unrolled`)."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from enum import Enum

import numpy as np
import numpy.typing as npt

from opendws.domain.planner.incremental.full import _Entry, _FlexState
from opendws.domain.planner.incremental.queue import _key_of
from opendws.domain.planner.search import options
from opendws.domain.timeline import FOREVER, MinuteGrid

# In the walk's test of a request (see stands), a start found on the rows rolled back is
# tested on the others with the takes of the requests after it given back: of at most this
# many requests on a row, and at most this many starts; else the request is searched.
UNROLLED_READERS = 64
UNROLLED_PROBES = 2


class Verdict(Enum):
    """What the walk's test of a request it visits (:func:`stands`) found."""

    SEARCH = "search"  # its slot may have moved: it is searched again
    STANDS = "stands"  # it takes its slot again, for the same reason
    REJUDGE = "rejudge"  # it takes its slot again; what holds it is worked out again


def stands(
    grid: MinuteGrid,
    flex: _FlexState,
    entry: _Entry,
    rows: list[int],
    delta: dict[int, npt.NDArray[np.int32]],
    spans: dict[int, list[int]],
    rolled: set[int],
    readers: Mapping[int, list[_Entry]],
) -> Verdict:
    """Whether ``entry``'s last slot is still what a search would find, judged from how the
    free amounts of ``rows`` (those of its rows that changed) differ from last pass:
    :attr:`Verdict.SEARCH` if it must be searched again; else :attr:`Verdict.STANDS`, or
    :attr:`Verdict.REJUDGE` if its hold reason must be worked out again.
    (``spans`` bounds, per row, the cells where it gained and where it lost.)

    Exact, not a heuristic. A search finds the earliest start among the request's options
    (a pool and the quota it counts against), a tie going to the more preferred pool. No
    start before the slot (nor a more preferred pool at it) fitted last pass. One fits now
    only if its run covers a cell where a row of that option gained: so the request stands
    unless a run of it fits from one of those starts. The slot itself still fits unless a row
    lost within it. A request with no slot waits on unless such a run fits by its deadline.

    The starts are searched on the rolled rows, which hold what this request sees. A row not
    rolled back is as it was last pass and still carries the takes of the requests after it:
    each start found is then tested there with those takes given back
    (:func:`past_unrolled`), and the search goes on past one that does not fit.

    Where only quota rows gained, an option whose pool alone has no room for any start that
    could win cannot newly fit: that is proved once, on the pool's rolled row or on one not
    rolled back as the request sees it (:func:`no_room_unrolled`), and kept in
    ``entry.clear`` (dropped for an option whose pool gained where a run of it could reach;
    the walk drops all of it when the request's slot or floor moves)."""
    best = entry.best
    reach = grid.cells if best is None else best + max(entry.span, entry.first)
    # Most visits follow a change that only took cells (an arrival): no row gained where a
    # run of this request could reach, and no option can newly fit.
    gained = any(spans[row][0] < min(spans[row][1], reach) for row in rows)
    # A more preferred pool wins a tie, so it need only start at the slot to take it; its own
    # pool and the less preferred ones must start before it (a request with no slot: by its
    # deadline, anywhere).
    latest = entry.last if best is None else best
    # What earlier visits proved of its pools alone (_Entry.clear), as long as they hold.
    clear = entry.clear
    for option, (lowest, pool, every_need) in enumerate(
        options(entry.candidate, flex.binding, flex.limit_row, flex.short, flex.shapes)
        if gained
        else ()
    ):
        if pool == entry.row:
            latest -= 1
        # The pool's own need, if it can bind (first of the needs: see options).
        pool_need = every_need[0] if every_need and every_need[0][0] == pool else None
        proving = False
        if pool_need is not None:
            bit = 1 << option
            pool_changed = spans.get(pool)
            if pool_changed is not None and pool_changed[0] < min(pool_changed[1], reach):
                clear &= ~bit  # its pool gained where a run of it could reach: proved no more
            elif clear & bit:
                # Its pool alone has no room for a start that could win, and gained nowhere
                # such a run could reach: whatever the quota rows gained, none fits.
                continue
            else:
                proving = True
        # Every row that gained is a rolled one: an option on none cannot newly fit.
        needs = tuple(need for need in every_need if need[0] in rolled)
        if not needs:
            continue
        gained_from, gained_to = FOREVER, lowest
        for row, _ in needs:
            changed = spans.get(row)
            if changed is not None and changed[0] < min(changed[1], reach):
                gained_from = min(gained_from, changed[0])
                gained_to = max(gained_to, min(changed[1], reach))
        # The starts that could newly win: those whose run covers a gained cell, early
        # enough. (From a whole minute; a run from now is one cell longer: this errs to
        # search.) What earlier searches proved settles most of them without a scan.
        length = entry.length
        # As a search does: a strict-FIFO request starts no earlier than its floor.
        first_start = max(lowest, entry.floor, gained_from - length + 1)
        last_start = min(gained_to - 1, latest)
        if first_start > last_start:
            continue
        proved = grid.bounds(needs, first_start, length)
        if proved[1] > last_start:
            continue
        if proving:
            # Its quota rows gained but not its pool: once proved that the pool alone has no
            # room for a start that could win, later visits skip this option without a scan
            # while the pool gains nothing they could use (on a rolled row, the proof's facts
            # also speed the scan below and the pool searches of its other readers).
            assert pool_need is not None
            lo = max(lowest, entry.floor)
            if (
                grid.earliest_fit((pool_need,), lo, latest, length) is None
                if pool in rolled  # the rolled row is the pool as it sees it
                else no_room_unrolled(grid, readers, entry, pool_need, lo, latest, length)
            ):
                clear |= 1 << option
                continue
        found = grid.earliest_fit(needs, first_start, last_start, length, proved)
        if found is None:  # most visits: no start fits even on the rolled rows
            continue
        unrolled = [need for need in every_need if need[0] not in rolled]
        for _ in range(UNROLLED_PROBES):
            # A run from now is one cell longer: tested over ``length`` cells, it errs to fit.
            past = (
                found
                if not unrolled
                else past_unrolled(grid, readers, entry, unrolled, found, length)
            )
            if past == found:
                return Verdict.SEARCH
            found = grid.earliest_fit(needs, past, last_start, length)
            if found is None:
                break
        if found is not None:
            return Verdict.SEARCH  # not settled in so many starts: searched
    entry.clear = clear
    if best is None:
        return Verdict.STANDS
    span = entry.span
    for row, amount in entry.needs:
        bounds = spans.get(row)
        if bounds is None:
            continue
        lost_from, lost_to = max(bounds[2], best), min(bounds[3], best + span)
        lost = lost_from < lost_to and delta[row][lost_from:lost_to].min() < 0
        if lost and not grid.fits(row, amount, best, span):
            return Verdict.SEARCH
    # Its reason reads its pool's row (one that never binds always has room: no change).
    return Verdict.REJUDGE if entry.row in rows else Verdict.STANDS


def no_room_unrolled(
    grid: MinuteGrid,
    readers: Mapping[int, list[_Entry]],
    entry: _Entry,
    need: tuple[int, int],
    lo: int,
    latest: int,
    length: int,
) -> bool:
    """True if ``need`` (a pool's), on a row the walk has not rolled back, has no run of
    ``length`` cells free from any start in ``[lo, latest]`` as ``entry`` sees it: the row
    with the takes of ``entry`` and the requests after it given back, as in
    :func:`past_unrolled`. False if there is one, or if telling means looking at more than
    :data:`UNROLLED_READERS` requests (it proves nothing then)."""
    row, amount = need
    latest = min(latest, grid.cells - length)
    if latest < lo:
        return True  # no start in the grid: none fits
    cells = as_seen(grid, readers, entry, row, lo, latest + length)
    if cells is None:
        return False
    # The stretches of room: a run fits from the first cell of one at least ``length`` long,
    # if that cell is a start the entry could take.
    short = np.flatnonzero(cells < amount)
    edges = np.concatenate(([-1], short, [len(cells)]))
    starts = edges[:-1] + 1
    long_enough = (edges[1:] - starts >= length) & (starts <= latest - lo)
    return not bool(long_enough.any())


def past_unrolled(
    grid: MinuteGrid,
    readers: Mapping[int, list[_Entry]],
    entry: _Entry,
    needs: Sequence[tuple[int, int]],
    start: int,
    length: int,
) -> int:
    """``start`` if each of ``needs``, on rows the walk has not rolled back, is free over cells
    ``[start, start + length)`` as ``entry`` sees them; else the cell just past the last one
    there where the first need that is not free falls short (no run of ``entry`` from
    ``start`` on can begin before it). A row whose telling means looking at more than
    :data:`UNROLLED_READERS` requests after ``entry`` is not tested (it errs to fit: a search
    more).

    Exact: such a row has not changed this pass and holds the takes of every request that reads
    it; ``entry`` sees it as it was before its own take and those of the requests after it,
    which are added back to a copy of the cells."""
    for row, amount in needs:
        cells = as_seen(grid, readers, entry, row, start, start + length)
        if cells is None:
            continue
        short = np.flatnonzero(cells < amount)
        if len(short):
            return start + int(short[-1]) + 1
    return start


def as_seen(
    grid: MinuteGrid,
    readers: Mapping[int, list[_Entry]],
    entry: _Entry,
    row: int,
    start: int,
    stop: int,
) -> npt.NDArray[np.int32] | None:
    """The free amounts of ``row`` (one the walk has not rolled back) over cells ``[start,
    stop)`` as ``entry`` sees them: the row holds the takes of every request that reads it,
    and those of ``entry`` and the requests after it are given back on a copy. None if that
    means looking at more than :data:`UNROLLED_READERS` requests."""
    on_row = readers.get(row, [])
    index = bisect.bisect_left(on_row, entry.key, key=_key_of)
    if len(on_row) - index > UNROLLED_READERS:
        return None
    cells = grid.free_over(row, start, stop)
    for holder in on_row[index:]:
        best = holder.best
        if best is None or best >= stop:
            continue
        end = best + holder.span
        if end <= start:
            continue
        for need_row, taken in holder.needs:
            if need_row == row:
                cells[max(best, start) - start : min(end, stop) - start] += taken
    return cells
