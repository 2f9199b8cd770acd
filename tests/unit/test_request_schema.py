"""The opendws.request/v1 message: what it accepts, and a field-naming error for what it does
not."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest

from opendws.domain import Mode
from opendws.schema import (
    Cancel,
    MessageError,
    Release,
    Submit,
    parse_message,
    to_capacity_request,
)
from tests.builders import NOW

DESIGN_EXAMPLE: dict[str, Any] = {
    "schema": "opendws.request/v1",
    "action": "submit",
    "request_id": "train-42",
    "tenant": "vision",
    "mode": "flex_start",
    "gang": {
        "vm_count": 2,
        "machine_type": "a3-highgpu-8g",
        "accelerator": "nvidia-h100-80gb",
        "accelerators_per_vm": 8,
    },
    "locations": ["us-central1-a", "us-central1-b"],
    "run_duration": "6h",
    "max_wait": "2d",
    "priority": 0,
    "labels": {"ci": "github"},
}


def message(**changes: Any) -> dict[str, Any]:
    """The design's example message with top-level fields changed (None removes one)."""
    result = {**DESIGN_EXAMPLE, **changes}
    return {key: value for key, value in result.items() if value is not None}


def gang(**changes: Any) -> dict[str, Any]:
    result = {**DESIGN_EXAMPLE["gang"], **changes}
    return {key: value for key, value in result.items() if value is not None}


def test_the_design_example_is_a_flex_request() -> None:
    submit = parse_message(json.dumps(DESIGN_EXAMPLE).encode())
    assert isinstance(submit, Submit)
    request = to_capacity_request(submit, default_request_id="msg-1", submitted_at=NOW)
    assert request.request_id == "train-42"
    assert request.mode is Mode.FLEX_START
    assert request.run_duration == timedelta(hours=6)
    assert request.max_wait == timedelta(days=2)
    assert request.gang.accelerator_units == 16
    assert request.labels == (("ci", "github"),)
    assert request.submitted_at == NOW


def test_defaults_message_id_max_wait_and_accelerators_per_vm() -> None:
    submit = parse_message(
        message(request_id=None, max_wait=None, gang=gang(accelerators_per_vm=None))
    )
    assert isinstance(submit, Submit)
    request = to_capacity_request(submit, default_request_id="msg-1", submitted_at=NOW)
    assert (request.request_id, request.max_wait) == ("msg-1", timedelta(days=7))
    assert request.gang.accelerators_per_vm == 8


def test_tpu_and_calendar_requests() -> None:
    submit = parse_message(
        message(
            mode="calendar",
            max_wait=None,
            start_at="2026-12-10T00:00:00Z",
            run_duration="P7D",
            gang={"vm_count": 1, "accelerator": "tpu-v5e", "topology": "4x4"},
            locations=["us-west4-b"],
        )
    )
    assert isinstance(submit, Submit)
    request = to_capacity_request(submit, default_request_id="m", submitted_at=NOW)
    assert request.mode is Mode.CALENDAR
    assert request.gang.units == 16
    assert request.start_at is not None
    assert request.start_at.isoformat() == "2026-12-10T00:00:00+00:00"


@pytest.mark.parametrize(
    ("payload", "kind"),
    [
        (
            {"schema": "opendws.request/v1", "action": "cancel", "request_id": "a", "tenant": "t"},
            Cancel,
        ),
        (
            {"schema": "opendws.request/v1", "action": "release", "request_id": "a", "tenant": "t"},
            Release,
        ),
    ],
    ids=["cancel", "release"],
)
def test_cancel_and_release(payload: dict[str, Any], kind: type) -> None:
    assert isinstance(parse_message(payload), kind)


BAD = [
    ("not JSON", b"{oops", "message"),
    ("not UTF-8", b"\xff\xfe", "message"),
    ("not an object", b"[1, 2]", "message"),
    ("another schema", message(schema="opendws.request/v2"), "schema"),
    ("an unknown field", message(colour="red"), "colour"),
    ("an unknown gang field", message(gang=gang(gpus=8)), "gang.gpus"),
    ("a number as text", message(gang=gang(vm_count="2")), "gang.vm_count"),
    ("no VMs", message(gang=gang(vm_count=0)), "gang.vm_count"),
    ("an unknown accelerator", message(gang=gang(accelerator="nvidia-k80")), "gang.accelerator"),
    (
        "a machine type that carries another GPU",
        message(gang=gang(accelerator="nvidia-l4")),
        "gang.accelerator",
    ),
    ("a wrong count per VM", message(gang=gang(accelerators_per_vm=4)), "gang.accelerators_per_vm"),
    ("both a machine type and a topology", message(gang=gang(topology="2x2")), "gang.machine_type"),
    (
        "an unknown machine type",
        message(gang=gang(machine_type="n1-standard-8")),
        "gang.machine_type",
    ),
    ("no tenant", message(tenant=None), "tenant"),
    ("a tenant with a slash", message(tenant="a/b"), "tenant"),
    ("a request id with a slash", message(request_id="a/b"), "request_id"),
    ("a bad location", message(locations=["US central"]), "locations.0"),
    ("no locations", message(locations=[]), "locations"),
    ("a duration without a unit", message(run_duration=6), "run_duration"),
    ("a duration in months", message(run_duration="P1M"), "run_duration"),
    ("a naive start", message(mode="calendar", start_at="2026-12-10T00:00:00"), "start_at"),
    ("an unknown action", message(action="resize"), "action"),
    (
        "a release recording another tenant's request",
        {
            "schema": "opendws.request/v1",
            "action": "release",
            "request_id": "a",
            "tenant": "t",
            "if_absent": message(tenant="other", request_id="a"),
        },
        "if_absent.tenant",
    ),
    (
        "a release recording another request",
        {
            "schema": "opendws.request/v1",
            "action": "release",
            "request_id": "a",
            "tenant": "t",
            "if_absent": message(tenant="t", request_id="b"),
        },
        "if_absent.request_id",
    ),
    (
        "a release recording a bad submission",
        {
            "schema": "opendws.request/v1",
            "action": "release",
            "request_id": "a",
            "tenant": "t",
            "if_absent": message(tenant="t", request_id="a", gang=gang(vm_count=0)),
        },
        "if_absent.gang.vm_count",
    ),
]


@pytest.mark.parametrize(
    ("payload", "field"), [(p, f) for _, p, f in BAD], ids=[n for n, _, _ in BAD]
)
def test_bad_messages_name_the_field(payload: bytes | dict[str, Any], field: str) -> None:
    with pytest.raises(MessageError) as raised:
        parse_message(payload)
    fields = [problem[0] for problem in raised.value.problems]
    assert field in fields, raised.value.problems


RULES = [
    ("a flex run under 10 minutes", message(run_duration="5m"), "run_duration"),
    ("a flex wait over 7 days", message(max_wait="8d"), "max_wait"),
    ("a calendar start in the past", message(mode="calendar", max_wait=None, run_duration="2d",
                                             start_at="2026-11-30T00:00:00Z"), "start_at"),
    ("a calendar block over 90 days", message(mode="calendar", max_wait=None, run_duration="91d",
                                              start_at="2026-12-10T00:00:00Z"), "run_duration"),
    ("a calendar start too far ahead", message(mode="calendar", max_wait=None, run_duration="2d",
                                               start_at="2027-06-01T00:00:00Z"), "start_at"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "field"), [(p, f) for _, p, f in RULES], ids=[n for n, _, _ in RULES]
)
def test_mode_rules_name_the_field(payload: dict[str, Any], field: str) -> None:
    submit = parse_message(payload)
    assert isinstance(submit, Submit)
    with pytest.raises(MessageError) as raised:
        to_capacity_request(submit, default_request_id="m", submitted_at=NOW)
    assert [problem[0] for problem in raised.value.problems] == [field]


def test_the_shipped_json_schema_matches_the_model() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "opendws.schema", "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def tpu_gang(accelerator: str, topology: str) -> dict[str, Any]:
    return {"vm_count": 1, "accelerator": accelerator, "topology": topology}


CALENDAR = {"mode": "calendar", "max_wait": None, "run_duration": "2d",
            "start_at": "2026-12-10T00:00:00Z"}  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (message(gang=tpu_gang("tpu-v5p", "2x2x1")), "reserve tpu-v5p in calendar mode instead"),
        (message(gang=tpu_gang("tpu-v4", "2x2x1")), "request-using-flex-start"),
        (message(gang=tpu_gang("tpu-v4", "2x2x1"), **CALENDAR), "calendar-mode-reservation"),
    ],
    ids=["flex v5p", "flex v4", "calendar v4"],
)
def test_a_tpu_generation_google_does_not_serve_in_that_mode_is_refused(
    payload: dict[str, Any], words: str
) -> None:
    """Flex-start: "You can only request Flex-start TPU v6e and v5e"
    (tpu/docs/request-using-flex-start, "Limitations"); calendar mode: "You can only reserve
    the following TPU versions": v6e, v5p, v5e (tpu/docs/calendar-mode-reservation). Such a
    request is refused at intake, naming the page, instead of admitted and refused by Google
    on every pass."""
    submit = parse_message(payload)
    assert isinstance(submit, Submit)
    with pytest.raises(MessageError) as raised:
        to_capacity_request(submit, default_request_id="m", submitted_at=NOW)
    [(field, rule)] = raised.value.problems
    assert field == "gang.accelerator"
    assert words in rule


@pytest.mark.parametrize(
    "payload",
    [
        message(gang=tpu_gang("tpu-v5e", "2x2")),
        message(gang=tpu_gang("tpu-v6e", "2x4")),
        message(gang=tpu_gang("tpu-v5p", "2x2x1"), locations=["us-east5-a"], **CALENDAR),
        message(gang=tpu_gang("tpu-v6e", "2x2"), locations=["us-east5"], **CALENDAR),
    ],
    ids=["flex v5e", "flex v6e", "calendar v5p", "calendar v6e"],
)
def test_the_tpu_generations_google_serves_in_a_mode_are_accepted(
    payload: dict[str, Any],
) -> None:
    submit = parse_message(payload)
    assert isinstance(submit, Submit)
    request = to_capacity_request(submit, default_request_id="m", submitted_at=NOW)
    assert request.gang.accelerator == payload["gang"]["accelerator"]


def test_a_release_naming_such_a_request_as_if_absent_is_still_a_release() -> None:
    """The rule is the request's, checked where a request is made of a submission: a release
    must never be refused for what its if_absent describes (it releases what exists)."""
    absent = message(gang=tpu_gang("tpu-v5p", "2x2x1"), request_id="r")
    release = parse_message(
        {"schema": "opendws.request/v1", "action": "release", "request_id": "r",
         "tenant": absent["tenant"], "if_absent": absent}
    )  # fmt: skip
    assert isinstance(release, Release)


@pytest.mark.parametrize(
    ("gang", "locations"),
    [
        (tpu_gang("tpu-v5e", "4x4"), ["us-central1-a", "us-west4-a"]),
        (tpu_gang("tpu-v6e", "2x2"), ["us-central1"]),
        (tpu_gang("tpu-v5p", "2x2x1"), ["us-east5-b"]),
    ],
    ids=["v5e", "v6e", "v5p"],
)
def test_a_calendar_tpu_block_where_google_reserves_none_is_refused_naming_its_zones(
    gang: dict[str, Any], locations: list[str]
) -> None:
    """ "You can only reserve the following TPU versions in the specified zones"
    (tpu/docs/calendar-mode-reservation, "Limitations"): a block none of whose locations is
    such a zone would be refused by Google; it is refused at submission, naming the zones."""
    submit = parse_message(message(gang=gang, locations=locations, **CALENDAR))
    assert isinstance(submit, Submit)
    with pytest.raises(MessageError, match=r"^locations: .*calendar mode reserves .* only in"):
        to_capacity_request(submit, default_request_id="m", submitted_at=NOW)
    flex = parse_message(message(gang=tpu_gang("tpu-v5e", "2x2"), locations=locations))
    assert isinstance(flex, Submit)
    to_capacity_request(flex, default_request_id="m", submitted_at=NOW)  # flex: any zone
