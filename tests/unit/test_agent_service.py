"""The agent function's service on the in-memory world, with identity tokens signed as the
metadata server emulator signs them and checked by the real verifier: who may register (a VM
of the order, as Compute Engine reports it: compute/docs/instances/verifying-instance-identity
"use the instance_id value to identify a unique instance"), the gang barrier, what the job
sees (DESIGN.md "Work on the gang"), and how a run ends (JOB_SUCCEEDED, JOB_FAILED, the
others stopped first; a repeated report changes nothing)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from emulators.metadata import Instance, identity_claims
from emulators.signing import LocalSigner
from opendws.adapters.memory import MemoryNudger
from opendws.adapters.ranks import MemoryRankStore
from opendws.adapters.vm_identity import EMULATOR_ISSUER, VmIdentityVerifier
from opendws.domain.run import RunSpec
from opendws.domain.states import RequestState
from opendws.ports import order_name
from opendws.ports.runs import UnknownSecret
from opendws.service.agents import AgentService, AgentSettings, Answer, Sessions
from opendws.service.release import EndService
from tests.builders import A3, H100, flex, pool
from tests.world import World, memory_world, submit, tenants_for

S = RequestState
ZONE = "us-central1-a"
AGENT_URL = "https://opendws-agent-123.us-central1.run.app"
PROJECT = "demo-opendws"
LATENCY = timedelta(seconds=20)
SECRET = "projects/demo-opendws/secrets/vision-hf/versions/latest"


@dataclass
class Vms:
    """Compute Engine's view of the orders' VMs: name → (zone, instance id)."""

    known: dict[str, tuple[str, str]] = field(default_factory=dict)

    def vms(self, zone: str, order: str) -> dict[str, tuple[str, str]]:
        return {
            name: where
            for name, where in self.known.items()
            if name.rsplit("-", 1)[0] == order and where[0] == zone
        }


@dataclass
class Logs:
    lines: list[tuple[str, int, str, str]] = field(default_factory=list)

    def write(self, request_id: str, rank: int, lines: list[tuple[str, str]]) -> None:
        self.lines += [(request_id, rank, stream, text) for stream, text in lines]


class Secrets:
    def read(self, version: str) -> str:
        if version != SECRET:
            raise UnknownSecret(f"Secret [{version}] not found or has no versions.")
        return "hf_s3cr3t"


@dataclass
class Kit:
    world: World
    service: AgentService
    vms: Vms
    logs: Logs
    ranks: MemoryRankStore
    signer: LocalSigner

    def token(self, name: str, *, zone: str = ZONE, instance_id: str | None = None,
              project: str = PROJECT) -> str:  # fmt: skip
        where = self.vms.known.get(name, (zone, "1"))
        vm = Instance(
            name=name, instance_id=instance_id or where[1], zone=zone, project_id=project,
            project_number=123, internal_ip="10.0.0.2",
            service_account="opendws-vm@demo-opendws.iam.gserviceaccount.com",
            created_at=datetime.now(UTC),
        )  # fmt: skip
        claims = identity_claims(vm, AGENT_URL, "full", datetime.now(UTC))
        return f"Bearer {self.signer.sign(claims)}"

    def call(self, path: str, bearer: str, body: dict[str, Any] | None = None) -> Answer:
        return self.service.handle(path, bearer, body or {})

    def register(self, name: str) -> str:
        answer = self.call("/v1/register", self.token(name))
        assert answer.status == 200, answer
        return f"Bearer {answer.body['session']}"


def kit(run: RunSpec | None, vm_count: int = 2) -> Kit:
    world, cloud = memory_world([pool(zone=ZONE, capacity=8)], tenants_for(H100))
    cloud.set_stock(ZONE, A3, 8)
    request = flex("train", vm_count=vm_count, hours=6, locations=(ZONE,))
    submit(world.store, request if run is None else _with_run(request, run))
    world.run()
    world.clock.advance(LATENCY)
    world.run()
    assert world.state("train") is S.ACTIVE
    order = order_name("train", 1)
    vms = Vms({f"{order}-{rank}": (ZONE, str(5000 + rank)) for rank in range(vm_count)})
    signer = LocalSigner("metadata", datetime.now(UTC))
    ranks = MemoryRankStore()
    logs = Logs()
    ending = EndService(
        world.store, world.config, world.providers, None, world.bus, MemoryNudger(), world.clock
    )
    service = AgentService(
        store=world.store, ranks=ranks,
        verifier=VmIdentityVerifier(
            audience=AGENT_URL, project_id=PROJECT, certs=signer.certs,
            issuers=frozenset({EMULATOR_ISSUER}),
        ),
        order_vms=vms, secrets=Secrets(), logs=logs, ending=ending,
        sessions=Sessions(b"k" * 32, world.clock, timedelta(days=8)), clock=world.clock,
        settings=AgentSettings(stop_grace=timedelta(seconds=7)),
    )  # fmt: skip
    return Kit(world, service, vms, logs, ranks, signer)


def _with_run(request: Any, run: RunSpec) -> Any:
    from dataclasses import replace

    return replace(request, run=run)


RUN = RunSpec.of(["python", "train.py"], env={"WANDB_MODE": "offline"},
                 secrets={"HF_TOKEN": SECRET})  # fmt: skip


def vm(rank: int) -> str:
    return f"{order_name('train', 1)}-{rank}"


def test_the_gang_meets_at_the_barrier_and_each_rank_sees_the_gang() -> None:
    k = kit(RUN)
    zero = k.register(vm(0))
    waiting = k.call("/v1/barrier", zero)
    assert (waiting.status, waiting.body["ready"], waiting.body["registered"]) == (200, False, 1)
    one = k.register(vm(1))
    ready = k.call("/v1/barrier", one)
    assert ready.status == 200
    assert ready.body["ready"] is True
    assert ready.body["command"] == ["python", "train.py"]
    env = ready.body["env"]
    hosts = k.world.record("train").hosts
    master = hosts[0].internal_ip
    assert env["OPENDWS_NODE_RANK"] == env["PET_NODE_RANK"] == "1"
    assert env["OPENDWS_NUM_NODES"] == env["PET_NNODES"] == "2"
    assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == env["OPENDWS_MASTER_ADDR"] == master
    assert env["OPENDWS_NODE_IPS"].split("\n") == [host.internal_ip for host in hosts]
    assert env["PET_NPROC_PER_NODE"] == env["OPENDWS_ACCELERATORS_PER_NODE"] == "8"
    assert env["JAX_COORDINATOR_ADDRESS"] == f"{master}:{env['MASTER_PORT']}"
    assert "RANK" not in env
    assert "WORLD_SIZE" not in env
    assert (env["WANDB_MODE"], env["HF_TOKEN"]) == ("offline", "hf_s3cr3t")
    assert ready.body["hostfile"] == "".join(f"{h.internal_ip} slots=8\n" for h in hosts)
    # The secret's value is nowhere but in that answer: not stored, not announced.
    stored = repr(k.world.record("train")) + repr(k.world.store.events("train"))
    assert "hf_s3cr3t" not in stored + repr(k.world.bus.published) + repr(k.ranks.ranks("train"))


def test_only_the_orders_own_vms_register() -> None:
    """Another order's VM is 403; an earlier VM of the same name (another instance id), another
    zone's or project's token are refused; a token signed by another key is 401."""
    k = kit(RUN)
    other = k.call("/v1/register", k.token(f"{order_name('other', 1)}-0"))
    assert other.status == 403
    earlier = k.call("/v1/register", k.token(vm(0), instance_id="4999"))
    assert earlier.status == 403
    assert "instance id" in earlier.body["error"]
    assert k.call("/v1/register", k.token(vm(0), zone="us-central1-b")).status == 403
    assert k.call("/v1/register", k.token(vm(0), project="other-project")).status == 403
    forger = LocalSigner("metadata", datetime.now(UTC))
    claims = identity_claims(
        Instance(name=vm(0), instance_id="5000", zone=ZONE, project_id=PROJECT,
                 project_number=123, internal_ip="10.0.0.2",
                 service_account="vm@demo-opendws.iam.gserviceaccount.com",
                 created_at=datetime.now(UTC)),
        AGENT_URL, "full", datetime.now(UTC),
    )  # fmt: skip
    assert k.call("/v1/register", f"Bearer {forger.sign(claims)}").status == 401
    assert k.call("/v1/barrier", "Bearer not-a-session").status == 401
    assert k.ranks.ranks("train") == []


def test_a_capacity_only_request_has_no_run_to_register_for() -> None:
    k = kit(None)
    assert k.call("/v1/register", k.token(vm(0))).status == 404


def test_every_rank_exiting_zero_releases_the_run_as_succeeded() -> None:
    k = kit(RUN)
    sessions = [k.register(vm(rank)) for rank in range(2)]
    assert k.call("/v1/logs", sessions[1], {"lines": [{"stream": "stdout", "text": "hi"}]}) == (
        Answer(204, {})
    )
    assert k.logs.lines == [("train", 1, "stdout", "hi")]
    assert k.call("/v1/exit", sessions[0], {"code": 0, "stopped": False}).status == 200
    assert k.world.state("train") is S.ACTIVE
    assert k.call("/v1/exit", sessions[1], {"code": 0, "stopped": False}).status == 200
    record = k.world.record("train")
    assert (record.state, record.reason) == (S.RELEASED, "JOB_SUCCEEDED")
    assert record.message == "rank 0 exited 0, rank 1 exited 0"
    # Usage counts what the job used, not the 6 h asked: what ending early saved shows.
    (usage,) = k.world.store.usage()
    assert (usage.granted_hours, usage.used_hours) == (16 * 6.0, 0.0)
    # A redelivered exit, and a heartbeat after the end, change nothing; the agents stop.
    assert k.call("/v1/exit", sessions[1], {"code": 0}).status == 200
    assert k.call("/v1/heartbeat", sessions[0], {"state": "exited"}).status == 410
    assert k.world.record("train").version == record.version


def test_a_failing_rank_stops_the_others_then_the_run_fails_naming_its_code() -> None:
    k = kit(RUN, vm_count=3)
    sessions = [k.register(vm(rank)) for rank in range(3)]
    beat = k.call("/v1/heartbeat", sessions[0], {"state": "running"})
    assert beat.body == {"stop": False, "grace_s": 7.0}
    k.call("/v1/exit", sessions[1], {"code": 3, "stopped": False})
    assert k.world.state("train") is S.ACTIVE  # the others are stopped first
    told = k.call("/v1/heartbeat", sessions[0], {"state": "running"})
    assert told.body == {"stop": True, "grace_s": 7.0}
    k.call("/v1/exit", sessions[0], {"code": 143, "stopped": True})
    k.call("/v1/exit", sessions[2], {"code": 137, "stopped": True})
    record = k.world.record("train")
    assert (record.state, record.reason) == (S.RELEASED, "JOB_FAILED")
    assert record.message == "rank 0 stopped 143, rank 1 exited 3, rank 2 stopped 137"


def test_rank0_exited_ends_the_run_when_rank_zero_exits() -> None:
    k = kit(RunSpec.of(["serve"], ends_when="rank0_exited"))
    sessions = [k.register(vm(rank)) for rank in range(2)]
    k.call("/v1/exit", sessions[0], {"code": 0, "stopped": False})
    assert k.call("/v1/heartbeat", sessions[1], {"state": "running"}).body["stop"] is True
    k.call("/v1/exit", sessions[1], {"code": 143, "stopped": True})
    assert (k.world.record("train").state, k.world.record("train").reason) == (
        S.RELEASED, "JOB_SUCCEEDED",
    )  # fmt: skip


def test_bad_bodies_are_refused_naming_the_field() -> None:
    k = kit(RUN)
    session = k.register(vm(0))
    assert k.call("/v1/exit", session, {"code": "zero"}).body["error"].startswith("code")
    assert k.call("/v1/heartbeat", session, {"state": "dancing"}).status == 400
    assert k.call("/v1/logs", session, {"lines": "nope"}).status == 400
    assert k.call("/v1/unknown", session).status == 404


def test_sessions_are_signed_and_expire() -> None:
    from opendws.clock import ManualClock

    clock = ManualClock(datetime(2026, 12, 1, tzinfo=UTC))
    sessions = Sessions(b"k" * 32, clock, timedelta(hours=1))
    token = sessions.issue("train", 1, 0, "5000")
    assert sessions.check(f"Bearer {token}").rank == 0
    body, _, signature = token.partition(".")
    from opendws.ports.access import Unauthorized

    with pytest.raises(Unauthorized, match="signature"):
        sessions.check(f"Bearer {body}x.{signature}")
    with pytest.raises(Unauthorized, match="signature"):
        Sessions(b"j" * 32, clock, timedelta(hours=1)).check(f"Bearer {token}")
    clock.advance(timedelta(hours=1))
    with pytest.raises(Unauthorized, match="expired"):
        sessions.check(f"Bearer {token}")


def test_an_agent_that_stops_reporting_is_lost_and_its_run_released() -> None:
    """A rank silent for lost_after (45 s), then lost_grace (30 s) more: AGENT_LOST naming
    it; one heartbeat in time keeps the run."""
    k = kit(RUN)
    sessions = [k.register(vm(rank)) for rank in range(2)]
    k.world.clock.advance(timedelta(seconds=60))
    k.call("/v1/heartbeat", sessions[0], {"state": "running"})
    assert k.service.sweep() == []
    k.world.clock.advance(timedelta(seconds=20))
    assert k.service.sweep() == ["train"]
    record = k.world.record("train")
    assert (record.state, record.reason) == (S.RELEASED, "AGENT_LOST")
    assert record.message == "agents of rank 1 lost (no registration or heartbeat)"
    assert k.service.sweep() == []  # once


def test_ranks_that_never_register_are_lost_after_the_registration_time() -> None:
    k = kit(RUN)
    zero = k.register(vm(0))
    for _ in range(20):  # rank 0 reports every 30 s; rank 1 never registers
        k.world.clock.advance(timedelta(seconds=30))
        k.call("/v1/heartbeat", zero, {"state": "waiting"})
        assert k.service.sweep() == []
    k.world.clock.advance(timedelta(seconds=30))
    # The live rank's heartbeat notices its lost peer: the run is released, the agent told.
    assert k.call("/v1/heartbeat", zero, {"state": "waiting"}).status == 410
    assert k.service.sweep() == []
    assert k.world.record("train").message.startswith("agents of rank 1 lost")
    assert k.world.record("train").reason == "AGENT_LOST"


def test_a_run_past_its_run_time_is_left_to_expire() -> None:
    """Google deletes flex-start VMs at their run-time limit: their silence is the end of the
    run time (EXPIRED by the reconciler), not lost agents."""
    k = kit(RUN)
    for rank in range(2):
        k.register(vm(rank))
    k.world.clock.advance(timedelta(hours=6))
    assert k.service.sweep() == []
    assert k.world.state("train") is S.ACTIVE


def test_an_agent_is_not_taken_for_lost_between_two_heartbeats_written() -> None:
    """Heartbeats are written at most every 10 s (ports.runs): a lost_after within that
    would lose live agents, so it is refused."""
    with pytest.raises(ValueError, match="lost_after"):
        AgentSettings(lost_after=timedelta(seconds=5))


def test_a_secret_that_cannot_be_read_fails_the_run_naming_it() -> None:
    missing = "projects/demo-opendws/secrets/vision-gone/versions/1"
    k = kit(RunSpec.of(["train"], secrets={"GONE": missing}))
    sessions = [k.register(vm(rank)) for rank in range(2)]
    answer = k.call("/v1/barrier", sessions[0])
    assert answer.status == 410
    record = k.world.record("train")
    assert (record.state, record.reason) == (S.RELEASED, "JOB_FAILED")
    assert record.message.startswith(f"secret GONE ({missing}) cannot be read")


def test_only_rank_zero_looks_after_its_peers_and_the_sweep_after_rank_zero() -> None:
    """A heartbeat of rank 1 does not read the gang (rank 0's does); a lost rank 0 is found by
    the sweep of the reconcile pass."""
    k = kit(RUN)
    sessions = [k.register(vm(rank)) for rank in range(2)]
    for _ in range(3):  # rank 0 silent: only rank 1 reports
        k.world.clock.advance(timedelta(seconds=30))
        assert k.call("/v1/heartbeat", sessions[1], {"state": "running"}).status == 200
    assert k.world.state("train") is S.ACTIVE
    assert k.service.sweep() == ["train"]
    assert k.world.record("train").message.startswith("agents of rank 0 lost")
