"""``dws up`` end to end: the whole system starts on this machine, a request submitted with
the CLI reaches ACTIVE (admission nudged by intake, not waiting for the tick), is released with
the CLI and shows in ``dws usage`` and in the metrics the api serves (``/metrics``, scraped
as Prometheus does); Ctrl-C, SIGTERM and SIGHUP stop everything with nothing
left listening and no file left behind."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulators import missing_reason
from emulators.stack import FUNCTIONS

DWS = [sys.executable, "-m", "opendws.cli"]
ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "hooks"
CI_CONFIG = ROOT / "tests" / "data" / "local-config-with-ci.yaml"


def start_up(
    scratch: Path | None = None, *, interrupt_ignored: bool = False,
    path: Path | None = None,
) -> tuple[subprocess.Popen[str], dict[str, str]]:  # fmt: skip
    """``dws up`` in a session of its own, once it says it is up: the process, and the
    variables and function URLs it printed. ``scratch``: its temporary folder (TMPDIR), so that
    what it leaves there is its own, whatever else runs on the machine. ``interrupt_ignored``:
    started with SIGINT ignored, as a non-interactive shell starts ``dws up &``. ``path``: a
    folder put first on its PATH (and so its VMs', whose jobs find their commands there)."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(f"official emulators unavailable: {reason}")
    # An ignored signal stays ignored across exec: the shell's `trap '' INT` hands it on.
    ignoring = ["sh", "-c", 'trap \'\' INT; exec "$0" "$@"'] if interrupt_ignored else []
    # Compute operations of 1 s: not instant (every call still finds them running), shorter
    # than the default 3 s so that the flows of these tests, one after another, stay quick.
    process = subprocess.Popen(
        [*ignoring, *DWS, "up", "--tick", "30", "--operation-latency", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={
            **os.environ,
            **({} if scratch is None else {"TMPDIR": str(scratch)}),
            **({} if path is None else {"PATH": f"{path}{os.pathsep}{os.environ['PATH']}"}),
        },
    )  # fmt: skip
    assert process.stdout is not None
    environment: dict[str, str] = {}
    printed: list[str] = []
    deadline = time.monotonic() + 120
    for line in process.stdout:
        printed.append(line)
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").strip().partition("=")
            environment[name] = value
        if " function: http" in line:
            name, _, url = line.strip().partition(" function: ")
            environment[f"url:{name}"] = url
        if line.startswith("function logs: "):
            environment["logs"] = line.removeprefix("function logs: ").split()[0]
        if "Ctrl-C stops everything" in line or time.monotonic() > deadline:
            break
    if "OPENDWS_COMPUTE_ENDPOINT" not in environment:
        # Stopped here, so that a stack half up leaves nothing running for the next test.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            code: int | str = process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            code = "killed: still running 60 s after SIGTERM"
        pytest.fail(f"dws up did not come up (exit {code}); it printed:\n{''.join(printed)}")
    return process, environment


def listening(environment: dict[str, str]) -> list[str]:
    """What of the stack still accepts connections: emulators and function servers."""
    addresses = {
        name: environment[name]
        for name in ("FIRESTORE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST",
                     "CLOUD_TASKS_EMULATOR_HOST")
    }  # fmt: skip
    for key, url in environment.items():
        if key.startswith("url:"):
            addresses[key] = url.removeprefix("http://").strip("/")
    still = []
    for name, address in addresses.items():
        host, _, port = address.partition(":")
        with socket.socket() as probe:
            if probe.connect_ex((host, int(port))) == 0:
                still.append(name)
    return still


@pytest.fixture
def stack() -> Iterator[dict[str, str]]:
    process, environment = start_up()
    try:
        yield environment
    finally:
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C
        assert process.wait(60) == 0
        assert listening(environment) == []


@pytest.mark.parametrize(
    ("stop", "interrupt_ignored"),
    [(signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGINT, True)],
    ids=["SIGTERM", "SIGHUP", "SIGINT-started-ignored"],
)
def test_a_signal_to_dws_up_alone_stops_everything_and_leaves_no_file(
    stop: signal.Signals, interrupt_ignored: bool, tmp_path: Path
) -> None:
    """Sent to the dws process only (a service manager, a closed terminal, a script that
    started it in the background, where SIGINT comes ignored), not to its group: it stops
    both emulator JVMs and every function server itself, and its run's logs go with it: its
    temporary folder is empty again."""
    process, environment = start_up(tmp_path, interrupt_ignored=interrupt_ignored)
    assert list(tmp_path.glob("opendws-*"))  # the run's log folders, while it runs
    logs = sorted(Path("/").glob(environment["logs"].lstrip("/")))  # the printed pattern
    assert [log.name for log in logs] == sorted(f"{name}.log" for name, _ in FUNCTIONS)
    process.send_signal(stop)
    assert process.wait(60) == 0
    assert listening(environment) == []
    assert list(tmp_path.iterdir()) == []


def dws(environment: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    variables = {k: v for k, v in environment.items() if not k.startswith("url:")}
    return subprocess.run(
        [*DWS, *args], env={**os.environ, **variables}, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def test_a_request_runs_and_is_released_through_the_cli(
    stack: dict[str, str], tmp_path: Path
) -> None:
    request = tmp_path / "train.yaml"
    request.write_text(
        "request_id: e2e-train\ntenant: vision\nmode: flex_start\n"
        "gang: {vm_count: 2, machine_type: a3-highgpu-8g, accelerator: nvidia-h100-80gb,"
        " accelerators_per_vm: 8}\n"
        "locations: [us-central1-a]\nrun_duration: 1h\nmax_wait: 1h\n"
    )
    submitted = time.monotonic()
    assert dws(stack, "submit", str(request)).returncode == 0
    waited = dws(stack, "wait", "e2e-train", "--timeout", "25")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    # ACTIVE within the provisioning latency (5 s) plus the nudged passes: well before the
    # 30 s tick, so nudges, not ticks, moved it along.
    assert time.monotonic() - submitted < 25
    assert dws(stack, "release", "e2e-train", "--tenant", "vision").returncode == 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        status = json.loads(dws(stack, "status", "e2e-train", "--json").stdout)
        if status["state"] == "RELEASED":
            break
        time.sleep(0.5)
    assert status["state"] == "RELEASED"
    usage = json.loads(dws(stack, "usage", "--json").stdout)
    assert [(u["tenant"], u["outcomes"]) for u in usage] == [("vision", {"RELEASED": 1})]
    used = usage[0]["used_hours"]
    # The api serves every function's metrics: the reconciler's admission and the intake's
    # release (it ends the run), each exported when its invocation ended.
    wanted = {
        ("opendws_admitted_requests_total", (("pool", "us-central1-a/a3-highgpu-8g"),
                                             ("tenant", "vision"))): 1.0,
        ("opendws_finished_requests_total", (("state", "RELEASED"), ("tenant", "vision"))): 1.0,
        ("opendws_accelerator_hours_total", (("accelerator", "nvidia-h100-80gb"),
                                             ("tenant", "vision"))): used,
    }  # fmt: skip
    deadline = time.monotonic() + 90  # an export at most a minute after the last change
    while True:
        samples = scrape(stack, "local-admin-key")
        found = {key: samples.get(key) for key in wanted}
        if all(found[key] == pytest.approx(value) for key, value in wanted.items()):
            break
        assert time.monotonic() < deadline, f"metrics never showed {wanted}: {found}"
        time.sleep(2)
    admitted_in = (("pool", "us-central1-a/a3-highgpu-8g"), ("tenant", "vision"))
    assert samples[("opendws_admission_wait_time_seconds_count", admitted_in)] == 1
    # Every function's structured log is in the printed folder while the stack runs: the
    # request's story is its lines (jsonPayload.request_id in Cloud Logging).
    story = [
        record
        for log in Path("/").glob(stack["logs"].lstrip("/"))
        for line in log.read_text().splitlines()
        if line.startswith("{") and (record := json.loads(line)).get("request_id") == "e2e-train"
    ]
    assert any("PENDING → PROVISIONING" in record["message"] for record in story), story
    assert any(record.get("call") == "provision" for record in story), story
    assert scrape_status(stack, "local-vision-key") == 403  # a tenant's key: not its business
    assert scrape_status(stack, None) == 401
    bad = dws(stack, "submit", "--tenant", "vision", "--vm-count", "0", "--run", "1h")
    assert bad.returncode == 2
    assert "vm_count" in bad.stderr


def test_the_demo_drives_every_path_and_summarises_it() -> None:
    if missing_reason() is not None:
        pytest.skip(f"official emulators unavailable: {missing_reason()}")
    result = subprocess.run(
        [*DWS, "demo", "--json"], capture_output=True, text=True, timeout=300, check=False,
        start_new_session=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    outcomes = {o["request_id"]: o for o in json.loads(result.stdout.strip().splitlines()[-1])}
    assert {name: o["state"] for name, o in outcomes.items()} == {
        "train": "ACTIVE", "nightly": "RELEASED", "slice": "ACTIVE", "block": "BOOKED",
        "later": "CANCELLED", "oops": "CANCELLED", "queued": "ACTIVE", "job": "RELEASED",
    }  # fmt: skip
    # Its agents ran the command on both VMs and the run ended by itself (DESIGN.md, "Work on
    # the gang").
    assert outcomes["job"]["reasons"].endswith("→ READY → JOB_SUCCEEDED")
    # Booked only once Google approved it (compute/docs/instances/future-reservations-
    # calendar-mode-overview); its cancel was refused (it starts within 4 days: billed in
    # full, delete-future-reservations-calendar-mode), so it stays booked. The one 40 days
    # ahead was cancelled at Google.
    assert outcomes["block"]["reasons"] == "- → AWAITING_APPROVAL → APPROVED"
    assert outcomes["later"]["reasons"] == "- → AWAITING_APPROVAL → APPROVED → CANCELLED"
    # Waited at Google in us-central1-a (never cancelled for it), raced into -b, won there.
    train = outcomes["train"]
    assert (train["attempts"], train["pool"]) == (2, "us-central1-b/a3-highgpu-8g")
    assert train["reasons"] == "- → ADMITTED → WAITING_FOR_CAPACITY → RACING → READY"
    # Waited in Google's queue until capacity freed, then served in its only zone.
    queued = outcomes["queued"]
    assert (queued["attempts"], queued["pool"]) == (1, "us-central1-a/a2-ultragpu-8g")
    assert queued["reasons"] == "- → ADMITTED → WAITING_FOR_CAPACITY → READY"


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, body, {**headers, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def scrape(stack: dict[str, str], key: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET /metrics as Prometheus parses it: (sample name, sorted labels) → value."""
    from prometheus_client.parser import text_string_to_metric_families

    request = urllib.request.Request(
        stack["url:api"].rstrip("/") + "/metrics", headers={"Authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape_status(stack: dict[str, str], key: str | None) -> int:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    request = urllib.request.Request(stack["url:api"].rstrip("/") + "/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def api_get(stack: dict[str, str], path: str) -> object:
    request = urllib.request.Request(
        stack["url:api"].rstrip("/") + path, headers={"Authorization": "Bearer local-admin-key"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_a_github_hook_round_trip_shows_on_the_api(stack: dict[str, str]) -> None:
    from emulators.stack import LOCAL_HOOK_SECRET

    dws(stack, "config", "apply", str(CI_CONFIG))
    queued = (DATA / "github_workflow_job_queued.json").read_bytes()
    completed = (DATA / "github_workflow_job_completed.json").read_bytes()

    def github(body: bytes, secret: str = LOCAL_HOOK_SECRET) -> dict[str, str]:
        digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        return {"X-GitHub-Event": "workflow_job", "X-Hub-Signature-256": f"sha256={digest}"}

    assert post(stack["url:ci_hook"], queued, github(queued, "forged"))[0] == 401
    status, answer = post(stack["url:ci_hook"], queued, github(queued))
    assert status == 202, answer
    request_id = str(answer["request_id"])
    assert post(stack["url:ci_hook"], queued, github(queued))[0] == 202  # redelivered
    assert dws(stack, "wait", request_id, "--timeout", "40").returncode == 0
    shown = api_get(stack, f"/requests/{request_id}")
    assert isinstance(shown, dict)
    assert (shown["tenant"], shown["state"]) == ("ci", "ACTIVE")
    assert [e["state"] for e in shown["events"]] == ["PENDING", "PROVISIONING", "ACTIVE"]
    timeline = api_get(stack, "/timeline")
    assert isinstance(timeline, dict)
    assert any(s["request_id"] == request_id for spans in timeline["pools"].values()
               for s in spans)  # fmt: skip
    assert post(stack["url:ci_hook"], completed, github(completed))[0] == 202
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        shown = api_get(stack, f"/requests/{request_id}")
        if isinstance(shown, dict) and shown["state"] == "RELEASED":
            break
        time.sleep(0.5)
    assert isinstance(shown, dict)
    assert shown["state"] == "RELEASED"
