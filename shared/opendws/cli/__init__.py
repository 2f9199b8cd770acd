"""The ``dws`` command line, one module per command group:

- :mod:`~opendws.cli.plan`: ``dws plan``, the admission core on a what-if scenario;
- :mod:`~opendws.cli.stack`: ``dws up`` and ``dws demo``, the whole system on this machine;
- :mod:`~opendws.cli.requests`: ``dws submit``, ``status``, ``wait``, ``cancel``, ``release``,
  ``ssh``, ``queue``, ``timeline`` and ``usage``, against a running system;
- :mod:`~opendws.cli.config`: ``dws config apply``;
- :mod:`~opendws.cli.replay`: ``dws simulate`` and ``dws trace convert|export``;
- :mod:`~opendws.cli.common`: what they share (the usage failure, the console, ``--project``).

Errors a user can fix (a missing file, a bad field) are one red line on stderr and exit code 2,
never a traceback. The commands that reach a running system do it through
:class:`opendws.Client` on a container of :mod:`opendws.bootstrap`, both imported only when
they run, so that ``dws plan`` and ``dws simulate`` start without the Google client libraries.
"""

from __future__ import annotations

import click

from opendws import __version__
from opendws.cli import config, plan, replay, requests, stack


@click.group()
@click.version_option(version=__version__, prog_name="dws")
def main() -> None:
    """opendws: admission of accelerator capacity, from the command line."""


for _command in (
    plan.plan_command,
    stack.up,
    stack.demo,
    requests.submit,
    requests.status,
    requests.wait,
    requests.cancel,
    requests.release,
    requests.ssh,
    requests.logs,
    requests.queue,
    requests.timeline,
    requests.usage,
    config.config,
    replay.simulate,
    replay.trace,
):
    main.add_command(_command)

__all__ = ["main"]
