"""The MetricSnapshots contract, on the in-memory fake and on Firestore over the emulator:
what processes leave for the api's /metrics reads back whole, one snapshot per process, and
old ones are forgotten."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from opendws.adapters.telemetry import MemoryMetricSnapshots
from opendws.ports.telemetry import Buckets, MetricSnapshot, MetricSnapshots, labels_of_mapping
from tests.builders import NOW


@pytest.fixture(params=["memory", "firestore"])
def snapshots(request: pytest.FixtureRequest) -> Iterator[MetricSnapshots]:
    if request.param == "memory":
        yield MemoryMetricSnapshots()
        return
    project: str = request.getfixturevalue("emulator_project")
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    from opendws.adapters.firestore import FirestoreMetricSnapshots

    client = firestore.Client(project=project, credentials=AnonymousCredentials())
    yield FirestoreMetricSnapshots(client)
    client.close()


def _snapshot(instance: str, at_minutes: int, admitted: float) -> MetricSnapshot:
    labels = labels_of_mapping({"tenant": "vision", "pool": "us-central1-a/a3-highgpu-8g"})
    pending = labels_of_mapping({**dict(labels), "reason": ""})
    return MetricSnapshot(
        instance=instance,
        at=NOW + timedelta(minutes=at_minutes),
        values={"opendws_admitted_requests_total": {labels: admitted},
                "opendws_pending_requests": {pending: 0.0}},
        histograms={"opendws_admission_wait_time_seconds": {
            labels: Buckets(count=2, sum=12.5, counts=(0, 1, 1, 0))}},
    )  # fmt: skip


def test_a_snapshot_reads_back_whole(snapshots: MetricSnapshots) -> None:
    saved = _snapshot("reconcile-host-1-ab", 0, 3.0)
    snapshots.put(saved)
    assert snapshots.all() == [saved]


def test_a_process_has_one_snapshot_its_latest(snapshots: MetricSnapshots) -> None:
    snapshots.put(_snapshot("reconcile/1", 0, 1.0))  # a name with a slash is one document
    snapshots.put(_snapshot("timer-1", 1, 5.0))
    snapshots.put(_snapshot("reconcile/1", 2, 4.0))
    assert [(s.instance, s.values["opendws_admitted_requests_total"]) for s in snapshots.all()] == [
        ("timer-1", {(("pool", "us-central1-a/a3-highgpu-8g"), ("tenant", "vision")): 5.0}),
        ("reconcile/1", {(("pool", "us-central1-a/a3-highgpu-8g"), ("tenant", "vision")): 4.0}),
    ]


def test_snapshots_older_than_the_cutoff_are_forgotten(snapshots: MetricSnapshots) -> None:
    snapshots.put(_snapshot("gone", 0, 1.0))
    snapshots.put(_snapshot("live", 10, 1.0))
    assert snapshots.forget_before(NOW + timedelta(minutes=5)) == 1
    assert [s.instance for s in snapshots.all()] == ["live"]
