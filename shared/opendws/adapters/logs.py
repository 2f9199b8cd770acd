"""Logs as Cloud Logging reads them: one JSON object per line on stdout.

Cloud Run (where Cloud Functions run) sends each line its containers write to Cloud Logging
and parses a JSON line into ``jsonPayload``, taking these special fields out of it
(https://cloud.google.com/logging/docs/structured-logging): ``severity``, ``message``,
``time``, ``logging.googleapis.com/trace`` (``projects/PROJECT/traces/TRACE_ID``: the entry is
shown with its trace), ``logging.googleapis.com/spanId``,
``logging.googleapis.com/trace_sampled`` and ``logging.googleapis.com/sourceLocation``.
Everything else stays in the payload: a service's ``extra={"fields": {...}}`` (``request_id``,
``tenant``, ``pool``, ``state``, a cloud call's ``error_code`` …) becomes top-level payload
fields, so ``jsonPayload.request_id="train-1"`` is a request's whole story in one query.

The trace comes from the invocation: :func:`traced` sets it for the duration of one call, from
the ``traceparent`` header (W3C Trace Context, which Cloud Run propagates) or
``X-Cloud-Trace-Context`` (``TRACE_ID/SPAN_ID;o=1``), or a CloudEvent's ``traceparent``
extension.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

TRACE_FIELD = "logging.googleapis.com/trace"
SPAN_FIELD = "logging.googleapis.com/spanId"
SAMPLED_FIELD = "logging.googleapis.com/trace_sampled"
SOURCE_FIELD = "logging.googleapis.com/sourceLocation"
# Python's level names that Cloud Logging's LogSeverity spells otherwise.
SEVERITIES = {"WARN": "WARNING", "FATAL": "CRITICAL"}

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_CLOUD_TRACE = re.compile(r"^([0-9a-fA-F]{32})(?:/(\d+))?(?:;o=([01]))?$")


@dataclass(frozen=True, slots=True)
class Trace:
    """The trace an invocation belongs to."""

    trace_id: str
    span_id: str | None = None
    sampled: bool = False


_current: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("trace", default=None)


def trace_of(headers: Mapping[str, str]) -> Trace | None:
    """The trace ``headers`` carry (``traceparent`` first, then ``X-Cloud-Trace-Context``;
    header names in any case), or None."""
    lowered = {name.lower(): value for name, value in headers.items()}
    parent = _TRACEPARENT.match(lowered.get("traceparent", "").strip())
    if parent is not None:
        trace_id, span_id, flags = parent.groups()
        if trace_id != "0" * 32:
            return Trace(trace_id, span_id, bool(int(flags, 16) & 1))
    cloud = _CLOUD_TRACE.match(lowered.get("x-cloud-trace-context", "").strip())
    if cloud is not None:
        trace_id, span, sampled = cloud.groups()
        # X-Cloud-Trace-Context gives the span in decimal; Cloud Logging wants 16 hex digits.
        span_id = None if span is None else f"{int(span):016x}"
        return Trace(trace_id.lower(), span_id, sampled == "1")
    return None


@contextlib.contextmanager
def traced(trace: Trace | None) -> Iterator[None]:
    """Log with ``trace`` for the duration of the block (None: with none)."""
    token = _current.set(trace)
    try:
        yield
    finally:
        _current.reset(token)


class CloudLoggingFormatter(logging.Formatter):
    """A log record as one line of Cloud Logging's structured JSON (see the module
    docstring). ``project`` names the trace's project."""

    def __init__(self, project: str) -> None:
        super().__init__()
        self._project = project

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            # Error Reporting groups errors by the stack trace in the message.
            message = f"{message}\n{self.formatException(record.exc_info)}"
        entry: dict[str, Any] = {
            "severity": SEVERITIES.get(record.levelname, record.levelname),
            "message": message,
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "logger": record.name,
            SOURCE_FIELD: {
                "file": record.pathname,
                "line": str(record.lineno),
                "function": record.funcName,
            },
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            entry.update({str(k): v for k, v in fields.items() if v is not None})
        trace = _current.get()
        if trace is not None:
            entry[TRACE_FIELD] = f"projects/{self._project}/traces/{trace.trace_id}"
            if trace.span_id is not None:
                entry[SPAN_FIELD] = trace.span_id
            entry[SAMPLED_FIELD] = trace.sampled
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure(project: str, stream: IO[str] | None = None, level: int = logging.INFO) -> None:
    """Make every log record of this process one structured line on ``stream`` (stdout by
    default). Safe to call again: the handler is replaced, not added twice."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_opendws", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(CloudLoggingFormatter(project))
    handler._opendws = True  # type: ignore[attr-defined]  # marks ours, for a second call
    root.addHandler(handler)
    root.setLevel(level)
