"""The commitments held before the policy order, as a layer under the walk: how they change
from the last pass (:func:`relayer`, a :class:`_Layer`), looking again only at those a change
can reach (:func:`looked_at`), each at its first slot (:func:`first_slot`)."""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from opendws.domain.model import Commitment, Grant, Snapshot
from opendws.domain.planner.commitments import commitment_slots
from opendws.domain.planner.incremental.clock import _ClockMove
from opendws.domain.planner.incremental.diff import identity_changes
from opendws.domain.planner.incremental.full import KeepingPass, _Entry, _FlexState
from opendws.domain.planner.incremental.kept import (
    _SLOTS_EPOCH,
    KeptPass,
    NeedFullPass,
    _grant_cells,
)
from opendws.domain.planner.incremental.queue import _Slot
from opendws.domain.policy import FlexKey
from opendws.domain.timeline import MINUTE


@dataclass(slots=True)
class _Layer:
    """How the commitments held before the policy order change in a pass (see
    :func:`relayer`). A slot is (first cell, cells, pool row, needs)."""

    # What the held slots give back (a positive amount) or take: (row, first cell, cells,
    # amount), applied to the grid under every entry.
    takes: list[tuple[int, int, int, int]] = field(default_factory=list)
    # (needs, first cell, cells) newly held: each must still fit once the walk is done
    checks: list[tuple[tuple[tuple[int, int], ...], int, int]] = field(default_factory=list)
    relocated: list[tuple[_Entry, _Slot]] = field(default_factory=list)  # held elsewhere
    dropped: list[_Entry] = field(default_factory=list)  # its request left or timed out
    absorbed: set[int] = field(default_factory=set)  # id() of a grant that took a dropped slot
    demoted: list[_Entry] = field(default_factory=list)  # no longer held: planned as any other
    promoted: list[tuple[_Entry, _Slot]] = field(default_factory=list)  # an entry now held
    quiet: list[tuple[_Entry, _Slot]] = field(default_factory=list)  # held where it was placed
    fresh: list[tuple[_Entry, _Slot]] = field(default_factory=list)  # an arrival held at once
    # A move the last pass made, carried out: the commitment is held where that pass moved it,
    # or admitted there (its grant takes exactly that slot). The grid is then as that pass
    # left it once its moves were made, so its tests and judgements still hold, except that a
    # commitment ranked before the mover was tested with the mover's old slot taken (see
    # rehold). Its takes (the old slot given back, the new one taken) are applied as
    # ``takes`` are, but are kept apart: no change to what rehold reads.
    carried: list[tuple[int, int, int, int]] = field(default_factory=list)
    carried_grants: set[int] = field(default_factory=set)  # id() of a grant that took one
    # request id → (policy key, old slot) of each carried move
    movers: dict[str, tuple[FlexKey, _Slot]] = field(default_factory=dict)


def relayer(
    planner: KeptPass,
    snapshot: Snapshot,
    state: KeepingPass,
    flex: _FlexState,
    arrivals: list[_Entry],
    gone: set[str],
    added: list[Grant],
    clock: _ClockMove,
) -> _Layer:
    """How the commitments held before the policy order change from the last pass (the
    clock already moved): the commitments within the horizon now, each at its first slot
    (:func:`commitment_slots`), against those held then. Else raise :class:`NeedFullPass`
    (a commitment whose request the clock planned again).

    The last pass held every commitment at its first slot. Whether this one can too is
    known only once the walk is done (see :func:`still_fit`); every slot it takes is
    listed for that check."""
    layer = _Layer()
    new: dict[str, tuple[_Slot, _Entry]] = {}
    horizon = snapshot.policy.commit_within
    expired = {id(entry) for entry in clock.expired_held}
    fresh = {entry.candidate.request.request_id: entry for entry in arrivals}
    looked: list[str] | None = None  # the requests looked at again, sorted (None: all)
    if horizon is None:
        planner._promised = None
    else:
        beyond = state.now + horizon
        named = looked_at(planner, snapshot, beyond, gone, fresh, clock)
        looked = None if named is None else sorted(named)
        promised = planner._promised
        assert promised is not None
        replanned = {id(entry) for entry in (*clock.restart, *clock.expired)}
        base = (state.origin - _SLOTS_EPOCH) // MINUTE  # the grid's cell 0, as a minute
        first_slots = planner._first_slots
        for key in promised if looked is None else looked:
            commitment = promised.get(key)
            if commitment is None or commitment.start_at >= beyond or key in gone:
                continue
            entry = planner._held.get(key) or planner._entry_of.get(key) or fresh.get(key)
            if entry is None or id(entry) in expired:
                continue
            if id(entry) in replanned:
                raise NeedFullPass("a commitment's request is planned again as the clock moved")
            # Most passes: the same commitment for the same candidate, its slot still
            # ahead (see first_slot), inline.
            known = first_slots.get(key)
            if (
                known is not None
                and known[0] is commitment
                and known[1] is entry.candidate
                and known[4] is not None
                and known[3] > base
                and known[2] - base == entry.last
            ):
                new[key] = ((known[3] - base, *known[4]), entry)
                continue
            slot = first_slot(planner, state, flex, commitment, entry, base)
            if slot is not None:
                new[key] = (slot, entry)
        if len(planner._first_slots) > 2 * len(promised) + 64:
            planner._first_slots = {
                key: known for key, known in planner._first_slots.items() if key in promised
            }
    moves = planner._moves or {}
    held_now = planner._held
    for key, held in (
        held_now.items()
        if looked is None
        else [(key, held_now[key]) for key in looked if key in held_now]
    ):
        was = planner._slots[key]
        cell, span, row, needs = was
        found = new.get(key)
        if found is not None:
            slot = found[0]
            if slot != was:
                taken = [(need, cell, span, amount) for need, amount in needs]
                taken += [(need, slot[0], slot[1], -amount) for need, amount in slot[3]]
                if moves.get(key) == (was, slot):  # where the last pass moved it
                    layer.carried += taken
                    layer.movers[key] = (held.key, was)
                else:
                    layer.takes += taken
                layer.checks.append((slot[3], slot[0], slot[1]))
                layer.relocated.append((held, slot))
            continue
        if key in gone or id(held) in expired:
            layer.dropped.append(held)
            grant = absorbing(planner, state, flex, added, key, was)
            if grant is not None:
                layer.absorbed.add(id(grant))
                continue
            move = moves.get(key)
            if key in gone and move is not None and move[0] == was:
                # Admitted where the last pass moved it: its grant takes that slot.
                grant = absorbing(planner, state, flex, added, key, move[1])
                if grant is not None:
                    layer.carried_grants.add(id(grant))
                    layer.carried += [(need, cell, span, amount) for need, amount in needs]
                    layer.movers[key] = (held.key, was)
                    continue
        else:
            layer.demoted.append(held)
        layer.takes += [(need, cell, span, amount) for need, amount in needs]
    for key, (slot, entry) in new.items():
        if key in planner._held:
            continue
        cell, span, row, needs = slot
        if key in fresh:
            layer.fresh.append((entry, slot))
        elif planner._carried_out(entry, clock.slot, (cell, span), row, needs):
            layer.quiet.append((entry, slot))  # it holds the slot it had: no cell changes
            continue
        else:
            layer.promoted.append((entry, slot))
        layer.takes += [(need, cell, span, -amount) for need, amount in needs]
        layer.checks.append((needs, cell, span))
    return layer


def looked_at(
    planner: KeptPass,
    snapshot: Snapshot,
    beyond: datetime,
    gone: set[str],
    fresh: Mapping[str, _Entry],
    clock: _ClockMove,
) -> set[str] | None:
    """Bring the commitments kept by request (``_promised``: the last one told for each)
    up to ``snapshot``'s, and name the requests whose commitment, whether it lies within
    the horizon (before ``beyond``), or what its first slot reads may have changed since
    they were last looked at: the commitments that came or left (told apart by identity,
    as pending requests are), the ones the horizon reached since (``_beyond``: by start),
    requests that left or came, those the clock planned again or timed out, and the held
    ones whose run from now grew (a slot from now spans it). For every other request
    within the horizon, the last pass found its first slot and held it there (or found
    none), and would find the same. None: every request is looked at again (after a full
    pass, in a later minute, whose cells moved, or where a request has two commitments:
    the last one counts, which the identities alone do not tell)."""
    told = snapshot.commitments
    promised = planner._promised
    if promised is None or clock.shifted or planner._twice:
        promise_all(planner, told, beyond)
        return None
    looked: set[str] = set()
    if told is not planner._promised_of:
        before, after = identity_changes(planner._promised_of, told)
        left = {commitment.request_id: commitment for commitment in before}
        came = {commitment.request_id: commitment for commitment in after}
        if len(left) < len(before) or len(came) < len(after):
            promise_all(planner, told, beyond)  # one request's two, or more
            return None
        for key in left.keys() | came.keys():
            old, now_told = left.get(key), came.get(key)
            if (promised.get(key) is not old) if old is not None else key in promised:
                promise_all(planner, told, beyond)  # another one told for it
                return None
            if now_told is None:
                del promised[key]
            else:
                promised[key] = now_told
                if now_told.start_at >= beyond:
                    planner._seq += 1
                    heapq.heappush(planner._beyond, (now_told.start_at, planner._seq, now_told))
            looked.add(key)
        planner._promised_of = told
    waiting = planner._beyond
    while waiting and waiting[0][0] < beyond:  # the horizon reached them
        commitment = heapq.heappop(waiting)[2]
        if promised.get(commitment.request_id) is commitment:
            looked.add(commitment.request_id)
    looked.update(fresh)
    looked.update(key for key in gone if key in promised or key in planner._held)
    looked.update(
        entry.candidate.request.request_id
        for entry in (*clock.restart, *clock.expired, *clock.expired_held)
    )
    looked.update(clock.flipped_held)
    return looked


def promise_all(planner: KeptPass, told: tuple[Commitment, ...], beyond: datetime) -> None:
    """Keep ``told`` by request (the last one counts), and those starting at or after
    ``beyond`` by start: every request is looked at again."""
    promised: dict[str, Commitment] = {}
    twice = False
    for commitment in told:
        twice = twice or commitment.request_id in promised
        promised[commitment.request_id] = commitment
    planner._promised, planner._promised_of, planner._twice = promised, told, twice
    planner._beyond = []
    for commitment in promised.values():
        if commitment.start_at >= beyond:
            planner._seq += 1
            planner._beyond.append((commitment.start_at, planner._seq, commitment))
    heapq.heapify(planner._beyond)


def first_slot(
    planner: KeptPass,
    state: KeepingPass,
    flex: _FlexState,
    commitment: Commitment,
    entry: _Entry,
    base: int,
) -> _Slot | None:
    """The first slot :func:`commitment_slots` gives ``commitment`` (within the
    horizon) for ``entry``'s request, or None; ``base``: the grid's cell 0, as a minute
    from _SLOTS_EPOCH. It is kept per request, in minutes rather than cells: for the same
    commitment and candidate, a later now leaves a slot still ahead at the same minute
    (its deadline too), so only one that came is worked out again (see relayer, which
    reads what is kept)."""
    candidate = entry.candidate
    found = commitment_slots(
        commitment,
        candidate,
        entry.length,
        entry.first,
        entry.last,
        flex.binding,
        flex.limit_row,
        flex.short,
        origin=state.origin,
        pool_row=state.pool_row,
    )
    if found is None:
        planner._first_slots[candidate.request.request_id] = (
            commitment, candidate, entry.last + base, base, None,
        )  # fmt: skip
        return None
    row, needs, cells = found
    cell, span = cells[0]
    planner._first_slots[candidate.request.request_id] = (
        commitment, candidate, entry.last + base, cell + base, (span, row, needs),
    )  # fmt: skip
    return cell, span, row, needs


def absorbing(
    planner: KeptPass,
    state: KeepingPass,
    flex: _FlexState,
    added: list[Grant],
    key: str,
    slot: tuple[int, int, int, tuple[tuple[int, int], ...]],
) -> Grant | None:
    """The grant among ``added`` that takes exactly the slot the commitment ``key`` held
    (its admission carried out), on every row a search reads; None if there is none."""
    cell, span, row, needs = slot
    for grant in added:
        if (
            grant.request_id == key
            and _grant_cells(flex, grant) == (cell, span)
            and state.pool_row.get(grant.pool_id) == row
            and sorted(c for c in state.grant_rows(grant, flex.limit_row) if flex.binding[c[0]])
            == sorted(needs)
        ):
            return grant
    return None


def _holds_commitments(snapshot: Snapshot, now: datetime) -> bool:
    """True if ``snapshot`` holds a commitment at ``now``: one told less than the horizon
    ahead (a pass holds those before the policy order; one further ahead is an estimate that
    no pass reads, so it changes no plan). A pass over one keeps nothing to plan from."""
    horizon = snapshot.policy.commit_within
    if horizon is None or not snapshot.commitments:
        return False
    beyond = now + horizon
    return any(commitment.start_at < beyond for commitment in snapshot.commitments)
