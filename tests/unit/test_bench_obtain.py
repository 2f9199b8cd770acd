"""bench/obtain.py keeps working: a tiny stream on the simulated cloud through the emulator and
the real providers, under the baseline and eager racing, gives figures of the JSON's shape."""

from __future__ import annotations

import importlib.util
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "obtain.py"


@pytest.fixture(scope="module")
def obtain() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_obtain", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_stream_is_seeded_and_allowed_everywhere(obtain: ModuleType) -> None:
    first = obtain.stream(3, 0.5, 2.0)
    assert first == obtain.stream(3, 0.5, 2.0)
    assert first != obtain.stream(4, 0.5, 2.0)
    for request in first:
        assert sorted(request.locations) == sorted(obtain.ZONES)
        assert 1 <= request.gang.vm_count <= 4
        assert timedelta(hours=1) <= request.run_duration <= timedelta(hours=6)
    assert [r.locations[0] for r in first[:3]] == list(obtain.ZONES)  # the order rotates


def test_a_tiny_stream_runs_under_two_strategies(obtain: ModuleType) -> None:
    requests = obtain.stream(1, 1 / 12, 3.0, max_wait=timedelta(hours=1))[:3]
    assert requests
    by_name = {strategy.name: strategy for strategy in obtain.STRATEGIES}
    for name in ("wait_one_zone", "race_k2_eager"):
        outcome = obtain.run_strategy(by_name[name], requests, 1)
        figures = outcome.figures()
        assert set(figures) == {"mean_s", "p50_s", "p95_s", "timed_out", "wasted_gang_minutes"}
        assert len(outcome.admission_to_active) + outcome.timed_out == len(requests)
        assert outcome.wasted_gang_minutes >= 0
        assert outcome.leaks == 0
