"""How capacity is created comes from the environment Terraform gives the functions."""

from __future__ import annotations

import pytest

from opendws.adapters.gce import CloudSettings
from opendws.bootstrap import CLOUD_SETTINGS_ENVIRONMENT, cloud_settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in CLOUD_SETTINGS_ENVIRONMENT:
        monkeypatch.delenv(variable, raising=False)


def test_without_the_variables_the_defaults_hold() -> None:
    assert cloud_settings("p") == CloudSettings(project="p")


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
    with pytest.raises(ValueError, match=r"OPENDWS_TPU_TIER is 'preemptible'.*guaranteed, spot"):
        cloud_settings("p")
