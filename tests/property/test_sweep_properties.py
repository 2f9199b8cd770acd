"""``steady_until`` against the sweep itself: over ``[now, steady_until)`` every instant gives
a live request the step it gets at ``now``.

The reconciler leaves a request whose last sweep did nothing alone until its inputs change or
this instant comes (``opendws.service.reconcile``), so an instant reported too late would be a
deadline missed: a run not ended, a wait not timed out, a block not started. Views are drawn
over every live state, mode, phase, error code and deadline the table knows, with several lanes
for a racing flex request.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from opendws.domain.model import Mode
from opendws.domain.provisioning import Lane, ProvisionPhase
from opendws.domain.states import RequestState
from opendws.domain.sweep import (
    CANCELLED_CODE,
    DECLINED_CODE,
    NOT_ACCEPTED,
    LaneView,
    SweepSettings,
    SweepView,
    steady_until,
    sweep,
)
from tests.builders import NOW

S = RequestState
# (state, mode) pairs a live request can be in; a PENDING one is a block under Google's review.
LIVE = [
    (S.PROVISIONING, Mode.FLEX_START),
    (S.ACTIVE, Mode.FLEX_START),
    (S.PENDING, Mode.CALENDAR),
    (S.BOOKED, Mode.CALENDAR),
    (S.PROVISIONING, Mode.CALENDAR),
    (S.ACTIVE, Mode.CALENDAR),
]
CODES = [None, "ZONE_RESOURCE_POOL_EXHAUSTED", "STOCKOUT", NOT_ACCEPTED, CANCELLED_CODE,
         DECLINED_CODE, "QUOTA_EXCEEDED"]  # fmt: skip
offsets = st.integers(min_value=-3 * 24 * 60, max_value=3 * 24 * 60).map(
    lambda minutes: timedelta(minutes=minutes)
)


@st.composite
def lane_views(draw: st.DrawFn, attempt: int) -> LaneView:
    return LaneView(
        lane=Lane(draw(st.sampled_from(["a", "b", "c"])), attempt),
        configured=draw(st.booleans()),
        phase=draw(st.none() | st.sampled_from(list(ProvisionPhase))),
        error_code=draw(st.sampled_from(CODES)),
        last_attempt=draw(st.sampled_from(CODES)),
        message=draw(st.sampled_from(["", "no capacity"])),
    )


@st.composite
def views(draw: st.DrawFn) -> SweepView:
    state, mode = draw(st.sampled_from(LIVE))
    racing = state is S.PROVISIONING and mode is Mode.FLEX_START
    count = draw(st.integers(min_value=1, max_value=3)) if racing else 1
    lanes = tuple(draw(lane_views(attempt)) for attempt in range(1, count + 1))
    block_start = NOW + draw(offsets) if mode is Mode.CALENDAR else None
    return SweepView(
        state=state,
        mode=mode,
        lanes=lanes,
        units=8,
        since=NOW + draw(offsets),
        reason=draw(st.sampled_from([None, "WAITING_FOR_CAPACITY", "READY"])),
        waiting_told=draw(st.booleans()),
        deadline=NOW + draw(offsets) if mode is Mode.FLEX_START else None,
        run_end=NOW + draw(offsets) if state is S.ACTIVE else None,
        block_start=block_start,
        block_end=None if block_start is None else block_start + timedelta(hours=draw(
            st.integers(min_value=1, max_value=48))),
    )  # fmt: skip


settings_strategy = st.builds(
    SweepSettings,
    grace=st.sampled_from([timedelta(0), timedelta(minutes=1)]),
    not_taken_after=st.sampled_from([timedelta(minutes=1), timedelta(minutes=15)]),
    give_up_after=st.none() | st.just(timedelta(hours=2)),
)


def deadlines(view: SweepView, settings: SweepSettings) -> set[datetime | None]:
    """Every instant of the view a deadline row compares the time against."""
    return {
        view.since + settings.not_taken_after,
        view.deadline,
        view.block_start,
        view.block_end,
        None if view.run_end is None else view.run_end + settings.grace,
        None if settings.give_up_after is None else view.since + settings.give_up_after,
    }


@given(views(), settings_strategy, offsets, st.floats(min_value=0, max_value=1))
def test_the_step_holds_until_steady_until(
    view: SweepView, settings: SweepSettings, at: timedelta, fraction: float
) -> None:
    """Checked at a random instant of the interval, at its last microsecond, and at every
    deadline of the view inside it (where a missed one would first change the step)."""
    now = NOW + at
    until = steady_until(view, now, settings)
    horizon = until if until is not None else now + timedelta(days=30)
    assert horizon > now
    last = horizon - timedelta(microseconds=1)
    inside = {d for d in deadlines(view, settings) if d is not None and now < d < horizon}
    expected = sweep(view, now, settings)
    for later in {min(now + (horizon - now) * fraction, last), last, *inside}:
        assert sweep(view, later, settings) == expected, later


@given(views(), settings_strategy, offsets)
def test_steady_until_is_a_deadline_of_the_view(
    view: SweepView, settings: SweepSettings, at: timedelta
) -> None:
    """It is never an arbitrary instant: one of the view's own deadlines, after now."""
    now = NOW + at
    until = steady_until(view, now, settings)
    assert until is None or (until in deadlines(view, settings) and until > now)
