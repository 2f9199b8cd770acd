"""Reading what was published, for tests against the Pub/Sub emulator."""

from __future__ import annotations

from typing import Any


def pull(subscriber: Any, subscription: str, want: int, attempts: int = 10) -> list[Any]:
    """Pull and acknowledge messages until ``want`` have arrived or ``attempts`` pulls came
    back; the received ``PubsubMessage`` objects, in arrival order. Stops early at ``want`` so
    a test that expects exactly N can pull again to prove there is no N+1."""
    received: list[Any] = []
    for _ in range(attempts):
        reply = subscriber.pull(
            request={"subscription": subscription, "max_messages": max(want, 10)}, timeout=5
        )
        received += [item.message for item in reply.received_messages]
        if reply.received_messages:
            subscriber.acknowledge(
                request={
                    "subscription": subscription,
                    "ack_ids": [item.ack_id for item in reply.received_messages],
                }
            )
        if len(received) >= want:
            break
    return received
