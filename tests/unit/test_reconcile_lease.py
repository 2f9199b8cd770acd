"""The reconciler lease on in-memory fakes: a pass gives it up however it ends — completed,
stopped on a stale view, or raising on a transient fault (of the store or a provider) — so the
pass right after runs at once instead of waiting out the lease's TTL; only a pass that was
fenced (another reconciler took the lease over) leaves it alone, as the other's."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from google.api_core.exceptions import ServiceUnavailable

from opendws.adapters.memory import MemoryCapacityProvider
from opendws.domain.states import RequestState
from opendws.ports import Change, Providers, StaleWrite, StatusEvent
from tests.builders import A3, H100, NOW, flex, pool
from tests.world import World, memory_world, submit, tenants_for

S = RequestState
ZONE = "us-central1-a"


class FailsOnce:
    """Wraps a store or a provider: the first call of ``method`` raises ``error``; every other
    call, and every later one, goes through."""

    def __init__(self, inner: Any, method: str, error: Exception) -> None:
        self._inner = inner
        self._method = method
        self._error: Exception | None = error

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name != self._method:
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            error, self._error = self._error, None
            if error is not None:
                raise error
            return attribute(*args, **kwargs)

        return call


def one_zone() -> tuple[World, MemoryCapacityProvider]:
    world, cloud = memory_world([pool(zone=ZONE, capacity=4)], tenants_for(H100))
    cloud.set_stock(ZONE, A3, 4)
    submit(world.store, flex("r1", locations=(ZONE,)))
    return world, cloud


# Where a transient fault strikes: a store read before the pass's cycle starts (building it
# reads the pools' shortages), the providers' look (Compute Engine), a write mid-pass.
FAULTS = {
    "store read as the pass starts": ("store", "pool_shortages"),
    "the providers' look": ("provider", "observe"),
    "a write mid-pass": ("store", "change"),
}


@pytest.mark.parametrize("where", sorted(FAULTS))
def test_the_pass_right_after_a_transient_fault_runs(where: str) -> None:
    world, cloud = one_zone()
    part, method = FAULTS[where]
    fault = ServiceUnavailable(f"{where}: try again")
    if part == "store":
        world.store = FailsOnce(world.store, method, fault)
    else:
        flaky: Any = FailsOnce(cloud, method, fault)
        world.providers = Providers(mig_flex=flaky, tpu=flaky, calendar=flaky)
    reconciler = world.reconciler()
    with pytest.raises(ServiceUnavailable):
        reconciler.run_pass()
    report = reconciler.run_pass()  # the next tick, at once: no wait for the lease's TTL
    assert report.ran
    assert world.state("r1") is S.PROVISIONING
    # Another instance after that one finds the lease free too.
    assert world.reconciler("reconciler-2").run_pass().ran


def test_an_event_whose_cursor_loses_to_another_writer_is_published_by_the_next_pass() -> None:
    """Moving the outbox cursor after publishing an event an earlier pass left behind loses
    to another writer (Firestore answers a contended transaction so). Events are published off
    the pass's thread (service.ordered), so the pass goes on and reports it; the next pass,
    which finds the record still in the outbox, publishes what is left."""
    world, _ = one_zone()
    record = world.record("r1")
    news = StatusEvent(
        request_id="r1", tenant="t", state=S.PENDING, previous_state=S.PENDING, at=NOW,
        message="an ETA an earlier pass stored but did not publish",
    )  # fmt: skip
    world.store.change("r1", Change(expected_version=record.version, state=S.PENDING, event=news))
    world.store = FailsOnce(world.store, "mark_announced", StaleWrite("contention"))
    report = world.run()
    assert report.ran
    assert not report.stale
    assert any("announce r1: contention" in error for error in report.errors)
    after = world.reconciler("reconciler-2").run_pass()
    assert after.ran
    assert world.record("r1").announced == world.record("r1").events


def test_a_fault_while_giving_the_lease_up_leaves_the_pass_s_own_error_to_be_seen(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world, _ = one_zone()
    store: Any = FailsOnce(world.store, "pool_shortages", ServiceUnavailable("shortages"))
    store = FailsOnce(store, "release_lease", ServiceUnavailable("lease"))
    world.store = store
    with pytest.raises(ServiceUnavailable, match="shortages"):
        world.run()
    [warning] = [r for r in caplog.records if "lease not given up" in r.getMessage()]
    assert warning.levelname == "WARNING"


def test_a_fenced_pass_leaves_the_lease_to_the_reconciler_that_took_it() -> None:
    world, _ = one_zone()
    store = world.store

    class Thief:
        """Takes the lease over at the pass's first write."""

        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

        def change(self, *args: object, **kwargs: object) -> object:
            store.acquire_lease("thief", world.clock.now() + timedelta(hours=1), timedelta(hours=1))
            return store.change(*args, **kwargs)  # type: ignore[arg-type]

    world.store = Thief()  # type: ignore[assignment]
    assert world.run().fenced
    world.store = store
    assert not world.reconciler("reconciler-2").run_pass().ran  # the thief's lease holds
