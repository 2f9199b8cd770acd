"""What the Cloud Tasks v2 API itself says, apart from any state: its limits and defaults, the
shape of its names, the requests it refuses (and with which status code), its pages and task
views, and its retry rule (:class:`RetryPolicy`).

Pure functions and values over ``google.cloud.tasks_v2`` messages: no clock, no lock, no I/O.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import grpc
from google.cloud import tasks_v2

SERVICE = "google.cloud.tasks.v2.CloudTasks"
# Cloud Tasks' own limits and defaults.
MAX_SCHEDULE_AHEAD = timedelta(days=30)
DEFAULT_DISPATCH_DEADLINE = timedelta(minutes=10)
MIN_DISPATCH_DEADLINE = timedelta(seconds=15)
MAX_DISPATCH_DEADLINE = timedelta(minutes=30)

LOCATION = r"projects/[A-Za-z0-9.:-]+/locations/[A-Za-z0-9-]+"
QUEUE = LOCATION + r"/queues/[A-Za-z0-9-]{1,100}"
TASK = QUEUE + r"/tasks/[A-Za-z0-9_-]{1,500}"
# Methods that may carry a body in Cloud Tasks.
_BODY_METHODS = frozenset({tasks_v2.HttpMethod.POST, tasks_v2.HttpMethod.PUT,
                           tasks_v2.HttpMethod.PATCH})  # fmt: skip
_DEFAULT_PAGE = 1000
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
OK = 0


class Refused(Exception):
    """A request the API refuses: answered with this gRPC status code and message."""

    def __init__(self, code: Any, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> Refused:
    return Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> Refused:
    return Refused(grpc.StatusCode.NOT_FOUND, message)


def rpc_code(name: str) -> int:
    """The google.rpc.Code number of a status code name."""
    return int(grpc.StatusCode[name].value[0])


def http_rpc_code(status: int) -> int:
    """The google.rpc.Code an HTTP answer counts as: OK for any 2xx."""
    return OK if 200 <= status < 300 else rpc_code(_HTTP_CODES.get(status, "UNKNOWN"))


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
        ``Refused`` (INVALID_ARGUMENT) when its values are out of range."""
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
            raise invalid(f"RetryConfig.max_attempts must be -1 or more, got {max_attempts}")
        if max_doublings < 0:
            raise invalid(f"RetryConfig.max_doublings must be 0 or more, got {max_doublings}")
        if min(min_backoff, max_backoff, duration) < timedelta(0):
            raise invalid("RetryConfig durations cannot be negative")
        if min_backoff > max_backoff:
            raise invalid("RetryConfig.min_backoff must not be greater than max_backoff")
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


def copy_task(task: tasks_v2.Task, view: tasks_v2.Task.View) -> tasks_v2.Task:
    """A copy of ``task`` in ``view``: BASIC leaves out the body, as Cloud Tasks does."""
    answer: tasks_v2.Task = tasks_v2.Task.deserialize(tasks_v2.Task.serialize(task))
    if view == tasks_v2.Task.View.FULL:
        answer.view = tasks_v2.Task.View(tasks_v2.Task.View.FULL)
    else:
        answer.view = tasks_v2.Task.View(tasks_v2.Task.View.BASIC)
        answer.http_request.body = b""
    return answer


def copy_queue(queue: tasks_v2.Queue) -> tasks_v2.Queue:
    copy: tasks_v2.Queue = tasks_v2.Queue.deserialize(tasks_v2.Queue.serialize(queue))
    return copy


def page(items: list[Any], size: int, token: str) -> tuple[list[Any], str]:
    """One page of ``items`` and the next page's token (an offset; empty on the last page)."""
    if size < 0:
        raise invalid("page_size cannot be negative")
    try:
        start = int(token or 0)
    except ValueError:
        raise invalid(f"Invalid page_token {token!r}") from None
    end = start + (size or _DEFAULT_PAGE)
    return items[start:end], (str(end) if end < len(items) else "")


def require(pattern: str, name: str, what: str) -> None:
    if re.fullmatch(pattern, name) is None:
        raise invalid(f"Invalid {what} name {name!r}")


def queue_of(task_name: str) -> str:
    return task_name.rpartition("/tasks/")[0]


def location_of(queue: str) -> str:
    return queue.rpartition("/queues/")[0]


def validated_http_request(task: tasks_v2.Task) -> tasks_v2.HttpRequest:
    """The task's HTTP request with its method defaulted to POST; ``Refused`` for what Cloud
    Tasks refuses and for what the emulator does not serve."""
    if "app_engine_http_request" in task:
        raise Refused(grpc.StatusCode.UNIMPLEMENTED, "App Engine tasks are not emulated")
    if "http_request" not in task:
        raise invalid("Task.http_request is required")
    request: tasks_v2.HttpRequest = tasks_v2.HttpRequest.deserialize(
        tasks_v2.HttpRequest.serialize(task.http_request)
    )
    parts = urllib.parse.urlsplit(request.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise invalid(f"HttpRequest.url must be an absolute http(s) URL, got {request.url!r}")
    if "oauth_token" in request:
        raise Refused(grpc.StatusCode.UNIMPLEMENTED, "OAuth tokens are not emulated")
    if "oidc_token" in request and not request.oidc_token.service_account_email:
        raise invalid("OidcToken.service_account_email is required")
    if request.http_method == tasks_v2.HttpMethod.HTTP_METHOD_UNSPECIFIED:
        request.http_method = tasks_v2.HttpMethod(tasks_v2.HttpMethod.POST)
    if request.body and request.http_method not in _BODY_METHODS:
        raise invalid("HttpRequest.body is only allowed with POST, PUT or PATCH")
    return request
