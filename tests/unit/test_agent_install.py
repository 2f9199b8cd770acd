"""The agent installs what a run needs before its command (``opendws.agent.install``): the
barrier's ``install`` (``url``, ``sha256``, ``dir``, ``creates``) is a ``.tar.gz`` served here
by a local http server, as GitHub serves the actions runner's releases
(``https://github.com/actions/runner/releases/download/v{V}/actions-runner-linux-x64-{V}.tar.gz``
with its SHA-256 on the release page, unpacked with ``tar xzf`` into the runner's own directory:
docs.github.com/en/actions/hosting-your-own-runners/managing-self-hosted-runners/adding-self-hosted-runners).

A member that would land or point outside the directory is refused as CPython's own
``tarfile`` "data" filter refuses it (docs.python.org/3/library/tarfile.html#tarfile.data_filter:
absolute names, ``..``, links pointing outside, device files; setuid, setgid, sticky and
group/other write bits cleared), which the agent cannot use: it runs on Python 3.8."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from opendws.agent import install as installing
from opendws.agent.install import Install, InstallFailed, ensure
from opendws.agent.run import INSTALL_FAILED, STOPPED_WHILE_INSTALLING, Start
from opendws.agent.transport import Unreachable
from tests import local_http
from tests.local_http import QuietHandler
from tests.unit.test_agent import (
    FakeFunction,
    FakeMetadata,
    agent_argvs,
    agent_process,
    argv_for,
    free_port,
    python_module_argv,
)

RUN_SH = b'#!/bin/sh\necho ran from "$(dirname "$0")"\n'


# -- archives ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    name: str
    data: bytes = b""
    mode: int = 0o644
    kind: bytes = tarfile.REGTYPE
    link: str = ""


def tarball(members: Sequence[Member]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for member in members:
            info = tarfile.TarInfo(member.name)
            info.type = member.kind
            info.mode = member.mode
            info.linkname = member.link
            info.size = len(member.data) if member.kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(member.data) if info.size else None)
    return out.getvalue()


def runner_archive() -> bytes:
    """Shaped like the actions runner's: run.sh at the top, more below, and links inside."""
    return tarball([
        Member("./", kind=tarfile.DIRTYPE, mode=0o775),
        Member("./run.sh", RUN_SH, 0o775),
        Member("./bin/Runner.Listener", b"\x7fELF", 0o6777),
        Member("./externals/node20/lib/npm-cli.js", b"// npm", 0o644),
        Member("./externals/node20/bin/npm", kind=tarfile.SYMTYPE, link="../lib/npm-cli.js"),
        Member("./bin/listener", kind=tarfile.LNKTYPE, link="./bin/Runner.Listener"),
    ])  # fmt: skip


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the release server -----------------------------------------------------------------------


@dataclass
class Releases:
    """Serves ``/<name>``: each path's answers in turn (the last one repeats): an archive's
    bytes, an HTTP status, or ``("redirect", url)``; with what was asked kept in ``asked``."""

    answers: dict[str, list[Any]] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    delay_s: float = 0.0
    port: int = 0
    _server: ThreadingHTTPServer | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def serve(self) -> None:
        releases = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                releases.asked.append(self.path)
                answers = releases.answers.get(self.path, [404])
                answer = answers[min(releases.asked.count(self.path), len(answers)) - 1]
                time.sleep(releases.delay_s)
                if isinstance(answer, tuple):
                    self.send_response(302)
                    self.send_header("Location", answer[1])
                    body = b""
                elif isinstance(answer, int):
                    self.send_response(answer)
                    body = b"no"
                else:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/gzip")
                    body = answer
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = local_http.serve(Handler)
        self.port = self._server.server_address[1]

    def close(self) -> None:
        local_http.stop(self._server)


@pytest.fixture
def releases() -> Iterator[Releases]:
    server = Releases()
    server.serve()
    yield server
    server.close()


def spec(releases: Releases, tmp_path: Path, archive: bytes, digest: str | None = None) -> Install:
    releases.answers["/runner.tar.gz"] = [archive]
    return Install.parse({
        "url": releases.url("/runner.tar.gz"), "sha256": digest or sha256(archive),
        "dir": str(tmp_path / "opt" / "actions-runner-2.328.0"), "creates": "run.sh",
    })  # fmt: skip


def run_ensure(install: Install) -> list[str]:
    said: list[str] = []
    ensure(install, said.append, threading.Event())
    return said


def failure(install: Install) -> str:
    with pytest.raises(InstallFailed) as failed:
        run_ensure(install)
    return str(failed.value)


def left_in(folder: Path) -> list[str]:
    return sorted(os.listdir(folder)) if folder.exists() else []


def mode(path: Path) -> int:
    return path.lstat().st_mode & 0o7777


# -- installing -------------------------------------------------------------------------------


def test_it_installs_once_and_a_second_run_downloads_nothing(
    releases: Releases, tmp_path: Path
) -> None:
    install = spec(releases, tmp_path, runner_archive())
    said = run_ensure(install)
    root = Path(install.dir)
    assert (root / "run.sh").read_bytes() == RUN_SH
    assert mode(root / "run.sh") == 0o755  # group write cleared
    assert mode(root / "bin" / "Runner.Listener") == 0o755  # setuid, setgid cleared
    assert os.readlink(root / "externals/node20/bin/npm") == "../lib/npm-cli.js"
    assert (root / "externals/node20/bin/npm").read_bytes() == b"// npm"
    assert os.path.samefile(root / "bin/listener", root / "bin/Runner.Listener")
    assert mode(root) == 0o755
    assert left_in(root.parent) == [root.name]  # no download or staging left beside it
    assert said[-1] == f"installed {install.url} in {install.dir}"

    again = run_ensure(install)
    assert releases.asked == ["/runner.tar.gz"]
    assert again == [f"{install.marker} is there: nothing to install"]


def test_a_bad_checksum_is_refused_naming_both_digests(releases: Releases, tmp_path: Path) -> None:
    archive = runner_archive()
    expected = sha256(b"the published one")
    install = spec(releases, tmp_path, archive, expected)
    message = failure(install)
    assert message == (
        f"checksum: {install.url} has SHA-256 {sha256(archive)}, expected {expected}"
    )
    assert left_in(Path(install.dir).parent) == []  # nothing unpacked, nothing left


@pytest.mark.parametrize(
    ("members", "said"),
    [
        ([Member("../x", b"out")], "'../x' is outside the directory"),
        ([Member("a/../../x", b"out")], "'a/../../x' is outside the directory"),
        ([Member("/tmp/x", b"out")], "'/tmp/x' is outside the directory"),
        ([Member("etc", kind=tarfile.SYMTYPE, link="/etc")], "the symlink 'etc' points out"),
        ([Member("up", kind=tarfile.SYMTYPE, link="a/../..")], "the symlink 'up' points out"),
        (
            [Member("x", kind=tarfile.LNKTYPE, link="../x")],
            "the hard link 'x' points out of the directory",
        ),
        (
            # Each link inside on its own; together out: sub/e -> sub/d/.. -> (..)/..
            [
                Member("sub/e", kind=tarfile.SYMTYPE, link="d/.."),
                Member("sub/d", kind=tarfile.SYMTYPE, link=".."),
            ],
            "the symlink 'sub/e' points out of the directory",
        ),
        (
            [Member("here", kind=tarfile.SYMTYPE, link="."), Member("here/x", b"through")],
            "'here/x' goes through a symlink",
        ),
        (
            [Member("link", kind=tarfile.SYMTYPE, link="run.sh"), Member("link", b"over")],
            "'link' is in the archive twice",
        ),
        ([Member("null", kind=tarfile.CHRTYPE)], "'null' is neither a file, a directory nor"),
        ([Member("pipe", kind=tarfile.FIFOTYPE)], "'pipe' is neither a file, a directory nor"),
    ],
    ids=[
        "../x",
        "a/../../x",
        "absolute",
        "symlink absolute",
        "symlink up",
        "hard link up",
        "symlink chain",
        "through a symlink",
        "over a symlink",
        "device",
        "fifo",
    ],
)
def test_a_member_landing_or_pointing_outside_is_refused_and_nothing_is_left(
    releases: Releases, tmp_path: Path, members: list[Member], said: str
) -> None:
    """The bad member comes after good ones: what was unpacked before it is never taken for
    an install, and nothing is written outside."""
    archive = tarball([Member("run.sh", RUN_SH, 0o755), *members])
    install = spec(releases, tmp_path, archive)
    message = failure(install)
    assert message.startswith("unpack: ")
    assert said in message
    root = Path(install.dir)
    assert left_in(root.parent) == []
    assert not (tmp_path / "opt" / "x").exists()
    assert not (tmp_path / "x").exists()


def test_an_archive_without_what_it_should_create_is_refused(
    releases: Releases, tmp_path: Path
) -> None:
    install = spec(releases, tmp_path, tarball([Member("actions-runner/run.sh", RUN_SH)]))
    assert failure(install) == "unpack: the archive has no run.sh"
    assert left_in(Path(install.dir).parent) == []


def test_a_directory_already_there_without_it_is_not_replaced(
    releases: Releases, tmp_path: Path
) -> None:
    install = spec(releases, tmp_path, runner_archive())
    Path(install.dir).mkdir(parents=True)
    (Path(install.dir) / "theirs").write_text("kept")
    assert failure(install).startswith(f"unpack: cannot put it in place at {install.dir}: ")
    assert left_in(Path(install.dir)) == ["theirs"]
    assert left_in(Path(install.dir).parent) == [Path(install.dir).name]


# -- downloading ------------------------------------------------------------------------------


def test_a_failed_download_is_reported_at_once_for_a_definite_answer(
    releases: Releases, tmp_path: Path
) -> None:
    install = spec(releases, tmp_path, runner_archive())
    releases.answers["/runner.tar.gz"] = [404]
    assert failure(install) == f"download: HTTP 404 from {install.url}"
    assert releases.asked == ["/runner.tar.gz"]
    assert left_in(Path(install.dir).parent) == []


def test_a_server_error_is_tried_again_with_backoff(releases: Releases, tmp_path: Path) -> None:
    archive = runner_archive()
    install = spec(releases, tmp_path, archive)
    releases.answers["/runner.tar.gz"] = [503, 429, archive]
    run_ensure(install)
    assert releases.asked == ["/runner.tar.gz"] * 3
    assert Path(install.marker).is_file()


def test_an_unreachable_server_fails_after_a_few_attempts(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/runner.tar.gz"
    install = Install.parse({"url": url, "sha256": "0" * 64, "dir": str(tmp_path / "r"),
                             "creates": "run.sh"})  # fmt: skip
    message = failure(install)
    assert message.startswith(f"download: {url}: ")
    assert message.endswith(f"({installing.DOWNLOAD_ATTEMPTS} attempts)")


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/runner.tar.gz",
        "ftp://example.com/runner.tar.gz",
        "file:///etc/passwd",
        "http://10.0.0.1/runner.tar.gz",
    ],
)
def test_only_https_is_downloaded_or_http_to_a_loopback_host(tmp_path: Path, url: str) -> None:
    install = Install.parse({"url": url, "sha256": "0" * 64, "dir": str(tmp_path / "r"),
                             "creates": "run.sh"})  # fmt: skip
    assert failure(install) == (f"download: {url} is not https (http only to a loopback host)")
    assert installing.allowed_url("https://github.com/actions/runner/releases/download/x")
    assert installing.allowed_url("http://localhost:8080/x")
    assert installing.allowed_url("http://[::1]:8080/x")


def test_a_redirect_to_plain_http_is_refused(releases: Releases, tmp_path: Path) -> None:
    """GitHub's release downloads redirect (to objects.githubusercontent.com): followed, but
    only to a URL the agent would download from in the first place."""
    archive = runner_archive()
    install = spec(releases, tmp_path, archive)
    releases.answers["/runner.tar.gz"] = [("redirect", releases.url("/objects/runner"))]
    releases.answers["/objects/runner"] = [archive]
    run_ensure(install)
    assert releases.asked == ["/runner.tar.gz", "/objects/runner"]

    other = spec(releases, tmp_path / "other", archive)
    releases.answers["/runner.tar.gz"] = [("redirect", "http://example.com/runner")]
    assert failure(other) == "download: redirected to http://example.com/runner, which is not https"


def test_a_malformed_install_is_a_malformed_barrier_reply() -> None:
    good = {"url": "https://h/r.tar.gz", "sha256": "A" * 64, "dir": "/opt/r", "creates": "run.sh"}
    assert Install.parse(good) == Install("https://h/r.tar.gz", "a" * 64, "/opt/r", "run.sh")
    for bad in [
        {**good, "sha256": "abc"}, {**good, "dir": "opt/r"}, {**good, "dir": "/"},
        {**good, "dir": "/opt/../r"}, {**good, "creates": "../run.sh"},
        {**good, "creates": "/run.sh"}, {**good, "url": 3}, "https://h/r.tar.gz",
    ]:  # fmt: skip
        with pytest.raises(ValueError, match="install"):
            Install.parse(bad)
        with pytest.raises(Unreachable, match="malformed barrier reply: install"):
            Start.parse({"ready": True, "command": ["x"], "install": bad})
    assert Start.parse({"ready": True, "command": ["x"], "install": good}).install is not None


# -- the agent --------------------------------------------------------------------------------


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


def runner_start(install: Install) -> dict[str, Any]:
    return {
        "command": [install.marker],
        "install": {"url": install.url, "sha256": install.sha256, "dir": install.dir,
                    "creates": install.creates},
    }  # fmt: skip


@pytest.mark.parametrize("kind", agent_argvs())
def test_the_agent_installs_before_the_command_and_once(
    kind: str,
    tmp_path: Path,
    releases: Releases,
    metadata: FakeMetadata,
    function: FakeFunction,
) -> None:
    install = spec(releases, tmp_path, runner_archive())
    function.start = runner_start(install)
    with agent_process(argv_for(kind, tmp_path, function), metadata, tmp_path / "out") as agent:
        assert agent.wait(timeout=15) == 0
    assert function.exits() == [{"code": 0, "stopped": False}]
    assert function.texts() == [
        f"[opendws agent] downloading {install.url}",
        f"[opendws agent] installed {install.url} in {install.dir}",
        f"ran from {install.dir}",
    ]

    second = FakeFunction(start=runner_start(install))
    second.serve()
    second.expected_token = FakeMetadata.token_for(second.url)
    metadata.agent_url = second.url
    try:
        with agent_process(python_module_argv(), metadata, tmp_path / "out2") as agent:
            assert agent.wait(timeout=15) == 0
    finally:
        second.close()
    assert second.exits() == [{"code": 0, "stopped": False}]
    assert releases.asked == ["/runner.tar.gz"]


def test_a_failed_install_is_the_jobs_exit_saying_what_failed(
    tmp_path: Path, releases: Releases, metadata: FakeMetadata, function: FakeFunction
) -> None:
    archive = runner_archive()
    expected = sha256(b"the published one")
    install = spec(releases, tmp_path, archive, expected)
    function.start = runner_start(install)
    with agent_process(python_module_argv(), metadata, tmp_path / "out") as agent:
        assert agent.wait(timeout=15) == 0
    assert function.exits() == [{"code": INSTALL_FAILED, "stopped": False}]
    said = function.texts()[-1]
    assert said.startswith(f"[opendws agent] cannot install {install.url} in {install.dir}: ")
    assert sha256(archive) in said
    assert expected in said
    assert not any(text.startswith("ran") for text in function.texts())
    assert "install failed: checksum" in (tmp_path / "out").read_text()


def test_the_agent_heartbeats_while_installing_and_stops_when_told(
    tmp_path: Path, releases: Releases, metadata: FakeMetadata, function: FakeFunction
) -> None:
    """An install may outlast the time after which a silent agent is lost: the agent
    heartbeats as ``running`` meanwhile, and a stop order ends it, reported stopped."""
    install = spec(releases, tmp_path, runner_archive())
    releases.delay_s = 5.0
    function.heartbeat_s = 0.2

    def running(fake: FakeFunction) -> int:
        return sum(call.body == {"state": "running"} for call in fake.of("/v1/heartbeat"))

    function.stop_when = lambda f: running(f) >= 3
    function.start = runner_start(install)
    with agent_process(python_module_argv(), metadata, tmp_path / "out") as agent:
        assert agent.wait(timeout=4) == 0
    assert function.exits() == [{"code": STOPPED_WHILE_INSTALLING, "stopped": True}]
    assert running(function) == 3
    assert not Path(install.dir).exists()
    assert releases.asked == ["/runner.tar.gz"]
