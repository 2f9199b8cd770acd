"""The rules of every store write, as the pure functions both adapters call
(opendws.ports.records): how a Change moves a record, who gets the reconciler lease, whether a
fenced write still lands, and that a pool's cool-down never shortens. The contract suite
(tests/contract/test_request_store.py) checks that the memory fake and Firestore persist what
these return; here the rules themselves are pinned, without any store."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opendws.domain import IllegalTransition, RequestState
from opendws.ports import (
    LEASE_FREE,
    Change,
    Fence,
    Fenced,
    Lane,
    RequestRecord,
    StaleWrite,
    StatusEvent,
    accepted,
    check_fence,
    cooldown_after,
    lease_released,
    next_lease,
)
from tests.builders import NOW, flex

S = RequestState
TTL = timedelta(minutes=2)


def stored(**changes: Any) -> RequestRecord:
    record, _ = accepted(flex("r1", vm_count=2, hours=1), NOW)
    return replace(record, **changes)


def event(state: RequestState, minutes: int = 1) -> StatusEvent:
    return StatusEvent(
        request_id="r1", tenant="t", state=state, previous_state=None,
        at=NOW + timedelta(minutes=minutes),
    )  # fmt: skip


def test_a_transition_bumps_the_version_and_sets_since_to_the_event() -> None:
    record = stored()
    changed = Change(
        expected_version=1, state=S.PROVISIONING, event=event(S.PROVISIONING), pool="p",
        attempt=1, reason="ADMITTED", message="admitted",
    ).apply(record)  # fmt: skip
    assert (changed.state, changed.version, changed.events) == (S.PROVISIONING, 2, 2)
    assert changed.since == changed.updated_at == NOW + timedelta(minutes=1)
    assert (changed.pool, changed.attempt, changed.reason) == ("p", 1, "ADMITTED")
    assert changed.announced == record.announced  # the outbox cursor is not a change's


def test_a_revision_keeps_since_and_attempt_none_keeps_the_attempt() -> None:
    record = stored(state=S.PROVISIONING, version=2, attempt=3, since=NOW, pool="p")
    revised = Change(
        expected_version=2, state=S.PROVISIONING, event=event(S.PROVISIONING, 5), pool="p",
        eta=NOW, position=4,
    ).apply(record)  # fmt: skip
    assert revised.since == NOW  # a revision is not a transition
    assert revised.attempt == 3  # None keeps it
    assert (revised.version, revised.eta, revised.position) == (3, NOW, 4)


def test_back_in_line_a_request_has_no_lanes_and_none_keeps_them_otherwise() -> None:
    lanes = (Lane("a", 1), Lane("b", 1))
    racing = stored(state=S.PROVISIONING, version=2, lanes=lanes, pool="a", attempt=1)
    kept = Change(expected_version=2, state=S.PROVISIONING, event=event(S.PROVISIONING)).apply(
        racing
    )
    assert kept.lanes == lanes
    back = Change(expected_version=2, state=S.PENDING, event=event(S.PENDING), lanes=lanes)
    assert back.apply(racing).lanes == ()


def test_a_change_at_another_version_is_stale_and_an_illegal_move_is_refused() -> None:
    record = stored()
    with pytest.raises(StaleWrite, match="r1 is at version 1, not 2"):
        Change(expected_version=2, state=S.PROVISIONING, event=event(S.PROVISIONING)).apply(record)
    with pytest.raises(IllegalTransition):
        Change(expected_version=1, state=S.EXPIRED, event=event(S.EXPIRED)).apply(record)


def test_the_lease_is_granted_when_free_or_expired_and_renewed_under_the_same_token() -> None:
    first = next_lease(None, "a", NOW, TTL)
    assert first == Fence(holder="a", token=1, expires_at=NOW + TTL)
    assert next_lease(first, "b", NOW + timedelta(minutes=1), TTL) is None  # still a's
    renewed = next_lease(first, "a", NOW + timedelta(minutes=1), TTL)
    assert renewed is not None
    assert renewed.token == 1
    taken = next_lease(first, "b", NOW + TTL, TTL)  # expired: b takes it, one token up
    assert taken is not None
    assert (taken.holder, taken.token) == ("b", 2)


def test_a_fence_admits_writes_only_under_its_own_holder_and_token() -> None:
    fence = Fence(holder="a", token=1, expires_at=NOW + TTL)
    assert fence.admits(fence)
    assert fence.admits(Fence(holder="a", token=1, expires_at=NOW))  # expired, not taken
    assert not fence.admits(None)
    assert not fence.admits(Fence(holder="b", token=2, expires_at=NOW + TTL))
    with pytest.raises(Fenced, match=r"held by b \(token 2\); a \(token 1\) may no longer"):
        check_fence(fence, Fence(holder="b", token=2, expires_at=NOW + TTL))
    check_fence(None, None)  # an unfenced write always lands


def test_releasing_frees_the_lease_at_once_only_for_its_holder() -> None:
    fence = Fence(holder="a", token=1, expires_at=NOW + TTL)
    released = lease_released(fence, fence)
    assert released is not None
    assert released.expires_at == LEASE_FREE
    assert next_lease(released, "b", NOW, TTL) is not None  # anyone may take it now
    assert lease_released(Fence(holder="b", token=2, expires_at=NOW), fence) is None
    assert lease_released(None, fence) is None


@given(
    current=st.none() | st.integers(min_value=0, max_value=600),
    until=st.integers(min_value=0, max_value=600),
)
def test_a_cooldown_never_shortens(current: int | None, until: int) -> None:
    at = None if current is None else NOW + timedelta(seconds=current)
    wanted = NOW + timedelta(seconds=until)
    after = cooldown_after(at, wanted)
    recorded = after if after is not None else at
    assert recorded is not None
    assert recorded == (wanted if at is None else max(at, wanted))
