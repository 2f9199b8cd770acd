"""Transaction contention is told by the exception types google-cloud-firestore raises, not
by their wording: ``Transaction._commit_with_retry`` retries a commit Firestore aborted
(``google.api_core.exceptions.Aborted``) and, out of attempts, raises
``ValueError(...) from last_exc`` (google/cloud/firestore_v1/transaction.py); a read that
Firestore aborts raises ``Aborted`` itself. Both mean the writer's view is stale."""

from __future__ import annotations

import pytest
from google.api_core.exceptions import Aborted

from opendws.adapters.firestore import _contention
from opendws.ports import StaleWrite


def out_of_attempts() -> None:
    """What the client raises when every attempt's commit was aborted."""
    try:
        raise Aborted("Transaction lock timeout")
    except Aborted as last:
        raise ValueError("Failed to commit transaction in 5 attempts.") from last


def test_a_commit_that_kept_aborting_is_a_stale_write() -> None:
    with (
        pytest.raises(StaleWrite, match="r1 changed meanwhile"),
        _contention("r1 changed meanwhile"),
    ):
        out_of_attempts()


def test_an_aborted_read_is_a_stale_write() -> None:
    with pytest.raises(StaleWrite), _contention("r1 changed meanwhile"):
        raise Aborted("contention")


def test_any_other_value_error_is_not_contention_whatever_it_says() -> None:
    with pytest.raises(ValueError, match="Failed to commit transaction"), _contention("r1"):
        raise ValueError("Failed to commit transaction in 5 attempts.")
