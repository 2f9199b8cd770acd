"""Crash injection for reconciler tests: wrap the store and the providers so that the process
"dies" right after the N-th side effect (a write or a provider call)."""

from __future__ import annotations

from typing import Any

# Calls after which a crash is injected.
STORE_WRITES = ("change", "mark_pool_short", "mark_announced")
PROVIDER_CALLS = ("provision", "reserve", "release")


class Crash(BaseException):
    """The process died (a BaseException: nothing in the service may swallow it)."""


class Steps:
    """Counts side effects and crashes once, right after the ``crash_at``-th."""

    def __init__(self, crash_at: int | None = None) -> None:
        self.crash_at = crash_at
        self.count = 0
        self.crashed = False

    def after(self, what: str) -> None:
        self.count += 1
        if self.count == self.crash_at:
            self.crashed = True
            raise Crash(f"crash after step {self.count} ({what})")


class Crashing:
    """Wraps a store or provider; each call named in ``methods`` is a step."""

    def __init__(self, inner: Any, methods: tuple[str, ...], steps: Steps) -> None:
        self._inner = inner
        self._methods = methods
        self._steps = steps

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name not in self._methods:
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attribute(*args, **kwargs)
            self._steps.after(name)
            return result

        return call
