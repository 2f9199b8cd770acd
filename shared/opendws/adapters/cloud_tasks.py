"""The TimerQueue on Cloud Tasks (google-cloud-tasks): each timer is one HTTP task that POSTs
the timer as JSON to the ``timer`` function at its time, with an OIDC token for the invoker
service account.

A task is named after its timer (request, kind, generation, hop), so arming a timer twice is
refused by Cloud Tasks as ALREADY_EXISTS — which is success here — and a name is never reused:
a timer that must be armed again after deletion has a new generation. Deleting a task that is
gone (it ran, or was deleted) is success too.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from google.api_core.exceptions import AlreadyExists, NotFound
from google.cloud import tasks_v2

from opendws.ports import Timer

# How long a timer call may take before Cloud Tasks counts it as failed and retries.
DISPATCH_DEADLINE = timedelta(minutes=2)


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerSettings:
    """Where timers are queued and whom they call."""

    project: str
    location: str
    queue: str
    url: str  # the timer function's URL
    service_account: str  # the invoker whose OIDC token the timer function accepts
    audience: str = ""  # the token's audience; the URL when empty

    @property
    def queue_path(self) -> str:
        return f"projects/{self.project}/locations/{self.location}/queues/{self.queue}"


class CloudTasksTimerQueue:
    """TimerQueue over a Cloud Tasks client (the emulator on one machine)."""

    def __init__(self, client: tasks_v2.CloudTasksClient, settings: TimerSettings) -> None:
        self._client = client
        self._settings = settings

    def ensure_queue(self) -> None:
        """Create the queue if it is missing (in Google Cloud, Terraform creates it)."""
        settings = self._settings
        queue = tasks_v2.Queue(
            name=settings.queue_path,
            retry_config=tasks_v2.RetryConfig(
                max_attempts=100,
                min_backoff=timedelta(seconds=1),
                max_backoff=timedelta(seconds=300),
            ),
        )
        with contextlib.suppress(AlreadyExists):
            self._client.create_queue(
                parent=f"projects/{settings.project}/locations/{settings.location}", queue=queue
            )

    def arm(self, timer: Timer, now: datetime) -> None:
        settings = self._settings
        task = tasks_v2.Task(
            name=self._task_name(timer),
            schedule_time=timer.due_at(now),
            dispatch_deadline=DISPATCH_DEADLINE,
            http_request=tasks_v2.HttpRequest(
                url=settings.url,
                http_method=tasks_v2.HttpMethod.POST,
                headers={"Content-Type": "application/json"},
                body=json.dumps(timer.to_json(), separators=(",", ":")).encode(),
                oidc_token=tasks_v2.OidcToken(
                    service_account_email=settings.service_account,
                    audience=settings.audience or settings.url,
                ),
            ),
        )
        # ALREADY_EXISTS: armed before (a retry), or it ran already; nothing left to do.
        with contextlib.suppress(AlreadyExists):
            self._client.create_task(parent=settings.queue_path, task=task)

    def disarm(self, timer: Timer) -> None:
        with contextlib.suppress(NotFound):
            self._client.delete_task(name=self._task_name(timer))

    def _task_name(self, timer: Timer) -> str:
        return f"{self._settings.queue_path}/tasks/{timer.name}"
