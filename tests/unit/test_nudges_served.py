"""A nudge that a pass has already served costs one read of the lease: no transaction, no
write, no pass (``nudge_served``, the ``reconcile`` function's ``already_served``).

Firestore sustains about one write a second to one document
(https://cloud.google.com/firestore/docs/best-practices, "Hotspots";
https://cloud.google.com/firestore/quotas); a burst of nudges must not each write the lease.
A message's ``publishTime`` is "populated by the server when it receives the Publish call"
(https://cloud.google.com/pubsub/docs/reference/rest/v1/PubsubMessage), after the publisher
stored the change it announces."""

from __future__ import annotations

import contextlib
import copy
import json
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from opendws import bootstrap
from opendws.adapters.memory import (
    MemoryConfigStore,
    MemoryEventBus,
    MemoryNudger,
    MemoryRequestPublisher,
    MemoryRequestStore,
)
from opendws.clock import ManualClock
from opendws.ports import LEASE_FREE, Configuration, Fence
from opendws.ports.records import CLOCK_MARGIN, LeaseView, nudge_served
from tests.builders import NOW

ROOT = Path(__file__).resolve().parents[2]
ENVELOPE = json.loads((ROOT / "tests" / "data" / "pubsub_message_published.json").read_text())
TTL = timedelta(minutes=2)
SECOND = timedelta(seconds=1)
BURST = 500


def held(*, started_at: datetime | None, again: bool = False) -> LeaseView:
    fence = Fence(holder="r#1", token=1, expires_at=NOW + TTL)
    return LeaseView(fence=fence, again=again, started_at=started_at)


def given_up(*, served_from: datetime | None) -> LeaseView:
    fence = Fence(holder="r#1", token=1, expires_at=LEASE_FREE)
    return LeaseView(fence=fence, started_at=served_from, served_from=served_from)


@pytest.mark.parametrize(
    ("view", "published", "served"),
    [
        # Never taken: a pass of its own.
        (LeaseView(fence=None), NOW - timedelta(hours=1), False),
        # Held by a pass that started after the publish, or before it: its holder is asked
        # (the pass has not ended yet).
        (held(started_at=NOW), NOW - timedelta(hours=1), False),
        (held(started_at=NOW), NOW + SECOND, False),
        # Held, its holder already owes one more pass (that pass starts after this read).
        (held(started_at=NOW - timedelta(hours=1), again=True), NOW, True),
        # Given up by a pass that read the requests after the publish.
        (given_up(served_from=NOW), NOW - CLOCK_MARGIN - SECOND, True),
        (given_up(served_from=NOW), NOW - CLOCK_MARGIN, False),
        # Given up by a pass that failed before it read them (served_from unset).
        (given_up(served_from=None), NOW - timedelta(hours=1), False),
        # Expired without being given up: its holder may have died before reading anything,
        # so neither its start nor an ask it owes serves the nudge.
        (
            LeaseView(
                fence=Fence(holder="r#1", token=1, expires_at=NOW - SECOND),
                again=True,
                started_at=NOW - TTL,
                served_from=NOW - TTL,
            ),
            NOW - timedelta(hours=1),
            False,
        ),
    ],
)
def test_a_nudge_is_served_only_by_a_pass_that_took_the_lease_after_it(
    view: LeaseView, published: datetime, served: bool
) -> None:
    assert nudge_served(view, published, NOW) is served


class CountingStore(MemoryRequestStore):
    """The memory store, counting what the lease costs on Firestore: a transaction per
    acquire or release, a write when it changes the lease, a read per lease view. With
    ``judging`` off, every view says the lease was never taken: the function before it judged
    nudges (every nudge asks for a pass). ``served``: what every release says, whatever its
    caller says: whether the pass read the requests and carried out its whole plan (as
    ``ReconcileService.run_pass`` says when it completes), or not (a pass that failed)."""

    def __init__(self, *, judging: bool, served: bool) -> None:
        super().__init__()
        self.judging = judging
        self.served = served
        self.cost: Counter[str] = Counter()

    def acquire_lease(
        self, holder: str, now: datetime, ttl: timedelta, *, ask_again: bool = False
    ) -> Fence | None:
        before = super().lease_view()
        granted = super().acquire_lease(holder, now, ttl, ask_again=ask_again)
        self._count(before, passes=granted is not None and granted.holder != before_holder(before))
        return granted

    def release_lease(self, fence: Fence, *, served: bool = False) -> bool:
        before = super().lease_view()
        del served  # replaced by the store's own (see the class docstring)
        again = super().release_lease(fence, served=self.served)
        self._count(before)
        return again

    def lease_view(self) -> LeaseView:
        self.cost["reads"] += 1
        return super().lease_view() if self.judging else LeaseView(fence=None)

    def _count(self, before: LeaseView, *, passes: bool = False) -> None:
        self.cost["transactions"] += 1
        self.cost["writes"] += super().lease_view() != before
        self.cost["passes"] += passes


def before_holder(view: LeaseView) -> str | None:
    return None if view.fence is None else view.fence.holder


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


@contextlib.contextmanager
def function(store: CountingStore, clock: ManualClock) -> Iterator[Any]:
    """The ``reconcile`` function (functions-framework's test client) on ``store``."""
    from functions_framework import create_app

    adapters = bootstrap.Adapters(
        store=store, config=MemoryConfigStore(Configuration()), events=MemoryEventBus(),
        nudger=MemoryNudger(), publisher=MemoryRequestPublisher(), clock=clock,
    )  # fmt: skip
    # No pools: a pass calls no provider (the endpoint is never reached).
    settings = bootstrap.Settings(
        project="demo-opendws", metrics_export=(), compute_endpoint="http://127.0.0.1:9",
        on_emulators=True,
    )  # fmt: skip
    previous = bootstrap.use(bootstrap.Container(settings, adapters=adapters))
    try:
        yield create_app(
            "reconcile", str(ROOT / "functions" / "main.py"), "cloudevent"
        ).test_client()
    finally:
        bootstrap.use(previous)


def nudge(client: Any, number: int, published: datetime) -> None:
    envelope = copy.deepcopy(ENVELOPE)
    envelope["source"] = "//pubsub.googleapis.com/projects/demo-opendws/topics/reconcile-ticks"
    envelope["id"] = envelope["data"]["message"]["messageId"] = f"nudge-{number}"
    envelope["data"]["message"]["data"] = ""
    stamp = published.isoformat().replace("+00:00", "Z")
    envelope["time"] = envelope["data"]["message"]["publishTime"] = stamp
    answer = client.post(
        "/", json=envelope, headers={"Content-Type": "application/cloudevents+json"}
    )
    assert answer.status_code == 200


def burst_during_a_pass(store: CountingStore, clock: ManualClock) -> Counter[str]:
    """Another instance's pass holds the lease; a burst of nudges published after it started
    (changes it may not have seen) arrives meanwhile; then it ends and runs the one more pass
    they asked for."""
    with function(store, clock) as client:
        other = store.acquire_lease("other#1", clock.now(), TTL, ask_again=True)
        assert other is not None
        for number in range(BURST):
            nudge(client, number, NOW + timedelta(milliseconds=number))
        clock.advance(timedelta(seconds=5))
        assert store.release_lease(other) is True  # one more pass owed, once
        following = store.acquire_lease("other#2", clock.now(), TTL)
        assert following is not None
        assert store.release_lease(following) is False
    return store.cost


def burst_after_a_pass(store: CountingStore, clock: ManualClock) -> Counter[str]:
    """A burst of nudges published within half a second; a pass that started two seconds
    later has read their changes and ended; their messages arrive after it (Pub/Sub delivers
    a backlog late when the function's instances are busy)."""
    with function(store, clock) as client:
        clock.advance(timedelta(seconds=2))
        first = store.acquire_lease("other#1", clock.now(), TTL, ask_again=True)
        assert first is not None
        store.release_lease(first)
        clock.advance(timedelta(seconds=1))
        for number in range(BURST):
            nudge(client, number, NOW + timedelta(milliseconds=number))
    return store.cost


def test_a_burst_of_nudges_during_a_pass_costs_one_transaction(clock: ManualClock) -> None:
    """Before: each nudge took a transaction on the lease (one wrote the ask). Now: one read
    each; the first, which finds nothing asked yet, asks (one transaction, one write)."""
    before = burst_during_a_pass(CountingStore(judging=False, served=True), ManualClock(NOW))
    now = burst_during_a_pass(CountingStore(judging=True, served=True), clock)
    # The holder's two passes: 2 acquires and 2 releases (4 writes), plus the ask.
    assert (before["transactions"], before["writes"]) == (BURST + 4, 5)
    assert (now["transactions"], now["writes"], now["reads"]) == (1 + 4, 5, BURST)
    assert now["passes"] == before["passes"] == 2


def test_a_burst_of_nudges_after_the_pass_that_served_them_costs_no_write(
    clock: ManualClock,
) -> None:
    """Before: each late nudge found the lease free and ran a pass of its own (two writes).
    Now: one read each, once the pass that read their changes says so at its release."""
    before = burst_after_a_pass(CountingStore(judging=False, served=True), ManualClock(NOW))
    now = burst_after_a_pass(CountingStore(judging=True, served=True), clock)
    assert (before["passes"], before["writes"]) == (1 + BURST, 2 + 2 * BURST)
    assert (now["passes"], now["transactions"], now["writes"], now["reads"]) == (1, 2, 2, BURST)


def test_a_pass_that_did_not_say_it_read_the_requests_serves_no_nudge(
    clock: ManualClock,
) -> None:
    """A release without ``served`` (a pass that failed, perhaps before it read anything)
    leaves the nudges published before it to passes of their own."""
    cost = burst_after_a_pass(CountingStore(judging=True, served=False), clock)
    assert cost["passes"] == 1 + BURST
