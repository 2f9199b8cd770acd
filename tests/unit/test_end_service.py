"""The end of a request on in-memory fakes: timers that end runs (and their long chains),
release and early release, cancel, who may do either, lost timers, and usage to the second."""

from __future__ import annotations

from datetime import timedelta

import pytest

from opendws.adapters.memory import MemoryCapacityProvider, MemoryNudger
from opendws.domain.states import RequestState
from opendws.ports import Configuration, Price, TimerKind
from opendws.service.release import EndOutcome
from opendws.service.usage import UsageService
from tests.builders import A3, DAY, H100, HOUR, MINUTE, NOW, V5E, calendar, flex, pool, tpu_pool
from tests.world import World, memory_world, submit, tenants_for

S = RequestState
ZONE = "us-central1-a"
# Where Google's calendar mode reserves v5e (tpu/docs/calendar-mode-reservation).
TPU_BLOCK_ZONE = "us-west4-b"
POOL = f"{ZONE}/{A3}"
LATENCY = timedelta(seconds=20)
World_ = tuple[World, MemoryCapacityProvider]


@pytest.fixture
def world_and_cloud() -> World_:
    pools = (
        pool(zone=ZONE, capacity=4),
        tpu_pool(zone=ZONE, capacity=16),
        tpu_pool(zone=TPU_BLOCK_ZONE, capacity=16),
    )
    configuration = Configuration(
        pools=pools,
        tenants=tenants_for(H100, V5E, names=("vision", "speech")),
        prices=(Price(accelerator=H100, per_hour=10.0, flex_factor=0.5, calendar_factor=0.7),),
    )
    world, cloud = memory_world(pools, (), timers=True, configuration=configuration)
    cloud.set_stock(ZONE, A3, 4)
    cloud.set_stock(ZONE, V5E, 16)
    cloud.set_stock(TPU_BLOCK_ZONE, V5E, 16)
    return world, cloud


def activate(world: World, request_id: str) -> None:
    """Two passes around the provisioning latency: admitted, then ACTIVE."""
    world.run()
    world.clock.advance(LATENCY)
    world.run()
    assert world.state(request_id) is S.ACTIVE


def test_the_release_timer_ends_the_run_at_its_time(world_and_cloud: World_) -> None:
    world, cloud = world_and_cloud
    submit(world.store, flex("train", tenant="vision", vm_count=2, hours=6))
    activate(world, "train")
    assert world.timers is not None
    [(timer, at)] = [(t, at) for t, at in world.timers.armed() if t.kind is TimerKind.RELEASE]
    assert at == NOW + LATENCY + 6 * HOUR
    world.clock.advance(6 * HOUR - MINUTE)
    assert world.fire_due() == []
    world.clock.advance(MINUTE)
    [result] = world.fire_due()
    assert (result.outcome, result.state) == (EndOutcome.ENDED, S.EXPIRED)
    assert cloud.stock(ZONE, A3) == 4
    assert world.published("train")[-1][:2] == ("EXPIRED", "RUN_TIME_UP")
    assert world.nudger.reasons == ["train expired"]
    # The same timer delivered again (Cloud Tasks is at-least-once): nothing more happens.
    assert world.ending().fire(timer).outcome is EndOutcome.IGNORED


def test_an_early_release_frees_the_capacity_and_deletes_the_timer(world_and_cloud: World_) -> None:
    world, cloud = world_and_cloud
    submit(world.store, flex("train", tenant="vision", vm_count=4, hours=6))
    submit(world.store, flex("next", tenant="speech", vm_count=4, hours=8,
                             submitted_at=NOW + MINUTE))  # fmt: skip
    activate(world, "train")
    world.clock.advance(2 * HOUR)
    result = world.ending().release("train", "vision")
    assert (result.outcome, result.state) == (EndOutcome.ENDED, S.RELEASED)
    assert cloud.stock(ZONE, A3) == 4
    assert world.timers is not None
    assert [t.request_id for t, _ in world.timers.armed() if t.kind is TimerKind.RELEASE] == []
    world.run()  # the nudge's pass admits the next request at once
    assert world.state("next") is S.PROVISIONING
    again = world.ending().release("train", "vision")
    assert again.outcome is EndOutcome.ALREADY_ENDED


class UnconfirmedNudger(MemoryNudger):
    """A nudger whose publish Pub/Sub never confirms (opendws.adapters.pubsub waits for it)."""

    def nudge(self, reason: str) -> None:
        raise TimeoutError(f"nudge {reason!r} not confirmed")


def test_a_nudge_that_fails_after_an_ending_fails_nothing(
    world_and_cloud: World_, caplog: pytest.LogCaptureFixture
) -> None:
    """The run has ended whatever becomes of the nudge: a lost nudge only costs the wait until
    the next tick, so the release answers as it would have, with a warning."""
    world, cloud = world_and_cloud
    submit(world.store, flex("train", tenant="vision", vm_count=4, hours=6))
    activate(world, "train")
    world.nudger = UnconfirmedNudger()
    result = world.ending().release("train", "vision")
    assert (result.outcome, result.state) == (EndOutcome.ENDED, S.RELEASED)
    assert cloud.stock(ZONE, A3) == 4
    assert world.published("train")[-1][0] == "RELEASED"
    [warning] = [r for r in caplog.records if "nudge" in r.getMessage()]
    assert warning.levelname == "WARNING"
    assert "not confirmed" in warning.getMessage()


def test_only_the_tenant_or_an_admin_may_release_or_cancel(world_and_cloud: World_) -> None:
    world, _ = world_and_cloud
    submit(world.store, flex("train", tenant="vision", vm_count=1))
    activate(world, "train")
    refused = world.ending().release("train", "speech")
    assert refused.outcome is EndOutcome.REFUSED
    assert world.state("train") is S.ACTIVE
    event = world.bus.published[-1]
    assert (event.tenant, event.reason, event.state) == ("speech", "NOT_YOUR_REQUEST", S.ACTIVE)
    assert "only its own tenant" in event.message
    assert world.ending().cancel("ghost", "speech").outcome is EndOutcome.REFUSED
    assert world.bus.published[-1].reason == "UNKNOWN_REQUEST"
    admin = world.ending().release("train", "platform-team", admin=True)
    assert admin.state is S.RELEASED
    assert world.store.events("train")[-1].message == "released by an admin"


def test_cancel_withdraws_a_waiting_request_or_a_booked_block(world_and_cloud: World_) -> None:
    world, cloud = world_and_cloud
    # Far enough ahead that Google lets it be cancelled (more than 30 days away).
    submit(world.store, calendar("block", tenant="vision", vm_count=2, start_at=NOW + 40 * DAY))
    world.run()
    world.clock.advance(2 * MINUTE)  # Google's review
    submit(world.store, flex("wait", tenant="vision", vm_count=1, hours=1,
                             submitted_at=world.clock.now()))  # fmt: skip
    world.run()
    assert world.state("block") is S.BOOKED
    assert cloud.stock(ZONE, A3) == 4  # the block's 2 VMs are promised, taken at its start
    assert world.ending().cancel("block", "vision").state is S.CANCELLED
    assert world.timers is not None
    armed = {(t.request_id, t.kind) for t, _ in world.timers.armed()}
    assert ("block", TimerKind.START) not in armed
    assert world.ending().cancel("wait", "vision").state is S.CANCELLED
    world.clock.advance(LATENCY)
    world.run()
    assert cloud.observe([pool(zone=ZONE)]) == {}
    assert cloud.stock(ZONE, A3) == 4


def test_a_running_request_is_not_cancelled_but_told_to_release(world_and_cloud: World_) -> None:
    world, _ = world_and_cloud
    submit(world.store, flex("train", tenant="vision", vm_count=1))
    activate(world, "train")
    result = world.ending().cancel("train", "vision")
    assert (result.outcome, result.state) == (EndOutcome.REFUSED, S.ACTIVE)
    assert world.bus.published[-1].reason == "NOT_CANCELLABLE"


def test_the_expiry_timer_times_out_a_request_still_waiting(world_and_cloud: World_) -> None:
    world, _ = world_and_cloud
    submit(world.store, flex("big", tenant="vision", vm_count=4, hours=8))
    submit(world.store, flex("late", tenant="speech", vm_count=4, hours=10,
                             max_wait=2 * HOUR, submitted_at=NOW + MINUTE))  # fmt: skip
    assert world.timers is not None
    from opendws.service.timers import expiry_timer

    world.timers.arm(expiry_timer(world.record("late")), NOW)  # as intake does
    world.run()
    world.clock.advance(2 * HOUR + MINUTE)
    results = world.fire_due()
    assert [(r.outcome, r.state) for r in results] == [(EndOutcome.ENDED, S.TIMED_OUT)]
    assert world.published("late")[-1][:2] == ("TIMED_OUT", "MAX_WAIT_PASSED")


def test_a_timer_of_an_older_run_is_ignored(world_and_cloud: World_) -> None:
    world, _ = world_and_cloud
    submit(world.store, flex("train", tenant="vision", vm_count=1, hours=1))
    activate(world, "train")
    from dataclasses import replace

    assert world.timers is not None
    [(timer, _)] = world.timers.armed()
    stale = replace(timer, generation=timer.generation + 1)
    world.clock.advance(2 * HOUR)
    assert world.ending().fire(stale).outcome is EndOutcome.IGNORED
    assert world.state("train") is S.ACTIVE


def test_a_timer_beyond_thirty_days_is_a_chain_of_hops(world_and_cloud: World_) -> None:
    world, _ = world_and_cloud
    # A TPU block: Google's calendar mode takes them up to 120 days ahead (GPU VMs: 60).
    submit(world.store, calendar("far", tenant="vision", vm_count=1, days=2, topology="2x2",
                                 start_at=NOW + 70 * DAY,
                                 locations=(TPU_BLOCK_ZONE,)))  # fmt: skip
    world.run()
    world.clock.advance(2 * MINUTE)  # Google's review
    world.run()
    assert world.timers is not None
    [(first, at)] = world.timers.armed()
    assert (first.kind, first.hop, at) == (TimerKind.START, 0, NOW + 2 * MINUTE + 29 * DAY)
    hops = 0
    while world.clock.now() < NOW + 70 * DAY:
        world.clock.advance(DAY)
        for result in world.fire_due():
            hops += result.outcome is EndOutcome.REARMED
    assert hops == 2  # at +29 d and +58 d; the third task fires at the start itself
    assert world.nudger.reasons == ["block far starts"]


def test_a_lost_timer_is_caught_by_the_sweep(world_and_cloud: World_) -> None:
    """(A TPU slice: flex-start VMs would be ended by the cloud itself.)"""
    world, cloud = world_and_cloud
    submit(world.store, flex("train", tenant="vision", vm_count=1, hours=1, topology="2x2",
                             locations=(ZONE,)))  # fmt: skip
    activate(world, "train")
    assert world.timers is not None
    [(timer, _)] = world.timers.armed()
    world.timers.disarm(timer)  # deleted behind the system's back
    world.clock.advance(HOUR + 2 * MINUTE)
    assert world.fire_due() == []
    world.run()
    assert world.state("train") is S.EXPIRED
    assert "no timer ended it" in world.store.events("train")[-1].message
    assert cloud.stock(ZONE, V5E) == 16


def test_usage_matches_the_scripted_intervals_to_the_second(world_and_cloud: World_) -> None:
    world, _ = world_and_cloud
    submit(world.store, flex("a", tenant="vision", vm_count=2, hours=6))  # 16 H100
    submit(world.store, flex("b", tenant="speech", vm_count=1, hours=3))  # 8 H100
    submit(world.store, flex("gone", tenant="speech", vm_count=1, hours=1,
                             submitted_at=NOW + MINUTE))  # fmt: skip
    world.run()  # a, b and gone (2 + 1 + 1 VMs) are admitted at NOW
    world.ending().cancel("gone", "speech")
    world.clock.advance(LATENCY)
    world.run()  # a and b ACTIVE at NOW + 20 s
    world.clock.advance(timedelta(hours=1, minutes=30, seconds=7))
    world.ending().release("a", "vision")  # used 1:30:07
    world.clock.advance(timedelta(hours=1, minutes=29, seconds=53))
    world.fire_due()  # b's timer at 3 h after it started
    assert world.state("b") is S.EXPIRED
    rows = {(r.tenant, r.accelerator): r for r in UsageService(world.store).summary()}
    vision, speech = rows[("vision", H100)], rows[("speech", H100)]
    assert vision.used_hours == pytest.approx(16 * (5407 / 3600), abs=1e-9)
    assert vision.granted_hours == 16 * 6
    assert vision.cost == pytest.approx(16 * 5407 / 3600 * 10.0 * 0.5)
    assert speech.used_hours == pytest.approx(8 * 3, abs=1e-9)
    assert speech.granted_hours == 8 * 3
    assert (vision.outcomes, speech.outcomes) == ({"RELEASED": 1}, {"EXPIRED": 1, "CANCELLED": 1})
    [entry] = world.store.usage("vision")
    assert entry.started_at == NOW + LATENCY
    assert entry.ended_at == NOW + LATENCY + timedelta(hours=1, minutes=30, seconds=7)


def test_a_cancel_racing_a_pass_leaves_that_request_to_the_next_pass(
    world_and_cloud: World_,
) -> None:
    world, _ = world_and_cloud
    submit(world.store, flex("raced", tenant="vision", vm_count=1, hours=1))
    submit(world.store, flex("other", tenant="speech", vm_count=1, hours=2,
                             submitted_at=NOW + MINUTE))  # fmt: skip
    store = world.store
    ending = world.ending()

    class Racing:
        """Cancels "raced" just before the reconciler's write to it lands."""

        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

        def change(self, request_id: str, *args: object, **kwargs: object) -> object:
            if request_id == "raced" and store.get("raced").state is S.PENDING:  # type: ignore[union-attr]
                ending.cancel("raced", "vision")
            return store.change(request_id, *args, **kwargs)  # type: ignore[arg-type]

    world.store = Racing()  # type: ignore[assignment]
    report = world.run()
    assert report.skipped == ["raced"]
    assert not report.stale
    assert (store.get("raced").state, store.get("other").state) == (  # type: ignore[union-attr]
        S.CANCELLED, S.PROVISIONING,
    )  # fmt: skip
