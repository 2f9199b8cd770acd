"""The official Firestore and Pub/Sub emulators: started as Java processes, reset, stopped
with nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from emulators import EmulatorError, Emulators, missing_reason, start
from emulators.official import ENVIRONMENT


def http(method: str, url: str, body: dict[str, object] | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_both_answer_and_the_environment_points_at_them(official_emulators: Emulators) -> None:
    environment = official_emulators.environment()
    assert environment == {
        "FIRESTORE_EMULATOR_HOST": official_emulators.firestore.host_port,
        "PUBSUB_EMULATOR_HOST": official_emulators.pubsub.host_port,
    }
    for name in ENVIRONMENT.values():
        assert os.environ[name] == environment[name]
    for emulator in (official_emulators.firestore, official_emulators.pubsub):
        status, body = http("GET", emulator.url + "/")
        assert (status, body.strip()) == (200, "Ok")


def test_reset_empties_firestore(official_emulators: Emulators, emulator_project: str) -> None:
    documents = (
        f"{official_emulators.firestore.url}/v1/projects/{emulator_project}"
        "/databases/(default)/documents"
    )
    status, _ = http(
        "POST", f"{documents}/things?documentId=one", {"fields": {"n": {"integerValue": "1"}}}
    )
    assert status == 200
    assert http("GET", f"{documents}/things/one")[0] == 200
    official_emulators.firestore.reset(emulator_project)
    assert http("GET", f"{documents}/things/one")[0] == 404


def test_reset_empties_pubsub(official_emulators: Emulators, emulator_project: str) -> None:
    base = f"{official_emulators.pubsub.url}/v1/projects/{emulator_project}"
    assert http("PUT", f"{base}/topics/capacity-requests")[0] == 200
    assert (
        http(
            "PUT",
            f"{base}/subscriptions/intake",
            {"topic": f"projects/{emulator_project}/topics/capacity-requests"},
        )[0]
        == 200
    )
    official_emulators.pubsub.reset(emulator_project)
    assert json.loads(http("GET", f"{base}/topics")[1] or "{}").get("topics", []) == []
    assert (
        json.loads(http("GET", f"{base}/subscriptions")[1] or "{}").get("subscriptions", []) == []
    )


def test_stop_leaves_no_java_process_behind(official_emulators: Emulators) -> None:
    del official_emulators  # only for the skip: this test starts its own instance
    emulator = start("firestore")
    group = emulator.process.pid
    emulator.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)
    emulator.stop()  # safe to repeat


def test_run_gives_a_command_the_emulator_hosts(official_emulators: Emulators) -> None:
    del official_emulators
    script = (
        "import os; print(os.environ['FIRESTORE_EMULATOR_HOST'], "
        "os.environ['PUBSUB_EMULATOR_HOST'])"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "emulators", "run", "--", sys.executable, "-c", script],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    firestore, pubsub = done.stdout.split()
    assert firestore.startswith("127.0.0.1:")
    assert pubsub.startswith("127.0.0.1:")


def test_a_missing_component_is_named(tmp_path: Path) -> None:
    (tmp_path / "platform").mkdir()
    reason = missing_reason(tmp_path)
    assert reason is not None
    assert "cloud-firestore-emulator" in reason or "java" in reason


def test_starting_without_the_component_says_why(tmp_path: Path) -> None:
    with pytest.raises(EmulatorError, match=r"not installed|java"):
        start("pubsub", root=tmp_path)


def test_a_port_taken_between_the_probe_and_the_bind_is_chosen_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A port found free can be taken before the emulator binds it: the emulator then exits
    with a BindException, and a port start chose is chosen again (the race failed a CI run)."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(f"official emulators unavailable: {reason}")
    import socket

    from emulators import official

    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind((official.HOST, 0))
    taken.listen()
    ports = iter([taken.getsockname()[1]])
    real = official.free_port
    monkeypatch.setattr(official, "free_port", lambda: next(ports, None) or real())
    try:
        emulator = start("firestore")
        try:
            assert emulator.port != taken.getsockname()[1]
        finally:
            emulator.stop()
    finally:
        taken.close()
