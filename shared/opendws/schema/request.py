"""The request message, ``opendws.request/v1``: the public contract of ``capacity-requests``.

A message is JSON (UTF-8) with ``"schema": "opendws.request/v1"`` and an ``action``: ``submit``
(a new request), ``cancel`` or ``release`` (``request_id`` and ``tenant`` only). Unknown fields
are refused, not ignored. Durations are ``"6h"``, ``"90m"``, ``"2d"``, ``"1h30m"`` or ISO 8601
(``"PT6H"``); timestamps carry a time zone. A submission may carry the job to run on its gang
(``run``, :class:`Run`); without it, it asks for capacity only. A submission naming a calendar
block (``block``, :class:`BlockSubmit`) is a job into that block instead, with no capacity of
its own (:func:`to_block_job`). :func:`parse_message`
validates a message and :func:`to_capacity_request` turns a submission into the domain's
request; both raise :class:`MessageError`, whose ``problems`` name each field and the rule it
broke.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

from opendws.catalog import (
    ACCELERATORS,
    MACHINE_TYPES,
    TPU_ACCELERATORS,
    tpu_calendar_zone_problem,
    tpu_mode_problem,
)
from opendws.domain.model import (
    FLEX_MAX_WAIT,
    CapacityRequest,
    GangShape,
    InvalidModel,
    Mode,
)
from opendws.domain.run import (
    ENV_NAME,
    IMAGE_RULE,
    MAX_RUNNER_LABELS,
    SECRET_VERSION,
    SECRET_VERSION_RULE,
    CiRunner,
    EndsWhen,
    RunSpec,
)
from opendws.durations import parse_duration

SCHEMA_ID = "opendws.request/v1"
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"  # also a valid Firestore document id
NAME_RULE = "letters, digits, '.', '_' and '-', at most 128, starting with a letter or digit"
_LOCATION = r"^[a-z]+-[a-z]+[0-9]+(-[a-z])?$"


def _duration(value: object) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if not isinstance(value, str):
        raise ValueError("must be a string such as '6h', '90m', '2d' or ISO 8601 'PT6H'")
    return parse_duration(value)


Duration = Annotated[
    timedelta,
    BeforeValidator(_duration),
    WithJsonSchema(
        {
            "type": "string",
            "description": "A duration: '6h', '90m', '2d', '1h30m' or ISO 8601 such as 'PT6H'.",
            "examples": ["6h", "2d", "PT90M"],
        }
    ),
]


class FieldProblem(ValueError):
    """A rule broken by one field of a nested object, named relative to that object."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(rule)
        self.field = field
        self.rule = rule


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


class Gang(_Strict):
    """``vm_count`` VMs of ``machine_type``, or ``vm_count`` TPU slices of ``topology``."""

    vm_count: int = Field(ge=1, le=4096, description="VMs (GPU) or slices (TPU), at least 1.")
    accelerator: str = Field(description="Accelerator type, e.g. nvidia-h100-80gb or tpu-v5e.")
    machine_type: str | None = Field(default=None, description="GPU gangs: e.g. a3-highgpu-8g.")
    accelerators_per_vm: int | None = Field(
        default=None, ge=1, description="GPU gangs: defaults to what the machine type carries."
    )
    topology: str | None = Field(
        default=None, pattern=r"^[1-9][0-9]*(x[1-9][0-9]*){1,2}$", description="TPU: e.g. 4x4."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Gang:
        if self.accelerator not in ACCELERATORS:
            known = ", ".join(sorted(ACCELERATORS))
            raise FieldProblem("accelerator", f"{self.accelerator!r} is unknown; known: {known}")
        if (self.machine_type is None) == (self.topology is None):
            raise FieldProblem(
                "machine_type", "give either machine_type (GPU VMs) or topology (a TPU slice)"
            )
        if self.topology is not None:
            if self.accelerator not in TPU_ACCELERATORS:
                raise FieldProblem("topology", f"is for TPU accelerators, not {self.accelerator}")
            if self.accelerators_per_vm is not None:
                raise FieldProblem(
                    "accelerators_per_vm", "is for machine-type gangs, not TPU slices"
                )
            return self
        machine = MACHINE_TYPES.get(self.machine_type or "")
        if machine is None:
            raise FieldProblem(
                "machine_type", f"{self.machine_type!r} is not a known GPU machine type"
            )
        if machine.accelerator != self.accelerator:
            raise FieldProblem(
                "accelerator",
                f"{machine.name} carries {machine.accelerator}, not {self.accelerator}",
            )
        per_vm = self.accelerators_per_vm
        if per_vm is not None and per_vm != machine.accelerators_per_vm:
            raise FieldProblem(
                "accelerators_per_vm",
                f"{machine.name} carries {machine.accelerators_per_vm} per VM, not {per_vm}",
            )
        return self


class Runner(_Strict):
    """A CI run: the VM becomes a one-job runner (the ``ci_hook`` function writes these)."""

    provider: Literal["github", "gitlab"]
    labels: list[str] = Field(min_length=1, max_length=MAX_RUNNER_LABELS)
    source: str = Field(min_length=1, max_length=512,
                        description="The job's repository (owner/name) or project id.")  # fmt: skip


class Run(_Strict):
    """The job run on every VM of the gang once the whole gang is up (its rules are
    :class:`~opendws.domain.run.RunSpec`'s, each refusal naming the field)."""

    command: Annotated[list[str], WithJsonSchema({
        "type": "array", "items": {"type": "string", "minLength": 1},
        "description": (
            "The program and its arguments (argv), run on every VM; required but for a CI "
            "runner's run (runner), which has none."
        ),
    })] = Field(default_factory=list)  # fmt: skip
    image: Annotated[str | None, WithJsonSchema({
        "anyOf": [{"type": "string"}, {"type": "null"}], "default": None,
        "description": (
            "Run the command in this container image, "
            f"{IMAGE_RULE.removeprefix('must be ')}; without it, on the VM's own system."
        ),
    })] = None  # fmt: skip
    env: Annotated[dict[str, str], WithJsonSchema({
        "type": "object", "additionalProperties": False,
        "patternProperties": {f"^{ENV_NAME.pattern}$": {"type": "string"}},
        "description": (
            "Added to the job's environment; not OPENDWS_*, MASTER_*, PET_* or "
            "JAX_COORDINATOR_ADDRESS (opendws sets those); at most 64 KiB of names and values."
        ),
    })] = Field(default_factory=dict)  # fmt: skip
    secrets: Annotated[dict[str, str], WithJsonSchema({
        "type": "object", "additionalProperties": False,
        "patternProperties": {
            f"^{ENV_NAME.pattern}$": {"type": "string", "pattern": f"^{SECRET_VERSION.pattern}$"}
        },
        "description": (
            "Environment name → Secret Manager version name, within the tenant's configured "
            f"secret_prefix; each {SECRET_VERSION_RULE.removeprefix('must be ')}. opendws "
            "stores the version's name, never its value."
        ),
    })] = Field(default_factory=dict)  # fmt: skip
    ends_when: Literal["all_exited", "rank0_exited"] = Field(
        default="all_exited",
        description="When the run is over and its capacity released: every rank exited, or rank 0.",
    )
    runner: Runner | None = Field(
        default=None,
        description="A CI job's run: the VM runs one job as a runner of its CI system.",
    )
    release_on_end: bool = Field(
        default=False,
        description=(
            "calendar only: when the job ends before the block does, delete the block's VMs at "
            "once (true) or keep them until the block ends (false, the default: another job "
            "may run on them). Google bills an approved block in full either way. Refused on "
            "a flex_start request, whose capacity is always given back when its job ends."
        ),
    )

    @model_validator(mode="after")
    def _valid(self) -> Run:
        self.build()
        return self

    def build(self) -> RunSpec:
        """The domain's run; FieldProblem naming the field (relative to ``run``) and the rule."""
        try:
            return RunSpec.of(
                self.command, image=self.image, env=self.env, secrets=self.secrets,
                ends_when=EndsWhen(self.ends_when),
                runner=None if self.runner is None else CiRunner.of(
                    self.runner.provider, self.runner.labels, self.runner.source),
                release_on_end=self.release_on_end,
            )  # fmt: skip
        except InvalidModel as error:
            raise FieldProblem(error.field.removeprefix("run."), error.rule) from None


class Submit(_Strict):
    """A new request for capacity."""

    schema_: Literal["opendws.request/v1"] = Field(alias="schema")
    action: Literal["submit"]
    request_id: str | None = Field(
        default=None,
        pattern=_NAME,
        description="Idempotency key chosen by the client; defaults to the Pub/Sub message id.",
    )
    tenant: str = Field(pattern=_NAME)
    mode: Literal["flex_start", "calendar"]
    gang: Gang
    locations: list[Annotated[str, Field(pattern=_LOCATION)]] = Field(
        min_length=1, max_length=64, description="Zones, or regions meaning any of their zones."
    )
    run_duration: Duration
    max_wait: Duration | None = Field(
        default=None, description="flex_start only; at most 7 days (the default)."
    )
    start_at: AwareDatetime | None = Field(
        default=None,
        description=(
            "calendar only: the block's start, at most 60 (GPU) or 120 (TPU) days ahead, "
            "a TPU block at least a day ahead."
        ),
    )
    priority: int = Field(default=0, ge=-1000, le=1000)
    labels: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")], str] = Field(
        default_factory=dict, max_length=64
    )
    run: Run | None = Field(
        default=None,
        description=(
            "The job to run on the gang once it is up; released when it ends. Without it the "
            "request is capacity only, released by its user."
        ),
    )


class BlockSubmit(_Strict):
    """A job into a running calendar block of the same tenant: its ``run`` runs on the block's
    VMs, after the block's own job and the jobs submitted into it before (one at a time).
    The block holds the capacity and Google bills it in full either way, so the job has no
    mode, gang, locations or times of its own: they are the block's."""

    schema_: Literal["opendws.request/v1"] = Field(alias="schema")
    action: Literal["submit"]
    request_id: str | None = Field(
        default=None,
        pattern=_NAME,
        description="Idempotency key chosen by the client; defaults to the Pub/Sub message id.",
    )
    tenant: str = Field(pattern=_NAME, description="The block's tenant.")
    block: str = Field(
        pattern=_NAME,
        description=(
            "The request id of a calendar block of the same tenant that has not ended and "
            "keeps its VMs when its job ends (run.release_on_end false): the job runs on them."
        ),
    )
    labels: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")], str] = Field(
        default_factory=dict, max_length=64
    )
    run: Run = Field(
        description=(
            "The job to run on the block's VMs; when it ends the job request is released and "
            "the block keeps its VMs (release_on_end does not apply: the block's own says)."
        )
    )


class Cancel(_Strict):
    """Withdraw a request that is not yet active."""

    schema_: Literal["opendws.request/v1"] = Field(alias="schema")
    action: Literal["cancel"]
    request_id: str = Field(pattern=_NAME)
    tenant: str = Field(pattern=_NAME)


class Release(_Strict):
    """Give back the capacity of an active request (early or on time); a pending one is
    cancelled."""

    schema_: Literal["opendws.request/v1"] = Field(alias="schema")
    action: Literal["release"]
    request_id: str = Field(pattern=_NAME)
    tenant: str = Field(pattern=_NAME)
    if_absent: Submit | None = Field(
        default=None,
        description=(
            "What to record, already ended, when no such request exists yet (a CI job that "
            "finished before its queued event arrived: webhooks come out of order). A later "
            "submission of it is then a duplicate and starts nothing. Its request_id and "
            "tenant are this release's."
        ),
    )
    unless_running: bool = Field(
        default=False,
        description=(
            "Leave the request be if it is running (a CI job that completed, whose own VM is a "
            "one-job runner that may have taken another job: its runner's exit ends it), or if "
            "the job ran on the runner of another running request (ran_on): this one's VM will "
            "serve the job that request was made for."
        ),
    )
    ran_on: str | None = Field(
        default=None, max_length=255, description="The runner that ran the completed job."
    )

    @model_validator(mode="after")
    def _same_request(self) -> Release:
        absent = self.if_absent
        if absent is not None and absent.request_id not in (None, self.request_id):
            raise FieldProblem("if_absent.request_id", f"must be {self.request_id!r}, as released")
        if absent is not None and absent.tenant != self.tenant:
            raise FieldProblem("if_absent.tenant", f"must be {self.tenant!r}, as released")
        return self


class CiJob(_Strict):
    """A CI job a one-job runner took or finished (the ``ci_hook`` function sends these, from
    GitHub's ``workflow_job`` and GitLab's Job Hook): the request whose VM the runner is
    records which job ran on it; the job's own request, when it is not running, is released
    (its job runs on another runner)."""

    schema_: Literal["opendws.request/v1"] = Field(alias="schema")
    action: Literal["ci_job"]
    request_id: str = Field(pattern=_NAME, description="The job's own request.")
    tenant: str = Field(pattern=_NAME)
    status: Literal["in_progress", "completed"]
    runner_name: str | None = Field(
        default=None, max_length=255, description="The runner that took the job (a VM's name)."
    )
    conclusion: str | None = Field(default=None, max_length=64)


def _kind(value: Any) -> str | None:
    """Which message ``value`` is: its action, and a submission naming a block is a job into
    it (``block``)."""
    data = value if isinstance(value, dict) else getattr(value, "__dict__", {})
    action = data.get("action")
    if action == "submit" and "block" in data:
        return "block"
    return action if isinstance(action, str) else None


Message = Submit | BlockSubmit | Cancel | Release | CiJob
RequestMessage = Annotated[
    Annotated[Submit, Tag("submit")]
    | Annotated[BlockSubmit, Tag("block")]
    | Annotated[Cancel, Tag("cancel")]
    | Annotated[Release, Tag("release")]
    | Annotated[CiJob, Tag("ci_job")],
    Discriminator(_kind),
]
_ADAPTER: TypeAdapter[Message] = TypeAdapter(RequestMessage)


# Why a flex-start request may not say release_on_end (DESIGN "Two modes": releasing a flex
# run early frees the capacity and stops the cost, so it is always given back).
RELEASE_ON_END_FLEX = (
    "is for calendar blocks only: a flex_start request's capacity is always given back when "
    "its job ends (it is billed for what it used); remove the field"
)


class MessageError(ValueError):
    """A message that cannot be accepted; ``problems`` holds ``(field, rule)`` pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{field}: {rule}" for field, rule in problems))


def parse_message(data: bytes | str | dict[str, Any]) -> Message:
    """Validate one message (JSON bytes or text, or an already decoded object)."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise MessageError([("message", "is not UTF-8 text")]) from None
    if isinstance(data, str):
        text = data
        try:
            decoded = json.loads(text)
        except json.JSONDecodeError as error:
            raise MessageError([("message", f"is not JSON ({error.msg})")]) from None
    else:
        decoded, text = data, json.dumps(data, default=str)
    if not isinstance(decoded, dict):
        raise MessageError([("message", "must be a JSON object")])
    if decoded.get("schema") != SCHEMA_ID:
        raise MessageError([("schema", f"must be {SCHEMA_ID!r}")])
    try:
        # JSON mode: strict types (no "8" for 8) that still read timestamps from strings.
        return _ADAPTER.validate_json(text)
    except ValidationError as error:
        raise MessageError(_problems(error)) from None


def to_capacity_request(
    submit: Submit, *, default_request_id: str, submitted_at: datetime
) -> CapacityRequest:
    """The domain request a submission asks for, submitted at ``submitted_at``; MessageError
    if it breaks a rule of its mode (run time, wait, start, the TPU generations Google
    serves in it)."""
    if submit.start_at is not None and submit.start_at < submitted_at:
        raise MessageError([("start_at", "lies in the past")])
    # Google serves each mode for some TPU generations only: a request it would refuse is
    # refused here, naming the page that says so, not admitted and then refused by Google.
    # (A rule of the request, not of the message: a release naming such a request as
    # if_absent is still a valid release.)
    tpu_problem = tpu_mode_problem(submit.gang.accelerator, submit.mode)
    if tpu_problem is not None:
        raise MessageError([("gang.accelerator", tpu_problem)])
    if submit.mode == Mode.CALENDAR.value:
        zone_problem = tpu_calendar_zone_problem(submit.gang.accelerator, submit.locations)
        if zone_problem is not None:
            raise MessageError([("locations", zone_problem)])
    if (
        submit.mode == Mode.FLEX_START.value
        and submit.run is not None
        and "release_on_end" in submit.run.model_fields_set
    ):
        raise MessageError([("run.release_on_end", RELEASE_ON_END_FLEX)])
    gang = submit.gang
    machine = MACHINE_TYPES.get(gang.machine_type or "")
    mode = Mode(submit.mode)
    max_wait = submit.max_wait
    if mode is Mode.FLEX_START and max_wait is None:
        max_wait = FLEX_MAX_WAIT
    try:
        return CapacityRequest(
            request_id=submit.request_id or default_request_id,
            tenant=submit.tenant,
            mode=mode,
            gang=GangShape(
                vm_count=gang.vm_count,
                accelerator=gang.accelerator,
                machine_type=gang.machine_type,
                accelerators_per_vm=(
                    None
                    if machine is None
                    else gang.accelerators_per_vm or machine.accelerators_per_vm
                ),
                topology=gang.topology,
            ),
            locations=tuple(submit.locations),
            run_duration=submit.run_duration,
            submitted_at=submitted_at,
            max_wait=max_wait,
            start_at=submit.start_at,
            priority=submit.priority,
            labels=tuple(sorted(submit.labels.items())),
            run=None if submit.run is None else submit.run.build(),
        )
    except InvalidModel as error:
        raise MessageError([(error.field, error.rule)]) from None


def to_block_job(
    message: BlockSubmit, block: CapacityRequest | None, *, default_request_id: str,
    submitted_at: datetime,
) -> CapacityRequest:  # fmt: skip
    """The domain request of a job into ``block`` (the request the message names; None: there
    is none): the block's mode, gang, locations and window, the message's run and labels.
    MessageError naming ``block`` when the block cannot take it: another tenant's (said as
    unknown: a tenant learns nothing of another's requests), not a calendar block, a job
    itself, or a block that deletes its VMs when its job ends (``run.release_on_end``)."""
    name = repr(message.block)
    if block is None or block.tenant != message.tenant:
        raise MessageError([("block", f"no calendar block {name} of tenant {message.tenant!r}")])
    if block.block is not None:
        raise MessageError([("block", (
            f"{name} is itself a job into block {block.block!r}: name the block"
        ))])  # fmt: skip
    if block.mode is not Mode.CALENDAR:
        raise MessageError([("block", (
            f"{name} is a {block.mode.value} request, not a calendar block: its capacity is "
            "given back when its job ends, so no other job can run on it"
        ))])  # fmt: skip
    if block.run is not None and block.run.release_on_end:
        raise MessageError([("block", (
            f"block {name} deletes its VMs when its own job ends (run.release_on_end): no "
            "other job can run on them"
        ))])  # fmt: skip
    if "release_on_end" in message.run.model_fields_set:
        raise MessageError([("run.release_on_end", (
            "is the block's to say, not a job's: a job into a block leaves its VMs to the block"
        ))])  # fmt: skip
    try:
        return CapacityRequest(
            request_id=message.request_id or default_request_id, tenant=message.tenant,
            mode=block.mode, gang=block.gang, locations=block.locations,
            run_duration=block.run_duration, submitted_at=submitted_at,
            start_at=block.start_at, priority=block.priority,
            labels=tuple(sorted(message.labels.items())), run=message.run.build(),
            block=block.request_id,
        )  # fmt: skip
    except InvalidModel as error:
        raise MessageError([(error.field, error.rule)]) from None


def json_schema() -> dict[str, Any]:
    """The JSON Schema of ``opendws.request/v1`` that publishers validate against."""
    schema = _ADAPTER.json_schema(by_alias=True)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "opendws capacity request (v1)",
        **schema,
    }


def _problems(error: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for item in error.errors(include_url=False):
        location = [str(part) for part in item["loc"]]
        if location and location[0] in ("submit", "block", "cancel", "release", "ci_job"):
            location = location[1:]  # the discriminator's branch, not a field
        field = ".".join(location) or "message"
        rule = str(item["msg"]).removeprefix("Value error, ")
        cause = item.get("ctx", {}).get("error")
        if isinstance(cause, FieldProblem):
            field, rule = ".".join([*location, cause.field]), cause.rule
        if item["type"] in ("union_tag_invalid", "union_tag_not_found"):
            field, rule = "action", "must be 'submit', 'cancel' or 'release'"
        if item["type"] == "extra_forbidden":
            rule = "is not a field of opendws.request/v1 (unknown fields are refused)"
        problems.append((field, rule))
    return problems


def is_request_id(text: str) -> bool:
    """Whether ``text`` could be a request's id (``request_id``'s pattern, which the Pub/Sub
    message ids intake takes for a missing one also match)."""
    return re.fullmatch(_NAME, text) is not None
