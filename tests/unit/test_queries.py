"""Queue and timeline views over what a reconcile pass left in the store."""

from __future__ import annotations

from datetime import timedelta

from opendws.service.queries import QueryService
from tests.builders import A3, DAY, H100, HOUR, MINUTE, NOW, calendar, flex, pool
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
    queries = QueryService(world.store, world.store)
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
