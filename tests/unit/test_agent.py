"""The agent (``opendws.agent``) as a process of its own, against a fake agent function and a
fake metadata server (http.server on 127.0.0.1; ``GCE_METADATA_HOST`` points at it, as
google-auth reads it), with real jobs (``sys.executable -c ...``).

The protocol is the agent function's (register, barrier, heartbeat, logs, exit); the identity
token is asked of the metadata server as Google documents it:
``instance/service-accounts/default/identity?audience=AUDIENCE&format=full`` with
``Metadata-Flavor: Google`` (cloud.google.com/compute/docs/instances/verifying-instance-identity,
compute/docs/metadata/querying-metadata)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from opendws.agent import MINIMUM_PYTHON
from opendws.agent.run import REASK_S
from opendws.agent.startup import bundle
from tests import local_http
from tests.local_http import QuietHandler

SESSION = "session-7"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


@dataclass
class Call:
    path: str
    authorization: str
    body: dict[str, Any]
    at: float


@dataclass
class FakeFunction:
    """The agent function's side of the protocol (the brief of the agent function), with
    what the agent sent kept in ``calls``. It registers the VM whose identity token
    ``expected_token`` names, and ends the run (410) once an exit is reported."""

    expected_token: str = ""
    register_status: int = 200
    not_ready: int = 0  # barrier answers "not ready" this many times first
    start: dict[str, Any] = field(default_factory=dict)
    heartbeat_s: float = 1
    grace_s: float = 1.0
    stop_when: Callable[[FakeFunction], bool] = lambda function: False
    calls: list[Call] = field(default_factory=list)
    told_to_stop_at: float | None = None
    port: int = 0
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def record(self, call: Call) -> None:
        self.calls.append(call)

    def of(self, path: str) -> list[Call]:
        return [call for call in list(self.calls) if call.path == path]

    def lines(self) -> list[dict[str, str]]:
        return [line for call in self.of("/v1/logs") for line in call.body["lines"]]

    def texts(self) -> list[str]:
        return [line["text"] for line in self.lines()]

    def exits(self) -> list[dict[str, Any]]:
        return [call.body for call in self.of("/v1/exit")]

    def answer(self, call: Call) -> tuple[int, dict[str, Any] | None]:
        if call.path == "/v1/register":
            if call.authorization != "Bearer " + self.expected_token:
                return 401, {"error": "identity token invalid"}
            if self.register_status != 200:
                return self.register_status, {"error": "no run for this order"}
            return 200, {
                "session": SESSION, "request_id": "r-1", "order": "o-1", "attempt": 1,
                "rank": 1, "num_nodes": 2, "heartbeat_s": self.heartbeat_s,
            }  # fmt: skip
        if call.authorization != "Bearer " + SESSION:
            return 401, {"error": "session invalid"}
        if call.path == "/v1/barrier":
            if len(self.of("/v1/barrier")) <= self.not_ready:
                return 200, {"ready": False, "retry_after_s": 0.1}
            return 200, {"ready": True, "image": None, "env": {}, **self.start}
        if call.path == "/v1/heartbeat":
            if self.exits():
                return 410, {"error": "the run is over"}
            stop = self.stop_when(self)
            if stop and self.told_to_stop_at is None:
                self.told_to_stop_at = call.at
            return 200, {"stop": stop, "grace_s": self.grace_s}
        if call.path == "/v1/logs":
            return 204, None
        if call.path == "/v1/exit":
            return 200, {}
        return 404, {"error": "no such endpoint"}

    def serve(self, port: int = 0) -> None:
        function = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                call = Call(self.path, self.headers.get("Authorization", ""), body, time.time())
                function.record(call)
                status, reply = function.answer(call)
                data = b"" if reply is None else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = local_http.serve(Handler, port)
        self.port = self._server.server_address[1]

    def close(self) -> None:
        local_http.stop(self._server)


@dataclass
class FakeMetadata:
    """The metadata server's answers the agent asks for: the ``opendws-agent-url`` attribute
    and an identity token that spells out the audience and format it was asked for."""

    agent_url: str | None = None
    requests: list[tuple[str, str]] = field(default_factory=list)  # (path?query, flavor)
    port: int = 0
    _server: ThreadingHTTPServer | None = None

    @staticmethod
    def token_for(audience: str) -> str:
        return f"identity:{audience}:full"

    def serve(self) -> None:
        metadata = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                flavor = self.headers.get("Metadata-Flavor", "")
                metadata.requests.append((self.path, flavor))
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                text = None
                if flavor == "Google":
                    if parts.path.endswith("/instance/service-accounts/default/identity"):
                        text = f"identity:{query.get('audience')}:{query.get('format')}"
                    elif parts.path.endswith("/instance/attributes/opendws-agent-url"):
                        text = metadata.agent_url
                data = (text or "not found").encode()
                self.send_response(200 if text is not None else 404)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = local_http.serve(Handler)
        self.port = self._server.server_address[1]

    def close(self) -> None:
        local_http.stop(self._server)


@contextmanager
def agent_process(
    argv: Sequence[str], metadata: FakeMetadata, output: Path, path: Sequence[Path] = ()
) -> Iterator[subprocess.Popen[bytes]]:
    """The agent as a process of its own, its output in ``output``; killed if still there."""
    env = dict(os.environ)
    env["GCE_METADATA_HOST"] = f"127.0.0.1:{metadata.port}"
    env["PATH"] = os.pathsep.join([*map(str, path), env.get("PATH", "")])
    env.pop("PYTHONPATH", None)
    with output.open("wb") as out:
        process = subprocess.Popen(
            list(argv), env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait()


def python_module_argv() -> list[str]:
    return [sys.executable, "-m", "opendws.agent"]


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def oldest_python() -> str | None:
    """An interpreter of the agent's oldest Python (MINIMUM_PYTHON), where one is installed."""
    major, minor = MINIMUM_PYTHON
    name = f"python{major}.{minor}"
    versions = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [
        shutil.which(name),
        *map(str, sorted(versions.glob(f"{major}.{minor}.*/bin/{name}"))),
    ]
    for candidate in candidates:
        if candidate is None:
            continue
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"],
                               capture_output=True, text=True, check=False)  # fmt: skip
        if probe.returncode == 0 and probe.stdout.strip() == str((major, minor)):
            return candidate
    return None


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    server = FakeMetadata()
    server.serve()
    yield server
    server.close()


@pytest.fixture
def function(metadata: FakeMetadata) -> Iterator[FakeFunction]:
    fake = FakeFunction()
    fake.serve()
    fake.expected_token = FakeMetadata.token_for(fake.url)
    metadata.agent_url = fake.url
    yield fake
    fake.close()


def job(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def agent_argvs() -> list[Any]:
    """The agent as ``python -m opendws.agent`` (its URL from the metadata server), and as the
    zip the startup script carries, run by the oldest Python the agent supports."""
    argvs: list[Any] = [pytest.param("module", id="python -m opendws.agent")]
    oldest = oldest_python()
    argvs.append(
        pytest.param(
            "bundle-oldest",
            id="bundle on the oldest Python",
            marks=pytest.mark.skipif(
                oldest is None, reason=f"no Python {MINIMUM_PYTHON} installed here"
            ),
        )
    )
    return argvs


def argv_for(kind: str, tmp_path: Path, function: FakeFunction) -> list[str]:
    if kind == "module":
        return python_module_argv()
    bundle_path = tmp_path / "agent.pyz"
    bundle_path.write_bytes(bundle())
    oldest = oldest_python()
    assert oldest is not None
    return [oldest, str(bundle_path), "--agent-url", function.url]


@pytest.mark.parametrize("kind", agent_argvs())
def test_the_job_starts_once_the_gang_is_up_with_its_env_and_its_output_and_exit_reach_the_function(
    kind: str, tmp_path: Path, metadata: FakeMetadata, function: FakeFunction
) -> None:
    """Register with the identity token (audience = the agent URL, format=full), wait at the
    barrier until it is ready, run the command with the env added to the agent's own, ship
    stdout and stderr line by line, report the exit code, and kill what the job left in its
    process group once it has exited; then heartbeat as ``exited`` until the run is over."""
    leftover = tmp_path / "leftover.pid"
    function.not_ready = 2
    function.start = {
        "command": job(f"""
            import os, subprocess, sys
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            open({str(leftover)!r}, "w").write(str(child.pid))
            print("rank", os.environ["OPENDWS_NODE_RANK"], "path", bool(os.environ["PATH"]))
            print("to stderr", file=sys.stderr)
            sys.exit(3)
        """),
        "env": {"OPENDWS_NODE_RANK": "1"},
    }
    with agent_process(argv_for(kind, tmp_path, function), metadata, tmp_path / "out") as agent:
        assert agent.wait(timeout=10) == 0
    assert function.exits() == [{"code": 3, "stopped": False}]
    assert {"stream": "stdout", "text": "rank 1 path True"} in function.lines()
    assert {"stream": "stderr", "text": "to stderr"} in function.lines()
    paths = [call.path for call in function.calls]
    assert paths[:4] == ["/v1/register", "/v1/barrier", "/v1/barrier", "/v1/barrier"]
    first_log = paths.index("/v1/logs")
    assert first_log > 3  # nothing ran before the barrier said ready
    assert paths.index("/v1/exit") > max(i for i, p in enumerate(paths) if p == "/v1/logs")
    assert function.of("/v1/heartbeat")[-1].body == {"state": "exited"}
    token = function.of("/v1/register")[0].authorization
    assert token == "Bearer " + FakeMetadata.token_for(function.url)
    assert all(flavor == "Google" for _, flavor in metadata.requests)
    wait_until(lambda: not alive(int(leftover.read_text())))
    assert "rank 1 path True" in (tmp_path / "out").read_text()  # echoed on its own stdout


def test_told_to_stop_the_job_gets_sigterm_then_sigkill_after_the_grace_period(
    tmp_path: Path, metadata: FakeMetadata, function: FakeFunction
) -> None:
    function.grace_s = 0.5
    function.stop_when = lambda f: "armed" in f.texts()
    function.start = {
        "command": job("""
            import signal, time
            signal.signal(signal.SIGTERM, lambda *a: print("got SIGTERM", flush=True))
            print("armed", flush=True)
            time.sleep(60)
        """)
    }
    with agent_process(python_module_argv(), metadata, tmp_path / "out") as agent:
        assert agent.wait(timeout=10) == 0
    assert function.exits() == [{"code": 128 + signal.SIGKILL, "stopped": True}]
    assert "got SIGTERM" in function.texts()
    assert function.told_to_stop_at is not None
    assert function.of("/v1/exit")[0].at - function.told_to_stop_at >= function.grace_s


def test_the_agent_retries_while_the_function_is_unreachable(
    tmp_path: Path, metadata: FakeMetadata
) -> None:
    function = FakeFunction(port=free_port())  # not listening yet
    function.expected_token = FakeMetadata.token_for(function.url)
    metadata.agent_url = function.url
    function.start = {"command": job("print('ran')")}
    with agent_process(python_module_argv(), metadata, tmp_path / "out") as agent:
        time.sleep(1.0)
        function.serve(function.port)
        try:
            assert agent.wait(timeout=10) == 0
        finally:
            function.close()
    assert function.exits() == [{"code": 0, "stopped": False}]
    assert "ran" in function.texts()
    assert "registering:" in (tmp_path / "out").read_text()  # it did try, and said so


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_agent_stopped_with_sigterm_stops_its_job_first_and_reports_it_stopped(
    tmp_path: Path, metadata: FakeMetadata, function: FakeFunction, signum: int
) -> None:
    pid_file = tmp_path / "job.pid"
    function.start = {
        "command": job(f"""
            import os, signal, sys, time
            open({str(pid_file)!r}, "w").write(str(os.getpid()))
            def bye(*args):
                print("bye", flush=True)
                sys.exit(0)
            signal.signal(signal.SIGTERM, bye)
            print("armed", flush=True)
            time.sleep(60)
        """)
    }
    with agent_process(python_module_argv(), metadata, tmp_path / "out") as agent:
        wait_until(lambda: "armed" in function.texts())
        agent.send_signal(signum)
        assert agent.wait(timeout=5) == 0
    assert function.exits() == [{"code": 0, "stopped": True}]
    assert "bye" in function.texts()
    assert not alive(int(pid_file.read_text()))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_job_dies_with_an_agent_killed_by_sigkill(
    tmp_path: Path, metadata: FakeMetadata, function: FakeFunction
) -> None:
    pid_file = tmp_path / "job.pid"
    function.start = {
        "command": job(f"""
            import os, time
            open({str(pid_file)!r}, "w").write(str(os.getpid()))
            print("armed", flush=True)
            time.sleep(60)
        """)
    }
    with agent_process(python_module_argv(), metadata, tmp_path / "out") as agent:
        wait_until(lambda: "armed" in function.texts())
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=5)
    wait_until(lambda: not alive(int(pid_file.read_text())), timeout_s=3)


def test_a_vm_without_a_run_idles_and_asks_again_later(
    tmp_path: Path, metadata: FakeMetadata, function: FakeFunction
) -> None:
    """404 at registration: a capacity-only request. The agent runs nothing and asks again
    only after REASK_S (60 s), and a SIGTERM ends it at once."""
    function.register_status = 404
    with agent_process(python_module_argv(), metadata, tmp_path / "out") as agent:
        wait_until(lambda: bool(function.of("/v1/register")))
        time.sleep(1.0)
        assert agent.poll() is None
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=3) == 0
    assert [call.path for call in function.calls] == ["/v1/register"]
    assert REASK_S == 60
    assert "capacity only" in (tmp_path / "out").read_text()


def test_an_image_runs_through_docker_and_no_value_is_on_a_command_line(
    tmp_path: Path, metadata: FakeMetadata, function: FakeFunction
) -> None:
    """``docker run --rm --gpus all --network host --ipc host -e NAME ... IMAGE COMMAND``:
    ``-e NAME`` without a value takes it from the docker client's environment
    (docs.docker.com/reference/cli/docker/container/run/#env), so a secret (here a value of
    two lines, which ``--env-file`` could not carry) is on no command line. A stand-in
    ``docker`` records its command line and hands the named variables to the command as a
    container would."""
    image = "us-docker.pkg.dev/p/ml/trainer:1.4"
    secret = "s3cr3t-value\nsecond line"
    record = tmp_path / "docker.jsonl"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent(f"""
            import json, os, subprocess, sys
            args = sys.argv[1:]
            with open({str(record)!r}, "a") as out:
                out.write(json.dumps(sys.argv) + "\\n")
            if args[0] == "run":
                names = [args[i + 1] for i, a in enumerate(args) if a == "-e"]
                env = {{n: os.environ[n] for n in names}}
                env["PATH"] = os.environ["PATH"]
                at = args.index({image!r})
                sys.exit(subprocess.call(args[at + 1:], env=env))
        """)
    )
    docker.chmod(0o755)
    function.start = {
        "image": image,
        "command": [sys.executable, "-c", "import os; print(repr(os.environ['HF_TOKEN']))"],
        "env": {"HF_TOKEN": secret, "OPENDWS_NODE_RANK": "1"},
    }
    with agent_process(python_module_argv(), metadata, tmp_path / "out", [bin_dir]) as agent:
        assert agent.wait(timeout=10) == 0
    runs = [argv for argv in map(json.loads, record.read_text().splitlines()) if argv[1] == "run"]
    assert len(runs) == 1
    argv = runs[0]
    name_at = argv.index("--name")
    assert argv[:name_at] == [str(docker), "run", "--rm"]
    assert argv[name_at + 2 :] == [
        "--gpus", "all", "--network", "host", "--ipc", "host",
        "-e", "HF_TOKEN", "-e", "OPENDWS_NODE_RANK",
        image, sys.executable, "-c", "import os; print(repr(os.environ['HF_TOKEN']))",
    ]  # fmt: skip
    assert not any("s3cr3t" in arg for arg in argv)
    assert "s3cr3t" not in (tmp_path / "out").read_text().replace(repr(secret), "")
    assert function.texts() == [repr(secret)]
    assert function.exits() == [{"code": 0, "stopped": False}]
