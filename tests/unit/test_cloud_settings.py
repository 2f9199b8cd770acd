"""How capacity is created comes from the environment Terraform gives the functions."""

from __future__ import annotations

import pytest

from opendws.adapters.gce import CloudSettings
from opendws.bootstrap import CLOUD_SETTINGS_ENVIRONMENT, TPU_TIERS, Settings, cloud_settings
from opendws.catalog import TPU_ACCELERATORS, TPU_RUNTIME_VERSIONS


def cloud(**environment: str) -> CloudSettings:
    """The cloud settings of project ``p`` under exactly ``environment``."""
    return cloud_settings(Settings.from_environment({"OPENDWS_PROJECT": "p", **environment}))


def test_without_the_variables_the_defaults_hold() -> None:
    assert cloud() == CloudSettings(project="p")


def test_empty_variables_are_unset() -> None:
    """Terraform passes every variable, empty where nothing is configured."""
    assert cloud(**dict.fromkeys(CLOUD_SETTINGS_ENVIRONMENT, "")) == CloudSettings(project="p")


def test_tpu_queued_resources_are_flex_start_by_default() -> None:
    """Flex-start is the TPU form of what opendws asks for (tpu/docs/request-using-flex-start);
    spot and guaranteed stay options."""
    assert cloud().tpu_tier == "flex_start"


def test_each_tpu_generation_boots_its_own_runtime_version() -> None:
    """tpu/docs/runtimes: v6e ``v2-alpha-tpuv6e``, v5p ``v2-alpha-tpuv5``, v5e
    ``v2-alpha-tpuv5-lite``; one set in the environment is used for every generation."""
    settings = cloud()
    assert settings.runtime_version("tpu-v6e") == "v2-alpha-tpuv6e"
    assert settings.runtime_version("tpu-v5p") == "v2-alpha-tpuv5"
    assert settings.runtime_version("tpu-v5e") == "v2-alpha-tpuv5-lite"
    assert set(TPU_RUNTIME_VERSIONS) == TPU_ACCELERATORS


def test_a_runtime_version_from_the_environment_is_used_for_all() -> None:
    settings = cloud(OPENDWS_TPU_RUNTIME_VERSION="v2-alpha-tpuv6e")
    assert settings.runtime_version("tpu-v5e") == "v2-alpha-tpuv6e"


def test_each_variable_overrides_its_setting() -> None:
    settings = cloud(
        OPENDWS_BOOT_IMAGE="projects/p/global/images/family/cuda",
        OPENDWS_NETWORK="projects/p/global/networks/ml",
        OPENDWS_TPU_RUNTIME_VERSION="v2-alpha-tpuv6e",
        OPENDWS_TPU_TIER="spot",
    )
    assert settings.boot_image == "projects/p/global/images/family/cuda"
    assert settings.network == "projects/p/global/networks/ml"
    assert settings.tpu_runtime_version == "v2-alpha-tpuv6e"
    assert settings.tpu_tier == "spot"
    assert settings.tpu_valid_for == CloudSettings(project="p").tpu_valid_for


def test_an_unknown_tpu_tier_is_refused_by_name() -> None:
    with pytest.raises(
        ValueError, match=r"OPENDWS_TPU_TIER is 'preemptible'.*flex_start, guaranteed, spot"
    ):
        cloud(OPENDWS_TPU_TIER="preemptible")


def test_an_unknown_tpu_tier_is_refused_in_settings_too() -> None:
    with pytest.raises(ValueError, match=r"tpu_tier is 'preemptible'"):
        Settings(project="p", tpu_tier="preemptible")


def test_every_tpu_tier_can_be_chosen() -> None:
    for tier in TPU_TIERS:
        assert cloud(OPENDWS_TPU_TIER=tier).tpu_tier == tier


def test_the_process_environment_is_not_read_when_a_mapping_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENDWS_TPU_TIER", "preemptible")
    monkeypatch.setenv("OPENDWS_BOOT_IMAGE", "projects/p/global/images/family/cuda")
    assert cloud() == CloudSettings(project="p")
