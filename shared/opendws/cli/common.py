"""What the ``dws`` command modules share: the failure a user can fix (one red line on stderr,
exit code 2, never a traceback), the console, ``--project``, and how timestamps are printed.

No command module imports another one; whatever two of them need lives here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, Any, TypeVar

import click
from rich.console import Console
from rich.text import Text

# Table width when stdout is not a terminal (a pipe or a file) and COLUMNS is unset.
PIPED_WIDTH = 160

console = Console()

F = TypeVar("F", bound=Callable[..., Any])


class UsageFailure(click.ClickException):
    """An error the user can fix: one red line on stderr and exit code 2, no traceback."""

    exit_code = 2

    def show(self, file: IO[Any] | None = None) -> None:
        """Print the message as one red line (on stderr unless ``file`` is given)."""
        console = Console(stderr=True) if file is None else Console(file=file)
        console.print(Text(f"error: {self.format_message()}", style="bold red"), soft_wrap=True)


def project_option(function: F) -> F:
    """``--project``: a real project (application default credentials) instead of the stack."""

    def set_project(_: click.Context, __: click.Parameter, value: str | None) -> str | None:
        if value:
            os.environ["OPENDWS_PROJECT"] = value
        return value

    return click.option(
        "--project",
        help="Google Cloud project (default: OPENDWS_PROJECT, else the local stack's).",
        callback=set_project,
        expose_value=False,
        is_eager=True,
    )(function)


def iso_seconds(at: datetime | None) -> str | None:
    """``at`` in UTC to the second (``2026-12-01T06:00:00+00:00``), or None."""
    return None if at is None else at.astimezone(UTC).isoformat(timespec="seconds")
