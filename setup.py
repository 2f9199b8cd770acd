"""Build opendws; its planner's modules are compiled with mypyc where a C compiler is at hand.

The admission core (``COMPILED``: the minute grid, the planner's parts in ``domain/planner/``,
the incremental planner's in ``domain/planner/incremental/``, and the full planner) is
compiled to C extension modules from the same annotated sources that mypy checks, by mypyc
(part of mypy), as one group. Everything else stays plain Python. The compiled modules plan exactly as the Python ones do (CI runs the
domain's tests both ways); they plan faster (see README, "The admission core"). A compiled
module is loaded in place of its ``.py`` beside it.

- ``OPENDWS_COMPILE=no``: install every module as plain Python (no compiler needed).
- ``OPENDWS_COMPILE=required``: fail the install if the modules cannot be compiled (CI).
- Otherwise a build that cannot compile them (no C compiler, no Python headers) warns and
  installs them as plain Python.

Every build first deletes the compiled modules an earlier editable install left in place.

An editable install compiles them in place: after editing one of them, install again
(``pip install -e .``); ``import opendws`` refuses to go on with a compiled module whose
source changed since (``opendws.native`` compares it with its digest recorded here).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.extension import Extension

COMPILED = [
    "shared/opendws/domain/timeline.py",
    "shared/opendws/domain/planner/verdicts.py",
    "shared/opendws/domain/planner/shapes.py",
    "shared/opendws/domain/planner/search.py",
    "shared/opendws/domain/planner/blocks.py",
    "shared/opendws/domain/planner/commitments.py",
    "shared/opendws/domain/admission.py",
    "shared/opendws/domain/planner/incremental/full.py",
    "shared/opendws/domain/planner/incremental/queue.py",
    "shared/opendws/domain/planner/incremental/kept.py",
    "shared/opendws/domain/planner/incremental/diff.py",
    "shared/opendws/domain/planner/incremental/clock.py",
    "shared/opendws/domain/planner/incremental/blocks.py",
    "shared/opendws/domain/planner/incremental/layer.py",
    "shared/opendws/domain/planner/incremental/stands.py",
    "shared/opendws/domain/planner/incremental/rehold.py",
    "shared/opendws/domain/planner/incremental/walk.py",
    "shared/opendws/domain/planner/incremental/planner.py",
    "shared/opendws/domain/planner/incremental/check.py",
]
GROUP = "opendws"  # the compiled modules' shared library: opendws__mypyc.<platform tag>.so
# Beside the compiled modules (above those of domain/planner/): each one's source digest as
# compiled (see opendws.native).
RECORD = "shared/opendws/domain/compiled-sources.json"
# The setup commands that build modules (others, such as egg_info, only describe the project).
BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "install", "develop"}
# mypyc type-checks what it compiles: with no configuration file (pyproject's names mypy
# plugins the build environment lacks), following the modules they import silently.
MYPYC_OPTIONS = [
    "--config-file=",
    "--python-version=3.11",
    "--follow-imports=silent",
    "--ignore-missing-imports",
]


def remove_compiled() -> None:
    """Delete the compiled modules an earlier editable install left beside the sources: Python
    would load them in place of the sources whether or not this build compiles them again.
    Every extension module under the record's folder goes, not only those ``COMPILED`` names:
    one a build compiled before its module moved, or left the list, would load in place of a
    source of the same name too."""
    root = Path(__file__).parent
    found = [*root.glob(f"{GROUP}__mypyc.*.so"), *root.glob(f"{GROUP}__mypyc.*.pyd")]
    found += [*(root / RECORD).parent.rglob("*.so"), *(root / RECORD).parent.rglob("*.pyd")]
    for compiled in [*found, root / RECORD]:
        compiled.unlink(missing_ok=True)


def record_sources() -> None:
    """Write each compiled module's source digest (SHA-256) where opendws.native reads it:
    a compiled module whose source no longer has that digest is out of date."""
    root = Path(__file__).parent
    digests = {
        path.removeprefix("shared/").removesuffix(".py").replace("/", "."): hashlib.sha256(
            (root / path).read_bytes()
        ).hexdigest()
        for path in COMPILED
    }
    (root / RECORD).write_text(json.dumps(digests, indent=2, sort_keys=True) + "\n")


def compiled_modules() -> list[Extension]:
    """The extension modules to build, per ``OPENDWS_COMPILE`` (see the module docstring)."""
    mode = os.environ.get("OPENDWS_COMPILE", "auto")
    if mode not in {"auto", "no", "required"}:
        raise SystemExit(f"OPENDWS_COMPILE is {mode!r}: expected auto, no or required")
    if not BUILDS & set(sys.argv[1:]):
        return []  # metadata only (egg_info, dist_info: pip asks for it first): no build
    remove_compiled()
    if mode == "no":
        return []
    try:
        from mypyc.build import mypycify

        modules = mypycify([*MYPYC_OPTIONS, *COMPILED], opt_level="3", group_name=GROUP)
    except (Exception, SystemExit) as error:
        if mode == "required":
            raise
        print(f"opendws: the planner is not compiled ({error!r}); plain Python", file=sys.stderr)
        return []
    record_sources()
    if mode == "auto":
        for module in modules:  # a failed compile leaves the plain Python modules in place
            module.optional = True
    return modules


setup(ext_modules=compiled_modules())
