"""A reconciler's world for tests: a clock the test moves (a frozen ManualClock at NOW), a
store, the configuration, the providers and the event bus — in memory by default — plus helpers
to submit requests and run passes. Integration tests build the same world over the emulators."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from opendws.adapters.memory import (
    MemoryCapacityProvider,
    MemoryConfigStore,
    MemoryEventBus,
    MemoryNudger,
    MemoryRequestStore,
    MemoryTimerQueue,
)
from opendws.clock import ManualClock
from opendws.domain.model import CapacityRequest, PolicySettings, Pool, Tenant
from opendws.domain.states import RequestState
from opendws.ports import (
    ConfigStore,
    Configuration,
    Providers,
    RequestRecord,
    RequestStore,
    accepted,
)
from opendws.ports.telemetry import Metrics
from opendws.service.reconcile import PassReport, ReconcileService, ReconcileSettings
from opendws.service.release import EndResult, EndService
from tests.builders import NOW, quota, tenant


def submit(store: RequestStore, request: CapacityRequest) -> RequestRecord:
    """Store ``request`` as intake would: PENDING, with its first event."""
    record, event = accepted(request, request.submitted_at)
    store.create(record, event)
    store.mark_announced(request.request_id, 1)
    return record


def tenants_for(*accelerators: str, names: Iterable[str] = ("t",)) -> tuple[Tenant, ...]:
    """Tenants with ample quota for ``accelerators``."""
    return tuple(tenant(name, *(quota(a, nominal=10_000) for a in accelerators)) for name in names)


@dataclass
class World:
    """Everything one reconciler needs, and what tests look at."""

    clock: ManualClock
    store: RequestStore
    config: ConfigStore
    providers: Providers
    bus: MemoryEventBus
    settings: ReconcileSettings = field(default_factory=ReconcileSettings)
    timers: MemoryTimerQueue | None = None  # None: no timers, the sweep alone ends runs
    nudger: MemoryNudger = field(default_factory=MemoryNudger)
    metrics: Metrics | None = None  # None: nothing is measured

    def reconciler(self, holder: str = "reconciler-1") -> ReconcileService:
        return ReconcileService(
            self.store, self.config, self.providers, self.bus, self.clock,
            holder=holder, settings=self.settings, timers=self.timers, metrics=self.metrics,
        )  # fmt: skip

    def ending(self) -> EndService:
        """The release/cancel/timer service on this world (it needs timers)."""
        assert self.timers is not None, "build the world with timers=True"
        return EndService(
            self.store, self.config, self.providers, self.timers, self.bus, self.nudger,
            self.clock, metrics=self.metrics,
        )  # fmt: skip

    def fire_due(self) -> list[EndResult]:
        """Dispatch every timer due now, as Cloud Tasks would."""
        assert self.timers is not None
        return [self.ending().fire(timer) for timer in self.timers.take_due(self.clock.now())]

    def run(self, holder: str = "reconciler-1") -> PassReport:
        return self.reconciler(holder).run_pass()

    def state(self, request_id: str) -> RequestState:
        record = self.store.get(request_id)
        assert record is not None, f"{request_id} is not stored"
        return record.state

    def record(self, request_id: str) -> RequestRecord:
        record = self.store.get(request_id)
        assert record is not None, f"{request_id} is not stored"
        return record

    def published(self, request_id: str) -> list[tuple[str, str | None, str | None]]:
        """(state, reason, pool) of every event published for ``request_id``."""
        return [
            (event.state.value, event.reason, event.pool)
            for event in self.bus.published
            if event.request_id == request_id
        ]


def memory_world(
    pools: Iterable[Pool],
    tenants: Iterable[Tenant],
    *,
    latency: timedelta = timedelta(seconds=20),
    settings: ReconcileSettings | None = None,
    timers: bool = False,
    configuration: Configuration | None = None,
    policy: PolicySettings | None = None,
) -> tuple[World, MemoryCapacityProvider]:
    """A world in memory: one fake cloud serves all three provider kinds."""
    clock = ManualClock(NOW)
    cloud = MemoryCapacityProvider(clock, latency=latency)
    world = World(
        clock=clock,
        store=MemoryRequestStore(),
        config=MemoryConfigStore(
            configuration
            or Configuration(
                pools=tuple(pools), tenants=tuple(tenants), policy=policy or PolicySettings()
            )
        ),
        providers=Providers(mig_flex=cloud, tpu=cloud, calendar=cloud),
        bus=MemoryEventBus(),
        settings=settings or ReconcileSettings(),
        timers=MemoryTimerQueue() if timers else None,
    )
    return world, cloud
