"""What a replay measures, per policy, from its job outcomes.

- Queueing delay: start − submission. A job that timed out counts with the 7 days it waited
  (leaving it out would reward a policy for giving up on jobs).
- Job completion time: finish − submission, over the jobs that ran.
- Utilization: busy GPU-seconds over the capacity's GPU-seconds, within the window in which jobs
  arrive (first to last submission), so that every policy is measured over the same span.
- ETA accuracy (opendws): over the jobs that were announced an ETA while they waited, the share
  that started no later than their first ETA, and actual start − first ETA (median, p90, over
  those that started). An ETA that moves by less than the reconciler's ``eta_tolerance`` is not
  announced again, so a start a few minutes after the last one announced counts as late.
- Behind Google's queue (a replay with a :class:`~opendws.replay.google_queue.GoogleQueue`), an
  ETA is judged against the job's admission, and ``ready_eta`` (the ETA plus the pool's learned
  admission → ACTIVE median, and its p90 bound) against when its capacity ran
  (:func:`ready_accuracy`); ETAs told less than the commitment horizon ahead that later moved
  later are counted by the cause their event named (:func:`broken_promises`).
- The naive estimate, as the baseline: on the same jobs, at the moment opendws announced its
  first ETA, the job's place in its pool's queue (every job of the pool waiting then, itself
  included) divided by the pool's admission rate over the :data:`NAIVE_RATE_WINDOW` before —
  what a queue without a planner can tell (queue depth ÷ drain rate). A pool that admitted no
  one in the window gives no estimate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from opendws.replay.baselines import Announced, JobOutcome
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


# How far back the naive estimate looks for its pool's admission rate.
NAIVE_RATE_WINDOW = timedelta(hours=6)


@dataclass(frozen=True, slots=True)
class EtaAccuracy:
    """How well one way of telling a waiting job its start did (see the module docstring)."""

    jobs: int  # jobs it gave an ETA
    started: int  # of those, the jobs that started (the errors are over these)
    kept_share: float  # started no later than the first ETA, over ``jobs``
    median_error_s: float  # actual start − first ETA
    p90_error_s: float
    # ETA announcements later than the job's previous one, by the reason the event gave.
    moved_later: int = 0
    moved_later_by_reason: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _accuracy(
    firsts: Sequence[tuple[datetime | None, datetime]], moves: Counter[str] | None = None
) -> EtaAccuracy:
    """Figures over ``(what happened, when it was promised)`` pairs, one per job (what
    happened is None for a job it never happened to)."""
    errors = np.array(
        [(actual - eta).total_seconds() for actual, eta in firsts if actual is not None],
        dtype=float,
    )
    kept = sum(actual is not None and actual <= eta for actual, eta in firsts)
    moves = moves or Counter()
    return EtaAccuracy(
        jobs=len(firsts),
        started=len(errors),
        kept_share=kept / len(firsts) if firsts else 1.0,
        median_error_s=float(np.median(errors)) if len(errors) else 0.0,
        p90_error_s=float(np.percentile(errors, 90)) if len(errors) else 0.0,
        moved_later=sum(moves.values()),
        moved_later_by_reason=dict(sorted(moves.items())),
    )


def eta_accuracy(outcomes: Sequence[JobOutcome], within: timedelta | None = None) -> EtaAccuracy:
    """opendws's ETAs: the first one each waiting job was told, against its start; and how
    many announcements moved a job's ETA later than the one before. With ``within``, the
    first ETA each job was told that lay less than that far ahead when it was told (with
    commitments over a horizon: the first promise), over the jobs told one."""
    firsts = [
        (outcome.admitted, told[0].eta)
        for outcome in outcomes
        if (told := [a for a in outcome.etas if within is None or a.eta - a.at < within])
    ]
    moves: Counter[str] = Counter(
        _cause(later)
        for outcome in outcomes
        for earlier, later in zip(outcome.etas, outcome.etas[1:], strict=False)
        if later.eta > earlier.eta
    )
    return _accuracy(firsts, moves)


def broken_promises(outcomes: Sequence[JobOutcome], within: timedelta) -> dict[str, int]:
    """ETAs told less than ``within`` ahead (promises, under commitments over that horizon)
    that a later announcement moved later, by the cause its event named: ``google_late``
    (runs ahead not served by Google in the pool's usual time), else ``none named``."""
    broken: Counter[str] = Counter(
        "google_late" if later.google_late else "none named"
        for outcome in outcomes
        for earlier, later in zip(outcome.etas, outcome.etas[1:], strict=False)
        if later.eta > earlier.eta and earlier.eta - earlier.at < within
    )
    return dict(sorted(broken.items()))


def _cause(announced: Announced) -> str:
    """The reason an announcement gave, with the cause outside the plan it named."""
    reason = str(announced.reason or "unknown")
    return f"{reason} (Google late)" if announced.google_late else reason


def naive_etas(
    outcomes: Sequence[JobOutcome], rate_window: timedelta = NAIVE_RATE_WINDOW
) -> dict[str, datetime]:
    """The naive estimate for each job opendws announced an ETA to, made when it announced
    its first (see the module docstring); job id → estimated start."""
    # A queue per set of pools the jobs may use (a Philly job: its virtual cluster's one).
    by_pool: dict[tuple[str, ...], list[JobOutcome]] = {}
    for outcome in outcomes:
        by_pool.setdefault(outcome.job.pools, []).append(outcome)
    estimates: dict[str, datetime] = {}
    width = rate_window.total_seconds()
    for members in by_pool.values():
        submitted = np.sort([o.job.submitted_at.timestamp() for o in members])
        started = np.sort([o.admitted.timestamp() for o in members if o.admitted])
        gave_up = np.sort(
            [(o.job.submitted_at + MAX_WAIT).timestamp() for o in members if o.timed_out]
        )
        for outcome in members:
            if not outcome.etas:
                continue
            told = outcome.etas[0].at
            at = told.timestamp()
            # Submitted by then, less started by then, less given up by then: waiting.
            waiting = int(
                np.searchsorted(submitted, at, side="right")
                - np.searchsorted(started, at, side="right")
                - np.searchsorted(gave_up, at, side="right")
            )
            recent = int(
                np.searchsorted(started, at, side="right")
                - np.searchsorted(started, at - width, side="right")
            )
            if recent:
                estimates[outcome.job.job_id] = told + timedelta(
                    seconds=max(waiting, 1) * width / recent
                )
    return estimates


def naive_accuracy(
    outcomes: Sequence[JobOutcome], rate_window: timedelta = NAIVE_RATE_WINDOW
) -> EtaAccuracy:
    """The naive estimate's accuracy on the jobs it could estimate of those opendws told."""
    estimates = naive_etas(outcomes, rate_window)
    firsts = [
        (outcome.admitted, estimates[outcome.job.job_id])
        for outcome in outcomes
        if outcome.job.job_id in estimates
    ]
    return _accuracy(firsts)


@dataclass(frozen=True, slots=True)
class ReadyAccuracy:
    """How well ``ready_eta`` told when a job's capacity would run, behind Google's queue
    (see :mod:`opendws.replay.google_queue`): over the jobs whose first announcement that
    carried a ``ready_eta`` (the first once their pool had enough samples), against the
    instant the job's capacity ran (ACTIVE)."""

    jobs: int  # jobs told a ready_eta
    ready: EtaAccuracy  # the first ready_eta (eta + the pool's median) against ACTIVE
    ready_p90: EtaAccuracy  # its 90th-percentile bound against ACTIVE
    eta_alone: EtaAccuracy  # the eta of that same announcement, taken as when it would run

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "kept_share": self.ready.kept_share,
            "median_error_s": self.ready.median_error_s,
            "p90_error_s": self.ready.p90_error_s,
            "p90_kept_share": self.ready_p90.kept_share,
            "eta_alone": {
                "kept_share": self.eta_alone.kept_share,
                "median_error_s": self.eta_alone.median_error_s,
                "p90_error_s": self.eta_alone.p90_error_s,
            },
        }


def ready_accuracy(outcomes: Sequence[JobOutcome]) -> ReadyAccuracy:
    """opendws's ``ready_eta`` against when each job's capacity ran (see
    :class:`ReadyAccuracy`); ``eta_alone`` shows what reading ``eta`` as that time misses."""
    told = [
        (outcome.started_at, first)
        for outcome in outcomes
        if (first := next((a for a in outcome.etas if a.ready_eta is not None), None))
    ]
    return ReadyAccuracy(
        jobs=len(told),
        ready=_accuracy([(ran, a.ready_eta) for ran, a in told if a.ready_eta is not None]),
        ready_p90=_accuracy(
            [(ran, a.ready_eta_p90) for ran, a in told if a.ready_eta_p90 is not None]
        ),
        eta_alone=_accuracy([(ran, a.eta) for ran, a in told]),
    )
