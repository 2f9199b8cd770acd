"""How long Google took to serve an admitted request in a pool, and the ready ETA that follows
(``opendws.domain.readiness``): the samples a pool keeps, their median and 90th percentile,
and an ETA moved by them."""

from __future__ import annotations

from datetime import timedelta

import pytest

from opendws.domain.readiness import (
    MIN_SAMPLES,
    WINDOW,
    Readiness,
    ReadySample,
    readiness,
    ready_etas,
    samples_after,
)
from tests.builders import MINUTE, NOW


def sample(request_id: str, minutes: float, *, at: timedelta = timedelta(0)) -> ReadySample:
    return ReadySample(request_id=request_id, at=NOW + at, took=timedelta(minutes=minutes))


def test_the_newest_samples_are_kept_one_per_request() -> None:
    kept = samples_after((), sample("a", 3))
    assert kept == (sample("a", 3),)
    assert samples_after(kept, sample("a", 9)) is None  # a repeated pass: nothing to write
    later = samples_after(kept, sample("b", 1, at=MINUTE), limit=1)
    assert later == (sample("b", 1, at=MINUTE),)
    # Kept by when they were taken, not by when they were written.
    older = samples_after((sample("b", 1, at=MINUTE),), sample("c", 2), limit=1)
    assert older == (sample("b", 1, at=MINUTE),)


def test_median_and_p90_are_nearest_rank_over_the_recent_window() -> None:
    samples = [
        sample(f"r{i}", minutes) for i, minutes in enumerate([5, 1, 9, 3, 7, 2, 8, 4, 6, 10])
    ]
    assert readiness(samples, NOW) == Readiness(
        median=timedelta(minutes=5), p90=timedelta(minutes=9), samples=10
    )
    # Samples from before the window, or from after now, do not count.
    stale = [sample(f"old{i}", 600, at=-(WINDOW + MINUTE)) for i in range(5)]
    future = [sample(f"new{i}", 600, at=MINUTE) for i in range(5)]
    assert readiness([*samples, *stale, *future], NOW) == readiness(samples, NOW)


def test_too_few_samples_make_no_estimate() -> None:
    few = [sample(f"r{i}", 4) for i in range(MIN_SAMPLES - 1)]
    assert readiness(few, NOW) is None
    assert readiness([*few, sample("last", 6)], NOW) == Readiness(
        median=timedelta(minutes=4), p90=timedelta(minutes=6), samples=MIN_SAMPLES
    )


def test_the_ready_eta_is_the_eta_plus_the_pools_times() -> None:
    known = Readiness(median=timedelta(minutes=5), p90=timedelta(minutes=20), samples=9)
    eta = NOW + timedelta(hours=2)
    assert ready_etas(eta, known) == (eta + timedelta(minutes=5), eta + timedelta(minutes=20))
    assert ready_etas(None, known) == (None, None)
    assert ready_etas(eta, None) == (None, None)
    # A calendar block's capacity is Google's reservation from its start.
    assert ready_etas(eta, None, reserved=True) == (eta, eta)
    assert ready_etas(eta, known, reserved=True) == (eta, eta)


def test_a_negative_time_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be negative"):
        ReadySample(request_id="r", at=NOW, took=-MINUTE)
