"""The ConfigStore contract, on the in-memory fake and on Firestore over the emulator."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from opendws.adapters.memory import MemoryConfigStore
from opendws.domain.model import PolicySettings, QueueingStrategy
from opendws.ports import ADMIN_ACCESS, AccessRule, ConfigStore, Configuration
from tests.builders import H100, V5E, pool, quota, tenant, tpu_pool


@pytest.fixture(params=["memory", "firestore"])
def config(request: pytest.FixtureRequest) -> Iterator[ConfigStore]:
    if request.param == "memory":
        yield MemoryConfigStore()
        return
    project: str = request.getfixturevalue("emulator_project")
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    from opendws.adapters.firestore import FirestoreConfigStore

    client = firestore.Client(project=project, credentials=AnonymousCredentials())
    yield FirestoreConfigStore(client)
    client.close()


def test_an_unsaved_configuration_is_empty(config: ConfigStore) -> None:
    assert config.load() == Configuration()


def test_a_saved_configuration_reads_back_whole(config: ConfigStore) -> None:
    saved = Configuration(
        pools=(pool(zone="us-central1-a", capacity=4), tpu_pool(zone="us-west4-a")),
        tenants=(
            tenant("vision", quota(H100, 32, 16), quota(V5E, 64), cohort="research"),
            tenant("ci", quota(H100, 8), strict_fifo=True),
        ),
        policy=PolicySettings(aging_half_life=timedelta(hours=3)),
        access=(
            AccessRule(principal="alice@example.com", tenant="vision"),
            AccessRule(principal="domain:example.com", tenant="ci"),
            AccessRule(principal="ops@example.com", tenant=ADMIN_ACCESS),
        ),
    )
    config.save(saved)
    assert config.load() == saved
    assert config.load().tenants[1].queueing is QueueingStrategy.STRICT_FIFO
    config.save(Configuration(pools=saved.pools[:1]))
    assert config.load() == Configuration(pools=saved.pools[:1])
