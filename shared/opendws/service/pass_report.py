"""What one reconcile pass did (:class:`PassReport`), as :meth:`ReconcileService.run_pass
<opendws.service.reconcile.ReconcileService.run_pass>` returns it and as the reconcile function
logs it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from opendws.domain.states import RequestState
from opendws.domain.sweep import Call


class PassOutcome(StrEnum):
    """How a pass ended."""

    SKIPPED = "SKIPPED"  # another reconciler holds the lease: nothing was done
    COMPLETED = "COMPLETED"  # the whole cycle ran
    FENCED = "FENCED"  # the lease was lost mid-pass; the rest was left to the new holder
    STALE = "STALE"  # stopped early: a record changed under the pass (the next one retries)


@dataclass(slots=True)
class PassReport:
    """What one pass did."""

    outcome: PassOutcome = PassOutcome.SKIPPED
    # (from, to) → how many requests moved so, e.g. (PENDING, PROVISIONING): 3.
    transitions: Counter[tuple[RequestState, RequestState]] = field(default_factory=Counter)
    double_wins: list[str] = field(default_factory=list)  # orders served beside a race's winner
    revisions: int = 0  # same-state updates (new ETA, reason, attempt)
    provisioned: list[str] = field(default_factory=list)  # order names whose creation was asked
    reserved: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)  # owned resources no live request wanted
    # Released or ended calendar blocks Google keeps (and bills) to their end: left alone.
    kept: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # provider calls that failed (retried later)
    # Provider calls the pass's time ran out for: written, not made (the next pass makes them).
    deferred: list[str] = field(default_factory=list)
    # The pass's time ran out before it had carried out all of its plan (the rest is the next
    # pass's, which it asks for at once).
    cut_short: bool = False
    skipped: list[str] = field(default_factory=list)  # changed by others meanwhile (next pass)
    # Requests left PROVISIONING or under Google's review: a pass soon will see them through.
    in_flight: int = 0
    published: int = 0
    observed_pools: int = 0  # pools whose resources were listed (see observe_all_every)
    observed_all: bool = False  # every configured pool was
    # Another pass was asked for while this one held the lease: the caller runs one more.
    again: bool = False
    # The plan's earliest held start: a pass then admits it on time (an ETA that moved by
    # less than eta_tolerance is not announced, so the records' ETAs may say later).
    next_start: datetime | None = None

    @property
    def ran(self) -> bool:
        """False when another reconciler held the lease."""
        return self.outcome is not PassOutcome.SKIPPED

    @property
    def fenced(self) -> bool:
        """True when the lease was lost mid-pass."""
        return self.outcome is PassOutcome.FENCED

    @property
    def stale(self) -> bool:
        """True when the pass stopped early on a stale view (fenced, or a conflict)."""
        return self.outcome in (PassOutcome.FENCED, PassOutcome.STALE)

    def transition_counts(self) -> dict[str, int]:
        """The transitions as ``{"PENDING→PROVISIONING": n}``, for logs and JSON."""
        return {f"{source}→{target}": n for (source, target), n in self.transitions.items()}

    def calls(self, call: Call) -> list[str]:
        """The order names for which a ``call`` was made this pass."""
        match call:
            case Call.PROVISION:
                return self.provisioned
            case Call.RESERVE:
                return self.reserved
            case Call.RELEASE:
                return self.released
