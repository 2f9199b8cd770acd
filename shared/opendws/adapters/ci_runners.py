"""The CiRunners port (opendws.ports.ci) on GitHub's and GitLab's APIs.

- **GitHub**: the mapping's App (its private key read from Secret Manager when first needed,
  kept in memory only) mints a just-in-time runner named after the VM with the job's labels
  in the mapping's runner group (:class:`~opendws.adapters.github_app.GitHubApp`). The agent
  runs ``DIR/run.sh`` with the config in ``ACTIONS_RUNNER_INPUT_JITCONFIG``: the runner reads
  any of its flags from ``ACTIONS_RUNNER_INPUT_<FLAG>`` (actions/runner
  ``src/Runner.Listener/CommandSettings.cs``; actions-runner-controller starts its runners
  so), which keeps the credential off the process list. ``RUNNER_ALLOW_RUNASROOT=1``: the
  agent runs as root on the VM, and ``run.sh``'s ``config.sh`` refuses root without it. The
  runner is installed by the agent at :data:`~opendws.ports.ci.GITHUB_RUNNER_VERSION` unless
  the image has it.
- **GitLab**: ``POST /user/runners`` with the mapping's token (Secret Manager) makes a runner
  for the job's project (or the mapping's group) with the job's tags, locked, not running
  untagged jobs, ``maximum_timeout`` the request's run time; the agent runs ``gitlab-runner
  run-single --max-builds 1 --wait-timeout IDLE`` with the runner's token in
  ``CI_SERVER_TOKEN``.

Errors become :class:`~opendws.ports.ci.RunnerRefused`: 401 and 403 (a revoked installation,
a token without the scope it needs) and refused bodies are permanent; rate limits carry when
to come back; 5xx and no answer are worth another try.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import cast

from opendws.adapters.github_app import (
    GitHubApp,
    GitHubError,
    GitHubInvalid,
    GitHubRateLimited,
    GitHubUnavailable,
    RunnerScope,
)
from opendws.adapters.gitlab_runners import (
    MINIMUM_TIMEOUT,
    Executor,
    GitLabError,
    GitLabNotFound,
    GitLabRateLimited,
    GitLabRunners,
    GitLabUnavailable,
    RunnerSpec,
    run_single_argv,
    run_single_environment,
)
from opendws.domain.run import CiProvider, CiRunner
from opendws.ports.ci import Overrides, RunnerInstall, RunnerLaunch, RunnerPrograms, RunnerRefused
from opendws.ports.configuration import CiMapping, GitHubRunners
from opendws.ports.configuration import GitLabRunners as GitLabSettings
from opendws.ports.runs import SecretReader, UnknownSecret

JITCONFIG_VARIABLE = "ACTIONS_RUNNER_INPUT_JITCONFIG"


class ProviderRunners:
    """See the module docstring. One API client per App or token, kept (tests give the
    fakes' addresses through the mapping or the overrides)."""

    def __init__(
        self,
        secrets: SecretReader,
        programs: RunnerPrograms | None = None,
        *,
        overrides: Overrides | None = None,
    ) -> None:
        self._secrets = secrets
        self._programs = programs or RunnerPrograms()
        self._overrides = overrides or Overrides()
        self._apps: dict[tuple[str, int, str], GitHubApp] = {}
        self._gitlabs: dict[tuple[str, str], GitLabRunners] = {}
        self._lock = threading.Lock()

    # The mapping's settings, as overridden.

    def _github(self, mapping: CiMapping) -> GitHubRunners:
        if mapping.github is None:
            raise RunnerRefused("the job's CI mapping names no GitHub App", permanent=True)
        return self._overrides.github(mapping.github)

    def _gitlab_of(self, mapping: CiMapping) -> GitLabSettings:
        if mapping.gitlab is None:
            raise RunnerRefused("the job's CI mapping names no GitLab", permanent=True)
        return self._overrides.gitlab(mapping.gitlab)

    # The port.

    def launch(
        self, mapping: CiMapping, runner: CiRunner, vm: str, max_run: timedelta
    ) -> RunnerLaunch:
        if runner.provider is CiProvider.GITHUB:
            return self._github_launch(self._github(mapping), runner, vm)
        return self._gitlab_launch(mapping, self._gitlab_of(mapping), runner, vm, max_run)

    def took_job(self, mapping: CiMapping, runner_id: str) -> bool | None:
        if mapping.github is not None:
            settings = self._github(mapping)
            app = self._app(settings)
            try:
                found = app.runner(settings.installation_id, _scope(settings), int(runner_id))
            except GitHubError as error:
                raise _github_refused(f"read runner {runner_id}", error) from error
            return None if found is None else found.busy
        client = self._gitlab(self._gitlab_of(mapping))
        try:
            return bool(client.jobs(int(runner_id)))
        except GitLabNotFound:
            return None
        except GitLabError as error:
            raise _gitlab_refused(f"read runner {runner_id}", error) from error

    def delete(self, mapping: CiMapping, runner_id: str) -> bool:
        if mapping.github is not None:
            settings = self._github(mapping)
            app = self._app(settings)
            try:
                app.delete_runner(settings.installation_id, _scope(settings), int(runner_id))
            except GitHubInvalid:
                return False  # 422: the runner is running a job
            except GitHubError as error:
                raise _github_refused(f"delete runner {runner_id}", error) from error
            return True
        client = self._gitlab(self._gitlab_of(mapping))
        try:
            client.delete(int(runner_id))
        except GitLabError as error:
            raise _gitlab_refused(f"delete runner {runner_id}", error) from error
        return True

    # GitHub.

    def _github_launch(self, settings: GitHubRunners, runner: CiRunner, vm: str) -> RunnerLaunch:
        app = self._app(settings)
        try:
            jit = app.generate_jit_config(
                settings.installation_id, _scope(settings), name=vm,
                runner_group_id=settings.runner_group_id, labels=list(runner.labels),
            )  # fmt: skip
        except GitHubError as error:
            raise _github_refused(f"mint a just-in-time runner for {vm}", error) from error
        programs = self._programs
        install = programs.github_install
        if install is not None and install.dir != programs.github_dir:
            install = RunnerInstall(url=install.url, sha256=install.sha256,
                                    dir=programs.github_dir, creates=install.creates)  # fmt: skip
        return RunnerLaunch(
            runner_id=str(jit.runner_id), command=(f"{programs.github_dir}/run.sh",),
            env={JITCONFIG_VARIABLE: jit.encoded_jit_config, "RUNNER_ALLOW_RUNASROOT": "1"},
            install=install,
        )  # fmt: skip

    def _app(self, settings: GitHubRunners) -> GitHubApp:
        key = (settings.api_url, settings.app_id, settings.private_key_secret)
        with self._lock:
            app = self._apps.get(key)
        if app is None:
            pem = self._secret(
                settings.private_key_secret,
                self._overrides.github_app_key_file,
                "the GitHub App's private key",
            )
            try:
                app = GitHubApp(settings.app_id, pem, api_url=settings.api_url)
            except ValueError as error:
                raise RunnerRefused(str(error), permanent=True) from None
            with self._lock:
                app = self._apps.setdefault(key, app)
        return app

    # GitLab.

    def _gitlab_launch(
        self, mapping: CiMapping, settings: GitLabSettings, runner: CiRunner, vm: str,
        max_run: timedelta,
    ) -> RunnerLaunch:  # fmt: skip
        client = self._gitlab(settings)
        if settings.group_id is not None:
            spec = RunnerSpec(runner_type="group_type", group_id=settings.group_id,
                              tags=runner.labels, maximum_timeout=max(max_run, MINIMUM_TIMEOUT),
                              description=vm)  # fmt: skip
        else:
            try:
                project = int(runner.source)
            except ValueError:
                raise RunnerRefused(
                    f"the job's project {runner.source!r} is not a GitLab project id",
                    permanent=True,
                ) from None
            spec = RunnerSpec(
                runner_type="project_type", project_id=project, tags=runner.labels,
                maximum_timeout=max(max_run, MINIMUM_TIMEOUT), description=vm,
            )  # fmt: skip
        try:
            created = client.create(spec)
        except GitLabError as error:
            raise _gitlab_refused(f"create a runner for {vm}", error) from error
        argv = run_single_argv(settings.url, cast(Executor, settings.executor),
                               mapping.idle_timeout)  # fmt: skip
        argv[0] = self._programs.gitlab_runner
        return RunnerLaunch(runner_id=str(created.id), command=tuple(argv),
                            env=run_single_environment(created.token))  # fmt: skip

    def _gitlab(self, settings: GitLabSettings) -> GitLabRunners:
        key = (settings.url, settings.token_secret)
        with self._lock:
            client = self._gitlabs.get(key)
        if client is None:
            token = self._secret(
                settings.token_secret, self._overrides.gitlab_token_file, "the GitLab token"
            ).strip()
            client = GitLabRunners(settings.url, token)
            with self._lock:
                client = self._gitlabs.setdefault(key, client)
        return client

    def _secret(self, version: str, file: str | None, what: str) -> str:
        """The secret's value: from ``file`` when given (local use), else Secret Manager."""
        if file is not None:
            try:
                return Path(file).read_text()
            except OSError as error:
                raise RunnerRefused(f"{what} cannot be read from {file}: {error}",
                                    permanent=True) from None  # fmt: skip
        try:
            return self._secrets.read(version)
        except UnknownSecret as error:
            raise RunnerRefused(f"{what} ({version}) cannot be read: {error}",
                                permanent=True) from None  # fmt: skip


def _scope(settings: GitHubRunners) -> RunnerScope:
    if settings.repository is not None:
        owner, _, name = settings.repository.partition("/")
        return RunnerScope.repository(owner, name)
    assert settings.organization is not None  # the configuration names one or the other
    return RunnerScope.organization(settings.organization)


def _github_refused(doing: str, error: GitHubError) -> RunnerRefused:
    """GitHub's error as RunnerRefused saying what was being done."""
    said = f"GitHub refused to {doing}: {error}"
    if isinstance(error, GitHubRateLimited):
        return RunnerRefused(said, permanent=False, retry_at=error.retry_at)
    return RunnerRefused(said, permanent=not isinstance(error, GitHubUnavailable))


def _gitlab_refused(doing: str, error: GitLabError) -> RunnerRefused:
    """GitLab's error as RunnerRefused saying what was being done."""
    said = f"GitLab refused to {doing}: {error}"
    if isinstance(error, GitLabRateLimited):
        return RunnerRefused(said, permanent=False, retry_at=error.retry_at)
    return RunnerRefused(said, permanent=not isinstance(error, GitLabUnavailable))


__all__ = ["JITCONFIG_VARIABLE", "ProviderRunners"]
