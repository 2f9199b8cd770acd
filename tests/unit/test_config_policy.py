"""The configuration's policy section: racing knobs are read, written back and checked."""

from __future__ import annotations

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
