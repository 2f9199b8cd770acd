"""Table-driven tests of the admission rules.

Each case builds a snapshot with the builders, plans it at ``NOW`` and compares a compact view
of the whole plan — ``request_id → (outcome, reason, pool, start offset from NOW)`` — so that an
unexpected decision for any request fails the case, not only the one the case is about.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest

from opendws.domain import Outcome, Plan, Reason, Snapshot, admit
from opendws.domain.planner.verdicts import Alternative
from opendws.domain.reasons import Expiry
from tests.builders import (
    A3,
    DAY,
    G2,
    H100,
    HOUR,
    L4,
    MINUTE,
    NOW,
    REGION,
    V5E,
    ZONE,
    calendar,
    flex,
    grant,
    pool,
    quota,
    tenant,
    tpu_pool,
)
from tests.builders import snapshot as build_snapshot

ZONE_B = "us-central1-b"
POOL_A = f"{ZONE}/{A3}"
POOL_B = f"{ZONE_B}/{A3}"

A = Outcome.ADMIT
H = Outcome.HOLD
W = Outcome.WAIT
C = Outcome.CONFIRM
F = Outcome.REFUSE
R = Outcome.REJECT
T = Outcome.TIME_OUT


def snapshot(**parts: object) -> Snapshot:
    """A snapshot whose default tenant ``t`` has quota to spare, so that only the cases about
    quota meet it."""
    parts.setdefault("tenants", [tenant("t", quota(H100, 1024), quota(V5E, 1024), quota(L4, 1024))])
    return build_snapshot(**parts)  # type: ignore[arg-type]


View = dict[str, tuple[Outcome, Reason | Expiry | None, str | None, timedelta | None]]


def view(plan: Plan) -> View:
    """The plan in a form a table can spell out."""
    return {
        d.request_id: (
            d.outcome,
            d.reason,
            d.pool_id,
            None if d.start_at is None else d.start_at - NOW,
        )
        for d in plan.decisions
    }


@dataclass(frozen=True)
class Case:
    name: str
    snapshot: Snapshot
    expected: View
    now: datetime = field(default=NOW)


CASES = [
    Case(
        "a gang that fits is admitted now in its pool",
        snapshot(pending=[flex("r1", vm_count=8)]),
        {"r1": (A, None, POOL_A, timedelta(0))},
    ),
    Case(
        "a gang larger than any allowed pool never fits",
        snapshot(
            pools=[pool(capacity=8), pool(zone=ZONE_B, capacity=4)],
            pending=[flex("r1", vm_count=9, locations=[REGION])],
        ),
        {"r1": (R, Reason.NEVER_FITS, None, None)},
    ),
    Case(
        "no pool of the shape in the allowed locations",
        snapshot(pending=[flex("r1", machine_type=G2), flex("r2", locations=[ZONE_B])]),
        {"r1": (R, Reason.NEVER_FITS, None, None), "r2": (R, Reason.NEVER_FITS, None, None)},
    ),
    Case(
        "a gang larger than the tenant may ever hold",
        snapshot(tenants=[tenant("t", quota(H100, 16))], pending=[flex("r1", vm_count=3)]),
        {"r1": (R, Reason.EXCEEDS_QUOTA, None, None)},
    ),
    Case(
        "an unknown tenant is rejected",
        snapshot(pending=[flex("r1", tenant="nobody")]),
        {"r1": (R, Reason.UNKNOWN_TENANT, None, None)},
    ),
    Case(
        "a flex window that already closed times out",
        snapshot(pending=[flex("r1", submitted_at=NOW - 2 * DAY, max_wait=DAY)]),
        {"r1": (T, Expiry.MAX_WAIT_PASSED, None, None)},
    ),
    Case(
        "a window that closes exactly now still admits now",
        snapshot(pending=[flex("r1", submitted_at=NOW - DAY, max_wait=DAY)]),
        {"r1": (A, None, POOL_A, timedelta(0))},
    ),
    Case(
        "busy pool: the slot is held from the end of the grant",
        snapshot(grants=[grant("g1", units=8, hours=3)], pending=[flex("r1", vm_count=2)]),
        {"r1": (H, Reason.NO_CAPACITY_UNTIL, POOL_A, 3 * HOUR)},
    ),
    Case(
        "a grant ending on an odd second delays the ETA to the next whole minute",
        snapshot(
            grants=[grant("g1", units=8, end_at=NOW + HOUR + timedelta(seconds=1))],
            pending=[flex("r1")],
        ),
        {"r1": (H, Reason.NO_CAPACITY_UNTIL, POOL_A, HOUR + MINUTE)},
    ),
    Case(
        "a request whose window closes before any slot waits without an ETA",
        snapshot(
            grants=[grant("g1", units=8, hours=30)],
            pending=[flex("r1", max_wait=DAY)],
        ),
        {"r1": (W, Reason.WINDOW_TOO_SHORT, None, None)},
    ),
    Case(
        "a request stamped in the future waits no longer than max_wait from now",
        snapshot(
            grants=[grant("g1", units=8, hours=30)],
            pending=[flex("r1", max_wait=DAY, submitted_at=NOW + 365 * DAY)],
        ),
        {"r1": (W, Reason.WINDOW_TOO_SHORT, None, None)},
    ),
    Case(
        "the earliest start wins across pools; ties go to the preferred location",
        snapshot(
            pools=[pool(capacity=8), pool(zone=ZONE_B, capacity=8)],
            grants=[grant("g1", units=8, hours=2)],
            pending=[
                flex("busy-first", locations=[ZONE, ZONE_B]),
                flex("tie", locations=[ZONE_B, ZONE], hours=0.5),
            ],
        ),
        {
            "tie": (A, None, POOL_B, timedelta(0)),
            "busy-first": (A, None, POOL_B, timedelta(0)),
        },
    ),
    Case(
        "shortest first: the smaller ask goes ahead, the larger waits for it",
        snapshot(
            pools=[pool(capacity=4)],
            pending=[
                flex("big", vm_count=4, hours=10, submitted_at=NOW - MINUTE),
                flex("small", vm_count=4, hours=1),
            ],
        ),
        {
            "small": (A, None, POOL_A, timedelta(0)),
            "big": (H, Reason.NO_CAPACITY_UNTIL, POOL_A, HOUR),
        },
    ),
    Case(
        "priority goes before size",
        snapshot(
            pools=[pool(capacity=4)],
            pending=[
                flex("big", vm_count=4, hours=10, priority=1),
                flex("small", vm_count=4, hours=1),
            ],
        ),
        {
            "big": (A, None, POOL_A, timedelta(0)),
            "small": (H, Reason.NO_CAPACITY_UNTIL, POOL_A, 10 * HOUR),
        },
    ),
    Case(
        "aging: a big request that waited five half-lives goes before a fresh small one",
        snapshot(
            pools=[pool(capacity=4)],
            pending=[
                flex(
                    "old-big", vm_count=4, hours=16, submitted_at=NOW - 120 * HOUR, max_wait=7 * DAY
                ),
                flex("new-small", vm_count=4, hours=1),
            ],
        ),
        {
            "old-big": (A, None, POOL_A, timedelta(0)),
            "new-small": (H, Reason.NO_CAPACITY_UNTIL, POOL_A, 16 * HOUR),
        },
    ),
    Case(
        "conservative backfill: a later small request fills the gap without delaying the head",
        snapshot(
            pools=[pool(capacity=4)],
            grants=[grant("g1", units=2, hours=2)],
            pending=[
                flex("head", vm_count=4, hours=1, submitted_at=NOW - HOUR),
                flex("filler", vm_count=2, hours=2, submitted_at=NOW),
                flex("too-long", vm_count=2, hours=3, submitted_at=NOW),
            ],
        ),
        {
            "head": (H, Reason.NO_CAPACITY_UNTIL, POOL_A, 2 * HOUR),
            "filler": (A, None, POOL_A, timedelta(0)),
            "too-long": (H, Reason.NO_CAPACITY_UNTIL, POOL_A, 3 * HOUR),
        },
    ),
    Case(
        "strict FIFO: a tenant's newer small request waits for its older big one",
        snapshot(
            pools=[pool(capacity=8)],
            tenants=[tenant("t", quota(H100, 64), strict_fifo=True)],
            grants=[grant("g1", units=6, hours=2)],
            pending=[
                flex("older", vm_count=4, hours=1, submitted_at=NOW - HOUR),
                flex("newer", vm_count=1, hours=1, submitted_at=NOW),
            ],
        ),
        {
            "older": (H, Reason.NO_CAPACITY_UNTIL, POOL_A, 2 * HOUR),
            "newer": (H, Reason.FIFO_BLOCKED, POOL_A, 2 * HOUR),
        },
    ),
    Case(
        "best effort: the same newer request starts at once",
        snapshot(
            pools=[pool(capacity=8)],
            grants=[grant("g1", units=6, hours=2)],
            pending=[
                flex("older", vm_count=4, hours=1, submitted_at=NOW - HOUR),
                flex("newer", vm_count=1, hours=1, submitted_at=NOW),
            ],
        ),
        {
            "older": (H, Reason.NO_CAPACITY_UNTIL, POOL_A, 2 * HOUR),
            "newer": (A, None, POOL_A, timedelta(0)),
        },
    ),
    Case(
        "a pool that stocked out starts nothing before its cool-down ends",
        snapshot(
            pools=[pool(capacity=8, short_until=NOW + 90 * MINUTE + timedelta(seconds=1))],
            pending=[flex("r1")],
        ),
        {"r1": (H, Reason.POOL_SHORT_UNTIL, POOL_A, 91 * MINUTE)},
    ),
    Case(
        "failover: a short pool is skipped for the next allowed one",
        snapshot(
            pools=[pool(capacity=8, short_until=NOW + HOUR), pool(zone=ZONE_B, capacity=8)],
            pending=[flex("r1", locations=[ZONE, ZONE_B])],
        ),
        {"r1": (A, None, POOL_B, timedelta(0))},
    ),
    Case(
        "quota: the tenant's own grants hold its quota until they end",
        snapshot(
            pools=[pool(capacity=8), pool(zone=ZONE_B, capacity=8)],
            tenants=[tenant("t", quota(H100, 32))],
            grants=[grant("g1", pool_id=POOL_B, units=4, hours=5)],
            pending=[flex("r1", vm_count=1)],
        ),
        {"r1": (H, Reason.QUOTA, POOL_A, 5 * HOUR)},
    ),
    Case(
        "borrowing: idle cohort quota is lent, within the borrowing limit",
        snapshot(
            tenants=[
                tenant("lender", quota(H100, 32), cohort="c"),
                tenant("borrower", quota(H100, 16, borrowing_limit=16), cohort="c"),
            ],
            pending=[
                flex("within", tenant="borrower", vm_count=4, priority=1),
                flex("beyond", tenant="borrower", vm_count=1, submitted_at=NOW + MINUTE),
            ],
        ),
        {
            "within": (A, None, POOL_A, timedelta(0)),
            "beyond": (H, Reason.QUOTA, POOL_A, HOUR),
        },
    ),
    Case(
        "a lender waits for its lent quota to come back (no preemption)",
        snapshot(
            tenants=[
                tenant("lender", quota(H100, 32), cohort="c"),
                tenant("borrower", quota(H100, 16), cohort="c"),
            ],
            grants=[grant("g1", tenant="borrower", units=6, hours=4)],
            pending=[flex("mine", tenant="lender", vm_count=1)],
        ),
        {"mine": (H, Reason.QUOTA, POOL_A, 4 * HOUR)},
    ),
    Case(
        "TPU slices count chips in a TPU pool",
        snapshot(
            pools=[tpu_pool(capacity=16)],
            tenants=[tenant("t", quota(V5E, 64))],
            pending=[
                flex("s1", topology="2x4", vm_count=2, priority=1),
                flex("s2", topology="1x1"),
            ],
        ),
        {
            "s1": (A, None, f"{ZONE}/{V5E}", timedelta(0)),
            "s2": (H, Reason.NO_CAPACITY_UNTIL, f"{ZONE}/{V5E}", HOUR),
        },
    ),
    Case(
        "a calendar block that fits is confirmed as asked",
        snapshot(pending=[calendar("c1", vm_count=8, start_at=NOW + DAY, days=2)]),
        {"c1": (C, None, POOL_A, DAY)},
    ),
    Case(
        "a block may start exactly when another ends",
        snapshot(
            grants=[grant("g1", units=8, start_at=NOW, end_at=NOW + DAY)],
            pending=[calendar("c1", vm_count=8, start_at=NOW + DAY)],
        ),
        {"c1": (C, None, POOL_A, DAY)},
    ),
    Case(
        "a block that collides by one second is refused",
        snapshot(
            grants=[grant("g1", units=8, start_at=NOW, end_at=NOW + DAY)],
            pending=[calendar("c1", vm_count=1, start_at=NOW + DAY - timedelta(seconds=1))],
        ),
        {"c1": (F, Reason.NO_CAPACITY, None, None)},
    ),
    Case(
        "borrowing that ends exactly at a block's start lets the block in",
        snapshot(
            tenants=[
                tenant("owner", quota(H100, 32), cohort="c"),
                tenant("borrower", quota(H100, 0), cohort="c"),
            ],
            pools=[pool(capacity=8)],
            grants=[grant("loan", tenant="borrower", units=4, end_at=NOW + DAY)],
            pending=[calendar("block", tenant="owner", vm_count=4, start_at=NOW + DAY)],
        ),
        {"block": (C, None, POOL_A, DAY)},
    ),
    Case(
        "borrowing that ends a second after the block's start refuses it on quota",
        snapshot(
            tenants=[
                tenant("owner", quota(H100, 32), cohort="c"),
                tenant("borrower", quota(H100, 0), cohort="c"),
            ],
            pools=[pool(capacity=8)],
            grants=[
                grant("loan", tenant="borrower", units=4, end_at=NOW + DAY + timedelta(seconds=1))
            ],
            pending=[calendar("block", tenant="owner", vm_count=4, start_at=NOW + DAY)],
        ),
        {"block": (F, Reason.QUOTA, None, None)},
    ),
    Case(
        "calendar blocks go first: flex work fills around them",
        snapshot(
            pools=[pool(capacity=8)],
            pending=[
                flex("long-flex", vm_count=8, hours=30, priority=5, max_wait=3 * DAY),
                calendar("block", vm_count=8, start_at=NOW + DAY, days=1),
            ],
        ),
        {
            "block": (C, None, POOL_A, DAY),
            "long-flex": (H, Reason.NO_CAPACITY_UNTIL, POOL_A, 2 * DAY),
        },
    ),
    Case(
        "a block wholly in the past is refused",
        snapshot(
            pending=[calendar("c1", start_at=NOW - 2 * DAY, submitted_at=NOW - 3 * DAY, days=1)]
        ),
        {"c1": (F, Reason.START_PASSED, None, None)},
    ),
    Case(
        "a block whose start just passed is confirmed for what remains",
        snapshot(pending=[calendar("c1", start_at=NOW - MINUTE, submitted_at=NOW - HOUR)]),
        {"c1": (C, None, POOL_A, -MINUTE)},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_admission(case: Case) -> None:
    assert view(admit(case.snapshot, case.now)) == case.expected


def test_a_refused_block_offers_the_three_nearest_starts_that_fit() -> None:
    plan = admit(
        snapshot(
            pools=[pool(capacity=8), pool(zone=ZONE_B, capacity=8)],
            grants=[
                grant("a1", units=8, start_at=NOW, end_at=NOW + 3 * DAY),
                grant("a2", units=8, start_at=NOW + 4 * DAY, end_at=NOW + 9 * DAY),
                grant("b1", pool_id=POOL_B, units=8, start_at=NOW, end_at=NOW + 5 * DAY),
            ],
            pending=[
                calendar("c1", vm_count=8, start_at=NOW + 2 * DAY, days=2, locations=[REGION])
            ],
        ),
        NOW,
    )
    decision = plan.decision("c1")
    assert (decision.outcome, decision.reason) == (F, Reason.NO_CAPACITY)
    assert decision.alternatives == (
        # A's one-day gap between a1 and a2 is too short for two days; B frees at day 5.
        Alternative(start_at=NOW + 5 * DAY, pool_id=POOL_B),
        Alternative(start_at=NOW + 9 * DAY, pool_id=POOL_A),
    )
    assert "nearest starts that fit" in decision.message


def test_alternatives_include_earlier_starts_and_stop_at_three() -> None:
    plan = admit(
        snapshot(
            pools=[pool(capacity=8)],
            grants=[
                grant("g1", units=8, start_at=NOW + 2 * DAY, end_at=NOW + 3 * DAY),
                grant("g2", units=8, start_at=NOW + 5 * DAY, end_at=NOW + 6 * DAY),
                grant("g3", units=8, start_at=NOW + 8 * DAY, end_at=NOW + 9 * DAY),
            ],
            pending=[calendar("c1", vm_count=1, start_at=NOW + 2 * DAY + HOUR, days=1)],
        ),
        NOW,
    )
    alternatives = plan.decision("c1").alternatives
    assert [alt.start_at - NOW for alt in alternatives] == [
        3 * DAY,  # 23 h later: right after g1 (the nearest point of the gap [3d, 4d])
        DAY,  # 25 h earlier: ending exactly when g1 starts
        6 * DAY,  # right after g2; one start per gap, so 4d is not offered
    ]


def test_held_requests_are_numbered_per_pool_by_eta() -> None:
    plan = admit(
        snapshot(
            pools=[pool(capacity=1)],
            grants=[grant("g1", units=1, hours=1)],
            pending=[
                flex("first", hours=1),
                flex("second", hours=2),
                flex("third", hours=3),
            ],
        ),
        NOW,
    )
    positions = {d.request_id: (d.position, d.start_at - NOW) for d in plan.decisions if d.start_at}
    assert positions == {
        "first": (1, HOUR),
        "second": (2, 2 * HOUR),
        "third": (3, 4 * HOUR),
    }
    assert [plan.rank(d.request_id) for d in plan.decisions] == [1, 2, 3]


def test_every_decision_has_a_message_a_person_can_read() -> None:
    plan = admit(
        snapshot(
            grants=[grant("g1", units=8, hours=2)],
            pending=[flex("held"), flex("huge", vm_count=99), flex("l4", machine_type=G2)],
        ),
        NOW,
    )
    assert plan.decision("held").message.startswith("waiting (NO_CAPACITY_UNTIL); slot held in")
    assert "largest allowed pool holds 8" in plan.decision("huge").message
    assert f"pool of {G2} ({L4})" in plan.decision("l4").message


def test_now_must_be_timezone_aware() -> None:
    from opendws.domain import InvalidModel

    with pytest.raises(InvalidModel, match="timezone-aware"):
        admit(snapshot(), NOW.replace(tzinfo=None))


@pytest.mark.parametrize("enabled", [True, False], ids=["collector on", "collector off"])
def test_a_pass_runs_without_the_cyclic_collector_and_restores_its_state(enabled: bool) -> None:
    import gc

    inside: list[bool] = []
    armed = {"note": False, "fail": False}

    class Spy(str):
        """A request id that, once armed, notes whether the collector is on whenever it is
        hashed (and fails the pass when told to): seen from inside the pass, compiled or not."""

        __slots__ = ()

        def __hash__(self) -> int:
            if armed["note"]:
                inside.append(gc.isenabled())
                if armed["fail"]:
                    raise RuntimeError("boom")
            return str.__hash__(self)

    planned = snapshot(pending=[flex(Spy("f1"))])
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        armed["note"] = True
        plan = admit(planned, NOW)
        armed["note"] = False
        assert plan.decision("f1").outcome is Outcome.ADMIT
        assert gc.isenabled() is enabled
        seen = len(inside)
        armed["note"] = armed["fail"] = True
        with pytest.raises(RuntimeError, match="boom"):
            admit(planned, NOW)
        armed["note"] = False
        assert gc.isenabled() is enabled  # restored when the pass fails too
    finally:
        armed["note"] = False
        (gc.enable if was else gc.disable)()
    assert seen > 0
    assert len(inside) == seen + 1  # the failing pass failed at its first hash
    assert not any(inside)


def test_decisions_follow_request_ids_whatever_the_order_pending_is_given_in() -> None:
    pending = [flex("f-3"), calendar("c-2", vm_count=1), flex("f-1", vm_count=99), flex("a-9")]
    plan = admit(snapshot(pending=pending), NOW)
    assert [d.request_id for d in plan.decisions] == ["a-9", "c-2", "f-1", "f-3"]
    assert plan == admit(snapshot(pending=pending[::-1]), NOW)


def test_a_plan_and_its_parts_survive_pickling_and_copying_unchanged() -> None:
    """A plan, its decisions (a refusal's alternatives too), races and a planner's pass report
    are values: pickled (as a replay's worker processes hand results back) or copied, each
    comes back equal, whether its module runs compiled or as plain Python (a compiled frozen
    class refuses the field writes the default way makes; see setup.py)."""
    import copy
    import pickle

    from opendws.domain.planner.incremental.kept import PlanReport
    from opendws.domain.planner.incremental.planner import IncrementalPlanner
    from opendws.domain.planner.verdicts import Decision, Race

    refused = Decision(
        request_id="b1",
        outcome=Outcome.REFUSE,
        reason=Reason.NO_CAPACITY,
        alternatives=(Alternative(start_at=NOW, pool_id="p", advised=True),),
        detail="no room",
    )
    planned = admit(snapshot(pending=[flex("f1"), flex("f2", vm_count=50)]), NOW)
    plan = Plan(
        now=NOW,
        decisions=(*planned.decisions, refused),
        races=(Race(request_id="f1", pools=("p", "q")),),
        order=planned.order,
    )
    planner = IncrementalPlanner()
    planner.plan(snapshot(pending=[flex("f1")]), NOW)
    values: list[object] = [plan, refused, *plan.races, planner.last_pass, PlanReport(full=False)]
    for value in values:
        for again in (
            pickle.loads(pickle.dumps(value)),
            copy.copy(value),
            copy.deepcopy(value),
        ):
            assert again == value
            assert type(again) is type(value)
    assert pickle.loads(pickle.dumps(plan)).decision("b1").alternatives[0].advised
