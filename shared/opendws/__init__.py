"""opendws: an open, self-hostable Dynamic Workload Scheduler for accelerator capacity.

``opendws.Client`` (:mod:`opendws.client`) is the system from Python; it is imported when
first named, so that ``import opendws`` loads none of the services or adapters. Importing it
fails (:class:`opendws.native.StaleCompiledModule`) where a compiled planner module is out of
date (see :mod:`opendws.native`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opendws.native import refuse_stale

# A compiled planner module built from another source than the one beside it would run in
# its place (an editable install not rebuilt since an edit): refuse, saying what to do.
refuse_stale()

if TYPE_CHECKING:
    from opendws.client import Client

__version__ = "0.1.0"
__all__ = ["Client", "__version__"]


def __getattr__(name: str) -> object:
    if name == "Client":
        from opendws.client import Client

        return Client
    raise AttributeError(f"module 'opendws' has no attribute {name!r}")
