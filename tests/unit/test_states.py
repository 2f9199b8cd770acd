"""The request life cycle: every (from, to) pair is either an allowed edge or IllegalTransition."""

from __future__ import annotations

import itertools

import pytest

from opendws.domain.states import (
    IllegalTransition,
    RequestState,
    can_transition,
    transition,
)

S = RequestState

# The life cycle of DESIGN.md, written out independently of the code's table.
ALLOWED: dict[RequestState, set[RequestState]] = {
    S.PENDING: {S.PROVISIONING, S.BOOKED, S.TIMED_OUT, S.CANCELLED, S.REJECTED},
    S.BOOKED: {S.PROVISIONING, S.CANCELLED, S.EXPIRED},
    S.PROVISIONING: {S.ACTIVE, S.PENDING, S.TIMED_OUT, S.CANCELLED, S.EXPIRED},
    S.ACTIVE: {S.RELEASED, S.EXPIRED},
    S.RELEASED: set(),
    S.EXPIRED: set(),
    S.TIMED_OUT: set(),
    S.CANCELLED: set(),
    S.REJECTED: set(),
}
# A job into a calendar block starts on the block's VMs (never admitted): its edge only.
BLOCK_JOB_ONLY = {(S.PENDING, S.ACTIVE)}
FINAL = {S.RELEASED, S.EXPIRED, S.TIMED_OUT, S.CANCELLED, S.REJECTED}

PAIRS = list(itertools.product(RequestState, repeat=2))
ALLOWED_PAIRS = [(current, target) for current, target in PAIRS if target in ALLOWED[current]]
ILLEGAL_PAIRS = [(current, target) for current, target in PAIRS if target not in ALLOWED[current]]


def pair_id(pair: tuple[RequestState, RequestState]) -> str:
    return f"{pair[0]}->{pair[1]}"


def test_the_table_covers_every_state() -> None:
    assert set(ALLOWED) == set(RequestState)
    assert len(PAIRS) == 81
    assert len(ALLOWED_PAIRS) == 15


@pytest.mark.parametrize(("current", "target"), ALLOWED_PAIRS, ids=map(pair_id, ALLOWED_PAIRS))
def test_allowed_transition(current: RequestState, target: RequestState) -> None:
    assert can_transition(current, target) is True
    assert transition(current, target) is target


@pytest.mark.parametrize(("current", "target"), ILLEGAL_PAIRS, ids=map(pair_id, ILLEGAL_PAIRS))
def test_illegal_transition(current: RequestState, target: RequestState) -> None:
    assert can_transition(current, target) is False
    with pytest.raises(IllegalTransition) as raised:
        transition(current, target)
    error = raised.value
    assert (error.current, error.target) == (current, target)
    assert f"from {current} to {target}" in str(error)
    # The message also says what is allowed instead, so the caller can act on it.
    for allowed in ALLOWED[current]:
        assert str(allowed) in str(error).split(";", 1)[1]
    if current in FINAL:
        assert "final" in str(error)


@pytest.mark.parametrize(("current", "target"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_a_job_into_a_block_takes_the_same_edges_and_its_own(
    current: RequestState, target: RequestState
) -> None:
    legal = target in ALLOWED[current] or (current, target) in BLOCK_JOB_ONLY
    assert can_transition(current, target, block_job=True) is legal
    if legal:
        assert transition(current, target, block_job=True) is target
    else:
        with pytest.raises(IllegalTransition):
            transition(current, target, block_job=True)


def test_only_a_job_into_a_block_goes_from_pending_to_active() -> None:
    with pytest.raises(IllegalTransition, match="only a job into a calendar block"):
        transition(S.PENDING, S.ACTIVE)


def test_illegal_transition_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="from RELEASED to ACTIVE"):
        transition(S.RELEASED, S.ACTIVE)


@pytest.mark.parametrize(
    ("state", "final"),
    [(state, state in FINAL) for state in RequestState],
    ids=[str(state) for state in RequestState],
)
def test_is_final(state: RequestState, final: bool) -> None:
    assert state.is_final is final
