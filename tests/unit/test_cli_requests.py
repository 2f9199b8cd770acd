"""The request commands run on ``opendws.Client``: ``dws cancel`` and ``dws release`` refuse a
booked block Google would keep before sending anything, and ``dws status --json`` prints the
client's own view of the request."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import pytest
from click.testing import CliRunner

from opendws import bootstrap
from opendws.cli import main
from opendws.cli import requests as requests_module
from opendws.domain.states import RequestState
from opendws.ports import Change
from tests.builders import A3, DAY, NOW, ZONE, calendar, flex
from tests.unit.test_client import System


@pytest.fixture
def system() -> Iterator[System]:
    system = System()
    previous = bootstrap.use(system.client.container)
    yield system
    bootstrap.use(previous)


@pytest.mark.parametrize("action", ["cancel", "release"])
def test_a_block_google_would_keep_is_refused_and_nothing_is_sent(
    system: System, action: str
) -> None:
    system.stored(calendar("block", tenant="speech", start_at=NOW + 2 * DAY))
    system.move("block", RequestState.BOOKED, pool=f"{ZONE}/{A3}")
    result = CliRunner().invoke(main, [action, "block", "--tenant", "speech"])
    assert result.exit_code == 1
    assert "'block' can no longer be cancelled" in result.stderr
    assert system.publisher.messages == []


def test_a_cancel_is_sent_on_the_tenants_topic(system: System) -> None:
    result = CliRunner().invoke(main, ["cancel", "train", "--tenant", "vision"])
    assert result.exit_code == 0, result.output
    assert "cancel of train sent" in result.stdout
    assert system.publisher.topics == ["capacity-requests-vision"]


def test_status_json_is_the_clients_view(system: System) -> None:
    system.stored(flex("train", tenant="vision"))
    result = CliRunner().invoke(main, ["status", "train", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == system.client.status("train").to_json()


# A message longer than a line of 80 columns, as reconcile writes them.
LONG = (
    "waiting (NO_CAPACITY_UNTIL); slot held in us-central1-a/a3-highgpu-8g from "
    "2026-12-02T00:55:00+00:00, behind two requests of higher priority"
)


def test_piped_status_and_wait_print_whole_times_and_lines(system: System) -> None:
    """Piped (no terminal, no COLUMNS), exact times are not cut at rich's 80-column default,
    and ``dws wait`` prints each event on one line: a script or grep reads them whole."""
    system.stored(flex("train", tenant="vision"))
    event = system.move("train", RequestState.PENDING, reason="NO_CAPACITY_UNTIL")
    record = system.store.get("train")
    assert record is not None
    ended = replace(event, state=RequestState.CANCELLED, message=LONG)
    system.store.change("train", Change(expected_version=record.version,
                                        state=RequestState.CANCELLED, event=ended))  # fmt: skip
    piped = CliRunner(env={"COLUMNS": None})
    shown = piped.invoke(main, ["status", "train"])
    assert shown.exit_code == 0, shown.output
    assert event.at.isoformat() in shown.stdout
    waited = piped.invoke(main, ["wait", "train", "--timeout", "0"])
    assert waited.exit_code == 1, waited.output  # cancelled without running
    lines = waited.stdout.splitlines()
    assert len(lines) == len(system.store.events("train"))
    assert lines[-1].endswith(LONG)


def test_a_tenant_without_a_topic_is_one_red_line_not_a_traceback() -> None:
    system = System(existing_topics=["capacity-requests-vision"])
    previous = bootstrap.use(system.client.container)
    try:
        result = CliRunner().invoke(main, [
            "submit", "--tenant", "nobody", "--vm-count", "1", "--machine-type", A3,
            "--accelerator", "nvidia-h100-80gb", "--location", ZONE, "--run", "1h",
        ])  # fmt: skip
    finally:
        bootstrap.use(previous)
    assert result.exit_code == 2, result.output
    assert "error: the request is not valid: tenant: 'nobody' is not a tenant" in result.stderr
    assert "Traceback" not in result.output


def test_wait_on_an_id_still_not_stored_says_so_and_keeps_waiting(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mistyped id would otherwise wait its whole timeout (600 s) in silence."""
    monkeypatch.setattr(requests_module, "NOT_STORED_NOTE_S", 0.05)
    result = CliRunner().invoke(main, ["wait", "trian", "--timeout", "0.3"])
    assert result.exit_code == 3, result.output  # timed out
    assert "no request 'trian' is stored yet; still waiting (check the id" in result.stderr
    assert "still not stored after" in result.stdout


def test_wait_past_the_note_shows_each_event_once_and_no_note(
    system: System, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(requests_module, "NOT_STORED_NOTE_S", 0.05)
    system.stored(flex("train", tenant="vision"))
    system.move("train", RequestState.PENDING, reason="NO_CAPACITY_UNTIL")
    result = CliRunner(env={"COLUMNS": None}).invoke(main, ["wait", "train", "--timeout", "0.3"])
    assert result.exit_code == 3, result.output
    assert result.stderr == ""
    events = [line for line in result.stdout.splitlines() if "  PENDING " in line]
    assert len(events) == len(system.store.events("train")) == 2


@pytest.mark.parametrize("command", ["status", "wait"])
def test_an_id_no_request_can_have_is_one_red_line(system: System, command: str) -> None:
    result = CliRunner().invoke(main, [command, "a/b"])
    assert result.exit_code == 2, result.output
    assert "error: no request can have the id 'a/b'" in result.stderr
