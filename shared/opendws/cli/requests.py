"""``dws`` commands on requests in a running system — the local stack (``dws up``) or a real
project (``--project``, application default credentials):

- ``dws submit`` publishes a request (from a YAML/JSON file or from flags, and the job to run on
  the gang after ``--``), validated against the ``opendws.request/v1`` schema first, so a bad
  request is refused here and never sent;
- ``dws status ID`` (ACTIVE: its hosts too), ``dws wait ID`` (until ACTIVE or a final state;
  the exit code says which);
- ``dws ssh ID [--rank R] [-- GCLOUD_ARGS...]``: ``gcloud compute ssh`` to a VM of an ACTIVE
  request;
- ``dws cancel ID`` and ``dws release ID``;
- ``dws queue``, ``dws timeline`` and ``dws usage``: what waits, what holds each pool, what was
  used.

Each command does its work through :class:`opendws.Client` (on the command's container, see
:func:`opendws.cli.common.client`) and keeps only its flags, its printing and its exit code.
Every error a user can fix is one red line and exit code 2.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich import box
from rich.table import Table

from opendws.cli.common import (
    UsageFailure,
    client,
    console,
    errors,
    iso_seconds,
    project_option,
    relative,
)
from opendws.durations import format_duration
from opendws.scenario import ScenarioError, read_document

if TYPE_CHECKING:
    from collections.abc import Sequence

    from opendws.client import InvalidRequest
    from opendws.domain.run import RunSpec
    from opendws.ports import Host, StatusEvent
    from opendws.service.usage import UsageRow

# `dws wait` says so on stderr when the request is still not stored after this many seconds.
NOT_STORED_NOTE_S = 5.0
# `dws wait` exit codes.
WAIT_ACTIVE = 0  # the capacity is running
WAIT_ENDED = 1  # it reached a final state without running (timed out, cancelled, rejected)
WAIT_TIMEOUT = 3  # still waiting when --timeout passed


# dws submit -----------------------------------------------------------------------------------

# Where `dws submit` keeps the words after its first `--`: the job's argv.
_ARGV = "opendws.run.command"


class _ArgvAfterDashes(click.Command):
    """A command whose words after the first ``--`` are a program's argv, kept whole (options
    and all) in ``ctx.meta[_ARGV]`` rather than parsed as its own."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            ctx.meta[_ARGV] = args[at + 1 :]
            args = args[:at]
        return super().parse_args(ctx, args)


@click.command(
    cls=_ArgvAfterDashes,
    short_help="Ask for capacity (from a file or flags), and the job to run on it after --.",
)
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
@click.option("--image", help="Run the job in this container image.")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE",
              help="Add to the job's environment; repeat.")  # fmt: skip
@click.option("--secret", "secrets", multiple=True, metavar="NAME=VERSION",
              help="Set NAME to a Secret Manager version's value "
                   "(projects/P/secrets/S/versions/V); repeat.")  # fmt: skip
@click.option("--ends-when", type=click.Choice(["all_exited", "rank0_exited"]),
              help="When the run is over: every rank exited (default), or rank 0.")  # fmt: skip
@click.option("--block", metavar="BLOCK_ID",
              help="Run the job on the VMs of this calendar block of yours (after its own job "
                   "and the jobs submitted into it before); no gang, mode, location or times "
                   "of its own.")  # fmt: skip
@click.option("--release-on-end", is_flag=True, default=None,
              help="calendar: delete the block's VMs when its job ends (default: kept until "
                   "the block ends; billed in full either way).")  # fmt: skip
@project_option
def submit(file: Path | None, **flags: Any) -> None:
    """Validate a request and publish it on its tenant's topic; print its id.

    Everything after -- is the job's command (argv), run on every VM of the gang once it is
    up; the capacity is released when it ends. With FILE, the job given here replaces the
    fields of the file's run it gives (env and secrets name by name)."""
    from opendws.client import InvalidRequest

    run = _run_from(flags, click.get_current_context().meta.get(_ARGV))
    try:
        if file is None:
            message = _message_from(flags)
            request_id = client().submit(message if run is None else {**message, "run": run})
        elif run is None:
            request_id = client().submit(file=file)
        else:
            request_id = client().submit(_with_run(file, run))
    except InvalidRequest as error:
        raise UsageFailure(_one_line(error)) from None
    console.print(f"submitted [bold]{request_id}[/bold]; follow it with: dws wait {request_id}")


def _one_line(error: InvalidRequest) -> str:
    """A file's own problem as its reader said it; a field's with the field's name."""
    if [field for field, _ in error.problems] == ["file"]:
        return error.problems[0][1]
    return str(error)


def _run_from(flags: dict[str, Any], argv: list[str] | None) -> dict[str, Any] | None:
    """The job the command line gives (the words after ``--`` and the run flags); None if
    none (the client checks it)."""
    run: dict[str, Any] = {}
    if argv is not None:
        run["command"] = list(argv)
    if flags.get("image") is not None:
        run["image"] = flags["image"]
    for key, option, given in (("env", "--env", "env"), ("secrets", "--secret", "secrets")):
        if flags.get(given):
            run[key] = _pairs(option, flags[given])
    if flags.get("ends_when") is not None:
        run["ends_when"] = flags["ends_when"]
    if flags.get("release_on_end"):
        run["release_on_end"] = True
    return run or None


def _pairs(option: str, given: tuple[str, ...]) -> dict[str, str]:
    """``NAME=VALUE`` words as a mapping (a later NAME replaces an earlier one)."""
    pairs: dict[str, str] = {}
    for word in given:
        name, equals, value = word.partition("=")
        if not equals or not name:
            raise UsageFailure(f"{option} {word!r}: give NAME=VALUE")
        pairs[name] = value
    return pairs


def _with_run(file: Path, run: dict[str, Any]) -> dict[str, Any]:
    """The request ``file`` holds, its ``run`` updated by ``run`` (env and secrets name by
    name)."""
    try:
        document = read_document(file)
    except ScenarioError as error:
        raise UsageFailure(str(error)) from None
    if not isinstance(document, dict):
        raise UsageFailure(f"{file}: a request is a mapping of fields")
    current = document.get("run")
    merged = dict(current) if isinstance(current, dict) else {}
    for key in ("env", "secrets"):
        if key in run and isinstance(merged.get(key), dict):
            run = {**run, key: {**merged[key], **run[key]}}
    return {**document, "run": {**merged, **run}}


# What a job into a block (--block) takes from its block, not from flags.
_BLOCK_OWN = {"vm_count": "--vm-count", "machine_type": "--machine-type",
              "accelerator": "--accelerator", "accelerators_per_vm": "--accelerators-per-vm",
              "topology": "--topology", "locations": "--location", "run_duration": "--run",
              "max_wait": "--max-wait", "start_at": "--start-at",
              "priority": "--priority"}  # fmt: skip


def _message_from(flags: dict[str, Any]) -> dict[str, Any]:
    """The request the flags describe (the client checks it)."""
    if flags.get("block") is not None:
        given = [option for key, option in _BLOCK_OWN.items() if flags.get(key)]
        if given:
            raise UsageFailure(
                f"{', '.join(given)}: a job into a block (--block) runs on the block's VMs "
                "and takes its gang, locations and times"
            )
        job = {"tenant": flags.get("tenant"), "block": flags["block"]}
        return (
            job if flags.get("request_id") is None else {**job, "request_id": flags["request_id"]}
        )
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
    message: dict[str, Any] = {"tenant": flags.get("tenant"), "mode": flags["mode"],
                               "gang": gang, "locations": list(flags["locations"]),
                               "run_duration": flags.get("run_duration")}  # fmt: skip
    for key in ("request_id", "max_wait", "start_at", "priority"):
        if flags.get(key) is not None:
            message[key] = flags[key]
    return message


# dws status / wait ------------------------------------------------------------------------------


@click.command(short_help="Show a request: state, ETA, position, reason, events.")
@click.argument("request_id")
@click.option("--wide", is_flag=True, help="Exact times (UTC) even on a terminal.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@project_option
def status(request_id: str, wide: bool, as_json: bool) -> None:
    """Show where a request is: on a terminal with times relative to now, fitting 80 columns;
    exact times (UTC) when piped or with --wide."""
    from opendws.client import UnknownRequest

    dws = client()
    try:
        shown = dws.status(request_id)
    except UnknownRequest as error:
        raise UsageFailure(str(error)) from None
    if as_json:
        click.echo(json.dumps(shown.to_json(), indent=2))
        return
    now = dws.now()
    exact = wide or not console.is_terminal

    def at(when: datetime | None) -> str:
        return (iso_seconds(when) or "") if exact else relative(when, now)

    ready, ready_p90 = shown.ready_eta, shown.ready_eta_p90
    console.print(
        f"[bold]{request_id}[/bold] ({shown.tenant}): [bold]{shown.state}[/bold]"
        + (f" in {shown.pool}" if shown.pool else "")
        + (f", ETA {at(shown.eta)}" if shown.eta else "")
        + (f", running {'by ' if exact else ''}{at(ready)} (p90 {at(ready_p90)})" if ready else "")
        + (f", position {shown.position}" if shown.position else "")
    )
    if exact and shown.run is not None:
        for line in _run_lines(shown.run):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    if shown.hosts:
        hosts = Table("rank", "host", "zone", "internal IP", "external IP",
                      **({} if exact else _NARROW))  # fmt: skip
        for host in shown.hosts:
            hosts.add_row(str(host.rank), host.name, host.zone, host.internal_ip,
                          host.external_ip or "")  # fmt: skip
        console.print(hosts)
        console.print(f"a shell on rank 0: dws ssh {request_id}", markup=False, highlight=False)
    table = Table("at", "state", "reason", "message", **({} if exact else _NARROW))
    for event in shown.events:
        stamp = event.at.isoformat() if exact else relative(event.at, now)
        table.add_row(stamp, event.state.value, event.reason or "", event.message)
    console.print(table)


def _run_lines(run: RunSpec) -> list[str]:
    """The job as ``dws status`` shows it: its command as a shell would read it, then its
    image, ending, environment names and secrets (version names: never a value); a CI run,
    whose runner is its job: the CI system, the job's labels and its repository or project."""
    if run.runner is not None:
        runner = run.runner
        return [
            f"run: a one-job {runner.provider.value} runner for {runner.source}",
            "  labels " + ", ".join(runner.labels),
        ]
    details = [f"image {run.image}"] if run.image else []
    details.append(f"ends when {run.ends_when.value}")
    if run.env:
        details.append("env " + ", ".join(name for name, _ in run.env))
    if run.secrets:
        details.append("secrets " + ", ".join(f"{name}={ref}" for name, ref in run.secrets))
    return [f"run: {shlex.join(run.command)}", "  " + "; ".join(details)]


# An 80-column terminal: no box around the table, messages wrap in their column.
_NARROW: dict[str, Any] = {"box": box.SIMPLE_HEAD, "pad_edge": False}


@click.command(short_help="Wait until a request is ACTIVE or ends; the exit code says which.")
@click.argument("request_id")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait at most.")
@project_option
def wait(request_id: str, timeout: float) -> None:
    """Follow a request: exit 0 once ACTIVE (or released/expired after running), 1 if it ended
    without running, 3 if still waiting after --timeout."""
    from opendws.client import UnknownRequest, Waited

    def show(event: StatusEvent) -> None:
        # One line per event, as the terminal wraps it (whole when piped, for grep).
        line = f"{event.at.isoformat()}  {event.state:<12} {event.message}"
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    dws = client()
    deadline = time.monotonic() + timeout
    try:
        result = dws.wait(request_id, timeout=min(timeout, NOT_STORED_NOTE_S), on_event=show)
    except UnknownRequest as error:  # an id no request can have
        raise UsageFailure(str(error)) from None
    if result.outcome is Waited.TIMEOUT and timeout > NOT_STORED_NOTE_S:
        if result.state is None:  # a mistyped id would otherwise wait in silence
            errors.print(
                f"no request {request_id!r} is stored yet; still waiting (check the id and "
                "OPENDWS_PROJECT)", markup=False, highlight=False, soft_wrap=True,
            )  # fmt: skip
        # The next wait calls back from the oldest event again: skip those shown.
        already = iter(range(len(result.events)))

        def show_new(event: StatusEvent) -> None:
            if next(already, None) is None:
                show(event)

        remaining = max(0.0, deadline - time.monotonic())
        result = dws.wait(request_id, timeout=remaining, on_event=show_new)
    if result.outcome is Waited.TIMEOUT:
        console.print(f"still {result.state or 'not stored'} after {timeout:.0f} s")
    raise SystemExit(
        {Waited.ACTIVE: WAIT_ACTIVE, Waited.ENDED: WAIT_ENDED, Waited.TIMEOUT: WAIT_TIMEOUT}[
            result.outcome
        ]
    )


# dws cancel / release ---------------------------------------------------------------------------


def _end_command(action: str) -> click.Command:
    @click.command(name=action, short_help=f"{action.capitalize()} a request.")
    @click.argument("request_id")
    @click.option("--tenant", required=True, help="The request's tenant (yours).")
    @project_option
    def command(request_id: str, tenant: str) -> None:
        from opendws.client import InvalidRequest, NotCancellable

        dws = client()
        end = dws.cancel if action == "cancel" else dws.release
        try:
            end(request_id, tenant=tenant)
        except NotCancellable as refusal:
            raise click.ClickException(str(refusal)) from None
        except InvalidRequest as error:
            raise UsageFailure(str(error)) from None
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

    dws = client()
    now = dws.now()
    entries = dws.queue(tenant)
    if as_json:
        click.echo(json.dumps([{**asdict(e), "eta": iso_seconds(e.eta),
                                "ready_eta": iso_seconds(e.ready_eta),
                                "ready_eta_p90": iso_seconds(e.ready_eta_p90),
                                "waited": format_duration(e.waited),
                                "waited_s": e.waited.total_seconds()} for e in entries],
                              indent=2))  # fmt: skip
        return
    if not wide:
        # Within 80 columns nothing is cut: an id or a reason too long for its column folds
        # onto the next line (an id is what `dws status` needs), times stay on one line.
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=0)
        table.add_column("request", overflow="fold")
        table.add_column("tenant", overflow="fold")
        table.add_column("#", no_wrap=True)
        table.add_column("ETA", no_wrap=True)
        table.add_column("running", no_wrap=True)
        table.add_column("reason", overflow="fold")
        table.add_column("waited", no_wrap=True)
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

    dws = client()
    now = dws.now()
    pools = dws.timeline(pool)
    if as_json:
        click.echo(json.dumps({name: [{**asdict(s), "start": iso_seconds(s.start),
                                       "end": iso_seconds(s.end)} for s in spans]
                               for name, spans in pools.items()}, indent=2))  # fmt: skip
        return
    for name, spans in pools.items():
        table = Table(title=name)
        table.add_column("request", overflow="fold")  # whole: `dws status` needs it
        for heading in ("tenant", "state", "units", "from", "until"):
            table.add_column(heading)
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

    rows = client().usage(tenant)
    if as_json:
        click.echo(json.dumps([{"tenant": r.tenant, "accelerator": r.accelerator,
                                "granted_hours": r.granted_hours, "used_hours": r.used_hours,
                                "cost": r.cost, "outcomes": dict(r.outcomes),
                                "blocks": dict(r.blocks)}
                               for r in rows], indent=2))  # fmt: skip
        return
    table = Table("tenant", "accelerator", "granted h", "used h", "cost", "outcomes",
                  "calendar blocks")  # fmt: skip
    for row in rows:
        cost = "" if row.cost is None else f"{row.cost:,.2f}"
        outcomes = ", ".join(f"{k.lower()} {v}" for k, v in sorted(row.outcomes.items()))
        table.add_row(row.tenant, row.accelerator, f"{row.granted_hours:,.2f}",
                      f"{row.used_hours:,.2f}", cost, outcomes, _blocks(row))  # fmt: skip
    console.print(table)


def _blocks(row: UsageRow) -> str:
    """How the row's started calendar blocks ended, and that each is billed in full."""
    if not row.blocks:
        return ""
    said = ", ".join(
        f"{count} {ending.replace('_', ' ')}" for ending, count in sorted(row.blocks.items())
    )
    return f"{said} (billed in full either way)"


# dws logs ----------------------------------------------------------------------------------------


@click.command(short_help="The output of a request's job, by rank.")
@click.argument("request_id")
@click.option("--rank", type=int, default=None, help="Only this rank (default: every rank).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the run ends.")
@project_option
def logs(request_id: str, rank: int | None, follow: bool) -> None:
    """Print the job's output, each line prefixed by its rank (``[1] …``; stderr lines
    ``[1!] …``): Cloud Logging on Google Cloud, the run folder of ``dws up`` on one machine."""
    from opendws.client import UnknownRequest

    dws = client()
    try:
        for line in dws.logs(request_id, rank=rank, follow=follow):
            mark = "!" if line.stream == "stderr" else ""
            click.echo(f"[{line.rank}{mark}] {line.text}")
    except UnknownRequest as error:
        raise UsageFailure(str(error)) from None


# dws ssh -----------------------------------------------------------------------------------------


@click.command(
    short_help="A shell on a VM of an ACTIVE request (gcloud compute ssh).",
    context_settings={"ignore_unknown_options": True},
)
@click.argument("request_id")
@click.option("--rank", type=int, default=0, show_default=True, help="The VM's rank in the gang.")
@click.argument("gcloud_args", nargs=-1, type=click.UNPROCESSED)
@project_option
def ssh(request_id: str, rank: int, gcloud_args: tuple[str, ...]) -> None:
    """Run ``gcloud compute ssh`` to the VM of rank --rank of an ACTIVE request, in its zone
    and project, through IAP when the VM has no external address. Everything after ``--`` is
    handed to gcloud (e.g. ``-- --command nvidia-smi``)."""
    import os
    import shutil

    from opendws.client import UnknownRequest

    dws = client()
    try:
        shown = dws.status(request_id)
    except UnknownRequest as error:
        raise UsageFailure(str(error)) from None
    argv = ssh_command(shown.hosts, rank, dws.container.settings.project, gcloud_args,
                       request_id=request_id, state=shown.state.value)  # fmt: skip
    if shutil.which(argv[0]) is None:
        raise UsageFailure(
            "gcloud is not on PATH: install the Google Cloud CLI "
            "(cloud.google.com/sdk/docs/install), then run this again"
        )
    os.execvp(argv[0], argv)  # the user's terminal is gcloud's from here on


def ssh_command(
    hosts: Sequence[Host], rank: int, project: str, extra: Sequence[str] = (), *,
    request_id: str, state: str,
) -> list[str]:  # fmt: skip
    """The ``gcloud compute ssh`` command line to the host of ``rank``: ``--tunnel-through-iap``
    when it has no external address (cloud.google.com/iap/docs/using-tcp-forwarding); a TPU
    worker's ``gcloud compute tpus tpu-vm ssh``; ``extra`` last. A request that is not ACTIVE
    (no hosts) or a rank it has not is refused by name."""
    if not hosts:
        raise UsageFailure(
            f"{request_id} is {state}: only an ACTIVE request has VMs to reach "
            f"(see: dws status {request_id})"
        )
    by_rank = {host.rank: host for host in hosts}
    if rank not in by_rank:
        raise UsageFailure(f"{request_id} has no rank {rank}: its ranks are 0 to {len(hosts) - 1}")
    host = by_rank[rank]
    if host.worker is not None:
        # A TPU worker: ``gcloud compute tpus tpu-vm ssh NODE --worker=N``, over its internal
        # address when it has no external one (sdk/gcloud/reference/compute/tpus/tpu-vm/ssh).
        argv = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", host.name,
                f"--worker={host.worker}", "--zone", host.zone, "--project", project]  # fmt: skip
        if host.external_ip is None:
            argv.append("--internal-ip")
        return [*argv, *extra]
    argv = ["gcloud", "compute", "ssh", host.name, "--zone", host.zone, "--project", project]
    if host.external_ip is None:
        argv.append("--tunnel-through-iap")
    return [*argv, *extra]
