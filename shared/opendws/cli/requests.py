"""``dws`` commands on requests in a running system — the local stack (``dws up``) or a real
project (``--project``, application default credentials):

- ``dws submit`` publishes a request (from a YAML/JSON file or from flags), validated against
  the ``opendws.request/v1`` schema first, so a bad request is refused here and never sent;
- ``dws status ID``, ``dws wait ID`` (until ACTIVE or a final state; the exit code says which);
- ``dws cancel ID`` and ``dws release ID``;
- ``dws queue``, ``dws timeline`` and ``dws usage``: what waits, what holds each pool, what was
  used.

Every error a user can fix is one red line and exit code 2.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich import box
from rich.table import Table

from opendws.cli.common import (
    UsageFailure,
    console,
    container,
    iso_seconds,
    project_option,
    relative,
)
from opendws.domain.states import RequestState
from opendws.durations import format_duration
from opendws.scenario import ScenarioError, read_document
from opendws.schema.request import MessageError, parse_message

S = RequestState
# `dws wait` exit codes.
WAIT_ACTIVE = 0  # the capacity is running
WAIT_ENDED = 1  # it reached a final state without running (timed out, cancelled, rejected)
WAIT_TIMEOUT = 3  # still waiting when --timeout passed


# dws submit -----------------------------------------------------------------------------------


@click.command(short_help="Ask for capacity (from a file or flags).")
@click.argument("file", type=click.Path(path_type=Path), required=False)
@click.option("--id", "request_id", help="request_id (default: the Pub/Sub message id).")
@click.option("--tenant", help="Your team.")
@click.option("--mode", type=click.Choice(["flex_start", "calendar"]), default="flex_start",
              show_default=True)  # fmt: skip
@click.option(
    "--vm-count", type=int, help="VMs (or TPU slices) in the gang; a TPU gang: 1 by default."
)
@click.option("--machine-type", help="GPU machine type, e.g. a3-highgpu-8g.")
@click.option("--accelerator", help="e.g. nvidia-h100-80gb or tpu-v5e.")
@click.option("--accelerators-per-vm", type=int)
@click.option("--topology", help="TPU slice topology, e.g. 4x4.")
@click.option("--location", "locations", multiple=True, help="Zone or region; repeat, best first.")
@click.option("--run", "run_duration", help="Run duration, e.g. 6h.")
@click.option("--max-wait", help="flex_start: how long to wait at most, e.g. 2d.")
@click.option("--start-at", help="calendar: the block's start (ISO 8601 with a zone).")
@click.option("--priority", type=int)
@project_option
def submit(file: Path | None, **flags: Any) -> None:
    """Validate a request and publish it on capacity-requests; print its id."""
    message = _message_from(file, flags)
    try:
        parse_message(json.dumps(message).encode())
    except MessageError as error:
        raise UsageFailure(f"the request is not valid: {error}") from None

    message_id = container().adapters.publisher.publish(message)
    request_id = message.get("request_id") or message_id
    console.print(f"submitted [bold]{request_id}[/bold]; follow it with: dws wait {request_id}")


def _message_from(file: Path | None, flags: dict[str, Any]) -> dict[str, Any]:
    if file is not None:
        try:
            document = read_document(file)
        except ScenarioError as error:
            raise UsageFailure(str(error)) from None
        if not isinstance(document, dict):
            raise UsageFailure(f"{file}: a request is a mapping of fields")
        return {"schema": "opendws.request/v1", "action": "submit", **document}
    gang = {
        key: flags[flag]
        for key, flag in (
            ("vm_count", "vm_count"),
            ("machine_type", "machine_type"),
            ("accelerator", "accelerator"),
            ("accelerators_per_vm", "accelerators_per_vm"),
            ("topology", "topology"),
        )
        if flags.get(flag) is not None
    }
    if "topology" in gang:
        gang.setdefault("vm_count", 1)  # a TPU gang is one slice unless asked for more
    message: dict[str, Any] = {"schema": "opendws.request/v1", "action": "submit",
                               "tenant": flags.get("tenant"), "mode": flags["mode"],
                               "gang": gang, "locations": list(flags["locations"]),
                               "run_duration": flags.get("run_duration")}  # fmt: skip
    for key in ("request_id", "max_wait", "start_at", "priority"):
        if flags.get(key) is not None:
            message[key] = flags[key]
    return message


# dws status / wait ------------------------------------------------------------------------------


@click.command(short_help="Show a request: state, ETA, position, reason, events.")
@click.argument("request_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@project_option
def status(request_id: str, as_json: bool) -> None:
    """Show where a request is."""

    store = container().adapters.store
    record = store.get(request_id)
    if record is None:
        raise UsageFailure(f"no request {request_id!r} (check the id and OPENDWS_PROJECT)")
    events = store.events(request_id)
    ready, ready_p90 = container().queries.ready_etas(record, datetime.now(UTC))
    if as_json:
        click.echo(json.dumps({"request_id": request_id, "state": record.state.value,
                               "eta": iso_seconds(record.eta), "ready_eta": iso_seconds(ready),
                               "ready_eta_p90": iso_seconds(ready_p90),
                               "events": [e.to_json() for e in events]}, indent=2))  # fmt: skip
        return
    console.print(
        f"[bold]{request_id}[/bold] ({record.tenant}): [bold]{record.state}[/bold]"
        + (f" in {record.pool}" if record.pool else "")
        + (f", ETA {iso_seconds(record.eta)}" if record.eta else "")
        + (f", running by {iso_seconds(ready)} (p90 {iso_seconds(ready_p90)})" if ready else "")
        + (f", position {record.position}" if record.position else "")
    )
    table = Table("at", "state", "reason", "message")
    for event in events:
        table.add_row(event.at.isoformat(), event.state.value, event.reason or "", event.message)
    console.print(table)


@click.command(short_help="Wait until a request is ACTIVE or ends; the exit code says which.")
@click.argument("request_id")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait at most.")
@project_option
def wait(request_id: str, timeout: float) -> None:
    """Follow a request: exit 0 once ACTIVE (or released/expired after running), 1 if it ended
    without running, 3 if still waiting after --timeout."""

    store = container().adapters.store
    deadline = time.monotonic() + timeout
    seen = 0
    while True:
        events = store.events(request_id)
        for event in events[seen:]:
            console.print(f"{event.at.isoformat()}  {event.state:<12} {event.message}")
        seen = len(events)
        record = store.get(request_id)
        if record is not None and record.state is S.ACTIVE:
            raise SystemExit(WAIT_ACTIVE)
        if record is not None and record.state.is_final:
            ran = any(event.state is S.ACTIVE for event in events)
            raise SystemExit(WAIT_ACTIVE if ran else WAIT_ENDED)
        if time.monotonic() >= deadline:
            console.print(f"still {record.state if record else 'not stored'} after {timeout:.0f} s")
            raise SystemExit(WAIT_TIMEOUT)
        time.sleep(0.5)


# dws cancel / release ---------------------------------------------------------------------------


def _end_command(action: str) -> click.Command:
    @click.command(name=action, short_help=f"{action.capitalize()} a request.")
    @click.argument("request_id")
    @click.option("--tenant", required=True, help="The request's tenant (yours).")
    @project_option
    def command(request_id: str, tenant: str) -> None:
        from opendws.service.release import block_cancel_refusal

        adapters = container().adapters
        record = adapters.store.get(request_id)
        if action == "cancel" and record is not None and record.tenant == tenant:
            # A booked block Google would keep: say so now, rather than in an event only.
            refusal = block_cancel_refusal(record, adapters.config.load(), datetime.now(UTC))
            if refusal is not None:
                raise click.ClickException(refusal)
        adapters.publisher.publish({"schema": "opendws.request/v1", "action": action,
                                    "request_id": request_id, "tenant": tenant})  # fmt: skip
        console.print(f"{action} of {request_id} sent; see it with: dws status {request_id}")

    command.__doc__ = f"Publish a {action} for a request (only its tenant may)."
    return command


cancel = _end_command("cancel")
release = _end_command("release")


# dws queue / timeline ----------------------------------------------------------------------------


@click.command(short_help="Pending requests: positions, ETAs and reasons per pool.")
@click.option("--tenant", help="Only this tenant's requests.")
@click.option("--wide", is_flag=True, help="Every column, with exact times (UTC).")
@click.option("--json", "as_json", is_flag=True)
@project_option
def queue(tenant: str | None, wide: bool, as_json: bool) -> None:
    """The queue as the last reconcile pass left it: by default the columns that fit an
    80-column terminal, times relative to now; --wide for all of them."""

    now = datetime.now(UTC)
    entries = container().queries.queue(now, tenant=tenant)
    if as_json:
        click.echo(json.dumps([{**asdict(e), "eta": iso_seconds(e.eta),
                                "ready_eta": iso_seconds(e.ready_eta),
                                "ready_eta_p90": iso_seconds(e.ready_eta_p90),
                                "waited_s": e.waited.total_seconds()} for e in entries],
                              default=str, indent=2))  # fmt: skip
        return
    if not wide:
        table = Table("request", "tenant", "#", "ETA", "running", "reason", "waited",
                      box=box.SIMPLE_HEAD, pad_edge=False)  # fmt: skip
        for e in entries:
            table.add_row(e.request_id, e.tenant, str(e.position or ""), relative(e.eta, now),
                          relative(e.ready_eta, now), e.reason or "",
                          format_duration(e.waited))  # fmt: skip
        console.print(table)
        return
    table = Table("request", "tenant", "units", "pool", "position", "ETA", "running by (p90)",
                  "reason", "waited")  # fmt: skip
    for e in entries:
        ready = "" if e.ready_eta is None else (
            f"{iso_seconds(e.ready_eta)} ({iso_seconds(e.ready_eta_p90)})"
        )  # fmt: skip
        table.add_row(e.request_id, e.tenant, f"{e.units} × {e.accelerator}", e.pool or "",
                      str(e.position or ""), iso_seconds(e.eta) or "", ready, e.reason or "",
                      format_duration(e.waited))  # fmt: skip
    console.print(table)


@click.command(short_help="What holds each pool when: runs, blocks, planned starts.")
@click.option("--pool", help="Only this pool.")
@click.option("--wide", is_flag=True, help="Exact times (UTC) instead of relative ones.")
@click.option("--json", "as_json", is_flag=True)
@project_option
def timeline(pool: str | None, wide: bool, as_json: bool) -> None:
    """Per pool: running and provisioning grants, booked blocks, planned starts; times
    relative to now (fitting an 80-column terminal), or exact with --wide."""

    now = datetime.now(UTC)
    pools = container().queries.timeline(now, pool=pool)
    if as_json:
        click.echo(json.dumps({name: [asdict(s) for s in spans] for name, spans in pools.items()},
                              default=str, indent=2))  # fmt: skip
        return
    for name, spans in pools.items():
        table = Table("request", "tenant", "state", "units", "from", "until", title=name)
        for s in spans:
            start, end = (
                (iso_seconds(s.start) or "", iso_seconds(s.end) or "")
                if wide
                else (relative(s.start, now), relative(s.end, now))
            )
            table.add_row(s.request_id, s.tenant, s.state, str(s.units), start, end)
        console.print(table)
    if not pools:
        console.print("no pool holds or plans anything")


# dws usage ---------------------------------------------------------------------------------------


@click.command(short_help="Accelerator-hours granted and used, cost, outcomes per tenant.")
@click.option("--tenant", help="Only this tenant.")
@click.option("--json", "as_json", is_flag=True)
@project_option
def usage(tenant: str | None, as_json: bool) -> None:
    """Usage totals per tenant and accelerator."""

    rows = container().usage.summary(tenant=tenant)
    if as_json:
        click.echo(json.dumps([{"tenant": r.tenant, "accelerator": r.accelerator,
                                "granted_hours": r.granted_hours, "used_hours": r.used_hours,
                                "cost": r.cost, "outcomes": dict(r.outcomes)}
                               for r in rows], indent=2))  # fmt: skip
        return
    table = Table("tenant", "accelerator", "granted h", "used h", "cost", "outcomes")
    for row in rows:
        cost = "" if row.cost is None else f"{row.cost:,.2f}"
        outcomes = ", ".join(f"{k.lower()} {v}" for k, v in sorted(row.outcomes.items()))
        table.add_row(row.tenant, row.accelerator, f"{row.granted_hours:,.2f}",
                      f"{row.used_hours:,.2f}", cost, outcomes)  # fmt: skip
    console.print(table)
