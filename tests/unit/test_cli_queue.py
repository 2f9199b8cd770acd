"""``dws queue`` and ``dws status`` on a stored queue: each held request's ETA and ready ETA
(eta + its pool's admission → ACTIVE median, and 90th percentile)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner

from opendws import bootstrap
from opendws.adapters.memory import (
    MemoryConfigStore,
    MemoryEventBus,
    MemoryNudger,
    MemoryRequestPublisher,
    MemoryRequestStore,
)
from opendws.cli import main
from opendws.cli.common import relative
from opendws.clock import ManualClock
from opendws.domain.readiness import ReadySample
from opendws.domain.states import RequestState
from opendws.ports import Change, StatusEvent, accepted
from tests.builders import A3, ZONE, flex

POOL = f"{ZONE}/{A3}"
# The CLI reads the wall clock; the samples must be recent against it.
NOW = datetime.now(UTC).replace(microsecond=0)
ETA = NOW + timedelta(hours=2)


@pytest.fixture
def store() -> Iterator[MemoryRequestStore]:
    store = MemoryRequestStore()
    record, event = accepted(flex("held", vm_count=2, submitted_at=NOW), NOW)
    store.create(record, event)
    held = StatusEvent(
        request_id="held", tenant="t", state=RequestState.PENDING,
        previous_state=RequestState.PENDING, at=NOW, reason="NO_CAPACITY_UNTIL", eta=ETA,
        pool=POOL, position=1,
    )  # fmt: skip
    store.change("held", Change(
        expected_version=1, state=RequestState.PENDING, event=held, reason="NO_CAPACITY_UNTIL",
        pool=POOL, eta=ETA, position=1,
    ))  # fmt: skip
    for index, minutes in enumerate((4, 6, 30)):
        took = timedelta(minutes=minutes)
        store.record_ready(POOL, ReadySample(request_id=f"s{index}", at=NOW, took=took))
    adapters = bootstrap.Adapters(
        store=store, config=MemoryConfigStore(), events=MemoryEventBus(),
        nudger=MemoryNudger(), publisher=MemoryRequestPublisher(), clock=ManualClock(NOW),
    )  # fmt: skip
    settings = bootstrap.Settings.from_environment({"OPENDWS_PROJECT": "cli-test"})
    previous = bootstrap.use(bootstrap.Container(settings, adapters=adapters))
    yield store
    bootstrap.use(previous)


def dws(*args: str) -> str:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def iso(at: datetime) -> str:
    return at.isoformat(timespec="seconds")


@pytest.mark.usefixtures("store")
def test_the_queue_shows_both_times() -> None:
    (entry,) = json.loads(dws("queue", "--json"))
    assert (entry["eta"], entry["ready_eta"], entry["ready_eta_p90"]) == (
        iso(ETA), iso(ETA + timedelta(minutes=6)), iso(ETA + timedelta(minutes=30)),
    )  # fmt: skip
    wide = dws("queue", "--wide")
    assert f"{iso(ETA + timedelta(minutes=6))} ({iso(ETA + timedelta(minutes=30))})" in wide


@pytest.mark.usefixtures("store")
def test_the_queue_fits_an_80_column_terminal_with_relative_times() -> None:
    table = CliRunner(env={"COLUMNS": "80"}).invoke(main, ["queue"]).stdout
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = [line for line in lines if line.lstrip().startswith("held")]
    assert len(rows) == 1, table
    row = rows[0]
    assert row.split() == [
        "held", "t", "1", "in", "2", "h", "in", "2", "h", "6", "min", "NO_CAPACITY_UNTIL", "0s",
    ]  # fmt: skip


@pytest.mark.usefixtures("store")
def test_status_shows_both_times() -> None:
    shown = json.loads(dws("status", "held", "--json"))
    assert (shown["eta"], shown["ready_eta"], shown["ready_eta_p90"]) == (
        iso(ETA), iso(ETA + timedelta(minutes=6)), iso(ETA + timedelta(minutes=30)),
    )  # fmt: skip
    line = dws("status", "held").splitlines()[0]
    assert f"running by {iso(ETA + timedelta(minutes=6))}" in line
    assert f"(p90 {iso(ETA + timedelta(minutes=30))})" in line


@pytest.mark.parametrize(
    ("offset", "shown"),
    [
        (timedelta(seconds=20), "now"),
        (timedelta(hours=2, minutes=10), "in 2 h 10 min"),
        (timedelta(days=3, hours=1, minutes=5), "in 3 d 1 h"),
        (-timedelta(minutes=5), "5 min ago"),
        (timedelta(hours=1), "in 1 h"),
    ],
)
def test_relative_times_read_like_a_clock(offset: timedelta, shown: str) -> None:
    assert relative(NOW + offset, NOW) == shown
    assert relative(None, NOW) == ""
