"""Intake and a request's ``run`` (over the in-memory fakes): the job is stored with the
request; a secret outside its tenant's configured ``secret_prefix`` (or any secret, for a tenant
configured with none) is refused with a REJECTED event naming the field, and nothing is stored;
the tenant's prefix is configured in the configuration document."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from opendws.adapters.memory import MemoryConfigStore, MemoryEventBus, MemoryRequestStore
from opendws.config import configuration_from_document, configuration_to_document
from opendws.domain import RequestState, RunSpec
from opendws.ports import Configuration
from opendws.scenario import ScenarioError
from opendws.service.intake import IntakeOutcome, IntakeService
from tests.builders import tenant
from tests.unit.test_intake_service import FixedClock, delivery
from tests.unit.test_request_schema import DESIGN_EXAMPLE

PREFIX = "projects/my-proj/secrets/vision-"
INSIDE = "projects/my-proj/secrets/vision-hf/versions/latest"
OUTSIDE = "projects/my-proj/secrets/audio-hf/versions/latest"


def configured(secret_prefixes: tuple[tuple[str, str], ...]) -> MemoryConfigStore:
    return MemoryConfigStore(
        Configuration(
            tenants=(tenant("vision"),),
            shared_requests_topic=True,
            secret_prefixes=secret_prefixes,
        )
    )


def intake(config: MemoryConfigStore) -> tuple[IntakeService, MemoryRequestStore, MemoryEventBus]:
    store, bus = MemoryRequestStore(), MemoryEventBus()
    return IntakeService(store, bus, FixedClock(), config=config), store, bus


def with_run(**run: Any) -> dict[str, Any]:
    return {**DESIGN_EXAMPLE, "run": {"command": ["python", "train.py"], **run}}


def test_a_run_is_stored_with_its_request_its_secrets_as_version_names() -> None:
    service, store, bus = intake(configured((("vision", PREFIX),)))
    result = service.handle(delivery(with_run(secrets={"HF_TOKEN": INSIDE})))
    assert result.outcome is IntakeOutcome.ACCEPTED
    record = store.get("train-42")
    assert record is not None
    assert record.request.run == RunSpec.of(["python", "train.py"], secrets={"HF_TOKEN": INSIDE})
    assert [event.state for event in bus.published] == [RequestState.PENDING]


def test_a_secret_outside_the_tenants_prefix_is_rejected_naming_it() -> None:
    service, store, bus = intake(configured((("vision", PREFIX),)))
    run = with_run(secrets={"HF_TOKEN": INSIDE, "AUDIO_TOKEN": OUTSIDE})
    result = service.handle(delivery(run))
    assert result.outcome is IntakeOutcome.REFUSED
    assert store.in_states(*RequestState) == []
    [event] = bus.published
    assert (event.state, event.reason, event.request_id) == (
        RequestState.REJECTED, "INVALID_REQUEST", "train-42",
    )  # fmt: skip
    assert event.message.startswith("run.secrets.AUDIO_TOKEN: ")
    assert f"outside tenant 'vision''s secret prefix {PREFIX!r}" in event.message


def test_a_tenant_configured_without_a_prefix_may_use_no_secrets_and_is_told_how() -> None:
    service, store, bus = intake(configured(()))
    result = service.handle(delivery(with_run(secrets={"HF_TOKEN": INSIDE})))
    assert result.outcome is IntakeOutcome.REFUSED
    assert store.get("train-42") is None
    [event] = bus.published
    assert event.message.startswith("run.secrets.HF_TOKEN: tenant 'vision' may use no secrets")
    assert "secret_prefix: projects/PROJECT/secrets/vision-" in event.message


def test_a_run_without_secrets_needs_no_prefix() -> None:
    service, store, _ = intake(configured(()))
    assert service.handle(delivery(with_run(env={"WANDB_MODE": "offline"}))).outcome is (
        IntakeOutcome.ACCEPTED
    )
    record = store.get("train-42")
    assert record is not None
    assert record.request.run is not None
    assert dict(record.request.run.env) == {"WANDB_MODE": "offline"}


def test_a_prefix_just_configured_is_taken_at_once() -> None:
    config = configured(())
    service, _, _ = intake(config)
    refused = service.handle(delivery(with_run(secrets={"HF_TOKEN": INSIDE})))
    assert refused.outcome is IntakeOutcome.REFUSED
    config.save(replace(config.load(), secret_prefixes=(("vision", PREFIX),)))
    again = service.handle(delivery(with_run(secrets={"HF_TOKEN": INSIDE}), "m-2"))
    assert again.outcome is IntakeOutcome.ACCEPTED


def test_a_run_breaking_a_rule_of_the_schema_is_rejected_naming_the_field() -> None:
    service, store, bus = intake(configured((("vision", PREFIX),)))
    result = service.handle(delivery(with_run(env={"MASTER_PORT": "29500"})))
    assert result.outcome is IntakeOutcome.REFUSED
    assert store.get("train-42") is None
    assert bus.published[-1].message.startswith("run.env.MASTER_PORT: is set by opendws")


# The tenant's secret prefix in the configuration document -----------------------------------


def document(**vision: Any) -> dict[str, Any]:
    return {"tenants": [{"name": "vision", **vision}, {"name": "audio"}]}


def test_a_tenants_secret_prefix_is_configured_and_written_back() -> None:
    configuration = configuration_from_document(
        document(secret_prefix=PREFIX), source="config.yaml"
    )
    assert configuration.secret_prefix("vision") == PREFIX
    assert configuration.secret_prefix("audio") is None
    written = configuration_to_document(configuration)
    assert written["tenants"][0]["secret_prefix"] == PREFIX
    assert "secret_prefix" not in written["tenants"][1]
    assert configuration_from_document(written, source="again") == configuration


@pytest.mark.parametrize(
    "prefix",
    ["vision-", "projects/my-proj/vision-", "projects/My_Proj/secrets/", "projects/p/secrets/"],
)
def test_a_secret_prefix_that_names_no_projects_secrets_is_refused(prefix: str) -> None:
    """A project is named by its id (6 to 30 lowercase letters, digits and hyphens, starting
    with a letter: cloud.google.com/resource-manager/docs/creating-managing-projects) or its
    number; its secrets are projects/PROJECT/secrets/SECRET_ID."""
    with pytest.raises(ScenarioError, match=r"tenants\[0\] \(vision\): secret_prefix: "):
        configuration_from_document(document(secret_prefix=prefix), source="config.yaml")
