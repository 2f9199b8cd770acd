"""The cloud's side: orders and their deterministic names, what a provider observes, the
capacity providers (MIG flex-start, TPU queued resources, calendar blocks) and which one
serves which order."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from opendws.domain.model import CapacityRequest, Mode, Pool, Provider
from opendws.domain.provisioning import ProvisionPhase

# Order names are cloud resource names: RFC 1035, at most 63 characters, and each VM of the
# gang is named after its order plus ``-{index}``.
_NAME_UNSAFE = re.compile(r"[^a-z0-9]+")
ORDER_PREFIX = "odws-"


@functools.lru_cache(maxsize=65_536)  # a pure function, asked every pass for every live request
def order_name(request_id: str, attempt: int) -> str:
    """The deterministic name of ``request_id``'s ``attempt``-th provisioning: a retried call
    always names the same resource, so the cloud refuses a second creation. A readable slug of
    the id keeps it recognisable; a hash of the exact id keeps distinct ids apart."""
    slug = _NAME_UNSAFE.sub("-", request_id.lower()).strip("-")[:28].strip("-")
    digest = hashlib.sha256(request_id.encode()).hexdigest()[:10]
    return f"{ORDER_PREFIX}{slug + '-' if slug else ''}{digest}-{attempt}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Order:
    """One attempt to provision one request's gang in one pool."""

    request: CapacityRequest
    pool: Pool
    attempt: int  # 1-based

    @property
    def name(self) -> str:
        """The cloud name of everything this order creates (see :func:`order_name`)."""
        return order_name(self.request.request_id, self.attempt)


@dataclass(frozen=True, slots=True, kw_only=True)
class Host:
    """One VM of a gang that runs: its rank (the ``i`` of its name ``{order}-{i}``), where it is,
    and its addresses as Compute Engine reports them (``networkInterfaces[0].networkIP``, and
    the ``natIP`` of that interface's access config when it has an external address).

    A TPU slice's VMs are its workers: ``name`` is the TPU node's, ``worker`` the worker's
    number within it (``agent-worker-number``) and the addresses its entry of the node's
    ``networkEndpoints`` (``ipAddress``, ``accessConfig.externalIp``) as the TPU API reports
    them; the rank runs over the nodes of the gang, then their workers (:func:`tpu_rank`)."""

    rank: int
    name: str
    zone: str
    internal_ip: str
    external_ip: str | None = None
    worker: int | None = None  # TPU workers only

    def to_json(self) -> dict[str, Any]:
        """The host as the public JSON object (``opendws.event/v1``, ``GET /requests/{id}``)."""
        return {
            "rank": self.rank,
            "name": self.name,
            "zone": self.zone,
            "internal_ip": self.internal_ip,
            "external_ip": self.external_ip,
            **({} if self.worker is None else {"worker": self.worker}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Host:
        """Read back what :meth:`to_json` wrote."""
        return cls(
            rank=int(data["rank"]),
            name=str(data["name"]),
            zone=str(data["zone"]),
            internal_ip=str(data["internal_ip"]),
            external_ip=data.get("external_ip"),
            worker=None if data.get("worker") is None else int(data["worker"]),
        )


def hosts_to_json(hosts: Iterable[Host]) -> list[dict[str, Any]]:
    """Hosts as JSON, in rank order."""
    return [host.to_json() for host in sorted(hosts, key=lambda host: host.rank)]


def hosts_from_json(data: object) -> tuple[Host, ...]:
    """Hosts read back from :func:`hosts_to_json` (anything else, e.g. a document written
    before hosts were recorded: none)."""
    if not isinstance(data, list):
        return ()
    return tuple(sorted((Host.from_json(item) for item in data), key=lambda host: host.rank))


def vm_order(vm_name: str) -> str:
    """The order a gang VM belongs to: VMs are named ``{order}-{index}``."""
    return vm_name.rsplit("-", 1)[0]


def tpu_rank(node_index: int, worker: int, workers_per_node: int) -> int:
    """The rank of worker ``worker`` of the gang's node ``node_index`` (DESIGN "Work on the
    gang": a TPU gang of several nodes ranks node, then ``agent-worker-number`` within it)."""
    if not 0 <= worker < workers_per_node:
        raise ValueError(f"worker {worker} is not one of the node's {workers_per_node} workers")
    if node_index < 0:
        raise ValueError(f"node index {node_index} is negative")
    return node_index * workers_per_node + worker


def tpu_node_index(node_name: str, order: str) -> int | None:
    """The index of TPU node ``node_name`` within order ``order``'s queued resource: 0 for the
    one node named after the order (``nodeId``), ``i`` for ``{order}-{i}`` (the nodes of a
    multi-node request, named ``{nodeIdPrefix}-{i}``); None for a node of another order."""
    if node_name == order:
        return 0
    head, _, index = node_name.rpartition("-")
    return int(index) if head == order and index.isdigit() else None


def vm_rank(vm_name: str) -> int | None:
    """The rank of a gang VM: the ``i`` of its name ``{order}-{i}`` (None: not such a name)."""
    _, _, index = vm_name.rpartition("-")
    return int(index) if index.isdigit() else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Observed:
    """One order's resources as a provider sees them now. Providers report every owned
    resource they find by name — a request, or VMs and queued resources left without one — so
    that nothing opendws made can run unseen."""

    name: str  # the order name
    pool_id: str
    phase: ProvisionPhase
    error_code: str | None = None  # FAILED: the cloud's final code (status.error)
    message: str = ""  # what the cloud said, for events
    # WAITING: the temporary error of Google's latest attempt (status.lastAttempt), e.g.
    # ZONE_RESOURCE_POOL_EXHAUSTED; None while no attempt failed yet.
    last_attempt: str | None = None
    # Calendar blocks: the last instant Google still lets it be cancelled (status.lockTime;
    # None: not approved yet, or never cancellable) and the end of its time window.
    locked_at: datetime | None = None
    ends_at: datetime | None = None
    # READY: the gang's VMs as Compute Engine reports them, in rank order (TPU slices: their
    # workers as the TPU API reports their nodes).
    hosts: tuple[Host, ...] = ()


class CloudRateLimited(RuntimeError):
    """The cloud refused a call for a rate quota (Compute Engine answers ``rateLimitExceeded``
    when a project's per-minute quota of API calls is spent): nothing was done, and the same
    call may be made again after ``retry_after`` (None: the cloud did not say; its quotas are
    per minute). Raised by a provider's calls so that their caller can slow down rather than
    count it as a failure."""

    def __init__(self, message: str, retry_after: timedelta | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class CapacityProvider(Protocol):
    """A kind of cloud capacity (MIG flex-start, TPU queued resources, calendar reservations).

    Implementers guarantee: every call is safe to repeat (creating what already exists, or
    releasing what is gone, succeeds without a second resource); no call waits for the cloud to
    finish — progress is read with :meth:`observe` on a later pass; only resources whose names
    start with :data:`ORDER_PREFIX` are ever touched.
    """

    def observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        """Every order of this provider's kind in ``pools``, by order name."""
        ...

    def reserve(self, order: Order) -> None:
        """Calendar: submit the block (a calendar-mode future reservation) for Google's review
        ahead of its start. Others: nothing to do."""
        ...

    def provision(self, order: Order) -> None:
        """Start creating the order's gang (for a calendar block: its VMs, in the reservation)."""
        ...

    def release(self, name: str, pool: Pool) -> None:
        """Cancel and delete everything the order ``name`` created in ``pool``."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Advised:
    """One start Google's Advice API recommends for a calendar block (advice.calendarMode):
    ``units`` free in ``zone`` from ``start_at`` to ``end_at``."""

    start_at: datetime
    end_at: datetime
    zone: str


class Withdrawal(StrEnum):
    """What asking Google to cancel a submitted calendar block did."""

    WITHDRAWN = "WITHDRAWN"  # cancelled now, or there was nothing to cancel (gone, declined)
    REFUSED = "REFUSED"  # Google keeps it: past its cancellation window (billed in full)


class CalendarBlocks(Protocol):
    """What calendar blocks need of the cloud beyond a CapacityProvider: Google's advice
    before booking and a cancellation Google may refuse. Implemented by the providers of
    calendar blocks (GPU VMs, TPU chips) and by the memory fake."""

    def advise(
        self, request: CapacityRequest, pools: Sequence[Pool], *, earliest: datetime,
        latest: datetime,
    ) -> tuple[Advised, ...]:  # fmt: skip
        """Starts in ``[earliest, latest]`` at which the request's block would fit, in the
        zones of ``pools``, earliest first (advice.calendarMode); () when none."""
        ...

    def withdraw(self, name: str, pool: Pool) -> Withdrawal:
        """Cancel the submitted block ``name`` at Google. Safe to repeat; never deletes a
        block Google keeps (see :class:`Withdrawal`)."""
        ...


class BlockProvider(CapacityProvider, CalendarBlocks, Protocol):
    """A provider of calendar blocks: a CapacityProvider whose ``reserve`` submits a
    calendar-mode future reservation for Google's review, and whose ``release`` deletes the
    block's VMs and then withdraws and deletes the reservation where Google allows it (a
    block Google keeps is left to its end: it is billed in full either way)."""


class Providers:
    """Which provider serves which order: flex requests use flex-start resize requests (MIG
    pools) or flex-start queued resources (TPU pools); calendar blocks use calendar-mode
    future reservations, consumed by VMs (``calendar``) or by queued resources naming the
    reservation (``tpu_calendar``; the ``calendar`` provider when not given)."""

    def __init__(
        self, *, mig_flex: CapacityProvider, tpu: CapacityProvider, calendar: BlockProvider,
        tpu_calendar: BlockProvider | None = None,
    ) -> None:  # fmt: skip
        self.mig_flex = mig_flex
        self.tpu = tpu
        self.calendar = calendar
        self.tpu_calendar = calendar if tpu_calendar is None else tpu_calendar
        # The last look's sightings by order name: one that shows the same report from the
        # same provider is reused, so an unchanged order costs no new object per look.
        self._sightings: dict[str, Sighting] = {}
        # Per provider and kind of pool asked: the provider, what it reported last (by order
        # name) and the sightings made of it, so that a look compares each report once and
        # makes sightings only of the new ones.
        self._looks: dict[tuple[int, Provider], _Look] = {}
        # Looks so far, and the names whose sighting the last one changed (a new report, or
        # gone): what a reader that saw the look before needs to look at again.
        self.looks = 0
        self.changed: set[str] = set()

    def for_order(self, pool: Pool, mode: Mode) -> CapacityProvider:
        """The provider of an order of ``mode`` in ``pool``."""
        if mode is Mode.CALENDAR:
            return self.blocks(pool)
        return self.tpu if pool.provider is Provider.TPU else self.mig_flex

    def blocks(self, pool: Pool) -> BlockProvider:
        """The provider of calendar blocks in ``pool``."""
        return self.tpu_calendar if pool.provider is Provider.TPU else self.calendar

    def observe(self, pools: Iterable[Pool]) -> dict[str, Sighting]:
        """Every owned resource in ``pools``, by order name, across all providers (a provider
        serving several kinds is asked once per kind of pool)."""
        pools = tuple(pools)
        by_kind = {kind: [pool for pool in pools if pool.provider is kind] for kind in Provider}
        observed: dict[str, Sighting] = {}
        changed: set[str] = set()
        asked: set[tuple[int, Provider]] = set()
        looks: dict[tuple[int, Provider], _Look] = {}
        fresh_all: list[str] = []
        for provider, kind in (
            (self.mig_flex, Provider.MIG),
            (self.tpu, Provider.TPU),
            (self.calendar, Provider.MIG),
            (self.tpu_calendar, Provider.TPU),
        ):
            asking = (id(provider), kind)
            if not by_kind[kind] or asking in asked:
                continue
            asked.add(asking)
            reported = provider.observe(by_kind[kind])
            look = self._looks.get(asking)
            if look is None or look.provider is not provider:
                look = _Look(provider, {}, {})
            # A copy: a look cut short by a provider's error keeps the last one whole.
            was, sightings = look.reported, dict(look.sightings)
            fresh = [name for name, seen in reported.items() if was.get(name) is not seen]
            fresh_all.extend(fresh)
            for name in fresh:
                sightings[name] = Sighting(provider=provider, observed=reported[name])
            if len(sightings) != len(reported):  # some are gone
                for name in sightings.keys() - reported.keys():
                    del sightings[name]
            looks[asking] = _Look(provider, reported, sightings)
            observed.update(sightings)
        # Changed: a name whose sighting is not the very one of the last look, or gone. When
        # one provider was asked, this time and the last, those are its new sightings.
        last = self._sightings
        if len(looks) == 1 and looks.keys() == self._looks.keys():
            changed.update(fresh_all)
        else:
            changed.update(name for name, seen in observed.items() if last.get(name) is not seen)
        changed.update(last.keys() - observed.keys())
        self._looks = looks
        self._sightings = dict(observed)
        self.changed = changed
        self.looks += 1
        return observed


@dataclass(frozen=True, slots=True)
class _Look:
    """What one provider reported for one kind of pool on the last look, and its sightings."""

    provider: CapacityProvider
    reported: dict[str, Observed]
    sightings: dict[str, Sighting]


@dataclass(frozen=True, slots=True)
class Sighting:
    """One observed resource and the provider that owns it."""

    provider: CapacityProvider
    observed: Observed
