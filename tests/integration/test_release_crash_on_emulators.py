"""Crash safety of every release path on the real adapters: the release dies right after any
write (Firestore), any provider call, any Compute Engine call inside the provider (over the
emulator of the simulated cloud), any event published or timer deleted — then the caller
retries where a client (or Cloud Tasks) would, a fresh reconciler runs a few passes, and the
run converges: the request in its expected final state, nothing left running (or waiting at
Google) that no live request owns, nothing owned left over at all, every zone's stock back,
no resize request created twice, every event published.

The paths: a user release of an ACTIVE run and the release timer (``EndService``), a cancel of
a request waiting at Google in two zones, the sweep's own release when the run time is up and
no timer ended it, a race won (the losing lane cancelled) or won twice (the extra gang
deleted), and the leak sweep — among its leaks the one a held-out crash probe found: a release
killed after the resize request was deleted and before its VMs, which left them running.

Google's behaviour relied on throughout (googleapis ``google/cloud/compute/v1/compute.proto``,
``service InstanceGroupManagerResizeRequests``): "Cancel is only possible for requests that are
accepted in the queue"; delete takes only an inactive request ("Requests that are still active
cannot be deleted") and "Deleting request does not delete instances that were provisioned
previously" — Terraform's delete cancels an ACCEPTED request, waits for the cancel, then
deletes (GoogleCloudPlatform/magic-modules
``mmv1/templates/terraform/custom_delete/compute_mig_resize_request_delete.go.tmpl``). So a
release deletes the VMs first, then cancels (if still queued) and deletes the request: every
prefix leaves something the next observation sees by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from opendws.adapters.memory import MemoryTimerQueue
from opendws.adapters.mig import group_name
from opendws.domain.model import PolicySettings, Pool
from opendws.domain.states import RequestState
from opendws.ports import Order, Providers, Timer, order_name
from opendws.service.release import EndOutcome, EndService
from tests.builders import A3, MINUTE, flex
from tests.crashing import (
    BUS_CALLS,
    PROVIDER_CALLS,
    STORE_WRITES,
    TIMER_CALLS,
    Crash,
    Crashing,
    Steps,
    crash_inside,
)
from tests.integration.conftest import LATENCY, POOL_A, POOL_B, ZONE_A, ZONE_B, Stack
from tests.world import submit

S = RequestState
TICK = 5 * MINUTE
PASSES = 2  # passes of a fresh reconciler after the release: enough to finish any crashed one
# Google deletes flex-start VMs at the end of their run duration, counted from when they were
# made; opendws counts from when a pass saw them running, a little later. Where the release
# under test runs at the run's end, the cloud's clock is held this far short of it, so the VMs
# still run and the release (or the sweep after a crash) must delete them itself.
SHORT_OF_THE_END = 2 * MINUTE


@dataclass
class Scenario:
    """A release path set up (without crashes) and ready to run: ``act`` is the release,
    ``retry`` what a client or Cloud Tasks does when it failed (None: the next passes retry);
    then the expected end."""

    act: Callable[[], object]
    retry: Callable[[], object] | None
    final: dict[str, RequestState]
    stock: tuple[int, int]  # free A3 VMs in zones A and B at the end
    cloud_moves: bool = True  # False: the cloud's clock stays put while the passes run


def pools(stack: Stack) -> dict[str, Pool]:
    return {pool.pool_id: pool for pool in stack.world.config.load().pools}


def race_eagerly(stack: Stack) -> None:
    configuration = stack.world.config.load()
    stack.world.config.save(replace(configuration, policy=PolicySettings(race_eagerly=True)))


def active(stack: Stack, request_id: str, *, timers: bool = False) -> None:
    """``request_id`` (2 VMs, an hour, zone A) admitted and running."""
    world = stack.world
    if timers:
        world.timers = MemoryTimerQueue()
    submit(world.store, flex(request_id, vm_count=2, hours=1, locations=(ZONE_A,)))
    world.run("setup")
    stack.advance(LATENCY)
    world.run("setup")
    assert world.state(request_id) is S.ACTIVE


def user_release(stack: Stack) -> Scenario:
    active(stack, "run", timers=True)
    return Scenario(
        act=lambda: stack.world.ending().release("run", "t"),
        retry=lambda: stack.world.ending().release("run", "t"),
        final={"run": S.RELEASED},
        stock=(4, 4),
    )


def release_timer(stack: Stack) -> Scenario:
    world = stack.world
    active(stack, "run", timers=True)
    assert world.timers is not None
    [(timer, due)] = world.timers.armed()
    # The task is due; Google has not deleted the VMs yet.
    world.clock.advance(due - world.clock.now())
    stack.cloud.advance(due - SHORT_OF_THE_END - stack.cloud.clock.now())
    [taken] = world.timers.take_due(world.clock.now())

    def fire(timer: Timer = taken) -> None:
        result = world.ending().fire(timer)
        assert result.outcome in (EndOutcome.ENDED, EndOutcome.IGNORED), result

    assert taken == timer
    return Scenario(act=fire, retry=fire, final={"run": S.EXPIRED}, stock=(4, 4),
                    cloud_moves=False)  # fmt: skip


def cancel_waiting(stack: Stack) -> Scenario:
    world = stack.world
    world.timers = MemoryTimerQueue()
    race_eagerly(stack)
    for zone in (ZONE_A, ZONE_B):
        stack.cloud.set_stock(zone, A3, 0)
    submit(world.store, flex("queued", vm_count=2, hours=1, locations=(ZONE_A, ZONE_B)))
    world.run("setup")
    stack.advance(LATENCY)
    world.run("setup")
    record = world.record("queued")
    assert (record.state, record.reason) == (S.PROVISIONING, "WAITING_FOR_CAPACITY")
    assert [lane.pool for lane in record.lanes] == [POOL_A, POOL_B]
    return Scenario(
        act=lambda: world.ending().cancel("queued", "t"),
        retry=lambda: world.ending().cancel("queued", "t"),
        final={"queued": S.CANCELLED},
        stock=(0, 0),
    )


def run_time_up(stack: Stack) -> Scenario:
    world = stack.world
    active(stack, "run")
    record = world.record("run")
    assert record.since is not None
    end = record.since + record.request.run_duration + world.settings.overdue_grace
    world.clock.advance(end - world.clock.now())
    stack.cloud.advance(end - 2 * SHORT_OF_THE_END - stack.cloud.clock.now())
    return Scenario(act=lambda: world.run("reconciler-0"), retry=None,
                    final={"run": S.EXPIRED}, stock=(4, 4), cloud_moves=False)  # fmt: skip


def failover(stack: Stack) -> Scenario:
    world = stack.world
    race_eagerly(stack)
    stack.cloud.set_stock(ZONE_A, A3, 0)
    submit(world.store, flex("failover", vm_count=2, hours=1, locations=(ZONE_A, ZONE_B)))
    world.run("setup")
    stack.advance(LATENCY)  # served in B; waiting with a stockout in A
    return Scenario(act=lambda: world.run("reconciler-0"), retry=None,
                    final={"failover": S.ACTIVE}, stock=(0, 2))  # fmt: skip


def double_win(stack: Stack) -> Scenario:
    world = stack.world
    race_eagerly(stack)
    submit(world.store, flex("twice", vm_count=2, hours=1, locations=(ZONE_A, ZONE_B)))
    world.run("setup")
    stack.advance(LATENCY)  # served in both zones
    return Scenario(act=lambda: world.run("reconciler-0"), retry=None,
                    final={"twice": S.ACTIVE}, stock=(2, 4))  # fmt: skip


class KilledAfterTheRequest:
    """The release order before the fix, killed midway: the resize request is deleted (which
    leaves its VMs), then the worker dies before deleting the VMs."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    def release(self, name: str, pool: Pool) -> None:
        self.stack.cloud.delete_resize_request(
            self.stack.project, pool.zone, group_name(pool), name
        )
        raise Crash(f"killed after the resize request {name} was deleted, before its VMs")


def leak_sweep(stack: Stack) -> Scenario:
    world = stack.world
    provider = world.providers.mig_flex
    active(stack, "probe")
    # The held-out crash probe: a release killed after the request was deleted, before the VMs.
    killed = EndService(
        world.store, world.config,
        Providers(mig_flex=KilledAfterTheRequest(stack),  # type: ignore[arg-type]  # release only
                  tpu=world.providers.tpu,
                  calendar=world.providers.calendar),
        None, world.bus, world.nudger, world.clock,
    )  # fmt: skip
    with pytest.raises(Crash):
        killed.release("probe", "t")
    # Orders no record wants: a gang Google served, and one queued at Google for good.
    by_id = pools(stack)
    late = Order(request=flex("late", vm_count=2), pool=by_id[POOL_B], attempt=1)
    stray = Order(request=flex("stray", vm_count=6), pool=by_id[POOL_B], attempt=1)
    provider.provision(late)
    provider.provision(stray)
    stack.advance(LATENCY)
    vms = [vm["name"] for vm in resources(stack, "instances")]
    assert sorted(vms) == sorted(
        f"{order_name(request_id, 1)}-{index}" for request_id in ("probe", "late")
        for index in range(2)
    )  # fmt: skip
    requests = {r["name"]: r["state"] for r in resources(stack, "resizeRequests")}
    assert requests == {late.name: "SUCCEEDED", stray.name: "ACCEPTED"}
    assert len(stack.left_running()) == 5  # 4 VMs and a request waiting at Google
    return Scenario(act=lambda: world.run("reconciler-0"), retry=None,
                    final={"probe": S.RELEASED}, stock=(4, 4))  # fmt: skip


PATHS: dict[str, Callable[[Stack], Scenario]] = {
    "user_release": user_release,
    "release_timer": release_timer,
    "cancel_waiting": cancel_waiting,
    "run_time_up": run_time_up,
    "failover": failover,
    "double_win": double_win,
    "leak_sweep": leak_sweep,
}
# Side effects of each uninterrupted release and the passes after it (checked below).
COUNTS = {
    "user_release": 8,
    "release_timer": 8,
    "cancel_waiting": 10,
    "run_time_up": 6,
    "failover": 8,
    "double_win": 7,
    "leak_sweep": 10,
}


def resources(stack: Stack, kind: str) -> list[dict[str, Any]]:
    state = stack.cloud.state()["resources"]
    assert isinstance(state, dict)
    listed: list[dict[str, Any]] = state.get(stack.project, {}).get(kind, [])
    return listed


def crashing(stack: Stack, steps: Steps) -> None:
    """From now on every write, provider call, Compute call, event and timer is a step."""
    world = stack.world
    crash_inside(world.providers.mig_flex, steps)
    world.providers = Providers(
        mig_flex=Crashing(world.providers.mig_flex, PROVIDER_CALLS, steps),
        tpu=world.providers.tpu,
        calendar=world.providers.calendar,
    )
    world.store = Crashing(world.store, STORE_WRITES, steps)
    # The World's bus and timers are the memory fakes; a Crashing proxy stands in for them.
    world.bus = Crashing(world.bus, BUS_CALLS, steps)  # type: ignore[assignment]
    if world.timers is not None:
        world.timers = Crashing(world.timers, TIMER_CALLS, steps)  # type: ignore[assignment]


def drive(stack: Stack, path: str, steps: Steps) -> Scenario:
    """Set ``path`` up, then release under crashes: the caller retries once if it crashed, and
    a new reconciler runs each pass after one crashed."""
    world = stack.world
    scenario = PATHS[path](stack)
    crashing(stack, steps)
    generation = 0
    try:
        scenario.act()
    except Crash:
        generation += 1
        if scenario.retry is not None:
            scenario.retry()
    for _ in range(PASSES):
        world.clock.advance(TICK)
        if scenario.cloud_moves:
            stack.cloud.advance(TICK)
        try:
            world.run(f"reconciler-{generation}")
        except Crash:
            generation += 1
    return scenario


def converged(stack: Stack, scenario: Scenario) -> None:
    world = stack.world
    states = {request_id: world.state(request_id) for request_id in scenario.final}
    assert states == scenario.final
    assert stack.left_running() == [], "left running with no live request to own it"
    live = {
        order_name(record.request_id, lane.attempt)
        for record in world.store.in_states(S.PROVISIONING, S.ACTIVE, S.BOOKED)
        for lane in record.orders
    }
    leftovers = [
        f"{kind} {entry['name']} ({entry.get('state') or entry.get('status')})"
        for kind in ("instances", "resizeRequests")
        for entry in resources(stack, kind)
        if str(entry["name"]) not in live and str(entry["name"]).rsplit("-", 1)[0] not in live
    ]
    assert leftovers == [], "owned resources left over with no live request"
    assert (stack.cloud.stock(ZONE_A, A3), stack.cloud.stock(ZONE_B, A3)) == scenario.stock
    created = stack.cloud.created("resizeRequests")
    assert all(count == 1 for count in created.values()), f"created more than once: {created}"
    published = {(e.request_id, e.state, e.reason, e.at) for e in world.bus.published}
    for request_id in scenario.final:
        record = world.record(request_id)
        assert record.announced == record.events, f"{request_id}: events left unpublished"
        for event in world.store.events(request_id)[1:]:  # the first is intake's (submit)
            assert (request_id, event.state, event.reason, event.at) in published


def crash_points(path: str) -> list[int]:
    return list(range(1, COUNTS[path] + 1))


def crashed_and_converged(stack: Stack, path: str, crash_at: int) -> None:
    steps = Steps(crash_at)
    scenario = drive(stack, path, steps)
    assert steps.crashed
    converged(stack, scenario)


@pytest.mark.parametrize("path", list(PATHS))
def test_every_step_of_each_uninterrupted_release_is_a_crash_point_below(
    stack: Stack, path: str
) -> None:
    steps = Steps()
    scenario = drive(stack, path, steps)
    converged(stack, scenario)
    assert steps.count == COUNTS[path], steps.count


@pytest.mark.parametrize("crash_at", crash_points("user_release"))
def test_a_user_release_crashed_anywhere_converges(stack: Stack, crash_at: int) -> None:
    """A tenant releases its running gang. The release deletes the VMs, then the request
    (SUCCEEDED, so inactive and deletable; deleting it alone would leave the VMs: compute.proto
    ``InstanceGroupManagerResizeRequests.Delete``). The record is written first, so a retry
    finds it ended and the reconciler releases what the crash left as a leak."""
    crashed_and_converged(stack, "user_release", crash_at)


@pytest.mark.parametrize("crash_at", crash_points("release_timer"))
def test_a_release_timer_crashed_anywhere_converges(stack: Stack, crash_at: int) -> None:
    """The run's release timer fires before Google's own deletion of the flex-start VMs at the
    end of their run duration (compute/docs/instance-groups/about-resize-requests-mig;
    ``instanceTerminationAction=DELETE``) and Cloud Tasks retries it when it failed; the VMs
    are deleted first, then the (inactive) request, which alone would leave them."""
    crashed_and_converged(stack, "release_timer", crash_at)


@pytest.mark.parametrize("crash_at", crash_points("cancel_waiting"))
def test_a_cancel_of_a_request_waiting_in_two_zones_crashed_anywhere_converges(
    stack: Stack, crash_at: int
) -> None:
    """A request raced into two zones, both short, waits ACCEPTED in each (Google keeps it
    queued: about-resize-requests-mig) and is cancelled. Each order is cancelled — possible
    only while ACCEPTED — and the cancel awaited before the delete, which takes only an
    inactive request (compute.proto ``InstanceGroupManagerResizeRequests.Cancel``/``Delete``;
    magic-modules ``compute_mig_resize_request_delete.go.tmpl``). A crash between the two
    leaves a CANCELLED request, which the leak sweep deletes."""
    crashed_and_converged(stack, "cancel_waiting", crash_at)


@pytest.mark.parametrize("crash_at", crash_points("run_time_up"))
def test_the_sweeps_release_at_the_end_of_the_run_crashed_anywhere_converges(
    stack: Stack, crash_at: int
) -> None:
    """No timer ended the run: the sweep ends it once its end is past by the grace, before
    Google's own deletion of the VMs at the end of their run duration
    (about-resize-requests-mig). It writes EXPIRED, then deletes the VMs and the request
    (deleting the request alone leaves its VMs: compute.proto
    ``InstanceGroupManagerResizeRequests.Delete``)."""
    crashed_and_converged(stack, "run_time_up", crash_at)


@pytest.mark.parametrize("crash_at", crash_points("failover"))
def test_a_race_won_in_the_second_zone_crashed_anywhere_converges(
    stack: Stack, crash_at: int
) -> None:
    """Raced into zones A (no stock: the order waits ACCEPTED with a stockout in its last
    attempt) and B (served). The pass that sees B running keeps it and cancels A — only an
    ACCEPTED request can be cancelled, and only once cancelled can it be deleted
    (compute.proto ``InstanceGroupManagerResizeRequests``); a crash leaves A's order to the
    leak sweep, never a second gang."""
    crashed_and_converged(stack, "failover", crash_at)


@pytest.mark.parametrize("crash_at", crash_points("double_win"))
def test_a_race_won_twice_crashed_anywhere_converges(stack: Stack, crash_at: int) -> None:
    """Raced into two zones that both serve the gang: the preferred zone's is kept and the
    other's VMs are deleted, then its request (SUCCEEDED: inactive, deletable; deleting it
    alone would leave the VMs running — compute.proto
    ``InstanceGroupManagerResizeRequests.Delete``)."""
    crashed_and_converged(stack, "double_win", crash_at)


@pytest.mark.parametrize("crash_at", crash_points("leak_sweep"))
def test_the_leak_sweep_crashed_anywhere_converges(stack: Stack, crash_at: int) -> None:
    """Three owned orders no live request wants: the held-out probe's — a release killed after
    the resize request was deleted and before its VMs, which Google leaves running ("Deleting
    request does not delete instances that were provisioned previously": compute.proto
    ``InstanceGroupManagerResizeRequests.Delete``), so they are observed by name without their
    request — a gang Google served, and a request queued at Google (cancelled, which only an
    ACCEPTED one can be, then deleted). Each is released whatever is left of it."""
    crashed_and_converged(stack, "leak_sweep", crash_at)
