"""The reconciler's knobs (:class:`ReconcileSettings`) and how a pass shares its time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from opendws.domain.sweep import SweepSettings
from opendws.service.cloud_calls import CallLimits


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconcileSettings:
    """Knobs of the reconciler. There is no provisioning timeout: an order waits in Google's
    queue until the request's own max_wait, since cancelling it to ask elsewhere would give up
    its place (Google serves first come first served); racing several pools is the way to
    take whichever Google serves first."""

    lease_ttl: timedelta = timedelta(minutes=2)  # a crashed holder blocks others this long
    # A pool whose orders wait with a stockout in Google's last attempt is short: nothing new
    # starts there until this long after the last pass that saw it so.
    stockout_cooldown: timedelta = timedelta(minutes=10)
    overdue_grace: timedelta = timedelta(minutes=1)  # the sweep ends runs this long past due
    eta_tolerance: timedelta = timedelta(minutes=5)  # smaller ETA moves are not announced
    renew_every: int = 50  # writes between lease renewals within a long pass
    # The old cancel-and-retry: give up on orders Google has not served after this long and
    # try the request's other pools. None (the default) waits until max_wait, keeping the
    # place in Google's queue; bench/obtain.py compares the two.
    give_up_after: timedelta | None = None
    # A create call the cloud kept refusing this long after admission drops that order.
    not_taken_after: timedelta = timedelta(minutes=15)
    # A pass observes the pools where something may have changed: those with a live order,
    # those where a request ended since the last pass or a release was asked, and those
    # where the last look found something no live request wanted. Every pool is observed on
    # an instance's first pass and then at least this often, so that a resource left behind
    # where nothing points (a release Google accepted and then failed) is still found.
    # timedelta(0): every pool, every pass.
    observe_all_every: timedelta = timedelta(minutes=5)
    # What Google took to serve each pool's orders (pool_status samples, what ready_eta and
    # a pool's serve wait are learned from) is read again at least this often; in between an
    # instance keeps the samples it read and those it recorded. timedelta(0): every pass.
    readiness_every: timedelta = timedelta(minutes=5)
    # A pass's cloud calls run in a pool (service.cloud_calls): this many at once, and no more
    # than this many started per minute (None: no budget). Compute Engine's rate quotas are
    # per project and per minute (https://cloud.google.com/compute/api-quota); a call refused
    # all the same pauses the pool until the quota refills.
    cloud_calls_in_flight: int = 8
    cloud_calls_per_minute: int | None = 1200
    # How long a pass may run: once this much has passed it carries out no more of its plan,
    # gathers its calls and ends, asking for the next pass at once (the coalesced "again"), so
    # the first requests of a burst go on without waiting for the last. At most half the
    # lease's TTL (see budget).
    pass_budget: timedelta = timedelta(seconds=10)

    @property
    def budget(self) -> timedelta:
        """A pass's time: ``pass_budget``, and never more than half the lease's TTL (the
        lease is renewed every ``renew_every`` writes, but a pass must not live on renewals).
        A lease of no time at all (passes that overlap on purpose) leaves ``pass_budget``."""
        if self.lease_ttl <= timedelta(0):
            return self.pass_budget
        return min(self.pass_budget, self.lease_ttl / 2)

    @property
    def call_limits(self) -> CallLimits:
        return CallLimits(
            in_flight=self.cloud_calls_in_flight, per_minute=self.cloud_calls_per_minute
        )

    @property
    def sweep(self) -> SweepSettings:
        return SweepSettings(
            grace=self.overdue_grace, not_taken_after=self.not_taken_after,
            give_up_after=self.give_up_after,
        )  # fmt: skip


# The share of a pass's time (ReconcileSettings.budget) for carrying out its plan; the rest is
# for gathering the calls it submitted.
APPLY_SHARE = 0.75
# The share of it for the sweep: a burst's requests going ACTIVE share each pass with those
# being admitted, rather than one pass sweeping hundreds before it admits any.
SWEEP_SHARE = 0.5

# Threads a pass publishes its events and sets its timers on (each request's in order).
ORDERED_THREADS = 4
