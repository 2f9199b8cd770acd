"""``dws`` commands that replay a workload trace on a virtual clock, through the real scheduler
and beside the baselines (see :mod:`opendws.replay`):

- ``dws simulate --trace FILE --pools FILE`` compares the policies on one trace; ``--add`` and
  ``--quota`` answer "what if this pool had more GPUs, or this team another quota";
- ``dws trace convert PHILLY_CSV --nodes NODES_CSV`` writes the Philly trace in the canonical
  form, with a pools file of its virtual clusters;
- ``dws trace export --accelerator A`` writes a running system's own history (``--project``)
  in that form, with its configured pools and quotas.

Every error a user can fix is one red line and exit code 2.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
from rich import box
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from opendws.cli.common import CommandConsole, UsageFailure, container, errors, project_option
from opendws.domain.model import InvalidModel, PolicySettings
from opendws.durations import format_duration, parse_duration
from opendws.replay.baselines import Policy
from opendws.replay.metrics import PolicyReport
from opendws.replay.philly import (
    HELIOS_END,
    HELIOS_START,
    ReadProgress,
    convert,
    largest_gangs,
)
from opendws.replay.runner import Progress as ReplayProgress
from opendws.replay.runner import replay_many
from opendws.replay.traces import (
    PoolsFile,
    PoolSpec,
    TenantSpec,
    TraceError,
    TraceJob,
    check_jobs_fit,
    read_pools,
    read_trace,
    write_pools,
    write_trace,
)

console = CommandConsole()  # PIPED_WIDTH wide when piped, the terminal's otherwise


# dws simulate ---------------------------------------------------------------------------------


@click.command(short_help="Replay a trace through opendws and the baselines; compare them.")
@click.option(
    "--trace",
    "trace_path",
    required=True,
    type=click.Path(path_type=Path),
    help="The jobs, in the canonical CSV form (dws trace convert writes it).",
)
@click.option(
    "--pools",
    "pools_path",
    required=True,
    type=click.Path(path_type=Path),
    help="The pools (and optional tenant quotas), YAML or JSON.",
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=click.Choice([policy.value for policy in Policy]),
    help="A policy to replay; repeat for several (default: all four).",
)
@click.option(
    "--scale",
    type=float,
    default=None,
    help="Multiply every pool's capacity (at least its largest gang).",
)
@click.option(
    "--add",
    "additions",
    multiple=True,
    metavar="POOL=GPUS",
    help="What if POOL had GPUS more (or fewer, if negative); repeatable.",
)
@click.option(
    "--quota",
    "quotas",
    multiple=True,
    metavar="TENANT=GPUS",
    help="What if TENANT's quota were GPUS; repeatable.",
)
@click.option(
    "--aging-half-life",
    "half_life_text",
    default=None,
    metavar="DURATION",
    help="opendws's aging half-life, e.g. 48h (default: the admission order's own, 24h).",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 16),
    default=1,
    show_default=True,
    help="Replay opendws's independent pools in this many processes.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")  # fmt: skip
def simulate(
    trace_path: Path,
    pools_path: Path,
    policies: Sequence[str],
    scale: float | None,
    additions: Sequence[str],
    quotas: Sequence[str],
    half_life_text: str | None,
    workers: int,
    as_json: bool,
) -> None:
    """Replay the jobs of a trace on its pools under each policy, on a virtual clock, and show
    queueing delays, completion times, utilization and time-outs side by side."""
    try:
        jobs = read_trace(trace_path)
        pools = read_pools(pools_path)
        if scale is not None:
            if scale <= 0:
                raise TraceError(f"--scale must be positive, not {scale}")
            pools = pools.scaled(scale, at_least=largest_gangs(jobs))
        pools = with_changes(pools, additions, quotas)
        check_jobs_fit(jobs, pools)
        settings = None if half_life_text is None else _policy(half_life_text)
    except TraceError as error:
        raise UsageFailure(str(error)) from None
    chosen = [Policy(name) for name in policies] or list(Policy)
    shown = console.is_terminal and errors.is_terminal and not as_json  # quiet when piped
    with replay_progress(jobs, chosen, shown=shown) as progress:
        results = replay_many(
            jobs, pools, chosen, workers=workers, settings=settings, progress=progress
        )
    capacity = sum(pool.capacity for pool in pools.pools)
    reports = [results[policy].report(capacity) for policy in chosen]
    if as_json:
        click.echo(json.dumps(comparison_document(reports), indent=2))
        return
    console.print(
        f"{len(jobs):,} jobs from {jobs[0].submitted_at:%Y-%m-%d} to "
        f"{jobs[-1].submitted_at:%Y-%m-%d} on {len(pools.pools)} pools, {capacity:,} GPUs"
    )
    console.print(comparison_table(reports))


@contextlib.contextmanager
def replay_progress(
    jobs: Sequence[TraceJob], policies: Sequence[Policy], *, shown: bool
) -> Iterator[Callable[[Policy], ReplayProgress] | None]:
    """On a terminal (``shown``), a progress bar per policy — jobs done, the simulated day,
    elapsed and remaining time — fed by the replay; None (quiet) otherwise."""
    if not shown or not jobs:
        yield None
        return
    start = min(job.submitted_at for job in jobs)
    days = max(1, math.ceil((max(job.submitted_at for job in jobs) - start) / timedelta(days=1)))
    columns = (
        TextColumn("{task.description:12}"), BarColumn(),
        MofNCompleteColumn(), TextColumn("jobs, day {task.fields[day]}/" + str(days)),
        TimeElapsedColumn(), TimeRemainingColumn(),
    )  # fmt: skip
    with Progress(*columns, console=errors, transient=False) as bar:
        tasks = {policy: bar.add_task(policy.value, total=len(jobs), day=0) for policy in policies}

        def reporter(policy: Policy) -> ReplayProgress:
            def told(done: int, at: datetime) -> None:
                day = min(days, (at - start) // timedelta(days=1) + 1)
                bar.update(tasks[policy], advance=done, day=day)

            return told

        yield reporter


def with_changes(pools: PoolsFile, additions: Sequence[str], quotas: Sequence[str]) -> PoolsFile:
    """``pools`` with ``POOL=GPUS`` added to pools and ``TENANT=GPUS`` quotas set."""
    capacity = pools.capacity()
    for addition in additions:
        name, gpus = _pair(addition, "--add", "POOL=GPUS")
        if name not in capacity:
            raise TraceError(f"--add {addition}: there is no pool {name!r}")
        capacity[name] += gpus
        if capacity[name] < 1:
            raise TraceError(f"--add {addition}: pool {name} would have {capacity[name]} GPUs")
    tenants = {tenant.name: tenant for tenant in pools.tenants}
    for quota in quotas:
        name, gpus = _pair(quota, "--quota", "TENANT=GPUS")
        if gpus < 0:
            raise TraceError(f"--quota {quota}: a quota cannot be negative")
        previous = tenants.get(name)
        tenants[name] = (
            TenantSpec(name=name, quota=gpus) if previous is None
            else previous.model_copy(update={"quota": gpus})
        )  # fmt: skip
    return PoolsFile(
        pools=tuple(PoolSpec(name=pool.name, capacity=capacity[pool.name]) for pool in pools.pools),
        tenants=tuple(tenants.values()),
    )


def _policy(half_life: str) -> PolicySettings:
    try:
        return PolicySettings(aging_half_life=parse_duration(half_life))
    except (ValueError, InvalidModel) as error:
        raise TraceError(f"--aging-half-life {half_life!r}: {error}") from None


def _pair(text: str, option: str, form: str) -> tuple[str, int]:
    name, _, number = text.partition("=")
    try:
        return name.strip(), int(number)
    except ValueError:
        raise TraceError(f"{option} {text!r}: expected {form}, e.g. {option} a=16") from None


def comparison_document(reports: Sequence[PolicyReport]) -> dict[str, object]:
    """``{"policies": {name: figures}, "wall_s": total}``."""
    return {
        "policies": {
            report.policy: {
                key: value
                for key, value in report.to_json().items()
                if key not in ("policy", "wall_s")
            }
            | {"wall_s": report.wall_s}
            for report in reports
        },
        "wall_s": sum(report.wall_s for report in reports),
    }


def comparison_table(reports: Sequence[PolicyReport]) -> Table:
    """Every policy's figures on one line each, fitting an 80-column terminal: durations
    to their two largest units, one space between columns, no vertical rules."""
    table = Table(
        title="queueing delay (start − submission) and completion, per policy",
        box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
    )  # fmt: skip
    for heading in ("policy", "mean", "p50", "p95", "p99", "max", "mean JCT", "util",
                    "timed out", "replay"):  # fmt: skip
        if heading == "policy":  # whole names: the rest may wrap
            longest = max((len(report.policy) for report in reports), default=6)
            table.add_column(heading, min_width=longest, no_wrap=True)
        else:
            table.add_column(heading, justify="right")
    for report in reports:
        table.add_row(
            report.policy,
            *(
                _seconds(value)
                for value in (
                    report.mean_wait_s,
                    report.p50_wait_s,
                    report.p95_wait_s,
                    report.p99_wait_s,
                    report.max_wait_s,
                    report.mean_jct_s,
                )
            ),
            f"{report.utilization:.1%}",
            f"{report.timed_out:,}",
            f"{report.wall_s:.1f}s",
        )
    return table


def _seconds(value: float) -> str:
    """A duration to its two largest units, as a table cell (``4d17h``, ``21h1m``, ``36m``,
    ``45s``): the rest is noise beside a p95 of days."""
    if value < 60:
        return f"{value:.0f}s"
    unit = 3_600 if value >= 86_400 else 60  # days and hours, else hours and minutes
    return format_duration(timedelta(seconds=round(value / unit) * unit))


# dws trace convert ----------------------------------------------------------------------------


@click.group(short_help="Workload traces: convert them to the canonical form.")
def trace() -> None:
    """Workload traces for `dws simulate`."""


def trace_outputs(command: Callable[..., None]) -> Callable[..., None]:
    """``--out`` (the trace, CSV) and ``--pools-out`` (its pools and quotas, JSON)."""
    command = click.option(
        "--pools-out", "pools_out", required=True, type=click.Path(path_type=Path),
        help="Where to write the pools and quotas (JSON).",
    )(command)  # fmt: skip
    return click.option(
        "--out", "out_path", required=True, type=click.Path(path_type=Path),
        help="Where to write the trace in the canonical form (CSV).",
    )(command)  # fmt: skip


@trace.command("convert", short_help="The Philly trace → canonical CSV and a pools file.")
@click.argument("philly", type=click.Path(path_type=Path))
@click.option(
    "--nodes",
    "nodes_path",
    required=True,
    type=click.Path(path_type=Path),
    help="Virtual cluster node counts (vc,node num), 8 GPUs per node.",
)
@trace_outputs
@click.option(
    "--start",
    "start_text",
    default=HELIOS_START.date().isoformat(),
    show_default=True,
    help="First submission day (UTC).",
)
@click.option(
    "--end",
    "end_text",
    default=(HELIOS_END - timedelta(days=1)).date().isoformat(),
    show_default=True,
    help="Last submission day (UTC), included.",
)
@click.option("--scale", type=float, default=1.0, show_default=True,
              help="Multiply every pool's capacity (at least its largest gang).")  # fmt: skip
def convert_command(
    philly: Path,
    nodes_path: Path,
    out_path: Path,
    pools_out: Path,
    start_text: str,
    end_text: str,
    scale: float,
) -> None:
    """Write the jobs of the Philly trace PHILLY submitted from --start to --end as a canonical
    trace (tenant and pool = virtual cluster), and one pool per virtual cluster."""
    try:
        start = _day(start_text, "--start")
        end = _day(end_text, "--end") + timedelta(days=1)
        if end <= start:
            raise TraceError(f"--end {end_text} is before --start {start_text}")
        if scale <= 0:
            raise TraceError(f"--scale must be positive, not {scale}")
        shown = console.is_terminal and errors.is_terminal  # quiet when piped
        with convert_progress(philly, shown=shown) as progress:
            converted = convert(philly, nodes_path, start=start, end=end, progress=progress)
        if not converted.jobs:
            raise TraceError(f"{philly}: no jobs submitted from {start_text} to {end_text}")
    except TraceError as error:
        raise UsageFailure(str(error)) from None
    pools = converted.pools
    if scale != 1.0:
        pools = pools.scaled(scale, at_least=largest_gangs(converted.jobs))
    _write(converted.jobs, pools, converted.skipped, out_path, pools_out)


@contextlib.contextmanager
def convert_progress(source: Path, *, shown: bool) -> Iterator[ReadProgress | None]:
    """On a terminal (``shown``), a bar of the trace read — bytes of its size, jobs kept,
    elapsed and remaining time — fed by the conversion; None (quiet) otherwise."""
    if not shown:
        yield None
        return
    try:
        size: int | None = source.stat().st_size
    except OSError:
        size = None  # the conversion says what is wrong with the file
    columns = (
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
        TextColumn("{task.fields[jobs]:,} jobs"), TimeElapsedColumn(), TimeRemainingColumn(),
    )  # fmt: skip
    with Progress(*columns, console=errors, transient=False) as bar:
        task = bar.add_task(f"reading {source.name}", total=size, jobs=0)

        def told(read: int, jobs: int) -> None:
            bar.update(task, completed=read, jobs=jobs)

        yield told


@trace.command("export", short_help="Your own history → canonical CSV and a pools file.")
@click.option(
    "--accelerator",
    required=True,
    help="Which accelerator's pools and requests (e.g. nvidia-h100-80gb).",
)
@trace_outputs
@click.option(
    "--since", "since_text", default=None, help="Only requests submitted from this day (UTC) on."
)
@project_option  # fmt: skip
def export_command(
    accelerator: str, out_path: Path, pools_out: Path, since_text: str | None
) -> None:
    """Write the flex requests that ran (or timed out) on ACCELERATOR as a trace, with the
    configured pools (in accelerators) and quotas, for `dws simulate` to ask what if."""
    from opendws.domain.states import RequestState
    from opendws.replay.history import history_trace

    try:
        since = None if since_text is None else _day(since_text, "--since")
        store = container().adapters.store
        ended = (RequestState.RELEASED, RequestState.EXPIRED, RequestState.TIMED_OUT)
        history = history_trace(
            store.in_states(*ended), store.usage(), container().adapters.config.load(),
            accelerator=accelerator, since=since,
        )  # fmt: skip
        if not history.jobs:
            raise TraceError(f"no ended flex request on {accelerator} to export")
    except TraceError as error:
        raise UsageFailure(str(error)) from None
    _write(history.jobs, history.pools, history.skipped, out_path, pools_out)


def _write(
    jobs: Sequence[TraceJob],
    pools: PoolsFile,
    skipped: Mapping[str, int],
    out_path: Path,
    pools_out: Path,
) -> None:
    """Write a trace and its pools file, and say what they hold and what was left out."""
    write_trace(jobs, out_path)
    write_pools(pools, pools_out)
    console.print(
        f"{len(jobs):,} jobs → {out_path}; {len(pools.pools)} pools, "
        f"{sum(pool.capacity for pool in pools.pools):,} GPUs, "
        f"{len(pools.tenants)} tenant quotas → {pools_out}"
    )
    for reason, count in sorted(skipped.items()):
        console.print(f"[dim]left out {count:,} job{'' if count == 1 else 's'}: {reason}[/dim]")


def _day(text: str, option: str) -> datetime:
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    except ValueError:
        raise TraceError(f"{option} {text!r} is not a date such as 2017-10-01") from None
