"""The job's output: echoed on the agent's own stdout/stderr (the serial console, the
journal) and shipped to the agent function in batches of at most 256 lines and 256 KiB."""

from __future__ import annotations

import collections
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import TypedDict

from opendws.agent.backoff import Backoff
from opendws.agent.transport import Refused, Unreachable

MAX_LINES = 256
MAX_BYTES = 256 * 1024
# A longer line is cut: even escaped as JSON (at most 12 bytes a character) it fits a batch.
MAX_LINE_CHARS = 16 * 1024
# Lines kept while the function is unreachable; beyond, the oldest are dropped (and counted).
MAX_PENDING = 20_000
LINGER_S = 0.2  # how long a first line waits for company before it is sent


class Line(TypedDict):
    stream: str  # "stdout" or "stderr"
    text: str


def _size(line: Line) -> int:
    return len(json.dumps(line)) + 2  # and the separator


class LogShipper:
    """Collects lines from the job's streams and sends them, in order, from a thread of its
    own. ``send`` raises :class:`Unreachable` to be retried with backoff."""

    def __init__(self, send: Callable[[list[Line]], None], echo: bool = True) -> None:
        self._send = send
        self._echo = echo
        self._pending: collections.deque[Line] = collections.deque()
        self._dropped = 0
        self._closing_until: float | None = None
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="opendws-logs", daemon=True)

    def add(self, stream: str, text: str) -> None:
        if self._echo:
            out = sys.stderr if stream == "stderr" else sys.stdout
            # An echo that cannot be written (a closed console) must not stop the job's output.
            with contextlib.suppress(OSError, ValueError):
                out.write(text + "\n")
                out.flush()
        with self._changed:
            if len(self._pending) >= MAX_PENDING:
                self._pending.popleft()
                self._dropped += 1
            self._pending.append({"stream": stream, "text": text[:MAX_LINE_CHARS]})
            self._changed.notify_all()

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout_s: float) -> None:
        """Send what is left, giving up after ``timeout_s`` if the function is unreachable."""
        with self._changed:
            self._closing_until = time.monotonic() + timeout_s
            self._changed.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s + 1.0)

    def _take(self) -> list[Line] | None:
        """The next batch, or None once closed and drained."""
        with self._changed:
            while not self._pending and self._closing_until is None:
                self._changed.wait()
            if not self._pending:
                return None
            if self._closing_until is None:
                # Let a first line wait a moment for the ones behind it.
                self._changed.wait_for(lambda: len(self._pending) >= MAX_LINES, LINGER_S)
            batch: list[Line] = []
            size = 0
            if self._dropped:
                notice: Line = {
                    "stream": "stderr",
                    "text": f"[opendws agent] {self._dropped} lines dropped "
                    "while the agent function was unreachable",
                }
                batch.append(notice)
                size += _size(notice)
                self._dropped = 0
            while self._pending and len(batch) < MAX_LINES:
                line_size = _size(self._pending[0])
                if batch and size + line_size > MAX_BYTES:
                    break
                batch.append(self._pending.popleft())
                size += line_size
            return batch

    def _time_left(self) -> float | None:
        """Seconds left to send before giving up; None while not closing."""
        with self._changed:
            if self._closing_until is None:
                return None
            return self._closing_until - time.monotonic()

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            backoff = Backoff()
            while True:
                try:
                    self._send(batch)
                    break
                except Refused as refused:
                    sys.stderr.write(f"opendws-agent: log lines refused ({refused})\n")
                    break
                except Unreachable as error:
                    left = self._time_left()
                    if left is not None and left <= 0:
                        sys.stderr.write(f"opendws-agent: log lines not sent ({error})\n")
                        break
                    delay = backoff.next_delay()
                    time.sleep(delay if left is None else min(delay, left))
