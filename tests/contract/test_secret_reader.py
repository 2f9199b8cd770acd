"""The SecretReader contract (opendws.ports.runs), run on the in-memory reader and on Google's
Secret Manager client over REST against the local stand-in (emulators.secrets): the same
assertions, so the two cannot drift.

Sources: secret-manager/docs/reference/rest/v1/projects.secrets.versions/access (``GET
/v1/{name=projects/*/secrets/*/versions/*}:access``; "projects/*/secrets/*/versions/latest is
an alias to the most recently created SecretVersion"; the response ``{"name", "payload"}``);
SecretPayload (``data`` base64, "no larger than 64KiB"; ``dataCrc32c``);
secret-manager/docs/access-secret-version (the samples verify the payload's CRC32C); the
refusals as gcloud reports them: "NOT_FOUND: Secret [projects/NUMBER/secrets/X] not found or
has no versions.", "FAILED_PRECONDITION: Secret Version [projects/NUMBER/secrets/X/versions/3]
is in DISABLED state." (and DESTROYED: google-github-actions/get-secretmanager-secrets#268,
where ``latest`` names a destroyed version and the access is refused).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from emulators.secrets import SecretManagerEmulator
from opendws.adapters.secrets import (
    MemorySecretReader,
    SecretManagerReader,
    SecretVersions,
    crc32c,
)
from opendws.ports.runs import SecretReader, UnknownSecret

PROJECT, NUMBER = "my-proj", 123456789012


@dataclass
class Secrets:
    reader: SecretReader
    versions: SecretVersions  # where versions are added and disabled


@pytest.fixture(params=["memory", "secret-manager"])
def secrets(request: pytest.FixtureRequest) -> Iterator[Secrets]:
    if request.param == "memory":
        versions = SecretVersions(PROJECT, NUMBER)
        yield Secrets(MemorySecretReader(versions), versions)
        return
    with SecretManagerEmulator(PROJECT, NUMBER) as emulator:
        yield Secrets(SecretManagerReader.on(emulator.url), emulator.versions)


def name(secret: str, version: str) -> str:
    return f"projects/{PROJECT}/secrets/{secret}/versions/{version}"


def test_a_version_reads_as_its_text_and_latest_is_the_most_recently_added(
    secrets: Secrets,
) -> None:
    assert secrets.versions.add_version("hf-token", "first", create=True).endswith("/versions/1")
    secrets.versions.add_version("hf-token", "zweite ✓\nline")
    assert secrets.reader.read(name("hf-token", "1")) == "first"
    assert secrets.reader.read(name("hf-token", "2")) == "zweite ✓\nline"
    assert secrets.reader.read(name("hf-token", "latest")) == "zweite ✓\nline"
    assert secrets.reader.read(f"projects/{NUMBER}/secrets/hf-token/versions/1") == "first"


@pytest.mark.parametrize(
    ("secret", "version", "message"),
    [
        ("missing", "latest", f"Secret [projects/{NUMBER}/secrets/missing] not found or has no "
                              "versions."),
        ("empty", "latest", f"Secret [projects/{NUMBER}/secrets/empty] not found or has no "
                            "versions."),
        ("hf-token", "7", "not found"),
    ],
)  # fmt: skip
def test_a_missing_secret_or_version_is_unknown(
    secrets: Secrets, secret: str, version: str, message: str
) -> None:
    secrets.versions.add_version("hf-token", "v1", create=True)
    secrets.versions.create("empty")
    with pytest.raises(UnknownSecret, match=message.replace("[", r"\[").replace("]", r"\]")):
        secrets.reader.read(name(secret, version))


@pytest.mark.parametrize("state", ["DISABLED", "DESTROYED"])
def test_a_version_that_is_not_enabled_is_refused_even_as_latest(
    secrets: Secrets, state: str
) -> None:
    secrets.versions.add_version("hf-token", "v1", create=True)
    secrets.versions.add_version("hf-token", "v2")
    secrets.versions.set_state(name("hf-token", "2"), state)
    expected = rf"Secret Version \[projects/{NUMBER}/secrets/hf-token/versions/2\] is in {state}"
    with pytest.raises(UnknownSecret, match=expected):
        secrets.reader.read(name("hf-token", "latest"))
    assert secrets.reader.read(name("hf-token", "1")) == "v1"


def test_another_projects_secret_is_refused(secrets: Secrets) -> None:
    secrets.versions.add_version("hf-token", "v1", create=True)
    with pytest.raises(UnknownSecret, match=r"Permission 'secretmanager\.versions\.access' denied"):
        secrets.reader.read("projects/other-proj/secrets/hf-token/versions/1")


def test_what_is_no_version_name_or_no_text_is_refused_by_name(secrets: Secrets) -> None:
    with pytest.raises(ValueError, match="not a Secret Manager version name"):
        secrets.reader.read(f"projects/{PROJECT}/secrets/hf-token")
    secrets.versions.add_version("key", b"\xff\xfe", create=True)
    with pytest.raises(ValueError, match="not UTF-8 text"):
        secrets.reader.read(name("key", "1"))


def test_crc32c_is_castagnolis() -> None:
    """RFC 3720 appendix B.4 and the common check value of CRC-32C."""
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA
    assert crc32c(b"\xff" * 32) == 0x62A8AB43


def test_the_stand_in_answers_as_googles_rest_api() -> None:
    """The access answer's shape (payload base64 with its CRC32C as a decimal string, the
    name with the project's number and the version ``latest`` resolved), Google's error
    shape, create and addVersion (a payload over 64 KiB, or whose checksum does not match, is
    refused)."""
    with SecretManagerEmulator(PROJECT, NUMBER) as emulator:

        def call(method: str, path: str, body: object = None) -> tuple[int, Any]:
            data = None if body is None else json.dumps(body).encode()
            request = urllib.request.Request(emulator.url + path, data=data, method=method)
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    return answer.status, json.loads(answer.read())
            except urllib.error.HTTPError as error:
                return error.code, json.loads(error.read())

        assert call("POST", f"/v1/projects/{PROJECT}/secrets?secretId=db", {}) == (
            200, {"name": f"projects/{NUMBER}/secrets/db", "replication": {"automatic": {}}},
        )  # fmt: skip
        status, error = call("POST", f"/v1/projects/{PROJECT}/secrets?secretId=db", {})
        assert (status, error["error"]) == (409, {
            "code": 409, "status": "ALREADY_EXISTS",
            "message": f"Secret [projects/{NUMBER}/secrets/db] already exists.",
        })  # fmt: skip
        payload = {"data": base64.b64encode(b"pw").decode(), "dataCrc32c": str(crc32c(b"pw"))}
        added = call("POST", f"/v1/projects/{PROJECT}/secrets/db:addVersion", {"payload": payload})
        assert added == (
            200, {"name": f"projects/{NUMBER}/secrets/db/versions/1", "state": "ENABLED"},
        )  # fmt: skip
        wrong = {**payload, "dataCrc32c": "1"}
        status, _ = call("POST", f"/v1/projects/{PROJECT}/secrets/db:addVersion",
                         {"payload": wrong})  # fmt: skip
        assert status == 400
        huge = {"data": base64.b64encode(bytes(64 * 1024 + 1)).decode()}
        status, error = call("POST", f"/v1/projects/{PROJECT}/secrets/db:addVersion",
                             {"payload": huge})  # fmt: skip
        assert status == 400
        assert "no larger than 65536" in str(error)
        assert call("GET", f"/v1/projects/{PROJECT}/secrets/db/versions/latest:access") == (
            200, {"name": f"projects/{NUMBER}/secrets/db/versions/1",
                  "payload": {"data": "cHc=", "dataCrc32c": str(crc32c(b"pw"))}},
        )  # fmt: skip
        status, error = call("GET", f"/v1/projects/{PROJECT}/secrets/nope/versions/1:access")
        assert (status, error["error"]["status"]) == (404, "NOT_FOUND")


def test_a_corrupted_payload_is_not_handed_on() -> None:
    """Google's samples check ``dataCrc32c`` against the data ("Data corruption detected")."""

    class Corrupting:
        def access_secret_version(self, request: dict[str, str]) -> object:
            from google.cloud.secretmanager_v1.types import (
                AccessSecretVersionResponse,
                SecretPayload,
            )

            payload = SecretPayload(data=b"pw", data_crc32c=crc32c(b"pv"))
            return AccessSecretVersionResponse(name=request["name"], payload=payload)

    reader = SecretManagerReader(Corrupting())  # type: ignore[arg-type]
    with pytest.raises(OSError, match="corrupted"):
        reader.read(name("db", "1"))
