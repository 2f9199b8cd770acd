"""A look at the memory cloud reports again only the orders touched since the last look, and
:class:`~opendws.ports.Providers` makes sightings only of new reports; neither may drift from
what a look that builds everything afresh would find.

Over random series of what the fake cloud does (orders created, served, failed by a stockout,
released, calendar blocks reviewed, cancelled and started, its clock moving), each followed by a
look at some of its pools, every look must report exactly the orders of those pools with their
current fields, and the names :attr:`Providers.changed` gives must include every name whose
report differs in value from the last look's (or that came or went), and only names whose
sighting is not the very object of the last look."""

from __future__ import annotations

from datetime import timedelta

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


def _afresh(cloud: MemoryCapacityProvider, pools: list[Pool]) -> dict[str, Observed]:
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
