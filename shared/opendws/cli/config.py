"""``dws config``: the configuration of a running system — the local stack or a real project
(``--project``) — replaced by a file after validating all of it (``dws config apply FILE``).

Every error a user can fix is one red line and exit code 2.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click

from opendws.cli.common import UsageFailure, console, container, project_option
from opendws.scenario import ScenarioError, read_document


@click.group(short_help="Show or replace the configuration.")
def config() -> None:
    """The configuration: pools, tenants and quotas, prices, the API's access table."""


@config.command("apply", short_help="Validate FILE and make it the configuration.")
@click.argument("file", type=click.Path(path_type=Path))
@project_option
def config_apply(file: Path) -> None:
    """Replace the configuration with FILE (YAML or JSON), after validating all of it."""
    from opendws.config import configuration_to_apply

    try:
        configuration = configuration_to_apply(
            read_document(file), source=str(file), now=datetime.now(UTC)
        )
    except ScenarioError as error:
        raise UsageFailure(str(error)) from None

    store = container().adapters.config
    before = {tenant.name for tenant in store.load().tenants}
    store.save(configuration)
    tenants = [tenant.name for tenant in configuration.tenants]
    intake_url = container().settings.local_intake_url
    if intake_url:  # the local stack: a new tenant gets its topic and subscriptions here
        from emulators.stack import wire_tenants

        for tenant in wire_tenants(container().settings.project, tenants, intake_url):
            console.print(f"tenant {tenant}: its topic capacity-requests-{tenant} is wired")
    else:
        for tenant in sorted(set(tenants) - before):
            console.print(
                f"tenant {tenant} is new: on Google Cloud its topic capacity-requests-{tenant}, "
                "its event subscription and who may use them come from Terraform's `tenants` "
                "variable (infra/); until it lists the tenant, nobody can publish for it"
            )
    console.print(
        f"applied {file}: {len(configuration.pools)} pools, {len(configuration.tenants)} "
        f"tenants, {len(configuration.prices)} prices, {len(configuration.access)} access rules"
    )
