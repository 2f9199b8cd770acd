"""The job a request may carry: what runs on every VM of its gang once the whole gang is up.

A :class:`RunSpec` is a frozen value that checks its rules when built and raises
:class:`~opendws.domain.model.InvalidModel` naming the field (``run.command``,
``run.env.NAME``, ...) and the rule, so the message schema, the stored request and the agent
function read one set of rules. It holds references to secrets (Secret Manager version names),
never their values. Whether a secret lies within its tenant's configured prefix depends on the
configuration: :func:`secret_prefix_problem` says, where the tenant's prefix is known.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from opendws.domain.model import InvalidModel

# Environment variable names: POSIX's portable form (letters, digits and '_', not starting with
# a digit; pubs.opengroup.org/onlinepubs/9699919799/basedefs/V1_chap08.html).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_NAME_RULE = "letters, digits and '_', not starting with a digit"
# Names opendws sets for the job itself (OPENDWS_*, MASTER_ADDR/PORT, torchrun's PET_*, JAX's
# coordinator): a request may not set them.
RESERVED_PREFIXES = ("OPENDWS_", "MASTER_", "PET_")
RESERVED_NAMES = frozenset({"JAX_COORDINATOR_ADDRESS"})
# The most a request's env may hold, names and values in UTF-8 (the same bound applies to the
# command's arguments): the job's own settings, not its data.
MAX_ENV_BYTES = 64 * 1024
MAX_COMMAND_BYTES = 64 * 1024

# A Secret Manager version's resource name, projects/*/secrets/*/versions/* with "latest" as
# the alias of the newest version (secret-manager/docs/reference/rest/v1/
# projects.secrets.versions/access). A project is named by its id (6 to 30 lowercase letters,
# digits and hyphens, starting with a letter, not ending with a hyphen:
# resource-manager/docs/creating-managing-projects) or its number; a secret id is at most 255
# letters, digits, '-' and '_' (CreateSecretRequest.secret_id).
_PROJECT = r"(?:[a-z][a-z0-9-]{4,28}[a-z0-9]|[1-9][0-9]*)"
_SECRET_ID = r"[A-Za-z0-9_-]{1,255}"
SECRET_VERSION = re.compile(
    rf"projects/{_PROJECT}/secrets/{_SECRET_ID}/versions/(?:[1-9][0-9]*|latest)"
)
SECRET_VERSION_RULE = (
    "must be a Secret Manager version name, projects/PROJECT/secrets/SECRET/versions/VERSION "
    "with VERSION a number or 'latest'"
)
# What a tenant's secret_prefix may be: a project's secrets, or those whose id starts so.
SECRET_PREFIX = re.compile(rf"projects/{_PROJECT}/secrets/[A-Za-z0-9_-]{{0,254}}")

# A container image reference, as Docker and every OCI registry client parse one (the grammar
# of distribution/reference, reference.go): [domain/]path[:tag][@digest], the domain's port
# optional, path components lowercase; at most 255 characters of name.
_DOMAIN = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*(?::[0-9]+)?"  # noqa: E501
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE = re.compile(rf"(?P<name>{_NAME})(?::{_TAG})?(?:@{_DIGEST})?")
MAX_IMAGE_NAME = 255
IMAGE_RULE = (
    "must be a container image reference such as "
    "us-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE:TAG or …@sha256:DIGEST"
)


class EndsWhen(StrEnum):
    """When a run is over (and its capacity released)."""

    ALL_EXITED = "all_exited"  # every rank's command has exited
    RANK0_EXITED = "rank0_exited"  # rank 0's command has exited (the others are stopped)


class CiProvider(StrEnum):
    """Whose one-job runner a CI run is."""

    GITHUB = "github"
    GITLAB = "gitlab"


# GitHub refuses a just-in-time runner with more than 100 labels (the generate-jitconfig
# operation's ``labels``: minItems 1, maxItems 100, in GitHub's OpenAPI description).
MAX_RUNNER_LABELS = 100
MAX_LABEL_LENGTH = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class CiRunner:
    """A CI run: the gang's VM becomes a one-job runner of ``provider`` for a job asking for
    ``labels`` (GitHub ``runs-on``, GitLab tags), queued in ``source`` (GitHub ``owner/name``,
    GitLab the project id). opendws builds the runner's command when the VM is up (the
    runner's credential is minted then, never stored); the runner's exit ends the run."""

    provider: CiProvider
    labels: tuple[str, ...]  # sorted
    source: str

    def __post_init__(self) -> None:
        if not self.labels or len(self.labels) > MAX_RUNNER_LABELS:
            raise InvalidModel(
                "run.runner.labels", f"holds {len(self.labels)}; give 1 to {MAX_RUNNER_LABELS}"
            )
        for label in self.labels:
            if not label or len(label) > MAX_LABEL_LENGTH or "\0" in label:
                raise InvalidModel(
                    "run.runner.labels",
                    f"{label!r}: a label is 1 to {MAX_LABEL_LENGTH} characters, no NUL",
                )
        if not self.source or len(self.source) > 512:
            raise InvalidModel("run.runner.source", "must name the repository or project")

    @classmethod
    def of(cls, provider: CiProvider | str, labels: Any, source: str) -> CiRunner:
        """A runner from text (``provider``) and any iterable of labels."""
        try:
            kind = CiProvider(provider)
        except ValueError:
            known = " or ".join(repr(member.value) for member in CiProvider)
            raise InvalidModel("run.runner.provider", f"is {provider!r}; give {known}") from None
        return cls(provider=kind, labels=tuple(sorted(set(labels))), source=str(source))

    def to_json(self) -> dict[str, Any]:
        return {"provider": self.provider.value, "labels": list(self.labels),
                "source": self.source}  # fmt: skip


def reserved(name: str) -> bool:
    """Whether opendws sets the environment variable ``name`` for the job itself."""
    return name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSpec:
    """The job: ``command`` (argv) run on every VM, in ``image`` when given, with ``env`` and
    the values of ``secrets`` (env name → Secret Manager version name) added to its
    environment; over when ``ends_when`` holds. ``env`` and ``secrets`` are sorted
    ``(name, value)`` pairs (:meth:`of` takes mappings).

    ``release_on_end`` (calendar blocks only): Google bills an approved block in full, so by
    default the block's VMs stay until the block ends when its job ends early; True deletes
    them at once (the block is billed in full either way). Flex-start capacity is always given
    back when its job ends: intake refuses the field on a flex-start request."""

    command: tuple[str, ...]
    image: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    secrets: tuple[tuple[str, str], ...] = ()
    ends_when: EndsWhen = EndsWhen.ALL_EXITED
    runner: CiRunner | None = None  # a CI run: no command of its own (see CiRunner)
    release_on_end: bool = False

    def __post_init__(self) -> None:
        if self.runner is None:
            _check_command(self.command)
        elif self.command or self.image is not None or self.secrets:
            raise InvalidModel(
                "run.runner",
                "a CI runner's run has no command, image or secrets of its own: opendws "
                "builds the runner's command when the VM is up",
            )
        if self.image is not None:
            _check_image(self.image)
        _check_names("run.env", self.env)
        _check_names("run.secrets", self.secrets)
        given = {name for name, _ in self.env}
        for name, version in self.secrets:
            if name in given:
                raise InvalidModel(
                    f"run.secrets.{name}", "is also set in run.env; give a name in one of them"
                )
            if SECRET_VERSION.fullmatch(version) is None:
                raise InvalidModel(f"run.secrets.{name}", f"{version!r} {SECRET_VERSION_RULE}")
        for name, value in self.env:
            if "\0" in value:
                raise InvalidModel(f"run.env.{name}", "must not contain a NUL character")
        size = sum(len(name.encode()) + len(value.encode()) for name, value in self.env)
        if size > MAX_ENV_BYTES:
            raise InvalidModel(
                "run.env",
                f"holds {size} bytes of names and values (UTF-8); at most {MAX_ENV_BYTES} "
                "(64 KiB): pass data in files or the image, not the environment",
            )

    @classmethod
    def of(
        cls,
        command: list[str] | tuple[str, ...],
        *,
        image: str | None = None,
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        ends_when: EndsWhen | str = EndsWhen.ALL_EXITED,
        runner: CiRunner | None = None,
        release_on_end: bool = False,
    ) -> RunSpec:
        """A run from mappings (``env``, ``secrets``) and text (``ends_when``)."""
        try:
            ending = EndsWhen(ends_when)
        except ValueError:
            known = " or ".join(repr(member.value) for member in EndsWhen)
            raise InvalidModel("run.ends_when", f"is {ends_when!r}; give {known}") from None
        return cls(
            command=tuple(command), image=image, env=tuple(sorted((env or {}).items())),
            secrets=tuple(sorted((secrets or {}).items())), ends_when=ending, runner=runner,
            release_on_end=release_on_end,
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        """The run as ``opendws.request/v1`` writes it (``image`` null when not given;
        ``runner`` and ``release_on_end`` only when given)."""
        return {
            "command": list(self.command),
            "image": self.image,
            "env": dict(self.env),
            "secrets": dict(self.secrets),
            "ends_when": self.ends_when.value,
            **({} if self.runner is None else {"runner": self.runner.to_json()}),
            **({"release_on_end": True} if self.release_on_end else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunSpec:
        """Read back what :meth:`to_json` wrote."""
        runner = data.get("runner")
        return cls.of(
            data.get("command") or (), image=data.get("image"), env=data.get("env"),
            secrets=data.get("secrets"), ends_when=data.get("ends_when", EndsWhen.ALL_EXITED),
            runner=None if runner is None else CiRunner.of(
                runner["provider"], runner["labels"], runner["source"]),
            release_on_end=data.get("release_on_end") is True,
        )  # fmt: skip


def secret_prefix_problem(run: RunSpec, prefix: str | None, tenant: str) -> tuple[str, str] | None:
    """What is wrong with ``run``'s secrets, as ``(field, rule)``, for a tenant whose configured
    secret prefix is ``prefix`` (None: the tenant may use none); None when each lies within it."""
    if not run.secrets:
        return None
    if prefix is None:
        return (
            f"run.secrets.{run.secrets[0][0]}",
            f"tenant {tenant!r} may use no secrets: the configuration gives it no "
            f"secret_prefix (an operator sets one on the tenant, e.g. secret_prefix: "
            f"projects/PROJECT/secrets/{tenant}-, and lets the agent function read those)",
        )
    for name, version in run.secrets:
        if not version.startswith(prefix):
            return (
                f"run.secrets.{name}",
                f"{version!r} lies outside tenant {tenant!r}'s secret prefix {prefix!r}",
            )
    return None


def check_secret_prefix(prefix: str) -> None:
    """Refuse a tenant's ``secret_prefix`` that is not the start of secret names of one
    project (``projects/PROJECT/secrets/`` and, optionally, the start of their ids)."""
    if SECRET_PREFIX.fullmatch(prefix) is None:
        raise InvalidModel(
            "secret_prefix",
            f"{prefix!r} must be projects/PROJECT/secrets/ followed by the start of the "
            "secrets' ids, if any (e.g. projects/my-project/secrets/vision-)",
        )


def _check_command(command: tuple[str, ...]) -> None:
    if not command:
        raise InvalidModel(
            "run.command", "must not be empty: give the program and its arguments (argv)"
        )
    for index, argument in enumerate(command):
        if not argument:
            raise InvalidModel(f"run.command[{index}]", "must not be empty")
        if "\0" in argument:
            raise InvalidModel(f"run.command[{index}]", "must not contain a NUL character")
    size = sum(len(argument.encode()) + 1 for argument in command)
    if size > MAX_COMMAND_BYTES:
        raise InvalidModel(
            "run.command",
            f"holds {size} bytes (UTF-8); at most {MAX_COMMAND_BYTES} (64 KiB): put long "
            "arguments in a file",
        )


def _check_image(image: str) -> None:
    match = IMAGE.fullmatch(image)
    if match is None:
        raise InvalidModel("run.image", f"{image!r} {IMAGE_RULE}")
    if len(match["name"]) > MAX_IMAGE_NAME:
        raise InvalidModel("run.image", f"its name is longer than {MAX_IMAGE_NAME} characters")


def _check_names(field_name: str, pairs: tuple[tuple[str, str], ...]) -> None:
    for name, _ in pairs:
        if ENV_NAME.fullmatch(name) is None:
            raise InvalidModel(
                f"{field_name}.{name}", f"is not an environment name: {ENV_NAME_RULE}"
            )
        if reserved(name):
            raise InvalidModel(
                f"{field_name}.{name}",
                "is set by opendws for the job (OPENDWS_*, MASTER_*, PET_*, "
                "JAX_COORDINATOR_ADDRESS); choose another name",
            )


# torchrun's and the peers' default rendezvous port; a gang's own port is drawn from
# [MASTER_PORT_BASE, MASTER_PORT_BASE + MASTER_PORT_SPAN) by its order's name, so that gangs
# sharing one machine (locally, every VM is on loopback) do not collide.
MASTER_PORT_BASE = 29500
MASTER_PORT_SPAN = 2000


@dataclass(frozen=True, slots=True, kw_only=True)
class Gang:
    """Where a run's ranks are: one internal address per rank, in rank order."""

    request_id: str
    addresses: tuple[str, ...]  # rank i's internal IP at index i
    accelerators_per_node: int  # GPUs per VM (0 where the gang has none)
    master_port: int
    gpus: bool = True  # a GPU gang (JAX_COORDINATOR_ADDRESS is set; a TPU slice's JAX finds
    # its peers itself)


def master_port(order: str) -> int:
    """A gang's rendezvous port: fixed for its order, spread over a range by its name (a
    sum of its characters, not Python's salted hash: the same on every process)."""
    return MASTER_PORT_BASE + sum(order.encode()) % MASTER_PORT_SPAN


def job_environment(gang: Gang, rank: int) -> dict[str, str]:
    """What opendws sets for rank ``rank``'s job (DESIGN "Work on the gang"): its own names,
    ``MASTER_ADDR``/``MASTER_PORT``, torchrun's ``PET_*`` (so ``torchrun train.py`` needs no
    flags), and ``JAX_COORDINATOR_ADDRESS`` for GPU gangs. Never ``RANK``/``WORLD_SIZE``:
    torchrun sets those per process. The hostfile (``OPENDWS_HOSTFILE``) is written by the
    agent from :func:`hostfile`."""
    if not 0 <= rank < len(gang.addresses):
        raise ValueError(f"rank {rank} is not one of the gang's {len(gang.addresses)} ranks")
    master = gang.addresses[0]
    port = str(gang.master_port)
    nodes = str(len(gang.addresses))
    per_node = str(gang.accelerators_per_node)
    env = {
        "OPENDWS_REQUEST_ID": gang.request_id,
        "OPENDWS_NODE_RANK": str(rank),
        "OPENDWS_NUM_NODES": nodes,
        "OPENDWS_NODE_IPS": "\n".join(gang.addresses),
        "OPENDWS_MASTER_ADDR": master,
        "OPENDWS_MASTER_PORT": port,
        "OPENDWS_ACCELERATORS_PER_NODE": per_node,
        "MASTER_ADDR": master,
        "MASTER_PORT": port,
        "PET_NNODES": nodes,
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": master,
        "PET_MASTER_PORT": port,
        "PET_NPROC_PER_NODE": str(max(gang.accelerators_per_node, 1)),
    }
    if gang.gpus:
        env["JAX_COORDINATOR_ADDRESS"] = f"{master}:{port}"
    return env


def hostfile(gang: Gang) -> str:
    """The gang as an MPI/DeepSpeed hostfile: one ``ip slots=n`` line per rank."""
    slots = max(gang.accelerators_per_node, 1)
    return "".join(f"{address} slots={slots}\n" for address in gang.addresses)


class RunVerdict(StrEnum):
    """What the ranks' exits say of a run."""

    RUNNING = "RUNNING"  # not over yet
    STOP_OTHERS = "STOP_OTHERS"  # over for one rank in a way that ends it: stop the rest
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


@dataclass(frozen=True, slots=True, kw_only=True)
class RankExit:
    """One rank's exit as its agent reported it (``stopped``: opendws stopped it)."""

    rank: int
    code: int
    stopped: bool


def run_verdict(
    ends_when: EndsWhen, ranks: int, exits: Mapping[int, RankExit]
) -> tuple[RunVerdict, str]:
    """Where a run of ``ranks`` ranks stands, given the exits so far, and one line naming each
    rank's exit code. A non-zero exit of a rank opendws did not stop fails the run and stops
    the others first; the exits of ranks opendws stopped are not failures. ``all_exited``:
    over when every rank exited; ``rank0_exited``: once rank 0 exited the others are stopped,
    and its code decides."""
    said = ", ".join(
        f"rank {rank} {'stopped' if e.stopped else 'exited'} {e.code}"
        for rank, e in sorted(exits.items())
    )
    failed = [e for e in exits.values() if not e.stopped and e.code != 0]
    everyone = len(exits) >= ranks
    if failed:
        return (RunVerdict.FAILED if everyone else RunVerdict.STOP_OTHERS), said
    if ends_when is EndsWhen.RANK0_EXITED and 0 in exits:
        if everyone:
            return (RunVerdict.SUCCEEDED if exits[0].code == 0 else RunVerdict.FAILED), said
        return RunVerdict.STOP_OTHERS, said
    if everyone:
        return RunVerdict.SUCCEEDED, said
    return RunVerdict.RUNNING, said
