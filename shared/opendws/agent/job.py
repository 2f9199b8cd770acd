"""The job: its command line, its process group, its output, and how it is stopped."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import IO

PR_SET_PDEATHSIG = 1  # linux/prctl.h
READ_CHUNK = 64 * 1024  # a longer line arrives as several
PUMP_JOIN_S = 5.0  # how long the output of an exited job may take to drain
DOCKER_KILL_S = 10.0


GPU = "gpu"
TPU = "tpu"


def docker_argv(
    image: str,
    command: Sequence[str],
    names: Sequence[str],
    name: str,
    mounts: Sequence[str] = (),
    devices: str = GPU,
) -> list[str]:
    """``docker run`` for ``command`` in ``image`` with host networking, host IPC and the VM's
    accelerators: every GPU (``--gpus all``), or on a TPU VM what Google's TPU container guide
    runs with, ``--privileged`` (the TPU chips) and host networking, which also reaches the
    metadata server JAX reads its slice from (cloud.google.com/tpu/docs/run-in-container).

    Each variable is passed as ``-e NAME``: Docker takes its value from the docker client's own
    environment (docs.docker.com/reference/cli/docker/container/run/#env), so no value is on a
    command line or in a file, and a value may hold newlines (a key file), which an
    ``--env-file`` cannot carry."""
    if devices not in (GPU, TPU):
        raise ValueError(f"devices: {GPU!r} or {TPU!r}, not {devices!r}")
    argv = ["docker", "run", "--rm", "--name", name]
    argv += ["--gpus", "all"] if devices == GPU else ["--privileged"]
    argv += ["--network", "host", "--ipc", "host"]
    for path in sorted(mounts):  # files the agent wrote for the job, at the same path
        argv += ["-v", f"{path}:{path}:ro"]
    for env_name in sorted(names):
        argv += ["-e", env_name]
    return [*argv, image, *command]


def exit_code(returncode: int) -> int:
    """A process killed by signal N exits as the shell says it: 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _death_signal() -> Callable[[], None] | None:
    """A preexec function asking Linux to SIGKILL the child when the agent dies, or None
    where that cannot be asked (not Linux, no libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def ask() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the agent died before the request took effect
            os._exit(137)

    return ask


class Job:
    """A running job: its own session and process group (``setsid``), output read line by
    line, and a thread that notices its exit."""

    def __init__(
        self,
        process: subprocess.Popen[bytes] | None,
        container: str | None,
        on_line: Callable[[str, str], None],
        on_exit: Callable[[], None],
        failed_code: int = 0,
    ) -> None:
        self._process = process
        self._container = container
        self._on_line = on_line
        self._on_exit = on_exit
        self.exited = threading.Event()
        self.code = failed_code
        self._pumps: list[threading.Thread] = []
        if process is None:
            self.exited.set()
            on_exit()
            return
        assert process.stdout is not None
        assert process.stderr is not None
        for stream, pipe in (("stdout", process.stdout), ("stderr", process.stderr)):
            pump = threading.Thread(
                target=self._pump, args=(stream, pipe), name="opendws-" + stream, daemon=True
            )
            pump.start()
            self._pumps.append(pump)
        threading.Thread(target=self._wait, name="opendws-job", daemon=True).start()

    @classmethod
    def start(
        cls,
        command: Sequence[str],
        image: str | None,
        env: Mapping[str, str],
        on_line: Callable[[str, str], None],
        on_exit: Callable[[], None],
        devices: str = GPU,
    ) -> Job:
        """Start ``command`` (in ``image`` when given) with ``env`` added to the agent's own
        environment. Call it from the main thread with no other thread running: the child's
        death signal is tied to the thread that forks it, and a preexec function is safe only
        when no other thread holds a lock."""
        child_env = dict(os.environ)
        child_env.update(env)
        container = None
        argv = list(command)
        if image is not None:
            container = f"opendws-job-{os.getpid()}"
            hostfile = env.get("OPENDWS_HOSTFILE")
            mounts = [hostfile] if hostfile else []
            argv = docker_argv(image, command, list(env), container, mounts, devices)
        try:
            process = subprocess.Popen(
                argv,
                env=child_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                # Only the main thread runs here (see above), so no lock is held in the child.
                preexec_fn=_death_signal(),  # noqa: PLW1509
            )
        except OSError as error:
            # As a shell says it: 127 not found, 126 found but not runnable.
            code = 127 if isinstance(error, FileNotFoundError) else 126
            on_line("stderr", f"[opendws agent] cannot run {argv[0]!r}: {error}")
            return cls(None, None, on_line, on_exit, failed_code=code)
        return cls(process, container, on_line, on_exit)

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def _pump(self, stream: str, pipe: IO[bytes]) -> None:
        with pipe:
            while True:
                raw = pipe.readline(READ_CHUNK)
                if not raw:
                    return
                if raw.endswith(b"\n"):
                    raw = raw[:-1]
                    if raw.endswith(b"\r"):
                        raw = raw[:-1]
                self._on_line(stream, raw.decode("utf-8", "replace"))

    def _wait(self) -> None:
        assert self._process is not None
        returncode = self._process.wait()
        # Whatever the job left behind in its group ends with it.
        self.signal(signal.SIGKILL)
        for pump in self._pumps:
            pump.join(PUMP_JOIN_S)
        self.code = exit_code(returncode)
        self.exited.set()
        self._on_exit()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the job's whole process group."""
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signum)

    def terminate(self, grace_s: float) -> bool:
        """SIGTERM the job's group, then SIGKILL it (and its container) after ``grace_s``.
        Returns whether the job was still running when told to stop."""
        if self.exited.is_set():
            return False
        self.signal(signal.SIGTERM)
        if not self.exited.wait(grace_s):
            self.kill()
        self.exited.wait()
        return True

    def kill(self) -> None:
        """SIGKILL the job's group and its container, at once."""
        self.signal(signal.SIGKILL)
        if self._container is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(
                    ["docker", "kill", self._container],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    timeout=DOCKER_KILL_S,
                    check=False,
                )
