"""What-if scenario files: pools, tenants, grants and pending requests at one instant, in YAML or
JSON, read into a domain :class:`~opendws.domain.Snapshot` plus the ``now`` to plan at.

The file is checked in two steps. Pydantic models (``opendws.schema.scenario``, whose pools,
tenants and policy are the configuration's) check its shape (unknown fields, types, durations,
timezone-aware timestamps); the domain constructors then check the rules each value must hold.
Both kinds of error become one :class:`ScenarioError` whose message names the file, the item
(``pending[3] (train-42)``), the field and the rule, so the user knows what to fix.

Timestamps are normalised to UTC. A pending request without ``submitted_at`` was submitted at the
scenario's ``now``, which the file states: reading a scenario never reads the clock.

:func:`read_document` reads any of the operators' documents (a scenario, or the configuration
that ``dws config apply`` takes) from a YAML or JSON file.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from opendws.domain import InvalidModel, Snapshot
from opendws.schema.common import (
    MAX_REPORTED,
    ScenarioError,
    build_items,
    describe_validation,
    parse_timestamp,
)
from opendws.schema.config import PoolSpec, TenantSpec, build_policy
from opendws.schema.scenario import GrantSpec, ScenarioSpec

__all__ = [
    "MAX_REPORTED",
    "Scenario",
    "ScenarioError",
    "load_scenario",
    "parse_scenario",
    "parse_timestamp",
    "read_document",
]

_FORMATS = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A scenario read from a file: what admission sees, and when it looks."""

    source: str  # where it was read from, for messages
    now: datetime  # the instant the file describes (UTC)
    snapshot: Snapshot


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
        raise ScenarioError(describe_validation(error, data, source, ScenarioSpec)) from None
    return Scenario(source=source, now=spec.now, snapshot=_build_snapshot(spec, source))


def _build_snapshot(spec: ScenarioSpec, source: str) -> Snapshot:
    """Build every domain value, naming the item whose rule is broken."""
    pools = build_items(ScenarioSpec, source, "pools", spec.pools, PoolSpec.build)
    tenants = build_items(ScenarioSpec, source, "tenants", spec.tenants, TenantSpec.build)
    grants = build_items(ScenarioSpec, source, "grants", spec.grants, GrantSpec.build)
    pending = build_items(
        ScenarioSpec, source, "pending", spec.pending, lambda item: item.build(spec.now)
    )
    policy = build_policy(spec.policy, source)
    try:
        return Snapshot(pools=pools, tenants=tenants, grants=grants, pending=pending, policy=policy)
    except InvalidModel as error:
        raise ScenarioError(f"{source}: {error.field}: {error.rule}") from None


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
