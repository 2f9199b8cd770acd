"""The configuration's policy section: racing and commitment knobs are read, written back and
checked."""

from __future__ import annotations

from datetime import timedelta

import pytest

from opendws.config import configuration_from_document, configuration_to_document
from opendws.domain.model import PolicySettings
from opendws.scenario import ScenarioError


def test_racing_knobs_round_trip_and_default_to_two_lanes_raced_once_short() -> None:
    assert (PolicySettings().race_width, PolicySettings().race_eagerly) == (2, False)
    configuration = configuration_from_document(
        {"policy": {"race_width": 3, "race_eagerly": True}}, source="config.yaml"
    )
    assert (configuration.policy.race_width, configuration.policy.race_eagerly) == (3, True)
    again = configuration_from_document(
        configuration_to_document(configuration), source="config.yaml"
    )
    assert again.policy == configuration.policy


@pytest.mark.parametrize("width", [0, 9, True])
def test_a_race_width_out_of_range_is_refused_naming_the_field(width: object) -> None:
    with pytest.raises(ScenarioError, match="race_width"):
        configuration_from_document({"policy": {"race_width": width}}, source="config.yaml")


def test_commitments_are_two_hours_by_default_off_with_false_and_round_trip() -> None:
    assert PolicySettings().commit_within == timedelta(hours=2)
    default = configuration_from_document({}, source="config.yaml")
    assert default.policy.commit_within == timedelta(hours=2)
    assert configuration_to_document(default)["policy"]["commit_within"] == "2h"
    off = configuration_from_document({"policy": {"commit_within": False}}, source="config.yaml")
    assert off.policy.commit_within is None
    assert configuration_to_document(off)["policy"]["commit_within"] is False
    assert (
        configuration_from_document(configuration_to_document(off), source="config.yaml").policy
        == off.policy
    )
    configuration = configuration_from_document(
        {"policy": {"commit_within": "6h"}}, source="config.yaml"
    )
    assert configuration.policy.commit_within == timedelta(hours=6)
    again = configuration_from_document(
        configuration_to_document(configuration), source="config.yaml"
    )
    assert again.policy == configuration.policy


@pytest.mark.parametrize("value", ["0s", "-1h", "soon", True])
def test_a_commitment_horizon_that_is_not_a_positive_duration_is_refused(value: str) -> None:
    with pytest.raises(ScenarioError, match="commit_within"):
        configuration_from_document({"policy": {"commit_within": value}}, source="config.yaml")
