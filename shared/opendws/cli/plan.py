"""``dws plan``: the admission core on a what-if scenario, no system needed.

``dws plan FILE`` runs one admission pass over a what-if scenario file and shows what it decided,
as a table or as JSON. Errors a user can fix (a missing file, a bad field) are one red line on
stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from opendws.cli.common import PIPED_WIDTH, UsageFailure
from opendws.domain import Alternative, Decision, Outcome, Plan, admit
from opendws.durations import format_duration
from opendws.scenario import ScenarioError, load_scenario, parse_timestamp

# Outcomes in the order the domain declares them: the table's primary sort key.
_OUTCOME_ORDER = {outcome: index for index, outcome in enumerate(Outcome)}
_OUTCOME_STYLE = {
    Outcome.ADMIT: "bold green",
    Outcome.CONFIRM: "bold green",
    Outcome.HOLD: "yellow",
    Outcome.WAIT: "yellow",
    Outcome.REFUSE: "red",
    Outcome.REJECT: "bold red",
    Outcome.TIME_OUT: "red",
}
# Outcomes whose pool and start columns say everything the message would.
_SELF_EXPLAINED = frozenset({Outcome.ADMIT, Outcome.HOLD, Outcome.CONFIRM})
# Below this width the table has no message column; the messages follow it as notes.
WIDE_TABLE = 130


@click.command("plan", short_help="Plan a what-if scenario: admit, hold, confirm, refuse.")
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--at",
    "at_text",
    metavar="ISO8601",
    help="Plan at this instant instead of the file's `now` (timezone-aware, e.g. "
    "2026-12-01T06:00:00Z). Requests without submitted_at still count as submitted at `now`.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON instead of a table.")
def plan_command(file: Path, at_text: str | None, as_json: bool) -> None:
    """Run one admission pass over the what-if scenario in FILE (.yaml, .yml or .json)."""
    try:
        scenario = load_scenario(file)
    except ScenarioError as error:
        raise UsageFailure(str(error)) from None
    now = scenario.now if at_text is None else _parse_at(at_text)
    plan = admit(scenario.snapshot, now)
    if as_json:
        click.echo(json.dumps(plan_document(plan), indent=2))
    else:
        _print_plan(plan, scenario.source)


def _parse_at(text: str) -> datetime:
    """The ``--at`` instant, or a failure that says what a valid one looks like."""
    try:
        return parse_timestamp(text)
    except ValueError as error:
        raise UsageFailure(f"--at {text!r}: {error}") from None


# JSON ----------------------------------------------------------------------------------------


def plan_document(plan: Plan) -> dict[str, object]:
    """The plan as JSON-ready data: ``now``, the decisions (by request_id) and counts per
    outcome. Timestamps are ISO 8601 in UTC."""
    return {
        "now": iso(plan.now),
        "decisions": [decision_document(decision, plan) for decision in plan.decisions],
        "counts": {outcome.value: count for outcome, count in outcome_counts(plan)},
    }


def decision_document(decision: Decision, plan: Plan) -> dict[str, object]:
    """One decision of ``plan`` as JSON-ready data, every field present (null when it does not
    apply)."""
    return {
        "request_id": decision.request_id,
        "outcome": decision.outcome.value,
        "reason": None if decision.reason is None else decision.reason.value,
        "pool_id": decision.pool_id,
        "start_at": _iso_or_none(decision.start_at),
        "end_at": _iso_or_none(decision.end_at),
        "eta": _iso_or_none(decision.eta),
        "rank": plan.rank(decision.request_id),
        "position": decision.position,
        "alternatives": [_alternative_document(alt) for alt in decision.alternatives],
        "message": decision.message,
    }


def _alternative_document(alternative: Alternative) -> dict[str, object]:
    return {"start_at": iso(alternative.start_at), "pool_id": alternative.pool_id}


def iso(at: datetime) -> str:
    """``at`` as ISO 8601 in UTC with a ``Z``: ``2026-12-01T06:00:00Z``."""
    return at.astimezone(UTC).isoformat().removesuffix("+00:00") + "Z"


def _iso_or_none(at: datetime | None) -> str | None:
    return None if at is None else iso(at)


# Table ---------------------------------------------------------------------------------------


def outcome_counts(plan: Plan) -> list[tuple[Outcome, int]]:
    """How many decisions had each outcome, in outcome order, outcomes that occur only."""
    counts = Counter(decision.outcome for decision in plan.decisions)
    return [(outcome, counts[outcome]) for outcome in Outcome if counts[outcome]]


def summary_line(plan: Plan) -> str:
    """``8 requests: 3 ADMIT, 2 HOLD, 1 CONFIRM, 1 REFUSE, 1 REJECT``."""
    total = len(plan.decisions)
    if not total:
        return "no pending requests"
    counts = ", ".join(f"{count} {outcome.value}" for outcome, count in outcome_counts(plan))
    return f"{total} request{'s' if total != 1 else ''}: {counts}"


def _print_plan(plan: Plan, source: str) -> None:
    """The decisions as a table sorted by outcome then request id, and the summary line. On a
    terminal too narrow for a message column, the messages follow the table as notes."""
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPED_WIDTH  # nothing to fit into: do not fold long messages
    ordered = sorted(plan.decisions, key=lambda d: (_OUTCOME_ORDER[d.outcome], d.request_id))
    inline = console.width >= WIDE_TABLE
    console.print(_plan_table(ordered, plan.now, f"Plan for {source}", with_messages=inline))
    if not inline:
        for decision in ordered:
            if message := _message_cell(decision):
                console.print(Text(f"{decision.request_id}: {message}"))
    console.print(summary_line(plan))


def _plan_table(
    ordered: Sequence[Decision], now: datetime, title: str, *, with_messages: bool
) -> Table:
    """One row per decision, in the order given."""
    table = Table(title=f"{title} at {iso(now)}", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("Request", no_wrap=True)
    table.add_column("Outcome", no_wrap=True)
    table.add_column("Reason", overflow="fold")
    table.add_column("Pool", overflow="fold")
    table.add_column("Start / ETA")
    table.add_column("Pos", justify="right", no_wrap=True)
    if with_messages:
        table.add_column("Message", overflow="fold")
    for decision in ordered:
        cells: list[str | Text] = [
            decision.request_id,
            Text(decision.outcome.value, style=_OUTCOME_STYLE.get(decision.outcome, "")),
            "" if decision.reason is None else decision.reason.value,
            decision.pool_id or "",
            _start_cell(decision.start_at, now),
            "" if decision.position is None else str(decision.position),
        ]
        if with_messages:
            cells.append(_message_cell(decision))
        table.add_row(*cells)
    return table


def _message_cell(decision: Decision) -> str:
    """The domain's message where it adds to the other columns: what went wrong, or why a
    request waits without a slot; admissions, holds and confirmations say it all already."""
    if decision.detail or decision.outcome not in _SELF_EXPLAINED:
        return decision.message
    return ""


def _start_cell(start_at: datetime | None, now: datetime) -> str:
    """``2026-12-01 06:00Z +6h``: when, and how long from now."""
    if start_at is None:
        return ""
    stamp = start_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    delta = start_at - now
    if delta == timedelta(0):
        return f"{stamp}Z now"
    sign = "+" if delta > timedelta(0) else ""  # format_duration writes the minus itself
    return f"{stamp}Z {sign}{format_duration(delta)}"
