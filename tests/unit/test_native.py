"""``opendws.native`` tells which planner modules run compiled, and refuses none silently: a
compiled module older than its source (an editable install not rebuilt since an edit) is
named, so that the test suite can refuse to run it (tests/conftest.py)."""

from __future__ import annotations

import os
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from opendws import native


def package(root: Path, name: str, *, compiled: bool) -> tuple[Path, Path]:
    """A package ``name`` under ``root`` with a module ``grid``: its source and, if
    ``compiled``, a file where a compiled one would be (found, never loaded)."""
    folder = root / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    source = folder / "grid.py"
    source.write_text("CELLS = 1\n")
    extension = folder / f"grid{EXTENSION_SUFFIXES[0]}"
    if compiled:
        extension.write_bytes(b"")
    return source, extension


def test_a_compiled_module_newer_than_its_source_is_compiled_and_not_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, extension = package(tmp_path, "fresh_pkg", compiled=True)
    os.utime(source, (1_000, 1_000))
    os.utime(extension, (2_000, 2_000))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert native.compiled(["fresh_pkg.grid"]) == {"fresh_pkg.grid": True}
    assert native.stale(["fresh_pkg.grid"]) == []


def test_a_source_edited_after_its_module_was_compiled_is_named_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, extension = package(tmp_path, "edited_pkg", compiled=True)
    os.utime(extension, (1_000, 1_000))
    os.utime(source, (2_000, 2_000))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert native.stale(["edited_pkg.grid"]) == [f"edited_pkg.grid ({source})"]


def test_a_plain_module_is_neither_compiled_nor_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package(tmp_path, "plain_pkg", compiled=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert native.compiled(["plain_pkg.grid"]) == {"plain_pkg.grid": False}
    assert native.stale(["plain_pkg.grid"]) == []


def test_the_modules_named_are_the_ones_setup_compiles() -> None:
    setup = (Path(__file__).parents[2] / "setup.py").read_text()
    for module in native.COMPILED:
        assert f'"shared/{module.replace(".", "/")}.py"' in setup
    assert setup.count('"shared/opendws/') == len(native.COMPILED)
