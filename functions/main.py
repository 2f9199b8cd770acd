"""Cloud Functions entry points: decode, call one service, map errors."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

import functions_framework
from cloudevents.http import CloudEvent

from opendws.bootstrap import intake_service
from opendws.service.intake import Delivery


@functions_framework.cloud_event
def intake(event: CloudEvent) -> None:
    """``capacity-requests`` → Firestore: one Pub/Sub message (Eventarc's messagePublished
    CloudEvent). Bad input is answered with a REJECTED event; only transient faults raise."""
    intake_service().handle(delivery_of(event))


def delivery_of(event: CloudEvent) -> Delivery:
    """The Pub/Sub message inside a ``google.cloud.pubsub.topic.v1.messagePublished`` event."""
    message: dict[str, Any] = (event.data or {}).get("message", {})
    published = message.get("publishTime") or event["time"]
    return Delivery(
        data=base64.b64decode(message.get("data", "")),
        message_id=str(message.get("messageId") or event["id"]),
        published_at=_instant(published),
        attributes=dict(message.get("attributes") or {}),
    )


def _instant(text: str) -> datetime:
    instant = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return instant if instant.tzinfo else instant.replace(tzinfo=UTC)


__all__ = ["delivery_of", "intake"]
