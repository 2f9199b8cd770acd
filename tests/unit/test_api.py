"""The HTTP API over in-memory fakes: keys, what each tenant may see and do, admins."""

from __future__ import annotations

import pytest

from opendws.domain.states import RequestState
from opendws.ports import Configuration
from opendws.service.api import ApiService, key_digest
from opendws.service.queries import QueryService
from opendws.service.usage import UsageService
from tests.builders import A3, H100, MINUTE, NOW, flex, pool
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
    api = ApiService(world.store, QueryService(world.store, world.store), UsageService(world.store),
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
