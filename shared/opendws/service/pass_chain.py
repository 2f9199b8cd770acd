"""What a reconciler keeps between its passes, and when it may trust it (:class:`PassChain`).

A :class:`~opendws.service.reconcile.ReconcileService` runs one pass at a time, so what it keeps
is read and written by one pass at a time: no lock guards it. Threads of a pass's own (its cloud
calls, :mod:`opendws.service.cloud_calls`; its events and timers, :mod:`opendws.service.ordered`)
touch none of it: they call the providers, the bus, the outbox cursor and Cloud Tasks, and
hand their outcomes back to the pass's thread, which gathers them.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from opendws.domain.model import Grant, PolicySettings, Pool
from opendws.domain.planner.incremental.planner import IncrementalPlanner
from opendws.domain.readiness import ReadySample
from opendws.ports import Observed, RequestRecord, Sighting
from opendws.service.mirror import RequestMirror
from opendws.service.parts import SnapshotParts

# What one live request's sweep reads besides the time: its record's version and, per lane,
# whether its pool is configured and what was observed of its order.
SweepInputs = tuple[int, tuple[tuple[bool, Observed | None], ...]]


@dataclass(frozen=True, slots=True)
class PassChain:
    """What one pass left the next so that, right after it, the next looks again only at
    what changed. A pass takes the chain when it starts (leaving it broken) and leaves a new
    one only when it ends having planned: any break — a cold instance, a pass that raised or
    stopped before planning, another look at the providers in between, a plan no pass
    carried out, another policy — makes the next pass look at everything once (README, "Between
    two passes that follow each other unbroken"). :class:`Kept` says which caches rest on it.
    """

    # The providers' look after which the sweep ran to its end, and the pools configured then
    # (None: it did not run to its end).
    look: int | None = None
    configured: frozenset[str] = frozenset()
    # The planner's plan number whose decisions the pass looked at and whose held slots it
    # kept, under which policy (None: the pass did not end).
    plans: int | None = None
    policy: PolicySettings | None = None
    due: frozenset[str] = frozenset()  # the decisions found due (carried out or not)
    # Waiting decisions whose news may come with the clock alone (a later ETA, told within the
    # commitment horizon once the clock brings it there).
    watched: frozenset[str] = frozenset()

    def sweep_follows(self, look: int, configured: frozenset[str]) -> bool:
        """Whether the last sweep ran to its end right after the look before ``look``, with
        the same pools ``configured``: then only the quiet requests the mirror, the look or
        the clock names can have news."""
        return self.look is not None and (self.look, self.configured) == (look - 1, configured)

    def plan_follows(self, plans: int, policy: PolicySettings) -> bool:
        """Whether the last pass looked at the planner's plan before plan number ``plans``
        under the same ``policy`` (the same object: the configuration was not read anew with
        another): then only the decisions the planner set anew, those whose record changed
        and ``due`` and ``watched`` can have news, and the held slots move only where the
        planner set a decision anew."""
        return self.plans == plans - 1 and self.policy is policy


BROKEN = PassChain()  # what a cold instance has, and what a pass leaves until it ends


@dataclass(frozen=True, slots=True)
class Quiet:
    """A live request whose last sweep did nothing: what that sweep read besides the time,
    and until when it stays so. Its lanes' pools and order names are kept with it, so a
    pass that finds the record at the same version (so with the same lanes) checks what was
    observed of each order without naming the orders again."""

    inputs: SweepInputs
    until: datetime | None  # the first instant its sweep may differ (None: never, by time)
    pools: tuple[str, ...]  # per lane, its pool
    names: tuple[str, ...]  # per order the record has, its name

    def holds(self, sightings: Sequence[Sighting | None], pools: Mapping[str, Pool]) -> bool:
        """Whether a sweep that sees ``sightings`` (per order, as ``names``) with ``pools``
        configured reads what the quiet one read (its record's version is checked apart)."""
        pools_of, count = self.pools, len(sightings)
        for index, (configured, observed) in enumerate(self.inputs[1]):
            if configured is not (pools_of[index] in pools):
                return False
            sighting = sightings[index] if index < count else None
            seen = None if sighting is None else sighting.observed
            # The same report object, most passes: no fields to compare.
            if observed is not seen and observed != seen:
                return False
        return True


class QuietRequests:
    """The live requests whose last sweep did nothing (:class:`Quiet`, by request id), indexed
    by their order names and their steady times so that a pass after an unbroken chain finds
    those to sweep again without a look at every one (:meth:`again`). An index entry whose
    request is no longer quiet, or quiet otherwise, only names a request to check once more;
    the indexes are rebuilt once such entries outgrow them."""

    def __init__(self) -> None:
        self._quiet: dict[str, Quiet] = {}
        self._names: dict[str, str] = {}  # a quiet order's name → its request
        self._until: list[tuple[datetime, str]] = []  # (steady time, request): a heap

    def get(self, request_id: str) -> Quiet | None:
        return self._quiet.get(request_id)

    def note(self, request_id: str, quiet: Quiet) -> None:
        """``request_id``'s last sweep did nothing: keep what it read, and index it."""
        self._quiet[request_id] = quiet
        names, due = self._names, self._until
        for name in quiet.names:
            names[name] = request_id
        if quiet.until is not None:
            heapq.heappush(due, (quiet.until, request_id))
        limit = 4 * len(self._quiet) + 64
        if len(names) > limit:
            self._names = {n: key for key, q in self._quiet.items() for n in q.names}
        if len(due) > limit:
            self._until = [(q.until, key) for key, q in self._quiet.items() if q.until]
            heapq.heapify(self._until)

    def drop(self, request_id: str) -> None:
        """``request_id``'s last sweep did something: it is not quiet."""
        self._quiet.pop(request_id, None)

    def forget_gone(self, records: Mapping[str, RequestRecord]) -> None:
        """Drop the requests no longer live, now and then (see :func:`forget_gone`)."""
        forget_gone(self._quiet, records)

    def again(self, changed: set[str], looked_changed: set[str], now: datetime) -> set[str]:
        """The quiet requests to sweep again after an unbroken chain: those whose record
        changed (``changed``, taken into the answer), those with an order the providers' look
        saw change (``looked_changed``: order names) and those whose steady time came by
        ``now``."""
        names = self._names
        changed.update(names[name] for name in looked_changed if name in names)
        due = self._until
        while due and due[0][0] <= now:
            changed.add(heapq.heappop(due)[1])
        return changed

    def __len__(self) -> int:
        return len(self._quiet)


class WatchedPools:
    """The pools a pass observes although no live order is there — a request ended there, a
    release was asked there, or the last look there found something no live request wanted —
    and when a pass last observed every configured pool (None: never yet, on this instance)."""

    def __init__(self) -> None:
        self.pools: set[str] = set()
        self.all_at: datetime | None = None

    def whole(self, now: datetime, every: timedelta) -> bool:
        """Whether a pass at ``now`` observes every configured pool: on an instance's first
        pass, and once ``every`` has passed since the last such pass."""
        return self.all_at is None or now - self.all_at >= every

    def after_look(
        self, looked: set[str], dirty: set[str], released_in: set[str], whole: bool,
        configured: set[str], now: datetime,
    ) -> None:  # fmt: skip
        """After the sweep: a pool ``looked`` at and found clean leaves the watch, unless the
        pass asked for a release there (``released_in``); one with something no live request
        wanted (``dirty``) stays. A ``whole`` look forgets pools no longer ``configured``."""
        watched = self.pools
        watched -= looked - dirty - released_in
        watched |= dirty
        if whole:
            watched &= configured
            self.all_at = now


class Kept:
    """What a reconciler keeps between its passes (one pass at a time reads and writes it).

    Each cache, and when it is trusted:

    - the mirror of the requests not yet final (:class:`~opendws.service.mirror.RequestMirror`):
      always; it is a view brought up to date by a watermark read each pass, and every write
      is fenced and guarded by the record's version. It tells each reader (the sweep, the
      snapshot's parts, the look at the plan) which requests changed since that reader's last
      look, or that any may have;
    - the planner (:class:`~opendws.domain.planner.incremental.planner.IncrementalPlanner`):
      always; it plans from its last pass only what the snapshot's changes reach, and in full
      otherwise;
    - the snapshot's parts (:class:`~opendws.service.parts.SnapshotParts`): each request's
      until the mirror names it changed; all of them after a read of everything;
    - the grants of live runs and blocks (``grants``): per request, while its record's version
      is the one the grant was built from (one that moves with the clock, while its span does);
    - the quiet requests (:class:`QuietRequests`): each while its record's version and what its
      sweep reads are those its last sweep read, and its steady time has not come. Their indexes
      (by order name, by steady time) name the only ones a pass needs to check only while the
      chain's sweep link holds (:meth:`PassChain.sweep_follows`);
    - the held slots of the last plan (``held``): always as the slots the planner is held to
      (a cold instance: the ETAs told); worked out from the planner's changes alone only while
      the plan link holds (:meth:`PassChain.plan_follows`), else read from every decision;
    - the decisions found due or watched (the chain's ``due`` and ``watched``): only while the
      plan link holds;
    - the serve wait each pool was planned with (``serve_waits``): the last pass's, for the
      clause of a later ETA only;
    - the pools' ready samples (``samples``): for ``readiness_every`` after they were read,
      with those this instance recorded since;
    - the pools to observe although no live order is there (:class:`WatchedPools`): until a
      look finds them clean, and every pool once ``observe_all_every`` has passed;
    - the chain (``chain``, :class:`PassChain`): taken by each pass, left again by one that ends.
    """

    def __init__(self) -> None:
        self.mirror = RequestMirror()
        self.planner = IncrementalPlanner()
        self.parts = SnapshotParts()
        # request id → (record version, grant, whether it may move with the clock).
        self.grants: dict[str, tuple[int, Grant, bool]] = {}
        self.quiet = QuietRequests()
        # request id → (pool, start) of the last plan's held slots: with commitments on, the
        # slot a request holds, which may be earlier than the ETA it was told (a move under
        # eta_tolerance is not announced). A cold instance starts from the announced ones.
        self.held: dict[str, tuple[str, datetime]] = {}
        self.chain = BROKEN
        self.serve_waits: dict[str, timedelta] = {}  # per pool
        # (when read, every pool's ready samples), with those recorded since.
        self.samples: tuple[datetime, dict[str, tuple[ReadySample, ...]]] | None = None
        self.watched = WatchedPools()


def forget_gone(cache: dict[str, Any], records: Mapping[str, RequestRecord]) -> None:
    """Drop the entries of requests no longer live from a per-request cache once it holds
    more than twice as many entries as there are live requests, plus 64 (an entry is checked
    against its record's version before use, so a stale one only takes room; sweeping it
    every pass would cost every pass a look at every live request)."""
    if len(cache) > 2 * len(records) + 64:
        for request_id in [key for key in cache if key not in records]:
            del cache[request_id]
