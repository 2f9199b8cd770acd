"""The domain stays pure: it imports the standard library (minus clocks, randomness, ids and
I/O) and numpy, and nothing else. import-linter enforces the layers; this test also catches a
third-party package that no contract names. Every module of the domain is read, its
subpackages' (the planner's, ``domain/planner/`` and ``domain/planner/incremental/``) too."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import opendws.domain

DOMAIN = Path(opendws.domain.__file__).parent
IMPURE = {"time", "os", "random", "uuid", "socket", "subprocess", "secrets", "pathlib", "io"}
IMPURE |= {"threading", "asyncio", "logging"}
ALLOWED_THIRD_PARTY = {"numpy", "opendws"}
# The planner's parts: modules of a subpackage (and of its own, the incremental planner's),
# read like the rest.
PLANNER: tuple[str, ...] = ("verdicts", "shapes", "search", "blocks", "commitments")
PLANNER += tuple(
    f"incremental/{name}"
    for name in ("planner", "kept", "diff", "clock", "blocks", "layer", "walk", "stands", "rehold")
)


def sources() -> list[Path]:
    """Every module of the domain, its subpackages' included."""
    return sorted(DOMAIN.rglob("*.py"))


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_domain_imports_only_the_pure_standard_library_and_numpy() -> None:
    offenders = []
    for path in sources():
        for module in imported_modules(path):
            top = module.split(".")[0]
            pure_stdlib = top in sys.stdlib_module_names and top not in IMPURE
            if not (pure_stdlib or top in ALLOWED_THIRD_PARTY):
                offenders.append(f"{path.relative_to(DOMAIN)}: {module}")
            if top == "opendws" and not module.startswith("opendws.domain"):
                offenders.append(
                    f"{path.relative_to(DOMAIN)}: {module} (the domain depends on nothing above it)"
                )
    assert offenders == []


def test_the_domain_never_reads_the_clock() -> None:
    calls = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if node.func.attr in {"now", "utcnow", "today"} and owner_name in {"datetime", "date"}:
                calls.append(
                    f"{path.relative_to(DOMAIN)}:{node.lineno} {owner_name}.{node.func.attr}()"
                )
    assert calls == []


def test_the_planners_modules_are_among_those_read() -> None:
    read = {path.relative_to(DOMAIN).as_posix() for path in sources()}
    assert {f"planner/{name}.py" for name in PLANNER} <= read
