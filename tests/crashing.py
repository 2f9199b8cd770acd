"""Crash injection for reconciler tests: wrap the store and the providers so that the process
"dies" right after the N-th side effect (a write or a provider call)."""

from __future__ import annotations

from typing import Any

# Calls after which a crash is injected.
STORE_WRITES = ("change", "mark_pool_short", "record_ready", "mark_announced")
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


# More calls after which a crash can be injected (the release paths' crash suite counts them).
# The Compute Engine calls that change something: a crash can then fall between two calls of
# one provider operation (after a gang's VMs are deleted and before its resize request is,
# after a cancel and before the delete).
COMPUTE_CALLS = ("insert", "delete", "cancel", "delete_instances")
BUS_CALLS = ("publish",)
TIMER_CALLS = ("arm", "disarm")
# The Compute Engine clients a MIG provider holds (opendws.adapters.mig.MigFlexProvider).
_MIG_CLIENTS = ("_templates", "_groups", "_resize_requests", "_instances")


def crash_inside(provider: Any, steps: Steps, methods: tuple[str, ...] = COMPUTE_CALLS) -> None:
    """Make every Compute Engine call of ``methods`` that ``provider`` (a MigFlexProvider)
    makes a step too, by wrapping its clients in place."""
    for attribute in _MIG_CLIENTS:
        client = getattr(provider, attribute, None)
        if client is not None:
            setattr(provider, attribute, Crashing(client, methods, steps))
