"""A Cloud Tasks v2 gRPC emulator that the real ``google-cloud-tasks`` client talks to, and that
really dispatches HTTP tasks.

It serves the method paths of ``google.cloud.tasks.v2.CloudTasks`` that opendws uses — queues
(create, get, list, delete, purge) and tasks (create, get, list, delete) — with the real API's
validation and status codes. A dispatcher sends every task to its URL at its ``schedule_time``
with the headers Cloud Tasks sends (``X-CloudTasks-*``, ``User-Agent: Google-Cloud-Tasks`` and,
for tasks with an ``oidc_token``, a bearer JWT signed by a key the emulator makes when built;
:meth:`CloudTasksEmulator.certs` verifies it). A 2xx answer completes the task; anything else is
retried with the queue's backoff until its attempts run out. A task name stays used for the
deduplication window after its task completed or was deleted, as in Cloud Tasks.

Time is the injected clock's (:mod:`opendws.clock`): the system clock when the emulator runs
for the local stack or standalone; a frozen ``ManualClock`` in tests, which move it and call
:meth:`CloudTasksEmulator.dispatch_due` instead of waiting.

Not emulated: App Engine tasks, OAuth tokens and queue-level HTTP targets (refused with
``UNIMPLEMENTED``); pausing queues, IAM, CMEK and locations (``UNIMPLEMENTED``, gRPC's answer for
methods not served); queue rate limits are kept and returned but not enforced; a deleted queue's
name may be used again at once (Cloud Tasks refuses it for 7 days).

One module per concern:

- :mod:`~emulators.cloud_tasks.api`: the API's limits, names, refusals, pages, views and
  retry rule — pure;
- :mod:`~emulators.cloud_tasks.signer`: the OIDC tokens;
- :mod:`~emulators.cloud_tasks.backend`: queues, tasks, used names, the log of attempts;
- :mod:`~emulators.cloud_tasks.dispatcher`: sending due tasks over HTTP, and retries' timing;
- :mod:`~emulators.cloud_tasks.server`: the gRPC face and :class:`CloudTasksEmulator`;
- ``__main__``: ``python -m emulators.cloud_tasks`` serves it standalone.
"""

from emulators.cloud_tasks.api import (
    DEFAULT_DISPATCH_DEADLINE,
    MAX_DISPATCH_DEADLINE,
    MAX_SCHEDULE_AHEAD,
    MIN_DISPATCH_DEADLINE,
    SERVICE,
    RetryPolicy,
)
from emulators.cloud_tasks.backend import DEFAULT_DEDUP_WINDOW, Dispatch
from emulators.cloud_tasks.dispatcher import USER_AGENT
from emulators.cloud_tasks.server import CloudTasksEmulator
from emulators.cloud_tasks.signer import ISSUER, TOKEN_LIFETIME

__all__ = [
    "DEFAULT_DEDUP_WINDOW",
    "DEFAULT_DISPATCH_DEADLINE",
    "ISSUER",
    "MAX_DISPATCH_DEADLINE",
    "MAX_SCHEDULE_AHEAD",
    "MIN_DISPATCH_DEADLINE",
    "SERVICE",
    "TOKEN_LIFETIME",
    "USER_AGENT",
    "CloudTasksEmulator",
    "Dispatch",
    "RetryPolicy",
]
