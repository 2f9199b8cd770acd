"""CI's pytest (.ci/pytest, which .ci/run runs for every marker and for the whole suite): no test
collected, pytest's exit code 5, is a failure; every other exit code is pytest's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CI_PYTEST = Path(__file__).parents[2] / ".ci" / "pytest"
# No plugins (hypothesis, anyio) in the inner runs: they need none, and start in a fraction of
# the time.
ENV = {**os.environ, "PYTHON": sys.executable, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    """A suite of its own (not this project's): one passing test, marked ``fast``."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    fast: quick\n")
    (tmp_path / "test_one.py").write_text(
        "import pytest\n\n\n@pytest.mark.fast\ndef test_one():\n    pass\n"
    )
    return tmp_path


def ci_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CI_PYTEST), "-q", "-p", "no:cacheprovider", "--strict-markers",
         "-c", str(folder / "pytest.ini"), "--rootdir", str(folder), str(folder), *args],
        env=ENV,
        cwd=folder, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def test_a_marker_that_selects_tests_passes(suite: Path) -> None:
    run = ci_pytest(suite, "-m", "fast")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


def test_a_marker_that_selects_nothing_fails(suite: Path) -> None:
    plain = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
         str(suite / "pytest.ini"), "--rootdir", str(suite), str(suite), "-m", "not fast"],
        env=ENV, cwd=suite, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert plain.returncode == 5  # what pytest itself says: no test collected
    run = ci_pytest(suite, "-m", "not fast")
    assert run.returncode == 1
    assert "pytest collected no tests" in run.stderr


def test_a_suite_with_no_tests_fails(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    run = ci_pytest(tmp_path)
    assert run.returncode == 1
    assert "pytest collected no tests" in run.stderr


def test_other_exit_codes_are_pytests_own(suite: Path) -> None:
    (suite / "test_two.py").write_text("def test_two():\n    assert False\n")
    assert ci_pytest(suite).returncode == 1  # tests failed
    assert ci_pytest(suite, "--no-such-option").returncode == 4  # usage error
