"""The metadata server emulator (emulators.metadata) over HTTP, as a VM's agent and google-auth
reach it: Google's protocol, the VM's keys, and identity tokens the agent function verifies.

Sources: compute/docs/metadata/querying-metadata (``/computeMetadata/v1/``, the required
``Metadata-Flavor: Google`` header, requests with ``X-Forwarded-For`` rejected, ``?recursive=
true`` directories as JSON); compute/docs/metadata/predefined-metadata-keys (``instance/name``,
``id``, ``zone`` as ``projects/NUMBER/zones/ZONE``, ``hostname``,
``network-interfaces/0/ip``, ``attributes/``, ``project/project-id``,
``numeric-project-id``); compute/docs/troubleshooting/troubleshoot-metadata-server (400
improper query parameters, 403, 404 no such endpoint); compute/docs/instances/
verifying-instance-identity (``instance/service-accounts/default/identity?audience=
AUD&format=full``, the token's claims); google-auth ``google/auth/compute_engine/_metadata.py``
(``ping`` GETs the root of ``GCE_METADATA_IP`` and trusts a 200 carrying ``Metadata-Flavor:
Google``; ``get`` joins ``http://$GCE_METADATA_HOST/computeMetadata/v1/`` and the path, and
reads ``application/json`` answers as JSON) and ``google/oauth2/id_token.py``
(``fetch_id_token``: the service account's ``?recursive=true`` directory, then its
``identity`` with ``format=full``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from google.auth import jwt

from emulators.metadata import ISSUER, Instance, MetadataServer
from emulators.signing import LocalSigner
from opendws.adapters.vm_identity import Unauthorized, VmIdentity, VmIdentityVerifier

AUDIENCE = "https://opendws-agent-123456789012.us-central1.run.app"
ADDRESS = "127.0.0.23"  # the VM's own loopback address, as the local cloud gives each VM
CREATED = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
INSTANCE = Instance(
    name="dws-0123456789abcdef-a1-1", instance_id="4340508760561261530", zone="us-central1-a",
    project_id="my-project", project_number=123456789012, internal_ip=ADDRESS,
    service_account="opendws-vm@my-project.iam.gserviceaccount.com", created_at=CREATED,
    attributes={"opendws-agent-url": AUDIENCE, "startup-script": "#!/bin/sh\n"},
)  # fmt: skip
FLAVOR = {"Metadata-Flavor": "Google"}


@pytest.fixture(scope="module")
def signer() -> LocalSigner:
    return LocalSigner(ISSUER, datetime.now(UTC))


@pytest.fixture(scope="module")
def server(signer: LocalSigner) -> Iterator[MetadataServer]:
    with MetadataServer(INSTANCE, signer, host=ADDRESS) as running:
        yield running


def get(
    server: MetadataServer, path: str, headers: dict[str, str] | None = None
) -> tuple[int, str, str, str]:
    """(status, Content-Type, Metadata-Flavor, body) of a GET of ``path`` under v1."""
    request = urllib.request.Request(server.url + path, headers=FLAVOR if headers is None
                                     else headers)  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return (answer.status, answer.headers["Content-Type"],
                    answer.headers["Metadata-Flavor"], answer.read().decode())  # fmt: skip
    except urllib.error.HTTPError as error:
        return (error.code, error.headers["Content-Type"], error.headers["Metadata-Flavor"],
                error.read().decode())  # fmt: skip


def test_the_server_listens_on_the_vms_own_address(server: MetadataServer) -> None:
    assert server.host_port.startswith(f"{ADDRESS}:")
    assert server.url == f"http://{server.host_port}/computeMetadata/v1/"


def test_a_request_without_metadata_flavor_google_is_forbidden(server: MetadataServer) -> None:
    status, _, flavor, body = get(server, "instance/name", headers={})
    assert (status, flavor) == (403, "Google")
    assert 'Missing required header "Metadata-Flavor": "Google"' in body
    status, _, _, body = get(server, "instance/name", headers={"Metadata-Flavor": "google"})
    assert status == 403
    assert "(got 'google')" in body
    status, _, _, _ = get(server, "instance/service-accounts/default/identity?audience=a",
                          headers={})  # fmt: skip
    assert status == 403


def test_a_request_with_x_forwarded_for_is_forbidden(server: MetadataServer) -> None:
    """querying-metadata: such requests are "automatically rejected" (no proxying of the
    server to another host)."""
    status, _, _, body = get(server, "instance/name", {**FLAVOR, "X-Forwarded-For": "1.2.3.4"})
    assert status == 403
    assert "X-Forwarded-For" in body


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("instance/name", INSTANCE.name),
        ("instance/id", "4340508760561261530"),
        ("instance/zone", "projects/123456789012/zones/us-central1-a"),
        ("instance/hostname", f"{INSTANCE.name}.us-central1-a.c.my-project.internal"),
        ("instance/network-interfaces/0/ip", ADDRESS),
        ("instance/attributes/opendws-agent-url", AUDIENCE),
        ("instance/service-accounts/default/email", INSTANCE.service_account),
        ("project/project-id", "my-project"),
        ("project/numeric-project-id", "123456789012"),
    ],
)
def test_the_vms_keys(server: MetadataServer, path: str, value: str) -> None:
    assert get(server, path) == (200, "application/text", "Google", value)


def test_a_missing_attribute_or_key_is_not_found(server: MetadataServer) -> None:
    assert get(server, "instance/attributes/no-such-key")[0] == 404
    assert get(server, "instance/no-such-key")[0] == 404
    assert get(server, "instance/name/")[0] == 404
    assert get(server, "instance/service-accounts/default/token")[0] == 404


def test_directories_list_their_entries_and_recursive_answers_json(server: MetadataServer) -> None:
    assert get(server, "instance/attributes/")[3] == "opendws-agent-url\nstartup-script\n"
    assert get(server, "instance/attributes")[3] == "opendws-agent-url\nstartup-script\n"
    status, kind, _, body = get(server, "instance/attributes/?recursive=true")
    assert (status, kind) == (200, "application/json")
    assert json.loads(body) == dict(INSTANCE.attributes)
    account = json.loads(get(server, "instance/service-accounts/default/?recursive=true")[3])
    assert account == {
        "aliases": ["default"], "email": INSTANCE.service_account,
        "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
    }  # fmt: skip
    instance = json.loads(get(server, "instance/?recursive=true")[3])
    assert instance["id"] == 4340508760561261530
    assert instance["networkInterfaces"] == [{"ip": ADDRESS}]
    assert instance["attributes"]["startup-script"] == "#!/bin/sh\n"
    project = json.loads(get(server, "project/?recursive=true")[3])
    assert project == {"numericProjectId": 123456789012, "projectId": "my-project"}


def test_an_identity_token_without_an_audience_is_a_bad_request(server: MetadataServer) -> None:
    for query in ("", "?format=full", "?audience=&format=full"):
        status, _, _, body = get(server, f"instance/service-accounts/default/identity{query}")
        assert status == 400
        assert "non-empty audience parameter required" in body
    status, _, _, body = get(server, "instance/service-accounts/default/identity?audience=a"
                             "&format=fancy")  # fmt: skip
    assert (status, body) == (400, "format=fancy: must be standard or full\n")


def test_a_full_identity_token_verifies_as_the_vm(
    server: MetadataServer, signer: LocalSigner
) -> None:
    path = f"instance/service-accounts/{INSTANCE.service_account}/identity?audience={AUDIENCE}"
    status, _, _, token = get(server, path + "&format=full")
    assert status == 200
    verifier = VmIdentityVerifier(audience=AUDIENCE, project_id="my-project", certs=signer.certs,
                                  issuers=frozenset({ISSUER}))  # fmt: skip
    assert verifier.verify(f"Bearer {token}") == VmIdentity(
        project_id="my-project", project_number=123456789012, zone="us-central1-a",
        instance_name=INSTANCE.name, instance_id="4340508760561261530",
        instance_creation_timestamp=int(CREATED.timestamp()), email=INSTANCE.service_account,
    )  # fmt: skip
    other = LocalSigner(ISSUER, datetime.now(UTC))
    with MetadataServer(INSTANCE, other, host=ADDRESS) as forger:
        forged = get(forger, path + "&format=full")[3]
    with pytest.raises(Unauthorized, match="invalid token"):
        verifier.verify(f"Bearer {forged}")


def test_google_auth_fetches_an_id_token_from_the_emulator(server: MetadataServer) -> None:
    """google-auth's own ``fetch_id_token``, with ``GCE_METADATA_HOST`` and
    ``GCE_METADATA_IP`` set to the emulator (read when google-auth is imported: a process of
    its own), finds the metadata server, reads the service account and gets its token."""
    script = (
        "import google.auth.transport.requests, google.oauth2.id_token, sys\n"
        "request = google.auth.transport.requests.Request()\n"
        "print(google.oauth2.id_token.fetch_id_token(request, sys.argv[1]))\n"
    )
    environment = {
        name: value for name, value in os.environ.items()
        if name not in ("GOOGLE_APPLICATION_CREDENTIALS", "GCE_METADATA_ROOT")
    }  # fmt: skip
    environment.update({"GCE_METADATA_HOST": server.host_port,
                        "GCE_METADATA_IP": server.host_port})  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script, AUDIENCE], env=environment,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    claims = jwt.decode(done.stdout.strip(), certs=server.signer.certs, audience=AUDIENCE)
    assert claims["iss"] == ISSUER
    assert claims["email"] == INSTANCE.service_account
    assert claims["google"]["compute_engine"]["instance_id"] == "4340508760561261530"


def test_what_is_not_emulated_is_refused_by_name(server: MetadataServer) -> None:
    """``alt=`` is not emulated: a 400 naming it, never an answer of another shape."""
    status, _, _, body = get(server, "instance/attributes/?recursive=true&alt=text")
    assert (status, body) == (400, "alt=text: not emulated (plain or recursive=true)\n")


def test_licenses_add_the_images_licenses_to_a_full_token(
    server: MetadataServer, signer: LocalSigner
) -> None:
    """``licenses=TRUE`` with ``format=full`` adds ``license_id``: none for a local VM."""
    path = f"instance/service-accounts/default/identity?audience={AUDIENCE}&format=full"
    plain = jwt.decode(get(server, path)[3], certs=signer.certs, audience=AUDIENCE)
    licensed = jwt.decode(get(server, path + "&licenses=TRUE")[3], certs=signer.certs,
                          audience=AUDIENCE)  # fmt: skip
    assert "license_id" not in plain["google"]["compute_engine"]
    assert licensed["google"]["compute_engine"]["license_id"] == []
    assert get(server, path + "&licenses=maybe")[0] == 400
