"""``dws submit`` from flags: validated before it is published; a TPU slice needs no
``--vm-count``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from opendws import bootstrap
from opendws.adapters.memory import (
    MemoryConfigStore,
    MemoryEventBus,
    MemoryNudger,
    MemoryRequestPublisher,
    MemoryRequestStore,
)
from opendws.cli import main
from opendws.clock import SystemClock


@pytest.fixture
def publisher() -> Iterator[MemoryRequestPublisher]:
    publisher = MemoryRequestPublisher()
    adapters = bootstrap.Adapters(
        store=MemoryRequestStore(), config=MemoryConfigStore(), events=MemoryEventBus(),
        nudger=MemoryNudger(), publisher=publisher, clock=SystemClock(),
    )  # fmt: skip
    settings = bootstrap.Settings.from_environment({"OPENDWS_PROJECT": "cli-test"})
    previous = bootstrap.use(bootstrap.Container(settings, adapters=adapters))
    yield publisher
    bootstrap.use(previous)


TPU = ["submit", "--id", "tpu-1", "--tenant", "vision", "--accelerator", "tpu-v5e",
       "--topology", "4x4", "--location", "us-west4-a", "--run", "6h"]  # fmt: skip


def test_a_tpu_slice_is_one_slice_unless_asked(publisher: MemoryRequestPublisher) -> None:
    result = CliRunner().invoke(main, TPU)
    assert result.exit_code == 0, result.output
    assert publisher.messages[-1]["gang"] == {
        "vm_count": 1, "accelerator": "tpu-v5e", "topology": "4x4",
    }  # fmt: skip
    result = CliRunner().invoke(main, [*TPU, "--vm-count", "2"])
    assert result.exit_code == 0, result.output
    assert publisher.messages[-1]["gang"]["vm_count"] == 2


def test_a_gpu_gang_still_needs_its_vm_count(publisher: MemoryRequestPublisher) -> None:
    result = CliRunner().invoke(main, [
        "submit", "--tenant", "vision", "--machine-type", "a3-highgpu-8g",
        "--accelerator", "nvidia-h100-80gb", "--location", "us-central1-a", "--run", "6h",
    ])  # fmt: skip
    assert result.exit_code == 2
    assert "gang.vm_count" in result.output
    assert publisher.messages == []
