"""The agent function's service: what the agents on a gang's VMs ask, and how a run ends.

The protocol (all POST, JSON; the agent in :mod:`opendws.agent` speaks it):

1. ``/v1/register`` with the VM's identity token (``Authorization: Bearer``): the token is
   verified (Google's signature, issuer, audience, expiry, project), the VM is held to what
   Compute Engine reports for its order (its name one of the order's VMs, its zone, its
   instance id: :func:`opendws.ports.runs.bind`), and the agent gets a session bound to
   (request, attempt, rank, instance id). 404 for a capacity-only request (no ``run``).
   A calendar block's VMs run the block's own run first, then each job into the block in
   turn (:mod:`opendws.domain.block_jobs`): once the block's run is over (or it has none) a
   VM of it registers for the job that runs on it now — a session bound to that job's id —
   and while none does it is told to wait (``{"wait": true, "retry_after_s": …}``) and to
   register again then.
2. ``/v1/barrier``: not ready until every rank of the attempt registered and the request is
   ACTIVE with its hosts; then the command, the image and the job's environment (opendws's
   names, the user's env and the values of its secrets, read now from Secret Manager by this
   service — never stored, never in an event or a log).
3. ``/v1/heartbeat``: recorded (at most every 10 s, ports.runs); answers whether to stop.
4. ``/v1/logs``: the job's output lines, written where the deployment keeps job logs.
5. ``/v1/exit``: recorded (the first exit stands); then the run's verdict
   (:func:`opendws.domain.run.run_verdict`): a failed rank stops the others, and a run that is
   over is released through the end service with JOB_SUCCEEDED or JOB_FAILED.

A run that is over or not this attempt's answers 410 (the agent stops). Every call is safe to
repeat: a redelivered report changes nothing.

**CI runs** (``run.runner``: a CI job's VM, DESIGN "Work on the gang": the VM lives as long as
its runner). At the barrier the VM's runner is minted (:class:`~opendws.ports.ci.CiRunners`,
for the CI mapping of the request's tenant whose labels the job has) and its command and
credential handed to the agent, once: the rank's document keeps the runner's id, never the
credential. An agent that asks again (it restarted before using it) gets a new runner and
the old one is deleted. The runner's exit ends the run like any job's, and the runner is
deleted. A runner that took no job within the mapping's ``idle_timeout`` is deleted and the
run released (RUNNER_IDLE, by :meth:`AgentService.sweep`). A refusal that asking again will
not mend (a revoked installation: 401; a token without its scope) ends the run JOB_FAILED
with GitHub's or GitLab's words, in the event and the log; a rate limit or an outage makes
the agent ask again, not before the time the CI system named.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from opendws.domain.model import Mode
from opendws.domain.run import (
    CiProvider,
    CiRunner,
    Gang,
    RankExit,
    RunVerdict,
    hostfile,
    job_environment,
    master_port,
    run_verdict,
)
from opendws.domain.states import RequestState
from opendws.durations import format_duration
from opendws.ports import Clock, RequestRecord, RequestStore, order_name, vm_order
from opendws.ports.access import Forbidden, Unauthorized
from opendws.ports.ci import CiRunners, RunnerRefused
from opendws.ports.configuration import CiMapping, ConfigStore, ci_mapping
from opendws.ports.runs import (
    HEARTBEAT_WRITE_EVERY,
    RankState,
    RankStore,
    Registration,
    SecretReader,
    StopOrder,
    TpuNode,
    TpuWorkerClaim,
    UnknownSecret,
    VmIdentity,
    accelerators_per_rank,
    bind,
    bind_tpu,
    gang_ranks,
    workers_per_node,
)
from opendws.service.release import (
    EndReason,
    EndService,
    block_job_over,
    block_run_on,
    keeps_vms,
    runs_attempt,
)

log = logging.getLogger(__name__)
S = RequestState

# Lines of output one /v1/logs call may carry (the agent batches at most this many).
MAX_LOG_LINES = 256
# How long an agent waits before asking again for a runner the CI system could not make (an
# outage, a 5xx) when it said no time of its own (a rate limit's Retry-After).
UNAVAILABLE_RETRY = timedelta(seconds=10)
# How long an agent that restarted waits while the runner it was handed still runs a job.
BUSY_RETRY = timedelta(seconds=30)


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSettings:
    """How the agent function treats agents."""

    heartbeat: timedelta = timedelta(seconds=5)  # how often an agent reports
    stop_grace: timedelta = timedelta(seconds=20)  # SIGTERM → SIGKILL for stopped jobs
    # Every rank registers within this of the request going ACTIVE, and an agent that has not
    # reported for ``lost_after`` is lost: the run is released (AGENT_LOST) once it has been
    # so for ``lost_grace`` more (a VM that comes back in that time saves it).
    register_within: timedelta = timedelta(minutes=10)
    lost_after: timedelta = timedelta(seconds=45)
    lost_grace: timedelta = timedelta(seconds=30)

    def __post_init__(self) -> None:
        if self.lost_after <= HEARTBEAT_WRITE_EVERY + self.heartbeat:
            raise ValueError(
                f"lost_after ({self.lost_after}) must exceed the time between two heartbeats "
                f"written ({HEARTBEAT_WRITE_EVERY}) plus the heartbeat ({self.heartbeat}): "
                "live agents would be taken for lost"
            )

    session_lifetime: timedelta = timedelta(days=8)  # longer than any run (7 d at most)
    barrier_retry: timedelta = timedelta(seconds=1)
    # How often the agents of a calendar block with no run on its VMs ask for the next job
    # into it (a job starts on them this long at most after the block is free for it).
    idle_reask: timedelta = timedelta(seconds=10)


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer: status and JSON body."""

    status: int
    body: dict[str, Any]


class IdentityVerifier(Protocol):
    """Checks a VM's identity token (adapters.vm_identity.VmIdentityVerifier); ``own_project``:
    the token's VM must be of the deployment's project."""

    def verify(self, authorization: str | None, *, own_project: bool = True) -> VmIdentity: ...


class TpuNodes(Protocol):
    """A TPU node as the TPU API reports it now (adapters.tpu.TpuQueuedProvider.node)."""

    def node(self, zone: str, name: str) -> TpuNode | None: ...


class OrderVms(Protocol):
    """What Compute Engine reports of an order's VMs now: ``{name: (zone, instance id)}``."""

    def vms(self, zone: str, order: str) -> dict[str, tuple[str, str]]: ...


class JobLogs(Protocol):
    """Where a run's output goes, by request and rank."""

    def write(self, request_id: str, rank: int, lines: list[tuple[str, str]]) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Session:
    """What an agent's session token is bound to."""

    request_id: str
    attempt: int
    rank: int
    instance_id: str
    expires: datetime


class Sessions:
    """Session tokens: the session's fields and its expiry, signed with HMAC-SHA256 under the
    function's key. Stateless: any instance of the function checks any token."""

    def __init__(self, key: bytes, clock: Clock, lifetime: timedelta) -> None:
        if len(key) < 16:
            raise ValueError("the session key must be at least 16 bytes")
        self._key = key
        self._clock = clock
        self._lifetime = lifetime

    def issue(self, request_id: str, attempt: int, rank: int, instance_id: str) -> str:
        expires = self._clock.now() + self._lifetime
        payload = json.dumps(
            [request_id, attempt, rank, instance_id, expires.isoformat()], separators=(",", ":")
        ).encode()
        body = base64.urlsafe_b64encode(payload).decode().rstrip("=")
        return f"{body}.{self._sign(body)}"

    def check(self, authorization: str | None) -> Session:
        """The session of a ``Bearer`` token; Unauthorized saying why not."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("missing session token (Authorization: Bearer <session>)")
        body, _, signature = token.strip().partition(".")
        if not hmac.compare_digest(self._sign(body), signature):
            raise Unauthorized("invalid session token (bad signature): register again")
        try:
            padded = body + "=" * (-len(body) % 4)
            request_id, attempt, rank, instance_id, expires = json.loads(
                base64.urlsafe_b64decode(padded)
            )
            session = Session(
                request_id=str(request_id), attempt=int(attempt), rank=int(rank),
                instance_id=str(instance_id), expires=datetime.fromisoformat(expires),
            )  # fmt: skip
        except (ValueError, TypeError, binascii.Error) as error:
            raise Unauthorized(f"invalid session token: {error}") from None
        if session.expires <= self._clock.now():
            raise Unauthorized("session expired: register again")
        return session

    def _sign(self, body: str) -> str:
        digest = hmac.new(self._key, body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")


class AgentService:
    """See the module docstring."""

    def __init__(
        self, *, store: RequestStore, ranks: RankStore, verifier: IdentityVerifier,
        order_vms: OrderVms, secrets: SecretReader, logs: JobLogs, ending: EndService,
        sessions: Sessions, clock: Clock, settings: AgentSettings | None = None,
        config: ConfigStore | None = None, runners: CiRunners | None = None,
        tpu_nodes: TpuNodes | None = None,
    ) -> None:  # fmt: skip
        self._store = store
        self._ranks = ranks
        self._verifier = verifier
        self._order_vms = order_vms
        self._secrets = secrets
        self._logs = logs
        self._ending = ending
        self._sessions = sessions
        self._clock = clock
        self._settings = settings or AgentSettings()
        self._config = config
        self._runners = runners
        self._tpu_nodes = tpu_nodes

    def handle(self, path: str, authorization: str | None, body: Mapping[str, Any]) -> Answer:
        """One call of the protocol; errors are answers saying what is wrong."""
        routes: dict[str, Callable[[str | None, Mapping[str, Any]], Answer]] = {
            "/v1/register": self.register, "/v1/barrier": self.barrier,
            "/v1/heartbeat": self.heartbeat, "/v1/logs": self.logs, "/v1/exit": self.exit,
        }  # fmt: skip
        route = routes.get(path.rstrip("/"))
        if route is None:
            return Answer(404, {"error": f"no such call {path!r} (known: {', '.join(routes)})"})
        try:
            return route(authorization, body)
        except Unauthorized as error:
            return Answer(401, {"error": str(error)})
        except Forbidden as error:
            return Answer(403, {"error": str(error)})
        except _BadRequest as error:
            return Answer(400, {"error": str(error)})
        except _Idle as idle:
            # Not an error: the block's VMs wait for the next job into it (register again).
            return Answer(200, {
                "wait": True, "request_id": idle.block, "error": str(idle),
                "retry_after_s": self._settings.idle_reask.total_seconds(),
            })  # fmt: skip

    # The protocol -----------------------------------------------------------------------

    def register(self, authorization: str | None, body: Mapping[str, Any]) -> Answer:
        if body.get("tpu") is not None:
            identity, record, attempt, rank = self._tpu_worker(authorization, body["tpu"])
        else:
            identity, record, attempt, rank = self._vm(authorization)
        request = record.request
        if request.run is None:
            return Answer(404, {"error": f"{record.request_id!r} has no run: capacity only"})
        self._ranks.register(
            Registration(
                request_id=record.request_id, attempt=attempt, rank=rank,
                vm=identity.instance_name, instance_id=identity.instance_id,
                at=self._clock.now(),
            )
        )  # fmt: skip
        session = self._sessions.issue(record.request_id, attempt, rank, identity.instance_id)
        log.info(
            "rank %s of %s registered from %s", rank, record.request_id, identity.instance_name,
            extra={"fields": {"request_id": record.request_id, "rank": rank}},
        )  # fmt: skip
        return Answer(200, {
            "session": session, "request_id": record.request_id, "order": identity.order,
            "attempt": attempt, "rank": rank, "num_nodes": gang_ranks(request.gang),
            "heartbeat_s": self._settings.heartbeat.total_seconds(),
            **({} if (block := _block_of(record)) is None else {"block": block}),
        })  # fmt: skip

    def _vm(self, authorization: str | None) -> tuple[VmIdentity, RequestRecord, int, int]:
        """A VM's registration: its verified token, its request and attempt, its rank
        (:func:`~opendws.ports.runs.bind` against the order's VMs Compute Engine reports)."""
        identity = self._verifier.verify(authorization)
        record, attempt = self._record_of_order(identity.order)
        if record is None:
            raise Forbidden(f"VM {identity.instance_name!r} belongs to no running request")
        rank = bind(identity, self._order_vms.vms(identity.zone, identity.order))
        return identity, record, attempt, rank

    def _tpu_worker(
        self, authorization: str | None, data: object
    ) -> tuple[VmIdentity, RequestRecord, int, int]:
        """A TPU worker's registration: its verified token, its request and attempt, its rank
        (:func:`~opendws.ports.runs.bind_tpu` against the node the TPU API reports). The
        token's project is not held to the deployment's: Google does not document which
        project a TPU VM's token names (TPU VMs run in a Google-managed project)."""
        try:
            claim = TpuWorkerClaim.from_json(data)
        except ValueError as error:
            raise _BadRequest(str(error)) from None
        identity = self._verifier.verify(authorization, own_project=False)
        record, attempt, order = None, 0, claim.node
        for order in (claim.node, vm_order(claim.node)):
            record, attempt = self._record_of_order(order)
            if record is not None:
                break
        if record is None:
            raise Forbidden(f"TPU node {claim.node!r} belongs to no running request")
        if self._tpu_nodes is None:
            raise Forbidden("this deployment's agent function reads no TPU nodes")
        node = self._tpu_nodes.node(identity.zone, claim.node)
        rank = bind_tpu(identity, claim, node, order, workers_per_node(record.request.gang))
        return identity, record, attempt, rank

    def barrier(self, authorization: str | None, body: Mapping[str, Any]) -> Answer:
        session, record = self._session(authorization)
        if record is None:
            return _over(session)
        run = record.request.run
        assert run is not None  # a session is issued for a run only
        count = gang_ranks(record.request.gang)
        registered = {
            report.rank
            for report in self._ranks.ranks(session.request_id)
            if report.attempt == session.attempt
        }
        addresses = {host.rank: host.internal_ip for host in record.hosts}
        if len(registered) < count or record.state is not S.ACTIVE or len(addresses) < count:
            return Answer(200, {
                "ready": False, "retry_after_s": self._settings.barrier_retry.total_seconds(),
                "registered": len(registered), "num_nodes": count,
            })  # fmt: skip
        gang = Gang(
            request_id=record.request_id,
            addresses=tuple(addresses[rank] for rank in range(count)),
            accelerators_per_node=accelerators_per_rank(record.request.gang),
            master_port=master_port(order_name(record.request_id, session.attempt)),
            gpus=record.request.gang.topology is None,
        )
        env = {**dict(run.env), **job_environment(gang, session.rank)}
        if run.runner is not None:
            return self._hand_runner(session, record, run.runner, env, hostfile(gang))
        for name, version in run.secrets:
            try:
                env[name] = self._secrets.read(version)
            except UnknownSecret as error:
                # The job cannot run without it: the run ends, saying which and why.
                message = f"secret {name} ({version}) cannot be read: {error}"
                self._ending.finish_run(
                    record.request_id, session.attempt, EndReason.JOB_FAILED, message
                )
                return Answer(410, {"error": message})
        return Answer(200, {
            "ready": True, "command": list(run.command), "image": run.image, "env": env,
            "hostfile": hostfile(gang), "devices": "gpu" if gang.gpus else "tpu",
        })  # fmt: skip

    def _hand_runner(
        self, session: Session, record: RequestRecord, runner: CiRunner, env: dict[str, str],
        hosts: str,
    ) -> Answer:  # fmt: skip
        """The barrier's answer for a CI run: mint the VM's runner (deleting one an earlier
        call handed out) and hand its command and credential to the agent."""
        mapping = self._mapping_of(record, runner)
        if isinstance(mapping, str):
            return self._runner_failed(session, record, mapping)
        assert self._runners is not None  # _mapping_of says so otherwise
        mine = (session.rank, session.attempt)
        report = next(
            (r for r in self._ranks.ranks(session.request_id) if (r.rank, r.attempt) == mine),
            None,
        )
        if report is None:
            raise Forbidden("register first: this rank has no registration")
        try:
            if report.runner_id is not None and not self._runners.delete(mapping, report.runner_id):
                # It is running a job its agent lost: wait for that job to end.
                return Answer(200, {"ready": False, "retry_after_s": BUSY_RETRY.total_seconds(),
                                    "registered": 0, "num_nodes": 0})  # fmt: skip
            launch = self._runners.launch(mapping, runner, report.vm, record.request.run_duration)
        except RunnerRefused as refused:
            if refused.permanent:
                return self._runner_failed(session, record, str(refused))
            wait = max(self._settings.barrier_retry, UNAVAILABLE_RETRY).total_seconds()
            if refused.retry_at is not None:
                wait = max(wait, (refused.retry_at - self._clock.now()).total_seconds())
            log.warning("%s: %s; asking again in %.0f s", record.request_id, refused, wait)
            return Answer(200, {"ready": False, "retry_after_s": wait,
                                "registered": 0, "num_nodes": 0})  # fmt: skip
        self._ranks.runner_handed(
            session.request_id, session.attempt, session.rank, launch.runner_id,
            self._clock.now(),
        )  # fmt: skip
        log.info(
            "runner %s minted for %s (%s)", launch.runner_id, report.vm, record.request_id,
            extra={"fields": {"request_id": record.request_id, "runner_id": launch.runner_id}},
        )  # fmt: skip
        answer: dict[str, Any] = {
            "ready": True, "command": list(launch.command), "image": None,
            "env": {**env, **launch.env}, "hostfile": hosts,
        }  # fmt: skip
        if launch.install is not None:
            answer["install"] = launch.install.to_json()
        return Answer(200, answer)

    def _mapping_of(self, record: RequestRecord, runner: CiRunner) -> CiMapping | str:
        """The CI mapping a CI run's runner is minted for (its provider's, of the request's
        tenant, whose labels the job has, that runs jobs), or what is wrong."""
        if self._config is None or self._runners is None:
            return "this deployment mints no CI runners (the agent function has no CI set up)"
        mapping = ci_mapping(self._config.load().ci, runner.provider.value, runner.labels)
        if mapping is None or not mapping.runs_jobs or mapping.tenant != record.tenant:
            return (
                f"no {runner.provider.value} CI mapping of tenant {record.tenant!r} that runs "
                f"jobs matches labels {list(runner.labels)}"
            )
        return mapping

    def _runner_failed(self, session: Session, record: RequestRecord, message: str) -> Answer:
        """A CI run whose runner cannot be had: ended JOB_FAILED saying why (410)."""
        log.error("%s: %s", record.request_id, message)
        self._ending.finish_run(record.request_id, session.attempt, EndReason.JOB_FAILED, message)
        return Answer(410, {"error": message})

    def heartbeat(self, authorization: str | None, body: Mapping[str, Any]) -> Answer:
        session, record = self._session(authorization)
        if record is None:
            return _over(session)
        state = _rank_state(body.get("state", "running"))
        if state is not RankState.EXITED:
            self._ranks.heartbeat(
                session.request_id, session.attempt, session.rank, state, self._clock.now()
            )
        # Rank 0 looks after its peers (one reader of the gang's documents per heartbeat, not
        # one per rank); the reconcile pass's sweep looks after a lost rank 0.
        if session.rank == 0 and self._release_lost(record, self._clock.now()):
            return _over(session)  # a peer is lost: the run is released
        stop = self._ranks.stop_order(session.request_id)
        if stop is not None and stop.attempt == session.attempt:
            return Answer(200, {"stop": True, "grace_s": stop.grace.total_seconds()})
        return Answer(200, {"stop": False, "grace_s": self._settings.stop_grace.total_seconds()})

    def logs(self, authorization: str | None, body: Mapping[str, Any]) -> Answer:
        session, _ = self._session(authorization)
        lines = body.get("lines")
        if not isinstance(lines, list) or len(lines) > MAX_LOG_LINES:
            raise _BadRequest(f"lines: a list of at most {MAX_LOG_LINES} lines")
        written: list[tuple[str, str]] = []
        for line in lines:
            if not isinstance(line, Mapping) or not isinstance(line.get("text"), str):
                raise _BadRequest('lines[]: {"stream": "stdout"|"stderr", "text": str}')
            stream = "stderr" if line.get("stream") == "stderr" else "stdout"
            written.append((stream, str(line["text"])))
        self._logs.write(session.request_id, session.rank, written)
        return Answer(204, {})

    def exit(self, authorization: str | None, body: Mapping[str, Any]) -> Answer:
        session, record = self._session(authorization)
        code = body.get("code")
        if isinstance(code, bool) or not isinstance(code, int):
            raise _BadRequest("code: the job's exit code, an integer")
        stopped = body.get("stopped") is True
        self._ranks.exited(
            session.request_id, session.attempt, session.rank, code, stopped, self._clock.now()
        )
        if record is not None:
            self._settle(record, session.attempt)
        return Answer(200, {})

    # How a run ends ---------------------------------------------------------------------

    def _settle(self, record: RequestRecord, attempt: int) -> None:
        """Carry out what the ranks' exits say: stop the others, or release the run."""
        run = record.request.run
        assert run is not None
        exits = {
            report.rank: RankExit(
                rank=report.rank, code=report.exit_code or 0, stopped=report.stopped
            )
            for report in self._ranks.ranks(record.request_id)
            if report.attempt == attempt and report.state is RankState.EXITED
        }
        verdict, said = run_verdict(run.ends_when, gang_ranks(record.request.gang), exits)
        if verdict is RunVerdict.STOP_OTHERS:
            self._ranks.order_stop(
                StopOrder(
                    request_id=record.request_id, attempt=attempt, reason=said,
                    at=self._clock.now(), grace=self._settings.stop_grace,
                )
            )  # fmt: skip
        elif verdict is not RunVerdict.RUNNING:
            reason = EndReason.JOB_SUCCEEDED if verdict is RunVerdict.SUCCEEDED else (
                EndReason.JOB_FAILED)  # fmt: skip
            idle = self._idle_runners(record, attempt) if reason is EndReason.JOB_SUCCEEDED else []
            if idle:
                # run-single exits 0 at its --wait-timeout with no job: say so, not that a job
                # succeeded.
                reason, said = (
                    EndReason.RUNNER_IDLE,
                    f"{said}; runner {', '.join(idle)} took no job",
                )
            result = self._ending.finish_run(record.request_id, attempt, reason, said)
            log.info("run of %s over: %s (%s)", record.request_id, reason, result.outcome)
            self._delete_runners(record, attempt)

    def sweep(self) -> list[str]:
        """Release the runs whose agents are lost (AGENT_LOST, naming the ranks): ranks not
        registered within ``register_within`` of ACTIVE, or silent for ``lost_after``, for
        ``lost_grace`` more; and the CI runs whose runner took no job within their mapping's
        idle time (RUNNER_IDLE, the runner deleted). A run past its run time is left to the
        reconciler, which ends it as EXPIRED (Google deletes flex-start VMs at their run-time
        limit). Returns the ids of the runs it released. Safe to repeat; the reconcile
        function calls it each pass."""
        now = self._clock.now()
        return [
            record.request_id
            for record in self._store.in_states(S.ACTIVE)
            if self._release_lost(record, now) or self._release_idle(record, now)
        ]

    def _release_idle(self, record: RequestRecord, now: datetime) -> bool:
        """Release ``record``'s CI run if a runner of it took no job within the idle time
        (deleting it first: a runner GitHub says is running a job is left running)."""
        run = record.request.run
        if run is None or run.runner is None or record.state is not S.ACTIVE:
            return False
        mapping = self._mapping_of(record, run.runner)
        if isinstance(mapping, str):
            return False
        assert self._runners is not None
        for report in self._ranks.ranks(record.request_id):
            if (
                report.attempt != record.attempt
                or report.state is RankState.EXITED
                or report.runner_id is None
                or report.runner_at is None
                or now < report.runner_at + mapping.idle_timeout
            ):
                continue
            try:
                if self._runners.took_job(mapping, report.runner_id) is not False:
                    continue  # it runs a job, or is done with one and its exit comes
                if not self._runners.delete(mapping, report.runner_id):
                    continue  # it took one meanwhile
            except RunnerRefused as refused:
                log.warning("%s: idle runner not checked: %s", record.request_id, refused)
                continue
            waited = format_duration(mapping.idle_timeout)
            message = f"runner {report.runner_id} on {report.vm} took no job within {waited}"
            log.info("%s: %s: deleted, released", record.request_id, message)
            self._ending.finish_run(
                record.request_id, record.attempt, EndReason.RUNNER_IDLE, message
            )
            self._delete_runners(record, record.attempt)  # a gang's other ranks' runners
            return True
        return False

    def _idle_runners(self, record: RequestRecord, attempt: int) -> list[str]:
        """The runners of a GitLab CI run's ``attempt`` that took no job, as GitLab lists the
        jobs a runner took (one it cannot be asked about counts as having taken one). GitHub
        says only whether a runner is busy now, and removes a just-in-time runner some time
        after its job: a runner that just finished one would look idle, so a GitHub run's
        exit is not second-guessed (its idle runners are the sweep's)."""
        run = record.request.run
        if run is None or run.runner is None or run.runner.provider is not CiProvider.GITLAB:
            return []
        mapping = self._mapping_of(record, run.runner)
        if isinstance(mapping, str):
            return []
        assert self._runners is not None
        idle: list[str] = []
        for report in self._ranks.ranks(record.request_id):
            if report.attempt != attempt or report.runner_id is None:
                continue
            try:
                if self._runners.took_job(mapping, report.runner_id) is False:
                    idle.append(report.runner_id)
            except RunnerRefused as refused:
                log.warning("%s: runner %s not checked: %s", record.request_id,
                            report.runner_id, refused)  # fmt: skip
        return idle

    def _delete_runners(self, record: RequestRecord, attempt: int) -> None:
        """Delete the runners of a CI run that is over (one GitHub removed already is gone
        already); a failure is logged, and the runner's idle check is GitHub's own."""
        run = record.request.run
        if run is None or run.runner is None:
            return
        mapping = self._mapping_of(record, run.runner)
        if isinstance(mapping, str):
            return
        assert self._runners is not None
        for report in self._ranks.ranks(record.request_id):
            if report.attempt == attempt and report.runner_id is not None:
                try:
                    self._runners.delete(mapping, report.runner_id)
                except RunnerRefused as refused:
                    log.warning("%s: runner not deleted: %s", record.request_id, refused)

    def _release_lost(self, record: RequestRecord, now: datetime) -> bool:
        """Release ``record``'s run if some of its agents are lost (see :meth:`sweep`); rank 0's
        heartbeat looks at its own run this way too, so a lost peer is noticed within seconds."""
        if record.request.run is None or record.since is None or record.state is not S.ACTIVE:
            return False
        if block_job_over(record):
            return False  # its job is over; the block keeps its VMs to its end
        if now >= record.since + record.request.run_duration:
            return False  # its run time is up: the reconciler expires it
        lost = self._lost_ranks(record, now)
        if not lost:
            return False
        said = ", ".join(str(rank) for rank in lost)
        message = f"agents of rank {said} lost (no registration or heartbeat)"
        log.warning("%s: %s", record.request_id, message)
        self._ending.finish_run(record.request_id, record.attempt, EndReason.AGENT_LOST, message)
        self._delete_runners(record, record.attempt)
        return True

    def _lost_ranks(self, record: RequestRecord, now: datetime) -> list[int]:
        """The ranks of ``record``'s current attempt lost for good by ``now`` (none exited)."""
        assert record.since is not None
        settings = self._settings
        reports = {
            report.rank: report
            for report in self._ranks.ranks(record.request_id)
            if report.attempt == record.attempt
        }
        lost: list[int] = []
        for rank in range(gang_ranks(record.request.gang)):
            report = reports.get(rank)
            if report is None:
                deadline = record.since + settings.register_within + settings.lost_grace
            elif report.state is RankState.EXITED:
                continue
            else:
                deadline = report.seen_at + settings.lost_after + settings.lost_grace
            if now >= deadline:
                lost.append(rank)
        return lost

    # Reading ----------------------------------------------------------------------------

    def _session(self, authorization: str | None) -> tuple[Session, RequestRecord | None]:
        """The session and its request's record while the run is this attempt's and not over
        (None: it is over, or another attempt runs)."""
        session = self._sessions.check(authorization)
        record = self._store.get(session.request_id)
        if (
            record is None
            or record.state.is_final
            or not runs_attempt(record, session.attempt)
            or record.request.run is None
            or block_job_over(record)  # a calendar block's job ended; its VMs are kept
        ):
            return session, None
        return session, record

    def _record_of_order(self, order: str) -> tuple[RequestRecord | None, int]:
        """The request whose run the VMs of ``order`` run now, and its attempt: the running
        (or still provisioning) request one of whose orders it is — or, on a calendar block
        whose own run is over (or that has none), the job into the block that runs on its
        VMs now (:mod:`opendws.domain.block_jobs`: one at a time); :class:`_Idle` when no
        job does yet."""
        running = list(self._store.in_states(S.ACTIVE, S.PROVISIONING))
        for record in running:
            for lane in record.orders:
                if order_name(record.request_id, lane.attempt) == order:
                    if not _hosts_jobs(record) or block_run_on(record):
                        return record, lane.attempt
                    for job in running:
                        if job.request.block == record.request_id and job.state is S.ACTIVE:
                            return job, job.attempt
                    raise _Idle(record.request_id)
        return None, 0


class _BadRequest(ValueError):
    """A call whose body is not what the protocol says (HTTP 400)."""


class _Idle(Exception):
    """A VM of a running calendar block whose own run is over (or that has none) and on
    which no job into the block runs yet: its agent registers again later."""

    def __init__(self, block: str) -> None:
        super().__init__(f"no run on the VMs of block {block!r} now")
        self.block = block


def _block_of(record: RequestRecord) -> str | None:
    """The calendar block whose VMs run ``record``'s run when they stay for jobs into it
    after it (the agent then registers again once the run is over): a job's block, or a
    block that keeps its VMs when its job ends; None for any other run."""
    if record.request.block is not None:
        return record.request.block
    return record.request_id if keeps_vms(record) else None


def _hosts_jobs(record: RequestRecord) -> bool:
    """Whether jobs into ``record`` may run on its VMs: a running calendar block (not a job
    itself)."""
    return (
        record.request.mode is Mode.CALENDAR
        and record.request.block is None
        and record.state is S.ACTIVE
    )


def _over(session: Session) -> Answer:
    return Answer(410, {"error": f"the run of {session.request_id!r} is over: stop"})


def _rank_state(value: object) -> RankState:
    states = {"waiting": RankState.REGISTERED, "running": RankState.RUNNING,
              "exited": RankState.EXITED}  # fmt: skip
    if not isinstance(value, str) or value not in states:
        raise _BadRequest(f"state: one of {', '.join(states)}, not {value!r}")
    return states[value]


__all__ = [
    "AgentService", "AgentSettings", "Answer", "IdentityVerifier", "JobLogs", "OrderVms",
    "Session", "Sessions",
]  # fmt: skip
