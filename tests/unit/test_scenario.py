"""Scenario files: shape checks, domain rule errors named by item, and the bundled example."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

import opendws
from opendws.domain import (
    Alternative,
    CapacityRequest,
    GangShape,
    Grant,
    Mode,
    Outcome,
    PolicySettings,
    Pool,
    Provider,
    QueueingStrategy,
    Quota,
    Reason,
    Snapshot,
    Tenant,
    admit,
)
from opendws.scenario import (
    MAX_REPORTED,
    ScenarioError,
    load_scenario,
    parse_scenario,
    parse_timestamp,
)

EXAMPLE = Path(opendws.__file__).parent / "examples" / "scenario.yaml"
NOW = datetime(2026, 12, 1, tzinfo=UTC)
POOL_ID = "us-central1-a/a3-highgpu-8g"
DELETE = object()  # edit(): remove the field instead of setting it


def scenario() -> dict[str, Any]:
    """A small valid scenario as read from a file: one pool, one tenant, one grant, a flex
    request and a calendar request."""
    return {
        "now": "2026-12-01T00:00:00Z",
        "pools": [
            {
                "pool_id": POOL_ID,
                "zone": "us-central1-a",
                "shape": "a3-highgpu-8g",
                "accelerator": "nvidia-h100-80gb",
                "provider": "mig",
                "capacity": 8,
                "short_until": None,
            },
            {
                "pool_id": "us-west4-a/tpu-v5e",
                "zone": "us-west4-a",
                "shape": "tpu-v5e",
                "accelerator": "tpu-v5e",
                "provider": "tpu",
                "capacity": 32,
            },
        ],
        "tenants": [
            {
                "name": "vision",
                "cohort": "research",
                "queueing": "best_effort",
                "quotas": [
                    {"accelerator": "nvidia-h100-80gb", "nominal": 64, "borrowing_limit": 16},
                    {"accelerator": "tpu-v5e", "nominal": 32},
                ],
            }
        ],
        "grants": [
            {
                "request_id": "old-1",
                "tenant": "vision",
                "pool_id": POOL_ID,
                "accelerator": "nvidia-h100-80gb",
                "units": 2,
                "accelerator_units": 16,
                "start_at": "2026-11-30T22:00:00Z",
                "end_at": "2026-12-01T04:00:00Z",
            }
        ],
        "pending": [
            {
                "request_id": "train-42",
                "tenant": "vision",
                "mode": "flex_start",
                "gang": {
                    "vm_count": 2,
                    "machine_type": "a3-highgpu-8g",
                    "accelerator": "nvidia-h100-80gb",
                    "accelerators_per_vm": 8,
                },
                "locations": ["us-central1"],
                "run_duration": "6h",
                "max_wait": "2d",
                "priority": 0,
                "labels": {"team": "x", "ci": "github"},
            },
            {
                "request_id": "tpu-1",
                "tenant": "vision",
                "mode": "calendar",
                "gang": {"vm_count": 1, "accelerator": "tpu-v5e", "topology": "4x4"},
                "locations": ["us-west4-a"],
                "run_duration": "P3D",
                "start_at": "2026-12-10T00:00:00Z",
                "submitted_at": "2026-11-30T12:00:00Z",
            },
        ],
    }


def edit(data: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """A copy of ``data`` with the field at the dotted ``path`` set to ``value`` (or removed
    when ``value`` is DELETE); numeric parts index lists."""
    data = copy.deepcopy(data)
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    key: Any = int(last) if last.isdigit() else last
    if value is DELETE:
        del node[key]
    else:
        node[key] = value
    return data


def error_of(data: object) -> str:
    """The ScenarioError message that parsing ``data`` raises."""
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data, source="what-if.yaml")
    return str(caught.value)


# What a valid file becomes ------------------------------------------------------------------


def test_parse_builds_the_snapshot_whole() -> None:
    expected = Snapshot(
        pools=(
            Pool(
                pool_id=POOL_ID,
                zone="us-central1-a",
                shape="a3-highgpu-8g",
                accelerator="nvidia-h100-80gb",
                provider=Provider.MIG,
                capacity=8,
            ),
            Pool(
                pool_id="us-west4-a/tpu-v5e",
                zone="us-west4-a",
                shape="tpu-v5e",
                accelerator="tpu-v5e",
                provider=Provider.TPU,
                capacity=32,
            ),
        ),
        tenants=(
            Tenant(
                name="vision",
                cohort="research",
                queueing=QueueingStrategy.BEST_EFFORT,
                quotas=(
                    Quota(accelerator="nvidia-h100-80gb", nominal=64, borrowing_limit=16),
                    Quota(accelerator="tpu-v5e", nominal=32),
                ),
            ),
        ),
        grants=(
            Grant(
                request_id="old-1",
                tenant="vision",
                pool_id=POOL_ID,
                accelerator="nvidia-h100-80gb",
                units=2,
                accelerator_units=16,
                start_at=datetime(2026, 11, 30, 22, tzinfo=UTC),
                end_at=datetime(2026, 12, 1, 4, tzinfo=UTC),
            ),
        ),
        pending=(
            CapacityRequest(
                request_id="train-42",
                tenant="vision",
                mode=Mode.FLEX_START,
                gang=GangShape(
                    vm_count=2,
                    machine_type="a3-highgpu-8g",
                    accelerator="nvidia-h100-80gb",
                    accelerators_per_vm=8,
                ),
                locations=("us-central1",),
                run_duration=timedelta(hours=6),
                max_wait=timedelta(days=2),
                submitted_at=NOW,  # omitted in the file: the scenario's now
                labels=(("ci", "github"), ("team", "x")),  # sorted
            ),
            CapacityRequest(
                request_id="tpu-1",
                tenant="vision",
                mode=Mode.CALENDAR,
                gang=GangShape(vm_count=1, accelerator="tpu-v5e", topology="4x4"),
                locations=("us-west4-a",),
                run_duration=timedelta(days=3),
                start_at=datetime(2026, 12, 10, tzinfo=UTC),
                submitted_at=datetime(2026, 11, 30, 12, tzinfo=UTC),
            ),
        ),
        policy=PolicySettings(),
    )
    parsed = parse_scenario(scenario(), source="what-if.yaml")
    assert parsed.now == NOW
    assert parsed.snapshot == expected


def test_optional_sections_default() -> None:
    data = scenario()
    del data["grants"], data["pending"]
    parsed = parse_scenario(data, source="what-if.yaml")
    assert (parsed.snapshot.grants, parsed.snapshot.pending) == ((), ())
    assert parsed.snapshot.policy == PolicySettings()


def test_policy_is_read() -> None:
    parsed = parse_scenario(
        edit(scenario(), "policy", {"aging_half_life": "90m"}), source="what-if.yaml"
    )
    assert parsed.snapshot.policy == PolicySettings(aging_half_life=timedelta(minutes=90))


def test_timestamps_with_offsets_are_normalised_to_utc() -> None:
    parsed = parse_scenario(
        edit(scenario(), "now", "2026-12-01T01:00:00+01:00"), source="what-if.yaml"
    )
    assert parsed.now == NOW
    assert parsed.now.utcoffset() == timedelta(0)
    assert parsed.snapshot.pending[0].submitted_at == NOW


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_yaml_and_json_files_read_alike(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"what-if{suffix}"
    text = json.dumps(scenario()) if suffix == ".json" else yaml.safe_dump(scenario())
    path.write_text(text, encoding="utf-8")
    loaded = load_scenario(path)
    assert loaded.source == str(path)
    assert loaded.snapshot == parse_scenario(scenario(), source="x").snapshot


def test_unquoted_yaml_timestamps_are_read_as_text(tmp_path: Path) -> None:
    text = yaml.safe_dump(scenario()).replace("'2026-12-01T00:00:00Z'", "2026-12-01T00:00:00Z")
    assert "now: 2026-12-01T00:00:00Z" in text
    aware = tmp_path / "aware.yaml"
    aware.write_text(text, encoding="utf-8")
    assert load_scenario(aware).now == NOW
    naive = tmp_path / "naive.yaml"
    naive.write_text(text.replace("now: 2026-12-01T00:00:00Z", "now: 2026-12-01 00:00:00"))
    with pytest.raises(ScenarioError, match="now: 2026-12-01T00:00:00 has no time zone"):
        load_scenario(naive)


# Shape errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        pytest.param(
            "pool",
            [],
            "what-if.yaml: unknown field 'pool'; did you mean 'pools'?",
            id="unknown-top-level",
        ),
        pytest.param(
            "pools.0.capacty",
            8,
            "pools[0] (us-central1-a/a3-highgpu-8g): unknown field 'capacty'; "
            "did you mean 'capacity'?",
            id="unknown-in-pool",
        ),
        pytest.param(
            "tenants.0.quotas.0.limit",
            8,
            "tenants[0] (vision): quotas[0]: unknown field 'limit'",
            id="unknown-in-quota",
        ),
        pytest.param(
            "pending.0.gang.vm_cout",
            2,
            "pending[0] (train-42): gang: unknown field 'vm_cout'; did you mean 'vm_count'? "
            "(known fields: vm_count, accelerator,",
            id="unknown-in-gang",
        ),
        pytest.param(
            "policy", {"half_life": "6h"}, "policy: unknown field 'half_life'", id="unknown-policy"
        ),
        pytest.param(
            "pending.0.request_id",
            DELETE,
            "pending[0]: request_id: required field is missing",
            id="missing-field",
        ),
        pytest.param("now", DELETE, "now: required field is missing", id="missing-now"),
        pytest.param(
            "pools.0.capacity",
            "8",
            "pools[0] (us-central1-a/a3-highgpu-8g): capacity: Input should be a valid integer",
            id="integer-as-text",
        ),
        pytest.param(
            "pending.0.priority",
            True,
            "pending[0] (train-42): priority: Input should be a valid integer",
            id="boolean-as-integer",
        ),
        pytest.param(
            "pending.0.mode",
            "flex",
            "pending[0] (train-42): mode: Input should be 'flex_start' or 'calendar'",
            id="unknown-mode",
        ),
        pytest.param(
            "pools.0.provider",
            "gce",
            "pools[0] (us-central1-a/a3-highgpu-8g): provider: Input",
            id="unknown-provider",
        ),
        pytest.param(
            "pending.0.run_duration",
            6,
            "pending[0] (train-42): run_duration: give a duration as text such as '6h'",
            id="duration-without-unit",
        ),
        pytest.param(
            "pending.0.max_wait",
            "2 days",
            "pending[0] (train-42): max_wait: '2 days' is not a duration",
            id="bad-duration",
        ),
        pytest.param(
            "pending.0.labels",
            {"ci": True},
            "pending[0] (train-42): labels.ci: must be text, not True (quote it",
            id="label-not-text",
        ),
        pytest.param(
            "pending.0.locations",
            ["us-central1", 5],
            "pending[0] (train-42): locations[1]: must be text, not 5",
            id="location-not-text",
        ),
        pytest.param(
            "pending.0.gang",
            5,
            "pending[0] (train-42): gang: must be a mapping of fields, not 5",
            id="gang-not-a-mapping",
        ),
        pytest.param(
            "now",
            1_700_000_000,
            "now: give a timestamp as ISO 8601 text",
            id="timestamp-as-number",
        ),
        pytest.param(
            "now",
            "1700000000",
            "now: give a timestamp as ISO 8601 text",
            id="timestamp-as-numeric-text",
        ),
    ],
)
def test_shape_errors_name_item_and_field(path: str, value: object, message: str) -> None:
    error = error_of(edit(scenario(), path, value))
    assert error.startswith("what-if.yaml: ")
    assert message in error


@pytest.mark.parametrize(
    ("path", "where"),
    [
        pytest.param("now", "what-if.yaml: now: ", id="now"),
        pytest.param(
            "pools.0.short_until",
            "pools[0] (us-central1-a/a3-highgpu-8g): short_until: ",
            id="pool",
        ),
        pytest.param("grants.0.start_at", "grants[0] (old-1): start_at: ", id="grant"),
        pytest.param("pending.0.submitted_at", "pending[0] (train-42): submitted_at: ", id="flex"),
        pytest.param("pending.1.start_at", "pending[1] (tpu-1): start_at: ", id="calendar"),
    ],
)
def test_naive_timestamps_are_refused(path: str, where: str) -> None:
    error = error_of(edit(scenario(), path, "2026-12-01T00:00:00"))
    assert f"{where}2026-12-01T00:00:00 has no time zone; add 'Z' or an offset" in error


def test_not_a_mapping() -> None:
    assert error_of([1]) == (
        "what-if.yaml: the file must hold a mapping with the fields now, policy, pools, "
        "tenants, grants, pending; it holds a list"
    )


def test_many_problems_are_counted_and_capped() -> None:
    data = scenario()
    for index in range(MAX_REPORTED + 2):
        data["pending"].append(edit(data["pending"][0], "run_duration", f"{index}x"))
    error = error_of(data)
    assert error.startswith(f"what-if.yaml: {MAX_REPORTED + 2} problems: pending[2] (train-42)")
    assert error.endswith("; and 2 more")
    assert "\n" not in error


# Domain rule errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        pytest.param(
            "pending.0.gang.vm_count",
            0,
            "what-if.yaml: pending[0] (train-42): gang.vm_count: must be at least 1",
            id="gang-size",
        ),
        pytest.param(
            "pending.0.run_duration",
            "5m",
            "what-if.yaml: pending[0] (train-42): run_duration: "
            "flex_start runs between 10 minutes and 7 days",
            id="flex-run-too-short",
        ),
        pytest.param(
            "pending.1.max_wait",
            "1d",
            "what-if.yaml: pending[1] (tpu-1): max_wait: "
            "calendar requests are confirmed at once; no max_wait",
            id="calendar-with-max-wait",
        ),
        pytest.param(
            "pending.1.gang.topology",
            "4by4",
            "what-if.yaml: pending[1] (tpu-1): gang.topology: '4by4' is not a topology",
            id="bad-topology",
        ),
        pytest.param(
            "pools.0.zone",
            "us-central1",
            "what-if.yaml: pools[0] (us-central1-a/a3-highgpu-8g): zone: "
            "'us-central1' is not a zone such as us-central1-a",
            id="pool-zone",
        ),
        pytest.param(
            "grants.0.end_at",
            "2026-11-30T21:00:00Z",
            "what-if.yaml: grants[0] (old-1): end_at: a grant ends after it starts",
            id="grant-ends-before-start",
        ),
        pytest.param(
            "tenants.0.quotas.0.nominal",
            -1,
            "what-if.yaml: tenants[0] (vision): quota.nominal: must not be negative",
            id="negative-quota",
        ),
        pytest.param(
            "policy",
            {"aging_half_life": "0s"},
            "what-if.yaml: policy: aging_half_life: must be positive",
            id="policy",
        ),
    ],
)
def test_domain_rule_errors_name_the_item(path: str, value: object, message: str) -> None:
    assert error_of(edit(scenario(), path, value)).startswith(message)


def test_duplicate_request_ids_are_refused() -> None:
    data = scenario()
    data["pending"].append(data["pending"][0])
    assert error_of(data) == "what-if.yaml: pending: 'train-42' appears twice"


# Reading files ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        pytest.param(
            "missing.yaml", None, "missing.yaml: no such file; check the path", id="missing"
        ),
        pytest.param(
            "scenario.txt",
            "now: x",
            "scenario.txt: unknown file type '.txt'; name the file *.yaml, *.yml or *.json",
            id="extension",
        ),
        pytest.param(
            "bad.yaml",
            "now: [1\n",
            "bad.yaml: not valid YAML: line 2, column 1: expected ',' or ']'",
            id="yaml-syntax",
        ),
        pytest.param(
            "bad.json",
            '{"now": }',
            "bad.json: not valid JSON at line 1, column 9: Expecting value",
            id="json-syntax",
        ),
        pytest.param(
            "twice.yaml",
            "now: 2026-12-01T00:00:00Z\nnow: 2026-12-02T00:00:00Z\n",
            "twice.yaml: not valid YAML: line 2, column 1: key 'now' appears twice",
            id="yaml-duplicate-key",
        ),
        pytest.param(
            "empty.yaml",
            "",
            "empty.yaml: the file must hold a mapping with the fields",
            id="empty",
        ),
    ],
)
def test_file_errors(tmp_path: Path, name: str, text: str | None, message: str) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert str(caught.value).startswith(f"{tmp_path}/{message}")


# --at and other single timestamps ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("2026-12-01T06:00:00Z", NOW + timedelta(hours=6), id="zulu"),
        pytest.param("2026-12-01T08:00:00+02:00", NOW + timedelta(hours=6), id="offset"),
    ],
)
def test_parse_timestamp(text: str, expected: datetime) -> None:
    parsed = parse_timestamp(text)
    assert parsed == expected
    assert parsed.tzinfo is UTC


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("2026-12-01T06:00:00", "has no time zone", id="naive"),
        pytest.param("2026-12-01", "has no time zone", id="date-only"),
        pytest.param("tomorrow", "Input should be a valid datetime", id="not-a-timestamp"),
        pytest.param("1700000000", "give a timestamp as ISO 8601 text", id="unix-seconds"),
    ],
)
def test_parse_timestamp_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_timestamp(text)


# The bundled example ------------------------------------------------------------------------


def test_example_plans_every_outcome_it_documents() -> None:
    example = load_scenario(EXAMPLE)
    plan = admit(example.snapshot, example.now)
    summary = {d.request_id: (d.outcome, d.reason, d.pool_id) for d in plan.decisions}
    assert summary == {
        "train-42": (Outcome.ADMIT, None, "us-central1-a/a3-highgpu-8g"),
        "quick-eval": (Outcome.ADMIT, None, "us-west4-a/a3-highgpu-8g"),
        "ci-smoke": (Outcome.ADMIT, None, "us-central1-a/a2-ultragpu-8g"),
        "big-sweep": (Outcome.HOLD, Reason.NO_CAPACITY_UNTIL, "us-central1-a/a3-highgpu-8g"),
        "ci-nightly": (Outcome.HOLD, Reason.NO_CAPACITY_UNTIL, "us-central1-a/a2-ultragpu-8g"),
        "tpu-serve": (Outcome.CONFIRM, None, "us-west4-a/tpu-v5e"),
        "tpu-train": (Outcome.REFUSE, Reason.NO_CAPACITY, None),
        "huge-run": (Outcome.REJECT, Reason.NEVER_FITS, None),
    }
    assert plan.decision("big-sweep").eta == example.now + timedelta(hours=6)
    assert plan.decision("ci-nightly").eta == example.now + timedelta(hours=1)
    assert plan.decision("tpu-train").alternatives == (
        Alternative(start_at=datetime(2026, 12, 5, tzinfo=UTC), pool_id="us-west4-a/tpu-v5e"),
    )
