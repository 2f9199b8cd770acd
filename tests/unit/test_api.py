"""The HTTP API over in-memory fakes: keys, what each tenant may see and do, admins."""

from __future__ import annotations

import pytest

from opendws.domain.states import RequestState
from opendws.ports import Configuration
from opendws.service.api import ApiService, key_digest
from opendws.service.queries import QueryService
from opendws.service.usage import UsageService
from tests.builders import A3, DAY, H100, HOUR, MINUTE, NOW, calendar, flex, pool, quota, tenant
from tests.world import World, memory_world, submit, tenants_for

# As the api keeps them: each key's digest, never the key.
KEYS = {key_digest(key): tenant for key, tenant in
        [("k-vision", "vision"), ("k-speech", "speech"), ("k-admin", "admin")]}  # fmt: skip
ZONE = "us-central1-a"


@pytest.fixture
def world_api() -> tuple[World, ApiService]:
    configuration = Configuration(
        pools=(pool(zone=ZONE, capacity=4),), tenants=tenants_for(H100, names=("vision", "speech"))
    )
    world, cloud = memory_world((), (), timers=True, configuration=configuration)
    cloud.set_stock(ZONE, A3, 4)
    submit(world.store, flex("mine", tenant="vision", vm_count=4, hours=2))
    submit(world.store, flex("theirs", tenant="speech", vm_count=4, hours=3,
                             submitted_at=NOW + MINUTE))  # fmt: skip
    world.run()
    queries = QueryService(world.store, world.store, world.config)
    api = ApiService(world.store, queries, UsageService(world.store),
                     world.ending, world.clock, KEYS)  # fmt: skip
    return world, api


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_every_route_but_the_page_needs_a_known_key(world_api: tuple[World, ApiService]) -> None:
    _, api = world_api
    assert api.handle("GET", "/", {}).status == 200
    assert "<title>opendws</title>" in str(api.handle("GET", "/dashboard", {}).body)
    for headers in ({}, auth("guess"), {"Authorization": "Basic k-vision"}):
        assert api.handle("GET", "/queue", headers).status == 401
    assert api.handle("GET", "/nowhere", auth("k-vision")).status == 404


def test_a_tenant_sees_only_its_own_requests(world_api: tuple[World, ApiService]) -> None:
    _, api = world_api
    mine = api.handle("GET", "/requests/mine", auth("k-vision"))
    assert mine.status == 200
    assert isinstance(mine.body, dict)
    assert (mine.body["state"], len(mine.body["events"])) == ("PROVISIONING", 2)
    assert api.handle("GET", "/requests/theirs", auth("k-vision")).status == 404
    assert api.handle("GET", "/queue", auth("k-vision")).body == []
    queue = api.handle("GET", "/queue", auth("k-admin")).body
    assert [e["request_id"] for e in queue] == ["theirs"]  # type: ignore[index]
    timeline = api.handle("GET", "/timeline", auth("k-vision")).body
    assert isinstance(timeline, dict)
    [spans] = timeline["pools"].values()
    assert [(s["request_id"], s["state"]) for s in spans] == [
        ("mine", "PROVISIONING"), ("other", "PENDING"),
    ]  # fmt: skip


def test_cancel_and_release_through_the_api(world_api: tuple[World, ApiService]) -> None:
    world, api = world_api
    refused = api.handle("POST", "/requests/theirs/cancel", auth("k-vision"))
    assert refused.status == 404  # another tenant's request is not revealed
    assert world.state("theirs") is RequestState.PENDING
    assert api.handle("POST", "/requests/ghost/cancel", auth("k-vision")).status == 404
    done = api.handle("POST", "/requests/theirs/cancel", auth("k-speech"))
    assert (done.status, done.body["state"]) == (200, "CANCELLED")  # type: ignore[call-overload, index]
    running = api.handle("POST", "/requests/theirs/release", auth("k-speech"))
    assert running.status == 200  # already cancelled: nothing more to do
    assert running.body["outcome"] == "ALREADY_ENDED"  # type: ignore[call-overload, index]
    released = api.handle("POST", "/requests/mine/release", auth("k-admin"))
    assert released.status == 200
    assert world.state("mine") is RequestState.CANCELLED  # it was still provisioning
    usage = api.handle("GET", "/usage", auth("k-speech")).body
    assert [(u["tenant"], u["outcomes"]) for u in usage] == [  # type: ignore[index]
        ("speech", {"CANCELLED": 1})
    ]


def test_cancelling_a_running_request_is_a_conflict(world_api: tuple[World, ApiService]) -> None:
    world, api = world_api
    world.clock.advance(world.settings.lease_ttl)
    world.run()  # "mine" is ready: ACTIVE
    assert world.state("mine") is RequestState.ACTIVE
    answer = api.handle("POST", "/requests/mine/cancel", auth("k-vision"))
    assert answer.status == 409
    assert "release it" in answer.body["message"]  # type: ignore[call-overload, index]


def test_only_digests_of_keys_are_kept_and_a_digest_is_no_key(
    world_api: tuple[World, ApiService],
) -> None:
    """A leaked configuration (the digests) lets no one in: the digest itself is refused."""
    _, api = world_api
    assert api.handle("GET", "/queue", auth(key_digest("k-vision"))).status == 401
    assert api.handle("GET", "/queue", auth("k-vision")).status == 200
    assert api.handle("GET", "/queue", auth("k-vision ")).status == 200  # surrounding space
    assert api.handle("GET", "/queue", auth("k-visio")).status == 401


def test_the_timeline_shows_each_pools_capacity_and_kinds_within_the_horizon(
    world_api: tuple[World, ApiService],
) -> None:
    world, api = world_api
    submit(world.store, calendar("block", tenant="vision", vm_count=1, days=1,
                                 start_at=NOW + 10 * DAY))  # fmt: skip
    world.run()
    world.clock.advance(2 * MINUTE)  # Google approves the block: booked
    world.run()
    day = api.handle("GET", "/timeline", auth("k-vision"), {"horizon": "24h"}).body
    assert isinstance(day, dict)
    assert (day["horizon"], day["capacity"]) == ("24h", {f"{ZONE}/{A3}": 4})
    assert [(s["request_id"], s["kind"]) for s in day["pools"][f"{ZONE}/{A3}"]] == [
        ("mine", "running"), ("other", "planned"),
    ]  # fmt: skip
    assert api.handle("GET", "/timeline", auth("k-vision")).body == day  # 24 h by default
    # The block, ten days ahead, is seen only over the long horizons.
    week = api.handle("GET", "/timeline", auth("k-vision"), {"horizon": "7d"}).body
    months = api.handle("GET", "/timeline", auth("k-vision"), {"horizon": "120d"}).body
    assert isinstance(week, dict)
    assert isinstance(months, dict)
    assert "block" not in [s["kind"] for s in week["pools"][f"{ZONE}/{A3}"]]
    spans = months["pools"][f"{ZONE}/{A3}"]
    assert ("block", "block", "BOOKED") in [(s["request_id"], s["kind"], s["state"]) for s in spans]
    assert months["end"] == (world.clock.now() + 120 * DAY).isoformat()


def test_a_horizon_or_days_out_of_range_is_a_bad_request(
    world_api: tuple[World, ApiService],
) -> None:
    _, api = world_api
    answer = api.handle("GET", "/timeline", auth("k-vision"), {"horizon": "3d"})
    assert answer.status == 400
    assert "horizon must be one of 24h, 7d, 120d, not '3d'" in str(answer.body)
    for days in ("0", "121", "thirty", "-1"):
        answer = api.handle("GET", "/usage/daily", auth("k-vision"), {"days": days})
        assert answer.status == 400
        assert "days must be a whole number from 1 to 120" in str(answer.body)
    assert api.handle("GET", "/quota", {}).status == 401
    assert api.handle("GET", "/usage/daily", {}).status == 401


def test_quota_shows_a_tenant_only_its_own_use_against_its_limits() -> None:
    configuration = Configuration(
        pools=(pool(zone=ZONE, capacity=8),),
        tenants=(
            tenant("vision", quota(H100, nominal=64, borrowing_limit=32), cohort="research"),
            tenant("speech", quota(H100, nominal=32), cohort="research"),
        ),
    )
    world, cloud = memory_world((), (), configuration=configuration)
    cloud.set_stock(ZONE, A3, 8)
    submit(world.store, flex("mine", tenant="vision", vm_count=4, hours=2))  # 32 H100s
    submit(world.store, flex("theirs", tenant="speech", vm_count=1, hours=2))  # 8 H100s
    world.run()
    queries = QueryService(world.store, world.store, world.config)
    api = ApiService(world.store, queries, UsageService(world.store), world.ending,
                     world.clock, KEYS)  # fmt: skip
    mine = api.handle("GET", "/quota", auth("k-vision")).body
    assert mine == [{
        "tenant": "vision", "accelerator": H100, "cohort": "research", "in_use": 32,
        "nominal": 64, "borrowing_limit": 32, "ceiling": 96,
    }]  # fmt: skip
    every = api.handle("GET", "/quota", auth("k-admin")).body
    assert [(q["tenant"], q["in_use"], q["ceiling"]) for q in every] == [  # type: ignore[index]
        ("speech", 8, 96), ("vision", 32, 96),
    ]  # fmt: skip


def test_daily_usage_shows_a_tenant_its_own_hours_and_cost_per_day(
    world_api: tuple[World, ApiService],
) -> None:
    world, api = world_api
    world.clock.advance(world.settings.lease_ttl)
    world.run()  # "mine" is ACTIVE
    world.clock.advance(HOUR)
    assert api.handle("POST", "/requests/mine/release", auth("k-vision")).status == 200
    mine = api.handle("GET", "/usage/daily", auth("k-vision")).body
    assert isinstance(mine, dict)
    assert len(mine["days"]) == 30
    assert mine["days"][-1] == NOW.date().isoformat()
    [series] = mine["tenants"]
    assert series["tenant"] == "vision"
    assert series["used_hours"][:-1] == [0.0] * 29
    assert series["used_hours"][-1] == pytest.approx(32.0)  # 4 VMs × 8 H100s × 1 h
    assert series["cost"] == [None] * 30  # no price is configured
    assert api.handle("GET", "/usage/daily", auth("k-speech")).body == {
        "days": mine["days"], "tenants": [],
    }  # fmt: skip
    week = api.handle("GET", "/usage/daily", auth("k-admin"), {"days": "7"}).body
    assert [len(s["used_hours"]) for s in week["tenants"]] == [7]  # type: ignore[index, call-overload]
