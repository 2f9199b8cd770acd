"""What a replay measures, per policy, from its job outcomes.

- Queueing delay: start − submission. A job that timed out counts with the 7 days it waited
  (leaving it out would reward a policy for giving up on jobs).
- Job completion time: finish − submission, over the jobs that ran.
- Utilization: busy GPU-seconds over the capacity's GPU-seconds, within the window in which jobs
  arrive (first to last submission), so that every policy is measured over the same span.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from opendws.replay.baselines import JobOutcome
from opendws.replay.traces import MAX_WAIT


@dataclass(frozen=True, slots=True)
class PolicyReport:
    """One policy's figures over one replay."""

    policy: str
    jobs: int
    mean_wait_s: float
    p50_wait_s: float
    p95_wait_s: float
    p99_wait_s: float
    max_wait_s: float
    mean_jct_s: float
    utilization: float
    timed_out: int
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def waits(outcomes: Sequence[JobOutcome]) -> np.ndarray:
    """Each job's queueing delay in seconds (a timed-out job: the 7 days it waited)."""
    return np.array([
        MAX_WAIT.total_seconds() if outcome.started_at is None
        else (outcome.started_at - outcome.job.submitted_at).total_seconds()
        for outcome in outcomes
    ], dtype=float)  # fmt: skip


def window(outcomes: Sequence[JobOutcome]) -> tuple[datetime, datetime]:
    """First to last submission."""
    submitted = [outcome.job.submitted_at for outcome in outcomes]
    return min(submitted), max(submitted)


def busy_seconds(outcomes: Sequence[JobOutcome], start: datetime, end: datetime) -> float:
    """GPU-seconds the jobs ran within [start, end)."""
    total = 0.0
    for outcome in outcomes:
        if outcome.started_at is None or outcome.finished_at is None:
            continue
        overlap = min(outcome.finished_at, end) - max(outcome.started_at, start)
        if overlap > timedelta(0):
            total += overlap.total_seconds() * outcome.job.gpus
    return total


def summarize(
    policy: str, outcomes: Sequence[JobOutcome], capacity: int, wall_s: float
) -> PolicyReport:
    """The figures of one policy (``capacity``: GPUs in all pools)."""
    delays = waits(outcomes)
    completions = [
        (outcome.finished_at - outcome.job.submitted_at).total_seconds()
        for outcome in outcomes
        if outcome.finished_at is not None
    ]
    start, end = window(outcomes)
    span = max((end - start).total_seconds(), 1.0)
    return PolicyReport(
        policy=policy,
        jobs=len(outcomes),
        mean_wait_s=float(delays.mean()),
        p50_wait_s=float(np.percentile(delays, 50)),
        p95_wait_s=float(np.percentile(delays, 95)),
        p99_wait_s=float(np.percentile(delays, 99)),
        max_wait_s=float(delays.max()),
        mean_jct_s=float(np.mean(completions)) if completions else 0.0,
        utilization=busy_seconds(outcomes, start, end) / (capacity * span),
        timed_out=sum(outcome.timed_out for outcome in outcomes),
        wall_s=wall_s,
    )


def utilization_series(
    outcomes: Sequence[JobOutcome], capacity: int, step: timedelta = timedelta(hours=6)
) -> list[tuple[datetime, float]]:
    """Utilization in consecutive ``step``-long bins across the arrival window."""
    start, end = window(outcomes)
    bins = max(int((end - start) / step) + 1, 1)
    busy = np.zeros(bins)
    origin = start.timestamp()
    width = step.total_seconds()
    for outcome in outcomes:
        if outcome.started_at is None or outcome.finished_at is None:
            continue
        first = outcome.started_at.timestamp() - origin
        last = min(outcome.finished_at.timestamp() - origin, bins * width)
        position = max(first, 0.0)
        while position < last:
            index = int(position // width)
            edge = min((index + 1) * width, last)
            busy[index] += (edge - position) * outcome.job.gpus
            position = edge
    return [(start + step * index, busy[index] / (capacity * width)) for index in range(bins)]
