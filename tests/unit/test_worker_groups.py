"""How README's test command shares the tests between its two pytest-xdist workers
(``--dist loadgroup``, pyproject's addopts): every end-to-end test in one group, so that no two
local stacks run at once, and every other test with the rest of its file."""

from __future__ import annotations

import tomllib

from tests.conftest import TESTS, xdist_group


def test_every_e2e_test_is_in_the_one_local_stack_group() -> None:
    assert xdist_group(TESTS / "e2e" / "test_local_stack.py", "e2e") == "local-stack"
    assert xdist_group(TESTS / "e2e" / "test_dashboard.py", "e2e") == "local-stack"


def test_any_other_test_is_grouped_with_its_file() -> None:
    one = xdist_group(TESTS / "integration" / "test_calendar_operations.py", "integration")
    assert one == "integration/test_calendar_operations.py"
    assert xdist_group(TESTS / "unit" / "test_agent.py", "unit") == "unit/test_agent.py"
    assert one != xdist_group(TESTS / "integration" / "test_tpu_vm_host.py", "integration")


def test_the_test_command_runs_in_two_workers_by_group() -> None:
    """pyproject's addopts, which README's test command runs with."""
    options = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())
    addopts = options["tool"]["pytest"]["ini_options"]["addopts"].split()
    assert addopts[addopts.index("-n") + 1] == "2"
    assert addopts[addopts.index("--dist") + 1] == "loadgroup"
