"""Compute Engine API rate quotas: how many calls of each kind a project may make a minute.

Google's behaviour, as modelled (compute/docs/api-rate-limits, "Compute Engine rate quotas"):
- Rate quotas apply per project, each to a group of methods, counted separately; regional and
  zonal methods are counted per region, global ones apart. The groups modelled are the legacy
  ones the page still lists: writes (``Queries``, ``compute.googleapis.com/default_per_region``:
  the methods that create, modify or delete, and also ``instanceGroupManagers
  .listManagedInstances``), reads (``*.get``), lists (``*.list``), operation reads
  (``zoneOperations.get``, ``globalOperations.get``) and heavy-weight reads (``zoneOperations
  .wait``).
- Google enforces them "at a per-minute interval for each group"; a quota reached at 10:00:15
  "refills at the start of the next synchronized interval, such as 10:01:00": a fixed window
  of each whole minute (here: of the simulated clock).
- A call over the quota gets "a 403 error with the reason rateLimitExceeded", whose message
  reads "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service
  'compute.googleapis.com' for consumer ..." (domain ``usageLimits``; Terraform's provider
  retries exactly that: magic-modules ``mmv1/third_party/terraform/transport/
  error_retry_predicates.go``, ``is403QuotaExceededPerMinuteError``: "GCE ... return[s] a 403
  rather than a 429 on rate limits").
- Default limits: the page's legacy tables gave 1,500 requests a minute for each of the
  Queries, read, list and operation read groups (its current version leaves the values to the
  console). It gives none for heavy-weight reads; they are taken to be the same here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

# The legacy default limit of each group, requests a minute (compute/docs/api-rate-limits).
GOOGLE_DEFAULT_PER_MINUTE = 1500


class CallKind(enum.StrEnum):
    """The quota group a Compute Engine API call counts in."""

    WRITE = "write"
    READ = "read"
    LIST = "list"
    OPERATION_READ = "operation_read"
    OPERATION_WAIT = "operation_wait"


# Each group's quota metric and limit, as Google's message names them.
_NAMES = {
    CallKind.WRITE: ("Queries", "Queries per minute per region"),
    CallKind.READ: ("Read requests", "Read requests per minute per region"),
    CallKind.LIST: ("List requests", "List requests per minute per region"),
    CallKind.OPERATION_READ: (
        "Operation read requests", "Operation read requests per minute per region",
    ),
    CallKind.OPERATION_WAIT: (
        "Heavy-weight read requests", "Heavy-weight read requests per minute per region",
    ),
}  # fmt: skip
_GLOBAL_NAMES = {
    CallKind.WRITE: ("Queries", "Queries per minute"),
    CallKind.READ: ("Read requests", "Read requests per minute"),
    CallKind.LIST: ("List requests", "List requests per minute"),
    CallKind.OPERATION_READ: ("Operation read requests", "Operation read requests per minute"),
    CallKind.OPERATION_WAIT: (
        "Heavy-weight read requests",
        "Heavy-weight read requests per minute",
    ),
}


@dataclass(frozen=True, slots=True)
class RateQuotas:
    """Per-minute limits of each group, per project and region (or global)."""

    writes: int = GOOGLE_DEFAULT_PER_MINUTE
    reads: int = GOOGLE_DEFAULT_PER_MINUTE
    lists: int = GOOGLE_DEFAULT_PER_MINUTE
    operation_reads: int = GOOGLE_DEFAULT_PER_MINUTE
    operation_waits: int = GOOGLE_DEFAULT_PER_MINUTE

    def __post_init__(self) -> None:
        for kind in CallKind:
            value = self.limit(kind)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"a rate quota is a whole number ≥ 0 a minute, not {value!r}")

    @classmethod
    def google_defaults(cls) -> RateQuotas:
        """Google's default limits (the module docstring)."""
        return cls()

    def limit(self, kind: CallKind) -> int:
        return {
            CallKind.WRITE: self.writes,
            CallKind.READ: self.reads,
            CallKind.LIST: self.lists,
            CallKind.OPERATION_READ: self.operation_reads,
            CallKind.OPERATION_WAIT: self.operation_waits,
        }[kind]

    def view(self) -> dict[str, int]:
        return {kind.value: self.limit(kind) for kind in CallKind}

    @classmethod
    def from_view(cls, view: dict[str, object]) -> RateQuotas:
        """The inverse of :meth:`view`; groups left out keep Google's default. ValueError
        names an unknown group."""
        fields = {
            CallKind.WRITE: "writes", CallKind.READ: "reads", CallKind.LIST: "lists",
            CallKind.OPERATION_READ: "operation_reads", CallKind.OPERATION_WAIT: "operation_waits",
        }  # fmt: skip
        unknown = sorted(set(view) - {kind.value for kind in CallKind})
        if unknown:
            known = ", ".join(kind.value for kind in CallKind)
            raise ValueError(f"unknown rate quota group(s) {', '.join(unknown)}; known: {known}")
        return cls(**{fields[CallKind(key)]: value for key, value in view.items()})  # type: ignore[arg-type]


def window(now: datetime) -> datetime:
    """The start of the whole minute ``now`` lies in: Google's synchronized interval."""
    return now.replace(second=0, microsecond=0)


def quota_message(kind: CallKind, location: str, project: str) -> str:
    """Google's message for a call over its group's quota."""
    metric, limit = (_GLOBAL_NAMES if location == "global" else _NAMES)[kind]
    return (
        f"Quota exceeded for quota metric '{metric}' and limit '{limit}' of service "
        f"'compute.googleapis.com' for consumer 'projects/{project}'."
    )
