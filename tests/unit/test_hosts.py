"""Where the capacity is: once a request is ACTIVE its record, its ACTIVE event (stored and
published, ``opendws.event/v1``), ``Client.status`` and the api's ``GET /requests/{id}`` carry
its hosts — one per VM, ``{order}-{i}`` at rank i, in rank order, with the zone and the
internal address the cloud reported (DESIGN.md, "Work on the gang"); no other state has any."""

from __future__ import annotations

from datetime import timedelta

import pytest

from opendws import bootstrap
from opendws.adapters.memory import MemoryNudger, MemoryRequestPublisher
from opendws.client import Client
from opendws.domain.states import RequestState
from opendws.ports import Change, Host, StatusEvent, hosts_after, order_name
from opendws.service.api import ApiService, key_digest
from opendws.service.queries import QueryService
from opendws.service.usage import UsageService
from tests.builders import A3, H100, HOUR, NOW, calendar, flex, pool
from tests.world import World, memory_world, submit, tenants_for

S = RequestState
ZONE = "us-central1-a"
LATENCY = timedelta(seconds=20)


@pytest.fixture
def world() -> World:
    world, cloud = memory_world([pool(zone=ZONE, capacity=8)], tenants_for(H100))
    cloud.set_stock(ZONE, A3, 8)
    return world


def _active(world: World, request_id: str, vm_count: int) -> None:
    submit(world.store, flex(request_id, vm_count=vm_count, hours=6, locations=(ZONE,)))
    world.run()
    world.clock.advance(LATENCY)
    world.run()
    assert world.state(request_id) is S.ACTIVE


def _where(hosts: tuple[Host, ...]) -> list[tuple[int, str, str]]:
    return [(host.rank, host.name, host.zone) for host in hosts]


def test_an_active_requests_record_and_active_event_carry_its_hosts_in_rank_order(
    world: World,
) -> None:
    _active(world, "train", vm_count=3)
    order = order_name("train", 1)
    expected = [(rank, f"{order}-{rank}", ZONE) for rank in range(3)]
    record = world.record("train")
    assert _where(record.hosts) == expected
    assert len({host.internal_ip for host in record.hosts}) == 3
    stored = world.store.events("train")
    assert [(e.state, bool(e.hosts)) for e in stored] == [
        (S.PENDING, False), (S.PROVISIONING, False), (S.ACTIVE, True),
    ]  # fmt: skip
    assert stored[-1].hosts == record.hosts
    published = [e for e in world.bus.published if e.request_id == "train"]
    assert published[-1].state is S.ACTIVE
    assert published[-1].hosts == record.hosts
    shown = published[-1].to_json()["hosts"]
    assert [(h["rank"], h["name"], h["zone"]) for h in shown] == expected
    assert [h["internal_ip"] for h in shown] == [h.internal_ip for h in record.hosts]


def test_a_calendar_block_carries_the_hosts_of_the_vms_that_consume_it() -> None:
    world, cloud = memory_world([pool(zone=ZONE, capacity=8)], tenants_for(H100))
    cloud.set_stock(ZONE, A3, 8)
    start = NOW + 2 * HOUR
    submit(world.store, calendar("block", vm_count=2, days=1, start_at=start, locations=(ZONE,)))
    for step in (timedelta(0), timedelta(minutes=3), start - NOW, LATENCY, LATENCY):
        world.clock.advance(step)
        world.run()
    assert world.state("block") is S.ACTIVE
    order = order_name("block", world.record("block").attempt)
    assert _where(world.record("block").hosts) == [(i, f"{order}-{i}", ZONE) for i in range(2)]


def test_the_client_and_the_api_show_the_hosts(world: World) -> None:
    _active(world, "train", vm_count=2)
    adapters = bootstrap.Adapters(
        store=world.store, config=world.config, events=world.bus, nudger=MemoryNudger(),
        publisher=MemoryRequestPublisher(), clock=world.clock,
    )  # fmt: skip
    container = bootstrap.Container(bootstrap.Settings(project="hosts"), adapters=adapters)
    status = Client(container=container).status("train")
    assert status.hosts == world.record("train").hosts
    as_json = status.to_json()["hosts"]
    assert [h["rank"] for h in as_json] == [0, 1]
    assert as_json == [host.to_json() for host in status.hosts]
    api = ApiService(
        world.store, QueryService(world.store, world.store, world.config),
        UsageService(world.store), lambda: container.end, world.clock,
        {key_digest("admin-key"): "admin"},
    )  # fmt: skip
    answer = api.handle("GET", "/requests/train", {"Authorization": "Bearer admin-key"})
    assert isinstance(answer.body, dict)
    assert answer.body["hosts"] == as_json
    assert answer.body["events"][-1]["hosts"] == as_json


def test_only_an_active_request_has_hosts() -> None:
    """Back in line, released or expired, its VMs are no longer its own: a change to any other
    state leaves none; a revision while ACTIVE keeps them."""
    hosts = (Host(rank=1, name="o-1", zone=ZONE, internal_ip="10.128.0.3"),
             Host(rank=0, name="o-0", zone=ZONE, internal_ip="10.128.0.2"))  # fmt: skip
    ordered = tuple(sorted(hosts, key=lambda host: host.rank))
    assert hosts_after((), S.ACTIVE, hosts) == ordered
    assert hosts_after(ordered, S.ACTIVE, None) == ordered
    for state in (S.RELEASED, S.EXPIRED, S.PENDING, S.PROVISIONING):
        assert hosts_after(ordered, state, None) == ()


def test_a_release_leaves_the_record_without_hosts(world: World) -> None:
    _active(world, "train", vm_count=2)
    record = world.record("train")
    event = StatusEvent(
        request_id="train", tenant=record.tenant, state=S.RELEASED, previous_state=S.ACTIVE,
        at=world.clock.now(),
    )  # fmt: skip
    change = Change(expected_version=record.version, state=S.RELEASED, event=event)
    assert world.store.change("train", change).hosts == ()


def test_the_event_json_has_hosts_only_when_the_event_has_them() -> None:
    """``opendws.event/v1`` is additive: an event without hosts reads as before (no key), an
    ACTIVE one has ``hosts`` in rank order; JSON written before hosts existed reads back with
    none."""
    event = StatusEvent(
        request_id="r", tenant="t", state=S.ACTIVE, previous_state=S.PROVISIONING, at=NOW,
        hosts=(Host(rank=0, name="o-0", zone=ZONE, internal_ip="10.128.0.2",
                    external_ip="34.0.0.2"),),
    )  # fmt: skip
    data = event.to_json()
    assert data["hosts"] == [{"rank": 0, "name": "o-0", "zone": ZONE,
                              "internal_ip": "10.128.0.2", "external_ip": "34.0.0.2"}]  # fmt: skip
    assert StatusEvent.from_json(data) == event
    bare = StatusEvent(request_id="r", tenant="t", state=S.PENDING, previous_state=None, at=NOW)
    assert "hosts" not in bare.to_json()
    assert StatusEvent.from_json(bare.to_json()).hosts == ()
