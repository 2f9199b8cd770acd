"""Emulators for local runs and tests: the official Firestore and Pub/Sub emulators (started as
their Java processes), and, later, the project's own Cloud Tasks and Compute/TPU emulators."""

from emulators.compute import ComputeEmulator, EmulatorAdmin
from emulators.official import (
    EmulatorError,
    Emulators,
    free_port,
    missing_reason,
    running,
    start,
)

__all__ = [
    "ComputeEmulator",
    "EmulatorAdmin",
    "EmulatorError",
    "Emulators",
    "free_port",
    "missing_reason",
    "running",
    "start",
]
