"""The real clock (the Clock port): the only place that reads the wall clock."""

from __future__ import annotations

from datetime import UTC, datetime


class SystemClock:
    """Now, timezone-aware UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)
