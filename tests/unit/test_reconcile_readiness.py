"""The reconciler learns how long Google takes to serve an admitted request in each pool, and
tells every waiting request both times: ``eta`` (when opendws admits it) and ``ready_eta``
(when its capacity is expected to run: eta + the pool's recent admission → ACTIVE median, and
its 90th percentile)."""

from __future__ import annotations

from datetime import timedelta

from opendws.domain.readiness import ReadySample
from opendws.domain.states import RequestState
from opendws.service.api import ApiService, key_digest
from opendws.service.queries import QueryService
from opendws.service.usage import UsageService
from tests.builders import A3, H100, NOW, ZONE, flex, pool
from tests.world import memory_world, submit, tenants_for

S = RequestState
POOL = f"{ZONE}/{A3}"
GOOGLE = timedelta(minutes=10)  # the fake cloud's time from an order to its running VMs


def test_a_waiting_request_is_told_when_it_is_admitted_and_when_it_will_run() -> None:
    world, cloud = memory_world([pool(capacity=4)], tenants_for(H100), latency=GOOGLE)
    cloud.set_stock(ZONE, A3, 4)
    for name in ("a", "b", "c"):
        submit(world.store, flex(name, vm_count=1, hours=1))
    world.run()
    assert {world.state(name) for name in ("a", "b", "c")} == {S.PROVISIONING}
    world.clock.advance(GOOGLE)
    world.run()
    assert {world.state(name) for name in ("a", "b", "c")} == {S.ACTIVE}
    served = [ReadySample(request_id=name, at=NOW + GOOGLE, took=GOOGLE) for name in "abc"]
    assert world.store.ready_samples() == {POOL: tuple(served)}

    # A gang of the whole pool waits for the three runs to end; its event says both times.
    submit(world.store, flex("big", vm_count=4, hours=1, submitted_at=NOW + GOOGLE))
    world.run()
    world.run()  # a repeated pass records no sample twice and announces nothing new
    assert world.store.ready_samples() == {POOL: tuple(served)}
    record = world.record("big")
    assert record.state is S.PENDING
    assert record.eta is not None
    assert record.eta == NOW + GOOGLE + timedelta(hours=1)
    told = [event for event in world.bus.published if event.request_id == "big"][-1]
    assert (told.eta, told.ready_eta, told.ready_eta_p90) == (
        record.eta, record.eta + GOOGLE, record.eta + GOOGLE,
    )  # fmt: skip

    # The queue, the API and `dws status` read the same two times.
    queries = QueryService(world.store, world.store, world.config)
    (entry,) = queries.queue(world.clock.now())
    assert (entry.eta, entry.ready_eta, entry.ready_eta_p90) == (
        told.eta, told.ready_eta, told.ready_eta_p90,
    )  # fmt: skip
    api = ApiService(world.store, queries, UsageService(world.store), world.ending,
                     world.clock, {key_digest("key"): "t"})  # fmt: skip
    body = api.handle("GET", "/requests/big", {"Authorization": "Bearer key"}).body
    assert isinstance(body, dict)
    assert body["ready_eta"] == (record.eta + GOOGLE).isoformat()
    assert body["ready_eta_p90"] == (record.eta + GOOGLE).isoformat()


def test_a_pool_without_history_gives_no_ready_eta() -> None:
    """An estimate needs a few requests Google served there lately: until then the ready ETA
    is unknown (null), never made up."""
    world, cloud = memory_world([pool(capacity=4)], tenants_for(H100), latency=GOOGLE)
    cloud.set_stock(ZONE, A3, 4)
    submit(world.store, flex("a", vm_count=4, hours=1))
    world.run()
    world.clock.advance(GOOGLE)
    world.run()
    submit(world.store, flex("b", vm_count=4, hours=1, submitted_at=NOW + GOOGLE))
    world.run()
    record = world.record("b")
    assert record.eta is not None
    told = [event for event in world.bus.published if event.request_id == "b"][-1]
    assert (told.eta, told.ready_eta, told.ready_eta_p90) == (record.eta, None, None)
    (entry,) = QueryService(world.store, world.store, world.config).queue(world.clock.now())
    assert (entry.ready_eta, entry.ready_eta_p90) == (None, None)
