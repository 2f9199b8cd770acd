"""The local Cloud Run front (emulators.cloud_run) over real HTTP, before a server that records
what reaches it: what Cloud Run does with a request before a function's code sees it.

Sources: run/docs/securing/ingress (an internal-only service takes requests from Cloud Tasks
and the other Google products of its project, and from its VPC networks; the internet cannot
reach it); run/docs/securing/managing-access and run/docs/authenticating/service-to-service
(a service that requires authentication takes a Google-signed ID token of a principal holding
roles/run.invoker; a public one, allUsers, takes everything); run/docs/configuring/
custom-audiences (the audience is the service's run.app URL) and functions/docs/samples/
functions-bearer-token (a function's cloudfunctions.net URL is its audience);
run/docs/troubleshooting#signature-removed and einride/iam-go ``iamgoogle/signature.go`` (the
checked token is handed on with its signature replaced by ``SIGNATURE_REMOVED_BY_GOOGLE``);
run/docs/troubleshooting (401 without credentials, 403 for a caller that may not invoke, 404
for a request the ingress setting blocks)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from emulators.cloud_run import (
    REMOVED_SIGNATURE,
    CloudRunFront,
    Ingress,
    Service,
    function_url,
    run_app_url,
)
from emulators.cloud_tasks import ISSUER
from emulators.cloud_tasks.signer import TokenSigner
from opendws.adapters.oidc import invocation_token

INVOKER = "opendws-tasks@p.iam.gserviceaccount.com"
RUN_APP = run_app_url("opendws-timer", "123456789012", "us-central1")
FUNCTION = function_url("opendws-timer", "p", "us-central1")
TIMER = Service("opendws-timer", Ingress.INTERNAL, frozenset({INVOKER}),
                frozenset({RUN_APP, FUNCTION}))  # fmt: skip


class Recorder(BaseHTTPRequestHandler):
    """The function behind the front: records each request, answers 200 with JSON."""

    seen: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append({"path": self.path, "headers": dict(self.headers), "body": body})
        answer = json.dumps({"outcome": "done"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def function() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []
    handler = type("Handler", (Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/", seen
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture(scope="module")
def signer() -> TokenSigner:
    """The Cloud Tasks emulator's token issuer."""
    return TokenSigner(datetime.now(UTC))


@pytest.fixture
def timer(
    function: tuple[str, list[dict[str, Any]]], signer: TokenSigner
) -> Iterator[CloudRunFront]:
    certs = {signer.kid: signer.certificate}
    with CloudRunFront(function[0], TIMER, certs=certs, issuers=frozenset({ISSUER})) as front:
        yield front


def post(url: str, token: str | None, path: str = "?kind=release") -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url + path, b'{"timer": 1}', headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.mark.parametrize("audience", [RUN_APP, FUNCTION])
def test_the_invoker_is_let_in_with_either_audience_and_its_signature_removed(
    timer: CloudRunFront, function: tuple[str, list[dict[str, Any]]], signer: TokenSigner,
    audience: str,
) -> None:  # fmt: skip
    """Both audiences Google accepts for a function's service pass Cloud Run's check; the
    function gets the token with its header and claims intact and its signature replaced."""
    token = signer.token(INVOKER, audience, datetime.now(UTC))
    status, body = post(timer.internal_url, token)
    assert (status, json.loads(body)) == (200, {"outcome": "done"})
    [seen] = function[1]
    header, claims, signature = token.split(".")
    assert seen["headers"]["Authorization"] == f"Bearer {header}.{claims}.{REMOVED_SIGNATURE}"
    assert signature != REMOVED_SIGNATURE
    assert (seen["path"], seen["body"]) == ("/?kind=release", b'{"timer": 1}')


def test_a_caller_without_a_token_is_401_and_one_that_may_not_invoke_is_403(
    timer: CloudRunFront, function: tuple[str, list[dict[str, Any]]], signer: TokenSigner
) -> None:
    now = datetime.now(UTC)
    assert post(timer.internal_url, None)[0] == 401
    refused = {
        "not a JWT": "not-a-jwt",
        "another signer": TokenSigner(now).token(INVOKER, RUN_APP, now),
        "another caller": signer.token("someone@p.iam.gserviceaccount.com", RUN_APP, now),
        "another audience": signer.token(INVOKER, "https://other-123.us-central1.run.app", now),
        "expired": signer.token(INVOKER, RUN_APP, now - timedelta(hours=2)),
        "already stripped": signer.token(INVOKER, RUN_APP, now).rpartition(".")[0]
        + f".{REMOVED_SIGNATURE}",
    }
    answers = {why: post(timer.internal_url, token)[0] for why, token in refused.items()}
    assert answers == dict.fromkeys(refused, 403)
    assert function[1] == []  # nothing reached the function


def test_an_internal_only_service_is_not_found_from_outside(
    timer: CloudRunFront, function: tuple[str, list[dict[str, Any]]], signer: TokenSigner
) -> None:
    """Even the invoker's valid token does not pass an ingress that blocks the request."""
    token = signer.token(INVOKER, RUN_APP, datetime.now(UTC))
    status, body = post(timer.url, token)
    assert status == 404
    assert b"internal requests only" in body
    assert post(timer.url, None)[0] == 404
    assert function[1] == []
    assert post(timer.internal_url, token)[0] == 200


def test_a_public_service_passes_every_request_on_untouched(
    function: tuple[str, list[dict[str, Any]]], signer: TokenSigner
) -> None:
    """allUsers holds the invoker role (ci_hook, api): Cloud Run checks no token and leaves
    the Authorization header as it came, for the function to check."""
    token = signer.token(INVOKER, RUN_APP, datetime.now(UTC))
    with CloudRunFront(function[0], Service("opendws-api")) as front:
        assert post(front.url, token)[0] == 200
        assert post(front.url, None)[0] == 200
        assert post(front.url, "an-api-key")[0] == 200
    assert [seen["headers"].get("Authorization") for seen in function[1]] == [
        f"Bearer {token}", None, "Bearer an-api-key",
    ]  # fmt: skip


def test_a_service_that_requires_authentication_names_its_audiences() -> None:
    with pytest.raises(ValueError, match="needs its audiences"):
        Service("opendws-timer", Ingress.INTERNAL, frozenset({INVOKER}))


def test_x_serverless_authorization_is_the_header_checked_when_given(
    timer: CloudRunFront, function: tuple[str, list[dict[str, Any]]], signer: TokenSigner
) -> None:
    """When a request carries X-Serverless-Authorization, Cloud Run checks that header (its
    signature replaced) and hands Authorization on as the caller sent it
    (GoogleCloudPlatform/cloud-run-proxy#25). The timer reads the header Cloud Run checked
    (oidc.invocation_token), so a stripped-looking Authorization beside it is never read."""
    token = signer.token(INVOKER, RUN_APP, datetime.now(UTC))
    forged = "Bearer e30.eyJlbWFpbCI6ImV2ZUBldmlsLmNvbSJ9." + REMOVED_SIGNATURE
    request = urllib.request.Request(
        timer.internal_url + "?kind=release", b'{"timer": 1}',
        {"Content-Type": "application/json", "X-Serverless-Authorization": f"Bearer {token}",
         "Authorization": forged},
        method="POST",
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    [seen] = function[1]
    header, claims, _ = token.split(".")
    assert seen["headers"]["X-Serverless-Authorization"] == (
        f"Bearer {header}.{claims}.{REMOVED_SIGNATURE}"
    )
    assert seen["headers"]["Authorization"] == forged  # the caller's own, untouched
    assert invocation_token(seen["headers"]) == seen["headers"]["X-Serverless-Authorization"]
    # Without a valid X-Serverless-Authorization the forged Authorization is what is checked.
    function[1].clear()
    assert post(timer.internal_url, forged.removeprefix("Bearer "))[0] == 403
    assert function[1] == []
