"""The versioned message schemas of opendws's public contract."""

from opendws.schema.request import (
    SCHEMA_ID,
    Cancel,
    MessageError,
    Release,
    Submit,
    json_schema,
    parse_message,
    to_capacity_request,
)

__all__ = [
    "SCHEMA_ID",
    "Cancel",
    "MessageError",
    "Release",
    "Submit",
    "json_schema",
    "parse_message",
    "to_capacity_request",
]
