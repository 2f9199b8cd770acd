"""Load a benchmark script of ``bench/`` as a module, for tests that reuse its workload
builders (the scripts are not a package; they import each other from their folder)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(script: str, name: str) -> ModuleType:
    """``bench/<script>.py`` as the module ``name`` (registered in ``sys.modules``)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # a benchmark imports its neighbours by name
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{script}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
