"""Serve a function of ``functions/main.py`` under functions-framework on 127.0.0.1, in its own
process group, for end-to-end tests, benchmarks and the local stack."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO

from emulators.official import HOST, EmulatorError, free_port

FUNCTIONS = Path(__file__).resolve().parents[1] / "functions" / "main.py"


@contextlib.contextmanager
def serving(
    target: str, signature_type: str, environment: Mapping[str, str], timeout: float = 30.0,
    port: int | None = None, log: Path | None = None,
) -> Iterator[str]:  # fmt: skip
    """Run function ``target`` (``http`` or ``cloudevent``) with ``environment`` added to this
    process's, on ``port`` (a free one if None — give one to tell the function its own URL);
    yield its URL once it answers, stop its whole process group afterwards. Its output (the
    structured log lines, functions-framework's own, any traceback) is appended to ``log`` as
    it is written, or dropped if None; a server that exits while starting is reported with
    the end of its log."""
    port = port or free_port()
    command = [sys.executable, "-m", "functions_framework", "--target", target,
               "--source", str(FUNCTIONS), "--signature-type", signature_type,
               "--host", HOST, "--port", str(port)]  # fmt: skip
    with contextlib.ExitStack() as files:
        output: IO[bytes] | int = subprocess.DEVNULL
        if log is not None:
            output = files.enter_context(log.open("ab"))
        server = subprocess.Popen(
            command,
            # Unbuffered: a line is in the log when it is written, not when a buffer fills.
            env={**os.environ, **environment, "PYTHONUNBUFFERED": "1"},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        url = f"http://{HOST}:{port}/"
        try:
            _wait_for(url, server, timeout, log)
            yield url
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(15)


def _wait_for(url: str, server: subprocess.Popen[bytes], timeout: float, log: Path | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            tail = "" if log is None else "\n" + _tail(log)
            raise EmulatorError(f"functions-framework exited with code {server.returncode}{tail}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return  # it answered (a GET is not an event): it is up
        except OSError:
            time.sleep(0.1)
    raise EmulatorError(f"functions-framework did not answer on {url} within {timeout:.0f} s")


def _tail(log: Path, lines: int = 20) -> str:
    """The last lines of a server's log (for an error message)."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
