"""A check of the kept state (:func:`check`): every index over the kept entries rebuilt from
the entries themselves and compared. For tests: the property tests call it after every plan,
and a test corrupts each index in turn and expects it named."""

from __future__ import annotations

import itertools

from opendws.domain.planner.incremental.full import _Entry
from opendws.domain.planner.incremental.kept import KeptPass
from opendws.domain.planner.incremental.queue import _key_of, _reads
from opendws.domain.planner.shapes import count_demand
from opendws.domain.planner.verdicts import Outcome


class KeptIndexDrift(Exception):
    """An index over the kept entries disagrees with the entries (:func:`check`): its name
    is the message."""


def _id(entry: _Entry) -> str:
    return entry.candidate.request.request_id


def check(planner: KeptPass) -> None:
    """Rebuild each index over ``planner``'s kept entries from the entries themselves and
    compare: raise :class:`KeptIndexDrift` naming the first index that disagrees. No pass
    kept (before the first plan, or after one that kept nothing): nothing to check. It costs
    a full rebuild."""
    state = planner._pass
    if state is None or state.flex is None:
        return
    entries = state.flex.entries
    held = list(planner._held.values())
    in_order = sorted([*entries, *held], key=_key_of)

    def expect(index: str, ok: bool) -> None:
        if not ok:
            raise KeptIndexDrift(index)

    expect("entries", all(a.key < b.key for a, b in itertools.pairwise(entries)))
    expect("entry_of", planner._entry_of == {_id(e): e for e in entries})
    flex = state.flex
    expect("reads", planner._reads == {_id(e): _reads(flex, e.candidate) for e in entries})
    readers: dict[int, list[_Entry]] = {}
    for entry in entries:
        for row in planner._reads.get(_id(entry), ()):
            readers.setdefault(row, []).append(entry)
    expect("readers", {r: e for r, e in planner._readers.items() if e} == readers)
    siblings: dict[str, list[_Entry]] = {}
    for entry in in_order:
        if entry.candidate.strict:
            siblings.setdefault(entry.candidate.request.tenant, []).append(entry)
    expect("siblings", {t: e for t, e in planner._siblings.items() if e} == siblings)
    by_pool: dict[int, set[_Entry]] = {}
    for entry in [*entries, *held]:
        if entry.best is not None:
            by_pool.setdefault(entry.row, set()).add(entry)
    expect("by_pool", {r: e for r, e in planner._by_pool.items() if e} == by_pool)
    expect("order", planner._order == [_id(e) for e in in_order])
    expect("order_keys", planner._order_keys == [e.key for e in in_order])
    expect("slots", planner._slots.keys() == planner._held.keys())
    expect("ids", planner._ids == sorted(state.decisions))
    expect("decisions", planner._decisions == [state.decisions[key] for key in planner._ids])
    admitted = {k for k, d in state.decisions.items() if d.outcome is Outcome.ADMIT}
    expect("admitted", planner._admitted == admitted)
    demand = [0] * len(flex.limits)
    for entry in [*entries, *held]:
        count_demand(demand, entry.candidate, flex.limit_row, state.snapshot.policy.race_width)
    expect("demand", planner._demand == demand)
