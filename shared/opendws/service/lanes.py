"""Keyed lanes: work submitted under one key runs in submission order, one item at a time, while
the work of other keys runs beside it on the other lanes (a key always lands on the same lane).

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


class Lanes:
    """``count`` lanes, each one thread."""

    def __init__(self, count: int, name: str) -> None:
        if count < 1:
            raise ValueError(f"at least one lane is needed, not {count}")
        self._lanes = [
            ThreadPoolExecutor(1, thread_name_prefix=f"{name}-{index}") for index in range(count)
        ]

    def submit(self, key: str, work: Callable[[], None]) -> Future[None]:
        """Run ``work`` after everything submitted under ``key`` before it, in the submitter's
        context (its log lines carry the submitter's trace)."""
        lane = self._lanes[zlib.crc32(key.encode()) % len(self._lanes)]
        return lane.submit(contextvars.copy_context().run, work)
