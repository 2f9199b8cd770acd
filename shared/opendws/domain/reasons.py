"""Reasons shared by several sources, each defined once.

Each source of events has its own reason type — the admission core
(:class:`opendws.domain.planner.verdicts.Reason`), the sweep
(:class:`opendws.domain.sweep.SweepReason`), the reconciler (``ReconcileReason``), the end
service (``EndReason``) — and a name belongs to exactly one of them. The exception is a
request ending because one of its own times passed: whoever notices first (the admission core,
the sweep, or a timer) says the same thing, so that name is defined here once and every source
uses it.
"""

from __future__ import annotations

from enum import StrEnum


class Expiry(StrEnum):
    """A request's own time passed."""

    MAX_WAIT_PASSED = "MAX_WAIT_PASSED"  # a flex request's max_wait passed before it ran
    RUN_TIME_UP = "RUN_TIME_UP"  # its run time is up
