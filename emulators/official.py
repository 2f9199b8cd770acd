"""The official Firestore and Pub/Sub emulators: find, start, wait for, reset and stop them.

Both are Google Cloud CLI components (``platform/`` under the SDK root that
``gcloud info --format='value(installation.sdk_root)'`` prints). They are started as their Java
processes directly — not through ``gcloud``, whose wrapper would leave the Java process behind
when stopped — on 127.0.0.1, each in its own process group (session), and stopped by signalling
that group, so nothing is left running.

Real Google clients find them through ``FIRESTORE_EMULATOR_HOST`` and ``PUBSUB_EMULATOR_HOST``
(see :meth:`Emulators.environment`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

Kind = Literal["firestore", "pubsub"]
HOST = "127.0.0.1"
# The variable each emulator's clients read, and the component folder under platform/.
ENVIRONMENT = {"firestore": "FIRESTORE_EMULATOR_HOST", "pubsub": "PUBSUB_EMULATOR_HOST"}
COMPONENTS = {"firestore": "cloud-firestore-emulator", "pubsub": "pubsub-emulator"}
# Where to look first for the SDK (set it where gcloud is not on PATH).
SDK_ROOT_VARIABLE = "OPENDWS_GCLOUD_SDK_ROOT"


class EmulatorError(RuntimeError):
    """An emulator could not be found, started, reset or stopped."""


def sdk_root() -> Path | None:
    """The Google Cloud CLI's SDK root, or None if neither the variable nor gcloud gives one."""
    configured = os.environ.get(SDK_ROOT_VARIABLE)
    if configured:
        return Path(configured)
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        return None
    try:
        printed = subprocess.run(
            [gcloud, "info", "--format=value(installation.sdk_root)"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return None
    return Path(printed) if printed else None


def jar(kind: Kind, root: Path) -> Path:
    """The emulator's jar inside the SDK (it may be missing: see :func:`missing_reason`)."""
    platform = root / "platform" / COMPONENTS[kind]
    if kind == "firestore":
        return platform / "cloud-firestore-emulator.jar"
    versions = sorted((platform / "lib").glob("cloud-pubsub-emulator-*-all.jar"))
    return versions[-1] if versions else platform / "lib" / "cloud-pubsub-emulator-all.jar"


def command(kind: Kind, port: int, root: Path) -> list[str]:
    """The Java command line that runs emulator ``kind`` on ``HOST:port``."""
    java = shutil.which("java") or "java"
    if kind == "firestore":
        main = "com.google.cloud.datastore.emulator.firestore.CloudFirestore"
        # The emulator only speaks English errors; its own launcher sets the same flag.
        return [java, "-Duser.language=en", "-cp", str(jar(kind, root)), main, "start",
                f"--host={HOST}", f"--port={port}"]  # fmt: skip
    return [java, "-jar", str(jar(kind, root)), f"--host={HOST}", f"--port={port}"]


def missing_reason(root: Path | None = None) -> str | None:
    """Why the emulators cannot run on this machine, or None if they can."""
    if shutil.which("java") is None:
        return "java is not installed (the official emulators are Java programs)"
    root = root or sdk_root()
    if root is None:
        return (
            "the Google Cloud CLI was not found (no gcloud on PATH and "
            f"{SDK_ROOT_VARIABLE} unset), so its Firestore and Pub/Sub emulators are missing"
        )
    kinds: tuple[Kind, ...] = ("firestore", "pubsub")
    for kind in kinds:
        if not jar(kind, root).is_file():
            return (
                f"the {COMPONENTS[kind]} component is not installed under {root / 'platform'}"
                f" (gcloud components install {COMPONENTS[kind]})"
            )
    return None


# Starts on a port chosen free, when the emulator could not bind it (see start).
BIND_ATTEMPTS = 3


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""Linux's ephemeral ports: the kernel hands them out to ``bind(0)`` and to every outgoing
connection's local end (ip-sysctl.rst, ``ip_local_port_range``)."""
PORT_ATTEMPTS = 200


def ephemeral_ports(source: Path = EPHEMERAL_RANGE) -> range:
    """The kernel's ephemeral port range (Linux's default 32768–60999 where it cannot be read)."""
    try:
        low, high = (int(word) for word in source.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port() -> int:
    """A TCP port on HOST that nothing listens on right now, chosen at random below the kernel's
    ephemeral range. A port is often chosen some seconds before its server binds it (a function
    is told its own URL first); an ephemeral one could meanwhile become the local end of any
    outgoing connection on the machine, and the server would fail to start. Below the range only
    a program that asks for the very port can take it. Falls back to an ephemeral port when no
    port below the range is free."""
    above = ephemeral_ports().start
    below = range(max(1024, above - 16384), max(1025, above))
    choices = random.Random()
    for _ in range(PORT_ATTEMPTS):
        port = choices.choice(below)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                continue
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


@dataclass
class Emulator:
    """One running emulator process (the leader of its own process group)."""

    kind: Kind
    port: int
    process: subprocess.Popen[bytes]
    log: IO[bytes]

    @property
    def host_port(self) -> str:
        """``127.0.0.1:PORT``, the value of its ``*_EMULATOR_HOST`` variable."""
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        """The base URL of its HTTP face."""
        return f"http://{self.host_port}"

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the process printed (for error messages)."""
        self.log.flush()
        text = Path(self.log.name).read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def wait_until_ready(self, timeout: float = 90.0) -> None:
        """Block until the emulator answers ``GET /`` with Ok; raise if it exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmulatorError(
                    f"the {self.kind} emulator exited with code {self.process.returncode} while "
                    f"starting on {self.host_port}:\n{self.log_tail()}"
                )
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.url + "/", timeout=2) as reply,
            ):
                if reply.status == 200:
                    return
            time.sleep(0.2)
        tail = self.log_tail()
        self.stop()
        raise EmulatorError(
            f"the {self.kind} emulator did not answer on {self.host_port} within {timeout:.0f} s:"
            f"\n{tail}"
        )

    def reset(self, project: str) -> None:
        """Forget everything stored for ``project``: all Firestore documents, or all Pub/Sub
        subscriptions and topics."""
        if self.kind == "firestore":
            _request(
                "DELETE", f"{self.url}/emulator/v1/projects/{project}/databases/(default)/documents"
            )
            return
        for collection in ("subscriptions", "topics"):
            listing = _request("GET", f"{self.url}/v1/projects/{project}/{collection}")
            for item in json.loads(listing or "{}").get(collection, []):
                name = item if isinstance(item, str) else item["name"]
                _request("DELETE", f"{self.url}/v1/{urllib.parse.quote(name)}")

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the whole process group: TERM, then KILL if it lingers. Safe to repeat."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout)
        # The leader is gone; make sure no child of its group outlives it either.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.log.close()
        with contextlib.suppress(FileNotFoundError):
            Path(self.log.name).unlink()  # a run leaves no file behind


def start(
    kind: Kind, port: int | None = None, root: Path | None = None, logs: Path | None = None
) -> Emulator:
    """Start emulator ``kind`` on ``port`` (a free one if None) and wait until it is ready.
    Its output goes to a log file in ``logs`` (the system's temporary folder if None), which
    :meth:`Emulator.stop` removes."""
    root = root or sdk_root()
    reason = missing_reason(root)
    if reason is not None or root is None:
        raise EmulatorError(reason or "the Google Cloud CLI was not found")
    chosen = port is None
    for attempt in range(1, BIND_ATTEMPTS + 1):
        emulator = _launch(kind, port or free_port(), root, logs)
        try:
            emulator.wait_until_ready()
        except EmulatorError:
            # A port found free may be taken before the emulator binds it (another process
            # between the probe and the bind): one we chose is chosen again, a few times.
            lost_race = chosen and "BindException" in emulator.log_tail(200)
            emulator.stop()
            if lost_race and attempt < BIND_ATTEMPTS:
                continue
            raise
        return emulator
    raise AssertionError("unreachable: the last attempt returns or raises")


def _launch(kind: Kind, port: int, root: Path, logs: Path | None) -> Emulator:
    """Start emulator ``kind``'s process on ``port``, its output to a log file in ``logs``."""
    log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the process's life
        prefix=f"opendws-{kind}-", suffix=".log", delete=False, dir=logs
    )
    process = subprocess.Popen(
        command(kind, port, root),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, stopped as a whole
    )
    return Emulator(kind=kind, port=port, process=process, log=log)


@dataclass
class Emulators:
    """The Firestore and Pub/Sub emulators, running together."""

    firestore: Emulator
    pubsub: Emulator

    def environment(self) -> dict[str, str]:
        """The variables that point real Google clients at these emulators."""
        return {
            ENVIRONMENT["firestore"]: self.firestore.host_port,
            ENVIRONMENT["pubsub"]: self.pubsub.host_port,
        }

    def reset(self, project: str) -> None:
        """Forget every document, topic and subscription of ``project``."""
        self.firestore.reset(project)
        self.pubsub.reset(project)

    def stop(self) -> None:
        """Stop both (safe to repeat)."""
        for emulator in (self.pubsub, self.firestore):
            emulator.stop()


@contextlib.contextmanager
def running(root: Path | None = None) -> Iterator[Emulators]:
    """Both emulators on free ports for the duration of the block, stopped afterwards; their
    logs are kept in a run folder of their own, removed with everything in it at the end."""
    with tempfile.TemporaryDirectory(prefix="opendws-emulators-") as folder:
        logs = Path(folder)
        firestore = start("firestore", root=root, logs=logs)
        try:
            pubsub = start("pubsub", root=root, logs=logs)
        except BaseException:
            firestore.stop()
            raise
        emulators = Emulators(firestore=firestore, pubsub=pubsub)
        try:
            yield emulators
        finally:
            emulators.stop()


def _request(method: str, url: str) -> str:
    """One HTTP call to an emulator; its body, or an EmulatorError saying what failed."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return str(reply.read().decode())
    except urllib.error.URLError as error:
        raise EmulatorError(f"{method} {url} failed: {error}") from error
