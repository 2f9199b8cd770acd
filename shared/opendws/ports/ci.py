"""One-job CI runners on a CI run's VMs (DESIGN "Work on the gang": the VM lives as long as its
runner): the port through which the agent function mints a runner for a VM, asks whether it
took a job, and deletes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from opendws.domain.run import CiRunner
from opendws.ports.configuration import CiMapping


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerInstall:
    """What the agent installs before it runs the runner: the ``.tar.gz`` at ``url`` (its
    SHA-256 ``sha256``) unpacked into ``dir`` unless ``dir/creates`` exists."""

    url: str
    sha256: str
    dir: str
    creates: str

    def to_json(self) -> dict[str, str]:
        return {"url": self.url, "sha256": self.sha256, "dir": self.dir, "creates": self.creates}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerLaunch:
    """A runner minted for one VM: its id at the CI system, and how the agent runs it.
    ``env`` carries the runner's credential: it is handed to the agent once and never stored,
    logged or put in an event (not in ``repr`` either)."""

    runner_id: str
    command: tuple[str, ...]
    env: dict[str, str] = field(repr=False)
    install: RunnerInstall | None = None


class RunnerRefused(Exception):
    """The CI system refused or could not be asked. ``permanent``: asking again will not help
    (a revoked installation, a token without the scope it needs, a refused body) — the run
    ends saying why; otherwise try again, not before ``retry_at`` when given."""

    def __init__(self, message: str, *, permanent: bool, retry_at: datetime | None = None) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.retry_at = retry_at


class CiRunners(Protocol):
    """The CI systems' runner APIs, as a CI mapping names them."""

    def launch(
        self, mapping: CiMapping, runner: CiRunner, vm: str, max_run: timedelta
    ) -> RunnerLaunch:
        """Mint a one-job runner named ``vm`` for a job asking for ``runner.labels``, that
        runs a job for at most ``max_run``; RunnerRefused saying why not."""
        ...

    def took_job(self, mapping: CiMapping, runner_id: str) -> bool | None:
        """Whether the runner has taken a job (busy, or done with one); None: it is gone (a
        just-in-time runner is removed after its job). RunnerRefused when it cannot tell."""
        ...

    def delete(self, mapping: CiMapping, runner_id: str) -> bool:
        """Remove the runner (one already gone is removed); False when the CI system refuses
        because it is running a job. RunnerRefused when it cannot be asked."""
        ...


__all__ = ["CiRunners", "RunnerInstall", "RunnerLaunch", "RunnerRefused"]
