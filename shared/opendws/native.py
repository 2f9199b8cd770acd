"""Which of the planner's modules run compiled, and which compiled one is out of date.

An install with a C compiler at hand compiles the planner's modules with mypyc (see
``setup.py``), and Python then loads each from its extension module, beside its ``.py``, in
place of the source. An editable install compiles them in place, once: a source edited since
is not what runs until the project is installed again. The build records each source's digest
beside the compiled modules (:data:`RECORD`); :func:`stale` names the compiled modules whose
source no longer matches it, so that whoever runs them (the test suite does) can refuse to.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Sequence
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

# The modules setup.py compiles (its COMPILED, by module name).
COMPILED = ("opendws.domain.timeline", "opendws.domain.admission", "opendws.domain.incremental")
# Beside the compiled modules: module name → SHA-256 of its source as compiled.
RECORD = "compiled-sources.json"


def _origin(module: str) -> Path | None:
    """Where ``module`` is loaded from if it is a compiled extension module, else None."""
    spec = importlib.util.find_spec(module)
    origin = None if spec is None else spec.origin
    if origin is None or not origin.endswith(tuple(EXTENSION_SUFFIXES)):
        return None
    return Path(origin)


def compiled(modules: Sequence[str] = COMPILED) -> dict[str, bool]:
    """Each of ``modules``: whether it is loaded from a compiled extension module."""
    return {module: _origin(module) is not None for module in modules}


def stale(modules: Sequence[str] = COMPILED) -> list[str]:
    """The compiled ones of ``modules`` whose source beside them is not the one they were
    compiled from (its digest differs from the build's record, or the build recorded none),
    each as "module (source path)"."""
    found: list[str] = []
    for module in modules:
        origin = _origin(module)
        if origin is None:
            continue
        source = origin.parent / f"{module.rpartition('.')[2]}.py"
        record = origin.parent / RECORD
        recorded = json.loads(record.read_text()) if record.exists() else {}
        digest = hashlib.sha256(source.read_bytes()).hexdigest() if source.exists() else None
        if digest is not None and recorded.get(module) != digest:
            found.append(f"{module} ({source})")
    return found
