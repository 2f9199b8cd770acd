"""Reading request bodies and writing API values: the field, duration, timestamp and name forms
the Compute Engine and Cloud TPU REST APIs use. Pure functions; a value the real API would refuse
raises ``CloudError`` (HTTP 400) naming the field."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from opendws.sim.cloud.errors import CloudError

JSON = dict[str, Any]

COMPUTE_BASE = "https://www.googleapis.com/compute/v1"
_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


def get(body: object, camel: str) -> Any:
    """A field of a request object, by its camelCase or its snake_case name."""
    if not isinstance(body, dict):
        return None
    if camel in body:
        return body[camel]
    return body.get(re.sub(r"([A-Z])", r"_\1", camel).lower())


def has(body: object, camel: str) -> bool:
    """Whether a request object carries a field (camelCase or snake_case)."""
    return get(body, camel) is not None


def refuse_unknown(body: object, camel: str, where: str) -> None:
    """Refuse a field the message has no such name for, as Google's REST front end does: an
    unknown name in a JSON payload is a 400, never silently dropped."""
    if has(body, camel):
        raise CloudError.invalid(
            f"Invalid JSON payload received. Unknown name \"{camel}\" at '{where}': "
            "Cannot find field."
        )


def name(value: object, what: str) -> str:
    """An RFC 1035 resource name (1-63 characters)."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise CloudError.invalid(
            f"Invalid value for {what}: {value!r} (must match [a-z]([-a-z0-9]*[a-z0-9])?, "
            "at most 63 characters)"
        )
    return value


def nonempty(value: str, what: str) -> str:
    """A steering argument that must be a non-empty string (``ValueError`` otherwise)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, not {value!r}")
    return value


def integer(value: object, what: str) -> int:
    """An integer field; int64 fields arrive as strings of digits in JSON."""
    if isinstance(value, bool):
        raise CloudError.invalid(f"{what} must be an integer, not {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value):
        return int(value)
    raise CloudError.invalid(f"{what} must be an integer, not {value!r}")


def duration(value: object, what: str) -> timedelta:
    """A protobuf Duration: ``"3600s"`` (JSON form), ``{"seconds": ..., "nanos": ...}`` (Compute's
    Duration message) or a number of seconds."""
    if isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?s", value):
        return timedelta(seconds=float(value[:-1]))
    if isinstance(value, dict):
        seconds = integer(value.get("seconds", 0), f"{what}.seconds")
        nanos = integer(value.get("nanos", 0), f"{what}.nanos")
        return timedelta(seconds=seconds, microseconds=nanos // 1000)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    raise CloudError.invalid(f"{what} must be a duration, not {value!r}")


def bounded_duration(value: object, what: str, low: timedelta, high: timedelta) -> timedelta:
    """A duration that must lie in ``[low, high]`` (a 400 naming the bounds otherwise)."""
    span = duration(value, what)
    if not low <= span <= high:
        raise CloudError.invalid(
            f"Invalid value for field '{what}': {span.total_seconds():g}s. It must be between "
            f"{low.total_seconds():g}s and {high.total_seconds():g}s"
        )
    return span


def timestamp(value: object, what: str) -> datetime:
    """An RFC 3339 time with an offset, in UTC."""
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if moment.tzinfo is not None:
                return moment.astimezone(UTC)
    raise CloudError.invalid(f"{what} must be an RFC 3339 time with an offset, not {value!r}")


def utc(moment: datetime) -> datetime:
    """A simulated time: timezone-aware, in UTC (``ValueError`` for a naive one)."""
    if moment.tzinfo is None:
        raise ValueError(f"a simulated time must be timezone-aware, not {moment!r}")
    return moment.astimezone(UTC)


def stamp(moment: datetime) -> str:
    """Compute's creationTimestamp form: RFC 3339 with milliseconds and an offset."""
    return moment.isoformat(timespec="milliseconds")


def rfc3339(moment: datetime) -> str:
    """A protobuf Timestamp in JSON: RFC 3339 in UTC with a ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def last(reference: str) -> str:
    """The name at the end of a resource URL or partial path."""
    return reference.rstrip("/").rsplit("/", 1)[-1]


def scope_path(scope: str) -> str:
    """``global`` or ``zones/{zone}``: where a Compute resource or operation lives."""
    return "global" if scope == "global" else f"zones/{scope}"


def scope_url(project: str, scope: str) -> str:
    """The Compute URL of a project's global or zonal scope."""
    return f"{COMPUTE_BASE}/projects/{project}/{scope_path(scope)}"


def zonal_path(project: str, zone: str, collection: str, item: str) -> str:
    """``projects/P/zones/Z/COLLECTION/NAME``: how Compute names a zonal resource in errors."""
    return f"projects/{project}/zones/{zone}/{collection}/{item}"


# A disk type as ``instances.insert`` takes it: a full or partial URL ending in
# ``zones/ZONE/diskTypes/TYPE`` (CP ``AttachedDiskInitializeParams.disk_type``).
_DISK_TYPE_URL = re.compile(
    r"(?:https://(?:www|compute)\.googleapis\.com/compute/(?:v1|beta)/)?"
    r"(?:projects/(?P<project>[^/]+)/)?zones/(?P<zone>[^/]+)/diskTypes/(?P<type>[-a-z0-9]+)"
)


def instance_disk_types(disks: object, project: str, zone: str) -> None:
    """Refuse, as ``instances.insert`` does, a boot or data disk whose
    ``initializeParams.diskType`` is not a URL of a disk type in the VM's own zone. CP
    ``AttachedDiskInitializeParams.disk_type``: "When creating a single instance, you must
    provide either the full or partial URL of the disk type"; a bare name (``pd-balanced``) is
    answered "The URL is malformed" (terraform-provider-google #275, #322, #3713), though an
    instance template takes exactly that (:func:`template_disk_types`)."""
    for index, disk in enumerate(disks if isinstance(disks, list) else []):
        value = get(get(disk, "initializeParams") or {}, "diskType")
        if value is None:
            continue
        field = f"resource.disks[{index}].initializeParams.diskType"
        match = _DISK_TYPE_URL.fullmatch(str(value))
        if match is None:
            raise CloudError.invalid(
                f"Invalid value for field '{field}': {value!r}. The URL is malformed."
            )
        if match["project"] not in (None, project) or match["zone"] != zone:
            raise CloudError.invalid(
                f"Invalid value for field '{field}': {value!r}. The disk type must be in the "
                f"instance's zone {zone} of project {project}."
            )


def template_disk_types(disks: object) -> None:
    """Refuse, as ``instanceTemplates.insert`` does, a disk type given as a URL. CP
    ``AttachedDiskInitializeParams.disk_type``: "When creating an instance template ... you
    specify the disk type without a URL, for example, hyperdisk-balanced";
    ansible-collections/google.cloud#516 shows Google's answer to a URL."""
    for index, disk in enumerate(disks if isinstance(disks, list) else []):
        value = get(get(disk, "initializeParams") or {}, "diskType")
        if value is not None and "/" in str(value):
            raise CloudError.invalid(
                f"Invalid value for field 'resource.properties.disks[{index}].initializeParams."
                f"diskType': {value!r}. DiskType {value!r} must be a valid resource name (not "
                "an url)."
            )


# Compute Engine's metadata limits (compute/docs/reference/rest/v1/Metadata): a key matches
# [a-zA-Z0-9-_]+ and is less than 128 bytes; a value is at most 262144 bytes (256 KiB); all
# keys and values together are less than 512 KB.
_METADATA_KEY = re.compile(r"[a-zA-Z0-9_-]+")
METADATA_KEY_LIMIT = 128
METADATA_VALUE_LIMIT = 256 * 1024
METADATA_TOTAL_LIMIT = 512 * 1024


def metadata_items(metadata: object, where: str) -> None:
    """Refuse, as Compute Engine does, metadata whose key is not of Google's form or whose
    value or whole is over Google's limits (see the constants above). ``where``: the field,
    ``resource.metadata`` or ``resource.properties.metadata``."""
    if metadata is None:
        return
    items = get(metadata, "items") if isinstance(metadata, dict) else metadata
    if items is None:
        return
    if not isinstance(items, list):
        raise CloudError.invalid(f"Invalid value for field '{where}.items': not a list")
    total = 0
    for index, item in enumerate(items):
        key, value = get(item, "key"), get(item, "value")
        field = f"{where}.items[{index}]"
        if not isinstance(key, str) or not _METADATA_KEY.fullmatch(key):
            raise CloudError.invalid(
                f"Invalid value for field '{field}.key': {key!r}. Keys must conform to the "
                "regexp [a-zA-Z0-9-_]+"
            )
        if len(key.encode()) >= METADATA_KEY_LIMIT:
            raise CloudError.invalid(
                f"Invalid value for field '{field}.key': keys must be less than "
                f"{METADATA_KEY_LIMIT} bytes"
            )
        if value is not None and not isinstance(value, str):
            raise CloudError.invalid(f"Invalid value for field '{field}.value': not a string")
        size = len((value or "").encode())
        if size > METADATA_VALUE_LIMIT:
            raise CloudError.invalid(
                f"Invalid value for field '{field}.value': {size} bytes; a metadata value is at "
                f"most {METADATA_VALUE_LIMIT} bytes (256 KiB)"
            )
        total += len(key.encode()) + size
    if total >= METADATA_TOTAL_LIMIT:
        raise CloudError.invalid(
            f"Invalid value for field '{where}': its keys and values total {total} bytes; they "
            f"must be less than {METADATA_TOTAL_LIMIT} bytes (512 KB)"
        )


def service_accounts(accounts: object, where: str) -> None:
    """Refuse what Compute Engine refuses in ``serviceAccounts``: "Only one service account per
    VM instance is supported" (compute/docs/reference/rest/v1/instances), each naming its
    email, with its scopes as a list of strings."""
    if accounts is None:
        return
    if not isinstance(accounts, list):
        raise CloudError.invalid(f"Invalid value for field '{where}': not a list")
    if len(accounts) > 1:
        raise CloudError.invalid(
            f"Invalid value for field '{where}': only one service account per VM instance is "
            "supported"
        )
    for index, account in enumerate(accounts):
        email = get(account, "email")
        if not isinstance(email, str) or not email:
            raise CloudError.invalid(f"Invalid value for field '{where}[{index}].email'")
        scopes = get(account, "scopes") or []
        if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
            raise CloudError.invalid(f"Invalid value for field '{where}[{index}].scopes'")
