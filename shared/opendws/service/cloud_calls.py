"""The cloud calls of reconcile passes, carried out concurrently: a bounded number in flight, a
budget of calls per minute, and a pause for the whole pool when the cloud says its rate quota is
spent.

A pass writes each record first, on its own thread (fenced), and only then submits the calls
that write licenses, as one *chain* per request: a request's calls run one after the other, in
the order its step lists them, while the chains of different requests run side by side. The
pass then gathers the outcomes on its own thread (reports and logs are written there), waiting
at most until its deadline. A chain not started by then is cancelled and one that runs out of
time between two calls stops there: the record says what the calls were for, so the next pass
issues them again (every provider call is safe to repeat). A chain still running at the
deadline goes on in the pool and logs its own outcome; the pass does not wait for it.

Rate: Compute Engine counts each project's API calls per group per minute, refilled at the start
of each synchronized minute, and answers a call over the quota with 403 ``rateLimitExceeded``
(https://cloud.google.com/compute/api-quota). The budget keeps this instance's calls under
``per_minute`` in every 60-second window (so in every synchronized minute too); a call the cloud
refuses all the same (:class:`~opendws.ports.CloudRateLimited`: other callers share the quota)
pauses every call of the pool until the cloud's ``retry_after``, or else the next minute's
start, and is then made again. A provider call counts once, whatever number of API requests it
makes (a release makes several), so the budget is a pace, not an exact count: the pause is what
holds under the quota.
"""

from __future__ import annotations

import contextvars
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field

from opendws.ports import CloudRateLimited

log = logging.getLogger(__name__)

MINUTE = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CallLimits:
    """How many cloud calls run at once, and how many start per minute (None: no budget)."""

    in_flight: int = 8
    per_minute: int | None = 1200

    def __post_init__(self) -> None:
        if self.in_flight < 1:
            raise ValueError(
                f"at least one cloud call must be allowed in flight, not {self.in_flight}"
            )
        if self.per_minute is not None and self.per_minute < 1:
            raise ValueError(f"the calls-per-minute budget must be positive, not {self.per_minute}")


class OutOfTime(RuntimeError):
    """A call not made: the pass's time ran out before it could start (the next pass makes
    it)."""


@dataclass(frozen=True, slots=True)
class Call:
    """One provider call of a chain: what it is (for the report and the log) and the work."""

    label: object  # the caller's own description, handed back with the outcome
    work: Callable[[], object]


@dataclass(slots=True)
class Outcome:
    """How one call of a chain went: made (``error`` None), failed (the error), or not made
    (``error`` is :class:`OutOfTime`, or the chain was cancelled)."""

    label: object
    error: Exception | None = None


@dataclass(slots=True)
class _Chain:
    calls: Sequence[Call]
    future: Future[list[Outcome]] = field(init=False)


class CloudCalls:
    """The pool of one process's cloud calls, shared by its passes (one owner of the pace and
    of a pause the cloud asked for). ``now`` and ``sleep`` measure and wait in seconds."""

    def __init__(
        self, limits: CallLimits | None = None, *,
        now: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
    ) -> None:  # fmt: skip
        self.limits = limits or CallLimits()
        self._now = now
        self._sleep = sleep
        self._pool = ThreadPoolExecutor(self.limits.in_flight, thread_name_prefix="cloud-call")
        self._lock = threading.Lock()
        self._started: deque[float] = deque()  # start times within the last minute
        self._paused_until = 0.0

    def batch(self, deadline: float) -> CallBatch:
        """A pass's calls, which it gathers by ``deadline`` (on ``now``'s scale)."""
        return CallBatch(self, deadline)

    def quota_refilled(self, deadline: float) -> bool:
        """Wait out a pause the cloud asked for (its quota refills) before a call made
        outside the pool (a pass's look at the providers); False, at once, if the pause lasts
        past ``deadline``."""
        with self._lock:
            wait = self._paused_until - self._now()
        if wait <= 0:
            return True
        if self._now() + wait > deadline:
            return False
        self._sleep(wait)
        return True

    def refused(self, refusal: CloudRateLimited) -> None:
        """A call made outside the pool was refused for the rate quota: pause the pool too."""
        self._pause(refusal)

    # Run in the pool ----------------------------------------------------------------------

    def _run(self, calls: Sequence[Call], deadline: float) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for index, call in enumerate(calls):
            outcome = self._one(call, deadline)
            outcomes.append(outcome)
            if isinstance(outcome.error, OutOfTime):
                # The rest waits for the next pass too: a chain's calls go in order.
                outcomes.extend(Outcome(later.label, outcome.error) for later in calls[index + 1 :])
                break
        return outcomes

    def _one(self, call: Call, deadline: float) -> Outcome:
        while True:
            if not self._permit(deadline):
                return Outcome(call.label, OutOfTime("the pass's time ran out before the call"))
            try:
                call.work()
            except CloudRateLimited as refused:
                self._pause(refused)
                continue  # made again once the pause is over, if time allows
            except Exception as error:
                return Outcome(call.label, error)
            return Outcome(call.label)

    def _permit(self, deadline: float) -> bool:
        """Wait until a call may start (no pause, under the budget); False if that would be
        after ``deadline``."""
        while True:
            with self._lock:
                now = self._now()
                wait = self._paused_until - now
                budget = self.limits.per_minute
                if wait <= 0 and budget is not None:
                    started = self._started
                    while started and started[0] <= now - MINUTE:
                        started.popleft()
                    if len(started) >= budget:
                        wait = started[0] + MINUTE - now
                if wait <= 0:
                    if budget is not None:
                        self._started.append(now)
                    return True
            if now + wait > deadline:
                return False
            self._sleep(wait)

    def _pause(self, refused: CloudRateLimited) -> None:
        """Hold every call of the pool until the cloud's quota refills."""
        with self._lock:
            now = self._now()
            if refused.retry_after is not None:
                until = now + refused.retry_after.total_seconds()
            else:
                # Compute refills each group at the start of the next synchronized minute; this
                # clock is not the wall's, so wait a whole minute at most.
                wall = time.time()
                until = now + (math.floor(wall / MINUTE) + 1) * MINUTE - wall
            if until > self._paused_until:
                self._paused_until = until
                log.warning(
                    "the cloud's rate quota is spent (%s): cloud calls paused for %.0f s",
                    refused, until - now,
                )  # fmt: skip


class CallBatch:
    """The chains one pass submitted, gathered on its own thread (see the module docstring)."""

    def __init__(self, calls: CloudCalls, deadline: float) -> None:
        self._calls = calls
        self.deadline = deadline
        self._chains: list[_Chain] = []

    def submit(self, calls: Sequence[Call]) -> None:
        """Run ``calls`` one after the other in the pool (nothing if empty)."""
        if not calls:
            return
        chain = _Chain(tuple(calls))
        # In the submitter's context: a call's log lines carry the pass's trace.
        context = contextvars.copy_context()
        chain.future = self._calls._pool.submit(
            context.run, self._calls._run, chain.calls, self.deadline
        )
        self._chains.append(chain)

    def gather(self) -> list[Outcome]:
        """Every call's outcome, in submission order, waiting until the deadline at most: a
        chain not started by then is cancelled (its calls not made), one still running is left
        to finish in the pool (its calls reported as not made here: the next pass sees
        whether they were)."""
        chains, self._chains = self._chains, []
        remaining = max(self.deadline - self._calls._now(), 0.0)
        wait_for([chain.future for chain in chains], timeout=remaining)
        outcomes: list[Outcome] = []
        late = OutOfTime("the pass's time ran out before the call was done")
        for chain in chains:
            future = chain.future
            if future.done() and not future.cancelled():
                outcomes.extend(future.result())
                continue
            if not future.cancel():  # running: it finishes in the pool and logs how it went
                future.add_done_callback(_log_late)
            outcomes.extend(Outcome(call.label, late) for call in chain.calls)
        return outcomes


def _log_late(future: Future[list[Outcome]]) -> None:
    """How a chain that outran its pass went (the pass reported its calls as not made)."""
    for outcome in future.result():
        if outcome.error is None:
            log.info("%s: made after its pass ended", outcome.label)
        else:
            log.warning("%s: failed after its pass ended: %s", outcome.label, outcome.error)
