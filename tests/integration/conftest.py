"""A reconciler's world on the emulators: Firestore (official emulator) for requests, lease and
configuration, and the real Compute Engine / Cloud TPU clients over the project's emulator of
a simulated cloud, whose clock moves with the reconciler's."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest

from emulators import ComputeEmulator
from opendws.adapters.memory import MemoryEventBus
from opendws.bootstrap import capacity_providers
from opendws.clock import ManualClock
from opendws.domain.states import RequestState
from opendws.ports import Configuration, order_name, submitted
from opendws.service.reconcile import ReconcileSettings
from opendws.sim import SimulatedCloud
from tests.builders import A3, H100, NOW, V5E, pool, tpu_pool
from tests.world import World, tenants_for

ZONE_A, ZONE_B = "us-central1-a", "us-central1-b"
POOL_A, POOL_B = f"{ZONE_A}/{A3}", f"{ZONE_B}/{A3}"
LATENCY = timedelta(seconds=20)


@dataclass
class Stack:
    """A world on the emulators, with the simulated cloud behind the Compute emulator."""

    world: World
    cloud: SimulatedCloud
    project: str

    def advance(self, delta: timedelta) -> None:
        """Move the reconciler's clock and the cloud's together."""
        self.world.clock.advance(delta)
        self.cloud.advance(delta)

    def run(self, holder: str = "reconciler-1") -> None:
        self.world.run(holder)

    def left_running(self) -> list[str]:
        """VMs, queued TPU resources and resize requests still waiting at Google that belong
        to no live request: what would run (and bill) unowned on Google."""
        records = [
            *self.world.store.in_states(
                RequestState.PROVISIONING, RequestState.ACTIVE, RequestState.BOOKED
            ),
            *filter(submitted, self.world.store.in_states(RequestState.PENDING)),
        ]
        live = {
            order_name(record.request_id, lane.attempt)
            for record in records
            for lane in record.orders
        }
        state = self.cloud.state()["resources"]
        assert isinstance(state, dict)
        left: list[str] = []
        for resources in state.values():
            for vm in resources.get("instances", []):
                if vm["name"].rsplit("-", 1)[0] not in live:
                    left.append(f"instance {vm['name']}")
            for request in resources.get("resizeRequests", []):
                if request["state"] in ("ACCEPTED", "CREATING") and request["name"] not in live:
                    left.append(f"resize request {request['name']}")
            for queued in resources.get("queuedResources", []):
                name = queued["name"].rsplit("/", 1)[-1]
                if queued["state"]["state"] not in ("FAILED", "SUSPENDED") and name not in live:
                    left.append(f"queued resource {name}")
        return sorted(left)


@pytest.fixture
def stack(emulator_project: str) -> Iterator[Stack]:
    """Two zones of 4 A3 VMs and a 16-chip v5e pool, in stock; ample quota."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    from opendws.adapters.firestore import FirestoreConfigStore, FirestoreRequestStore

    cloud = SimulatedCloud(
        ManualClock(NOW), provisioning_latency=LATENCY, operation_latency=timedelta(0)
    )
    for zone in (ZONE_A, ZONE_B):
        cloud.set_stock(zone, A3, 4)
    cloud.set_stock(ZONE_A, "V5LITE_POD", 16)
    client = firestore.Client(project=emulator_project, credentials=AnonymousCredentials())
    config = FirestoreConfigStore(client)
    config.save(
        Configuration(
            pools=(
                pool(zone=ZONE_A, capacity=4),
                pool(zone=ZONE_B, capacity=4),
                tpu_pool(zone=ZONE_A, capacity=16),
            ),
            tenants=tenants_for(H100, V5E),
        )
    )
    with ComputeEmulator(cloud) as emulator:
        world = World(
            clock=ManualClock(NOW),
            store=FirestoreRequestStore(client),
            config=config,
            providers=capacity_providers(emulator_project, endpoint=emulator.endpoint),
            bus=MemoryEventBus(),
            settings=ReconcileSettings(),
        )
        yield Stack(world=world, cloud=cloud, project=emulator_project)
    client.close()
