"""Shared test configuration: hypothesis profiles and the official emulators.

CI runs with ``HYPOTHESIS_PROFILE=ci``: derandomized (the same examples every run, so a red
build is reproducible) and with more examples than a developer's quick run.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from emulators import Emulators, missing_reason, running

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
