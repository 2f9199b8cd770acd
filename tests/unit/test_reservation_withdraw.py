"""A refused cancel of a calendar block, as the real adapter reads it: Google does not document
the HTTP code of a cancel it refuses (compute/docs/instances/
delete-future-reservations-calendar-mode says only when a request can be cancelled), so after
any client error the adapter reads the future reservation back and lets its
``status.procurementStatus`` decide (CP FutureReservationStatus): CANCELLED (or gone) is
withdrawn, anything still promised is refused (Google keeps and bills it). A server error is
not a refusal: it raises, and a later pass tries again."""

from __future__ import annotations

from typing import Any, cast

import pytest
from google.api_core.exceptions import (
    Conflict,
    Forbidden,
    GoogleAPICallError,
    NotFound,
    ServiceUnavailable,
)
from google.cloud import compute_v1

from opendws.adapters.gce import CloudSettings
from opendws.adapters.reservations import CalendarReservationProvider
from opendws.ports import Withdrawal
from tests.builders import pool

NAME = "odws-block-0000000000-1"


class _Operation:
    def result(self, timeout: float | None = None) -> object:
        return None


class _FutureReservations:
    """A FutureReservationsClient whose cancel fails as told and whose get reads ``after``."""

    def __init__(self, failure: GoogleAPICallError | None, before: str, after: str | None):
        self.failure = failure
        self.state = before
        self.after = after
        self.cancels = 0

    def get(self, **_: Any) -> compute_v1.FutureReservation:
        if self.state == "":
            raise NotFound("gone")
        return compute_v1.FutureReservation(
            name=NAME,
            status=compute_v1.FutureReservationStatus(procurement_status=self.state),
        )

    def cancel(self, **_: Any) -> _Operation:
        self.cancels += 1
        if self.after is not None:
            self.state = self.after
        if self.failure is not None:
            raise self.failure
        return _Operation()


def provider(client: _FutureReservations) -> CalendarReservationProvider:
    return CalendarReservationProvider(
        CloudSettings(project="p"),
        future_reservations=cast(compute_v1.FutureReservationsClient, client),
        instances=cast(compute_v1.InstancesClient, object()),
    )


@pytest.mark.parametrize(
    ("failure", "after", "expected"),
    [
        # Refused with a code other than 400 or 412: the block is still promised.
        (Conflict("cannot be cancelled"), "APPROVED", Withdrawal.REFUSED),
        (Forbidden("cannot be cancelled"), "PROCURING", Withdrawal.REFUSED),
        # The cancel took, though its call failed (a repeat, a lost answer): the state says so.
        (Conflict("already cancelled"), "CANCELLED", Withdrawal.WITHDRAWN),
        (Forbidden("gone meanwhile"), "", Withdrawal.WITHDRAWN),
        (None, "CANCELLED", Withdrawal.WITHDRAWN),
    ],
)
def test_after_a_failed_cancel_the_blocks_state_decides(
    failure: GoogleAPICallError | None, after: str, expected: Withdrawal
) -> None:
    client = _FutureReservations(failure, "APPROVED", after)
    assert provider(client).withdraw(NAME, pool()) is expected
    assert client.cancels == 1


def test_a_server_error_on_cancel_is_not_a_refusal() -> None:
    client = _FutureReservations(ServiceUnavailable("try again"), "APPROVED", None)
    with pytest.raises(ServiceUnavailable):
        provider(client).withdraw(NAME, pool())
