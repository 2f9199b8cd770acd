"""A request's ``run`` stored in Firestore (official emulator) and read back: the job as asked,
its secrets as Secret Manager version names only; a request without one reads as capacity
only, as documents written before ``run`` existed do."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from emulators import Emulators
from opendws.domain import EndsWhen, RunSpec
from opendws.ports import RequestStore, accepted
from tests.builders import NOW, flex

HF = "projects/my-proj/secrets/vision-hf/versions/latest"
RUN = RunSpec.of(
    ["torchrun", "--nnodes", "2", "train.py"],
    image="us-docker.pkg.dev/my-proj/ml/trainer:1.4",
    env={"WANDB_MODE": "offline", "NOTE": "é ünïcode"},
    secrets={"HF_TOKEN": HF},
    ends_when=EndsWhen.RANK0_EXITED,
)


@pytest.fixture
def firestore_client(official_emulators: Emulators, emulator_project: str) -> Iterator[Any]:
    del official_emulators
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    client = firestore.Client(project=emulator_project, credentials=AnonymousCredentials())
    yield client
    client.close()


def store_of(client: Any) -> RequestStore:
    from opendws.adapters.firestore import FirestoreRequestStore

    return FirestoreRequestStore(client)


def test_a_run_is_stored_and_read_back_as_asked(firestore_client: Any) -> None:
    store = store_of(firestore_client)
    request = replace(flex("job-1", tenant="vision", vm_count=2), run=RUN)
    store.create(*accepted(request, NOW))
    stored = store.get("job-1")
    assert stored is not None
    assert stored.request.run == RUN
    assert stored.request == request
    raw = firestore_client.collection("requests").document("job-1").get().to_dict()
    assert raw["request"]["run"]["secrets"] == {"HF_TOKEN": HF}  # the reference, not a value


def test_a_request_without_run_is_stored_without_one_and_reads_as_capacity_only(
    firestore_client: Any,
) -> None:
    """Documents written before ``run`` existed have no such field: they read as None."""
    store = store_of(firestore_client)
    store.create(*accepted(flex("capacity-1", tenant="vision"), NOW))
    raw = firestore_client.collection("requests").document("capacity-1").get().to_dict()
    assert "run" not in raw["request"]
    stored = store.get("capacity-1")
    assert stored is not None
    assert stored.request.run is None
