"""Messaging: who a request topic speaks for, and the ports that publish requests, nudges
and events."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from opendws.ports.records import StatusEvent

# Who a request message speaks for is the topic it was published on, never its body: Pub/Sub
# does not tell a subscriber who published a message, but a topic's publisher IAM says who may
# (infra/: each tenant's principals publish on their own topic only).
TENANT_REQUESTS_PREFIX = "capacity-requests-"  # + the tenant: that tenant's own topic
ADMIN_REQUESTS_TOPIC = "capacity-admin-requests"  # the admins'; acts for any tenant
SHARED_REQUESTS_TOPIC = "capacity-requests"  # trusts every publisher; off unless configured
EVENTS_TOPIC = "capacity-events"


def requests_topic(tenant: str) -> str:
    """The topic a tenant's request messages are published on."""
    return f"{TENANT_REQUESTS_PREFIX}{tenant}"


class Speaker(StrEnum):
    """Whom a request topic speaks for."""

    TENANT = "TENANT"  # a tenant's own topic: it acts as that tenant only
    ADMIN = "ADMIN"  # the admins' topic: it acts for any tenant
    SHARED = "SHARED"  # the shared topic, when configured: every publisher is trusted
    UNTRUSTED = "UNTRUSTED"  # the shared topic while it is off
    UNKNOWN = "UNKNOWN"  # no topic of this deployment (no configured tenant has it)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a message speaks for, from its topic; ``tenant`` for a tenant's topic."""

    speaker: Speaker
    tenant: str | None = None


def identity_of_topic(
    topic: str | None, tenants: Sequence[str], *, shared_trusted: bool
) -> Identity:
    """Who a message on ``topic`` (its short name; None: not known, as for a shared topic)
    speaks for, given the configured tenants and whether the shared topic is trusted."""
    if topic is None or topic == SHARED_REQUESTS_TOPIC:
        return Identity(Speaker.SHARED if shared_trusted else Speaker.UNTRUSTED)
    if topic == ADMIN_REQUESTS_TOPIC:
        return Identity(Speaker.ADMIN)
    if topic.startswith(TENANT_REQUESTS_PREFIX):
        tenant = topic.removeprefix(TENANT_REQUESTS_PREFIX)
        if tenant in tenants:
            return Identity(Speaker.TENANT, tenant)
    return Identity(Speaker.UNKNOWN)


def topic_of_source(source: str) -> str | None:
    """The topic's short name in a Pub/Sub CloudEvent ``source``
    (``//pubsub.googleapis.com/projects/P/topics/T``), or in any path naming
    ``projects/P/topics/T``; None when there is none."""
    match = re.search(r"projects/[^/?]+/topics/([^/?]+)", source or "")
    return None if match is None else match.group(1)


def event_filter(tenant: str) -> str:
    """The Pub/Sub subscription filter of a tenant's events (pubsub/docs/subscription-message-
    filter): only messages whose ``tenant`` attribute is the tenant's."""
    return f'attributes.tenant = "{tenant}"'


def passes_event_filter(tenant: str, attributes: dict[str, str]) -> bool:
    """What :func:`event_filter` lets through, applied where Pub/Sub cannot (the official
    emulator ignores subscription filters)."""
    return attributes.get("tenant") == tenant


class UnknownTopic(LookupError):
    """The topic a message was to go on does not exist: for a tenant's topic, the tenant is
    not one of this deployment's (its topics are made when a tenant is configured)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        super().__init__(f"no topic {topic!r} in this project")


class RequestPublisher(Protocol):
    """Where request messages go: each on its tenant's topic (:func:`requests_topic`), as
    that tenant's publishers send them."""

    def publish(self, message: dict[str, object]) -> str:
        """Publish one ``opendws.request/v1`` message on the topic of its ``tenant``; returns
        its message id. :class:`UnknownTopic` if that topic does not exist (nothing is
        published)."""
        ...


class Nudger(Protocol):
    """Asks the reconciler for a pass now (a message on ``reconcile-ticks``)."""

    def nudge(self, reason: str) -> None: ...


class EventBus(Protocol):
    """Where state changes are announced (Pub/Sub ``capacity-events``)."""

    def publish(self, event: StatusEvent) -> None:
        """Publish one event, with ``request_id``, ``tenant`` and ``state`` as attributes.
        Returns once the bus has accepted it; raises if it could not."""
        ...
