"""``python -m emulators.cloud_tasks [--port N] [--certs PATH] [--dedup-window SECONDS]``: serve
the Cloud Tasks emulator standalone, on the system clock, until SIGINT/SIGTERM.

It prints ``CLOUD_TASKS_EMULATOR_HOST=HOST:PORT`` once it listens, and writes its token
certificates (``{kid: certificate PEM}``) to ``--certs`` when given.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from datetime import timedelta
from pathlib import Path
from types import FrameType

from emulators.cloud_tasks.backend import DEFAULT_DEDUP_WINDOW
from emulators.cloud_tasks.server import CloudTasksEmulator
from emulators.official import HOST, EmulatorError


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m emulators.cloud_tasks",
        description="Serve the Cloud Tasks v2 emulator until interrupted.",
    )
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--certs", type=Path, help="write {kid: certificate PEM} JSON here")
    parser.add_argument(
        "--dedup-window",
        type=float,
        default=DEFAULT_DEDUP_WINDOW.total_seconds(),
        metavar="SECONDS",
        help="how long a task name stays used after its task is gone",
    )
    options = parser.parse_args(argv)
    if options.dedup_window < 0:
        parser.error("--dedup-window cannot be negative")
    stopped = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    emulator = CloudTasksEmulator(
        options.host,
        options.port,
        dedup_window=timedelta(seconds=options.dedup_window),
        certs_path=options.certs,
    )
    try:
        emulator.start()
    except EmulatorError as error:
        print(f"cloud tasks emulator: {error}", file=sys.stderr)
        return 1
    try:
        print(f"CLOUD_TASKS_EMULATOR_HOST={emulator.address}", flush=True)
        while not stopped.wait(1.0):
            pass
    finally:
        emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
