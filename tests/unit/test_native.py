"""``opendws.native`` tells which planner modules run compiled, and lets none run out of date
silently: a compiled module whose source is not the one the build recorded (an editable
install not rebuilt since an edit) is named, and ``import opendws`` refuses to go on."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from opendws import native

SOURCE = "CELLS = 1\n"


def package(root: Path, name: str, *, compiled: bool, recorded: str | None = SOURCE) -> Path:
    """A package ``name`` under ``root`` with a module ``grid`` (its source returned) and, if
    ``compiled``, a file where a compiled one would be and the build's record of the source
    it was compiled from (``recorded``; None: no record)."""
    folder = root / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    source = folder / "grid.py"
    source.write_text(SOURCE)
    if compiled:
        (folder / f"grid{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
        if recorded is not None:
            digest = hashlib.sha256(recorded.encode()).hexdigest()
            (folder / native.RECORD).write_text(json.dumps({f"{name}.grid": digest}))
    return source


def test_a_compiled_module_built_from_its_source_is_compiled_and_not_stale(
    tmp_path: Path,
) -> None:
    package(tmp_path, "fresh", compiled=True)
    assert native.compiled(["fresh.grid"], tmp_path) == {"fresh.grid": True}
    assert native.stale(["fresh.grid"], tmp_path) == []


def test_a_source_edited_after_its_module_was_compiled_is_named_stale(tmp_path: Path) -> None:
    source = package(tmp_path, "edited", compiled=True)
    source.write_text(SOURCE + "CELLS = 2\n")
    assert native.stale(["edited.grid"], tmp_path) == [f"edited.grid ({source})"]


def test_a_compiled_module_the_build_recorded_no_source_for_is_named_stale(
    tmp_path: Path,
) -> None:
    source = package(tmp_path, "unrecorded", compiled=True, recorded=None)
    assert native.stale(["unrecorded.grid"], tmp_path) == [f"unrecorded.grid ({source})"]


@pytest.mark.parametrize("edited", [False, True], ids=["built from it", "edited since"])
def test_a_compiled_module_of_a_subpackage_is_judged_by_the_record_above_it(
    tmp_path: Path, edited: bool
) -> None:
    """The build writes one record, in the package's folder: a module of a subpackage (the
    planner's, in ``domain/planner/``) compiled from its source is not stale, and one whose
    source changed since is."""
    package(tmp_path, "outer", compiled=False)
    inner = tmp_path / "outer" / "inner"
    inner.mkdir()
    (inner / "__init__.py").write_text("")
    source = inner / "grid.py"
    source.write_text(SOURCE)
    (inner / f"grid{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()
    (tmp_path / "outer" / native.RECORD).write_text(json.dumps({"outer.inner.grid": digest}))
    if edited:
        source.write_text(SOURCE + "CELLS = 2\n")
    assert native.compiled(["outer.inner.grid"], tmp_path) == {"outer.inner.grid": True}
    expected = [f"outer.inner.grid ({source})"] if edited else []
    assert native.stale(["outer.inner.grid"], tmp_path) == expected


def test_a_plain_module_is_neither_compiled_nor_stale(tmp_path: Path) -> None:
    package(tmp_path, "plain", compiled=False)
    assert native.compiled(["plain.grid"], tmp_path) == {"plain.grid": False}
    assert native.stale(["plain.grid"], tmp_path) == []


@pytest.mark.parametrize("edited", [False, True], ids=["built from it", "edited since"])
def test_import_opendws_refuses_a_compiled_planner_module_built_from_another_source(
    tmp_path: Path, edited: bool
) -> None:
    """A copy of the package whose timeline module is "compiled" (a file where Python would
    load it from, never loaded here) from the source beside it imports; once that source is
    edited, ``import opendws`` fails, naming the module and what to do."""
    copy = tmp_path / "opendws"
    domain = copy / "domain"
    domain.mkdir(parents=True)
    shipped = Path(native.__file__).parent
    for name in ("__init__.py", "native.py"):
        (copy / name).write_bytes((shipped / name).read_bytes())
    timeline = domain / "timeline.py"
    timeline.write_bytes((shipped / "domain" / "timeline.py").read_bytes())
    (domain / f"timeline{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    digest = hashlib.sha256(timeline.read_bytes()).hexdigest()
    (domain / native.RECORD).write_text(json.dumps({"opendws.domain.timeline": digest}))
    if edited:
        timeline.write_text(timeline.read_text() + "\n# edited\n")
    result = subprocess.run(
        [sys.executable, "-c", "import opendws"],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
    )
    if not edited:
        assert result.returncode == 0, result.stderr
        return
    assert result.returncode != 0
    assert "StaleCompiledModule" in result.stderr
    assert f"opendws.domain.timeline ({timeline})" in result.stderr
    assert "Install again" in result.stderr


def test_the_modules_and_the_record_named_are_the_ones_setup_builds() -> None:
    setup = (Path(__file__).parents[2] / "setup.py").read_text()
    for module in native.COMPILED:
        assert f'"shared/{module.replace(".", "/")}.py"' in setup
    assert setup.count('"shared/opendws/domain/') == len(native.COMPILED) + 1  # and the record
    assert f'RECORD = "shared/opendws/domain/{native.RECORD}"' in setup


def test_every_module_of_the_planners_package_is_compiled() -> None:
    """The planner's parts (``domain/planner/`` and its subpackage, the incremental planner's,
    but their docstring-only ``__init__``) are compiled with the modules that import them, so
    none runs as plain Python beside compiled callers, and an edited one is refused until the
    build runs again."""
    planner = Path(native.__file__).parent / "domain" / "planner"
    modules = {
        ".".join(("opendws.domain.planner", *path.relative_to(planner).with_suffix("").parts))
        for path in planner.rglob("*.py")
        if path.name != "__init__.py"
    }
    assert modules <= set(native.COMPILED)
    assert "opendws.domain.planner.search" in native.COMPILED
    assert "opendws.domain.planner.incremental.walk" in native.COMPILED
    assert "opendws.domain.incremental" not in native.COMPILED
