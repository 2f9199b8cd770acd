"""The functions' upload (infra/package.py): reproducible to the byte, complete, and
self-contained — functions-framework finds every function in it without the repository."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def package_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("infra_package", ROOT / "infra" / "package.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_of_sources(target: Path) -> Path:
    """The files the package is built from, copied with fresh timestamps and a stray cache."""
    shutil.copy(ROOT / "pyproject.toml", target / "pyproject.toml")
    shutil.copytree(ROOT / "functions", target / "functions", copy_function=shutil.copy)
    shutil.copytree(
        ROOT / "shared" / "opendws", target / "shared" / "opendws", copy_function=shutil.copy,
        ignore=shutil.ignore_patterns("__pycache__", "*.so", "compiled-sources.json"),
    )  # fmt: skip
    cache = target / "shared" / "opendws" / "__pycache__"
    cache.mkdir()
    (cache / "stray.cpython-311.pyc").write_bytes(b"\x00")
    # A planner module compiled here (setup.py): built for this machine, never uploaded.
    domain = target / "shared" / "opendws" / "domain"
    (domain / "timeline.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (domain / "compiled-sources.json").write_text('{"opendws.domain.timeline": "0"}\n')
    return target


def test_the_same_sources_give_the_same_bytes_whenever_built(tmp_path: Path) -> None:
    package = package_module()
    first = package.build(tmp_path / "a.zip")
    (tmp_path / "copy").mkdir()
    copy = copy_of_sources(tmp_path / "copy")
    os.utime(copy / "functions" / "main.py", (1_000_000_000, 1_000_000_000))
    second = package.build(tmp_path / "b.zip", root=copy)
    assert first == second
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()
    assert not (tmp_path / "b.partial").exists()


def test_a_changed_source_changes_the_package(tmp_path: Path) -> None:
    package = package_module()
    (tmp_path / "copy").mkdir()
    copy = copy_of_sources(tmp_path / "copy")
    before = package.build(tmp_path / "a.zip", root=copy)
    with (copy / "functions" / "main.py").open("a") as main:
        main.write("\n# changed\n")
    assert package.build(tmp_path / "b.zip", root=copy) != before


def test_it_holds_main_the_package_and_the_runtime_requirements(tmp_path: Path) -> None:
    package = package_module()
    package.build(tmp_path / "functions.zip")
    with zipfile.ZipFile(tmp_path / "functions.zip") as bundle:
        names = set(bundle.namelist())
        requirements = bundle.read("requirements.txt").decode().splitlines()
        infos = bundle.infolist()
    assert {"main.py", "requirements.txt", "opendws/__init__.py", "opendws/bootstrap.py"} <= names
    assert {"opendws/dashboard.html", "opendws/py.typed"} <= names
    assert any(name.startswith("opendws/examples/") for name in names)
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]
    assert not [name for name in names if name.endswith((".so", ".pyd"))]
    assert "opendws/domain/compiled-sources.json" not in names
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [line for line in requirements if not line.startswith("#")] == dependencies
    assert [info.filename for info in infos] == sorted(info.filename for info in infos)
    assert {info.date_time for info in infos} == {(1980, 1, 1, 0, 0, 0)}


def test_functions_framework_serves_every_function_from_the_unpacked_package(
    tmp_path: Path,
) -> None:
    package = package_module()
    package.build(tmp_path / "functions.zip")
    unpacked = tmp_path / "unpacked"
    with zipfile.ZipFile(tmp_path / "functions.zip") as bundle:
        bundle.extractall(unpacked)
    probe = (
        "import functions_framework, opendws, sys\n"
        "for target in ('intake', 'reconcile', 'timer', 'ci_hook', 'api', 'agent'):\n"
        "    functions_framework.create_app(target=target, source='main.py')\n"
        "import opendws\n"
        "print(opendws.__file__)\n"
    )
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=unpacked, env=environment,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # The package's own copy of opendws, not the repository's.
    assert Path(result.stdout.strip()).resolve().is_relative_to(unpacked.resolve())
