"""Google's rules for calendar-mode future reservations, in one place: how far ahead a block may
start, how many units one request may reserve, and when a submitted block may still be
cancelled. Admission, the services, the memory fake and the simulated cloud all read them from
here, so the rule the user is told is the rule the cloud enforces.

Sources (compute/docs/instances/future-reservations-calendar-mode-overview,
create-future-reservations-calendar-mode, delete-future-reservations-calendar-mode;
tpu/docs/calendar-mode-reservation):

- a block lasts 1 to 90 days;
- availability is visible, and a block may start, up to 60 days ahead for GPU VMs and up to
  120 days ahead for TPUs; the TPU page says "1 to 120 days in advance" (a TPU block starts at
  least a day ahead); no minimum lead is documented for GPU VMs;
- a GPU request reserves 1 to 80 VMs; a TPU request 1, 4, 8, 16, 32, 64, 128, 256, 512 or
  1,024 chips;
- cancellation (the newest Compute page): only while the start is more than 30 days away, or
  within 24 hours after approval while the start is at least 4 days away; otherwise the block
  is billed in full. Older Compute pages and the TPU page say a submitted request cannot be
  cancelled at all: :class:`CancellationRule` chooses, defaulting to the newest page. A block
  not yet approved is not yet promised to anyone and may be withdrawn (the pages are silent on
  it; the simulated cloud does the same).

Everything here is pure: times are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

GPU_MAX_LEAD = timedelta(days=60)
TPU_MAX_LEAD = timedelta(days=120)
GPU_MIN_LEAD = timedelta(0)
TPU_MIN_LEAD = timedelta(days=1)
GPU_MAX_VMS = 80
TPU_CHIP_COUNTS = (1, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

CANCEL_FAR_AHEAD = timedelta(days=30)  # cancellable while the start is more than this away
CANCEL_AFTER_APPROVAL = timedelta(hours=24)  # ... or this long after approval
CANCEL_GRACE_LEAD = timedelta(days=4)  # ... while the start is at least this far away


class CancellationRule(StrEnum):
    """Which of Google's pages a submitted calendar block is cancelled by."""

    # compute/docs/instances/delete-future-reservations-calendar-mode (the newest page).
    WINDOWS = "windows"
    # Older Compute pages and tpu/docs/calendar-mode-reservation: never, once submitted.
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class Lead:
    """How far ahead a block of one kind may start."""

    earliest: timedelta
    latest: timedelta


def lead_of(tpu: bool) -> Lead:
    """The start window of a GPU (``tpu`` False) or TPU block, from its submission."""
    return Lead(TPU_MIN_LEAD, TPU_MAX_LEAD) if tpu else Lead(GPU_MIN_LEAD, GPU_MAX_LEAD)


def count_problem(tpu: bool, units: int) -> str | None:
    """Why one calendar request may not reserve ``units`` (VMs, or TPU chips); None if it may."""
    if tpu:
        if units not in TPU_CHIP_COUNTS:
            allowed = ", ".join(str(count) for count in TPU_CHIP_COUNTS)
            return f"a TPU calendar block reserves {allowed} chips; {units} is not one of them"
        return None
    if not 1 <= units <= GPU_MAX_VMS:
        return f"a GPU calendar block reserves 1 to {GPU_MAX_VMS} VMs; {units} asked"
    return None


def may_cancel(
    rule: CancellationRule, *, start: datetime, approved_at: datetime | None, now: datetime
) -> bool:
    """Whether a submitted block starting at ``start`` may be cancelled at ``now``
    (``approved_at`` None: not approved yet)."""
    if approved_at is None:
        return True
    if rule is CancellationRule.NEVER:
        return False
    if start - now > CANCEL_FAR_AHEAD:
        return True
    return now - approved_at <= CANCEL_AFTER_APPROVAL and start - now >= CANCEL_GRACE_LEAD


def cancel_deadline(
    rule: CancellationRule, *, start: datetime, approved_at: datetime
) -> datetime | None:
    """The last instant an approved block may be cancelled (None: it never could)."""
    if rule is CancellationRule.NEVER:
        return None
    # Cancellable while start - now > 30 days, i.e. until just before start - 30 days...
    far = start - CANCEL_FAR_AHEAD - timedelta(microseconds=1)
    # ... or while now <= approval + 24 h and start - now >= 4 days.
    grace = min(approved_at + CANCEL_AFTER_APPROVAL, start - CANCEL_GRACE_LEAD)
    latest = max(far, grace)
    return latest if latest >= approved_at else None


def why_not_cancellable(
    rule: CancellationRule, *, start: datetime, end: datetime, approved_at: datetime,
    now: datetime, cost: float | None,
) -> str:  # fmt: skip
    """The message for a cancel Google would refuse: which rule, when the block ends, what it
    costs, and that releasing its VMs early does not stop the charge."""
    if rule is CancellationRule.NEVER:
        why = "Google Cloud does not allow a submitted calendar block to be cancelled"
    else:
        why = (
            f"Google Cloud allows a calendar block to be cancelled only while its start is more "
            f"than {CANCEL_FAR_AHEAD.days} days away, or within "
            f"{CANCEL_AFTER_APPROVAL // timedelta(hours=1)} hours of its approval while its "
            f"start is at least {CANCEL_GRACE_LEAD.days} days away; this one was approved at "
            f"{approved_at.isoformat()} and starts at {start.isoformat()}"
        )
    charge = f", {cost:,.2f} in all" if cost is not None else ""
    return (
        f"{why}. It is billed in full from {start.isoformat()} to {end.isoformat()}{charge}; "
        "releasing its VMs early does not stop the charge"
    )
