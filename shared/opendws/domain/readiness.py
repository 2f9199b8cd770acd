"""How long Google takes to serve an admitted request in a pool, learned from what it did
lately, and the ``ready_eta`` that follows from it.

opendws's ``eta`` is when *it* admits a request; the capacity runs once Google has served the
order (a flex-start resize request or queued resource waits in Google's own queue first). Each
time a flex-start order becomes ACTIVE the reconciler records one :class:`ReadySample` for its
pool: admission → ACTIVE. A pool keeps its newest :data:`KEPT_SAMPLES` (one per request, so a
repeated pass cannot count one twice); :func:`readiness` reads the median and the 90th
percentile of those from the last :data:`WINDOW`, and :func:`ready_etas` adds them to an
``eta``. With fewer than :data:`MIN_SAMPLES` recent samples a pool has no estimate (None), rather
than one made up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

KEPT_SAMPLES = 50  # per pool: enough for a stable p90, few enough for one small document
WINDOW = timedelta(days=7)  # older samples describe another season of Google's queue
MIN_SAMPLES = 3  # below this a median is one request's luck, not the pool's behaviour


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadySample:
    """One admitted request that became ACTIVE: when (``at``) and after how long (``took``,
    admission → ACTIVE)."""

    request_id: str
    at: datetime
    took: timedelta

    def __post_init__(self) -> None:
        if self.took < timedelta(0):
            raise ValueError(f"{self.request_id}: admission → ACTIVE cannot be negative")


@dataclass(frozen=True, slots=True, kw_only=True)
class Readiness:
    """A pool's recent admission → ACTIVE times: median, 90th percentile, and how many
    samples they come from."""

    median: timedelta
    p90: timedelta
    samples: int


def samples_after(
    current: Sequence[ReadySample], *samples: ReadySample, limit: int = KEPT_SAMPLES
) -> tuple[ReadySample, ...] | None:
    """The samples a pool keeps once ``samples`` are recorded (a rule every store applies):
    the newest ``limit`` by ``at``, one per request (the first recorded of a request stays).
    None when there is nothing to write (every request is already recorded: a repeated
    pass)."""
    seen = {kept.request_id for kept in current}
    new: list[ReadySample] = []
    for sample in samples:
        if sample.request_id not in seen:
            seen.add(sample.request_id)
            new.append(sample)
    if not new:
        return None
    ordered = sorted((*current, *new), key=lambda kept: (kept.at, kept.request_id))
    return tuple(ordered[-limit:])


def readiness(
    samples: Iterable[ReadySample], now: datetime, window: timedelta = WINDOW
) -> Readiness | None:
    """The median and 90th percentile (nearest rank) of the samples taken in ``window`` before
    ``now``; None below :data:`MIN_SAMPLES` of them."""
    took = sorted(sample.took for sample in samples if now - window <= sample.at <= now)
    if len(took) < MIN_SAMPLES:
        return None
    return Readiness(median=_rank(took, 0.5), p90=_rank(took, 0.9), samples=len(took))


def readiness_by_pool(
    samples: Mapping[str, Iterable[ReadySample]], now: datetime
) -> dict[str, Readiness | None]:
    """:func:`readiness` of each pool's samples, by pool id."""
    return {pool: readiness(kept, now) for pool, kept in samples.items()}


def ready_etas(
    eta: datetime | None, known: Readiness | None, *, reserved: bool = False
) -> tuple[datetime | None, datetime | None]:
    """``(ready_eta, ready_eta_p90)``: when an order admitted at ``eta`` is expected to run,
    at the pool's median and its 90th percentile; (None, None) without an eta or an
    estimate. A ``reserved`` one (a calendar block: its capacity is Google's reservation from
    its start) is ready at ``eta``."""
    if eta is None:
        return None, None
    if reserved:
        return eta, eta
    if known is None:
        return None, None
    return eta + known.median, eta + known.p90


def expected_wait(known: Readiness | None) -> timedelta:
    """How long an order just admitted in a pool is planned to wait in Google's queue: the
    pool's recent 90th percentile (nine in ten were served sooner); zero without an
    estimate."""
    return timedelta(0) if known is None else known.p90


def _rank(ordered: Sequence[timedelta], share: float) -> timedelta:
    """The nearest-rank percentile of ``ordered`` (sorted, not empty): the smallest value with
    at least ``share`` of the values at or below it."""
    return ordered[max(math.ceil(share * len(ordered)) - 1, 0)]
