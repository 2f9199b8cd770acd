"""The planner places a flex run with its pool's serve wait (Pool.serve_wait): Google serves an
admitted order only "as soon as resources are available"
(cloud.google.com/compute/docs/instance-groups/about-resize-requests-mig), so the capacity is
held from admission through that wait and then the run. Starts (ETAs) are admissions; the slot's
end, and so every start behind it, includes the wait."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from opendws.domain import Outcome, Snapshot, admit
from opendws.domain.model import CapacityRequest, Grant, InvalidModel, Pool
from opendws.domain.planner.incremental.planner import IncrementalPlanner
from tests.builders import A3, H100, HOUR, MINUTE, NOW, ZONE, flex, grant, pool, quota, tenant
from tests.builders import snapshot as build_snapshot

WAIT = 20 * MINUTE
ZONE_B = "us-central1-b"


def _snapshot(
    *pools: Pool, pending: Sequence[CapacityRequest], grants: Sequence[Grant] = ()
) -> Snapshot:
    return build_snapshot(
        pools=pools, tenants=[tenant("t", quota(H100, 1024))], pending=pending, grants=grants
    )


def test_a_run_holds_its_pools_serve_wait_and_what_waits_behind_it_starts_after() -> None:
    """a (the whole pool) is admitted now and holds now + 20 min + 1 h; b, the whole pool too,
    is held from there, not from now + 1 h."""
    snapshot = _snapshot(
        replace(pool(capacity=4), serve_wait=WAIT),
        pending=[flex("a", vm_count=4, hours=1), flex("b", vm_count=4, hours=1)],
    )
    plan = admit(snapshot, NOW)
    a, b = plan.decision("a"), plan.decision("b")
    assert (a.outcome, a.start_at, a.end_at) == (Outcome.ADMIT, NOW, NOW + WAIT + HOUR)
    assert (b.outcome, b.start_at, b.end_at) == (
        Outcome.HOLD, NOW + WAIT + HOUR, NOW + 2 * (WAIT + HOUR),
    )  # fmt: skip
    assert IncrementalPlanner().plan(snapshot, NOW) == plan


def test_a_gap_shorter_than_wait_and_run_is_not_backfilled() -> None:
    """A grant leaves the pool free for 1 h 10 min from now: a one-hour run fits without a
    serve wait, but not with 20 minutes of Google's queue before it."""
    busy = grant("g", units=4, start_at=NOW + 70 * MINUTE, hours=5)
    short = flex("short", vm_count=4, hours=1)
    free = admit(_snapshot(pool(capacity=4), pending=[short], grants=[busy]), NOW)
    assert free.decision("short").outcome is Outcome.ADMIT
    waiting = admit(
        _snapshot(replace(pool(capacity=4), serve_wait=WAIT), pending=[short], grants=[busy]),
        NOW,
    )
    assert waiting.decision("short").start_at == NOW + 70 * MINUTE + 5 * HOUR


def test_a_request_that_may_use_several_pools_holds_the_longest_wait() -> None:
    """Exact for one pool, never short for several: the slot's end uses the largest wait of
    the pools that serve it, wherever it lands."""
    near = replace(pool(capacity=4), serve_wait=5 * MINUTE)
    far = replace(pool(zone=ZONE_B, capacity=4), serve_wait=WAIT)
    request = flex("r", vm_count=1, hours=1, locations=(ZONE, ZONE_B))
    decision = admit(_snapshot(near, far, pending=[request]), NOW).decision("r")
    assert decision.pool_id == f"{ZONE}/{A3}"
    assert decision.end_at == NOW + WAIT + HOUR


def test_a_negative_serve_wait_is_refused() -> None:
    with pytest.raises(InvalidModel, match="serve_wait"):
        replace(pool(), serve_wait=-MINUTE)
