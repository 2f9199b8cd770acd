"""A reconcile pass costs what changed: the service keeps the requests not yet final between
passes and reads only what changed since; a stale copy never causes a wrong write; and a pass
asked for while another one runs is owed, not dropped."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from opendws.adapters.memory import MemoryCapacityProvider, MemoryRequestStore
from opendws.domain.model import Pool
from opendws.domain.states import RequestState
from opendws.ports import Change, Changes, Observed, StatusEvent, Watermark, order_name
from opendws.service.reconcile import ReconcileService
from tests.builders import A3, H100, NOW, flex, pool
from tests.world import World, memory_world, submit, tenants_for

S = RequestState


class CountingStore(MemoryRequestStore):
    """The memory store, counting the records each read of changes returned."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[int] = []

    def changes(self, since: Watermark | None) -> Changes:
        found = super().changes(since)
        self.read.append(len(found.records))
        return found


BUSY, FREE = "us-central1-a", "us-central1-b"


def world_with_backlog(held: int) -> tuple[World, MemoryCapacityProvider, CountingStore]:
    """Two pools of 4 VMs: BUSY is held for days by a blocker, and ``held`` requests wait
    behind it there (PENDING, with an ETA); FREE is free."""
    world, cloud = memory_world(
        [pool(zone=BUSY, capacity=4), pool(zone=FREE, capacity=4)], tenants_for(H100)
    )
    cloud.set_stock(BUSY, A3, 4)
    cloud.set_stock(FREE, A3, 4)
    store = CountingStore()
    world.store = store
    submit(store, flex("blocker", vm_count=4, hours=100, locations=(BUSY,)))
    world.reconciler("setup").run_pass()  # the blocker holds BUSY from now on
    store.read.clear()
    for index in range(held):
        submit(store, flex(f"held-{index}", vm_count=4, hours=1, locations=(BUSY,)))
    return world, cloud, store


def settle(world: World, service: ReconcileService) -> None:
    """Pass until a pass read nothing and wrote nothing (the blocker ACTIVE, ETAs kept)."""
    for _ in range(10):
        world.clock.advance(timedelta(minutes=1))
        report = service.run_pass()
        store = world.store
        assert isinstance(store, CountingStore)
        if store.read[-1] == 0 and not report.transitions and report.revisions == 0:
            return
    raise AssertionError("the world did not settle")


def test_a_steady_pass_reads_what_changed_not_the_backlog() -> None:
    world, _, store = world_with_backlog(200)
    service = world.reconciler()
    first = service.run_pass()
    assert first.ran
    assert store.read == [201]  # cold: every request not final (the blocker too), once
    settle(world, service)
    assert store.read[-1] == 0  # nothing changed: nothing read
    submit(store, flex("small", vm_count=1, hours=1, locations=(FREE,)))
    report = service.run_pass()
    assert store.read[-1] == 1  # one arrival: one record
    assert report.transitions == {(S.PENDING, S.PROVISIONING): 1}
    assert world.state("small") is S.PROVISIONING


def test_the_mirror_plans_like_a_cold_read() -> None:
    """The same decisions as a fresh service, reading everything, makes on the same store."""
    warm_world, _, warm_store = world_with_backlog(30)
    cold_world, _, cold_store = world_with_backlog(30)
    kept = warm_world.reconciler()
    kept.run_pass()
    cold_world.reconciler().run_pass()
    for store in (warm_store, cold_store):
        for index in range(3):
            submit(store, flex(f"fits-{index}", vm_count=1, hours=1, locations=(FREE,)))
    warm = kept.run_pass()
    cold = cold_world.reconciler().run_pass()
    assert cold_store.read[-1] == 34  # the fresh service read everything
    assert warm.transitions == cold.transitions == {(S.PENDING, S.PROVISIONING): 3}
    assert sorted(warm.provisioned) == sorted(cold.provisioned)
    assert warm.revisions == cold.revisions
    assert {r.request_id: (r.state, r.eta, r.version) for r in warm_store.in_states(*S)} == {
        r.request_id: (r.state, r.eta, r.version) for r in cold_store.in_states(*S)
    }


def test_a_change_by_another_writer_reaches_the_mirror_and_no_wrong_write_follows() -> None:
    world, _, store = world_with_backlog(0)
    service = world.reconciler()
    submit(store, flex("r1", vm_count=4, hours=1, locations=(BUSY,)))  # waits
    service.run_pass()
    record = world.record("r1")
    cancelled = StatusEvent(
        request_id="r1", tenant="t", state=S.CANCELLED, previous_state=S.PENDING,
        at=NOW + timedelta(seconds=1),
    )  # fmt: skip
    store.change("r1", Change(expected_version=record.version, state=S.CANCELLED, event=cancelled))
    report = service.run_pass()
    assert report.ran
    assert not report.stale
    assert world.state("r1") is S.CANCELLED
    assert report.transitions == {}


def test_a_stale_copy_is_refused_by_its_version_and_read_again() -> None:
    """A write behind the mirror's back between its read and the pass's write: the pass's
    guarded write is refused (the request skipped), and the next pass works from the new
    version."""
    world, _, store = world_with_backlog(0)
    service = world.reconciler()
    submit(store, flex("r1", vm_count=1, hours=1, locations=(FREE,)))

    original = store.changes

    def changes_then_cancel(since: Watermark | None) -> Changes:
        found = original(since)
        record = store.get("r1")
        assert record is not None
        if record.state is S.PENDING:
            event = StatusEvent(
                request_id="r1", tenant="t", state=S.CANCELLED, previous_state=S.PENDING,
                at=NOW,
            )  # fmt: skip
            store.change(
                "r1", Change(expected_version=record.version, state=S.CANCELLED, event=event)
            )
        return found

    store.changes = changes_then_cancel  # type: ignore[method-assign]
    report = service.run_pass()
    assert report.skipped == ["r1"]  # refused by its version: nothing provisioned for it
    assert order_name("r1", 1) not in report.provisioned
    store.changes = original  # type: ignore[method-assign]
    assert service.run_pass().transitions == {}
    assert world.state("r1") is S.CANCELLED


def test_a_pass_asked_for_during_a_pass_is_owed_once() -> None:
    world, cloud, _ = world_with_backlog(0)
    service: ReconcileService = world.reconciler()
    inner: list[bool] = []
    observe = cloud.observe

    def observe_and_nudge(pools: Sequence[Pool]) -> dict[str, Observed]:
        if not inner:
            inner.append(service.run_pass().ran)  # a nudge arriving mid-pass
        return observe(pools)

    cloud.observe = observe_and_nudge  # type: ignore[method-assign]
    first = service.run_pass()
    assert inner == [False]  # the lease was held: it did nothing itself...
    assert first.again  # ...and the holder owes one more pass
    cloud.observe = observe  # type: ignore[method-assign]
    second = service.run_pass()
    assert second.ran
    assert not second.again  # served: owed once, not once per nudge
