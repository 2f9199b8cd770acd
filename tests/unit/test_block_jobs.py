"""A calendar block's job (issue 51, calendar half): it starts when Google has filled the block's
reservation, not at the block's start, and the events say it waited; when it ends early the
block's VMs stay until the block ends unless its run says ``release_on_end`` — Google bills an
approved block in full either way (compute/docs/instances/delete-future-reservations-calendar-
mode: an approved block may be cancelled only within narrow windows, and is billed in full
otherwise; compute/docs/instances/future-reservations-calendar-mode-overview: the capacity is
provisioned into the block's reservation from its start, possibly up to 24 h later).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from opendws.adapters.memory import MemoryCapacityProvider
from opendws.domain.model import CapacityRequest, Mode
from opendws.domain.provisioning import Lane
from opendws.domain.run import RunSpec
from opendws.domain.states import RequestState
from opendws.domain.sweep import (
    Call,
    LaneView,
    SweepReason,
    SweepSettings,
    SweepView,
    sweep,
)
from opendws.ports import Configuration, Price, ProvisionPhase, UsageEntry, order_name
from opendws.schema.request import MessageError, Submit, parse_message, to_capacity_request
from opendws.service.release import EndOutcome, EndReason, block_job_over
from opendws.service.usage import KEPT_TO_END, RELEASED_EARLY, UsageService, block_ending
from tests.builders import A3, DAY, H100, MINUTE, NOW, calendar, flex, pool
from tests.world import World, memory_world, submit, tenants_for

S = RequestState
P = ProvisionPhase
ZONE = "us-central1-a"
POOL = f"{ZONE}/{A3}"
PRICE = Price(accelerator=H100, per_hour=10.0, calendar_factor=0.5)
REVIEW = timedelta(minutes=2)  # the memory cloud's review delay (its default)
START = NOW + 5 * DAY
Cloud = tuple[World, MemoryCapacityProvider]


def block(request_id: str = "block", *, release_on_end: bool = False) -> CapacityRequest:
    return replace(
        calendar(request_id, vm_count=2, days=1, start_at=START),
        run=RunSpec.of(["python3", "train.py"], release_on_end=release_on_end),
    )


@pytest.fixture
def cloud() -> Cloud:
    configuration = Configuration(
        pools=(pool(zone=ZONE, capacity=8),), tenants=tenants_for(H100), prices=(PRICE,)
    )
    world, fake = memory_world((), (), timers=True, configuration=configuration)
    fake.set_stock(ZONE, A3, 8)
    return world, fake


def running_block(cloud: Cloud, *, release_on_end: bool = False, fill: timedelta) -> World:
    """A block with a job, booked, started, its reservation filled ``fill`` after its start,
    and ACTIVE."""
    world, fake = cloud
    fake.set_fill_delay(fill)
    submit(world.store, block(release_on_end=release_on_end))
    world.run()
    world.clock.advance(REVIEW)
    world.run()
    assert world.state("block") is S.BOOKED
    world.clock.advance(START - world.clock.now())
    world.run()
    for _ in range(20):
        if world.state("block") is S.ACTIVE:
            return world
        world.clock.advance(MINUTE)
        world.run()
    raise AssertionError(f"the block is {world.state('block')}")


def phase(cloud: Cloud) -> ProvisionPhase:
    _world, fake = cloud
    return fake.observe((pool(zone=ZONE, capacity=8),))[order_name("block", 1)].phase


# The block's start and Google's fill ------------------------------------------------------------


def view(reason: str | None, seen: ProvisionPhase) -> SweepView:
    return SweepView(
        state=S.PROVISIONING, mode=Mode.CALENDAR,
        lanes=(LaneView(lane=Lane(POOL, 1), configured=True, phase=seen),), units=16,
        since=START, reason=reason, deadline=None, run_end=None, block_start=START,
        block_end=START + DAY,
    )  # fmt: skip


def test_a_block_google_fills_after_its_start_says_so_once_and_creates_its_vms() -> None:
    """The start's event said it waits for Google (BLOCK_STARTED); once the reservation is
    filled, one revision says so and asks for the VMs (the job starts once they run)."""
    step = sweep(view("BLOCK_STARTED", P.RESERVED), START + 5 * MINUTE, SweepSettings())
    assert (step.target, step.reason) == (None, SweepReason.BLOCK_FILLED)
    assert step.calls == ((Call.PROVISION, Lane(POOL, 1)),)
    assert "Google Cloud filled the block's reservation" in step.message
    assert START.isoformat() in step.message
    # Said once: a later pass that finds it still RESERVED repeats the call, silently.
    again = sweep(view("BLOCK_FILLED", P.RESERVED), START + 6 * MINUTE, SweepSettings())
    assert (again.target, again.reason, again.calls) == (None, None, step.calls)
    # While Google has not filled it, nothing is asked for.
    waiting = sweep(view("BLOCK_STARTED", P.APPROVED), START + MINUTE, SweepSettings())
    assert (waiting.target, waiting.reason, waiting.calls) == (None, None, ())


def test_a_blocks_job_starts_when_google_fills_it_and_the_events_say_it_waited(
    cloud: Cloud,
) -> None:
    world = running_block(cloud, fill=5 * MINUTE)
    assert world.record("block").since == START + 5 * MINUTE + MINUTE  # filled, then running
    reasons = [(state, reason) for state, reason, _ in world.published("block")]
    assert reasons[-3:] == [
        ("PROVISIONING", "BLOCK_STARTED"), ("PROVISIONING", "BLOCK_FILLED"), ("ACTIVE", "READY"),
    ]  # fmt: skip
    started, filled = [
        event.message
        for event in world.bus.published
        if event.reason in ("BLOCK_STARTED", "BLOCK_FILLED")
    ]
    assert "waiting for Google Cloud to fill its reservation" in started
    assert "filled the block's reservation" in filled


# When the block's job ends ----------------------------------------------------------------------


def test_a_blocks_job_that_ends_keeps_its_vms_until_the_block_ends(cloud: Cloud) -> None:
    world = running_block(cloud, fill=timedelta(0))
    ending = world.ending()
    result = ending.finish_run("block", 1, EndReason.JOB_SUCCEEDED, "rank 0 exited 0")
    assert (result.outcome, result.state) == (EndOutcome.KEPT, S.ACTIVE)
    record = world.record("block")
    assert (record.state, record.reason) == (S.ACTIVE, "JOB_SUCCEEDED")
    assert block_job_over(record)
    assert record.hosts  # still where its capacity is
    event = world.bus.published[-1]
    assert (event.state, event.previous_state, event.reason) == (S.ACTIVE, S.ACTIVE,
                                                                  "JOB_SUCCEEDED")  # fmt: skip
    assert "job ended (succeeded: rank 0 exited 0)" in event.message
    assert f"kept until its end at {(START + DAY).isoformat()}" in event.message
    assert "bills the block in full" in event.message
    assert phase(cloud) is P.READY  # its VMs run on
    # A repeated report (another rank's exit) changes nothing.
    again = ending.finish_run("block", 1, EndReason.JOB_SUCCEEDED, "rank 0 exited 0")
    assert again.outcome is EndOutcome.ALREADY_ENDED
    assert world.record("block").version == record.version
    # Passes leave it be until the block's end; then it ends as any block does.
    world.clock.advance(START + DAY - world.clock.now() - MINUTE)
    world.run()
    assert world.state("block") is S.ACTIVE
    world.clock.advance(MINUTE)
    world.fire_due()
    world.run()
    assert world.state("block") is S.EXPIRED
    (entry,) = world.store.usage()
    assert entry.used_hours == entry.granted_hours == 2 * 8 * 24
    assert block_ending(entry) == KEPT_TO_END


def test_a_failed_job_keeps_the_blocks_vms_too_and_says_so(cloud: Cloud) -> None:
    world = running_block(cloud, fill=timedelta(0))
    world.ending().finish_run("block", 1, EndReason.JOB_FAILED, "rank 1 exited 3")
    record = world.record("block")
    assert (record.state, record.reason) == (S.ACTIVE, "JOB_FAILED")
    assert "job ended (failed: rank 1 exited 3)" in record.message


def test_release_on_end_deletes_the_blocks_vms_and_says_it_is_billed_in_full(
    cloud: Cloud,
) -> None:
    world = running_block(cloud, release_on_end=True, fill=timedelta(0))
    result = world.ending().finish_run("block", 1, EndReason.JOB_SUCCEEDED, "rank 0 exited 0")
    assert (result.outcome, result.state) == (EndOutcome.ENDED, S.RELEASED)
    record = world.record("block")
    assert (record.state, record.reason) == (S.RELEASED, "JOB_SUCCEEDED")
    assert "the block's VMs are deleted now (release_on_end)" in record.message
    assert f"bills the block in full to its end either way at {(START + DAY).isoformat()}" in (
        record.message
    )
    assert phase(cloud) is not P.READY  # its VMs are gone
    (entry,) = world.store.usage()
    assert entry.used_hours == 2 * 8 * 24  # billed in full all the same
    assert block_ending(entry) == RELEASED_EARLY


def test_a_tenant_may_still_release_a_block_whose_job_ended(cloud: Cloud) -> None:
    world = running_block(cloud, fill=timedelta(0))
    world.ending().finish_run("block", 1, EndReason.JOB_SUCCEEDED, "rank 0 exited 0")
    result = world.ending().release("block", "t")
    assert (result.outcome, result.state) == (EndOutcome.ENDED, S.RELEASED)
    assert phase(cloud) is not P.READY


def test_a_flex_runs_end_still_releases_it() -> None:
    """The rule is the block's: a flex-start run's end gives its capacity back, as before."""
    world, fake = memory_world((pool(zone=ZONE, capacity=8),), tenants_for(H100), timers=True)
    fake.set_stock(ZONE, A3, 8)
    submit(world.store, replace(flex("f", vm_count=1), run=RunSpec.of(["true"])))
    world.run()
    world.clock.advance(MINUTE)
    world.run()
    assert world.state("f") is S.ACTIVE
    result = world.ending().finish_run("f", 1, EndReason.JOB_SUCCEEDED, "rank 0 exited 0")
    assert (result.outcome, result.state) == (EndOutcome.ENDED, S.RELEASED)
    assert "release_on_end" not in world.record("f").message


# The field ---------------------------------------------------------------------------------------


def submission(mode: str, run: dict[str, object]) -> Submit:
    common: dict[str, object] = {
        "schema": "opendws.request/v1", "action": "submit", "request_id": "r", "tenant": "t",
        "gang": {"vm_count": 1, "machine_type": "a3-highgpu-8g",
                 "accelerator": "nvidia-h100-80gb"},
        "locations": [ZONE], "run_duration": "1d", "run": run,
    }  # fmt: skip
    if mode == "calendar":
        common |= {"mode": "calendar", "start_at": (NOW + DAY).isoformat()}
    else:
        common |= {"mode": "flex_start", "run_duration": "1h"}
    parsed = parse_message(common)
    assert isinstance(parsed, Submit)
    return parsed


@pytest.mark.parametrize("value", [True, False])
def test_release_on_end_is_refused_on_a_flex_start_request(value: bool) -> None:
    flexible = submission("flex_start", {"command": ["x"], "release_on_end": value})
    with pytest.raises(MessageError) as refused:
        to_capacity_request(flexible, default_request_id="r", submitted_at=NOW)
    [(field, rule)] = refused.value.problems
    assert field == "run.release_on_end"
    assert "calendar blocks only" in rule
    assert "always given back" in rule


def test_release_on_end_is_a_calendar_runs_field_and_is_stored() -> None:
    submitted = submission("calendar", {"command": ["x"], "release_on_end": True})
    request = to_capacity_request(submitted, default_request_id="r", submitted_at=NOW)
    assert request.run is not None
    assert request.run.release_on_end
    assert request.run.to_json()["release_on_end"] is True
    assert RunSpec.from_json(request.run.to_json()) == request.run
    default = submission("calendar", {"command": ["x"]})
    kept = to_capacity_request(default, default_request_id="r", submitted_at=NOW)
    assert kept.run is not None
    assert not kept.run.release_on_end
    assert "release_on_end" not in kept.run.to_json()


def test_the_usage_totals_say_how_each_started_block_ended() -> None:
    def entry(request_id: str, mode: Mode, outcome: RequestState, hours: float) -> UsageEntry:
        return UsageEntry(
            request_id=request_id, tenant="t", accelerator=H100, mode=mode, outcome=outcome,
            granted_hours=hours, used_hours=hours, started_at=NOW, ended_at=NOW + DAY,
            cost=None,
        )  # fmt: skip

    class Ledger:
        def usage(self, tenant: str | None = None) -> list[UsageEntry]:
            return [
                entry("kept", Mode.CALENDAR, S.EXPIRED, 384.0),
                entry("released", Mode.CALENDAR, S.RELEASED, 384.0),
                entry("never", Mode.CALENDAR, S.CANCELLED, 0.0),
                entry("flex", Mode.FLEX_START, S.RELEASED, 8.0),
            ]

    (row,) = UsageService(Ledger()).summary()
    assert dict(row.blocks) == {KEPT_TO_END: 1, RELEASED_EARLY: 1}


# The agents on a block's VMs ---------------------------------------------------------------------


def test_the_agents_exits_end_a_blocks_job_and_then_are_told_the_run_is_over(
    cloud: Cloud,
) -> None:
    """Through the agent function: every rank exits 0, the block stays ACTIVE with its VMs
    (JOB_SUCCEEDED), its agents' next calls answer 410 (the run is over: they stop), and the
    sweep for lost agents leaves the block alone afterwards."""
    from emulators.signing import LocalSigner
    from opendws.adapters.ranks import MemoryRankStore
    from opendws.adapters.vm_identity import EMULATOR_ISSUER, VmIdentityVerifier
    from opendws.service.agents import AgentService, AgentSettings, Sessions
    from tests.unit.test_agent_service import AGENT_URL, PROJECT, Kit, Logs, Secrets, Vms

    world = running_block(cloud, fill=timedelta(0))
    order = order_name("block", 1)
    vms = Vms({f"{order}-{rank}": (ZONE, str(7000 + rank)) for rank in range(2)})
    signer = LocalSigner("metadata", datetime.now(UTC))
    service = AgentService(
        store=world.store, ranks=MemoryRankStore(),
        verifier=VmIdentityVerifier(audience=AGENT_URL, project_id=PROJECT, certs=signer.certs,
                                    issuers=frozenset({EMULATOR_ISSUER})),
        order_vms=vms, secrets=Secrets(), logs=Logs(), ending=world.ending(),
        sessions=Sessions(b"k" * 32, world.clock, timedelta(days=8)), clock=world.clock,
        settings=AgentSettings(),
    )  # fmt: skip
    kit = Kit(world, service, vms, Logs(), MemoryRankStore(), signer)
    sessions = [kit.register(f"{order}-{rank}") for rank in range(2)]
    for session in sessions:
        assert kit.call("/v1/barrier", session).body["ready"] is True
    for session in sessions:
        assert kit.call("/v1/exit", session, {"code": 0}).status == 200
    record = world.record("block")
    assert (record.state, record.reason) == (S.ACTIVE, "JOB_SUCCEEDED")
    assert record.message.startswith("job ended (succeeded: rank 0 exited 0, rank 1 exited 0)")
    assert phase(cloud) is P.READY
    for session in sessions:
        assert kit.call("/v1/heartbeat", session, {"state": "exited"}).status == 410
    world.clock.advance(timedelta(hours=2))
    assert service.sweep() == []
    assert world.state("block") is S.ACTIVE
