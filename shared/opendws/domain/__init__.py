"""The pure core of opendws: model, life cycle, timeline, quotas, policy and admission.

Nothing in this package performs I/O, reads a clock, draws random numbers or makes ids; it
imports only the standard library and numpy.
"""

from opendws.domain.admission import admit
from opendws.domain.model import (
    CapacityRequest,
    GangShape,
    Grant,
    InvalidModel,
    Mode,
    PolicySettings,
    Pool,
    Provider,
    QueueingStrategy,
    Quota,
    Snapshot,
    Tenant,
)
from opendws.domain.planner.verdicts import Alternative, Decision, Outcome, Plan, Reason
from opendws.domain.run import EndsWhen, RunSpec
from opendws.domain.states import IllegalTransition, RequestState, transition

__all__ = [
    "Alternative",
    "CapacityRequest",
    "Decision",
    "EndsWhen",
    "GangShape",
    "Grant",
    "IllegalTransition",
    "InvalidModel",
    "Mode",
    "Outcome",
    "Plan",
    "PolicySettings",
    "Pool",
    "Provider",
    "QueueingStrategy",
    "Quota",
    "Reason",
    "RequestState",
    "RunSpec",
    "Snapshot",
    "Tenant",
    "admit",
    "transition",
]
