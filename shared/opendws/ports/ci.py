"""One-job CI runners on a CI run's VMs (DESIGN "Work on the gang": the VM lives as long as its
runner): the port through which the agent function mints a runner for a VM, asks whether it
took a job, and deletes it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Protocol

from opendws.domain.run import CiRunner
from opendws.ports.configuration import CiMapping, GitHubRunners, GitLabRunners


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


# The actions runner a VM installs when its image has none: GitHub's release of the Linux x64
# runner and the SHA-256 GitHub publishes beside it (github.com/actions/runner/releases,
# "Validate the hash" of the new-runner instructions). GitHub stops sending jobs to runners
# that fall too far behind its newest release: keep this current, or bake a current runner
# into the VMs' image (OPENDWS_GITHUB_RUNNER_DIR).
GITHUB_RUNNER_VERSION = "2.324.0"
GITHUB_RUNNER_SHA256 = "e8e24a3477da17040b4d6fa6d34c6ecb9a2879e800aa532518ec21e49e21d7b4"
GITHUB_RUNNER_URL = (
    "https://github.com/actions/runner/releases/download/v{version}/"
    "actions-runner-linux-x64-{version}.tar.gz"
)
# Installed into a folder of its own version: one the agent finds without run.sh is refused,
# never overwritten.
GITHUB_RUNNER_DIR = f"/opt/actions-runner-{GITHUB_RUNNER_VERSION}"
GITHUB_RUNNER_INSTALL = RunnerInstall(
    url=GITHUB_RUNNER_URL.format(version=GITHUB_RUNNER_VERSION),
    sha256=GITHUB_RUNNER_SHA256,
    dir=GITHUB_RUNNER_DIR,
    creates="run.sh",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerPrograms:
    """Where the runners are on the VMs: GitHub's runner directory (installed there by the
    agent at ``github_install``'s version when missing; None: the image has it) and the
    ``gitlab-runner`` program."""

    github_dir: str = GITHUB_RUNNER_DIR
    github_install: RunnerInstall | None = GITHUB_RUNNER_INSTALL
    gitlab_runner: str = "gitlab-runner"

    @classmethod
    def of(cls, github_dir: str | None, gitlab_runner: str | None) -> RunnerPrograms:
        """Defaults but where given (a runner directory given is the image's: nothing is
        installed)."""
        return cls(
            github_dir=github_dir or GITHUB_RUNNER_DIR,
            github_install=GITHUB_RUNNER_INSTALL if github_dir is None else None,
            gitlab_runner=gitlab_runner or "gitlab-runner",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Overrides:
    """What points every mapping at other servers (OPENDWS_GITHUB_API_URL, OPENDWS_GITLAB_URL)
    and, for local use, another App and token read from files instead of Secret Manager
    (OPENDWS_GITHUB_APP_ID, OPENDWS_GITHUB_APP_KEY_FILE, OPENDWS_GITLAB_TOKEN_FILE)."""

    github_api_url: str | None = None
    github_app_id: int | None = None
    github_app_key_file: str | None = None
    gitlab_url: str | None = None
    gitlab_token_file: str | None = None

    def github(self, settings: GitHubRunners) -> GitHubRunners:
        return replace(
            settings, api_url=self.github_api_url or settings.api_url,
            app_id=self.github_app_id or settings.app_id,
        )  # fmt: skip

    def gitlab(self, settings: GitLabRunners) -> GitLabRunners:
        return replace(settings, url=self.gitlab_url or settings.url)


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


__all__ = [
    "GITHUB_RUNNER_VERSION", "CiRunners", "Overrides", "RunnerInstall", "RunnerLaunch",
    "RunnerPrograms", "RunnerRefused",
]  # fmt: skip
