"""The walk (:func:`walk`): the flex requests the changes reach re-planned in policy order. A
grid row is rolled back (the takes of the requests from there on given back) once the walk
must read or change it, and only the requests on rolled rows are visited: each takes its slot
again, or is searched (see the package docstring).

The grid's memo (what searches proved: :meth:`MinuteGrid.forget`) holds only while free
amounts go down, and a walk gives takes back. It forgets the memo once, before rolling any
row, and from then on keeps to two rules, which a change here must keep too (or forget again):

- a row is given back only as it is first rolled: its readers' takes from there on then, and
  the pass's frees (releases, departures, the layer's) on rows rolled for them before the
  first visit. After that the walk only takes.
- searches read rolled rows only: a request is searched once every row its search reads is
  rolled, and :func:`stands` asks the memo about rolled rows alone (it reads a row not rolled
  back from its cells, as the request sees it). A hold reason may read a pool's row that never
  binds and was not rolled: nothing was given back there.

So nothing a search proved is undone while the walk runs."""

from __future__ import annotations

import bisect
import heapq
from typing import Final

import numpy as np
import numpy.typing as npt

from opendws.domain.model import Grant, Snapshot
from opendws.domain.planner.incremental.clock import _ClockMove, clock_news
from opendws.domain.planner.incremental.full import KeepingPass, _Entry, _FlexState
from opendws.domain.planner.incremental.kept import (
    KeptPass,
    PlanReport,
    _grant_cells,
    _unheld,
)
from opendws.domain.planner.incremental.layer import _Layer
from opendws.domain.planner.incremental.queue import _floor_after, _key_of
from opendws.domain.planner.incremental.rehold import decide, rehold
from opendws.domain.planner.incremental.stands import Verdict, stands
from opendws.domain.planner.search import hold_reason, longer_reason, place
from opendws.domain.policy import FlexKey
from opendws.domain.timeline import FOREVER

# At most this many spare delta rows are kept between passes (a walk rolls a few dozen rows;
# each spare is as long as the grid).
SPARE_ROWS = 64

# A visit in the walk's queue, in policy order: (key, source, index, entry). The source is a
# rolled row (>= 0: the row's next reader, ``index`` into its readers, no entry), DIRECT (an
# entry visited for itself, ``index`` a sequence number) or DEPARTED (an entry that left,
# whose slot others saw until its place in policy order: ``index`` a sequence number). Keys
# are unique but for a request planned again, whose departure comes first (DEPARTED <
# DIRECT < a row). A plain tuple, not a NamedTuple: the walk builds one per visit.
_Visit = tuple[FlexKey, int, int, _Entry | None]
DIRECT: Final = -1
DEPARTED: Final = -2

# After this many requests of a pool in a row moved, a walk searches the next at once (most
# often it moves too) rather than first testing whether its slot stands.
CASCADE_AFTER = 2


def walk(
    planner: KeptPass,
    snapshot: Snapshot,
    state: KeepingPass,
    flex: _FlexState,
    gone: list[str],
    arrivals: list[_Entry],
    released: list[Grant],
    added: list[Grant],
    clock: _ClockMove,
    layer: _Layer,
) -> PlanReport:
    """Re-plan the flex requests the changes reach, in policy order (module docstring),
    then the commitments held before them (see :func:`rehold`, which raises
    :class:`NeedFullPass` if a commitment no longer fits where it was promised).

    Only entries on a row the walk rolls back are visited: a row is rolled back from the
    first request in policy order that must read or change it, and every later entry on
    it is then visited in order (through each row's readers, merged by key), to take its
    share again or to be searched. An entry on no such row keeps its slot untouched."""
    entries = flex.entries
    grid = flex.grid
    gone_set = set(gone)
    # (row, first cell, cells, amount given back: negative for a new grant's take)
    freed: list[tuple[int, int, int, int]] = []
    # The same, of the last pass's moves carried out (see _Layer.carried): the walk's
    # entries see them as any other, the commitments' tests do not (see rehold).
    carried: list[tuple[int, int, int, int]] = []
    # Where the walk begins: the first request in policy order a change can reach.
    starts: list[FlexKey] = []
    # Entries visited whatever their rows: arrivals, and the strict-FIFO requests whose
    # tenant's earlier request left (their floor moves). (key, seq, entry)
    direct: list[tuple[FlexKey, int, _Entry]] = []
    # An admission carried out: the request left and its grant came, holding exactly the
    # slot it took on every row a search reads. Nothing a search reads changes then; the
    # grant's share of rows no search reads is taken as it is.
    absorbed: set[str] = set()
    for grant in added:
        span = _grant_cells(flex, grant)
        contributions = state.grant_rows(grant, flex.limit_row)
        if id(grant) in layer.absorbed:  # it took a dropped commitment's slot exactly
            for row, amount in contributions:
                if not flex.binding[row]:
                    grid.give(((row, -amount),), span[0], span[1])
            continue
        if id(grant) in layer.carried_grants:  # it took where the last pass moved one
            if span[1] > 0:
                carried.extend((row, span[0], span[1], -amount) for row, amount in contributions)
            continue
        entry = planner._entry_of.get(grant.request_id)
        if (
            entry is not None
            and grant.request_id in gone_set
            and grant.request_id not in absorbed
            and planner._carried_out(
                entry,
                clock.slot,
                span,
                state.pool_row.get(grant.pool_id),
                [c for c in contributions if flex.binding[c[0]]],
            )
        ):
            absorbed.add(grant.request_id)
            for row, amount in contributions:
                if not flex.binding[row]:
                    grid.give(((row, -amount),), span[0], span[1])
            continue
        if span[1] > 0:
            freed.extend((row, span[0], span[1], -amount) for row, amount in contributions)
    for grant in released:
        first, cells = _grant_cells(flex, grant)
        if cells > 0:
            counted = state.grant_rows(grant, flex.limit_row)
            freed.extend((row, first, cells, amount) for row, amount in counted)
    freed.extend(take for take in layer.takes if take[2] > 0)
    carried.extend(take for take in layer.carried if take[2] > 0)
    touched: set[int] = set()  # pools whose held slots are numbered again
    changed: dict[int, _Entry] = {}  # held commitments whose decision is recorded again
    arrivals = [*arrivals]
    for held in (*layer.dropped, *layer.demoted):
        touched.add(held.row)
        after = planner._unhold(held)
        if held in layer.dropped:
            planner._drop_order(held)
            planner._count(snapshot, flex, held.candidate, -1)
            if after is not None:
                direct.append((after.key, len(direct), after))
        else:  # planned again from its key, as if it had just come
            arrivals.append(_unheld(held))
    demoted = {id(entry) for entry in arrivals[len(arrivals) - len(layer.demoted) :]}
    for held, slot in layer.relocated:
        planner._reslot(held, slot)
        # Held where the last pass put it: no change.
        if held.candidate.request.request_id not in layer.movers:
            changed[id(held)] = held
        if held.candidate.strict:  # it stays where it is held: its tenant's next follows
            held.best = slot[0]
            after = planner._sibling_after(held)
            if after is not None:
                direct.append((after.key, len(direct), after))
    for entry, slot in layer.fresh:
        arrivals.remove(entry)
        planner._add_order(planner._hold(entry, slot, changed))
    promoted = {id(entry) for entry, _ in layer.promoted}
    for entry, _ in layer.quiet:
        planner._forget(entry.candidate.request.request_id)
        planner._remove(flex, entry, ordered=False)
        planner._leave_pool(entry)
        touched.add(entry.row)
    leaving = [planner._forget(key) for key in gone if key in planner._entry_of]
    leaving += (planner._forget(entry.candidate.request.request_id) for entry in clock.expired)
    leaving += (planner._forget(e.candidate.request.request_id) for e, _ in layer.promoted)
    for entry in clock.restart:  # planned again from its key, as if it had just come
        leaving.append(planner._forget(entry.candidate.request.request_id))
        again = _unheld(entry)
        planner._count(snapshot, flex, again.candidate, 1)
        arrivals = [*arrivals, again]
    for entry in leaving:
        starts.append(entry.key)
        if id(entry) not in promoted:
            planner._count(snapshot, flex, entry.candidate, -1)
        after = planner._remove(flex, entry, ordered=id(entry) not in promoted)
        if after is not None:
            direct.append((after.key, len(direct), after))
    for entry, slot in (*layer.promoted, *layer.quiet):
        planner._hold(entry, slot, changed)
    for entry in arrivals:
        starts.append(entry.key)
        planner._insert(flex, entry, ordered=id(entry) not in demoted)
        direct.append((entry.key, len(direct), entry))
    starts += (key for key, _, _ in direct)
    based = {row for row, _, _, _ in (*freed, *carried)}
    if clock.shifted:
        # A held request's reason is judged at its earliest start, over cells the clock
        # just dropped: in its own view, which a rolled row gives, for every pool a held
        # slot lies in. (Within a minute, only a run from now may grow a cell: each held
        # entry knows its reason for that run, see move_within.)
        based.update(row for row, held in planner._by_pool.items() if held and flex.binding[row])
    for row in based:
        readers = planner._readers.get(row)
        if readers:
            starts.append(readers[0].key)
    if not starts:
        for row, first, cells, amount in (*freed, *carried):  # rows no request reads
            grid.give(((row, amount),), first, cells)
        if planner._held:
            gains: dict[int, int] = {}
            for row, first, cells, amount in freed:
                if amount > 0 and cells > 0:
                    gains[row] = min(gains.get(row, FOREVER), first)
            rows = {row for row, _, _, _ in freed}
            rehold(planner, state, flex, layer, added, changed, touched, clock, rows, gains)
        else:
            planner._moves = {}  # none held: none moved
        news: dict[int, _Entry] = {}
        clock_news(planner, state, clock, news, touched)
        news.update(changed)
        decide(planner, state, news, touched)
        return PlanReport(full=False, from_rank=len(entries) + 1)
    start = min(starts)
    from_rank = bisect.bisect_left(entries, start, key=_key_of) + 1
    # The key of the first entry from ``start`` on (rows are rolled back from there; None:
    # there is none).
    first_key = entries[from_rank - 1].key if from_rank <= len(entries) else None
    fresh = {id(entry) for entry in arrivals}
    rolled: set[int] = set()
    # Per rolled row, what is free now minus what was free last pass, as seen by the entry
    # the walk is at (both before its own take): the walk keeps it so as it goes.
    delta: dict[int, npt.NDArray[np.int32]] = {}
    live: set[int] = set()  # rows whose delta was ever changed (it may be nonzero)
    # Per live row, cells outside which its delta has never gained ([0]) or lost ([1]):
    # most visits are settled from these bounds without reading the delta at all.
    spans: dict[int, list[int]] = {}
    # The same, for what the commitments are tested against (see rehold): per row
    # changed other than by a carried move, the first cell where it gained (FOREVER: none).
    seen: dict[int, int] = {}
    # The walk's queue, in policy order (see _Visit).
    heap: list[_Visit] = [(entry.key, DIRECT, seq, entry) for _, seq, entry in direct]
    grid.forget()  # once: the memo's rules are in the module docstring

    def roll(row: int, at: FlexKey | None) -> None:
        """Roll ``row`` back to the grid as it stood before the first entry keyed ``at``
        or later (None: after the last): give back the takes of the entries from there on,
        each visited later to take again."""
        rolled.add(row)
        spare = planner._spare
        while spare and len(spare[-1]) != flex.cells:  # of a grid since resized
            spare.pop()
        delta[row] = spare.pop() if spare else np.zeros(flex.cells, dtype=np.int32)
        readers = planner._readers.get(row)
        if not readers:
            return
        index = len(readers) if at is None else bisect.bisect_left(readers, at, key=_key_of)
        for holder in readers[index:]:
            if holder.best is not None:
                give = [need for need in holder.needs if need[0] == row]
                if give:
                    grid.give(give, holder.best, holder.span)
        if index < len(readers):
            heapq.heappush(heap, (readers[index].key, row, index, None))

    def shift(
        needs: tuple[tuple[int, int], ...],
        first: int,
        cells: int,
        sign: int,
        carried: bool = False,
    ) -> None:
        """Add ``sign`` × each need's amount to its row's delta over the cells (of a
        carried move: not seen by the commitments' tests)."""
        for row, amount in needs:
            change = sign * amount
            if change == 0 or cells <= 0:
                continue
            cells_of = delta[row][first : first + cells]
            cells_of += change
            live.add(row)
            if not carried:
                gained = seen.get(row, FOREVER)
                seen[row] = min(gained, first) if change > 0 else gained
            bounds = spans.get(row)
            if bounds is None:
                bounds = spans[row] = [FOREVER, -1, FOREVER, -1]
            side = 0 if change > 0 else 2
            bounds[side] = min(bounds[side], first)
            bounds[side + 1] = max(bounds[side + 1], first + cells)

    for row in based:
        roll(row, first_key)
    for row, first, cells, amount in freed:
        grid.give(((row, amount),), first, cells)
        shift(((row, amount),), first, cells, 1)
    for row, first, cells, amount in carried:
        grid.give(((row, amount),), first, cells)
        shift(((row, amount),), first, cells, 1, carried=True)
    touched.update(entry.row for entry in leaving if entry.best is not None)  # renumber
    for entry in leaving:
        if entry.candidate.request.request_id in absorbed:
            planner._leave_pool(entry)
            continue
        if entry.best is not None:
            for row, _ in entry.needs:
                if row not in rolled:
                    roll(row, first_key)
            first_cell, cells = clock.slot(entry)
            grid.give(entry.needs, first_cell, cells)
            planner._leave_pool(entry)
            heap.append((entry.key, DEPARTED, len(heap), entry))
    heapq.heapify(heap)
    searched = 0
    visited = 0
    tested = 0
    moved: dict[int, _Entry] = {}  # entries whose decision may differ beyond position
    # Per pool row, how many of its requests this walk searched one after another and
    # found moved; one searched that stays, or tested and found to stand, ends the run
    # (see the visits below).
    streak: dict[int, int] = {}
    last: _Entry | None = None
    readers_of = planner._readers
    siblings = planner._siblings
    while heap:
        _, source, index, item = heapq.heappop(heap)
        if source >= 0:
            readers = readers_of[source]
            entry = readers[index]
            if index + 1 < len(readers):
                heapq.heappush(heap, (readers[index + 1].key, source, index + 1, None))
        else:
            assert item is not None
            entry = item
            if source == DEPARTED:  # from here on, the departed slot is free
                assert entry.best is not None
                shift(entry.needs, *clock.slot(entry), 1)
                continue
        if entry is last:
            continue  # reached through several rows: once is enough
        if planner._entry_of.get(entry.candidate.request.request_id) is not entry:
            continue  # a strict-FIFO sibling queued for a visit that has left since
        last = entry
        visited += 1
        candidate = entry.candidate
        floor = planner._floor_of(entry) if candidate.strict else 0
        reads = planner._reads_of(entry)
        is_fresh = id(entry) in fresh
        keep = Verdict.STANDS
        if is_fresh or floor != entry.floor:
            keep = Verdict.SEARCH
        elif not live.isdisjoint(reads):
            if streak.get(entry.row, 0) >= CASCADE_AFTER:
                # Where the pool's last requests moved one after another, the next most
                # likely moves too (a release or an arrival can move a pool's whole queue,
                # a request at a time): it is searched at once, which is exact whatever
                # it finds, rather than first tested by stands, which then costs about
                # as much as the search.
                keep = Verdict.SEARCH
            else:
                tested += 1
                keep = stands(
                    grid,
                    flex,
                    entry,
                    [row for row in reads if row in live],
                    delta,
                    spans,
                    rolled,
                    readers_of,
                )
                if keep is not Verdict.SEARCH:
                    streak.pop(entry.row, None)  # it stands: the pool's queue stopped
        if keep is Verdict.SEARCH:
            searched += 1
            for row in reads:
                if row not in rolled:
                    roll(row, entry.key)
            best, row, needs, reason = place(
                grid,
                candidate,
                entry.length,
                entry.first,
                entry.last,
                floor,
                flex.binding,
                flex.limit_row,
                flex.short,
                flex.shapes,
            )
            before = _floor_after(entry)
            slot_moved = (best, row, needs) != (entry.best, entry.row, entry.needs)
            if entry.best is not None:  # its pool's queue moves on, or stopped
                if slot_moved:
                    streak[entry.row] = streak.get(entry.row, 0) + 1
                else:
                    streak.pop(entry.row, None)
            if is_fresh or slot_moved:
                if entry.best is not None:
                    shift(entry.needs, entry.best, entry.span, 1)
                touched.update(r for r in (entry.row, row) if r >= 0)
                if best is not None:
                    shift(needs, best, entry.first if best == 0 else entry.length, -1)
            if is_fresh or (best, row, needs, reason) != (
                entry.best,
                entry.row,
                entry.needs,
                entry.reason,
            ):
                moved[id(entry)] = entry
            planner._settle(entry, row, best)
            entry.floor = floor
            entry.needs, entry.reason, entry.alt = needs, reason, reason
            entry.clear = 0  # proved of the slot it had
            if best:
                entry.alt = longer_reason(
                    grid, row, candidate.request.gang.units, best, floor, flex.short[row],
                    entry.length, entry.first, reason,
                )  # fmt: skip
            if best is not None:
                grid.take(needs, best, entry.span)
            if candidate.strict and (is_fresh or _floor_after(entry) != before):
                # The tenant's next request starts from this one's slot: visit it.
                tenant = siblings[candidate.request.tenant]
                following = bisect.bisect_right(tenant, entry.key, key=_key_of)
                if following < len(tenant):
                    sibling = tenant[following]
                    heapq.heappush(heap, (sibling.key, DIRECT, -1 - visited, sibling))
            continue
        if entry.best is None:
            continue
        if entry.best > 0 and (keep is Verdict.REJUDGE or (clock.shifted and entry.row in rolled)):
            # Its pool's free amounts moved near its slot, or the clock moved its earliest
            # start: what holds it may have changed. Judged as a search judges it, in the
            # grid before its own take (and for a run from now a cell longer).
            units, short = candidate.request.gang.units, flex.short[entry.row]
            reason = hold_reason(
                grid, entry.row, units, entry.best, floor, short, entry.length, entry.first
            )
            entry.alt = longer_reason(
                grid, entry.row, units, entry.best, floor, short, entry.length,
                entry.first, reason,
            )  # fmt: skip
            if reason != entry.reason:
                entry.reason = reason
                moved[id(entry)] = entry
        retake = [need for need in entry.needs if need[0] in rolled]
        if retake:
            grid.take(retake, entry.best, entry.span)
    clock_news(planner, state, clock, moved, touched)
    for row, cells_of in delta.items():  # zeroed where it changed, kept for the next walk
        bounds = spans.get(row)
        if bounds is not None:
            cells_of[min(bounds[0], bounds[2]) : max(bounds[1], bounds[3])] = 0
        if len(planner._spare) < SPARE_ROWS:
            planner._spare.append(cells_of)
    if planner._held:
        gains = {row: cell for row, cell in seen.items() if cell < FOREVER}
        rehold(planner, state, flex, layer, added, changed, touched, clock, {*seen}, gains)
    else:
        planner._moves = {}  # none held: none moved
    moved.update(changed)
    decide(planner, state, moved, touched)
    return PlanReport(
        full=False, from_rank=from_rank, walked=visited, searched=searched, tested=tested
    )
