"""``--project`` reaches the command's wiring through its click context, never through the
environment: the process's environment is the same after the command as before it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from opendws import bootstrap
from opendws.cli.common import container, project_option


@click.command()
@project_option
def probe() -> None:
    """Print the project the command is wired to, twice (the same container both times)."""
    first, second = container(), container()
    click.echo(f"{first.settings.project} {first is second}")


@pytest.fixture
def process_container() -> Iterator[bootstrap.Container]:
    installed = bootstrap.Container(bootstrap.Settings(project="from-the-environment"))
    previous = bootstrap.use(installed)
    yield installed
    bootstrap.use(previous)


def test_project_option_wires_the_command_to_that_project_and_leaves_the_environment(
    process_container: bootstrap.Container,
) -> None:
    del process_container
    before = dict(os.environ)
    result = CliRunner().invoke(probe, ["--project", "real-project"])
    assert result.exit_code == 0, result.output
    assert result.output.split() == ["real-project", "True"]
    assert dict(os.environ) == before


def test_without_the_option_the_command_runs_on_the_process_container(
    process_container: bootstrap.Container,
) -> None:
    del process_container
    result = CliRunner().invoke(probe, [])
    assert result.exit_code == 0, result.output
    assert result.output.split() == ["from-the-environment", "True"]
