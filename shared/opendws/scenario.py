"""What-if scenario files: pools, tenants, grants and pending requests at one instant, in YAML or
JSON, read into a domain :class:`~opendws.domain.Snapshot` plus the ``now`` to plan at.

The file is checked in two steps. Pydantic models check its shape (unknown fields, types,
durations, timezone-aware timestamps); the domain constructors then check the rules each value
must hold. Both kinds of error become one :class:`ScenarioError` whose message names the file,
the item (``pending[3] (train-42)``), the field and the rule, so the user knows what to fix.

Timestamps are normalised to UTC. A pending request without ``submitted_at`` was submitted at the
scenario's ``now``.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    StrictBool,
    StrictInt,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails

from opendws.domain import (
    CapacityRequest,
    GangShape,
    Grant,
    InvalidModel,
    Mode,
    PolicySettings,
    Pool,
    Provider,
    QueueingStrategy,
    Quota,
    Snapshot,
    Tenant,
)
from opendws.domain.calendar import CancellationRule
from opendws.durations import parse_duration

# How many problems one error message lists before it summarises the rest.
MAX_REPORTED = 5
# Which field names the items of each top-level list, for error messages.
_ITEM_KEYS = {
    "pools": "pool_id",
    "tenants": "name",
    "grants": "request_id",
    "pending": "request_id",
}
_FORMATS = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}

# Text pydantic would read as Unix seconds.
_NUMBER = re.compile(r"^\s*[-+]?\d+(\.\d*)?\s*$")

_S = TypeVar("_S", bound="Spec")
_T = TypeVar("_T")


class ScenarioError(ValueError):
    """A scenario file that cannot be read; the message says where and what to fix."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A scenario read from a file: what admission sees, and when it looks."""

    source: str  # where it was read from, for messages
    now: datetime  # the instant the file describes (UTC)
    snapshot: Snapshot


# Field types -------------------------------------------------------------------------------


def _to_duration(value: object) -> object:
    """Durations are text (``6h``, ``PT6H``); a bare number has no unit and is refused."""
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, timedelta):
        return value
    raise ValueError(f"give a duration as text such as '6h' or 'PT6H', not {value!r}")


def _to_utc(value: datetime) -> datetime:
    """Refuse naive timestamps (whose zone would be a guess); normalise the rest to UTC."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"{value.isoformat()} has no time zone; add 'Z' or an offset, e.g. 2026-12-01T00:00:00Z"
        )
    return value.astimezone(UTC)


def _refuse_number(value: object) -> object:
    """Timestamps are ISO 8601 text; a bare number would silently be read as Unix seconds."""
    if isinstance(value, int | float) or (isinstance(value, str) and _NUMBER.match(value)):
        raise ValueError(
            f"give a timestamp as ISO 8601 text such as 2026-12-01T00:00:00Z, not {value!r}"
        )
    return value


Duration = Annotated[timedelta, BeforeValidator(_to_duration)]
Timestamp = Annotated[datetime, BeforeValidator(_refuse_number), AfterValidator(_to_utc)]
_TIMESTAMP = TypeAdapter(Timestamp)


# The file's shape --------------------------------------------------------------------------


class Spec(BaseModel):
    """Base of every part of the file: unknown fields are refused, never ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_fields(cls, data: Any) -> Any:
        """Name the unknown field, the nearest known one and the list of known ones (the
        ``extra="forbid"`` message alone says only "Extra inputs are not permitted")."""
        if isinstance(data, dict):
            known = list(cls.model_fields)
            unknown = sorted(str(key) for key in data if key not in cls.model_fields)
            if unknown:
                first = unknown[0]
                close = difflib.get_close_matches(first, known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(
                    f"unknown field {first!r}{hint} (known fields: {', '.join(known)})"
                )
        return data


class PolicySpec(Spec):
    """``policy``: knobs of the admission order."""

    aging_half_life: Duration | None = None  # None: the domain's default
    race_width: StrictInt | None = None  # None: the domain's default (pools raced at once)
    race_eagerly: StrictBool | None = None  # None: the domain's default (race once a pool is short)
    # None: the domain's default (Google's newest cancellation rule for calendar blocks).
    calendar_cancellation: CancellationRule | None = None


class PoolSpec(Spec):
    """``pools[i]``: capacity of one shape in one zone."""

    pool_id: str
    zone: str
    shape: str
    accelerator: str
    provider: Provider
    capacity: StrictInt
    short_until: Timestamp | None = None

    def build(self) -> Pool:
        """The domain pool."""
        return Pool(
            pool_id=self.pool_id,
            zone=self.zone,
            shape=self.shape,
            accelerator=self.accelerator,
            provider=self.provider,
            capacity=self.capacity,
            short_until=self.short_until,
        )


class QuotaSpec(Spec):
    """``tenants[i].quotas[j]``: a tenant's share of one accelerator type."""

    accelerator: str
    nominal: StrictInt
    borrowing_limit: StrictInt | None = None


class TenantSpec(Spec):
    """``tenants[i]``: a team, its cohort and its quotas."""

    name: str
    cohort: str | None = None
    queueing: QueueingStrategy = QueueingStrategy.BEST_EFFORT
    quotas: list[QuotaSpec] = []

    def build(self) -> Tenant:
        """The domain tenant (quota rules are checked here too)."""
        quotas = tuple(
            Quota(
                accelerator=quota.accelerator,
                nominal=quota.nominal,
                borrowing_limit=quota.borrowing_limit,
            )
            for quota in self.quotas
        )
        return Tenant(name=self.name, quotas=quotas, cohort=self.cohort, queueing=self.queueing)


class GrantSpec(Spec):
    """``grants[i]``: capacity already committed over ``[start_at, end_at)``."""

    request_id: str
    tenant: str
    pool_id: str
    accelerator: str
    units: StrictInt
    accelerator_units: StrictInt
    start_at: Timestamp
    end_at: Timestamp

    def build(self) -> Grant:
        """The domain grant."""
        return Grant(
            request_id=self.request_id,
            tenant=self.tenant,
            pool_id=self.pool_id,
            accelerator=self.accelerator,
            units=self.units,
            accelerator_units=self.accelerator_units,
            start_at=self.start_at,
            end_at=self.end_at,
        )


class GangSpec(Spec):
    """``pending[i].gang``: VMs of one machine type, or TPU slices of one topology."""

    vm_count: StrictInt
    accelerator: str
    machine_type: str | None = None
    accelerators_per_vm: StrictInt | None = None
    topology: str | None = None


class PendingSpec(Spec):
    """``pending[i]``: a request awaiting a decision."""

    request_id: str
    tenant: str
    mode: Mode
    gang: GangSpec
    locations: list[str]
    run_duration: Duration
    max_wait: Duration | None = None
    start_at: Timestamp | None = None
    priority: StrictInt = 0
    labels: dict[str, str] = {}
    submitted_at: Timestamp | None = None  # None: submitted at the scenario's now

    def build(self, now: datetime) -> CapacityRequest:
        """The domain request; ``now`` stands in for a missing ``submitted_at``."""
        gang = GangShape(
            vm_count=self.gang.vm_count,
            accelerator=self.gang.accelerator,
            machine_type=self.gang.machine_type,
            accelerators_per_vm=self.gang.accelerators_per_vm,
            topology=self.gang.topology,
        )
        return CapacityRequest(
            request_id=self.request_id,
            tenant=self.tenant,
            mode=self.mode,
            gang=gang,
            locations=tuple(self.locations),
            run_duration=self.run_duration,
            submitted_at=now if self.submitted_at is None else self.submitted_at,
            max_wait=self.max_wait,
            start_at=self.start_at,
            priority=self.priority,
            labels=tuple(sorted(self.labels.items())),
        )


class ScenarioSpec(Spec):
    """The whole file."""

    now: Timestamp
    policy: PolicySpec | None = None
    pools: list[PoolSpec]
    tenants: list[TenantSpec]
    grants: list[GrantSpec] = []
    pending: list[PendingSpec] = []


# Reading -----------------------------------------------------------------------------------


def load_scenario(path: Path) -> Scenario:
    """Read the scenario in ``path`` (``.yaml``, ``.yml`` or ``.json``)."""
    return parse_scenario(read_document(path), source=str(path))


def read_document(path: Path) -> object:
    """The raw data in ``path``, parsed as YAML or JSON by its extension."""
    kind = _FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ScenarioError(
            f"{path}: unknown file type {path.suffix or '(none)'!r}; "
            "name the file *.yaml, *.yml or *.json"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such file; check the path") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ScenarioError(f"{path}: cannot be read ({error})") from None
    try:
        if kind == "json":
            return json.loads(text)
        return yaml.load(text, Loader=_ScenarioLoader)  # a SafeLoader: plain data only
    except json.JSONDecodeError as error:
        raise ScenarioError(
            f"{path}: not valid JSON at line {error.lineno}, column {error.colno}: {error.msg}"
        ) from None
    except yaml.YAMLError as error:
        raise ScenarioError(f"{path}: not valid YAML: {_yaml_problem(error)}") from None


def parse_scenario(data: object, *, source: str) -> Scenario:
    """Check ``data`` (as read from a file) and build the domain snapshot from it."""
    try:
        spec = ScenarioSpec.model_validate(data)
    except ValidationError as error:
        raise ScenarioError(describe_validation(error, data, source)) from None
    return Scenario(source=source, now=spec.now, snapshot=_build_snapshot(spec, source))


def parse_timestamp(text: str) -> datetime:
    """A timezone-aware ISO 8601 timestamp, in UTC; ValueError saying what is wrong."""
    try:
        return _TIMESTAMP.validate_python(text)
    except ValidationError as error:
        raise ValueError(_error_message(error.errors()[0])) from None


def _build_snapshot(spec: ScenarioSpec, source: str) -> Snapshot:
    """Build every domain value, naming the item whose rule is broken."""
    pools = build_items(source, "pools", spec.pools, lambda item: item.build())
    tenants = build_items(source, "tenants", spec.tenants, lambda item: item.build())
    grants = build_items(source, "grants", spec.grants, lambda item: item.build())
    pending = build_items(source, "pending", spec.pending, lambda item: item.build(spec.now))
    policy = build_policy(spec.policy, source)
    try:
        return Snapshot(pools=pools, tenants=tenants, grants=grants, pending=pending, policy=policy)
    except InvalidModel as error:
        raise ScenarioError(f"{source}: {error.field}: {error.rule}") from None


def build_policy(spec: PolicySpec | None, source: str) -> PolicySettings:
    """The policy the file sets, the domain's defaults where it is silent."""
    if spec is None:
        return PolicySettings()
    given: dict[str, Any] = {}
    if spec.aging_half_life is not None:
        given["aging_half_life"] = spec.aging_half_life
    if spec.race_width is not None:
        given["race_width"] = spec.race_width
    if spec.race_eagerly is not None:
        given["race_eagerly"] = spec.race_eagerly
    if spec.calendar_cancellation is not None:
        given["calendar_cancellation"] = spec.calendar_cancellation
    try:
        return PolicySettings(**given)
    except InvalidModel as error:
        raise ScenarioError(f"{source}: policy: {error.field}: {error.rule}") from None


def build_items(
    source: str, section: str, specs: Sequence[_S], build: Callable[[_S], _T]
) -> tuple[_T, ...]:
    """``build`` applied to each item of one top-level list, in file order."""
    built: list[_T] = []
    for index, spec in enumerate(specs):
        try:
            built.append(build(spec))
        except InvalidModel as error:
            name = getattr(spec, _ITEM_KEYS[section])
            raise ScenarioError(
                f"{source}: {section}[{index}] ({name}): {error.field}: {error.rule}"
            ) from None
    return tuple(built)


# Error messages ----------------------------------------------------------------------------


def describe_validation(error: ValidationError, data: object, source: str) -> str:
    """One line naming the file and, for each problem, the item, the field and the rule."""
    problems = [_problem(details, data) for details in error.errors()]
    if len(problems) == 1:
        return f"{source}: {problems[0]}"
    shown = "; ".join(problems[:MAX_REPORTED])
    more = len(problems) - MAX_REPORTED
    rest = f"; and {more} more" if more > 0 else ""
    return f"{source}: {len(problems)} problems: {shown}{rest}"


def _problem(details: ErrorDetails, data: object) -> str:
    """One problem: where it is, then what is wrong."""
    if not details["loc"] and details["type"] == "model_type":
        holds = "nothing" if data is None else f"a {type(data).__name__}"
        fields = ", ".join(ScenarioSpec.model_fields)
        return f"the file must hold a mapping with the fields {fields}; it holds {holds}"
    return f"{_where(details['loc'], data)}{_error_message(details)}"


def _where(loc: tuple[int | str, ...], data: object) -> str:
    """``pending[3] (train-42): gang.vm_count: `` for the location ``loc`` of an error."""
    if not loc:
        return ""
    head, rest = str(loc[0]), loc[1:]
    if head in _ITEM_KEYS and rest and isinstance(rest[0], int):
        index = rest[0]
        name = _item_name(data, head, index)
        head = f"{head}[{index}]" + (f" ({name})" if name else "")
        rest = rest[1:]
    field = _dotted(rest)
    return f"{head}: {field}: " if field else f"{head}: "


def _dotted(loc: Sequence[int | str]) -> str:
    """``("gang", "vm_count")`` → ``gang.vm_count``; ``("locations", 1)`` → ``locations[1]``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _item_name(data: object, section: str, index: int) -> str | None:
    """The identifying field of item ``index`` of ``section`` in the raw data, if it has one."""
    items = data.get(section) if isinstance(data, dict) else None
    if not isinstance(items, list) or not 0 <= index < len(items):
        return None
    item = items[index]
    name = item.get(_ITEM_KEYS[section]) if isinstance(item, dict) else None
    return str(name) if isinstance(name, str | int) else None


def _error_message(details: ErrorDetails) -> str:
    """The rule a pydantic error reports, in the words a file author needs."""
    kind = details["type"]
    context = details.get("ctx") or {}
    if kind == "missing":
        return "required field is missing"
    if kind == "value_error" and "error" in context:
        return str(context["error"])
    if kind == "string_type" and isinstance(details["input"], bool | int | float):
        return (
            f"must be text, not {details['input']!r} "
            "(quote it: YAML reads yes, no, on, off and numbers as non-text)"
        )
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a mapping of fields, not {details['input']!r}"
    return f"{details['msg']} (got {details['input']!r})"


def _yaml_problem(error: yaml.YAMLError) -> str:
    """Where in the file and what: ``line 3, column 5: expected ',' or ']'``."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {error.problem}"
    return " ".join(str(error).split())


class _ScenarioLoader(yaml.SafeLoader):
    """YAML read as plain data, with two changes. Timestamps stay text, so YAML and JSON files
    read them alike and a naive one is refused instead of guessed. A key given twice in one
    mapping is an error instead of the last one silently winning."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable):
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} appears twice", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


_ScenarioLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
