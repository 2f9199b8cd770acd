"""The pool of a pass's cloud calls (opendws.service.cloud_calls): calls in flight bounded,
chains in order, a per-minute budget, a pause when the cloud's rate quota is spent, and a pass
that gathers by its deadline.

Compute Engine enforces its rate quotas per project per minute and answers a call over one with
403 ``rateLimitExceeded``; the quota refills at the start of the next interval
(https://cloud.google.com/compute/api-quota)."""

from __future__ import annotations

import functools
import threading
import time
from datetime import timedelta

import pytest

from opendws.ports import CloudRateLimited
from opendws.service.cloud_calls import Call, CallLimits, CloudCalls, OutOfTime

pytestmark = pytest.mark.unit


class FakeTime:
    """A monotonic clock that moves only when someone sleeps on it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.slept.append(seconds)
            self.now += seconds


def test_calls_run_at_most_in_flight_at_once_and_each_chain_in_its_order() -> None:
    calls = CloudCalls(CallLimits(in_flight=3, per_minute=None))
    lock = threading.Lock()
    running, most = 0, 0
    done: list[tuple[int, int]] = []

    def work(chain: int, step: int) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.01)
        with lock:
            running -= 1
            done.append((chain, step))

    batch = calls.batch(time.monotonic() + 30)
    for chain in range(10):
        batch.submit(
            [Call((chain, step), functools.partial(work, chain, step)) for step in range(3)]
        )
    outcomes = batch.gather()
    assert [o.label for o in outcomes] == [(c, s) for c in range(10) for s in range(3)]
    assert all(o.error is None for o in outcomes)
    assert most == 3
    for chain in range(10):
        assert [s for c, s in done if c == chain] == [0, 1, 2]


def test_the_budget_holds_calls_to_per_minute_in_any_sixty_seconds() -> None:
    clock = FakeTime()
    calls = CloudCalls(CallLimits(in_flight=1, per_minute=3), now=clock, sleep=clock.sleep)
    started: list[float] = []
    batch = calls.batch(clock.now + 600)
    for index in range(7):
        batch.submit([Call(index, lambda: started.append(clock()))])
    assert all(o.error is None for o in batch.gather())
    assert started == [1000.0, 1000.0, 1000.0, 1060.0, 1060.0, 1060.0, 1120.0]


def test_a_rate_limited_call_pauses_the_pool_and_is_made_again_after_retry_after() -> None:
    clock = FakeTime()
    calls = CloudCalls(CallLimits(in_flight=1, per_minute=None), now=clock, sleep=clock.sleep)
    tries: list[float] = []

    def refused_once() -> None:
        tries.append(clock())
        if len(tries) == 1:
            raise CloudRateLimited("Rate Limit Exceeded", retry_after=timedelta(seconds=7))

    later: list[float] = []
    batch = calls.batch(clock.now + 600)
    batch.submit([Call("first", refused_once)])
    batch.submit([Call("second", lambda: later.append(clock()))])
    outcomes = batch.gather()
    assert [o.error for o in outcomes] == [None, None]
    assert tries == [1000.0, 1007.0]
    assert later == [1007.0]  # the pause held the other call too


def test_without_retry_after_the_pause_lasts_until_the_next_minute_at_most() -> None:
    clock = FakeTime()
    calls = CloudCalls(CallLimits(in_flight=1, per_minute=None), now=clock, sleep=clock.sleep)
    tries: list[float] = []

    def refused_once() -> None:
        tries.append(clock())
        if len(tries) == 1:
            raise CloudRateLimited("rateLimitExceeded")

    batch = calls.batch(clock.now + 600)
    batch.submit([Call("call", refused_once)])
    assert [o.error for o in batch.gather()] == [None]
    assert 0 < tries[1] - tries[0] <= 60


def test_a_call_that_cannot_start_before_the_deadline_is_not_made_nor_the_rest_of_its_chain() -> (
    None
):
    clock = FakeTime()
    calls = CloudCalls(CallLimits(in_flight=1, per_minute=1), now=clock, sleep=clock.sleep)
    made: list[str] = []
    batch = calls.batch(clock.now + 30)
    batch.submit([Call("a", lambda: made.append("a")), Call("b", lambda: made.append("b")),
                  Call("c", lambda: made.append("c"))])  # fmt: skip
    outcomes = batch.gather()
    assert made == ["a"]
    assert outcomes[0].error is None
    assert [type(o.error) for o in outcomes[1:]] == [OutOfTime, OutOfTime]


def test_a_failure_is_reported_and_the_other_chains_go_on() -> None:
    calls = CloudCalls(CallLimits(in_flight=2, per_minute=None))

    def broken() -> None:
        raise RuntimeError("400 Bad Request")

    batch = calls.batch(time.monotonic() + 30)
    batch.submit([Call("bad", broken), Call("after-bad", lambda: None)])
    batch.submit([Call("good", lambda: None)])
    outcomes = {o.label: o.error for o in batch.gather()}
    assert isinstance(outcomes["bad"], RuntimeError)
    assert outcomes["after-bad"] is None  # a failure is no reason to skip the chain's next call
    assert outcomes["good"] is None


def test_gather_returns_by_the_deadline_reporting_what_was_not_done() -> None:
    calls = CloudCalls(CallLimits(in_flight=1, per_minute=None))
    release = threading.Event()
    batch = calls.batch(time.monotonic() + 0.2)
    batch.submit([Call("slow", lambda: release.wait(5))])
    made: list[str] = []
    batch.submit([Call("queued", lambda: made.append("queued"))])
    started = time.monotonic()
    outcomes = batch.gather()
    assert time.monotonic() - started < 1.0
    assert [(o.label, type(o.error)) for o in outcomes] == [
        ("slow", OutOfTime), ("queued", OutOfTime),
    ]  # fmt: skip
    release.set()
    time.sleep(0.05)
    assert made == []  # cancelled before it started: never made


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="at least one"):
        CallLimits(in_flight=0)
    with pytest.raises(ValueError, match="positive"):
        CallLimits(per_minute=0)
