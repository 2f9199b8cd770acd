"""Commitments (``PolicySettings.commit_within``) on random snapshots: once a pass told a
request its slot, no newcomer — whatever its priority or size — moves it later, and no limit
is exceeded whatever commitments a snapshot carries (possible or not)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from opendws.domain import Outcome, Snapshot, admit
from opendws.domain.model import Commitment, Mode
from tests.property.test_admission_properties import (
    NOW,
    applied,
    planned_grants,
    request_strategy,
    snapshots,
    violations,
)

STICKY = timedelta(days=14)


def committing(snapshot: Snapshot) -> Snapshot:
    return replace(snapshot, policy=replace(snapshot.policy, commit_within=STICKY))


def told(snapshot: Snapshot) -> tuple[Commitment, ...]:
    """The held slots a pass announces, as the next pass's commitments."""
    plan = admit(snapshot, NOW)
    return tuple(
        Commitment(request_id=d.request_id, pool_id=d.pool_id, start_at=d.start_at)
        for d in plan.having(Outcome.HOLD)
        if d.pool_id is not None and d.start_at is not None
    )


@given(snapshots(), st.data())
def test_a_newcomer_never_moves_a_commitment_later(snapshot: Snapshot, data: st.DataObject) -> None:
    snapshot = committing(snapshot)
    commitments = told(snapshot)
    names = [tenant.name for tenant in snapshot.tenants]
    newcomer = data.draw(
        request_strategy(99, names, list(snapshot.pools)).filter(
            lambda r: r.mode is Mode.FLEX_START
        )
    )
    first = max((request.priority for request in snapshot.pending), default=0)
    newcomer = replace(newcomer, priority=data.draw(st.sampled_from([first + 1, first, 0])))
    after = replace(snapshot, pending=(*snapshot.pending, newcomer), commitments=commitments)
    plan = admit(after, NOW)
    for commitment in commitments:
        decision = plan.decision(commitment.request_id)
        assert decision.outcome in (Outcome.ADMIT, Outcome.HOLD), decision
        assert decision.start_at is not None
        assert decision.start_at <= commitment.start_at
    assert violations(after, planned_grants(after, plan)) == []


@given(snapshots(), st.data())
def test_no_limit_is_exceeded_whatever_the_commitments(
    snapshot: Snapshot, data: st.DataObject
) -> None:
    snapshot = committing(snapshot)
    flex = [r for r in snapshot.pending if r.mode is Mode.FLEX_START]
    pools = [pool.pool_id for pool in snapshot.pools]
    commitments: list[Commitment] = []
    for request in flex if pools else []:
        if data.draw(st.booleans()):
            seconds = data.draw(st.integers(-3600, 5 * 86_400))
            commitments.append(
                Commitment(
                    request_id=request.request_id,
                    pool_id=data.draw(st.sampled_from(pools)),
                    start_at=NOW + timedelta(seconds=seconds),
                )
            )
    after = replace(snapshot, commitments=tuple(commitments))
    plan = admit(after, NOW)
    assert violations(after, planned_grants(after, plan)) == []
    assert [d.request_id for d in plan.decisions] == sorted(r.request_id for r in after.pending)


@given(snapshots())
def test_carrying_out_a_plan_leaves_its_commitments_reasons_as_they_were(
    snapshot: Snapshot,
) -> None:
    """A pass over the same commitments after the last one's admissions and confirmations
    were carried out (now grants) names the same reason for every request that was held at
    its promised slot both times, as long as nothing moved: a reason is judged on the
    finished plan, whether what holds the request is a grant or another request's slot — so
    a reconcile pass that only sees its own admissions running rewrites no commitment."""
    snapshot = committing(snapshot)
    first = replace(snapshot, commitments=told(snapshot))
    plan = admit(first, NOW)
    second = replace(applied(first, plan), commitments=told(first))
    again = admit(second, NOW)
    held = {d.request_id: d for d in plan.having(Outcome.HOLD)}
    if any(again.decision(request_id).start_at != d.start_at for request_id, d in held.items()):
        return  # a slot moved earlier: the plan changed, and so may what holds the rest
    promised = {c.request_id: c.start_at for c in first.commitments}
    for request_id, decision in held.items():
        if promised.get(request_id) == decision.start_at:  # kept where it was promised
            assert again.decision(request_id).reason == decision.reason, request_id
