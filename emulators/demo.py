"""``dws demo``: a scripted mixed workload on the local stack, as its users would drive it —
every step a message on ``capacity-requests`` — ending with a summary table.

1. ``train`` (vision, 2 H100 VMs, us-central1-a preferred, -b allowed): Google has none free
   in us-central1-a, so its order waits in Google's queue there (the event says so, with
   Google's last attempt); the pool is short, the request is raced into us-central1-b as well,
   served there, and its order still queued in us-central1-a is cancelled.
2. ``nightly`` (ci, strict FIFO, 1 A100 VM): a CI job, released early once it runs.
3. ``slice`` (vision, a v5e 4x4 TPU slice): provisioned as a queued resource.
4. ``block`` (speech, calendar, 1 A100 VM for a day from tomorrow): checked with Google's
   Advice API, submitted, PENDING until Google approves it, then BOOKED. Cancelling it is
   refused at once: it starts within 4 days and was approved, so Google bills it in full.
   ``later`` (speech, calendar, 40 days ahead): booked, then cancelled at Google and deleted.
5. ``oops`` (speech, 8 H100 VMs): cancelled while it waits.
6. ``queued`` (vision, 1 A100 VM, us-central1-a only): Google has no A100 free, so it waits in
   Google's queue until Google frees capacity there, then runs — nothing cancels it meanwhile.
7. ``job`` (vision, 2 H100 VMs in us-central1-b, with a ``run``): the agents on its VMs meet,
   each rank prints where it is, and the run ends by itself: RELEASED, JOB_SUCCEEDED.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from emulators.stack import Stack

STEP_TIMEOUT = 60.0
# Google's review of a block (the stack's review delay) and the reconcile pass after it.
REVIEW_TIMEOUT = 120.0
# The lines run_demo says, one per step (what dws demo's progress bar counts).
STEPS = 26


@dataclass(frozen=True, slots=True)
class Outcome:
    """Where one demo request ended up."""

    request_id: str
    tenant: str
    state: str
    pool: str | None
    attempts: int
    events: int
    story: str  # its states, in order
    reasons: str  # the reasons of its events, in order
    times: str  # seconds from its first event to each of the others


def run_demo(stack: Stack, say: Callable[[str], None]) -> list[Outcome]:
    """Drive the workload on ``stack`` (whose variables are in this process's environment)."""
    from opendws.bootstrap import container

    adapters = container().adapters
    publisher, store = adapters.publisher, adapters.store
    events = _EventWatcher(stack.project)

    def events_seen(request_id: str) -> list[dict[str, Any]]:
        return [event for event in events.pull() if event.get("request_id") == request_id]

    def send(message: dict[str, Any]) -> None:
        publisher.publish({"schema": "opendws.request/v1", **message})

    def until(request_id: str, *states: str, timeout: float = STEP_TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = store.get(request_id)
            if record is not None and record.state.value in states:
                return str(record.state.value)
            time.sleep(0.3)
        raise TimeoutError(f"{request_id} did not reach {' or '.join(states)} in time")

    def reason_of(request_id: str) -> str:
        record = store.get(request_id)
        return "" if record is None else f"{record.reason}, {record.message}"

    def refusal(request_id: str) -> str:
        """The message of the request's refusal event (a refusal is not stored: it is only
        announced on capacity-events)."""
        deadline = time.monotonic() + STEP_TIMEOUT
        while time.monotonic() < deadline:
            for event in events_seen(request_id):
                if event.get("reason") == "NOT_CANCELLABLE":
                    return str(event.get("message"))
            time.sleep(0.3)
        raise TimeoutError(f"{request_id}: no refusal was announced in time")

    def waits_at_google(request_id: str) -> str:
        deadline = time.monotonic() + STEP_TIMEOUT
        while time.monotonic() < deadline:
            for event in store.events(request_id):
                if event.reason == "WAITING_FOR_CAPACITY":
                    return str(event.message)
            time.sleep(0.3)
        raise TimeoutError(f"{request_id} was not seen waiting at Google in time")

    def submit(request_id: str, tenant: str, gang: dict[str, Any], **fields: Any) -> None:
        send({"action": "submit", "request_id": request_id, "tenant": tenant, "gang": gang,
              "mode": "flex_start", "run_duration": "1h", "max_wait": "1h", **fields})  # fmt: skip

    h100 = {"machine_type": "a3-highgpu-8g", "accelerator": "nvidia-h100-80gb",
            "accelerators_per_vm": 8}  # fmt: skip
    a100 = {"machine_type": "a2-ultragpu-8g", "accelerator": "nvidia-a100-80gb",
            "accelerators_per_vm": 8}  # fmt: skip

    say("Google has no a3-highgpu-8g free in us-central1-a: other customers hold it all")
    stack.cloud.set_stock("us-central1-a", "a3-highgpu-8g", 0)
    say("submit train: 2 × H100 VMs, us-central1-a preferred, us-central1-b allowed")
    submit("train", "vision", {"vm_count": 2, **h100},
           locations=["us-central1-a", "us-central1-b"])  # fmt: skip
    say("submit nightly: a CI job, 1 × A100 VM")
    submit("nightly", "ci", {"vm_count": 1, **a100}, locations=["us-central1"],
           labels={"ci": "github"})  # fmt: skip
    say("submit slice: a v5e 4x4 TPU slice")
    submit("slice", "vision", {"vm_count": 1, "accelerator": "tpu-v5e", "topology": "4x4"},
           locations=["us-west4-a"])  # fmt: skip
    start = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0)
    say(f"book block: 1 × A100 VM for a day from {start.isoformat()}")
    send({"action": "submit", "request_id": "block", "tenant": "speech", "mode": "calendar",
          "gang": {"vm_count": 1, **a100}, "locations": ["us-central1-a"],
          "run_duration": "1d", "start_at": start.isoformat()})  # fmt: skip
    say("submit oops: 8 × H100 VMs (more than is free), then cancel it")
    submit("oops", "speech", {"vm_count": 8, **h100}, locations=["us-central1-a"])
    until("oops", "PENDING")
    send({"action": "cancel", "request_id": "oops", "tenant": "speech"})
    say(f"oops: {until('oops', 'CANCELLED')}")
    later = (datetime.now(UTC) + timedelta(days=40)).replace(microsecond=0)
    say(f"book later: 1 × A100 VM for a day from {later.isoformat()}")
    send({"action": "submit", "request_id": "later", "tenant": "speech", "mode": "calendar",
          "gang": {"vm_count": 1, **a100}, "locations": ["us-central1-a"],
          "run_duration": "1d", "start_at": later.isoformat()})  # fmt: skip
    say(f"block: {until('block', 'PENDING')}: {reason_of('block')}")
    say(f"block: {until('block', 'BOOKED', timeout=REVIEW_TIMEOUT)}: {reason_of('block')}")
    say("cancel block (it starts tomorrow)")
    send({"action": "cancel", "request_id": "block", "tenant": "speech"})
    say(f"block: refused: {refusal('block')}")
    say(f"later: {until('later', 'BOOKED', timeout=REVIEW_TIMEOUT)}; cancel it (40 days ahead)")
    send({"action": "cancel", "request_id": "later", "tenant": "speech"})
    say(f"later: {until('later', 'CANCELLED')}")
    say(f"nightly: {until('nightly', 'ACTIVE')}; the job is done early: release it")
    send({"action": "release", "request_id": "nightly", "tenant": "ci"})
    say(f"nightly: {until('nightly', 'RELEASED')}")
    say(f"slice: {until('slice', 'ACTIVE')}")
    say(f"train: {waits_at_google('train')}")
    say(f"train: {until('train', 'ACTIVE')} (won the race in us-central1-b)")
    say("other customers take every a2-ultragpu-8g in us-central1-a")
    stack.cloud.set_stock("us-central1-a", "a2-ultragpu-8g", 0)
    say("submit queued: 1 × A100 VM in us-central1-a")
    submit("queued", "vision", {"vm_count": 1, **a100}, locations=["us-central1-a"])
    say(f"queued: {waits_at_google('queued')}")
    say("Google frees 2 × a2-ultragpu-8g in us-central1-a")
    stack.cloud.set_stock("us-central1-a", "a2-ultragpu-8g", 2)
    say(f"queued: {until('queued', 'ACTIVE')} (served from Google's queue)")
    say("submit job: 2 × H100 VMs in us-central1-b that run a job and end by themselves")
    submit(
        "job",
        "vision",
        {"vm_count": 2, **h100},
        locations=["us-central1-b"],
        run={
            "command": [
                "sh",
                "-c",
                'echo "rank $OPENDWS_NODE_RANK of $OPENDWS_NUM_NODES '
                'on $(hostname), master $MASTER_ADDR:$MASTER_PORT"',
            ]
        },
    )
    say(f"job: {until('job', 'RELEASED', timeout=2 * STEP_TIMEOUT)}: {reason_of('job')}")
    outcomes = []
    for request_id in ("train", "nightly", "slice", "block", "later", "oops", "queued", "job"):
        record = store.get(request_id)
        assert record is not None
        recorded = store.events(request_id)
        outcomes.append(
            Outcome(
                request_id=request_id,
                tenant=record.tenant,
                state=record.state.value,
                pool=record.pool,
                attempts=record.attempt,
                events=len(recorded),
                story=" → ".join(event.state.value for event in recorded),
                reasons=" → ".join(event.reason or "-" for event in recorded),
                times=" → ".join(
                    f"{max((event.at - recorded[0].at).total_seconds(), 0):.0f}s"
                    for event in recorded
                ),
            )
        )
    return outcomes


class _EventWatcher:
    """A pull subscription on ``capacity-events`` (refusals are announced, not stored)."""

    def __init__(self, project: str) -> None:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import pubsub_v1

        credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]  # untyped here
        self._subscriber = pubsub_v1.SubscriberClient(credentials=credentials)
        self._name = self._subscriber.subscription_path(project, "demo-events")
        topic = f"projects/{project}/topics/capacity-events"
        self._subscriber.create_subscription(request={"name": self._name, "topic": topic})
        self._seen: list[dict[str, Any]] = []

    def pull(self) -> list[dict[str, Any]]:
        """Every event seen so far (pulling whatever arrived since the last call)."""
        response = self._subscriber.pull(
            request={"subscription": self._name, "max_messages": 100}, timeout=5
        )
        if response.received_messages:
            self._seen += [json.loads(m.message.data) for m in response.received_messages]
            self._subscriber.acknowledge(
                request={
                    "subscription": self._name,
                    "ack_ids": [m.ack_id for m in response.received_messages],
                }
            )
        return self._seen


def as_json(outcomes: list[Outcome]) -> str:
    """The outcomes as a JSON list."""
    return json.dumps([asdict(outcome) for outcome in outcomes])
