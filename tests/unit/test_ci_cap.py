"""A CI mapping's ``max_vms``: its jobs never hold more VMs at once; a job over the cap waits
(PENDING, never refused) and is admitted when one of the mapping's VMs is given back."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from opendws.domain.run import CiRunner, RunSpec
from opendws.domain.states import RequestState
from opendws.ports.configuration import CiMapping, GitHubRunners
from tests.builders import A3, H100, flex, pool
from tests.world import World, memory_world, submit, tenants_for

S = RequestState
ZONE = "us-central1-a"
KEY = "projects/demo-opendws/secrets/app-key/versions/latest"


def mapping(cap: int | None) -> CiMapping:
    return CiMapping(
        provider="github", labels=frozenset({"gpu-h100"}), template={"tenant": "t"},
        github=GitHubRunners(app_id=1, installation_id=2, private_key_secret=KEY,
                             organization="acme"),
        max_vms=cap,
    )  # fmt: skip


def ci_request(request_id: str, minute: int, tenant: str = "t") -> Any:
    base = flex(request_id, vm_count=1, hours=2, locations=(ZONE,), tenant=tenant)
    return replace(
        base, submitted_at=base.submitted_at + timedelta(minutes=minute),
        run=RunSpec(command=(), runner=CiRunner.of("github", ["gpu-h100"], "acme/app")),
    )  # fmt: skip


def world_with(cap: int | None, jobs: int) -> World:
    world, cloud = memory_world(
        [pool(zone=ZONE, capacity=8)], tenants_for(H100, names=("t",)), timers=True
    )
    cloud.set_stock(ZONE, A3, 8)
    world.config.save(replace(world.config.load(), ci=(mapping(cap),)))
    for n in range(jobs):
        submit(world.store, ci_request(f"gh-job-{n}", n))
    world.run()
    world.clock.advance(timedelta(seconds=20))
    world.run()
    return world


def states(world: World, jobs: int) -> list[S]:
    return [world.state(f"gh-job-{n}") for n in range(jobs)]


def test_jobs_over_the_cap_wait_in_the_order_they_were_queued() -> None:
    world = world_with(2, 4)
    assert states(world, 4) == [S.ACTIVE, S.ACTIVE, S.PENDING, S.PENDING]


def test_a_job_over_the_cap_is_admitted_when_a_vm_of_the_mapping_is_given_back() -> None:
    world = world_with(2, 3)
    world.ending().release("gh-job-0", "t", admin=False)
    world.run()
    world.clock.advance(timedelta(seconds=20))
    world.run()
    assert states(world, 3) == [S.RELEASED, S.ACTIVE, S.ACTIVE]


def test_without_a_cap_every_job_that_fits_runs() -> None:
    assert states(world_with(None, 4), 4) == [S.ACTIVE] * 4
