"""Secret Manager: the values of a run's secrets, read by version name
(:class:`~opendws.ports.runs.SecretReader`).

:class:`SecretManagerReader` reads them with Google's client library
(``SecretManagerServiceClient.access_secret_version``): from Google with application default
credentials, or over REST from the local stand-in (:mod:`emulators.secrets`). It checks the
payload's ``dataCrc32c`` as Google's samples do ("verify payload checksum",
secret-manager/docs/access-secret-version) and gives the value as UTF-8 text (a value goes
into an environment variable).

:class:`SecretVersions` is Secret Manager's behaviour for one project, in memory — what the
stand-in serves and :class:`MemorySecretReader` reads — as Google documents it
(secret-manager/docs/reference/rest/v1/projects.secrets.versions):

- a secret's versions are numbered 1, 2, … in the order they are added; ``latest`` "is an
  alias to the most recently created SecretVersion" (whatever its state);
- a version is ``ENABLED`` when added; accessing one that is ``DISABLED`` or ``DESTROYED`` is
  refused (400 ``FAILED_PRECONDITION``: "Secret Version [NAME] is in DISABLED state.");
- a missing secret, or one without versions, is 404 ``NOT_FOUND`` ("Secret [NAME] not found or
  has no versions."), a missing version 404 too; names in answers carry the project's number;
- a payload holds at most 64 KiB ("Must be no larger than 64KiB", ``SecretPayload.data``);
- another project's secret is 403 ``PERMISSION_DENIED`` ("Permission
  'secretmanager.versions.access' denied on resource (or it may not exist).").
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from google.api_core import exceptions as google_errors

from opendws.ports.runs import SecretReader, UnknownSecret

if TYPE_CHECKING:
    from google.cloud import secretmanager

__all__ = [
    "MAX_PAYLOAD", "MemorySecretReader", "SecretManagerReader", "SecretReader",
    "SecretRefused", "SecretVersions", "UnknownSecret", "crc32c",
]  # fmt: skip

MAX_PAYLOAD = 64 * 1024
# projects/*/secrets/*/versions/* (secret ids: letters, digits, - and _, at most 255).
_VERSION_NAME = re.compile(
    r"projects/(?P<project>[^/]+)/secrets/(?P<secret>[A-Za-z0-9_-]{1,255})/versions/(?P<version>[^/]+)"
)
_SECRET_ID = re.compile(r"[A-Za-z0-9_-]{1,255}")


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        value = byte
        for _ in range(8):
            value = (value >> 1) ^ 0x82F63B78 if value & 1 else value >> 1
        table.append(value)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of Secret Manager's ``dataCrc32c``."""
    value = 0xFFFFFFFF
    for byte in data:
        value = _TABLE[(value ^ byte) & 0xFF] ^ (value >> 8)
    return value ^ 0xFFFFFFFF


def _parse(version: str) -> tuple[str, str, str]:
    """(project, secret, version) of a version name; ValueError naming the expected form."""
    match = _VERSION_NAME.fullmatch(version)
    if match is None:
        raise ValueError(
            f"{version!r} is not a Secret Manager version name "
            "(projects/PROJECT/secrets/SECRET/versions/VERSION)"
        )
    return match["project"], match["secret"], match["version"]


def _text(version: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(
            f"{version}: the value is not UTF-8 text (it goes into an environment variable)"
        ) from None


# ---------------------------------------------------------------------- Google's client


class SecretManagerReader:
    """Reads secret versions with Google's Secret Manager client."""

    def __init__(self, client: secretmanager.SecretManagerServiceClient) -> None:
        self._client = client

    @classmethod
    def on(cls, endpoint: str | None = None) -> SecretManagerReader:
        """A reader of Google's Secret Manager (application default credentials), or of the
        stand-in at ``endpoint`` (``http://host:port``, over REST, no credentials)."""
        from google.cloud import secretmanager

        if endpoint is None:
            return cls(secretmanager.SecretManagerServiceClient())
        from opendws.adapters.clients import anonymous_credentials

        return cls(
            secretmanager.SecretManagerServiceClient(
                credentials=anonymous_credentials(),
                transport="rest",
                client_options={"api_endpoint": endpoint},
            )
        )

    def read(self, version: str) -> str:
        _parse(version)
        try:
            response = self._client.access_secret_version(request={"name": version})
        except (google_errors.NotFound, google_errors.Forbidden, google_errors.BadRequest) as error:
            # Over REST the class is the HTTP status's: 404, 403 (PERMISSION_DENIED) and 400
            # (FAILED_PRECONDITION: not enabled); over gRPC their subclasses.
            raise UnknownSecret(f"{version}: {error.message}") from None
        payload = response.payload
        if "data_crc32c" in payload and payload.data_crc32c != crc32c(payload.data):
            raise OSError(f"{version}: the value arrived corrupted (its CRC32C does not match)")
        return _text(version, payload.data)


# ---------------------------------------------------------------------- in memory


class SecretRefused(UnknownSecret):
    """Secret Manager's refusal: HTTP ``code``, gRPC-style ``status`` and its message."""

    def __init__(self, code: int, status: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message


@dataclass
class _Version:
    number: int
    data: bytes
    created_at: datetime
    state: str = "ENABLED"


@dataclass
class _Secret:
    created_at: datetime
    versions: list[_Version] = field(default_factory=list)


class SecretVersions:
    """One project's secrets as Secret Manager keeps them (see the module docstring);
    thread-safe. Requests name the project by id or number; answers by number."""

    def __init__(self, project_id: str, project_number: int) -> None:
        self.project_id = project_id
        self.project_number = project_number
        self._secrets: dict[str, _Secret] = {}
        self._lock = threading.Lock()

    def secret_name(self, secret: str) -> str:
        return f"projects/{self.project_number}/secrets/{secret}"

    def create(self, secret: str) -> str:
        """Create the secret ``secret`` (no versions yet); its name."""
        if _SECRET_ID.fullmatch(secret) is None:
            raise SecretRefused(
                400, "INVALID_ARGUMENT",
                f"Secret id {secret!r}: letters, digits, '-' and '_', at most 255",
            )  # fmt: skip
        with self._lock:
            if secret in self._secrets:
                raise SecretRefused(
                    409, "ALREADY_EXISTS", f"Secret [{self.secret_name(secret)}] already exists."
                )
            self._secrets[secret] = _Secret(datetime.now(UTC))
        return self.secret_name(secret)

    def add_version(self, secret: str, data: bytes | str, *, create: bool = False) -> str:
        """Add a version holding ``data`` to ``secret`` (created first when ``create`` and
        missing); the new version's name."""
        raw = data.encode() if isinstance(data, str) else data
        if len(raw) > MAX_PAYLOAD:
            raise SecretRefused(
                400, "INVALID_ARGUMENT",
                f"Secret payload is {len(raw)} bytes: no larger than {MAX_PAYLOAD} (64KiB)",
            )  # fmt: skip
        with self._lock:
            if create and secret not in self._secrets and _SECRET_ID.fullmatch(secret):
                self._secrets[secret] = _Secret(datetime.now(UTC))
            held = self._secret(secret)
            version = _Version(len(held.versions) + 1, raw, datetime.now(UTC))
            held.versions.append(version)
        return f"{self.secret_name(secret)}/versions/{version.number}"

    def set_state(self, version: str, state: str) -> str:
        """Set a version ``ENABLED``, ``DISABLED`` or ``DESTROYED`` (a destroyed version's
        data is gone and it stays destroyed); its name."""
        if state not in ("ENABLED", "DISABLED", "DESTROYED"):
            raise ValueError(f"state {state!r}: ENABLED, DISABLED or DESTROYED")
        with self._lock:
            name, found = self._version(version)
            if found.state == "DESTROYED" and state != "DESTROYED":
                raise SecretRefused(
                    400, "FAILED_PRECONDITION", f"Secret Version [{name}] is in DESTROYED state."
                )
            found.state = state
            if state == "DESTROYED":
                found.data = b""
        return name

    def state(self, version: str) -> str:
        with self._lock:
            return self._version(version)[1].state

    def access(self, version: str) -> tuple[str, bytes]:
        """The resolved version name (``latest`` replaced by its number) and its data."""
        with self._lock:
            name, found = self._version(version)
            if found.state != "ENABLED":
                raise SecretRefused(
                    400,
                    "FAILED_PRECONDITION",
                    f"Secret Version [{name}] is in {found.state} state.",
                )
            return name, found.data

    def _secret(self, secret: str) -> _Secret:
        held = self._secrets.get(secret)
        if held is None:
            raise SecretRefused(
                404,
                "NOT_FOUND",
                f"Secret [{self.secret_name(secret)}] not found or has no versions.",
            )
        return held

    def _version(self, version: str) -> tuple[str, _Version]:
        try:
            project, secret, number = _parse(version)
        except ValueError as error:
            raise SecretRefused(400, "INVALID_ARGUMENT", str(error)) from None
        if project not in (self.project_id, str(self.project_number)):
            raise SecretRefused(
                403, "PERMISSION_DENIED",
                "Permission 'secretmanager.versions.access' denied on resource (or it may not "
                "exist).",
            )  # fmt: skip
        held = self._secret(secret)
        if not held.versions:
            raise SecretRefused(
                404,
                "NOT_FOUND",
                f"Secret [{self.secret_name(secret)}] not found or has no versions.",
            )
        if number == "latest":
            found = held.versions[-1]
        elif number.isdigit() and 1 <= int(number) <= len(held.versions):
            found = held.versions[int(number) - 1]
        else:
            raise SecretRefused(
                404, "NOT_FOUND",
                f"Secret Version [{self.secret_name(secret)}/versions/{number}] not found.",
            )  # fmt: skip
        return f"{self.secret_name(secret)}/versions/{found.number}", found


class MemorySecretReader:
    """A :class:`~opendws.ports.runs.SecretReader` over :class:`SecretVersions` in memory."""

    def __init__(self, versions: SecretVersions) -> None:
        self.versions = versions

    def read(self, version: str) -> str:
        _parse(version)
        try:
            _, data = self.versions.access(version)
        except SecretRefused as refused:
            raise UnknownSecret(f"{version}: {refused.message}") from None
        return _text(version, data)
