"""Jobs into a calendar block (issue 51: "another job can be submitted into it: a request naming
the block runs on its VMs"). Google bills an approved block in full whatever is done with it
(compute/docs/instances/delete-future-reservations-calendar-mode), so a block whose own job
ended keeps its VMs until its end and further jobs run on them, one at a time, in submission
order: never admitted (the block holds the capacity), never billed, and never touching the
block's VMs when they end.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from opendws.domain.block_jobs import BlockJobReason, BlockView, JobView, block_jobs
from opendws.domain.model import CapacityRequest
from opendws.domain.run import RunSpec
from opendws.domain.states import RequestState, can_transition
from opendws.domain.sweep import Call
from opendws.ports import order_name, request_from_document, request_to_document
from opendws.schema.request import BlockSubmit, MessageError, parse_message, to_block_job
from opendws.service.agents import AgentService, AgentSettings, Sessions
from opendws.service.intake import Delivery, IntakeOutcome, IntakeService
from opendws.service.release import EndReason
from tests.builders import DAY, flex
from tests.unit.test_block_jobs import START, Cloud, block, cloud, phase, running_block
from tests.world import World, submit

__all__ = ["cloud"]  # the fixture, shared with test_block_jobs

S = RequestState


def job(
    request_id: str, on: CapacityRequest | None = None, *, tenant: str = "t"
) -> CapacityRequest:
    message = parse_message({
        "schema": "opendws.request/v1", "action": "submit", "request_id": request_id,
        "tenant": tenant, "block": "block", "run": {"command": ["python3", "-c", "print(1)"]},
    })  # fmt: skip
    assert isinstance(message, BlockSubmit)
    return to_block_job(
        message, on or block(), default_request_id=request_id, submitted_at=START + DAY / 2
    )


# The life cycle ---------------------------------------------------------------------------------


def test_a_job_into_a_block_goes_from_pending_straight_to_active() -> None:
    """It is never admitted (the block holds its capacity): PENDING → ACTIVE is an edge, its
    own (any other request is admitted first)."""
    assert can_transition(S.PENDING, S.ACTIVE, block_job=True)
    assert not can_transition(S.PENDING, S.ACTIVE)
    assert can_transition(S.ACTIVE, S.RELEASED)
    assert can_transition(S.PENDING, S.REJECTED)


# The pure rule ----------------------------------------------------------------------------------


def running(*, own_run: bool = False) -> BlockView:
    return BlockView(request_id="block", state=S.ACTIVE, own_run=own_run, units=2, pool="p")


def test_jobs_wait_while_the_block_is_not_running_and_say_so_once() -> None:
    booked = BlockView(request_id="block", state=S.PROVISIONING)
    (step,) = block_jobs(booked, [JobView(request_id="j1", state=S.PENDING)])
    assert (step.target, step.reason) == (None, BlockJobReason.WAITING_FOR_BLOCK)
    assert "waiting for block 'block' to run with its VMs up (it is PROVISIONING)" in step.message
    told = JobView(request_id="j1", state=S.PENDING, reason=step.reason.value,
                   message=step.message)  # fmt: skip
    assert block_jobs(booked, [told]) == []


def test_the_blocks_own_run_goes_first_then_one_job_at_a_time_in_submission_order() -> None:
    jobs = [JobView(request_id=name, state=S.PENDING) for name in ("j1", "j2")]
    steps = block_jobs(running(own_run=True), jobs)
    assert [(s.request_id, s.target) for s in steps] == [("j1", None), ("j2", None)]
    assert "waiting for the block's own job to end" in steps[0].message
    assert "1 job of it before this one" in steps[1].message
    # Its own run over: the first job starts, with the block's VMs; the second waits for it.
    first, second = block_jobs(running(), jobs)
    assert (first.request_id, first.target, first.reason) == ("j1", S.ACTIVE,
                                                              BlockJobReason.ON_BLOCK)  # fmt: skip
    assert "running on the 2 VMs of block 'block' in p" in first.message
    assert (second.request_id, second.target) == ("j2", None)
    assert "waiting for job 'j1' to end" in second.message
    # A job running on it: the next waits, whatever is before it in the list.
    on = [JobView(request_id="j1", state=S.ACTIVE), JobView(request_id="j2", state=S.PENDING)]
    assert [s.target for s in block_jobs(running(), on)] == [None]


@pytest.mark.parametrize(
    ("block_state", "job_state", "target"),
    [
        (S.EXPIRED, S.ACTIVE, S.EXPIRED),  # ran out its window while the job ran
        (S.RELEASED, S.ACTIVE, S.RELEASED),  # released by its tenant
        (S.EXPIRED, S.PENDING, S.REJECTED),  # ended before the job could run
        (S.CANCELLED, S.PENDING, S.REJECTED),
    ],
)
def test_a_job_ends_when_its_block_does_saying_so(
    block_state: RequestState, job_state: RequestState, target: RequestState
) -> None:
    ended = BlockView(request_id="block", state=block_state, message="block ended")
    (step,) = block_jobs(ended, [JobView(request_id="j1", state=job_state)])
    assert (step.target, step.reason) == (target, BlockJobReason.BLOCK_ENDED)
    assert f"block 'block' ended ({block_state}: block ended)" in step.message


# The message and its checks ---------------------------------------------------------------------


def test_a_job_message_names_the_block_and_takes_its_gang_and_window() -> None:
    request = job("j1")
    the_block = block()
    assert request.block == "block"
    assert (request.mode, request.gang, request.locations) == (
        the_block.mode, the_block.gang, the_block.locations,
    )  # fmt: skip
    assert (request.start_at, request.run_duration) == (the_block.start_at, the_block.run_duration)
    assert request_from_document(request_to_document(request)) == request
    # A request of its own reads and fingerprints as before (no block key).
    assert "block" not in request_to_document(the_block)


def _message(**fields: Any) -> dict[str, Any]:
    return {
        "schema": "opendws.request/v1", "action": "submit", "tenant": "t", "block": "block",
        "run": {"command": ["true"]}, **fields,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"mode": "calendar"}, "mode"), ({"gang": {"vm_count": 1}}, "gang"), ({"run": None}, "run")],
)
def test_a_job_message_has_no_capacity_of_its_own_and_needs_a_run(
    fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(MessageError) as refused:
        parse_message(_message(**fields))
    assert next(name for name, _ in refused.value.problems).startswith(field)


@pytest.mark.parametrize(
    ("on", "run", "said"),
    [
        (None, {}, "no calendar block 'block' of tenant 't'"),
        (replace(block(), tenant="other"), {}, "no calendar block 'block' of tenant 't'"),
        (flex("block"), {}, "is a flex_start request, not a calendar block"),
        (block(release_on_end=True), {}, "deletes its VMs when its own job ends"),
        (replace(block(), block="x"), {}, "is itself a job into block 'x'"),
        (block(), {"release_on_end": False}, "is the block's to say"),
    ],
)
def test_a_bad_block_reference_is_refused_naming_the_field(
    on: CapacityRequest | None, run: dict[str, Any], said: str
) -> None:
    message = parse_message(_message(run={"command": ["true"], **run}))
    assert isinstance(message, BlockSubmit)
    with pytest.raises(MessageError) as refused:
        to_block_job(message, on, default_request_id="j", submitted_at=START)
    ((field, rule),) = refused.value.problems
    assert field in ("block", "run.release_on_end")
    assert said in rule


def _intake(world: World) -> IntakeService:
    from tests.unit.test_intake_service import trusting

    return IntakeService(world.store, world.bus, world.clock, config=trusting())


def _deliver(world: World, message: dict[str, Any], message_id: str = "m-1") -> Any:
    return _intake(world).handle(
        Delivery(json.dumps(message).encode(), message_id, world.clock.now(), {})
    )


def test_intake_stores_a_job_into_a_running_block_and_refuses_one_into_an_ended_block(
    cloud: Cloud,
) -> None:
    world = running_block(cloud, fill=timedelta(0))
    result = _deliver(world, _message(request_id="j1"))
    assert result.outcome is IntakeOutcome.ACCEPTED, result
    stored = world.record("j1")
    assert (stored.state, stored.request.block, stored.request.gang) == (
        S.PENDING, "block", world.record("block").request.gang,
    )  # fmt: skip
    refused = _deliver(world, _message(request_id="j2", block="nope"), "m-2")
    assert refused.outcome is IntakeOutcome.REFUSED
    assert "block: no calendar block 'nope' of tenant 't'" in refused.message
    world.ending().release("block", "t")
    assert world.state("block") is S.RELEASED
    late = _deliver(world, _message(request_id="j3"), "m-3")
    assert late.outcome is IntakeOutcome.REFUSED
    assert "block 'block' has ended (RELEASED)" in late.message
    # A redelivery of a job stored before the block ended is a duplicate, not a refusal.
    assert _deliver(world, _message(request_id="j1")).outcome is IntakeOutcome.DUPLICATE


# On the reconciler ------------------------------------------------------------------------------


def test_jobs_run_on_the_kept_block_in_turn_and_never_touch_its_vms(cloud: Cloud) -> None:
    world = running_block(cloud, fill=timedelta(0))
    submit(world.store, job("j1"))
    submit(world.store, job("j2"))
    report = world.run()
    # The block's own job still runs: both wait, never admitted (no order, no provider call).
    assert (world.state("j1"), world.state("j2")) == (S.PENDING, S.PENDING)
    assert world.record("j1").reason == "WAITING_FOR_BLOCK"
    made = [name for call in Call for name in report.calls(call)]
    assert not [name for name in made if "j1" in name or "j2" in name]
    ending = world.ending()
    ending.finish_run("block", 1, EndReason.JOB_SUCCEEDED, "rank 0 exited 0, rank 1 exited 0")
    world.run()
    first = world.record("j1")
    assert (first.state, first.reason, first.pool, first.attempt) == (S.ACTIVE, "ON_BLOCK",
                                                                       None, 1)  # fmt: skip
    assert first.hosts == world.record("block").hosts
    assert first.orders == ()
    assert world.state("j2") is S.PENDING
    # Its run ends: RELEASED with the job's verdict; the block's VMs run on; the next starts.
    result = ending.finish_run("j1", 1, EndReason.JOB_SUCCEEDED, "rank 0 exited 0")
    assert result.state is S.RELEASED
    assert phase(cloud).value == "READY"
    usage = world.store.usage()
    assert [(e.request_id, e.granted_hours) for e in usage if e.request_id == "j1"] == [("j1", 0.0)]
    world.run()
    assert world.state("j2") is S.ACTIVE
    assert world.state("block") is S.ACTIVE
    # The block's end: the job running on it ends with it; the block expires as ever.
    world.clock.advance(START + DAY - world.clock.now())
    world.run()
    assert world.state("block") is S.EXPIRED
    ended = world.record("j2")
    assert (ended.state, ended.reason) == (S.EXPIRED, "BLOCK_ENDED")
    assert "block 'block' ended (EXPIRED" in ended.message


def test_a_tenants_release_of_a_job_ends_only_the_job(cloud: Cloud) -> None:
    world = running_block(cloud, fill=timedelta(0))
    world.ending().finish_run("block", 1, EndReason.JOB_SUCCEEDED, "done")
    submit(world.store, job("j1"))
    world.run()
    assert world.state("j1") is S.ACTIVE
    world.ending().release("j1", "t")
    world.run()
    assert world.state("j1") is S.RELEASED
    assert world.state("block") is S.ACTIVE
    assert phase(cloud).value == "READY"


# The agents on the block's VMs ------------------------------------------------------------------


def _agents(world: World, cloud: Cloud) -> Any:
    from emulators.signing import LocalSigner
    from opendws.adapters.ranks import MemoryRankStore
    from opendws.adapters.vm_identity import EMULATOR_ISSUER, VmIdentityVerifier
    from tests.unit.test_agent_service import AGENT_URL, PROJECT, Kit, Logs, Secrets, Vms

    order = order_name("block", 1)
    vms = Vms({f"{order}-{rank}": ("us-central1-a", str(7000 + rank)) for rank in range(2)})
    signer = LocalSigner("metadata", datetime.now(UTC))
    service = AgentService(
        store=world.store, ranks=MemoryRankStore(),
        verifier=VmIdentityVerifier(audience=AGENT_URL, project_id=PROJECT, certs=signer.certs,
                                    issuers=frozenset({EMULATOR_ISSUER})),
        order_vms=vms, secrets=Secrets(), logs=Logs(), ending=world.ending(),
        sessions=Sessions(b"k" * 32, world.clock, timedelta(days=8)), clock=world.clock,
        settings=AgentSettings(idle_reask=timedelta(seconds=3)),
    )  # fmt: skip
    return Kit(world, service, vms, Logs(), MemoryRankStore(), signer), order


def test_the_blocks_vms_register_for_the_block_then_wait_then_for_each_job_in_turn(
    cloud: Cloud,
) -> None:
    """The agent function maps a block's VM to the run on it now: the block's own (its
    registration names the block: register again after it), then nothing (wait, ask again
    in ``idle_reask``), then the job running on it — a session bound to the job, which the
    job's end makes 410 while the block's VMs stay."""
    world = running_block(cloud, fill=timedelta(0))
    kit, order = _agents(world, cloud)
    vm = [f"{order}-{rank}" for rank in range(2)]
    first = kit.call("/v1/register", kit.token(vm[0]))
    assert (first.status, first.body["request_id"], first.body["block"]) == (200, "block",
                                                                              "block")  # fmt: skip
    sessions = [f"Bearer {first.body['session']}", kit.register(vm[1])]
    for session in sessions:
        assert kit.call("/v1/exit", session, {"code": 0}).status == 200
    assert world.record("block").reason == "JOB_SUCCEEDED"
    assert kit.call("/v1/heartbeat", sessions[0], {"state": "exited"}).status == 410
    idle = kit.call("/v1/register", kit.token(vm[0]))
    assert (idle.status, idle.body["wait"], idle.body["retry_after_s"]) == (200, True, 3.0)
    submit(world.store, job("j1"))
    world.run()
    assert world.state("j1") is S.ACTIVE
    answers = [kit.call("/v1/register", kit.token(name)) for name in vm]
    assert [(a.body["request_id"], a.body["rank"], a.body["block"]) for a in answers] == [
        ("j1", 0, "block"), ("j1", 1, "block"),
    ]  # fmt: skip
    jobs = [f"Bearer {a.body['session']}" for a in answers]
    ready = kit.call("/v1/barrier", jobs[1])
    assert ready.body["ready"] is True
    assert ready.body["env"]["OPENDWS_REQUEST_ID"] == "j1"
    assert ready.body["env"]["OPENDWS_NODE_RANK"] == "1"
    # The block's own old session does not act for the job.
    assert kit.call("/v1/heartbeat", sessions[1], {"state": "running"}).status == 410
    for session in jobs:
        assert kit.call("/v1/exit", session, {"code": 0}).status == 200
    ended = world.record("j1")
    assert (ended.state, ended.reason) == (S.RELEASED, "JOB_SUCCEEDED")
    assert kit.call("/v1/heartbeat", jobs[0], {"state": "exited"}).status == 410
    assert world.state("block") is S.ACTIVE
    assert phase(cloud).value == "READY"
    again = kit.call("/v1/register", kit.token(vm[1]))
    assert again.body["wait"] is True


def test_a_flex_runs_registration_names_no_block() -> None:
    """Only a block's VMs register again after a run: any other VM's agent leaves."""
    from tests.unit.test_agent_service import kit

    flex_kit = kit(RunSpec.of(["true"]))
    answer = flex_kit.call("/v1/register", flex_kit.token(f"{order_name('train', 1)}-0"))
    assert answer.status == 200
    assert "block" not in answer.body
