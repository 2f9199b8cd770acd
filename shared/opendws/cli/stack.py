"""``dws`` commands that run the whole system on this machine:

- ``dws up`` starts the local stack (the emulators, every function, the topics and
  subscriptions, the configuration and the reconcile ticker) and runs until Ctrl-C, SIGTERM
  or SIGHUP, which all stop everything;
- ``dws demo`` drives a scripted mixed workload through a fresh local stack and summarises it.

Every error a user can fix is one red line and exit code 2.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import click
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from opendws.cli.common import UsageFailure, console, errors
from opendws.scenario import ScenarioError

# dws up ---------------------------------------------------------------------------------------


@click.command(short_help="Run the whole system on this machine until Ctrl-C.")
@click.option("--tick", default=60.0, show_default=True, help="Seconds between reconcile ticks.")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Configuration to load (default: the example local configuration).",
)
@click.option(
    "--operation-latency",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds a simulated Compute operation takes to be DONE "
    "(default: a few seconds, as on Google).",
)
@click.option("--rate-quotas", is_flag=True,
              help="Enforce Google's default Compute Engine API rate quotas.")  # fmt: skip
def up(
    tick: float, config_path: Path | None, operation_latency: float | None, rate_quotas: bool
) -> None:
    """Start the emulators, every function, the topics and subscriptions, the configuration
    and the reconcile ticker; print what clients need and where each function logs; stop
    everything on Ctrl-C."""
    try:
        from emulators import EmulatorError, missing_reason
        from emulators.stack import DEFAULT_CONFIG, local_stack
        from opendws.sim.cloud import OPERATION_LATENCY
    except ImportError as error:  # pragma: no cover - the package ships them
        raise UsageFailure(f"the local stack is not installed with this package: {error}") from None
    reason = missing_reason()
    if reason is not None:
        raise UsageFailure(f"cannot start the local stack: {reason}")
    latency = (
        OPERATION_LATENCY if operation_latency is None else timedelta(seconds=operation_latency)
    )
    try:
        # A TERM or HUP (a service manager stopping it, its terminal closing) unwinds like
        # Ctrl-C, so that every emulator and function server is stopped and its port freed;
        # so does an INT even where it was started with INT ignored (`dws up &` in a script).
        stack_signals = stop_on_signals(signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
        with (
            stack_signals,
            local_stack(
                tick=timedelta(seconds=tick),
                config=config_path or DEFAULT_CONFIG,
                progress=lambda step: console.print(f"[dim]·[/dim] {step}"),
                operation_latency=latency,
                rate_quotas=rate_quotas,
            ) as stack,
        ):
            console.print("[bold green]opendws is up.[/bold green] Point clients at it with:")
            for name, value in stack.client_environment().items():
                click.echo(f"export {name}={value}")
            for name, url in stack.urls.items():
                console.print(f"[dim]{name} function: {url}[/dim]")
            # The functions' structured logs, one file each beside the emulators' (a path
            # to tail, on one line whatever the width).
            folder = next(iter(stack.logs.values())).parent
            click.echo(f"function logs: {folder}/*.log (Cloud Logging JSON lines; removed on exit)")
            console.print("Ctrl-C stops everything (so do SIGTERM and SIGHUP).")
            wait_for_a_signal()
    except (KeyboardInterrupt, Stopped) as stop:
        console.print(f"stopped{f' by {stop}' if isinstance(stop, Stopped) else ''}")
    except (EmulatorError, ScenarioError) as error:
        raise UsageFailure(str(error)) from None


class Stopped(Exception):
    """A signal asked the process to stop; its text is the signal's name."""


# How long the main thread sleeps at a time while it waits for a signal (see wait_for_a_signal).
SIGNAL_STEP_S = 0.5


def wait_for_a_signal(step: float = SIGNAL_STEP_S) -> NoReturn:
    """Sleep until a signal's handler raises, in steps of ``step`` seconds. A signal sent to
    the process may be delivered to any of its threads (the reconcile ticker's, the clients'),
    and Python runs its handler only once the main thread next runs: a main thread in one
    long sleep would not notice it until that sleep ended."""
    while True:
        time.sleep(step)


@contextlib.contextmanager
def stop_on_signals(*signals: signal.Signals) -> Iterator[None]:
    """While the block runs (in the main thread), ``signals`` (default SIGTERM and SIGHUP)
    raise :class:`Stopped` where the program is, so that it unwinds through every ``finally``
    as Ctrl-C does; the previous handlers come back afterwards."""
    chosen = signals or (signal.SIGTERM, signal.SIGHUP)

    def stop(number: int, _frame: object) -> None:
        raise Stopped(signal.Signals(number).name)

    previous = {number: signal.signal(number, stop) for number in chosen}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@click.command(short_help="Run a scripted mixed workload on a fresh local stack.")
@click.option("--json", "as_json_flag", is_flag=True, help="Print the summary as JSON.")
def demo(as_json_flag: bool) -> None:
    """Start the local stack, drive flex requests, a CI job, a TPU slice, a calendar block, a
    cancel, an early release and a stockout with failover through it, then summarise. On a
    terminal a bar shows the stack starting, then the demo's steps; piped, only the story and
    the summary are printed; with --json only the summary."""
    from emulators import EmulatorError, missing_reason
    from emulators.demo import STEPS, as_json, run_demo
    from emulators.stack import local_stack

    reason = missing_reason()
    if reason is not None:
        raise UsageFailure(f"cannot start the local stack: {reason}")
    shown = console.is_terminal and errors.is_terminal and not as_json_flag
    try:
        with (
            demo_progress(shown=shown, story=not as_json_flag, steps=STEPS) as view,
            local_stack(
                tick=timedelta(seconds=5),
                latency=timedelta(seconds=3),
                review_delay=timedelta(seconds=5),
                progress=view.step,
            ) as stack,
        ):
            outcomes = run_demo(stack, view.say)
    except (EmulatorError, TimeoutError) as error:
        raise click.ClickException(f"demo failed: {error}") from None
    if as_json_flag:
        click.echo(as_json(outcomes))
        return
    table = Table("request", "tenant", "state", "pool", "attempts", "events", "story",
                  "reasons", "after", title="opendws demo")  # fmt: skip
    for o in outcomes:
        table.add_row(o.request_id, o.tenant, o.state, o.pool or "", str(o.attempts),
                      str(o.events), o.story, o.reasons, o.times)  # fmt: skip
    console.print(table)


@dataclass(frozen=True, slots=True)
class DemoView:
    """Where ``dws demo`` tells what happens: ``step``, a step of starting the local stack;
    ``say``, a line of the demo's story."""

    step: Callable[[str], None]
    say: Callable[[str], None]


@contextlib.contextmanager
def demo_progress(*, shown: bool, story: bool, steps: int) -> Iterator[DemoView]:
    """On a terminal (``shown``), a live bar on stderr: the local stack starting (its current
    step), then the demo's steps done of ``steps`` and the time elapsed, with the story
    printed above it. Otherwise no progress: the story alone, on stdout, when ``story``."""
    if not shown:

        def tell(line: str) -> None:
            if story:
                console.print(f"[bold]›[/bold] {line}")

        yield DemoView(step=lambda _: None, say=tell)
        return
    columns = (
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(),
    )  # fmt: skip
    with Progress(*columns, console=errors, transient=False) as bar:
        starting = bar.add_task("local stack: starting", total=None)
        running = bar.add_task("demo steps", total=steps, visible=False)

        def step(text: str) -> None:
            bar.update(starting, description=f"local stack: {text}", refresh=True)

        begun: list[bool] = []  # once the first line is said

        def say(line: str) -> None:
            if not begun:  # the stack is up: the demo's steps begin
                begun.append(True)
                bar.update(starting, total=1, completed=1, description="local stack: ready")
                bar.update(running, visible=True)
            bar.console.print(f"[bold]›[/bold] {line}")
            bar.advance(running)

        yield DemoView(step=step, say=say)
