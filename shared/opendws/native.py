"""Which of the planner's modules run compiled, and refusing any that is out of date.

An install with a C compiler at hand compiles the planner's modules with mypyc (see
``setup.py``), and Python then loads each from its extension module, beside its ``.py``, in
place of the source. An editable install compiles them in place, once: a source edited since
is not what runs until the project is installed again. The build records each source's digest
in one file (:data:`RECORD`), beside the compiled modules of a package and above those of its
subpackages; :func:`stale` names the compiled modules whose source no longer matches it, and
``import opendws`` refuses to go on with any (:func:`refuse_stale`). Everything here reads
files only: nothing is imported.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

# The modules setup.py compiles (its COMPILED, by module name).
COMPILED = (
    "opendws.domain.timeline",
    "opendws.domain.planner.verdicts",
    "opendws.domain.planner.shapes",
    "opendws.domain.planner.search",
    "opendws.domain.planner.blocks",
    "opendws.domain.planner.commitments",
    "opendws.domain.admission",
    "opendws.domain.planner.incremental.full",
    "opendws.domain.planner.incremental.queue",
    "opendws.domain.planner.incremental.kept",
    "opendws.domain.planner.incremental.diff",
    "opendws.domain.planner.incremental.clock",
    "opendws.domain.planner.incremental.blocks",
    "opendws.domain.planner.incremental.layer",
    "opendws.domain.planner.incremental.stands",
    "opendws.domain.planner.incremental.rehold",
    "opendws.domain.planner.incremental.walk",
    "opendws.domain.planner.incremental.planner",
    "opendws.domain.planner.incremental.check",
)
# Beside the compiled modules, or in a folder above theirs: module name → SHA-256 of its
# source as compiled.
RECORD = "compiled-sources.json"
# The folder opendws is imported from (its modules' names are paths below it).
ROOT = Path(__file__).resolve().parent.parent


def _extension(module: str, root: Path) -> Path | None:
    """The compiled extension module Python loads for ``module`` (a name below ``root``) in
    place of its source, or None: any of the interpreter's extension suffixes, tried in the
    order the import system tries them, before the source."""
    stem = root.joinpath(*module.split("."))
    for suffix in EXTENSION_SUFFIXES:
        candidate = stem.with_name(stem.name + suffix)
        if candidate.exists():
            return candidate
    return None


def _record(extension: Path, root: Path) -> Path | None:
    """The build's record for a compiled module: the nearest beside it or in a folder above
    it, up to ``root`` (one record covers the modules of a package and its subpackages)."""
    for folder in extension.parents:
        if folder != root and root not in folder.parents:
            return None
        record = folder / RECORD
        if record.exists():
            return record
    return None


def compiled(modules: Sequence[str] = COMPILED, root: Path = ROOT) -> dict[str, bool]:
    """Each of ``modules``: whether it is loaded from a compiled extension module."""
    return {module: _extension(module, root) is not None for module in modules}


def stale(modules: Sequence[str] = COMPILED, root: Path = ROOT) -> list[str]:
    """The compiled ones of ``modules`` whose source beside them is not the one they were
    compiled from (its digest differs from the build's record, or the build recorded none),
    each as "module (source path)"."""
    found: list[str] = []
    for module in modules:
        extension = _extension(module, root)
        if extension is None:
            continue
        source = extension.with_name(f"{module.rpartition('.')[2]}.py")
        record = _record(extension, root)
        recorded = json.loads(record.read_text()) if record is not None else {}
        digest = hashlib.sha256(source.read_bytes()).hexdigest() if source.exists() else None
        if digest is not None and recorded.get(module) != digest:
            found.append(f"{module} ({source})")
    return found


class StaleCompiledModule(ImportError):
    """A compiled module would run in place of a source it was not built from."""


def refuse_stale() -> None:
    """Raise :class:`StaleCompiledModule`, saying what to do, if any compiled planner module
    was built from another source than the one beside it."""
    found = stale()
    if found:
        raise StaleCompiledModule(
            "compiled modules were built from another source than the one beside them, and"
            f" would run in its place: {', '.join(found)}. Install again"
            " (pip install -e '.[dev]'), or install plain Python"
            " (OPENDWS_COMPILE=no pip install -e '.[dev]')"
        )
