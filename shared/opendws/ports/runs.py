"""What the agents of a run report, one document per rank, and the pure rules every store
applies to it (so the in-memory and Firestore stores cannot disagree).

A rank's document holds the attempt it belongs to (the request's order number), the VM
(name and instance id) that registered for it, its last heartbeat, and its exit. A report of
an earlier attempt changes nothing; a redelivered report (the same registration, a second
exit) changes nothing; a heartbeat is written at most every :data:`HEARTBEAT_WRITE_EVERY`
unless the rank's state changed, so a gang of many ranks costs few writes.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from opendws.catalog import tpu_hosts
from opendws.domain.model import GangShape, topology_chips
from opendws.ports.access import Forbidden
from opendws.ports.cloud import tpu_node_index, tpu_rank, vm_order, vm_rank

# A heartbeat that changes nothing but the time is written at most this often.
HEARTBEAT_WRITE_EVERY = timedelta(seconds=10)


class RankState(StrEnum):
    """Where one rank's job is."""

    REGISTERED = "REGISTERED"  # the agent registered and waits at the gang's barrier
    RUNNING = "RUNNING"  # its job runs
    EXITED = "EXITED"  # its job ended (exit_code says how)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankReport:
    """One rank of a run, as its agent reported it."""

    request_id: str
    attempt: int  # the order's attempt this rank belongs to
    rank: int
    vm: str  # the VM's name ({order}-{rank})
    instance_id: str  # what Compute Engine reports for that VM
    state: RankState
    registered_at: datetime
    seen_at: datetime  # the last report of any kind
    exit_code: int | None = None
    stopped: bool = False  # its job was stopped by opendws (its exit is not a failure)
    exited_at: datetime | None = None
    # A CI run: the runner minted for this VM (its id at GitHub or GitLab, never its
    # credential) and when its credential was handed to the agent.
    runner_id: str | None = None
    runner_at: datetime | None = None

    def to_document(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "attempt": self.attempt,
            "rank": self.rank,
            "vm": self.vm,
            "instance_id": self.instance_id,
            "state": self.state.value,
            "registered_at": self.registered_at,
            "seen_at": self.seen_at,
            "exit_code": self.exit_code,
            "stopped": self.stopped,
            "exited_at": self.exited_at,
            "runner_id": self.runner_id,
            "runner_at": self.runner_at,
        }

    @staticmethod
    def from_document(document: dict[str, Any]) -> RankReport:
        return RankReport(
            request_id=str(document["request_id"]),
            attempt=int(document["attempt"]),
            rank=int(document["rank"]),
            vm=str(document["vm"]),
            instance_id=str(document["instance_id"]),
            state=RankState(document["state"]),
            registered_at=document["registered_at"],
            seen_at=document["seen_at"],
            exit_code=None if document.get("exit_code") is None else int(document["exit_code"]),
            stopped=bool(document.get("stopped", False)),
            exited_at=document.get("exited_at"),
            runner_id=None if document.get("runner_id") is None else str(document["runner_id"]),
            runner_at=document.get("runner_at"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Registration:
    """An agent's registration for one rank of one attempt, from one VM."""

    request_id: str
    attempt: int
    rank: int
    vm: str
    instance_id: str
    at: datetime


def registered(current: RankReport | None, registration: Registration) -> RankReport | None:
    """The rank's document after ``registration``; None: nothing to write (a repeat, or a
    registration of an earlier attempt than the one recorded). A later attempt, or another
    VM of the same attempt (the VM was made again under its name), starts the rank afresh."""
    if current is not None:
        if registration.attempt < current.attempt:
            return None
        same_vm = (current.vm, current.instance_id) == (registration.vm, registration.instance_id)
        if registration.attempt == current.attempt and same_vm:
            return None
    return RankReport(
        request_id=registration.request_id,
        attempt=registration.attempt,
        rank=registration.rank,
        vm=registration.vm,
        instance_id=registration.instance_id,
        state=RankState.REGISTERED,
        registered_at=registration.at,
        seen_at=registration.at,
    )


def heartbeat(
    current: RankReport | None, attempt: int, state: RankState, at: datetime
) -> RankReport | None:
    """The rank's document after a heartbeat saying ``state`` at ``at``; None: nothing to write
    (another attempt's, an exited rank's, or one within :data:`HEARTBEAT_WRITE_EVERY` of the
    last that changes no state). A heartbeat never says EXITED: only :func:`exited` does."""
    if current is None or current.attempt != attempt or current.state is RankState.EXITED:
        return None
    if state is RankState.EXITED:
        raise ValueError("a heartbeat cannot end a rank: report its exit")
    if state is current.state and at - current.seen_at < HEARTBEAT_WRITE_EVERY:
        return None
    return replace(current, state=state, seen_at=max(at, current.seen_at))


def exited(
    current: RankReport | None, attempt: int, code: int, stopped: bool, at: datetime
) -> RankReport | None:
    """The rank's document after its exit; None: nothing to write (another attempt's, or a
    rank that has exited already: the first exit stands)."""
    if current is None or current.attempt != attempt or current.state is RankState.EXITED:
        return None
    return replace(
        current, state=RankState.EXITED, exit_code=code, stopped=stopped, exited_at=at,
        seen_at=max(at, current.seen_at),
    )  # fmt: skip


def latest(reports: list[RankReport]) -> RankReport | None:
    """The report of the latest attempt (then registration) among ``reports``."""
    return max(reports, key=lambda r: (r.attempt, r.registered_at), default=None)


def runner_handed(
    current: RankReport | None, attempt: int, runner_id: str, at: datetime
) -> RankReport | None:
    """The rank's document after the runner ``runner_id`` was handed to its agent at ``at``;
    None: nothing to write (another attempt's, an exited rank's, or this runner already)."""
    if current is None or current.attempt != attempt or current.state is RankState.EXITED:
        return None
    if current.runner_id == runner_id:
        return None
    return replace(current, runner_id=runner_id, runner_at=at)


@dataclass(frozen=True, slots=True, kw_only=True)
class StopOrder:
    """opendws asked the ranks of an attempt to stop (a rank failed, or the run is released):
    each agent stops its job (SIGTERM, ``grace``, then SIGKILL) and reports its exit as
    stopped."""

    request_id: str
    attempt: int
    reason: str
    at: datetime
    grace: timedelta

    def to_document(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id, "attempt": self.attempt, "reason": self.reason,
            "at": self.at, "grace_s": self.grace.total_seconds(),
        }  # fmt: skip

    @staticmethod
    def from_document(document: dict[str, Any]) -> StopOrder:
        return StopOrder(
            request_id=str(document["request_id"]), attempt=int(document["attempt"]),
            reason=str(document["reason"]), at=document["at"],
            grace=timedelta(seconds=float(document["grace_s"])),
        )  # fmt: skip


def stop_ordered(current: StopOrder | None, order: StopOrder) -> StopOrder | None:
    """The stop order after ``order``; None: nothing to write (one already stands for this
    attempt or a later one: the first reason stands)."""
    if current is not None and current.attempt >= order.attempt:
        return None
    return order


@dataclass(frozen=True, slots=True)
class VmIdentity:
    """A VM, as its verified identity token's ``google.compute_engine`` claims name it
    (compute/docs/instances/verifying-instance-identity)."""

    project_id: str
    project_number: int
    zone: str
    instance_name: str
    instance_id: str
    instance_creation_timestamp: int
    email: str  # the VM's service account

    @property
    def order(self) -> str:
        """The order the VM's name says it belongs to (``{order}-{i}``)."""
        return vm_order(self.instance_name)


def bind(identity: VmIdentity, order_vms: Mapping[str, tuple[str, str]]) -> int:
    """The rank of the VM ``identity`` names within its order, whose VMs Compute Engine
    reports as ``{VM name: (zone, instance id)}``; Forbidden for a VM that is not one of them
    (another order's), in another zone, or whose instance id is not the one Compute Engine
    reports for its name (an earlier VM of the same name: "instance_name ... can be reused by
    several instances over time, so use the instance_id value to identify a unique
    instance")."""
    name = identity.instance_name
    if name not in order_vms:
        known = ", ".join(sorted(order_vms)) or "none"
        raise Forbidden(f"VM {name!r} is not one of the order's VMs ({known})")
    zone, instance_id = order_vms[name]
    if identity.zone != zone:
        raise Forbidden(f"VM {name!r} is in zone {identity.zone!r}, but the order's is {zone!r}")
    if identity.instance_id != instance_id:
        raise Forbidden(
            f"VM {name!r} has instance id {identity.instance_id}, but Compute Engine reports "
            f"{instance_id} for that name (a token of an earlier VM of the same name)"
        )
    rank = vm_rank(name)
    if rank is None:
        raise Forbidden(f"VM {name!r} is not named {{order}}-{{rank}}")
    return rank


# The node metadata key whose value a TPU worker presents when it registers: a random value
# opendws puts in the order's queued resource's node metadata, which only the node's own workers
# read from their metadata server (and the TPU API's ``nodes.get`` reports).
TPU_ORDER_KEY = "opendws-order-key"
# A TPU VM's host name is ``t1v-n-<id>-w-<worker>``; when the token's instance name has that
# ending, its worker number must be the one the agent claims.
_TPU_WORKER_SUFFIX = re.compile(r"-w-(\d+)$")


@dataclass(frozen=True, slots=True)
class TpuWorkerClaim:
    """What a TPU worker's agent says of itself at registration, read from its metadata server:
    its node (``tpu-env``'s ``NODE_ID``), its worker number (``agent-worker-number``) and the
    order's key (the node metadata item :data:`TPU_ORDER_KEY`)."""

    node: str
    worker: int
    key: str

    @classmethod
    def from_json(cls, data: object) -> TpuWorkerClaim:
        """The claim of a registration's ``tpu`` object; ValueError saying what is wrong."""
        if not isinstance(data, Mapping):
            raise ValueError("tpu: an object with node, worker and key")
        node, worker, key = data.get("node"), data.get("worker"), data.get("key")
        if not isinstance(node, str) or not node:
            raise ValueError("tpu.node: the TPU node's name (tpu-env NODE_ID)")
        if not isinstance(worker, int) or isinstance(worker, bool) or worker < 0:
            raise ValueError("tpu.worker: the worker's number (agent-worker-number), 0 or more")
        if not isinstance(key, str) or not key:
            raise ValueError(f"tpu.key: the node's {TPU_ORDER_KEY} metadata value")
        return cls(node=node, worker=worker, key=key)


@dataclass(frozen=True, slots=True)
class TpuNode:
    """A TPU node as the TPU API reports it (``projects.locations.nodes.get``): its name (last
    segment), zone, state, its workers' internal addresses (``networkEndpoints[].ipAddress``,
    in worker order), the service account its workers run as (``serviceAccount.email``; None
    when it reports none) and its metadata's :data:`TPU_ORDER_KEY` (None: absent)."""

    name: str
    zone: str
    state: str
    endpoints: tuple[str, ...]
    service_account: str | None
    order_key: str | None


def bind_tpu(
    identity: VmIdentity, claim: TpuWorkerClaim, node: TpuNode | None, order: str,
    workers_per_node: int,
) -> int:  # fmt: skip
    """The rank of the TPU worker whose verified token is ``identity`` and which claims
    ``claim``, held to its node as the TPU API reports it (``node``; None: no such node);
    Forbidden saying which check failed. Google documents no TPU-specific claim in a TPU VM's
    identity token (compute/docs/instances/verifying-instance-identity documents the
    ``google.compute_engine`` claims of every VM), so the proof that the caller runs on the
    node is the node's own metadata: only the node's workers read its :data:`TPU_ORDER_KEY`
    from their metadata server. The token must further be of the node's zone and service
    account, and a host name ending ``-w-N`` must be worker N's."""
    where = f"TPU node {claim.node!r}"
    if node is None:
        raise Forbidden(f"{where} does not exist in zone {identity.zone!r}")
    index = tpu_node_index(node.name, order)
    if index is None:
        raise Forbidden(f"{where} is not one of order {order!r}'s nodes")
    if node.order_key is None or not hmac.compare_digest(node.order_key, claim.key):
        raise Forbidden(
            f"{identity.instance_name!r} is not a worker of {where}: its {TPU_ORDER_KEY} is not "
            "the node's (a worker of another node)"
        )
    if identity.zone != node.zone:
        raise Forbidden(f"{where} is in zone {node.zone!r}, the token's VM in {identity.zone!r}")
    if node.service_account is not None and identity.email != node.service_account:
        raise Forbidden(
            f"the token's VM runs as {identity.email!r}, {where}'s workers as "
            f"{node.service_account!r}"
        )
    if node.state != "READY":
        raise Forbidden(f"{where} is {node.state}, not READY")
    if not claim.worker < len(node.endpoints):
        raise Forbidden(f"{where} has {len(node.endpoints)} workers, not a worker {claim.worker}")
    suffix = _TPU_WORKER_SUFFIX.search(identity.instance_name)
    if suffix is not None and int(suffix.group(1)) != claim.worker:
        raise Forbidden(
            f"{identity.instance_name!r} is worker {suffix.group(1)}, not worker {claim.worker}"
        )
    return tpu_rank(index, claim.worker, workers_per_node)


def gang_ranks(gang: GangShape) -> int:
    """The ranks of a gang's run: its VMs, or every worker of its TPU slices."""
    return gang.vm_count * workers_per_node(gang)


def workers_per_node(gang: GangShape) -> int:
    """VMs per node of the gang: 1 for a GPU VM, a TPU slice's hosts (catalog.tpu_hosts)."""
    if gang.topology is None:
        return 1
    return tpu_hosts(gang.accelerator, topology_chips(gang.topology))


def accelerators_per_rank(gang: GangShape) -> int:
    """Accelerators each rank's VM has: its GPUs, or its share of its TPU slice's chips."""
    if gang.topology is None:
        return gang.accelerators_per_vm or 0
    return topology_chips(gang.topology) // workers_per_node(gang)


class JobLogReader(Protocol):
    """Where a run's output is read back (``dws logs``)."""

    def read(self, request_id: str, rank: int) -> list[tuple[str, str]]:
        """The lines of ``rank`` so far, oldest first: (stream, text)."""
        ...


class RankStore(Protocol):
    """The ranks of runs. Every method is safe to repeat; each applies the rule of this
    module named after it in one atomic read-modify-write of the rank's document."""

    def register(self, registration: Registration) -> RankReport:
        """Record ``registration``; returns the rank's document as it stands after."""
        ...

    def heartbeat(
        self, request_id: str, attempt: int, rank: int, state: RankState, at: datetime
    ) -> RankReport | None:
        """Record a heartbeat; the rank's document as it stands after (None: no such rank)."""
        ...

    def exited(
        self, request_id: str, attempt: int, rank: int, code: int, stopped: bool, at: datetime
    ) -> RankReport | None:
        """Record an exit; the rank's document as it stands after (None: no such rank)."""
        ...

    def runner_handed(
        self, request_id: str, attempt: int, rank: int, runner_id: str, at: datetime
    ) -> RankReport | None:
        """Record the runner handed to the rank's agent; the document after (None: no rank)."""
        ...

    def of_vm(self, vm: str) -> RankReport | None:
        """The rank a VM of this name registered for (its latest attempt's), whatever its
        request's state; None: no agent registered from it. A CI runner is named after its
        VM, so this finds the request whose VM ran a CI job."""
        ...

    def ranks(self, request_id: str) -> list[RankReport]:
        """Every rank document of ``request_id``, by rank."""
        ...

    def order_stop(self, order: StopOrder) -> StopOrder:
        """Record a stop order; the one that stands after."""
        ...

    def stop_order(self, request_id: str) -> StopOrder | None:
        """The stop order of ``request_id``'s latest stopped attempt, if any."""
        ...


__all__ = [
    "HEARTBEAT_WRITE_EVERY", "JobLogReader", "RankReport", "RankState", "RankStore", "Registration",
    "StopOrder", "VmIdentity", "bind", "exited", "heartbeat", "registered", "runner_handed",
    "stop_ordered",
]  # fmt: skip


class UnknownSecret(LookupError):
    """A Secret Manager version that cannot be read: no such secret or version, a version
    that is not enabled (disabled or destroyed), or one this deployment may not read. Its
    message says which, in Secret Manager's words."""


class SecretReader(Protocol):
    """Secret Manager's secret versions, read by name."""

    def read(self, version: str) -> str:
        """The value of ``version`` (``projects/P/secrets/S/versions/V``, ``V`` a number or
        ``latest``: the most recently created version) as text; UnknownSecret when it cannot
        be read."""
        ...


__all__ += ["SecretReader", "UnknownSecret"]
