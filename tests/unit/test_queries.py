"""Queue and timeline views over what a reconcile pass left in the store."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from opendws.service.queries import QueryService, SpanKind, span_kind
from tests.builders import (
    A3,
    A100,
    DAY,
    H100,
    HOUR,
    MINUTE,
    NOW,
    calendar,
    flex,
    pool,
    quota,
    tenant,
)
from tests.world import memory_world, submit, tenants_for

ZONE = "us-central1-a"
POOL = f"{ZONE}/{A3}"


def test_the_queue_and_the_timeline_show_what_the_pass_decided() -> None:
    world, cloud = memory_world([pool(zone=ZONE, capacity=4)], tenants_for(H100, names=("a", "b")))
    cloud.set_stock(ZONE, A3, 4)
    submit(world.store, flex("running", tenant="a", vm_count=4, hours=2))
    submit(world.store, flex("next", tenant="b", vm_count=4, hours=3, submitted_at=NOW + MINUTE))
    submit(world.store, flex("after", tenant="a", vm_count=2, hours=4,
                             submitted_at=NOW + 2 * MINUTE))  # fmt: skip
    submit(world.store, calendar("block", tenant="b", vm_count=1, days=1, start_at=NOW + 3 * DAY))
    world.run()
    world.clock.advance(timedelta(seconds=20))
    world.run()
    queries = QueryService(world.store, world.store, world.config)
    # The block waits for Google's approval in the queue, then it is booked.
    assert [e.reason for e in queries.queue(NOW) if e.request_id == "block"] == [
        "AWAITING_APPROVAL"
    ]
    world.clock.advance(2 * MINUTE)
    world.run()
    later = NOW + 10 * MINUTE
    queue = queries.queue(later)
    # Shortest first: "after" (2 VMs × 4 h) goes before "next" (4 VMs × 3 h).
    assert [(e.request_id, e.position, e.reason) for e in queue] == [
        ("after", 1, "NO_CAPACITY_UNTIL"),
        ("next", 2, "NO_CAPACITY_UNTIL"),
    ]
    # "running" started 20 s late, so the slot after it moved to the next minute: within the
    # commitment horizon a later ETA is always told.
    assert queue[0].eta == NOW + 2 * HOUR + MINUTE
    assert queue[1].waited == 9 * MINUTE
    assert [e.request_id for e in queries.queue(later, tenant="b")] == ["next"]
    [(name, spans)] = queries.timeline(later).items()
    assert name == POOL
    assert [(s.request_id, s.state, s.start, s.end) for s in spans] == [
        ("running", "ACTIVE", NOW + timedelta(seconds=20), NOW + timedelta(seconds=20) + 2 * HOUR),
        ("after", "PENDING", NOW + 2 * HOUR + MINUTE, NOW + 6 * HOUR + MINUTE),
        ("next", "PENDING", NOW + 6 * HOUR, NOW + 9 * HOUR),
        ("block", "BOOKED", NOW + 3 * DAY, NOW + 4 * DAY),
    ]
    assert queries.timeline(later, pool="elsewhere") == {}


def test_each_span_says_what_it_is_and_the_horizon_cuts_later_starts() -> None:
    """Running, provisioning, waiting in Google's queue (a stockout keeps the order queued,
    compute/docs/instance-groups/about-resize-requests-mig), a calendar block and a planned
    start, each of its kind on its pool's timeline."""
    world, cloud = memory_world([pool(zone=ZONE, capacity=4)], tenants_for(H100, names=("a",)))
    cloud.set_stock(ZONE, A3, 1)
    submit(world.store, flex("running", tenant="a", vm_count=1, hours=1))
    world.run()
    world.clock.advance(timedelta(seconds=20))
    world.run()  # "running" is up; the pool has no stock left
    submit(world.store, flex("queued", tenant="a", vm_count=3, hours=1))
    submit(world.store, flex("later", tenant="a", vm_count=4, hours=1, submitted_at=NOW + MINUTE))
    submit(world.store, calendar("block", tenant="a", vm_count=1, days=1, start_at=NOW + 3 * DAY))
    world.run()
    world.clock.advance(timedelta(seconds=20))
    world.run()  # "queued" found no stock: it waits at Google
    queries = QueryService(world.store, world.store, world.config)
    now = world.clock.now()
    [spans] = queries.timeline(now).values()
    assert {s.request_id: s.kind for s in spans} == {
        "running": SpanKind.RUNNING, "queued": SpanKind.WAITING, "later": SpanKind.PLANNED,
        "block": SpanKind.BLOCK,
    }  # fmt: skip
    [spans] = queries.timeline(now, until=now + DAY).values()
    assert "block" not in {s.request_id for s in spans}
    assert [p.capacity for p in queries.pools()] == [4]
    record = world.store.get("queued")
    assert record is not None
    assert span_kind(replace(record, reason="ADMITTED")) is SpanKind.PROVISIONING


def test_quota_in_use_counts_provisioning_and_running_requests_against_the_limits() -> None:
    """In use: the accelerators of a tenant's provisioning and running requests (a pending
    one holds nothing yet); the ceiling is the cohort's total or the tenant's own nominal +
    borrowing limit, whichever is lower (domain.quotas)."""
    tenants = (
        tenant("a", quota(H100, nominal=16, borrowing_limit=8), cohort="c"),
        tenant("b", quota(H100, nominal=32), quota(A100, nominal=8), cohort="c"),
        tenant("solo", quota(H100, nominal=8)),
    )
    world, cloud = memory_world([pool(zone=ZONE, capacity=8)], tenants)
    cloud.set_stock(ZONE, A3, 8)
    submit(world.store, flex("a-run", tenant="a", vm_count=3, hours=1))  # 24 H100s: borrows 8
    submit(world.store, flex("b-wait", tenant="b", vm_count=8, hours=1, submitted_at=NOW + MINUTE))
    world.run()
    queries = QueryService(world.store, world.store, world.config)
    rows = [(q.tenant, q.accelerator, q.in_use, q.nominal, q.borrowing_limit, q.ceiling)
            for q in queries.quota()]  # fmt: skip
    assert rows == [
        ("a", H100, 24, 16, 8, 24),
        ("b", A100, 0, 8, None, 8),
        ("b", H100, 0, 32, None, 48),
        ("solo", H100, 0, 8, None, 8),
    ]
    assert [q.tenant for q in queries.quota(tenant="b")] == ["b", "b"]
