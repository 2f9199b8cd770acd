"""Usage per UTC day, as the dashboard's 30-day chart shows it: used hours and cost spread
over the days a run covered."""

from __future__ import annotations

from datetime import date, datetime

import pytest

from opendws.domain.model import Mode
from opendws.domain.states import RequestState
from opendws.ports import UsageEntry
from opendws.service.usage import UsageService, day_shares
from tests.builders import DAY, H100, HOUR, NOW

TODAY = NOW.date()


def entry(
    request_id: str, tenant: str, started: datetime | None, ended: datetime, hours: float,
    cost: float | None,
) -> UsageEntry:  # fmt: skip
    return UsageEntry(
        request_id=request_id, tenant=tenant, accelerator=H100, mode=Mode.FLEX_START,
        outcome=RequestState.RELEASED, granted_hours=hours, used_hours=hours,
        started_at=started, ended_at=ended, cost=cost,
    )  # fmt: skip


class Ledger:
    """The usage port over a fixed list of entries."""

    def __init__(self, *entries: UsageEntry) -> None:
        self._entries = entries

    def usage(self, tenant: str | None = None) -> list[UsageEntry]:
        return [e for e in self._entries if tenant is None or e.tenant == tenant]


def test_a_run_over_midnight_is_split_by_the_time_in_each_day() -> None:
    overnight = entry("r", "a", NOW - 6 * HOUR, NOW + 2 * HOUR, 80.0, 40.0)
    assert list(day_shares(overnight)) == [(TODAY - DAY, 0.75), (TODAY, 0.25)]
    never_ran = entry("n", "a", None, NOW + HOUR, 0.0, None)
    assert list(day_shares(never_ran)) == [(TODAY, 1.0)]
    midnight_to_midnight = entry("m", "a", NOW - DAY, NOW, 24.0, None)
    assert list(day_shares(midnight_to_midnight)) == [(TODAY - DAY, 1.0)]


def test_daily_series_per_tenant_with_every_day_of_the_window() -> None:
    ledger = Ledger(
        entry("r", "a", NOW - 6 * HOUR, NOW + 2 * HOUR, 80.0, 40.0),
        entry("s", "b", NOW + HOUR, NOW + 3 * HOUR, 16.0, None),
        entry("old", "a", NOW - 40 * DAY, NOW - 40 * DAY + HOUR, 8.0, 4.0),  # before the window
    )
    usage = UsageService(ledger)
    a, b = usage.daily(TODAY, 3)
    assert a.tenant == "a"
    assert a.days == (TODAY - 2 * DAY, TODAY - DAY, TODAY)
    assert a.used_hours == (0.0, 60.0, 20.0)
    assert a.cost == (None, 30.0, 10.0)
    assert (b.tenant, b.used_hours, b.cost) == ("b", (0.0, 0.0, 16.0), (None, None, None))
    assert [s.tenant for s in usage.daily(TODAY, 3, tenant="b")] == ["b"]
    assert usage.daily(date(2027, 6, 1), 30) == []  # nothing ended in that window
    for days in (0, 121):
        with pytest.raises(ValueError, match="days must be between 1 and 120"):
            usage.daily(TODAY, days)
    assert len(usage.daily(TODAY, 120)[0].days) == 120
    assert usage.daily(TODAY, 1)[0].used_hours == (20.0,)
