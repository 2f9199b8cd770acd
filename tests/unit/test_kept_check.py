"""The check of the incremental planner's kept state: each index over the kept entries,
corrupted in turn, is named (the property tests call the check after every plan, so an index
that drifts fails the step where it drifted)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from opendws.domain import Decision, Outcome
from opendws.domain.planner.incremental.check import KeptIndexDrift, check
from opendws.domain.planner.incremental.kept import KeptPass
from opendws.domain.planner.incremental.planner import IncrementalPlanner
from tests.builders import HOUR, NOW, flex, grant, pool, quota, tenant
from tests.builders import snapshot as build_snapshot


def planned() -> IncrementalPlanner:
    """A planner after two passes (the second incremental) over a pool with a running grant,
    a best-effort tenant and a strict-FIFO one: every index has entries."""
    pending = [
        flex(f"{who}{index}", tenant=who, vm_count=2 + index % 3, hours=1 + index)
        for index in range(4)
        for who in ("best", "line")
    ]
    snapshot = build_snapshot(
        pools=[pool(capacity=8)],
        tenants=[
            tenant("best", quota(nominal=1024)),
            tenant("line", quota(nominal=1024), strict_fifo=True),
        ],
        grants=[grant("g1", units=4, start_at=NOW - HOUR, hours=3)],
        pending=pending[:-1],
    )
    planner = IncrementalPlanner(clock_floor=0)
    planner.plan(snapshot, NOW)
    planner.plan(build_snapshot(
        pools=snapshot.pools, tenants=snapshot.tenants, grants=snapshot.grants, pending=pending,
    ), NOW)  # fmt: skip
    assert not planner.last_pass.full
    return planner


def _swap(items: list[object]) -> None:
    items[0], items[1] = items[1], items[0]


def _first_row(kept: KeptPass) -> int:
    return next(row for row, readers in kept._readers.items() if readers)


def _strict(kept: KeptPass) -> str:
    return next(tenant for tenant, line in kept._siblings.items() if line)


CORRUPTIONS: dict[str, Callable[[IncrementalPlanner], object]] = {
    "entries": lambda p: _swap(p._pass.flex.entries),  # type: ignore[union-attr,arg-type]
    "entry_of": lambda p: p._entry_of.popitem(),
    "reads": lambda p: p._reads.popitem(),
    "readers": lambda p: p._readers[_first_row(p)].pop(),
    "siblings": lambda p: p._siblings[_strict(p)].pop(),
    "by_pool": lambda p: p._by_pool[next(row for row, held in p._by_pool.items() if held)].pop(),
    "order": lambda p: _swap(p._order),  # type: ignore[arg-type]
    "order_keys": lambda p: _swap(p._order_keys),  # type: ignore[arg-type]
    "slots": lambda p: p._slots.setdefault("nobody", (0, 1, 0, ())),
    "ids": lambda p: p._ids.append("zz-nobody"),
    "decisions": lambda p: p._decisions.__setitem__(
        0, Decision(request_id=p._ids[0], outcome=Outcome.WAIT, detail="corrupted")
    ),
    "admitted": lambda p: p._admitted.add("nobody"),
    "demand": lambda p: p._demand.__setitem__(0, p._demand[0] + 1),
}


def test_the_kept_state_of_a_plan_checks_out() -> None:
    check(planned())


@pytest.mark.parametrize("index", list(CORRUPTIONS))
def test_a_corrupted_index_is_named(index: str) -> None:
    planner = planned()
    CORRUPTIONS[index](planner)
    with pytest.raises(KeptIndexDrift) as raised:
        check(planner)
    assert str(raised.value) == index
