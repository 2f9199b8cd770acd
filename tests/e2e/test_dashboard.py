"""The dashboard in headless Chromium: the ``api`` function under functions-framework serves
the page and its JSON from Firestore (official emulator) with a seeded state; the rendered
page shows each pool's timeline with the seeded runs and planned starts, the queue and usage.
A screenshot is kept in tests/artifacts/dashboard.png."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from emulators import Emulators
from emulators.functions import serving
from opendws.adapters.memory import MemoryCapacityProvider, MemoryEventBus
from opendws.clock import ManualClock
from opendws.ports import Configuration, Providers
from opendws.service.reconcile import ReconcileService
from tests.builders import A3, H100, MINUTE, flex, pool
from tests.world import submit, tenants_for

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
ZONE = "us-central1-a"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=8000"]  # fmt: skip


@pytest.fixture
def dashboard(official_emulators: Emulators, emulator_project: str) -> Iterator[str]:
    """The api function on a seeded project: one run and one planned start in one pool."""
    if CHROMIUM is None:
        pytest.skip("headless Chromium is not installed (Debian package: chromium)")
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    from opendws.adapters.firestore import FirestoreConfigStore, FirestoreRequestStore

    client = firestore.Client(project=emulator_project, credentials=AnonymousCredentials())
    store, config = FirestoreRequestStore(client), FirestoreConfigStore(client)
    config.save(Configuration(pools=(pool(zone=ZONE, capacity=4),),
                              tenants=tenants_for(H100, names=("vision", "speech"))))  # fmt: skip
    now = datetime.now(UTC)
    clock = ManualClock(now)
    cloud = MemoryCapacityProvider(clock)
    cloud.set_stock(ZONE, A3, 4)
    submit(store, flex("long-job", tenant="vision", vm_count=4, hours=3, submitted_at=now,
                       locations=(ZONE,)))  # fmt: skip
    submit(store, flex("short-job", tenant="speech", vm_count=4, hours=2,
                       submitted_at=now + MINUTE, locations=(ZONE,)))  # fmt: skip
    providers = Providers(mig_flex=cloud, tpu=cloud, calendar=cloud)
    ReconcileService(store, config, providers, MemoryEventBus(), clock, holder="seed").run_pass()
    environment = {**official_emulators.environment(), "OPENDWS_PROJECT": emulator_project,
                   "OPENDWS_API_KEYS": "admin:dash-key"}  # fmt: skip
    with serving("api", "http", environment) as url:
        yield url + "?key=dash-key"
    client.close()


def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args], capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_dashboard_renders_the_seeded_timeline(dashboard: str, tmp_path: Path) -> None:
    dom = chromium("--dump-dom", dashboard, tmp=tmp_path).stdout
    assert 'data-ready="1"' in dom, dom[-2000:]
    assert f'data-pool="{ZONE}/{A3}"' in dom
    assert 'class="span PROVISIONING" ' in dom or 'class="span PROVISIONING"' in dom
    assert 'data-request="long-job"' in dom  # its planned start, held in the plan
    assert 'data-request="short-job"' in dom
    assert "NO_CAPACITY_UNTIL" in dom  # the queue shows why it waits
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    shot.unlink(missing_ok=True)
    chromium(f"--screenshot={shot}", "--window-size=1100,760", dashboard, tmp=tmp_path)
    assert shot.exists()
    assert shot.stat().st_size > 10_000
