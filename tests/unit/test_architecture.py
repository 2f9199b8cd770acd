"""The layers contract (pyproject.toml, checked by import-linter in CI) covers every module:
a module that no layer names would be free to import anything, so a new module must be placed
before it lands. Also pins the contracts the architecture relies on by name."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"opendws": ROOT / "shared" / "opendws", "emulators": ROOT / "emulators"}


def importlinter() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
    settings: dict[str, Any] = config["tool"]["importlinter"]
    return settings


def layered() -> list[str]:
    """Every module the layers contract names (a package stands for all its modules)."""
    layers = next(c for c in importlinter()["contracts"] if c["type"] == "layers")["layers"]
    names: list[str] = []
    for layer in layers:
        names += [part.strip().strip("()") for part in layer.split("|")]
    return names


def modules() -> list[str]:
    """Every module of the two packages, but their roots."""
    found = []
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            if len(parts) > 1:
                found.append(".".join(parts))
    return found


def test_every_module_of_opendws_and_emulators_is_in_exactly_one_layer() -> None:
    names = layered()
    assert len(names) == len(set(names))
    unplaced = []
    for module in modules():
        homes = [name for name in names if module == name or module.startswith(name + ".")]
        if len(homes) != 1:
            unplaced.append((module, homes))
    assert unplaced == []


def test_the_contracts_cover_both_packages_and_keep_google_and_pydantic_in_their_place() -> None:
    settings = importlinter()
    assert settings["root_packages"] == ["opendws", "emulators"]
    forbidden: dict[str, set[str]] = {}
    for contract in settings["contracts"]:
        if contract["type"] == "forbidden":
            for module in contract["source_modules"]:
                forbidden.setdefault(module, set()).update(contract["forbidden_modules"])
    assert "google" in forbidden["opendws.bootstrap"]  # adapters build their own clients
    assert "pydantic" in forbidden["opendws.service"]
    assert {"google", "pydantic", "time", "os"} <= forbidden["opendws.domain"]


def test_the_planners_layers_place_every_module_of_its_package() -> None:
    """The planner's own layers contract names each of its parts (``domain/planner/``, the
    incremental planner's phases in ``domain/planner/incremental/`` among them, each by its
    module) and the full pass, the incremental planner's phases above it: a new part must be
    placed among them."""
    contract = next(
        c for c in importlinter()["contracts"] if c["name"].startswith("The planner's layers")
    )
    names = [part.strip() for layer in contract["layers"] for part in layer.split("|")]
    planner = [m for m in modules() if m.startswith("opendws.domain.planner.")]
    # A subpackage (its __init__ a docstring only) is placed by its modules.
    parts = [m for m in planner if not any(other.startswith(m + ".") for other in planner)]
    assert "opendws.domain.planner.incremental.planner" in parts
    assert sorted(parts) == sorted(n for n in names if n.startswith("opendws.domain.planner."))
    incremental = [n for n in names if n.startswith("opendws.domain.planner.incremental.")]
    assert names[0] == "opendws.domain.planner.incremental.planner"
    assert names[: len(incremental) + 1] == [*incremental, "opendws.domain.admission"]
