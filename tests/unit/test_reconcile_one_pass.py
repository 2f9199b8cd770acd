"""The reconcile service runs one pass at a time, and what one pass leaves the next to look only
at what changed is one value (:class:`~opendws.service.pass_chain.PassChain`) that a pass takes
when it starts and leaves again only when it ends."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

import pytest

from opendws.domain.model import PolicySettings, Pool
from opendws.ports import Changes, Observed, Watermark
from opendws.service import reconcile
from opendws.service.pass_chain import BROKEN, PassChain, Quiet
from opendws.service.pass_report import PassReport
from tests.builders import A3, H100, flex, pool
from tests.world import memory_world, submit, tenants_for

ZONE = "us-central1-a"


def test_a_second_pass_asked_of_a_service_while_one_runs_waits_for_it_and_then_runs() -> None:
    """Two callers of one service's run_pass at once (a local server serving two ticks on two
    threads): the second does not start its pass, nor ask for the lease, until the first has
    ended; then it runs a pass of its own, under a lease name of its own."""
    world, cloud = memory_world([pool(zone=ZONE, capacity=4)], tenants_for(H100))
    cloud.set_stock(ZONE, A3, 4)
    submit(world.store, flex("train", vm_count=1, hours=1, locations=(ZONE,)))
    service = world.reconciler()
    inside, go_on = threading.Event(), threading.Event()
    store = world.store
    read_changes, take_lease = store.changes, store.acquire_lease
    holders: list[str] = []

    def changes(since: Watermark | None) -> Changes:
        if not inside.is_set():  # the first pass holds here, its lease taken
            inside.set()
            assert go_on.wait(10)
        return read_changes(since)

    def acquire_lease(holder: str, *args: object, **kwargs: object) -> object:
        holders.append(holder)
        return take_lease(holder, *args, **kwargs)  # type: ignore[arg-type]

    store.changes = changes  # type: ignore[method-assign]
    store.acquire_lease = acquire_lease  # type: ignore[method-assign,assignment]
    reports: list[PassReport] = []
    first = threading.Thread(target=lambda: reports.append(service.run_pass()))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=lambda: reports.append(service.run_pass()))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # waiting for the first pass
    assert len(holders) == 1  # and not asking for the lease meanwhile
    go_on.set()
    first.join(10)
    second.join(10)
    assert [report.ran for report in reports] == [True, True]
    assert len(set(holders)) == 2
    assert world.state("train").is_final is False


def test_the_chain_follows_only_the_look_and_the_plan_right_before() -> None:
    """The sweep link holds for the next look with the same pools configured; the plan link
    for the next plan under the same policy object (a configuration read anew is another);
    a cold instance's chain follows nothing."""
    policy = PolicySettings()
    chain = PassChain(
        look=7, configured=frozenset({"a"}), plans=3, policy=policy,
        due=frozenset({"x"}), watched=frozenset(),
    )  # fmt: skip
    assert chain.sweep_follows(8, frozenset({"a"}))
    assert not chain.sweep_follows(9, frozenset({"a"}))  # another look in between
    assert not chain.sweep_follows(8, frozenset({"a", "b"}))  # another pool configured
    assert chain.plan_follows(4, policy)
    assert not chain.plan_follows(5, policy)  # a plan no pass carried out
    assert not chain.plan_follows(4, replace(policy))  # the policy read anew
    unswept = replace(chain, look=None)
    assert not unswept.sweep_follows(8, frozenset({"a"}))
    assert unswept.plan_follows(4, policy)  # the sweep cut short leaves the plan link
    assert not BROKEN.sweep_follows(1, frozenset())
    assert not BROKEN.plan_follows(1, policy)


def test_a_pass_that_raised_leaves_the_chain_broken_and_the_next_looks_at_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After an unbroken pass the chain names the planner's plan and the look the sweep ran
    to its end after, and the next pass checks no quiet request whose record and order did
    not change. A pass that raised (here while building its snapshot, after its sweep) leaves
    the chain broken: the next pass checks every quiet request once, then the chain holds
    again."""
    world, cloud = memory_world([pool(zone=ZONE, capacity=4)], tenants_for(H100))
    cloud.set_stock(ZONE, A3, 4)
    for name in ("one", "two"):
        submit(world.store, flex(name, vm_count=1, hours=10, locations=(ZONE,)))
    service = world.reconciler()
    for _ in range(4):  # admitted, served, then swept quiet
        world.clock.advance(timedelta(minutes=1))
        service.run_pass()
    assert len(service.kept.quiet) == 2
    checked: list[int] = []
    holds = Quiet.holds

    def counting(quiet: Quiet, *args: object) -> bool:
        checked[-1] += 1
        return holds(quiet, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Quiet, "holds", counting)

    def one_pass() -> int:
        checked.append(0)
        world.clock.advance(timedelta(minutes=1))
        service.run_pass()
        return checked[-1]

    assert one_pass() == 0
    chain = service.kept.chain
    assert chain.plans == service.kept.planner.plans
    assert chain.look == world.providers.looks
    snapshot = reconcile._Cycle._snapshot

    def failing(cycle: reconcile._Cycle, *args: object, **kwargs: object) -> object:
        raise RuntimeError("Firestore is unavailable")

    monkeypatch.setattr(reconcile._Cycle, "_snapshot", failing)
    with pytest.raises(RuntimeError):
        one_pass()
    assert service.kept.chain is BROKEN
    monkeypatch.setattr(reconcile._Cycle, "_snapshot", snapshot)
    assert one_pass() == 2  # every quiet request, once
    assert one_pass() == 0
    assert {world.state(name).value for name in ("one", "two")} == {"ACTIVE"}


def test_a_pass_asked_of_a_service_from_within_its_own_pass_is_refused_not_waited_for() -> None:
    """A pass that calls its own service's run_pass (a mistake: waiting would never end) gets
    a clear error; the lease is given up and the next pass runs."""
    world, cloud = memory_world([pool(zone=ZONE, capacity=4)], tenants_for(H100))
    service = world.reconciler()
    observe = cloud.observe

    def observe_and_pass(pools: Sequence[Pool]) -> dict[str, Observed]:
        service.run_pass()
        return observe(pools)

    cloud.observe = observe_and_pass  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="from within a pass of the same service"):
        service.run_pass()
    cloud.observe = observe  # type: ignore[method-assign]
    assert service.run_pass().ran
