"""The agent function's service: what the agents on a gang's VMs ask, and how a run ends.

The protocol (all POST, JSON; the agent in :mod:`opendws.agent` speaks it):

1. ``/v1/register`` with the VM's identity token (``Authorization: Bearer``): the token is
   verified (Google's signature, issuer, audience, expiry, project), the VM is held to what
   Compute Engine reports for its order (its name one of the order's VMs, its zone, its
   instance id: :func:`opendws.ports.runs.bind`), and the agent gets a session bound to
   (request, attempt, rank, instance id). 404 for a capacity-only request (no ``run``).
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

from opendws.domain.run import (
    Gang,
    RankExit,
    RunVerdict,
    hostfile,
    job_environment,
    master_port,
    run_verdict,
)
from opendws.domain.states import RequestState
from opendws.ports import Clock, RequestRecord, RequestStore, order_name
from opendws.ports.access import Forbidden, Unauthorized
from opendws.ports.runs import (
    HEARTBEAT_WRITE_EVERY,
    RankState,
    RankStore,
    Registration,
    SecretReader,
    StopOrder,
    UnknownSecret,
    VmIdentity,
    bind,
)
from opendws.service.release import EndReason, EndService

log = logging.getLogger(__name__)
S = RequestState

# Lines of output one /v1/logs call may carry (the agent batches at most this many).
MAX_LOG_LINES = 256


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


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer: status and JSON body."""

    status: int
    body: dict[str, Any]


class IdentityVerifier(Protocol):
    """Checks a VM's identity token (adapters.vm_identity.VmIdentityVerifier)."""

    def verify(self, authorization: str | None) -> VmIdentity: ...


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

    # The protocol -----------------------------------------------------------------------

    def register(self, authorization: str | None, body: Mapping[str, Any]) -> Answer:
        identity = self._verifier.verify(authorization)
        record, attempt = self._record_of_order(identity.order)
        if record is None:
            raise Forbidden(f"VM {identity.instance_name!r} belongs to no running request")
        vms = self._order_vms.vms(identity.zone, identity.order)
        rank = bind(identity, vms)
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
            "attempt": attempt, "rank": rank, "num_nodes": request.gang.vm_count,
            "heartbeat_s": self._settings.heartbeat.total_seconds(),
        })  # fmt: skip

    def barrier(self, authorization: str | None, body: Mapping[str, Any]) -> Answer:
        session, record = self._session(authorization)
        if record is None:
            return _over(session)
        run = record.request.run
        assert run is not None  # a session is issued for a run only
        count = record.request.gang.vm_count
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
            accelerators_per_node=record.request.gang.accelerators_per_vm or 0,
            master_port=master_port(order_name(record.request_id, session.attempt)),
            gpus=record.request.gang.accelerators_per_vm is not None,
        )
        env = {**dict(run.env), **job_environment(gang, session.rank)}
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
            "hostfile": hostfile(gang),
        })  # fmt: skip

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
        verdict, said = run_verdict(run.ends_when, record.request.gang.vm_count, exits)
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
            result = self._ending.finish_run(record.request_id, attempt, reason, said)
            log.info("run of %s over: %s (%s)", record.request_id, reason, result.outcome)

    def sweep(self) -> list[str]:
        """Release the runs whose agents are lost (AGENT_LOST, naming the ranks): ranks not
        registered within ``register_within`` of ACTIVE, or silent for ``lost_after``, for
        ``lost_grace`` more. A run past its run time is left to the reconciler, which ends it
        as EXPIRED (Google deletes flex-start VMs at their run-time limit). Returns the ids
        of the runs it released. Safe to repeat; the reconcile function calls it each pass."""
        now = self._clock.now()
        return [
            record.request_id
            for record in self._store.in_states(S.ACTIVE)
            if self._release_lost(record, now)
        ]

    def _release_lost(self, record: RequestRecord, now: datetime) -> bool:
        """Release ``record``'s run if some of its agents are lost (see :meth:`sweep`); rank 0's
        heartbeat looks at its own run this way too, so a lost peer is noticed within seconds."""
        if record.request.run is None or record.since is None or record.state is not S.ACTIVE:
            return False
        if now >= record.since + record.request.run_duration:
            return False  # its run time is up: the reconciler expires it
        lost = self._lost_ranks(record, now)
        if not lost:
            return False
        said = ", ".join(str(rank) for rank in lost)
        message = f"agents of rank {said} lost (no registration or heartbeat)"
        log.warning("%s: %s", record.request_id, message)
        self._ending.finish_run(record.request_id, record.attempt, EndReason.AGENT_LOST, message)
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
        for rank in range(record.request.gang.vm_count):
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
            or session.attempt not in {lane.attempt for lane in record.orders}
            or record.request.run is None
        ):
            return session, None
        return session, record

    def _record_of_order(self, order: str) -> tuple[RequestRecord | None, int]:
        """The running (or still provisioning) request one of whose orders is ``order``."""
        for record in self._store.in_states(S.ACTIVE, S.PROVISIONING):
            for lane in record.orders:
                if order_name(record.request_id, lane.attempt) == order:
                    return record, lane.attempt
        return None, 0


class _BadRequest(ValueError):
    """A call whose body is not what the protocol says (HTTP 400)."""


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
