"""Work ordered by key: what is submitted under one key runs in submission order, one item at a
time, while the work of other keys runs beside it on other threads (a key always lands on the
same thread).

The reconciler publishes a pass's events and sets its requests' timers through them
(:mod:`opendws.service.reconcile`): each request's in their order, off the pass's thread, so
that publishing, moving the outbox cursor and calling Cloud Tasks overlap the pass's next
writes instead of adding to each one. The outbox makes that safe for events: a record's events
are stored with it (``outbox`` set) before they are published, and what a crash or a failure
leaves unpublished is published by a later pass; a timer not set costs promptness only (the
sweep ends runs that outlive their time).
"""

from __future__ import annotations

import contextvars
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class OrderedByKey:
    """``count`` threads, each running the work of the keys that land on it in order."""

    def __init__(self, count: int, name: str) -> None:
        if count < 1:
            raise ValueError(f"at least one thread is needed, not {count}")
        self._threads = [
            ThreadPoolExecutor(1, thread_name_prefix=f"{name}-{index}") for index in range(count)
        ]

    def submit(self, key: str, work: Callable[[], None]) -> Future[None]:
        """Run ``work`` after everything submitted under ``key`` before it, in the submitter's
        context (its log lines carry the submitter's trace)."""
        thread = self._threads[zlib.crc32(key.encode()) % len(self._threads)]
        return thread.submit(contextvars.copy_context().run, work)
