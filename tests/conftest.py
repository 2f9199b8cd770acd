"""Shared test configuration: hypothesis profiles, the suites' markers and the official
emulators.

CI runs with ``HYPOTHESIS_PROFILE=ci``: derandomized (the same examples every run, so a red
build is reproducible) and with more examples than a developer's quick run.

Every test is marked by the folder it lives in (``tests/unit`` → ``unit``, and so on for
``property``, ``contract``, ``integration`` and ``e2e``), so ``pytest -m unit`` runs a suite
without naming its files. Tests that need an emulator are marked ``emulator`` as well: all of
``integration`` and ``e2e``, and the contract tests on a real adapter. A contract suite runs on
its in-memory fake and on the real adapter through a parametrized fixture whose fake parameter
is named ``"memory"`` (alone, or as a member of a tuple): a parametrized contract test with no
such parameter is taken to need an emulator, as is one that asks for the official emulators.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from emulators import Emulators, missing_reason, running
from opendws import native

# pytest-xdist starts its workers with COLUMNS and LINES set to the controller's terminal size
# (80 × 24 where it has none). The CLI reads COLUMNS as the user's own choice of width (see
# opendws.cli.common), and the tests that run it, in process or as a subprocess, expect what one
# process sees: a worker drops them.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "dev",
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

TESTS = Path(__file__).parent
SUITES = ("unit", "property", "contract", "integration", "e2e")
NEED_EMULATORS = ("integration", "e2e")
FAKE = "memory"  # a contract fixture's parameter for the in-memory fake
EMULATOR_FIXTURES = frozenset({"official_emulators", "emulator_project"})


def pytest_report_header(config: pytest.Config) -> str:
    """Whether the planner's modules run compiled (mypyc) or as plain Python."""
    modules = native.compiled()
    if all(modules.values()):
        return "opendws planner: compiled (mypyc)"
    if not any(modules.values()):
        return "opendws planner: plain Python"
    return "opendws planner: compiled in part: " + ", ".join(m for m, c in modules.items() if c)


def suite_of(path: Path) -> str:
    """The suite a test file belongs to: its folder under ``tests/``."""
    parts = path.relative_to(TESTS).parts if path.is_relative_to(TESTS) else ()
    if len(parts) < 2 or parts[0] not in SUITES:
        raise pytest.UsageError(
            f"{path}: a test lives in one of tests/{{{','.join(SUITES)}}}/ (its folder marks it)"
        )
    return parts[0]


def asks_for_emulators(item: pytest.Item) -> bool:
    return bool(EMULATOR_FIXTURES & set(getattr(item, "fixturenames", ())))


def needs_emulator(item: pytest.Item, suite: str) -> bool:
    """Whether a test needs an emulator: every integration and e2e test; a contract test that
    asks for the official emulators, or is parametrized with no ``"memory"`` parameter (alone or
    in a tuple)."""
    if suite in NEED_EMULATORS:
        return True
    if suite != "contract":
        return False
    if asks_for_emulators(item):
        return True
    callspec = getattr(item, "callspec", None)
    return (
        callspec is not None
        and bool(callspec.params)
        and not any(
            value == FAKE or (isinstance(value, tuple) and FAKE in value)
            for value in callspec.params.values()
        )
    )


def xdist_group(path: Path, suite: str) -> str:
    """The worker group of a test (pytest-xdist's ``--dist loadgroup``): every e2e test in one,
    since each runs a whole local stack and two at once on a small machine starve each other;
    any other test with the rest of its file, whose module fixtures (an emulator-backed
    service, a stack) are then set up once."""
    return "local-stack" if suite == "e2e" else str(path.relative_to(TESTS))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its suite, and ``emulator`` where it needs one. A unit or property
    test that asks for the official emulators is refused: those suites never start one."""
    del config
    for item in items:
        suite = suite_of(item.path)
        item.add_marker(suite)
        item.add_marker(pytest.mark.xdist_group(xdist_group(item.path, suite)))
        if needs_emulator(item, suite):
            item.add_marker("emulator")
        elif suite in ("unit", "property") and asks_for_emulators(item):
            raise pytest.UsageError(
                f"{item.nodeid} uses the official emulators: it belongs in tests/integration"
            )


@pytest.fixture(scope="session")
def official_emulators() -> Iterator[Emulators]:
    """The official Firestore and Pub/Sub emulators for the whole session, with
    ``FIRESTORE_EMULATOR_HOST`` and ``PUBSUB_EMULATOR_HOST`` set; skipped, with the reason,
    where they are not installed."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(f"official emulators unavailable: {reason}")
    with running() as emulators:
        saved = {name: os.environ.get(name) for name in emulators.environment()}
        os.environ.update(emulators.environment())
        try:
            yield emulators
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.fixture
def emulator_project(official_emulators: Emulators, request: pytest.FixtureRequest) -> str:
    """A project id of the test's own, emptied before the test runs."""
    project = "test-" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]
    official_emulators.reset(project)
    return project
