"""``dws up --operation-latency SECONDS --rate-quotas``: how long the local stack's simulated
Compute operations take, and whether Google's default rate quotas are enforced
(compute/docs/api-rate-limits)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta

import pytest
from click.testing import CliRunner

import emulators
import emulators.stack as stack_module
from opendws.cli import main
from opendws.sim.cloud import OPERATION_LATENCY


@pytest.fixture
def given(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """``dws up`` on a stand-in stack that records what it was given and stops at once."""
    seen: dict[str, object] = {}

    @contextlib.contextmanager
    def local_stack(**options: object) -> Iterator[object]:
        seen.update(options)
        raise KeyboardInterrupt
        yield  # pragma: no cover

    monkeypatch.setattr(emulators, "missing_reason", lambda: None)
    monkeypatch.setattr(stack_module, "local_stack", local_stack)
    return seen


def test_up_gives_the_stack_googles_operation_latency_and_no_quotas_by_default(
    given: dict[str, object],
) -> None:
    result = CliRunner().invoke(main, ["up"])
    assert result.exit_code == 0, result.output
    assert given["operation_latency"] == OPERATION_LATENCY
    assert given["rate_quotas"] is False


def test_up_takes_an_operation_latency_and_turns_the_rate_quotas_on(
    given: dict[str, object],
) -> None:
    result = CliRunner().invoke(main, ["up", "--operation-latency", "0.5", "--rate-quotas"])
    assert result.exit_code == 0, result.output
    assert given["operation_latency"] == timedelta(seconds=0.5)
    assert given["rate_quotas"] is True


def test_up_refuses_a_negative_operation_latency(given: dict[str, object]) -> None:
    result = CliRunner().invoke(main, ["up", "--operation-latency", "-1"])
    assert result.exit_code == 2
    assert "--operation-latency" in result.output
