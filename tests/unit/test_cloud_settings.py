"""How capacity is created comes from the environment Terraform gives the functions."""

from __future__ import annotations

import pytest

from opendws.adapters.gce import CloudSettings
from opendws.bootstrap import CLOUD_SETTINGS_ENVIRONMENT, TPU_TIERS, cloud_settings
from opendws.catalog import TPU_ACCELERATORS, TPU_RUNTIME_VERSIONS


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in CLOUD_SETTINGS_ENVIRONMENT:
        monkeypatch.delenv(variable, raising=False)


def test_without_the_variables_the_defaults_hold() -> None:
    assert cloud_settings("p") == CloudSettings(project="p")


def test_tpu_queued_resources_are_flex_start_by_default() -> None:
    """Flex-start is the TPU form of what opendws asks for (tpu/docs/request-using-flex-start);
    spot and guaranteed stay options."""
    assert cloud_settings("p").tpu_tier == "flex_start"


def test_each_tpu_generation_boots_its_own_runtime_version() -> None:
    """tpu/docs/runtimes: v6e ``v2-alpha-tpuv6e``, v5p ``v2-alpha-tpuv5``, v5e
    ``v2-alpha-tpuv5-lite``; one set in the environment is used for every generation."""
    settings = cloud_settings("p")
    assert settings.runtime_version("tpu-v6e") == "v2-alpha-tpuv6e"
    assert settings.runtime_version("tpu-v5p") == "v2-alpha-tpuv5"
    assert settings.runtime_version("tpu-v5e") == "v2-alpha-tpuv5-lite"
    assert set(TPU_RUNTIME_VERSIONS) == TPU_ACCELERATORS


def test_a_runtime_version_from_the_environment_is_used_for_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENDWS_TPU_RUNTIME_VERSION", "v2-alpha-tpuv6e")
    assert cloud_settings("p").runtime_version("tpu-v5e") == "v2-alpha-tpuv6e"


def test_each_variable_overrides_its_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENDWS_BOOT_IMAGE", "projects/p/global/images/family/cuda")
    monkeypatch.setenv("OPENDWS_NETWORK", "projects/p/global/networks/ml")
    monkeypatch.setenv("OPENDWS_TPU_RUNTIME_VERSION", "v2-alpha-tpuv6e")
    monkeypatch.setenv("OPENDWS_TPU_TIER", "spot")
    settings = cloud_settings("p")
    assert settings.boot_image == "projects/p/global/images/family/cuda"
    assert settings.network == "projects/p/global/networks/ml"
    assert settings.tpu_runtime_version == "v2-alpha-tpuv6e"
    assert settings.tpu_tier == "spot"
    assert settings.tpu_valid_for == CloudSettings(project="p").tpu_valid_for


def test_an_unknown_tpu_tier_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENDWS_TPU_TIER", "preemptible")
    with pytest.raises(
        ValueError, match=r"OPENDWS_TPU_TIER is 'preemptible'.*flex_start, guaranteed, spot"
    ):
        cloud_settings("p")


def test_every_tpu_tier_can_be_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    for tier in TPU_TIERS:
        monkeypatch.setenv("OPENDWS_TPU_TIER", tier)
        assert cloud_settings("p").tpu_tier == tier
