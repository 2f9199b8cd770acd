"""The shapes of what opendws reads, as pydantic specs: the versioned request message of its
public contract (:mod:`~opendws.schema.request`, re-exported here), and the documents operators
write — the configuration (:mod:`~opendws.schema.config`) and what-if scenarios
(:mod:`~opendws.schema.scenario`), which share their pools, tenants and policy, and the field
types and error messages of :mod:`~opendws.schema.common`."""

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
