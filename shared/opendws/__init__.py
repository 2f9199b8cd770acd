"""opendws: an open, self-hostable Dynamic Workload Scheduler for accelerator capacity.

``opendws.Client`` (:mod:`opendws.client`) is the system from Python; it is imported when
first named, so that ``import opendws`` loads none of the services or adapters."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opendws.client import Client

__version__ = "0.1.0"
__all__ = ["Client", "__version__"]


def __getattr__(name: str) -> object:
    if name == "Client":
        from opendws.client import Client

        return Client
    raise AttributeError(f"module 'opendws' has no attribute {name!r}")
