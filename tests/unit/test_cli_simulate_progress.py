"""``dws simulate`` shows its progress on a terminal — a bar per policy with jobs done, the
simulated day, elapsed and remaining time — and nothing of it when piped or with --json."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

from opendws.cli import replay as cli_replay
from opendws.replay.baselines import Policy
from opendws.replay.traces import TraceJob

START = datetime(2017, 10, 1, tzinfo=UTC)
JOBS = [
    TraceJob(job_id=f"j{day}", submitted_at=START + timedelta(days=day), gpus=1,
             duration=timedelta(hours=1), tenant="t")
    for day in range(10)
]  # fmt: skip


def test_a_terminal_sees_jobs_and_days_per_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=120, color_system=None)
    monkeypatch.setattr(cli_replay, "errors", terminal)
    with cli_replay.replay_progress(JOBS, [Policy.OPENDWS, Policy.FIFO], shown=True) as report:
        assert report is not None
        report(Policy.OPENDWS)(4, START + timedelta(days=3, hours=2))
        report(Policy.FIFO)(10, START + timedelta(days=9))
    shown = screen.getvalue()
    assert "4/10 jobs, day 4/9" in shown
    assert "10/10 jobs, day 9/9" in shown


def test_nothing_is_shown_when_quiet() -> None:
    with cli_replay.replay_progress(JOBS, [Policy.OPENDWS], shown=False) as report:
        assert report is None
