"""A look at the memory cloud reports again only the orders touched since the last look, and
:class:`~opendws.ports.Providers` makes sightings only of new reports; neither may drift from
what a look that builds everything afresh would find.

Over random series of what the fake cloud does (orders created, served, failed by a stockout,
released, calendar blocks reviewed, cancelled and started, its clock moving), each followed by a
look at some of its pools, every look must report exactly the orders of those pools with their
current fields, and the names :attr:`Providers.changed` gives must include every name whose
report differs in value from the last look's (or that came or went), and only names whose
sighting is not the very object of the last look.

What a look must keep is Google's: a list call returns every resource of what it lists, each
time, not what changed (resize requests per managed instance group,
compute/docs/reference/rest/v1/instanceGroupManagerResizeRequests/list; queued resources per
zone, tpu/docs/reference/rest/v2/projects.locations.queuedResources/list). So a kept view is
only a way to build the same answer: every order of the pools asked, as it is now."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opendws.adapters.memory import MemoryCapacityProvider
from opendws.clock import ManualClock
from opendws.domain.model import Pool
from opendws.ports import Observed, Order, Providers, Sighting
from tests.builders import A3, DAY, HOUR, MINUTE, NOW, calendar, flex, pool, tpu_gang, tpu_pool

ZONES = ("us-central1-a", "us-central1-b")
POOLS: tuple[Pool, ...] = (
    pool(zone=ZONES[0], shape=A3, capacity=4),
    pool(zone=ZONES[1], shape=A3, capacity=2),
    tpu_pool(zone=ZONES[0], capacity=8),
)

_STEP = st.one_of(
    st.tuples(st.just("flex"), st.integers(0, 2), st.integers(1, 3)),
    st.tuples(st.just("block"), st.integers(0, 1), st.integers(1, 3)),
    st.tuples(st.just("release"), st.integers(0, 40)),
    st.tuples(st.just("withdraw"), st.integers(0, 40)),
    st.tuples(st.just("stockout"), st.integers(0, 2)),
    st.tuples(st.just("advance"), st.sampled_from((MINUTE, 20 * MINUTE, HOUR, DAY))),
)


def _afresh(cloud: MemoryCapacityProvider, pools: Sequence[Pool]) -> dict[str, Observed]:
    """What a look that builds every report anew finds: each order of ``pools`` as it is."""
    wanted = {p.pool_id for p in pools}
    return {
        name: Observed(
            name=name,
            pool_id=order.pool.pool_id,
            phase=order.phase,
            error_code=order.error_code,
            message=order.message,
            last_attempt=order.last_attempt,
            locked_at=order.locked_at,
            ends_at=order.calendar_end,
            hosts=order.hosts(),
        )
        for name, order in cloud._orders.items()
        if order.pool.pool_id in wanted
    }


@given(
    steps=st.lists(
        st.tuples(_STEP, st.sets(st.integers(0, len(POOLS) - 1), min_size=1)), max_size=30
    )
)
def test_a_kept_look_reports_what_a_look_afresh_finds(
    steps: list[tuple[tuple[object, ...], set[int]]],
) -> None:
    clock = ManualClock(NOW)
    cloud = MemoryCapacityProvider(clock, latency=timedelta(seconds=20))
    for where in POOLS:
        cloud.set_stock(where.zone, where.shape, where.capacity)
    providers = Providers(mig_flex=cloud, tpu=cloud, calendar=cloud)
    orders: list[Order] = []
    last: dict[str, Sighting] = {}
    for index, (step, looked_at) in enumerate(steps):
        match step:
            case ("flex", at, units):
                assert isinstance(at, int)
                assert isinstance(units, int)
                where = POOLS[at]
                tpu = where.pool_id == POOLS[2].pool_id
                request = flex(
                    f"f{index}", vm_count=units, locations=(where.zone,),
                    shape=tpu_gang(units) if tpu else None,
                )  # fmt: skip
                order = Order(request=request, pool=where, attempt=1)
                cloud.provision(order)
                orders.append(order)
            case ("block", at, units):
                assert isinstance(at, int)
                assert isinstance(units, int)
                start = clock.now() + 2 * DAY
                request = calendar(
                    f"b{index}", vm_count=units, days=1, start_at=start,
                    locations=(POOLS[at].zone,),
                )  # fmt: skip
                order = Order(request=request, pool=POOLS[at], attempt=1)
                cloud.reserve(order)
                orders.append(order)
            case ("release", which) if orders:
                assert isinstance(which, int)
                order = orders[which % len(orders)]
                cloud.release(order.name, order.pool)
            case ("withdraw", which) if orders:
                assert isinstance(which, int)
                order = orders[which % len(orders)]
                if order.request.start_at is not None:
                    cloud.withdraw(order.name, order.pool)
            case ("stockout", at):
                assert isinstance(at, int)
                cloud.inject(POOLS[at].zone, POOLS[at].shape, "stockout")
            case ("advance", by):
                assert isinstance(by, timedelta)
                clock.advance(by)
        pools = [POOLS[at] for at in sorted(looked_at)]
        seen = cloud.observe(pools)
        assert seen == _afresh(cloud, pools)
        sightings = providers.observe(pools)
        assert {name: s.observed for name, s in sightings.items()} == _afresh(cloud, pools)
        changed = providers.changed
        by_value = {
            n for n in sightings if n not in last or last[n].observed != sightings[n].observed
        }
        by_identity = {n for n in sightings if last.get(n) is not sightings[n]}
        gone = last.keys() - sightings.keys()
        assert by_value | gone <= changed <= by_identity | gone
        last = sightings


class _Failing(MemoryCapacityProvider):
    """The memory cloud, whose look fails once when told to (a transient error of Google's)."""

    fail = False

    def observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        if self.fail:
            self.fail = False
            raise RuntimeError("503 Service Unavailable: backendError")
        return super().observe(pools)


def test_a_look_cut_short_by_a_providers_error_leaves_the_next_look_whole() -> None:
    """A look that fails at its second provider, after the first one's orders changed (and
    over fewer pools), must not leave the first one's kept sightings half brought up to date:
    the next look still reports every order, and names every one that came or went since the
    last whole look."""
    clock = ManualClock(NOW)
    gpus = MemoryCapacityProvider(clock, latency=timedelta(seconds=20))
    tpus = _Failing(clock, latency=timedelta(seconds=20))
    for where in POOLS:
        gpus.set_stock(where.zone, where.shape, where.capacity)
        tpus.set_stock(where.zone, where.shape, where.capacity)
    providers = Providers(mig_flex=gpus, tpu=tpus, calendar=gpus)
    first = [Order(request=flex(f"f{i}", locations=(ZONES[i % 2],)), pool=POOLS[i % 2],
                   attempt=1) for i in range(3)]  # fmt: skip
    for order in first:
        gpus.provision(order)
    tpus.provision(Order(request=flex("t0", shape=tpu_gang(1)), pool=POOLS[2], attempt=1))
    whole = providers.observe(POOLS)
    assert set(whole) == {order.name for order in first} | {
        Order(request=flex("t0"), pool=POOLS[2], attempt=1).name
    }
    gpus.release(first[0].name, POOLS[0])
    later = Order(request=flex("f9", locations=(ZONES[0],)), pool=POOLS[0], attempt=1)
    gpus.provision(later)
    tpus.fail = True
    with pytest.raises(RuntimeError):  # a narrowed look (not the second pool), cut short
        providers.observe([POOLS[0], POOLS[2]])
    again = providers.observe(POOLS)
    assert {name: s.observed for name, s in again.items()} == _afresh(gpus, POOLS[:2]) | (
        _afresh(tpus, POOLS[2:])
    )
    assert {first[0].name, later.name} <= providers.changed
