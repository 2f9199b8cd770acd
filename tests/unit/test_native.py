"""``opendws.native`` tells which planner modules run compiled, and lets none run out of date
silently: a compiled module whose source is not the one the build recorded (an editable
install not rebuilt since an edit) is named, so that the test suite can refuse to run it
(tests/conftest.py)."""

from __future__ import annotations

import hashlib
import json
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from opendws import native

SOURCE = "CELLS = 1\n"


def package(root: Path, name: str, *, compiled: bool, recorded: str | None = SOURCE) -> Path:
    """A package ``name`` under ``root`` with a module ``grid`` (its source returned) and, if
    ``compiled``, a file where a compiled one would be (found, never loaded) and the build's
    record of the source it was compiled from (``recorded``; None: no record)."""
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package(tmp_path, "fresh_pkg", compiled=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert native.compiled(["fresh_pkg.grid"]) == {"fresh_pkg.grid": True}
    assert native.stale(["fresh_pkg.grid"]) == []


def test_a_source_edited_after_its_module_was_compiled_is_named_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = package(tmp_path, "edited_pkg", compiled=True)
    source.write_text(SOURCE + "CELLS = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert native.stale(["edited_pkg.grid"]) == [f"edited_pkg.grid ({source})"]


def test_a_compiled_module_the_build_recorded_no_source_for_is_named_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = package(tmp_path, "unrecorded_pkg", compiled=True, recorded=None)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert native.stale(["unrecorded_pkg.grid"]) == [f"unrecorded_pkg.grid ({source})"]


def test_a_plain_module_is_neither_compiled_nor_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package(tmp_path, "plain_pkg", compiled=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert native.compiled(["plain_pkg.grid"]) == {"plain_pkg.grid": False}
    assert native.stale(["plain_pkg.grid"]) == []


def test_the_modules_and_the_record_named_are_the_ones_setup_builds() -> None:
    setup = (Path(__file__).parents[2] / "setup.py").read_text()
    for module in native.COMPILED:
        assert f'"shared/{module.replace(".", "/")}.py"' in setup
    assert setup.count('"shared/opendws/domain/') == len(native.COMPILED) + 1  # and the record
    assert f'RECORD = "shared/opendws/domain/{native.RECORD}"' in setup
