"""Ports: what the services need from the outside world, as narrow Protocols, and the records
that cross them.

- :mod:`~opendws.ports.records` — requests, events, usage, the lease's fence, and the rules of
  every store write (one pure function each);
- :mod:`~opendws.ports.store` — the store as narrow ports (requests, outbox, lease, pool
  status, usage ledger);
- :mod:`~opendws.ports.configuration` — what operators configure, and where it lives;
- :mod:`~opendws.ports.cloud` — orders, observations and the capacity providers;
- :mod:`~opendws.ports.timers` — timers and the clock;
- :mod:`~opendws.ports.topics` — request topics and who they speak for, publishers, the
  event bus.

Adapters implement these for Google Cloud (``opendws.adapters``) and in memory (fakes for fast
tests); one contract suite per port runs on both, so a fake cannot drift from the real thing.
Everything is importable from ``opendws.ports`` itself.
"""

from opendws.domain.provisioning import Lane, ProvisionPhase
from opendws.ports.cloud import (
    ORDER_PREFIX,
    Advised,
    BlockProvider,
    CalendarBlocks,
    CapacityProvider,
    Observed,
    Order,
    Providers,
    Sighting,
    Withdrawal,
    order_name,
)
from opendws.ports.configuration import CiMapping, ConfigStore, Configuration, Price
from opendws.ports.records import (
    EVENT_SCHEMA,
    LEASE_FREE,
    Change,
    CreateOutcome,
    Fence,
    Fenced,
    RequestRecord,
    StaleWrite,
    StatusEvent,
    UnknownRequest,
    UsageEntry,
    accepted,
    check_fence,
    content_digest,
    cooldown_after,
    hold_end,
    lanes_after,
    lanes_from_document,
    lanes_to_document,
    lease_released,
    next_lease,
    request_from_document,
    request_to_document,
    submitted,
)
from opendws.ports.store import (
    AnnouncedRequests,
    Outbox,
    PoolStatus,
    ReconcilerLease,
    ReconcilerStore,
    Requests,
    RequestStore,
    UsageLedger,
)
from opendws.ports.timers import TIMER_HORIZON, Clock, Timer, TimerKind, TimerQueue
from opendws.ports.topics import (
    ADMIN_REQUESTS_TOPIC,
    EVENTS_TOPIC,
    SHARED_REQUESTS_TOPIC,
    TENANT_REQUESTS_PREFIX,
    EventBus,
    Identity,
    Nudger,
    RequestPublisher,
    Speaker,
    event_filter,
    identity_of_topic,
    passes_event_filter,
    requests_topic,
    topic_of_source,
)

__all__ = [
    "ADMIN_REQUESTS_TOPIC",
    "EVENTS_TOPIC",
    "EVENT_SCHEMA",
    "LEASE_FREE",
    "ORDER_PREFIX",
    "SHARED_REQUESTS_TOPIC",
    "TENANT_REQUESTS_PREFIX",
    "TIMER_HORIZON",
    "Advised",
    "AnnouncedRequests",
    "BlockProvider",
    "CalendarBlocks",
    "CapacityProvider",
    "Change",
    "CiMapping",
    "Clock",
    "ConfigStore",
    "Configuration",
    "CreateOutcome",
    "EventBus",
    "Fence",
    "Fenced",
    "Identity",
    "Lane",
    "Nudger",
    "Observed",
    "Order",
    "Outbox",
    "PoolStatus",
    "Price",
    "Providers",
    "ProvisionPhase",
    "ReconcilerLease",
    "ReconcilerStore",
    "RequestPublisher",
    "RequestRecord",
    "RequestStore",
    "Requests",
    "Sighting",
    "Speaker",
    "StaleWrite",
    "StatusEvent",
    "Timer",
    "TimerKind",
    "TimerQueue",
    "UnknownRequest",
    "UsageEntry",
    "UsageLedger",
    "Withdrawal",
    "accepted",
    "check_fence",
    "content_digest",
    "cooldown_after",
    "event_filter",
    "hold_end",
    "identity_of_topic",
    "lanes_after",
    "lanes_from_document",
    "lanes_to_document",
    "lease_released",
    "next_lease",
    "order_name",
    "passes_event_filter",
    "request_from_document",
    "request_to_document",
    "requests_topic",
    "submitted",
    "topic_of_source",
]
