"""The burst benchmark's own arithmetic and naming (bench/burst.py): which cloud resources are
the bench's, the rate its quotas allow, and that its configuration is one opendws accepts."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from types import ModuleType, SimpleNamespace

import pytest
import yaml

from opendws.config import configuration_to_apply
from opendws.ports import order_name
from tests.bench_modules import load_bench

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def burst() -> ModuleType:
    return load_bench("burst", "bench_burst")


def test_a_request_owns_its_orders_and_their_vms_of_any_attempt(burst: ModuleType) -> None:
    run = burst.Burst(["burst-00001", "burst-00002"])
    order = order_name("burst-00002", 3)
    assert run.request_of(order) == "burst-00002"
    assert run.request_of(f"{order}-0") == "burst-00002"
    assert run.request_of(f"zones/us-central1-a/instances/{order}-0") == "burst-00002"
    assert run.request_of(order_name("someone-else", 1)) is None
    assert run.request_of("a-vm-of-another-kind") is None


def test_the_quota_allows_the_least_rate_over_each_location_and_group(burst: ModuleType) -> None:
    counter = SimpleNamespace(
        accepted=Counter({("us-central1", "write"): 400, ("us-central1", "read"): 100,
                          ("global", "write"): 1}),
        refused=Counter({("us-central1", "write"): 7}),
    )  # fmt: skip
    figures = burst.quota_figures(counter, {"write": 1500, "read": 1500}, 100)
    # 4 writes a request against 1,500 a minute: 25/60 = 6.25 requests a second.
    assert figures["quota_allowed_per_s"] == 6.25
    assert figures["calls_per_request"] == {
        "global/write": 0.01, "us-central1/read": 1.0, "us-central1/write": 4.0,
    }  # fmt: skip
    assert figures["rate_limited_calls"] == 7


def test_its_configuration_has_room_for_every_request_and_the_warm_up(burst: ModuleType) -> None:
    configuration = configuration_to_apply(
        yaml.safe_load(burst.configuration(2000)), source="burst", now=datetime.now(UTC)
    )
    (pool,) = configuration.pools
    (tenant,) = configuration.tenants
    # Every request and the warm-up request that runs before them.
    assert (pool.zone, pool.shape, pool.capacity) == (burst.ZONE, burst.SHAPE, 2001)
    assert tenant.name == burst.TENANT
    assert [(q.accelerator, q.nominal) for q in tenant.quotas] == [(burst.ACCELERATOR, 2001)]
