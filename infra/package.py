"""Build the functions' upload: ``functions/main.py``, the ``opendws`` package from ``shared/``
and a ``requirements.txt`` of the project's runtime dependencies, as one zip file.

The zip is reproducible: the same sources give the same bytes on any machine and at any time
(entries sorted, fixed timestamps and modes, no caches), so Terraform, which names the uploaded
object by the zip's hash, redeploys the functions only when their code or dependencies change.

    python infra/package.py [--output infra/build/opendws-functions.zip]

prints the zip's path and SHA-256.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = ROOT / "infra" / "build" / "opendws-functions.zip"
# What never goes into the upload: caches and compiled files (bytecode, and the planner's
# modules an install here compiled for this machine's Python: the functions run the sources).
SKIPPED_PARTS = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
SKIPPED_SUFFIXES = {".pyc", ".pyo", ".so", ".pyd"}
SKIPPED_NAMES = {"compiled-sources.json"}  # what those compiled modules were built from
# 1980-01-01, the earliest time a zip entry can carry.
FIXED_TIME = (1980, 1, 1, 0, 0, 0)


def requirements(root: Path = ROOT) -> str:
    """requirements.txt: the runtime dependencies of pyproject.toml, in its order."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    lines = ["# The runtime dependencies of opendws (pyproject.toml), for Cloud Build."]
    lines += list(project["dependencies"])
    return "\n".join(lines) + "\n"


def sources(root: Path = ROOT) -> Iterator[tuple[str, bytes]]:
    """(name in the zip, content) of every file the functions need."""
    yield "main.py", (root / "functions" / "main.py").read_bytes()
    yield "requirements.txt", requirements(root).encode()
    package = root / "shared" / "opendws"
    for path in sorted(package.rglob("*")):
        relative = path.relative_to(package.parent)
        if path.is_dir() or SKIPPED_PARTS & set(relative.parts):
            continue
        if path.suffix in SKIPPED_SUFFIXES or path.name in SKIPPED_NAMES:
            continue
        yield relative.as_posix(), path.read_bytes()


def build(output: Path = DEFAULT_OUTPUT, root: Path = ROOT) -> str:
    """Write the zip to ``output``; return its SHA-256 (hex)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    entries = sorted(sources(root))
    names = [name for name, _ in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"two files would have the same name in the zip: {names}")
    partial = output.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w") as bundle:
        for name, content in entries:
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # Unix, whatever builds it
            info.external_attr = 0o100644 << 16  # a regular file, rw-r--r--
            bundle.writestr(info, content, compresslevel=9)
    partial.replace(output)  # never leave a half-written zip under the real name
    return hashlib.sha256(output.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    arguments = parser.parse_args(argv)
    digest = build(arguments.output)
    print(f"{arguments.output}  sha256:{digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
