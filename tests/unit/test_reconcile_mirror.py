"""A reconcile pass costs what changed: the service keeps the requests not yet final between
passes and reads only what changed since; a stale copy never causes a wrong write; and a pass
asked for while another one runs is owed, not dropped."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from opendws.adapters.memory import MemoryCapacityProvider, MemoryRequestStore
from opendws.domain.model import Pool
from opendws.domain.states import RequestState
from opendws.domain.sweep import Step, SweepSettings, SweepView, sweep
from opendws.ports import (
    Change,
    Changes,
    Configuration,
    Observed,
    Order,
    RequestRecord,
    StatusEvent,
    Watermark,
    order_name,
)
from opendws.ports.records import accepted
from opendws.service import reconcile
from opendws.service.mirror import RequestMirror
from opendws.service.reconcile import ReconcileService
from tests.builders import A3, H100, NOW, calendar, flex, pool
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
    other = world.reconciler("reconciler-2")  # another instance: one pass at a time each
    inner: list[bool] = []
    observe = cloud.observe

    def observe_and_nudge(pools: Sequence[Pool]) -> dict[str, Observed]:
        if not inner:
            inner.append(other.run_pass().ran)  # a nudge arriving mid-pass
        return observe(pools)

    cloud.observe = observe_and_nudge  # type: ignore[method-assign]
    first = service.run_pass()
    assert inner == [False]  # the lease was held: it did nothing itself...
    assert first.again  # ...and the holder owes one more pass
    cloud.observe = observe  # type: ignore[method-assign]
    second = service.run_pass()
    assert second.ran
    assert not second.again  # served: owed once, not once per nudge


class SweepSpy:
    """Counts the sweep's table lookups per request (the pure ``sweep`` the service calls)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.swept: list[str] = []
        self.views: dict[int, str] = {}
        original = sweep

        def counting(view: SweepView, now: datetime, settings: SweepSettings) -> Step:
            self.swept.append(self.current)
            return original(view, now, settings)

        self.current = ""
        original_sweep = reconcile._Cycle._sweep

        def named(cycle: reconcile._Cycle, record: RequestRecord, *args: Any) -> None:
            self.current = record.request_id
            original_sweep(cycle, record, *args)

        monkeypatch.setattr("opendws.service.pass_sweep.sweep", counting)
        monkeypatch.setattr(reconcile._Cycle, "_sweep", named)


def running(world: World, service: ReconcileService, request_id: str) -> None:
    for _ in range(5):
        world.clock.advance(timedelta(minutes=1))
        service.run_pass()
        if world.state(request_id) is S.ACTIVE:
            return
    raise AssertionError(f"{request_id} never ran")


def quiet_run() -> tuple[World, MemoryCapacityProvider, ReconcileService]:
    """A world where ``small`` (1 VM on FREE for 10 h) runs, and a reconciler whose last
    pass found it quiet."""
    world, cloud, store = world_with_backlog(0)
    service = world.reconciler()
    submit(store, flex("small", vm_count=1, hours=10, locations=(FREE,)))
    running(world, service, "small")
    world.clock.advance(timedelta(minutes=1))
    service.run_pass()
    return world, cloud, service


def test_a_quiet_run_is_swept_again_only_once_what_was_observed_of_it_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A running gang whose pass found nothing to do costs no table lookup while its record
    and its order stay as they were; once its VMs are gone, the next pass sweeps it and ends
    it (the cloud ended the run)."""
    world, cloud, store = world_with_backlog(0)
    service = world.reconciler()
    submit(store, flex("small", vm_count=1, hours=10, locations=(FREE,)))
    running(world, service, "small")
    spy = SweepSpy(monkeypatch)
    for _ in range(20):
        world.clock.advance(timedelta(minutes=1))
        service.run_pass()
    assert spy.swept.count("small") == 1  # the first pass after it ran; then it was quiet
    cloud.release(order_name("small", world.record("small").attempt), pool(zone=FREE))
    report = service.run_pass()
    assert spy.swept.count("small") == 2
    assert world.state("small") is S.EXPIRED
    assert report.transitions == {(S.ACTIVE, S.EXPIRED): 1}


def test_a_quiet_booking_is_swept_again_when_its_start_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A booked block waits for its start with nothing to do; with no timer to start it, the
    first pass at its start sweeps it and provisions it, however many passes left it alone."""
    world, _, store = world_with_backlog(0)
    service = world.reconciler()
    start = NOW + timedelta(days=1)
    submit(store, calendar("block", vm_count=2, days=1, start_at=start, locations=(FREE,)))
    for _ in range(5):
        world.clock.advance(timedelta(minutes=1))
        service.run_pass()
    assert world.state("block") is S.BOOKED
    spy = SweepSpy(monkeypatch)
    while world.clock.now() + timedelta(hours=1) < start:
        world.clock.advance(timedelta(hours=1))
        service.run_pass()
    assert world.state("block") is S.BOOKED
    assert spy.swept.count("block") == 0  # nothing to do until its start
    world.clock.set(start)
    service.run_pass()
    assert spy.swept.count("block") == 1
    assert world.state("block") is S.PROVISIONING
    assert world.record("block").reason == "BLOCK_STARTED"


def test_a_pass_at_the_same_instant_plans_from_the_last_plan() -> None:
    """The service keeps its planner between passes: a pass at the instant of the last one
    plans incrementally (the domain's property tests show that this is the plan admit makes),
    and its decisions are those of a fresh service's cold pass on the same store."""
    world, _, store = world_with_backlog(30)
    service = world.reconciler()
    service.run_pass()
    assert service.kept.planner.last_pass.full
    submit(store, flex("fits", vm_count=1, hours=1, locations=(FREE,)))
    report = service.run_pass()  # the clock has not moved
    assert not service.kept.planner.last_pass.full
    assert report.transitions == {(S.PENDING, S.PROVISIONING): 1}
    held = {r.request_id: r.eta for r in store.in_states(S.PENDING)}
    world.reconciler("cold").run_pass()  # plans from scratch: writes nothing new
    assert {r.request_id: r.eta for r in store.in_states(S.PENDING)} == held


class _Feed(MemoryRequestStore):
    """A store whose reads of changes return what the test gives it next."""

    def __init__(self) -> None:
        super().__init__()
        self.next: list[RequestRecord] = []
        self.reads = 0

    def changes(self, since: Watermark | None) -> Changes:
        self.reads += 1
        found, self.next = tuple(self.next), []
        return Changes(records=found, watermark=Watermark(self.reads))


def _pending(request_id: str, minutes: int) -> RequestRecord:
    record, _ = accepted(flex(request_id, submitted_at=NOW + timedelta(minutes=minutes)), NOW)
    return record


def test_the_mirror_returns_submission_order_whatever_order_changes_arrive_in() -> None:
    """The mirror keeps its order by appending newcomers; one submitted before a request it
    holds (a late delivery, an id that sorts first at the same instant) is put in its place,
    and a rewrite of a held request keeps its place."""
    feed = _Feed()
    mirror = RequestMirror()
    feed.next = [_pending("b", 2), _pending("c", 3)]
    assert list(mirror.refresh(feed).records) == ["b", "c"]
    feed.next = [_pending("d", 4), _pending("a", 1), _pending("a2", 1)]
    assert list(mirror.refresh(feed).records) == ["a", "a2", "b", "c", "d"]
    rewritten = replace(_pending("b", 2), version=2, reason="QUOTA")
    feed.next = [rewritten, _pending("e", 5), _pending("a1", 1)]
    held = mirror.refresh(feed)
    assert list(held.records) == ["a", "a1", "a2", "b", "c", "d", "e"]
    assert held.records["b"] is rewritten
    feed.next = [replace(_pending("c", 3), version=2, state=S.CANCELLED)]
    assert list(mirror.refresh(feed).records) == ["a", "a1", "a2", "b", "d", "e"]


def test_the_mirror_keeps_what_a_pass_sweeps_and_what_google_is_still_to_serve() -> None:
    """A pass sweeps the live requests and the calendar blocks at Google's review, and counts
    those Google is still to serve (an order being created, a block under review): the
    mirror keeps both as records come, change state and leave, equal to working them out
    from every record."""
    feed = _Feed()
    mirror = RequestMirror()

    def check(expected_live: list[str], expected_in_flight: int) -> None:
        held = mirror.refresh(feed)
        assert sorted(held.live) == sorted(expected_live)
        assert held.in_flight == expected_in_flight
        assert all(held.records[key] is record for key, record in held.live.items())

    block, _ = accepted(calendar("blk", submitted_at=NOW), NOW)
    feed.next = [_pending("a", 1), _pending("b", 2), block]
    check([], 0)
    creating = replace(_pending("a", 1), version=2, state=S.PROVISIONING, pool="p")
    reviewed = replace(block, version=2, pool="p", attempt=1)  # submitted: under review
    feed.next = [creating, reviewed]
    check(["a", "blk"], 2)
    feed.next = [replace(creating, version=3, state=S.ACTIVE)]
    check(["a", "blk"], 1)
    feed.next = [replace(_pending("a", 1), version=4, state=S.PENDING)]  # back in line
    check(["blk"], 1)
    feed.next = [replace(reviewed, version=3, state=S.BOOKED)]
    check(["blk"], 0)
    feed.next = [replace(reviewed, version=4, state=S.CANCELLED), _pending("c", 3)]
    check([], 0)
    feed.next = [replace(_pending("b", 2), version=2, state=S.PROVISIONING, pool="p")]
    mirror.record(replace(_pending("c", 3), version=2, state=S.PROVISIONING, pool="p"))
    check(["b", "c"], 2)


def test_a_quiet_order_google_never_serves_times_out_at_max_wait_on_a_kept_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An order Google keeps queued shows the same report pass after pass, so the request is
    left alone (no table lookup) while it waits; no report change marks its max_wait, so
    the pass at that instant looks at it for its steady time alone, and times it out (no
    provisioning timeout: cluster-toolkit waits up to 65,535 s for flex partitions)."""
    world, cloud, store = world_with_backlog(0)
    cloud.inject(FREE, A3, "hang")
    service = world.reconciler()
    submit(store, flex("waits", vm_count=1, max_wait=timedelta(hours=2), locations=(FREE,)))
    service.run_pass()
    world.clock.advance(timedelta(minutes=1))
    service.run_pass()
    assert world.state("waits") is S.PROVISIONING
    spy = SweepSpy(monkeypatch)
    for _ in range(10):
        world.clock.advance(timedelta(minutes=10))
        service.run_pass()
    assert world.state("waits") is S.PROVISIONING
    assert spy.swept.count("waits") <= 1  # quiet from its first look on
    world.clock.set(NOW + timedelta(hours=2, seconds=1))
    service.run_pass()
    assert world.state("waits") is S.TIMED_OUT
    assert world.published("waits")[-1][:2] == ("TIMED_OUT", "MAX_WAIT_PASSED")


def test_a_quiet_run_whose_pool_is_removed_is_ended_by_the_next_pass() -> None:
    """What a quiet request's sweep read includes whether its pool is configured: a pass
    after the pool left the configuration looks at every quiet request again."""
    world, _, service = quiet_run()
    world.config.save(
        Configuration(pools=(pool(zone=BUSY, capacity=4),), tenants=tenants_for(H100))
    )
    world.clock.advance(timedelta(minutes=1))
    service.run_pass()
    assert world.state("small") is S.EXPIRED
    assert world.published("small")[-1][:2] == ("EXPIRED", "POOL_REMOVED")


def test_an_order_nobody_wants_is_released_beside_quiet_runs() -> None:
    """Quiet runs are passed over without naming their orders again, yet an order in their
    pool that no live request has (a leak: a creation whose record write was lost) is seen
    and released by the next pass."""
    world, cloud, service = quiet_run()
    stray = flex("stray", vm_count=1, locations=(FREE,))
    cloud.provision(Order(request=stray, pool=pool(zone=FREE, capacity=4), attempt=1))
    world.clock.advance(timedelta(minutes=1))
    report = service.run_pass()
    assert report.leaks == [order_name("stray", 1)]
    assert world.state("small") is S.ACTIVE


def test_a_look_at_the_providers_between_two_passes_makes_the_next_one_check_every_request() -> (
    None
):
    """What changed is known from one look to the next: when something else looked at the
    providers in between (a second reconciler, a status command), the change it saw is not
    in the pass's own look, so that pass checks every quiet request as its last sweep left
    it, and ends the run whose VMs are gone."""
    world, cloud, service = quiet_run()
    cloud.release(order_name("small", world.record("small").attempt), pool(zone=FREE))
    world.providers.observe([pool(zone=FREE)])  # someone else looks first
    world.clock.advance(timedelta(minutes=1))
    report = service.run_pass()
    assert world.state("small") is S.EXPIRED
    assert report.transitions == {(S.ACTIVE, S.EXPIRED): 1}
