"""The Cloud Tasks emulator's state: queues, tasks, used task names and the log of attempts,
behind one lock, on an injected clock.

It answers the queue and task methods (create, get, list, delete, purge) as Cloud Tasks does,
keeps the due tasks in order of their ``schedule_time``, and does the task-side bookkeeping of
an attempt: :meth:`Backend.begin_due` counts the attempts of every task due by the clock and
hands them out as :class:`Attempt` values; :meth:`Backend.finish` records an attempt's answer
and completes, reschedules (with the retry policy's backoff, from the clock's now) or drops its
task. Sending the HTTP requests is the dispatcher's (:mod:`emulators.cloud_tasks.dispatcher`).

Every "now" comes from the clock it is given, so a test on a frozen clock decides when a task is
due, when a retry is, and when a used name is free again.
"""

from __future__ import annotations

import heapq
import itertools
import secrets
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import grpc
from google.cloud import tasks_v2

from emulators.cloud_tasks.api import (
    DEFAULT_DISPATCH_DEADLINE,
    LOCATION,
    MAX_DISPATCH_DEADLINE,
    MAX_SCHEDULE_AHEAD,
    MIN_DISPATCH_DEADLINE,
    OK,
    QUEUE,
    TASK,
    Refused,
    RetryPolicy,
    copy_queue,
    copy_task,
    invalid,
    location_of,
    not_found,
    page,
    queue_of,
    require,
    validated_http_request,
)
from opendws.ports import Clock

DEFAULT_DEDUP_WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class Dispatch:
    """One HTTP attempt the dispatcher made: the task's full name, where it went, when (by the
    emulator's clock), with which headers, and its outcome — the HTTP ``status`` or, when no
    answer came, the ``error`` (a refused connection, the dispatch deadline passed)."""

    task: str
    url: str
    at: datetime
    headers: dict[str, str]
    status: int | None = None
    error: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


@dataclass
class _Task:
    """A pending task: its canonical FULL-view message, plus what dispatching needs.

    ``due`` is the instant of the heap entry that is current for it; older entries are
    skipped. ``in_flight`` tasks are never dispatched twice at once."""

    message: tasks_v2.Task
    queue: str
    due: datetime
    in_flight: bool = False
    previous_response: int | None = None
    first_dispatch: datetime | None = None


@dataclass
class _Queue:
    message: tasks_v2.Queue
    policy: RetryPolicy
    tasks: dict[str, _Task] = field(default_factory=dict)


@dataclass(frozen=True)
class Attempt:
    """One HTTP request to make for a task, counted on it under the lock and sent outside it:
    the task's own request (its headers as the task gives them) and what Cloud Tasks tells the
    target about the attempt."""

    task: _Task
    epoch: int
    name: str
    queue: str
    url: str
    method: str
    headers: dict[str, str]
    body: bytes
    deadline: float  # seconds
    at: datetime
    schedule_time: datetime
    retry_count: int  # attempts before this one
    execution_count: int  # attempts that got an answer
    previous_response: int | None
    oidc: tuple[str, str] | None  # (service account, audience) of the token to sign


@dataclass(frozen=True)
class Outcome:
    """What came back: the HTTP ``status`` (None when no answer came, then ``error`` says
    why), the google.rpc.Code it counts as, and when, by the emulator's clock."""

    status: int | None
    error: str | None
    code: int
    at: datetime


class Backend:
    """Queues, tasks, used task names and the dispatch log, behind one lock.

    Invariants: a task is in exactly one queue's ``tasks`` until it completes, is deleted or
    runs out of attempts; then its name goes to ``_used`` and is refused for the deduplication
    window. Attempt results for tasks no longer current (deleted, reset) are ignored.

    ``condition`` is that lock. It is reentrant, so that the dispatcher may call the backend
    while holding it, and it is notified whenever a task becomes due at a new instant, which is
    what the dispatcher waits for.
    """

    def __init__(self, clock: Clock, dedup_window: timedelta = DEFAULT_DEDUP_WINDOW) -> None:
        self._clock = clock
        self._dedup_window = dedup_window
        self.condition = threading.Condition(threading.RLock())
        self._queues: dict[str, _Queue] = {}
        self._used: dict[str, datetime] = {}
        self._log: list[Dispatch] = []
        self._heap: list[tuple[datetime, int, _Task]] = []
        self._sequence = itertools.count()
        self._epoch = 0

    # ------------------------------------------------------------------ queues

    def create_queue(self, request: tasks_v2.CreateQueueRequest) -> tasks_v2.Queue:
        require(LOCATION, request.parent, "location")
        queue = request.queue
        require(QUEUE, queue.name, "queue")
        if location_of(queue.name) != request.parent:
            raise invalid(f"Queue {queue.name!r} is not in location {request.parent!r}")
        if "http_target" in queue or "app_engine_routing_override" in queue:
            raise Refused(grpc.StatusCode.UNIMPLEMENTED, "queue-level targets are not emulated")
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
        with self.condition:
            if queue.name in self._queues:
                raise Refused(grpc.StatusCode.ALREADY_EXISTS, f"Queue {queue.name} exists")
            self._queues[queue.name] = _Queue(message, policy)
            return copy_queue(message)

    def get_queue(self, request: tasks_v2.GetQueueRequest) -> tasks_v2.Queue:
        with self.condition:
            return copy_queue(self._queue(request.name).message)

    def list_queues(self, request: tasks_v2.ListQueuesRequest) -> tasks_v2.ListQueuesResponse:
        require(LOCATION, request.parent, "location")
        prefix = request.parent + "/queues/"
        with self.condition:
            queues = [
                copy_queue(queue.message)
                for name, queue in sorted(self._queues.items())
                if name.startswith(prefix)
            ]
        items, token = page(queues, request.page_size, request.page_token)
        return tasks_v2.ListQueuesResponse(queues=items, next_page_token=token)

    def delete_queue(self, request: tasks_v2.DeleteQueueRequest) -> None:
        with self.condition:
            queue = self._queue(request.name)
            self._retire_all(queue)
            del self._queues[request.name]

    def purge_queue(self, request: tasks_v2.PurgeQueueRequest) -> tasks_v2.Queue:
        with self.condition:
            queue = self._queue(request.name)
            self._retire_all(queue)
            queue.message.purge_time = self._clock.now()
            return copy_queue(queue.message)

    # ------------------------------------------------------------------ tasks

    def create_task(self, request: tasks_v2.CreateTaskRequest) -> tasks_v2.Task:
        require(QUEUE, request.parent, "queue")
        given = request.task
        http_request = validated_http_request(given)
        now = self._clock.now()
        schedule = given.schedule_time if "schedule_time" in given else now
        if schedule - now > MAX_SCHEDULE_AHEAD:
            raise invalid(
                f"Task.schedule_time {schedule.isoformat()} is more than 30 days ahead: "
                "Cloud Tasks schedules at most 30 days in the future"
            )
        deadline = (
            given.dispatch_deadline if "dispatch_deadline" in given else DEFAULT_DISPATCH_DEADLINE
        )
        if not MIN_DISPATCH_DEADLINE <= deadline <= MAX_DISPATCH_DEADLINE:
            raise invalid("Task.dispatch_deadline must be between 15 seconds and 30 minutes")
        if given.name:
            require(TASK, given.name, "task")
            if queue_of(given.name) != request.parent:
                raise invalid(f"Task {given.name!r} is not in queue {request.parent!r}")
        message = tasks_v2.Task(
            http_request=http_request,
            schedule_time=schedule,
            create_time=now.replace(microsecond=0),
            dispatch_deadline=deadline,
            view=tasks_v2.Task.View.FULL,
        )
        with self.condition:
            queue = self._queue(request.parent)
            if "retry_config" in given:
                RetryPolicy.from_message(given.retry_config, queue.policy)
                message.retry_config = given.retry_config
            message.name = given.name or self._fresh_name(request.parent, now)
            self._refuse_used(message.name, now)
            task = _Task(message=message, queue=request.parent, due=message.schedule_time)
            queue.tasks[message.name] = task
            self._push(task)
            return copy_task(message, request.response_view)

    def get_task(self, request: tasks_v2.GetTaskRequest) -> tasks_v2.Task:
        with self.condition:
            return copy_task(self._task(request.name).message, request.response_view)

    def list_tasks(self, request: tasks_v2.ListTasksRequest) -> tasks_v2.ListTasksResponse:
        with self.condition:
            queue = self._queue(request.parent)
            tasks = [
                copy_task(task.message, request.response_view)
                for _, task in sorted(queue.tasks.items())
            ]
        items, token = page(tasks, request.page_size, request.page_token)
        return tasks_v2.ListTasksResponse(tasks=items, next_page_token=token)

    def delete_task(self, request: tasks_v2.DeleteTaskRequest) -> None:
        with self.condition:
            task = self._task(request.name)
            self._retire(task, self._clock.now())

    # ------------------------------------------------------------------ the emulator's own

    def reset(self) -> None:
        """Forget queues, tasks, used names and the log; attempts in flight become stale."""
        with self.condition:
            self._queues.clear()
            self._used.clear()
            self._log.clear()
            self._heap.clear()
            self._epoch += 1

    def dispatched(self) -> list[Dispatch]:
        with self.condition:
            return list(self._log)

    # ------------------------------------------------------------------ attempts

    def next_due(self) -> datetime | None:
        """The earliest instant a task falls due (perhaps a stale entry's), if any."""
        with self.condition:
            return self._heap[0][0] if self._heap else None

    def begin_due(self) -> list[Attempt]:
        """Count an attempt on every current task due by the clock's now that is not already in
        flight, and return them; each must be answered with :meth:`finish`."""
        with self.condition:
            now = self._clock.now()
            attempts = []
            while self._heap and self._heap[0][0] <= now:
                due, _, task = heapq.heappop(self._heap)
                if self._current(task) and not task.in_flight and task.due == due:
                    attempts.append(self._begin(task, now))
            return attempts

    def finish(self, attempt: Attempt, headers: dict[str, str], outcome: Outcome) -> None:
        """Log the attempt (sent with ``headers``); complete, reschedule or drop its task."""
        with self.condition:
            if attempt.epoch != self._epoch:
                return
            self._log.append(
                Dispatch(
                    task=attempt.name,
                    url=attempt.url,
                    at=attempt.at,
                    headers=headers,
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
            if outcome.code == OK:
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
            task.due = message.schedule_time
            self._push(task)

    def _begin(self, task: _Task, now: datetime) -> Attempt:
        """Count the attempt on the task and describe its request (the lock is held)."""
        message = task.message
        http_request = message.http_request
        oidc = None
        if "oidc_token" in http_request:
            token = http_request.oidc_token
            oidc = (token.service_account_email, token.audience or http_request.url)
        attempt = Attempt(
            task=task,
            epoch=self._epoch,
            name=message.name,
            queue=task.queue,
            url=http_request.url,
            method=tasks_v2.HttpMethod(http_request.http_method).name,
            headers=dict(http_request.headers.items()),
            body=http_request.body,
            deadline=message.dispatch_deadline.total_seconds(),
            at=now,
            schedule_time=message.schedule_time,
            retry_count=message.dispatch_count,
            execution_count=message.response_count,
            previous_response=task.previous_response,
            oidc=oidc,
        )
        if task.first_dispatch is None:
            task.first_dispatch = now
            message.first_attempt = tasks_v2.Attempt(dispatch_time=now)
        message.last_attempt = tasks_v2.Attempt(
            schedule_time=message.schedule_time, dispatch_time=now
        )
        message.dispatch_count += 1
        task.in_flight = True
        return attempt

    # ------------------------------------------------------------------ lookups (locked)

    def _queue(self, name: str) -> _Queue:
        require(QUEUE, name, "queue")
        queue = self._queues.get(name)
        if queue is None:
            raise not_found(f"Queue {name} does not exist")
        return queue

    def _task(self, name: str) -> _Task:
        require(TASK, name, "task")
        task = self._queue(queue_of(name)).tasks.get(name)
        if task is None:
            raise not_found(f"Task {name} does not exist")
        return task

    def _current(self, task: _Task) -> bool:
        queue = self._queues.get(task.queue)
        return queue is not None and queue.tasks.get(task.message.name) is task

    def _fresh_name(self, parent: str, now: datetime) -> str:
        while True:
            # Shaped like the ids Cloud Tasks generates: a long decimal number.
            name = f"{parent}/tasks/{secrets.randbelow(10**20):020d}"
            if not self._is_used(name, now):
                return name

    def _is_used(self, name: str, now: datetime) -> bool:
        freed = self._used.get(name)
        if freed is not None and now - freed >= self._dedup_window:
            del self._used[name]
            freed = None
        return freed is not None or self._task_exists(name)

    def _task_exists(self, name: str) -> bool:
        queue = self._queues.get(queue_of(name))
        return queue is not None and name in queue.tasks

    def _refuse_used(self, name: str, now: datetime) -> None:
        if self._task_exists(name):
            raise Refused(grpc.StatusCode.ALREADY_EXISTS, f"Task {name} already exists")
        if self._is_used(name, now):
            raise Refused(
                grpc.StatusCode.ALREADY_EXISTS,
                f"Task {name} cannot be created: a task with this name existed too recently "
                f"(names stay used for {self._dedup_window} after the task is gone)",
            )

    def _retire(self, task: _Task, now: datetime) -> None:
        """Take ``task`` out of its queue for good; its name stays used for the window."""
        del self._queues[task.queue].tasks[task.message.name]
        self._used[task.message.name] = now

    def _retire_all(self, queue: _Queue) -> None:
        now = self._clock.now()
        for task in list(queue.tasks.values()):
            self._retire(task, now)

    def _push(self, task: _Task) -> None:
        heapq.heappush(self._heap, (task.due, next(self._sequence), task))
        self.condition.notify_all()
