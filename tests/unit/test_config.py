"""Configuration documents: loading reads no clock; the rule that depends on the time is checked
at the instant the caller passes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from opendws.config import configuration_from_document, configuration_to_apply
from opendws.schema.common import ScenarioError
from opendws.schema.config import ConfigSpec, PolicySpec, PoolSpec, TenantSpec
from opendws.schema.scenario import ScenarioSpec

START = datetime(2026, 12, 10, tzinfo=UTC)
CALENDAR = {
    "tenant": "vision", "mode": "calendar",
    "gang": {"vm_count": 2, "machine_type": "a3-highgpu-8g", "accelerator": "nvidia-h100-80gb"},
    "locations": ["us-central1-a"], "run_duration": "2d", "start_at": START.isoformat(),
}  # fmt: skip
TPU_CALENDAR = {
    "tenant": "vision", "mode": "calendar",
    "gang": {"vm_count": 1, "topology": "4x4", "accelerator": "tpu-v5e"},
    "locations": ["us-west4-b"], "run_duration": "2d", "start_at": START.isoformat(),
}  # fmt: skip


def document(template: dict[str, Any]) -> dict[str, Any]:
    return {"ci": [{"provider": "github", "labels": ["gpu"], "request": template}]}


@pytest.mark.parametrize("template", [CALENDAR, TPU_CALENDAR])
def test_a_calendar_template_loads_at_any_time_and_is_checked_at_the_given_now(
    template: dict[str, Any],
) -> None:
    # Loaded (from Firestore, by every service) without a clock: its start may have passed.
    assert configuration_from_document(document(template), source="ci.yaml").ci[0].template == (
        template
    )
    applied = configuration_to_apply(
        document(template), source="ci.yaml", now=datetime(2026, 12, 1, tzinfo=UTC)
    )
    assert applied.ci[0].labels == frozenset({"gpu"})
    with pytest.raises(ScenarioError, match=r"^ci\.yaml: ci\[0\]\.request: start_at: lies in"):
        configuration_to_apply(
            document(template), source="ci.yaml", now=datetime(2026, 12, 11, tzinfo=UTC)
        )


def test_a_calendar_block_too_far_ahead_of_now_is_refused_when_applied() -> None:
    with pytest.raises(ScenarioError, match=r"ci\[0\]\.request: start_at: .*at most 60 days"):
        configuration_to_apply(
            document(CALENDAR), source="ci.yaml", now=datetime(2026, 9, 1, tzinfo=UTC)
        )
    with pytest.raises(ScenarioError, match=r"ci\[0\]\.request: start_at: .*at least 1 day"):
        configuration_to_apply(
            document(TPU_CALENDAR), source="ci.yaml", now=datetime(2026, 12, 9, 12, tzinfo=UTC)
        )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"run_duration": "5m"}, "run_duration"),
        ({"max_wait": "1h"}, "max_wait"),
        ({"mode": "flex_start"}, "start_at"),
    ],
)
def test_a_calendar_template_no_instant_makes_valid_is_refused_on_load(
    change: dict[str, str], field: str
) -> None:
    with pytest.raises(ScenarioError, match=rf"ci\[0\]\.request: {field}: "):
        configuration_from_document(document({**CALENDAR, **change}), source="ci.yaml")


def test_a_document_that_is_not_a_mapping_names_the_configurations_fields() -> None:
    with pytest.raises(ScenarioError) as refused:
        configuration_from_document(["pools"], source="config.yaml")
    assert str(refused.value) == (
        "config.yaml: the file must hold a mapping with the fields policy, "
        "shared_requests_topic, prices, ci, pools, tenants, access; it holds a list"
    )


def test_scenarios_describe_pools_tenants_and_policy_with_the_configurations_specs() -> None:
    assert ConfigSpec.model_fields["pools"].annotation == list[PoolSpec]
    assert ScenarioSpec.model_fields["pools"].annotation == list[PoolSpec]
    assert ConfigSpec.model_fields["tenants"].annotation == list[TenantSpec]
    assert ScenarioSpec.model_fields["tenants"].annotation == list[TenantSpec]
    assert ScenarioSpec.model_fields["policy"].annotation == PolicySpec | None
