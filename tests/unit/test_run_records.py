"""A request's ``run`` in its stored form: read back as asked, absent (and fingerprinted as
before) when it carries none, and part of what tells a redelivery from another request."""

from __future__ import annotations

from dataclasses import replace

from opendws.adapters.memory import MemoryRequestStore
from opendws.domain import RunSpec
from opendws.ports import (
    CreateOutcome,
    accepted,
    content_digest,
    request_from_document,
    request_to_document,
)
from tests.builders import NOW, flex

RUN = RunSpec.of(
    ["python", "train.py"], env={"WANDB_MODE": "offline"},
    secrets={"HF_TOKEN": "projects/my-proj/secrets/vision-hf/versions/3"},
)  # fmt: skip


def test_a_run_reads_back_from_its_document_as_asked() -> None:
    request = replace(flex("job-1", tenant="vision"), run=RUN)
    document = request_to_document(request)
    assert document["run"]["secrets"] == {
        "HF_TOKEN": "projects/my-proj/secrets/vision-hf/versions/3"
    }
    assert request_from_document(document) == request


def test_a_request_without_run_has_the_document_and_fingerprint_it_always_had() -> None:
    request = flex("capacity-1", tenant="vision")
    document = request_to_document(request)
    assert "run" not in document
    assert request_from_document(document).run is None
    assert content_digest(request) != content_digest(replace(request, run=RUN))


def test_the_memory_store_keeps_the_run_and_refuses_another_run_under_the_same_id() -> None:
    store = MemoryRequestStore()
    request = replace(flex("job-1", tenant="vision"), run=RUN)
    assert store.create(*accepted(request, NOW)) is CreateOutcome.CREATED
    stored = store.get("job-1")
    assert stored is not None
    assert stored.request.run == RUN
    other = replace(request, run=RunSpec.of(["python", "eval.py"]))
    assert store.create(*accepted(other, NOW)) is CreateOutcome.CONFLICT
    assert store.create(*accepted(request, NOW)) is CreateOutcome.DUPLICATE
