"""The Cloud Tasks v2 emulator, a package: see :mod:`emulators.cloud_tasks.backend`."""

from emulators.cloud_tasks.backend import ISSUER, CloudTasksEmulator, Dispatch, RetryPolicy

__all__ = ["ISSUER", "CloudTasksEmulator", "Dispatch", "RetryPolicy"]
