"""A Cloud Tasks v2 gRPC emulator that the real ``google-cloud-tasks`` client talks to, and that
really dispatches HTTP tasks.

It serves the method paths of ``google.cloud.tasks.v2.CloudTasks`` that opendws uses — queues
(create, get, list, delete, purge) and tasks (create, get, list, delete) — with the real API's
validation and status codes. A dispatcher thread sends every task to its URL at its
``schedule_time`` with the headers Cloud Tasks sends (``X-CloudTasks-*``, ``User-Agent:
Google-Cloud-Tasks`` and, for tasks with an ``oidc_token``, a bearer JWT signed by a key the
emulator makes at start; :meth:`CloudTasksEmulator.certs` verifies it). A 2xx answer completes the
task; anything else is retried with the queue's backoff until its attempts run out. A task name
stays used for the deduplication window after its task completed or was deleted, as in Cloud
Tasks.

Not emulated: App Engine tasks, OAuth tokens and queue-level HTTP targets (refused with
``UNIMPLEMENTED``); pausing queues, IAM, CMEK and locations (``UNIMPLEMENTED``, gRPC's answer for
methods not served); queue rate limits are kept and returned but not enforced; a deleted queue's
name may be used again at once (Cloud Tasks refuses it for 7 days).

``python -m emulators.cloud_tasks [--port N] [--certs PATH] [--dedup-window SECONDS]`` serves it
standalone until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import heapq
import http.client
import itertools
import json
import re
import secrets
import signal
import socket
import sys
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

from emulators.official import HOST, EmulatorError

SERVICE = "google.cloud.tasks.v2.CloudTasks"
# The ``iss`` of the tokens the emulator signs: deliberately not Google's, so that a verifier
# configured for real Google tokens never accepts one.
ISSUER = "opendws-cloud-tasks-emulator"
TOKEN_LIFETIME = timedelta(hours=1)
DEFAULT_DEDUP_WINDOW = timedelta(hours=1)
# Cloud Tasks' own limits and defaults.
MAX_SCHEDULE_AHEAD = timedelta(days=30)
DEFAULT_DISPATCH_DEADLINE = timedelta(minutes=10)
MIN_DISPATCH_DEADLINE = timedelta(seconds=15)
MAX_DISPATCH_DEADLINE = timedelta(minutes=30)
USER_AGENT = "Google-Cloud-Tasks"

_LOCATION = r"projects/[A-Za-z0-9.:-]+/locations/[A-Za-z0-9-]+"
_QUEUE = _LOCATION + r"/queues/[A-Za-z0-9-]{1,100}"
_TASK = _QUEUE + r"/tasks/[A-Za-z0-9_-]{1,500}"
# Methods that may carry a body in Cloud Tasks.
_BODY_METHODS = frozenset({tasks_v2.HttpMethod.POST, tasks_v2.HttpMethod.PUT,
                           tasks_v2.HttpMethod.PATCH})  # fmt: skip
# Task headers Cloud Tasks ignores or replaces with its own (prefixes, lower case).
_REPLACED_HEADERS = ("host", "content-length", "user-agent", "x-google-", "x-appengine-",
                     "x-cloudtasks-")  # fmt: skip
_DEFAULT_PAGE = 1000
# The dispatcher re-reads the wall clock at least this often, so a clock step is noticed.
_LONGEST_WAIT = 0.25
# How long stopping waits for each attempt thread that is still connecting.
_SENDER_JOIN = 5.0
# The canonical HTTP → google.rpc.Code mapping, for ``Attempt.response_status``.
_HTTP_CODES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    412: "FAILED_PRECONDITION",
    416: "OUT_OF_RANGE",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


class _Refused(Exception):
    """A request the API refuses: answered with this gRPC status code and message."""

    def __init__(self, code: Any, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _invalid(message: str) -> _Refused:
    return _Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


def _not_found(message: str) -> _Refused:
    return _Refused(grpc.StatusCode.NOT_FOUND, message)


def _rpc_code(name: str) -> int:
    """The google.rpc.Code number of a status code name."""
    return int(grpc.StatusCode[name].value[0])


_OK = 0


def _empty(nothing: None) -> bytes:
    """``google.protobuf.Empty`` on the wire: no bytes at all."""
    return b""


def _now() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------------- public records


@dataclass(frozen=True)
class Dispatch:
    """One HTTP attempt the dispatcher made: the task's full name, where it went, when, with
    which headers, and its outcome — the HTTP ``status`` or, when no answer came, the ``error``
    (a refused connection, the dispatch deadline passed)."""

    task: str
    url: str
    at: datetime
    headers: dict[str, str]
    status: int | None = None
    error: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


@dataclass(frozen=True)
class RetryPolicy:
    """A queue's (or task's) retry configuration, defaults filled in as Cloud Tasks does.

    ``max_attempts`` of -1 means unlimited. A failed task waits ``min_backoff``, doubling
    ``max_doublings`` times, then growing linearly by the last doubled interval, never more than
    ``max_backoff``. It is dropped once it has been attempted ``max_attempts`` times and, if
    ``max_retry_duration`` is positive, that long has passed since its first attempt.
    """

    max_attempts: int = 100
    min_backoff: timedelta = timedelta(seconds=0.1)
    max_backoff: timedelta = timedelta(hours=1)
    max_doublings: int = 16
    max_retry_duration: timedelta = timedelta(0)

    @classmethod
    def from_message(cls, config: tasks_v2.RetryConfig, fallback: RetryPolicy) -> RetryPolicy:
        """The policy ``config`` asks for, with ``fallback``'s values where it gives none;
        ``_Refused`` (INVALID_ARGUMENT) when its values are out of range."""
        max_attempts = config.max_attempts or fallback.max_attempts
        max_doublings = config.max_doublings or fallback.max_doublings
        min_backoff = config.min_backoff if "min_backoff" in config else fallback.min_backoff
        max_backoff = config.max_backoff if "max_backoff" in config else fallback.max_backoff
        duration = (
            config.max_retry_duration
            if "max_retry_duration" in config
            else fallback.max_retry_duration
        )
        if max_attempts < -1:
            raise _invalid(f"RetryConfig.max_attempts must be -1 or more, got {max_attempts}")
        if max_doublings < 0:
            raise _invalid(f"RetryConfig.max_doublings must be 0 or more, got {max_doublings}")
        if min(min_backoff, max_backoff, duration) < timedelta(0):
            raise _invalid("RetryConfig durations cannot be negative")
        if min_backoff > max_backoff:
            raise _invalid("RetryConfig.min_backoff must not be greater than max_backoff")
        return cls(max_attempts, min_backoff, max_backoff, max_doublings, duration)

    def message(self) -> tasks_v2.RetryConfig:
        return tasks_v2.RetryConfig(
            max_attempts=self.max_attempts,
            min_backoff=self.min_backoff,
            max_backoff=self.max_backoff,
            max_doublings=self.max_doublings,
            max_retry_duration=self.max_retry_duration,
        )

    def backoff(self, failures: int) -> timedelta:
        """How long to wait after the ``failures``-th failed attempt (1 for the first)."""
        retry = max(failures - 1, 0)
        doublings = min(retry, self.max_doublings)
        interval = self.min_backoff * (1 << doublings)
        if retry > self.max_doublings:
            interval *= retry - self.max_doublings + 1
        return min(interval, self.max_backoff)

    def exhausted(self, attempts: int, since_first: timedelta) -> bool:
        if self.max_attempts < 0 or attempts < self.max_attempts:
            return False
        return self.max_retry_duration <= timedelta(0) or since_first >= self.max_retry_duration


# ---------------------------------------------------------------------- OIDC tokens


class _TokenSigner:
    """The emulator's OIDC token issuer: an RSA key made at start, its self-signed certificate
    (published by ``certs()``) and RS256 JWTs whose header names the key's ``kid``."""

    def __init__(self) -> None:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.kid = hashlib.sha1(public).hexdigest()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = _now()
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=365))
            .sign(key, hashes.SHA256())
        )
        self.certificate = certificate.public_bytes(serialization.Encoding.PEM).decode()
        self._key = key

    def token(self, email: str, audience: str, now: datetime) -> str:
        """A signed RS256 JWT for ``email``, for ``audience``, valid for an hour from ``now``."""
        issued = int(now.timestamp())
        header = {"alg": "RS256", "typ": "JWT", "kid": self.kid}
        claims = {
            "iss": ISSUER,
            "aud": audience,
            "azp": email,
            "email": email,
            "email_verified": True,
            "sub": _subject(email),
            "iat": issued,
            "exp": issued + int(TOKEN_LIFETIME.total_seconds()),
        }
        signed = f"{_segment(header)}.{_segment(claims)}"
        signature = self._key.sign(signed.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
        return f"{signed}.{_base64url(signature)}"


def _base64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _segment(part: Mapping[str, object]) -> str:
    return _base64url(json.dumps(part, separators=(",", ":")).encode())


def _subject(email: str) -> str:
    """A stable numeric id per service account, shaped like Google's 21-digit ``sub``."""
    digest = int.from_bytes(hashlib.sha256(email.encode()).digest()[:9], "big")
    return "1" + str(digest).zfill(20)[-20:]


# ---------------------------------------------------------------------- state


@dataclass
class _Task:
    """A pending task: its canonical FULL-view message, plus what dispatching needs.

    ``due`` is the timestamp of the heap entry that is current for it; older entries are
    skipped. ``in_flight`` tasks are never dispatched twice at once."""

    message: tasks_v2.Task
    queue: str
    due: float
    in_flight: bool = False
    previous_response: int | None = None
    first_dispatch: datetime | None = None


@dataclass
class _Queue:
    message: tasks_v2.Queue
    policy: RetryPolicy
    tasks: dict[str, _Task] = field(default_factory=dict)


@dataclass(frozen=True)
class _Attempt:
    """One HTTP request to make, built under the lock, sent outside it."""

    task: _Task
    epoch: int
    url: str
    method: str
    headers: dict[str, str]
    body: bytes
    deadline: float
    at: datetime


@dataclass(frozen=True)
class _Outcome:
    status: int | None
    error: str | None
    code: int
    at: datetime


def _copy(task: tasks_v2.Task, view: tasks_v2.Task.View) -> tasks_v2.Task:
    """A copy of ``task`` in ``view``: BASIC leaves out the body, as Cloud Tasks does."""
    answer: tasks_v2.Task = tasks_v2.Task.deserialize(tasks_v2.Task.serialize(task))
    if view == tasks_v2.Task.View.FULL:
        answer.view = tasks_v2.Task.View(tasks_v2.Task.View.FULL)
    else:
        answer.view = tasks_v2.Task.View(tasks_v2.Task.View.BASIC)
        answer.http_request.body = b""
    return answer


def _copy_queue(queue: tasks_v2.Queue) -> tasks_v2.Queue:
    copy: tasks_v2.Queue = tasks_v2.Queue.deserialize(tasks_v2.Queue.serialize(queue))
    return copy


def _page(items: list[Any], size: int, token: str) -> tuple[list[Any], str]:
    """One page of ``items`` and the next page's token (an offset; empty on the last page)."""
    if size < 0:
        raise _invalid("page_size cannot be negative")
    try:
        start = int(token or 0)
    except ValueError:
        raise _invalid(f"Invalid page_token {token!r}") from None
    end = start + (size or _DEFAULT_PAGE)
    return items[start:end], (str(end) if end < len(items) else "")


def _require(pattern: str, name: str, what: str) -> None:
    if re.fullmatch(pattern, name) is None:
        raise _invalid(f"Invalid {what} name {name!r}")


def _queue_of(task_name: str) -> str:
    return task_name.rpartition("/tasks/")[0]


class _Backend:
    """Queues, tasks, used task names and the dispatch log, behind one lock; and the dispatcher
    thread that fires due tasks.

    Invariants: a task is in exactly one queue's ``tasks`` until it completes, is deleted or
    runs out of attempts; then its name goes to ``_used`` and is refused for the deduplication
    window. Attempt results for tasks no longer current (deleted, reset) are ignored."""

    def __init__(self, dedup_window: timedelta, signer: _TokenSigner) -> None:
        self._dedup_window = dedup_window
        self._signer = signer
        self._condition = threading.Condition(threading.Lock())
        self._queues: dict[str, _Queue] = {}
        self._used: dict[str, datetime] = {}
        self._log: list[Dispatch] = []
        self._heap: list[tuple[float, int, _Task]] = []
        self._sequence = itertools.count()
        self._epoch = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._senders: set[threading.Thread] = set()
        self._connections: set[http.client.HTTPConnection] = set()

    # ------------------------------------------------------------------ queues

    def create_queue(self, request: tasks_v2.CreateQueueRequest) -> tasks_v2.Queue:
        _require(_LOCATION, request.parent, "location")
        queue = request.queue
        _require(_QUEUE, queue.name, "queue")
        if _queue_of_name(queue.name) != request.parent:
            raise _invalid(f"Queue {queue.name!r} is not in location {request.parent!r}")
        if "http_target" in queue or "app_engine_routing_override" in queue:
            raise _Refused(grpc.StatusCode.UNIMPLEMENTED, "queue-level targets are not emulated")
        policy = RetryPolicy.from_message(queue.retry_config, RetryPolicy())
        limits = queue.rate_limits
        message = tasks_v2.Queue(
            name=queue.name,
            rate_limits=tasks_v2.RateLimits(
                max_dispatches_per_second=limits.max_dispatches_per_second or 500.0,
                max_burst_size=limits.max_burst_size or 100,
                max_concurrent_dispatches=limits.max_concurrent_dispatches or 1000,
            ),
            retry_config=policy.message(),
            state=tasks_v2.Queue.State.RUNNING,
        )
        if "stackdriver_logging_config" in queue:
            message.stackdriver_logging_config = queue.stackdriver_logging_config
        with self._condition:
            if queue.name in self._queues:
                raise _Refused(grpc.StatusCode.ALREADY_EXISTS, f"Queue {queue.name} exists")
            self._queues[queue.name] = _Queue(message, policy)
            return _copy_queue(message)

    def get_queue(self, request: tasks_v2.GetQueueRequest) -> tasks_v2.Queue:
        with self._condition:
            return _copy_queue(self._queue(request.name).message)

    def list_queues(self, request: tasks_v2.ListQueuesRequest) -> tasks_v2.ListQueuesResponse:
        _require(_LOCATION, request.parent, "location")
        prefix = request.parent + "/queues/"
        with self._condition:
            queues = [
                _copy_queue(queue.message)
                for name, queue in sorted(self._queues.items())
                if name.startswith(prefix)
            ]
        page, token = _page(queues, request.page_size, request.page_token)
        return tasks_v2.ListQueuesResponse(queues=page, next_page_token=token)

    def delete_queue(self, request: tasks_v2.DeleteQueueRequest) -> None:
        with self._condition:
            queue = self._queue(request.name)
            self._retire_all(queue)
            del self._queues[request.name]

    def purge_queue(self, request: tasks_v2.PurgeQueueRequest) -> tasks_v2.Queue:
        with self._condition:
            queue = self._queue(request.name)
            self._retire_all(queue)
            queue.message.purge_time = _now()
            return _copy_queue(queue.message)

    # ------------------------------------------------------------------ tasks

    def create_task(self, request: tasks_v2.CreateTaskRequest) -> tasks_v2.Task:
        _require(_QUEUE, request.parent, "queue")
        given = request.task
        http_request = _validated_http_request(given)
        now = _now()
        schedule = given.schedule_time if "schedule_time" in given else now
        if schedule - now > MAX_SCHEDULE_AHEAD:
            raise _invalid(
                f"Task.schedule_time {schedule.isoformat()} is more than 30 days ahead: "
                "Cloud Tasks schedules at most 30 days in the future"
            )
        deadline = (
            given.dispatch_deadline if "dispatch_deadline" in given else DEFAULT_DISPATCH_DEADLINE
        )
        if not MIN_DISPATCH_DEADLINE <= deadline <= MAX_DISPATCH_DEADLINE:
            raise _invalid("Task.dispatch_deadline must be between 15 seconds and 30 minutes")
        if given.name:
            _require(_TASK, given.name, "task")
            if _queue_of(given.name) != request.parent:
                raise _invalid(f"Task {given.name!r} is not in queue {request.parent!r}")
        message = tasks_v2.Task(
            http_request=http_request,
            schedule_time=schedule,
            create_time=now.replace(microsecond=0),
            dispatch_deadline=deadline,
            view=tasks_v2.Task.View.FULL,
        )
        with self._condition:
            queue = self._queue(request.parent)
            if "retry_config" in given:
                RetryPolicy.from_message(given.retry_config, queue.policy)
                message.retry_config = given.retry_config
            message.name = given.name or self._fresh_name(request.parent)
            self._refuse_used(message.name, now)
            task = _Task(message=message, queue=request.parent, due=schedule.timestamp())
            queue.tasks[message.name] = task
            self._push(task)
            return _copy(message, request.response_view)

    def get_task(self, request: tasks_v2.GetTaskRequest) -> tasks_v2.Task:
        with self._condition:
            return _copy(self._task(request.name).message, request.response_view)

    def list_tasks(self, request: tasks_v2.ListTasksRequest) -> tasks_v2.ListTasksResponse:
        with self._condition:
            queue = self._queue(request.parent)
            tasks = [
                _copy(task.message, request.response_view)
                for _, task in sorted(queue.tasks.items())
            ]
        page, token = _page(tasks, request.page_size, request.page_token)
        return tasks_v2.ListTasksResponse(tasks=page, next_page_token=token)

    def delete_task(self, request: tasks_v2.DeleteTaskRequest) -> None:
        with self._condition:
            task = self._task(request.name)
            self._retire(task, _now())

    # ------------------------------------------------------------------ lookups (locked)

    def _queue(self, name: str) -> _Queue:
        _require(_QUEUE, name, "queue")
        queue = self._queues.get(name)
        if queue is None:
            raise _not_found(f"Queue {name} does not exist")
        return queue

    def _task(self, name: str) -> _Task:
        _require(_TASK, name, "task")
        task = self._queue(_queue_of(name)).tasks.get(name)
        if task is None:
            raise _not_found(f"Task {name} does not exist")
        return task

    def _current(self, task: _Task) -> bool:
        queue = self._queues.get(task.queue)
        return queue is not None and queue.tasks.get(task.message.name) is task

    def _fresh_name(self, parent: str) -> str:
        while True:
            # Shaped like the ids Cloud Tasks generates: a long decimal number.
            name = f"{parent}/tasks/{secrets.randbelow(10**20):020d}"
            if not self._is_used(name, _now()):
                return name

    def _is_used(self, name: str, now: datetime) -> bool:
        freed = self._used.get(name)
        if freed is not None and now - freed >= self._dedup_window:
            del self._used[name]
            freed = None
        return freed is not None or self._task_exists(name)

    def _task_exists(self, name: str) -> bool:
        queue = self._queues.get(_queue_of(name))
        return queue is not None and name in queue.tasks

    def _refuse_used(self, name: str, now: datetime) -> None:
        if self._task_exists(name):
            raise _Refused(grpc.StatusCode.ALREADY_EXISTS, f"Task {name} already exists")
        if self._is_used(name, now):
            raise _Refused(
                grpc.StatusCode.ALREADY_EXISTS,
                f"Task {name} cannot be created: a task with this name existed too recently "
                f"(names stay used for {self._dedup_window} after the task is gone)",
            )

    def _retire(self, task: _Task, now: datetime) -> None:
        """Take ``task`` out of its queue for good; its name stays used for the window."""
        del self._queues[task.queue].tasks[task.message.name]
        self._used[task.message.name] = now

    def _retire_all(self, queue: _Queue) -> None:
        now = _now()
        for task in list(queue.tasks.values()):
            self._retire(task, now)

    def _push(self, task: _Task) -> None:
        heapq.heappush(self._heap, (task.due, next(self._sequence), task))
        self._condition.notify_all()

    # ------------------------------------------------------------------ dispatching

    def start(self) -> None:
        with self._condition:
            self._stopping = False
            self._thread = threading.Thread(
                target=self._run, name="cloud-tasks-dispatcher", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop the dispatcher, cut the HTTP requests in flight, and wait for every thread."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
            thread, self._thread = self._thread, None
            connections = list(self._connections)
        if thread is not None:
            thread.join()
        for connection in connections:
            _interrupt(connection)
        with self._condition:
            senders = list(self._senders)
        # A connect() in progress cannot be interrupted; it ends by itself at the socket
        # timeout, and its answer is then ignored, so waiting is bounded.
        for sender in senders:
            sender.join(_SENDER_JOIN)

    def reset(self) -> None:
        with self._condition:
            self._queues.clear()
            self._used.clear()
            self._log.clear()
            self._heap.clear()
            self._epoch += 1

    def dispatched(self) -> list[Dispatch]:
        with self._condition:
            return list(self._log)

    def _run(self) -> None:
        with self._condition:
            while not self._stopping:
                now = _now()
                while self._heap and self._heap[0][0] <= now.timestamp():
                    due, _, task = heapq.heappop(self._heap)
                    if self._current(task) and not task.in_flight and task.due == due:
                        self._send(self._begin(task, now))
                wait = self._heap[0][0] - _now().timestamp() if self._heap else _LONGEST_WAIT
                self._condition.wait(min(max(wait, 0.0), _LONGEST_WAIT))

    def _begin(self, task: _Task, now: datetime) -> _Attempt:
        """Count the attempt on the task and build its request (the lock is held)."""
        message = task.message
        http_request = message.http_request
        headers = {
            name: value
            for name, value in http_request.headers.items()
            if not name.lower().startswith(_REPLACED_HEADERS)
        }
        if http_request.body and not any(n.lower() == "content-type" for n in headers):
            headers["Content-Type"] = "application/octet-stream"
        headers.update(
            {
                "User-Agent": USER_AGENT,
                "X-CloudTasks-QueueName": task.queue.rpartition("/")[2],
                "X-CloudTasks-TaskName": message.name.rpartition("/")[2],
                "X-CloudTasks-TaskRetryCount": str(message.dispatch_count),
                "X-CloudTasks-TaskExecutionCount": str(message.response_count),
                "X-CloudTasks-TaskETA": f"{message.schedule_time.timestamp():.6f}",
            }
        )
        if task.previous_response is not None:
            headers["X-CloudTasks-TaskPreviousResponse"] = str(task.previous_response)
        if "oidc_token" in http_request:
            oidc = http_request.oidc_token
            token = self._signer.token(
                oidc.service_account_email, oidc.audience or http_request.url, now
            )
            headers = {n: v for n, v in headers.items() if n.lower() != "authorization"}
            headers["Authorization"] = f"Bearer {token}"
        attempt = tasks_v2.Attempt(schedule_time=message.schedule_time, dispatch_time=now)
        if task.first_dispatch is None:
            task.first_dispatch = now
            message.first_attempt = tasks_v2.Attempt(dispatch_time=now)
        message.last_attempt = attempt
        message.dispatch_count += 1
        task.in_flight = True
        return _Attempt(
            task=task,
            epoch=self._epoch,
            url=http_request.url,
            method=tasks_v2.HttpMethod(http_request.http_method).name,
            headers=headers,
            body=http_request.body,
            deadline=message.dispatch_deadline.total_seconds(),
            at=now,
        )

    def _send(self, attempt: _Attempt) -> None:
        sender = threading.Thread(
            target=self._deliver, args=(attempt,), name="cloud-tasks-attempt", daemon=True
        )
        self._senders.add(sender)
        sender.start()

    def _deliver(self, attempt: _Attempt) -> None:
        try:
            outcome = self._request(attempt)
            self._finish(attempt, outcome)
        finally:
            with self._condition:
                self._senders.discard(threading.current_thread())

    def _request(self, attempt: _Attempt) -> _Outcome:
        parts = urllib.parse.urlsplit(attempt.url)
        kind = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        connection = kind(parts.hostname or "", parts.port, timeout=attempt.deadline)
        with self._condition:
            if self._stopping:
                return _Outcome(None, "the emulator stopped", _rpc_code("CANCELLED"), _now())
            self._connections.add(connection)
        path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        try:
            body = attempt.body or None
            connection.request(attempt.method, path, body=body, headers=attempt.headers)
            with connection.getresponse() as response:
                response.read()
                status, reason = response.status, response.reason
        except TimeoutError:
            return _Outcome(
                None, "dispatch deadline exceeded", _rpc_code("DEADLINE_EXCEEDED"), _now()
            )
        except (OSError, http.client.HTTPException) as error:
            return _Outcome(
                None, f"{type(error).__name__}: {error}", _rpc_code("UNAVAILABLE"), _now()
            )
        finally:
            connection.close()
            with self._condition:
                self._connections.discard(connection)
        code = _OK if 200 <= status < 300 else _rpc_code(_HTTP_CODES.get(status, "UNKNOWN"))
        return _Outcome(status, None if code == _OK else reason, code, _now())

    def _finish(self, attempt: _Attempt, outcome: _Outcome) -> None:
        """Record the attempt; complete, reschedule or drop its task (under the lock)."""
        with self._condition:
            if attempt.epoch != self._epoch:
                return
            self._log.append(
                Dispatch(
                    task=attempt.task.message.name,
                    url=attempt.url,
                    at=attempt.at,
                    headers=attempt.headers,
                    status=outcome.status,
                    error=outcome.error,
                )
            )
            task = attempt.task
            task.in_flight = False
            if not self._current(task):
                return  # deleted while in flight: the answer no longer matters
            message = task.message
            message.last_attempt.response_time = outcome.at
            message.last_attempt.response_status = {
                "code": outcome.code,
                "message": outcome.error or "",
            }
            if outcome.status is not None:
                message.response_count += 1
                task.previous_response = outcome.status
            if outcome.code == _OK:
                self._retire(task, outcome.at)
                return
            policy = self._queues[task.queue].policy
            if "retry_config" in message:
                policy = RetryPolicy.from_message(message.retry_config, policy)
            assert task.first_dispatch is not None
            if policy.exhausted(message.dispatch_count, outcome.at - task.first_dispatch):
                self._retire(task, outcome.at)
                return
            message.schedule_time = outcome.at + policy.backoff(message.dispatch_count)
            task.due = message.schedule_time.timestamp()
            self._push(task)


def _queue_of_name(queue: str) -> str:
    return queue.rpartition("/queues/")[0]


def _validated_http_request(task: tasks_v2.Task) -> tasks_v2.HttpRequest:
    """The task's HTTP request with its method defaulted to POST; ``_Refused`` for what Cloud
    Tasks refuses and for what the emulator does not serve."""
    if "app_engine_http_request" in task:
        raise _Refused(grpc.StatusCode.UNIMPLEMENTED, "App Engine tasks are not emulated")
    if "http_request" not in task:
        raise _invalid("Task.http_request is required")
    request: tasks_v2.HttpRequest = tasks_v2.HttpRequest.deserialize(
        tasks_v2.HttpRequest.serialize(task.http_request)
    )
    parts = urllib.parse.urlsplit(request.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _invalid(f"HttpRequest.url must be an absolute http(s) URL, got {request.url!r}")
    if "oauth_token" in request:
        raise _Refused(grpc.StatusCode.UNIMPLEMENTED, "OAuth tokens are not emulated")
    if "oidc_token" in request and not request.oidc_token.service_account_email:
        raise _invalid("OidcToken.service_account_email is required")
    if request.http_method == tasks_v2.HttpMethod.HTTP_METHOD_UNSPECIFIED:
        request.http_method = tasks_v2.HttpMethod(tasks_v2.HttpMethod.POST)
    if request.body and request.http_method not in _BODY_METHODS:
        raise _invalid("HttpRequest.body is only allowed with POST, PUT or PATCH")
    return request


def _interrupt(connection: http.client.HTTPConnection) -> None:
    """Wake a thread blocked on ``connection`` (closing alone does not, on Linux)."""
    sock = connection.sock
    if sock is None:
        return
    with contextlib.suppress(OSError):  # already closed by its own thread
        sock.shutdown(socket.SHUT_RDWR)


# ---------------------------------------------------------------------- gRPC face


def _method(
    fn: Callable[[Any], Any], request_type: Any, response_serialize: Callable[[Any], bytes]
) -> Any:
    """A unary handler for ``fn``: refusals become the gRPC status they carry."""

    def handle(request: Any, context: Any) -> Any:
        try:
            return fn(request)
        except _Refused as refusal:
            context.abort(refusal.code, refusal.message)

    return grpc.unary_unary_rpc_method_handler(
        handle,
        request_deserializer=request_type.deserialize,
        response_serializer=response_serialize,
    )


def _service(backend: _Backend) -> Any:
    """The generic handler that serves the real method paths of CloudTasks."""
    queue, task = tasks_v2.Queue.serialize, tasks_v2.Task.serialize
    empty = _empty
    methods = {
        "CreateQueue": _method(backend.create_queue, tasks_v2.CreateQueueRequest, queue),
        "GetQueue": _method(backend.get_queue, tasks_v2.GetQueueRequest, queue),
        "ListQueues": _method(
            backend.list_queues, tasks_v2.ListQueuesRequest, tasks_v2.ListQueuesResponse.serialize
        ),
        "DeleteQueue": _method(backend.delete_queue, tasks_v2.DeleteQueueRequest, empty),
        "PurgeQueue": _method(backend.purge_queue, tasks_v2.PurgeQueueRequest, queue),
        "CreateTask": _method(backend.create_task, tasks_v2.CreateTaskRequest, task),
        "GetTask": _method(backend.get_task, tasks_v2.GetTaskRequest, task),
        "ListTasks": _method(
            backend.list_tasks, tasks_v2.ListTasksRequest, tasks_v2.ListTasksResponse.serialize
        ),
        "DeleteTask": _method(backend.delete_task, tasks_v2.DeleteTaskRequest, empty),
    }
    return grpc.method_handlers_generic_handler(SERVICE, methods)


class CloudTasksEmulator:
    """The Cloud Tasks emulator: a gRPC server and a dispatcher thread; a context manager.

    ``address`` (``HOST:PORT``) is what ``grpc.insecure_channel`` takes; ``client()`` builds a
    real client on such a channel. Tokens in dispatched requests verify against ``certs()``
    (also written to ``certs_path`` at start, when given). Stopping stops everything it runs.
    """

    def __init__(
        self,
        host: str = HOST,
        port: int = 0,
        *,
        dedup_window: timedelta = DEFAULT_DEDUP_WINDOW,
        certs_path: Path | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._certs_path = certs_path
        self._signer = _TokenSigner()
        self._backend = _Backend(dedup_window, self._signer)
        self._server: Any = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._bound = 0
        self._channels: list[Any] = []

    @property
    def address(self) -> str:
        if self._server is None:
            raise EmulatorError("the Cloud Tasks emulator is not running")
        return f"{self._host}:{self._bound}"

    def start(self) -> Self:
        if self._server is not None:
            return self
        if self._certs_path is not None:
            self._certs_path.write_text(json.dumps(self.certs(), indent=2) + "\n")
        executor = futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="cloud-tasks")
        server = grpc.server(executor, handlers=(_service(self._backend),))
        try:
            bound = server.add_insecure_port(f"{self._host}:{self._port}")
        except RuntimeError as error:
            executor.shutdown()
            raise EmulatorError(f"cannot listen on {self._host}:{self._port}: {error}") from None
        if not bound:
            executor.shutdown()
            raise EmulatorError(f"cannot listen on {self._host}:{self._port}")
        server.start()
        self._backend.start()
        self._server, self._executor, self._bound = server, executor, bound
        return self

    def stop(self) -> None:
        server, executor = self._server, self._executor
        self._server, self._executor = None, None
        # Channels first: a channel whose server went away first logs a GOAWAY to stderr.
        channels, self._channels = self._channels, []
        for channel in channels:
            channel.close()
        if server is not None:
            server.stop(grace=None).wait()
        self._backend.stop()
        if executor is not None:
            executor.shutdown(wait=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def certs(self) -> dict[str, str]:
        """``{kid: certificate PEM}``: what ``google.auth.jwt.decode(token, certs=...)`` takes."""
        return {self._signer.kid: self._signer.certificate}

    def client(self) -> tasks_v2.CloudTasksClient:
        """A real client on an insecure channel to the emulator (closed when it stops)."""
        channel = grpc.insecure_channel(self.address)
        self._channels.append(channel)
        return tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))

    def dispatched(self) -> list[Dispatch]:
        """Every HTTP attempt made since start (or the last reset), oldest first."""
        return self._backend.dispatched()

    def reset(self) -> None:
        """Forget queues, tasks, used names and the dispatch log; answers to requests in flight
        are ignored."""
        self._backend.reset()


# ---------------------------------------------------------------------- standalone


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m emulators.cloud_tasks",
        description="Serve the Cloud Tasks v2 emulator until interrupted.",
    )
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--certs", type=Path, help="write {kid: certificate PEM} JSON here")
    parser.add_argument(
        "--dedup-window",
        type=float,
        default=DEFAULT_DEDUP_WINDOW.total_seconds(),
        metavar="SECONDS",
        help="how long a task name stays used after its task is gone",
    )
    options = parser.parse_args(argv)
    if options.dedup_window < 0:
        parser.error("--dedup-window cannot be negative")
    stopped = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    emulator = CloudTasksEmulator(
        options.host,
        options.port,
        dedup_window=timedelta(seconds=options.dedup_window),
        certs_path=options.certs,
    )
    try:
        emulator.start()
    except EmulatorError as error:
        print(f"cloud tasks emulator: {error}", file=sys.stderr)
        return 1
    try:
        print(f"CLOUD_TASKS_EMULATOR_HOST={emulator.address}", flush=True)
        while not stopped.wait(1.0):
            pass
    finally:
        emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
