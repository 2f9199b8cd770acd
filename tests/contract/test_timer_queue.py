"""The TimerQueue contract, on the in-memory fake and on Cloud Tasks (the real
google-cloud-tasks client over the project's Cloud Tasks emulator): arming is idempotent by
name, disarming deletes, a used name is never armed again, a far timer is armed as its first
hop."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from opendws.adapters.memory import MemoryTimerQueue
from opendws.ports import TIMER_HORIZON, Timer, TimerKind, TimerQueue

_ids = itertools.count()
NOW = datetime.now(UTC).replace(microsecond=0)


@dataclass
class Kit:
    queue: TimerQueue
    armed: Callable[[], dict[str, datetime]]  # task name → schedule time


@pytest.fixture(params=["memory", "cloud_tasks"])
def kit(request: pytest.FixtureRequest) -> Iterator[Kit]:
    if request.param == "memory":
        memory = MemoryTimerQueue()
        yield Kit(memory, lambda: {t.name: at for t, at in memory.armed()})
        return
    from emulators import CloudTasksEmulator
    from opendws.adapters.cloud_tasks import CloudTasksTimerQueue, TimerSettings

    with CloudTasksEmulator() as emulator:
        client = emulator.client()
        settings = TimerSettings(
            project=f"timers-{next(_ids)}", location="us-central1", queue="opendws-timers",
            url="http://127.0.0.1:9/timer", service_account="timers@example.com",
        )  # fmt: skip
        queue = CloudTasksTimerQueue(client, settings)
        queue.ensure_queue()
        queue.ensure_queue()  # safe to repeat

        def armed() -> dict[str, datetime]:
            tasks = client.list_tasks(parent=settings.queue_path)
            return {t.name.rsplit("/", 1)[-1]: t.schedule_time for t in tasks}

        yield Kit(queue, armed)


def timer(hours: float = 1, kind: TimerKind = TimerKind.RELEASE) -> Timer:
    return Timer(
        request_id=f"train/{next(_ids)}", kind=kind, generation=1,
        fire_at=NOW + timedelta(hours=hours),
    )  # fmt: skip


def test_an_armed_timer_is_one_task_at_its_time(kit: Kit) -> None:
    first = timer()
    kit.queue.arm(first, NOW)
    kit.queue.arm(first, NOW)  # a retried creation
    assert kit.armed() == {first.name: first.fire_at}


def test_a_disarmed_timer_is_gone_and_its_name_is_not_reused(kit: Kit) -> None:
    first, second = timer(), timer(2)
    kit.queue.arm(first, NOW)
    kit.queue.arm(second, NOW)
    kit.queue.disarm(first)
    kit.queue.disarm(first)  # already gone
    assert set(kit.armed()) == {second.name}
    kit.queue.arm(first, NOW)  # the name was used: nothing is armed again
    assert set(kit.armed()) == {second.name}


def test_a_timer_beyond_the_horizon_is_armed_as_its_first_hop(kit: Kit) -> None:
    far = timer(hours=24 * 60, kind=TimerKind.START)
    kit.queue.arm(far, NOW)
    assert kit.armed() == {far.name: NOW + TIMER_HORIZON}
