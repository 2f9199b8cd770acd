"""``dws queue`` and ``dws status`` on a stored queue: each held request's ETA and ready ETA
(eta + its pool's admission → ACTIVE median, and 90th percentile)."""

from __future__ import annotations

import json
import re
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
AHEAD = timedelta(hours=2, seconds=30)  # shown as "in 2 h" for a minute of test time


@pytest.fixture
def held() -> Iterator[datetime]:
    """One held request, stored now, and its ETA (what the fixture yields)."""
    yield from holding("held")


# An id and a reason as long as real ones get: together they do not fit 80 columns.
LONG_ID = "speech-asr-large-finetune-v3-retry"


@pytest.fixture
def held_long() -> Iterator[datetime]:
    yield from holding(LONG_ID, reason="NO_CAPACITY_UNTIL", ahead=timedelta(hours=2, minutes=59))


def holding(
    request_id: str, *, reason: str = "NO_CAPACITY_UNTIL", ahead: timedelta = AHEAD
) -> Iterator[datetime]:
    """``request_id`` held for ``ahead`` from now, the process's container on it meanwhile."""
    # The CLI reads the wall clock: the samples must be recent, the ETA ahead, against it.
    now = datetime.now(UTC).replace(microsecond=0)
    eta = now + ahead
    store = MemoryRequestStore()
    record, event = accepted(flex(request_id, vm_count=2, submitted_at=now), now)
    store.create(record, event)
    held = StatusEvent(
        request_id=request_id, tenant="t", state=RequestState.PENDING,
        previous_state=RequestState.PENDING, at=now, reason=reason, eta=eta,
        pool=POOL, position=1,
    )  # fmt: skip
    store.change(request_id, Change(
        expected_version=1, state=RequestState.PENDING, event=held, reason=reason,
        pool=POOL, eta=eta, position=1,
    ))  # fmt: skip
    for index, minutes in enumerate((4, 6, 30)):
        took = timedelta(minutes=minutes)
        store.record_ready(POOL, ReadySample(request_id=f"s{index}", at=now, took=took))
    adapters = bootstrap.Adapters(
        store=store, config=MemoryConfigStore(), events=MemoryEventBus(),
        nudger=MemoryNudger(), publisher=MemoryRequestPublisher(), clock=ManualClock(now),
    )  # fmt: skip
    settings = bootstrap.Settings.from_environment({"OPENDWS_PROJECT": "cli-test"})
    previous = bootstrap.use(bootstrap.Container(settings, adapters=adapters))
    yield eta
    bootstrap.use(previous)


def dws(*args: str) -> str:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def iso(at: datetime) -> str:
    return at.isoformat(timespec="seconds")


def test_the_queue_shows_both_times(held: datetime) -> None:
    eta = held
    (entry,) = json.loads(dws("queue", "--json"))
    assert (entry["eta"], entry["ready_eta"], entry["ready_eta_p90"]) == (
        iso(eta), iso(eta + timedelta(minutes=6)), iso(eta + timedelta(minutes=30)),
    )  # fmt: skip
    wide = dws("queue", "--wide")
    assert f"{iso(eta + timedelta(minutes=6))} ({iso(eta + timedelta(minutes=30))})" in wide


@pytest.mark.usefixtures("held")
def test_the_queue_fits_an_80_column_terminal_with_relative_times() -> None:
    table = CliRunner(env={"COLUMNS": "80"}).invoke(main, ["queue"]).stdout
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = [line for line in lines if line.lstrip().startswith("held")]
    assert len(rows) == 1, table
    row = rows[0]
    words = row.split()
    assert words[:-1] == [
        "held", "t", "1", "in", "2", "h", "in", "2", "h", "6", "min", "NO_CAPACITY_UNTIL",
    ]  # fmt: skip
    assert words[-1].endswith("s")  # waited: the seconds since the fixture stored it


def test_queue_and_timeline_json_give_times_in_iso_8601(held: datetime) -> None:
    """Every time in ``--json`` is ISO 8601 in UTC to the second, as ``dws status --json``
    gives them, and the wait a duration as ``dws queue`` prints it (with ``waited_s``)."""
    (entry,) = json.loads(dws("queue", "--json"))
    assert re.fullmatch(r"(\d+[dhms])+", entry["waited"]), entry["waited"]
    assert entry["waited_s"] >= 0
    spans = json.loads(dws("timeline", "--json"))[POOL]
    (span,) = [span for span in spans if span["request_id"] == "held"]
    assert (span["start"], span["end"]) == (iso(held), iso(held + timedelta(hours=1)))


@pytest.mark.usefixtures("held_long")
def test_a_long_id_and_reason_fold_within_80_columns_rather_than_being_cut() -> None:
    """The id is what ``dws status`` needs: it is never shortened to an ellipsis, nor is the
    reason; the times stay on one line."""
    table = CliRunner(env={"COLUMNS": "80"}).invoke(main, ["queue"]).stdout
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in table
    assert LONG_ID in "".join(line.split()[0] for line in lines if line.strip()), table
    assert "NO_CAPACITY_UNTIL" in table
    assert "in 2 h 59 min" in table


@pytest.mark.usefixtures("held_long")
def test_the_timeline_folds_a_long_id_rather_than_cutting_it() -> None:
    table = CliRunner(env={"COLUMNS": "80"}).invoke(main, ["timeline"]).stdout
    assert max(len(line) for line in table.splitlines()) <= 80
    assert "…" not in table
    ids = [line.replace("│", " ").split()[:1] for line in table.splitlines()[3:-1]]
    assert LONG_ID in "".join(word for words in ids for word in words), table


def test_status_shows_both_times(held: datetime) -> None:
    eta = held
    shown = json.loads(dws("status", "held", "--json"))
    assert (shown["eta"], shown["ready_eta"], shown["ready_eta_p90"]) == (
        iso(eta), iso(eta + timedelta(minutes=6)), iso(eta + timedelta(minutes=30)),
    )  # fmt: skip
    line = dws("status", "held").splitlines()[0]
    assert f"running by {iso(eta + timedelta(minutes=6))}" in line
    assert f"(p90 {iso(eta + timedelta(minutes=30))})" in line


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
    now = datetime(2026, 12, 1, tzinfo=UTC)
    assert relative(now + offset, now) == shown
    assert relative(None, now) == ""


def test_the_timeline_shows_relative_times_and_exact_ones_with_wide(held: datetime) -> None:
    """The held request's planned start and end: "in 2 h" and "in 3 h" (its 1 h run after
    its ETA) within 80 columns; --wide gives them in UTC."""
    lines = CliRunner(env={"COLUMNS": "80"}).invoke(main, ["timeline"]).stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = [line.replace("│", " ").split() for line in lines if " held " in line]
    assert rows == [["held", "t", "PENDING", "2", "in", "2", "h", "in", "3", "h"]], lines
    wide = dws("timeline", "--wide")
    assert iso(held) in wide


def on_a_terminal(*args: str) -> str:
    """``dws ARGS`` as an 80-column terminal shows it (TTY_COMPATIBLE: rich's own switch)."""
    result = CliRunner(env={"COLUMNS": "80", "TTY_COMPATIBLE": "1", "FORCE_COLOR": None}).invoke(
        main, list(args)
    )
    assert result.exit_code == 0, result.output
    return result.stdout


def test_status_on_a_terminal_shows_relative_times_within_80_columns(held: datetime) -> None:
    shown = on_a_terminal("status", "held")
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= 80
    headline = " ".join(" ".join(lines[:3]).split())
    assert "ETA in 2 h, running in 2 h 6 min (p90 in 2 h 30 min), position 1" in headline
    assert iso(held) not in shown
    events = [line.split()[:2] for line in lines if "NO_CAPACITY_UNTIL" in line]
    assert events == [["now", "PENDING"]], shown


def test_status_with_wide_shows_exact_times_even_on_a_terminal(held: datetime) -> None:
    shown = " ".join(on_a_terminal("status", "held", "--wide").split())
    assert f"ETA {iso(held)}" in shown
    assert f"running by {iso(held + timedelta(minutes=6))}" in shown


@pytest.mark.usefixtures("held")
def test_wait_and_status_keep_their_exit_codes() -> None:
    """``dws wait`` on a request still pending: exit 3 once --timeout passes; ``dws status``
    of an unknown id: one red line, exit 2."""
    waited = CliRunner().invoke(main, ["wait", "held", "--timeout", "0.2"])
    assert waited.exit_code == 3
    assert "still PENDING after 0 s" in waited.stdout
    unknown = CliRunner().invoke(main, ["status", "nothing"])
    assert unknown.exit_code == 2
    assert unknown.stderr.startswith("error: no request 'nothing'")
