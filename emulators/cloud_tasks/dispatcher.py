"""The Cloud Tasks emulator's dispatcher: it sends every due task to its URL as Cloud Tasks does,
and hands the answer back to the backend.

A dispatched request carries the task's own method, headers and body, minus the headers Cloud
Tasks replaces, plus Cloud Tasks' own (``User-Agent: Google-Cloud-Tasks``, ``X-CloudTasks-*``)
and, for a task with an ``oidc_token``, a bearer JWT from the emulator's signer. Each attempt
runs on a thread of its own, so that a slow target delays no other task; its dispatch deadline
is the socket timeout.

When does a task fall due? When the emulator's clock says so. A thread waits for the next due
instant; on a :class:`~opendws.clock.ManualClock` it also wakes whenever that clock moves, so an
advance dispatches at once. For tests on a frozen clock, :meth:`Dispatcher.dispatch_due` is the
synchronous way: it begins everything due now and returns once every attempt has its answer, so
that "nothing was sent" is a fact to assert, not a wait.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import urllib.parse
from datetime import datetime

from emulators.cloud_tasks.api import OK, http_rpc_code, rpc_code
from emulators.cloud_tasks.backend import Attempt, Backend, Outcome
from emulators.cloud_tasks.signer import TokenSigner
from opendws.clock import ManualClock
from opendws.ports import Clock

USER_AGENT = "Google-Cloud-Tasks"
# Task headers Cloud Tasks ignores or replaces with its own (prefixes, lower case).
_REPLACED_HEADERS = ("host", "content-length", "user-agent", "x-google-", "x-appengine-",
                     "x-cloudtasks-")  # fmt: skip
# The dispatcher re-reads its clock at least this often, so that a step of a clock that does not
# announce its moves (the system clock) is noticed.
_LONGEST_WAIT = 0.25
# How long stopping waits for each attempt thread that is still connecting.
_SENDER_JOIN = 5.0
# How long dispatch_due waits, by default, for the answers of the attempts in flight.
DISPATCH_DUE_TIMEOUT = 30.0


def request_headers(attempt: Attempt, signer: TokenSigner) -> dict[str, str]:
    """The headers Cloud Tasks sends for ``attempt``: the task's own, minus those it replaces,
    with its own added and, for an OIDC task, a bearer token dated at the attempt."""
    headers = {
        name: value
        for name, value in attempt.headers.items()
        if not name.lower().startswith(_REPLACED_HEADERS)
    }
    if attempt.body and not any(n.lower() == "content-type" for n in headers):
        headers["Content-Type"] = "application/octet-stream"
    headers.update(
        {
            "User-Agent": USER_AGENT,
            "X-CloudTasks-QueueName": attempt.queue.rpartition("/")[2],
            "X-CloudTasks-TaskName": attempt.name.rpartition("/")[2],
            "X-CloudTasks-TaskRetryCount": str(attempt.retry_count),
            "X-CloudTasks-TaskExecutionCount": str(attempt.execution_count),
            "X-CloudTasks-TaskETA": f"{attempt.schedule_time.timestamp():.6f}",
        }
    )
    if attempt.previous_response is not None:
        headers["X-CloudTasks-TaskPreviousResponse"] = str(attempt.previous_response)
    if attempt.oidc is not None:
        email, audience = attempt.oidc
        token = signer.token(email, audience, attempt.at)
        headers = {n: v for n, v in headers.items() if n.lower() != "authorization"}
        headers["Authorization"] = f"Bearer {token}"
    return headers


class Dispatcher:
    """The dispatcher thread and the attempt threads it starts; everything under the backend's
    lock. Stopping cuts the requests in flight and waits for every thread it started."""

    def __init__(self, backend: Backend, signer: TokenSigner, clock: Clock) -> None:
        self._backend = backend
        self._signer = signer
        self._clock = clock
        self._condition = backend.condition
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._senders: set[threading.Thread] = set()
        self._connections: set[http.client.HTTPConnection] = set()
        if isinstance(clock, ManualClock):
            clock.on_move(self._wake)

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

    def dispatch_due(self, timeout: float = DISPATCH_DUE_TIMEOUT) -> None:
        """Begin every task due by the clock's now, and return once no attempt is in flight,
        every answer recorded (in ``dispatched()`` and on its task). TimeoutError if some
        attempt still waits for its answer after ``timeout`` seconds.

        Meant for a frozen clock, on which what is due stays due until the clock moves: a
        retry is scheduled after the answer, from the clock's unmoved now, so it is not due
        yet. The dispatcher thread may have begun some of these attempts; they are waited for
        all the same."""
        with self._condition:
            for attempt in self._backend.begin_due():
                self._send(attempt)
            if not self._condition.wait_for(lambda: not self._senders, timeout):
                raise TimeoutError(f"attempts still in flight after {timeout} s")

    def _wake(self, moment: datetime) -> None:
        """The clock moved: look again at what is due."""
        with self._condition:
            self._condition.notify_all()

    def _run(self) -> None:
        with self._condition:
            while not self._stopping:
                for attempt in self._backend.begin_due():
                    self._send(attempt)
                self._condition.wait(self._wait())

    def _wait(self) -> float:
        """How long to sleep until the next due instant, in real seconds, capped (the lock
        is held)."""
        due = self._backend.next_due()
        if due is None:
            return _LONGEST_WAIT
        wait = (due - self._clock.now()).total_seconds()
        return min(max(wait, 0.0), _LONGEST_WAIT)

    def _send(self, attempt: Attempt) -> None:
        """Start the attempt's thread (the lock is held)."""
        sender = threading.Thread(
            target=self._deliver, args=(attempt,), name="cloud-tasks-attempt", daemon=True
        )
        self._senders.add(sender)
        sender.start()

    def _deliver(self, attempt: Attempt) -> None:
        try:
            headers = request_headers(attempt, self._signer)
            outcome = self._request(attempt, headers)
            self._backend.finish(attempt, headers, outcome)
        finally:
            with self._condition:
                self._senders.discard(threading.current_thread())
                self._condition.notify_all()

    def _request(self, attempt: Attempt, headers: dict[str, str]) -> Outcome:
        parts = urllib.parse.urlsplit(attempt.url)
        kind = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        connection = kind(parts.hostname or "", parts.port, timeout=attempt.deadline)
        with self._condition:
            if self._stopping:
                return Outcome(
                    None, "the emulator stopped", rpc_code("CANCELLED"), self._clock.now()
                )
            self._connections.add(connection)
        path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        try:
            body = attempt.body or None
            connection.request(attempt.method, path, body=body, headers=headers)
            with connection.getresponse() as response:
                response.read()
                status, reason = response.status, response.reason
        except TimeoutError:
            return Outcome(
                None,
                "dispatch deadline exceeded",
                rpc_code("DEADLINE_EXCEEDED"),
                self._clock.now(),
            )
        except (OSError, http.client.HTTPException) as error:
            return Outcome(
                None,
                f"{type(error).__name__}: {error}",
                rpc_code("UNAVAILABLE"),
                self._clock.now(),
            )
        finally:
            connection.close()
            with self._condition:
                self._connections.discard(connection)
        code = http_rpc_code(status)
        return Outcome(status, None if code == OK else reason, code, self._clock.now())


def _interrupt(connection: http.client.HTTPConnection) -> None:
    """Wake a thread blocked on ``connection`` (closing alone does not, on Linux)."""
    sock = connection.sock
    if sock is None:
        return
    with contextlib.suppress(OSError):  # already closed by its own thread
        sock.shutdown(socket.SHUT_RDWR)
