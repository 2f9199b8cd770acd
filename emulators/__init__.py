"""Emulators for local runs and tests: the official Firestore and Pub/Sub emulators (started as
their Java processes), and the project's own Cloud Tasks (gRPC) and Compute/TPU (REST) emulators."""

from emulators.cloud_tasks import CloudTasksEmulator
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
    "CloudTasksEmulator",
    "ComputeEmulator",
    "EmulatorAdmin",
    "EmulatorError",
    "Emulators",
    "free_port",
    "missing_reason",
    "running",
    "start",
]
