"""``python -m emulators.cloud_tasks``: serve the emulator standalone."""

import sys

from emulators.cloud_tasks.backend import main

sys.exit(main(sys.argv[1:]))
