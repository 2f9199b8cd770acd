"""``python -m emulators [run -- COMMAND ...]``: the official emulators from a shell.

Without arguments, starts both, prints the variables that point real clients at them and runs
until interrupted. With ``run -- COMMAND``, runs COMMAND with those variables set and stops the
emulators when it ends, exiting with its code (2 if the emulators are not installed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from emulators.official import EmulatorError, missing_reason, running


def main(argv: list[str]) -> int:
    reason = missing_reason()
    if reason is not None:
        print(f"emulators: cannot start: {reason}", file=sys.stderr)
        return 2
    try:
        with running() as emulators:
            variables = emulators.environment()
            if argv[:1] == ["run"]:
                child = argv[2:] if argv[1:2] == ["--"] else argv[1:]
                if not child:
                    print("emulators: run needs a command: run -- COMMAND ...", file=sys.stderr)
                    return 2
                return subprocess.call(child, env={**os.environ, **variables})
            for name, value in variables.items():
                print(f"export {name}={value}", flush=True)
            while True:
                # Short sleeps: Ctrl-C may land on another thread, and Python runs its handler
                # only once the main thread runs again.
                time.sleep(0.5)
    except EmulatorError as error:
        print(f"emulators: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
