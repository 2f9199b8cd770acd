"""What the documents operators write have in common: the configuration (``config/scheduler``,
``dws config apply``) and what-if scenario files.

Their field types (durations as text, timezone-aware timestamps), the base of every part (unknown
fields refused, naming the nearest known one), the one error both raise
(:class:`ScenarioError`), and how a pydantic error and a broken domain rule become its message:
the file, the item (``pending[3] (train-42)``), the field and the rule, so the author knows what
to fix. Nothing here reads the clock.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from pydantic_core import ErrorDetails

from opendws.domain import InvalidModel
from opendws.durations import parse_duration

# How many problems one error message lists before it summarises the rest.
MAX_REPORTED = 5

# Text pydantic would read as Unix seconds.
_NUMBER = re.compile(r"^\s*[-+]?\d+(\.\d*)?\s*$")

_S = TypeVar("_S", bound="Spec")
_T = TypeVar("_T")


class ScenarioError(ValueError):
    """A scenario or configuration document that cannot be read; the message says where and
    what to fix."""


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


def parse_timestamp(text: str) -> datetime:
    """A timezone-aware ISO 8601 timestamp, in UTC; ValueError saying what is wrong."""
    try:
        return _TIMESTAMP.validate_python(text)
    except ValidationError as error:
        raise ValueError(_error_message(error.errors()[0])) from None


# The parts of a document -------------------------------------------------------------------


class Spec(BaseModel):
    """Base of every part of a document: unknown fields are refused, never ignored."""

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


class Document(Spec):
    """Base of a whole document (what one file holds)."""

    # Which field names the items of each top-level list, for error messages.
    item_keys: ClassVar[Mapping[str, str]] = {}


def build_items(
    document: type[Document],
    source: str,
    section: str,
    specs: Sequence[_S],
    build: Callable[[_S], _T],
) -> tuple[_T, ...]:
    """``build`` applied to each item of one top-level list of ``document``, in file order; a
    broken domain rule names the item."""
    built: list[_T] = []
    for index, spec in enumerate(specs):
        try:
            built.append(build(spec))
        except InvalidModel as error:
            name = getattr(spec, document.item_keys[section])
            raise ScenarioError(
                f"{source}: {section}[{index}] ({name}): {error.field}: {error.rule}"
            ) from None
    return tuple(built)


# Error messages ----------------------------------------------------------------------------


def describe_validation(
    error: ValidationError, data: object, source: str, document: type[Document]
) -> str:
    """One line naming the file and, for each problem, the item, the field and the rule."""
    problems = [_problem(details, data, document) for details in error.errors()]
    if len(problems) == 1:
        return f"{source}: {problems[0]}"
    shown = "; ".join(problems[:MAX_REPORTED])
    more = len(problems) - MAX_REPORTED
    rest = f"; and {more} more" if more > 0 else ""
    return f"{source}: {len(problems)} problems: {shown}{rest}"


def _problem(details: ErrorDetails, data: object, document: type[Document]) -> str:
    """One problem: where it is, then what is wrong."""
    if not details["loc"] and details["type"] == "model_type":
        holds = "nothing" if data is None else f"a {type(data).__name__}"
        fields = ", ".join(document.model_fields)
        return f"the file must hold a mapping with the fields {fields}; it holds {holds}"
    return f"{_where(details['loc'], data, document.item_keys)}{_error_message(details)}"


def _where(loc: tuple[int | str, ...], data: object, item_keys: Mapping[str, str]) -> str:
    """``pending[3] (train-42): gang.vm_count: `` for the location ``loc`` of an error."""
    if not loc:
        return ""
    head, rest = str(loc[0]), loc[1:]
    if head in item_keys and rest and isinstance(rest[0], int):
        index = rest[0]
        name = _item_name(data, head, index, item_keys[head])
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


def _item_name(data: object, section: str, index: int, key: str) -> str | None:
    """The identifying field ``key`` of item ``index`` of ``section`` in the raw data."""
    items = data.get(section) if isinstance(data, dict) else None
    if not isinstance(items, list) or not 0 <= index < len(items):
        return None
    item = items[index]
    name = item.get(key) if isinstance(item, dict) else None
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
