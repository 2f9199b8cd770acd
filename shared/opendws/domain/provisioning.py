"""Provisioning vocabulary the domain reasons with: where one order's cloud resources are, and
the orders (lanes) a request has open at once while it races several pools."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ProvisionPhase(StrEnum):
    """Where one order's cloud resources are, as the provider observes them."""

    # Calendar: the block was submitted and Google is reviewing it (PENDING_APPROVAL).
    REVIEW = "REVIEW"
    # Calendar: Google approved the block; its capacity is not in its reservation yet (the
    # reservation exists from approval, empty, and is filled from the block's start, possibly
    # up to 24 h later: APPROVED, PROCURING, PROVISIONING).
    APPROVED = "APPROVED"
    # Calendar: the block's reservation holds its capacity (FULFILLED); nothing consumes it yet.
    RESERVED = "RESERVED"
    CREATING = "CREATING"  # the cloud accepted the order and is creating it (no error seen)
    # Queued at Google: the capacity is not there yet (a resize request ACCEPTED with a
    # stockout in status.lastAttempt, a flex VM PENDING, a queued resource
    # WAITING_FOR_RESOURCES). The order keeps its place in Google's queue: it is not a failure.
    WAITING = "WAITING"
    READY = "READY"  # every unit of the gang is running
    FAILED = "FAILED"  # the cloud gave up for good (status.error); the order must be released
    ENDED = "ENDED"  # it ran and is gone (its run duration elapsed, or it was deleted)


@dataclass(frozen=True, slots=True, order=True)
class Lane:
    """One open order of a request: the pool it was offered to and its attempt number (which
    names its cloud resources). A request racing several pools has one lane per pool; attempt
    numbers are never reused, so no two orders of a request ever share a name."""

    pool: str
    attempt: int
