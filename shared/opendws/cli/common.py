"""What the ``dws`` command modules share: the failure a user can fix (one red line on stderr,
exit code 2, never a traceback), the console, ``--project``, and how timestamps are printed.

No command module imports another one; whatever two of them need lives here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console, ConsoleDimensions
from rich.text import Text

if TYPE_CHECKING:
    from opendws.bootstrap import Container
    from opendws.client import Client

# Table width when stdout is not a terminal (a pipe or a file) and COLUMNS is unset.
PIPED_WIDTH = 160


class CommandConsole(Console):
    """rich's console, but :data:`PIPED_WIDTH` wide when stdout is a pipe or a file and
    ``COLUMNS`` is unset, where rich would take 80 columns and cut exact times and ids."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self.is_terminal or os.environ.get("COLUMNS"):
            return size
        return ConsoleDimensions(PIPED_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self.width, self.height = new_size


console = CommandConsole()
errors = Console(stderr=True)  # progress goes here, beside the results on stdout

F = TypeVar("F", bound=Callable[..., Any])


class UsageFailure(click.ClickException):
    """An error the user can fix: one red line on stderr and exit code 2, no traceback."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        """Print the message as one red line (on stderr unless ``file`` is given)."""
        console = Console(stderr=True) if file is None else Console(file=file)
        console.print(Text(f"error: {self.format_message()}", style="bold red"), soft_wrap=True)


@dataclass
class Wiring:
    """What a command runs on, kept on its click context: the project ``--project`` named
    (None: the environment's), and the container built from it once, when first asked for."""

    project: str | None = None
    built: Container | None = None


def project_option(function: F) -> F:
    """``--project``: a real project (application default credentials) instead of the stack.
    The option only records the project on the command's context (:class:`Wiring`); the
    environment is never changed."""

    def set_project(context: click.Context, _: click.Parameter, value: str | None) -> None:
        if value:
            context.ensure_object(Wiring).project = value

    return click.option(
        "--project",
        help="Google Cloud project (default: OPENDWS_PROJECT, else the local stack's).",
        callback=set_project,
        expose_value=False,
        is_eager=True,
    )(function)


def container() -> Container:
    """The adapters and services of the running command: with ``--project``, a container of
    its own, built once from the environment with that project; without it, the process's
    (:func:`opendws.bootstrap.container`, built from the environment)."""
    from opendws import bootstrap
    from opendws.client import for_project

    wiring = click.get_current_context().find_object(Wiring)
    if wiring is None or wiring.project is None:
        return bootstrap.container()
    if wiring.built is None:
        wiring.built = for_project(wiring.project)
    return wiring.built


def client() -> Client:
    """An :class:`opendws.Client` on the running command's :func:`container`."""
    from opendws.client import Client

    return Client(container=container())


def iso_seconds(at: datetime | None) -> str | None:
    """``at`` in UTC to the second (``2026-12-01T06:00:00+00:00``), or None."""
    return None if at is None else at.astimezone(UTC).isoformat(timespec="seconds")


def relative(at: datetime | None, now: datetime) -> str:
    """``at`` as a person reads it beside a clock showing ``now``: ``in 2 h 10 min``,
    ``5 min ago``, ``now`` (within half a minute); the two largest units, rounded to the
    minute; empty for None."""
    if at is None:
        return ""
    seconds = (at - now).total_seconds()
    if abs(seconds) < 30:
        return "now"
    minutes = round(abs(seconds) / 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    parts = [f"{n} {unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "min")) if n]
    text = " ".join(parts[:2])
    return f"in {text}" if seconds > 0 else f"{text} ago"
