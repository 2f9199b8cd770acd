"""``opendws.Client``: the system from Python — a pipeline, a notebook, the ``dws`` command.

A client works on what a :class:`~opendws.bootstrap.Container` wires: built from the
environment as ``dws`` is (the local stack's variables after ``dws up``, ``OPENDWS_PROJECT``
for a real project, or ``project=``), or on a given container (a test's in-memory adapters).

- :meth:`Client.submit` builds a request from a mapping, a YAML/JSON file and keyword fields,
  checks it against ``opendws.request/v1`` and the rules of its mode, and only then publishes
  it on its tenant's topic: a bad request raises :class:`InvalidRequest` naming each field and
  publishes nothing;
- :meth:`Client.status` and :meth:`Client.wait` (until ACTIVE, a final state or a timeout,
  calling back once per event, oldest first) follow one request;
- :meth:`Client.cancel` and :meth:`Client.release` publish an end, refusing at once
  (:class:`NotCancellable`) a calendar block Google would keep;
- :meth:`Client.queue`, :meth:`Client.timeline` and :meth:`Client.usage` return the
  services' own values (:class:`~opendws.service.queries.QueueEntry`,
  :class:`~opendws.service.queries.Span`, :class:`~opendws.service.usage.UsageRow`).

Every refusal is a :class:`ClientError` whose message is one line saying what is wrong.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

from opendws import bootstrap
from opendws.domain.model import CapacityRequest
from opendws.domain.run import RunSpec
from opendws.domain.states import RequestState
from opendws.durations import format_duration
from opendws.ports import (
    Host,
    RequestRecord,
    StatusEvent,
    UnknownTopic,
    content_digest,
    hosts_to_json,
)
from opendws.ports.runs import gang_ranks
from opendws.scenario import ScenarioError, read_document
from opendws.schema.request import (
    NAME_RULE,
    SCHEMA_ID,
    BlockSubmit,
    MessageError,
    Submit,
    is_request_id,
    parse_message,
    to_block_job,
    to_capacity_request,
)
from opendws.service.queries import QueueEntry, Span
from opendws.service.release import block_cancel_refusal
from opendws.service.usage import UsageRow

S = RequestState
# How often wait() looks at the request again.
POLL_SECONDS = 0.5


class ClientError(Exception):
    """Something the client refused before publishing anything; the message says what."""


class InvalidRequest(ClientError, ValueError):
    """A request that breaks ``opendws.request/v1`` or a rule of its mode, or a file that holds
    none; ``problems`` holds ``(field, rule)`` pairs (``file`` for the file itself)."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__(
            "the request is not valid: " + "; ".join(f"{field}: {rule}" for field, rule in problems)
        )


class UnknownRequest(ClientError, LookupError):
    """No request with this id is stored (check the id, and the project the client is on)."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        if is_request_id(request_id):
            super().__init__(f"no request {request_id!r} (check the id and OPENDWS_PROJECT)")
        else:  # asked as is, the store would fail on it (a "/" is a path, "" no document)
            super().__init__(f"no request can have the id {request_id!r}: ids are {NAME_RULE}")


class NotCancellable(ClientError):
    """A cancel (or release) of a calendar block Google would keep and bill in full: the
    message gives the rule, the block's end and its cost. Nothing was published."""


@dataclass(frozen=True, slots=True)
class RequestStatus:
    """One request as the system holds it: its record, every event (oldest first) and — while
    it is held for a pool — when its capacity is expected to run (``ready_eta``: its ETA plus
    the pool's recent admission → ACTIVE median; ``ready_eta_p90``: the 90th percentile)."""

    record: RequestRecord
    events: tuple[StatusEvent, ...]
    ready_eta: datetime | None
    ready_eta_p90: datetime | None

    @property
    def request_id(self) -> str:
        return self.record.request_id

    @property
    def tenant(self) -> str:
        return self.record.tenant

    @property
    def state(self) -> RequestState:
        return self.record.state

    @property
    def pool(self) -> str | None:
        return self.record.pool

    @property
    def eta(self) -> datetime | None:
        """PENDING with a held slot: that slot's start."""
        return self.record.eta

    @property
    def position(self) -> int | None:
        return self.record.position

    @property
    def reason(self) -> str | None:
        return self.record.reason

    @property
    def hosts(self) -> tuple[Host, ...]:
        """ACTIVE: where its capacity is, one host per VM in rank order (() otherwise)."""
        return self.record.hosts

    @property
    def run(self) -> RunSpec | None:
        """The job it carries (its secrets as version names); None: capacity only."""
        return self.record.request.run

    def to_json(self) -> dict[str, Any]:
        """What ``dws status --json`` prints, with the fields of the api's ``GET
        /requests/{id}``: id, tenant, state, pool, the three times (UTC, to the second),
        position, reason, message, run (the job it carries, or None), hosts and the events as
        published on ``capacity-events``."""
        return {
            "request_id": self.request_id,
            "tenant": self.tenant,
            "state": self.state.value,
            "pool": self.pool,
            "eta": _iso(self.eta),
            "ready_eta": _iso(self.ready_eta),
            "ready_eta_p90": _iso(self.ready_eta_p90),
            "position": self.position,
            "reason": self.reason,
            "message": self.record.message,
            "run": None if self.run is None else self.run.to_json(),
            "hosts": hosts_to_json(self.hosts),
            "events": [event.to_json() for event in self.events],
        }


class Waited(StrEnum):
    """How :meth:`Client.wait` ended (``dws wait``'s exit codes 0, 1 and 3)."""

    ACTIVE = "ACTIVE"  # its capacity runs (or it ended after running: released, expired)
    ENDED = "ENDED"  # a final state without having run (timed out, cancelled, rejected)
    TIMEOUT = "TIMEOUT"  # still neither when the timeout passed


@dataclass(frozen=True, slots=True)
class WaitResult:
    """What :meth:`Client.wait` saw: how it ended, the request's state then (None: not stored
    yet) and every event so far, oldest first."""

    outcome: Waited
    state: RequestState | None
    events: tuple[StatusEvent, ...]


@dataclass(frozen=True, slots=True)
class JobLine:
    """One line of a job's output: its rank, its stream (stdout or stderr) and its text."""

    rank: int
    stream: str
    text: str


class Client:
    """The running system from Python (see the module docstring).

    ``Client()`` works where ``dws`` does: on the process's container, built from the
    environment (the local stack's variables, or ``OPENDWS_PROJECT``); ``Client(project=P)``
    on project P with application default credentials; ``Client(container=C)`` on C (a test's
    in-memory adapters). Building one connects to nothing; the first call does."""

    def __init__(
        self, project: str | None = None, *, container: bootstrap.Container | None = None
    ) -> None:
        if project is not None and container is not None:
            raise ValueError("give a project or a container, not both")
        if container is None:
            container = bootstrap.container() if project is None else for_project(project)
        self.container = container

    def now(self) -> datetime:
        """The system's clock (the wall clock, but for a test's manual one)."""
        return self.container.adapters.clock.now()

    # Submit ---------------------------------------------------------------------------------

    def submit(
        self,
        request: Mapping[str, Any] | None = None,
        *,
        file: str | Path | None = None,
        **fields: Any,
    ) -> str:
        """Publish a new request; returns its id (its ``request_id``, else the Pub/Sub message
        id, which intake takes for it).

        The request's fields come from ``file`` (YAML or JSON), then ``request``, then the
        keyword ``fields``, a later one replacing an earlier one: ``tenant``, ``mode``,
        ``gang`` (a mapping), ``locations``, ``run_duration``, ``max_wait``, ``start_at``,
        ``priority``, ``labels``, ``request_id``, and ``run``, the job to run on the gang (a
        mapping of ``opendws.request/v1``'s ``run`` or a
        :class:`~opendws.domain.run.RunSpec`). With ``block`` (a calendar block's request
        id) it is a job into that block instead: ``tenant``, ``block``, ``run`` and
        optionally ``labels`` and ``request_id`` only. Durations may be given as ``timedelta``
        (whole seconds) and times as aware ``datetime``. The request is checked against
        ``opendws.request/v1`` and the rules of its mode (run time, wait, a start in the
        future) first: :class:`InvalidRequest` names every field that breaks one, and nothing
        is published."""
        message, checked = self._message(request, file, fields)
        if "request_id" in message:
            self._refuse_a_used_id(checked)
        message_id = self._publish(message)
        return str(message.get("request_id") or message_id)

    def _refuse_a_used_id(self, request: CapacityRequest) -> None:
        """Intake refuses a different request under a stored one's id only in an event no
        one follows (the stored request is unchanged, ``status`` shows it): say so now. The
        same request again is a retry, which intake takes as a duplicate."""
        stored = self.container.adapters.store.get(request.request_id)
        if stored is not None and stored.digest != content_digest(request):
            raise InvalidRequest([("request_id", (
                f"{request.request_id!r} is already used by a different request "
                f"({stored.state}); give this one another id"
            ))])  # fmt: skip

    def _publish(self, message: dict[str, Any]) -> str:
        """Publish on the message's tenant's topic; a tenant with none is refused by name."""
        try:
            return self.container.adapters.publisher.publish(message)
        except UnknownTopic as missing:
            tenant = message.get("tenant")
            raise InvalidRequest([("tenant", (
                f"{tenant!r} is not a tenant of this deployment: there is no topic "
                f"{missing.topic!r} (check the name, and OPENDWS_PROJECT)"
            ))]) from None  # fmt: skip

    def _message(
        self, request: Mapping[str, Any] | None, file: str | Path | None, fields: dict[str, Any]
    ) -> tuple[dict[str, Any], CapacityRequest]:
        """The message to publish, checked, and the request intake will make of it."""
        document: dict[str, Any] = {} if file is None else _read_request(Path(file))
        merged = {**document, **(request or {}), **fields}
        action = merged.pop("action", "submit")
        if action != "submit":
            raise InvalidRequest([("action", f"is {action!r}; use cancel() or release() for it")])
        message = {"schema": SCHEMA_ID, "action": "submit", **_plain(merged)}
        try:
            parsed = parse_message(message)
            if isinstance(parsed, BlockSubmit):
                return message, self._block_job(parsed)
            assert isinstance(parsed, Submit)  # the action is submit: so is what parsed
            # The rules intake applies next (run time, wait, start): refused here rather than
            # announced as REJECTED later.
            checked = to_capacity_request(
                parsed, default_request_id="checked", submitted_at=self.now()
            )
        except MessageError as error:
            raise InvalidRequest(error.problems) from None
        return message, checked

    def _block_job(self, message: BlockSubmit) -> CapacityRequest:
        """The request of a job into a calendar block, checked against the stored block as
        intake checks it (MessageError naming ``block``)."""
        block = self.container.adapters.store.get(message.block)
        checked = to_block_job(
            message, None if block is None else block.request, default_request_id="checked",
            submitted_at=self.now(),
        )  # fmt: skip
        if block is not None and block.state.is_final:
            raise MessageError([("block", (
                f"block {message.block!r} has ended ({block.state}): no job can run on its VMs"
            ))])  # fmt: skip
        return checked

    # Follow -----------------------------------------------------------------------------------

    def status(self, request_id: str) -> RequestStatus:
        """Where the request is now; :class:`UnknownRequest` if none has this id."""
        store = self.container.adapters.store
        record = self._stored(request_id)
        ready, ready_p90 = self.container.queries.ready_etas(record, self.now())
        return RequestStatus(
            record=record, events=tuple(store.events(request_id)), ready_eta=ready,
            ready_eta_p90=ready_p90,
        )  # fmt: skip

    def wait(
        self,
        request_id: str,
        timeout: float | timedelta = 600.0,
        on_event: Callable[[StatusEvent], None] | None = None,
        *,
        poll: float = POLL_SECONDS,
    ) -> WaitResult:
        """Follow the request until it is ACTIVE (:attr:`Waited.ACTIVE`), reaches a final state
        (ACTIVE too if it ran before: released or expired; :attr:`Waited.ENDED` if it never
        ran) or ``timeout`` (seconds or a timedelta) passes (:attr:`Waited.TIMEOUT`), looking
        every ``poll`` seconds. ``on_event`` is called once per event, oldest first, those
        already recorded included, before the outcome is returned. A request not stored yet
        (its submission still on its way) is waited for."""
        if not is_request_id(request_id):
            raise UnknownRequest(request_id)  # no request will ever have it: do not wait
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        store = self.container.adapters.store
        deadline = time.monotonic() + seconds
        seen = 0
        while True:
            # The record first, then its events: a state is written with its event in one
            # write, so the events read after hold the one of the state just read (read the
            # other way round, a change landing between the two would be returned unseen).
            record = store.get(request_id)
            state = None if record is None else record.state
            events = store.events(request_id)
            if on_event is not None:
                for event in events[seen:]:
                    on_event(event)
            seen = len(events)
            if state is S.ACTIVE:
                return WaitResult(Waited.ACTIVE, state, tuple(events))
            if state is not None and state.is_final:
                ran = any(event.state is S.ACTIVE for event in events)
                return WaitResult(Waited.ACTIVE if ran else Waited.ENDED, state, tuple(events))
            if time.monotonic() >= deadline:
                return WaitResult(Waited.TIMEOUT, state, tuple(events))
            time.sleep(max(0.0, min(poll, deadline - time.monotonic())))

    def _stored(self, request_id: str) -> RequestRecord:
        """The stored record of ``request_id``; :class:`UnknownRequest` if none has this id."""
        if not is_request_id(request_id):
            raise UnknownRequest(request_id)
        record = self.container.adapters.store.get(request_id)
        if record is None:
            raise UnknownRequest(request_id)
        return record

    # Logs -------------------------------------------------------------------------------------

    def logs(
        self, request_id: str, *, rank: int | None = None, follow: bool = False,
        poll: float = POLL_SECONDS,
    ) -> Iterator[JobLine]:  # fmt: skip
        """The output of the request's job, rank by rank (``rank``: that rank only): Cloud
        Logging's entries on Google Cloud, the run folder on one machine. ``follow``: keep
        yielding new lines, looking every ``poll`` seconds, until the request has ended and
        no new line came. :class:`UnknownRequest` if no request has this id."""
        store = self.container.adapters.store
        record = self._stored(request_id)
        reader = self.container.job_logs
        seen: dict[int, int] = {}
        while True:
            record = store.get(request_id) or record
            ranks = [rank] if rank is not None else list(range(gang_ranks(record.request.gang)))
            new = False
            for each in ranks:
                lines = reader.read(request_id, each)
                for stream, text in lines[seen.get(each, 0) :]:
                    new = True
                    yield JobLine(rank=each, stream=stream, text=text)
                seen[each] = len(lines)
            if not follow or (record.state.is_final and not new):
                return
            time.sleep(poll)

    # End --------------------------------------------------------------------------------------

    def cancel(self, request_id: str, *, tenant: str) -> str:
        """Publish a cancel of a request that is not running yet (only its tenant may: another
        tenant's stored request raises :class:`InvalidRequest`); returns the message id.
        Watch :meth:`status` for its effect."""
        return self._end("cancel", request_id, tenant)

    def release(self, request_id: str, *, tenant: str) -> str:
        """Publish a release: give an active request's capacity back (one not running yet is
        cancelled); returns the message id."""
        return self._end("release", request_id, tenant)

    def _end(self, action: str, request_id: str, tenant: str) -> str:
        message: dict[str, object] = {
            "schema": SCHEMA_ID, "action": action, "request_id": request_id, "tenant": tenant,
        }  # fmt: skip
        try:
            parse_message(message)
        except MessageError as error:
            raise InvalidRequest(error.problems) from None
        adapters = self.container.adapters
        record = adapters.store.get(request_id)
        if record is not None and record.tenant != tenant:
            # Intake would refuse it (NOT_YOUR_REQUEST) in an event of a request the caller
            # does not follow: say so now. (A request not stored yet may still be on its way.)
            raise InvalidRequest([("tenant", (
                f"{request_id!r} is not a request of tenant {tenant!r}; only its own tenant "
                f"may {action} it"
            ))])  # fmt: skip
        if record is not None:
            # A booked block Google would keep (ending it is cancelling it at Google): say so
            # now, rather than in a refusal event only.
            refusal = block_cancel_refusal(record, adapters.config.load(), self.now())
            if refusal is not None:
                raise NotCancellable(refusal)
        return self._publish(message)

    # Views ------------------------------------------------------------------------------------

    def queue(self, tenant: str | None = None) -> list[QueueEntry]:
        """Pending requests (only ``tenant``'s if given) as the last reconcile pass left them:
        by pool, then position (those without a slot last), then age."""
        return self.container.queries.queue(self.now(), tenant=tenant)

    def timeline(self, pool: str | None = None) -> dict[str, list[Span]]:
        """Per pool (only ``pool`` if given): every running or provisioning grant, booked
        block and planned start, by start time."""
        return self.container.queries.timeline(self.now(), pool=pool)

    def usage(
        self, tenant: str | None = None, *, since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[UsageRow]:  # fmt: skip
        """Accelerator-hours granted and used, cost and outcomes per (tenant, accelerator) of
        the requests that ended in ``[since, until)``, sorted by tenant then accelerator."""
        return self.container.usage.summary(tenant=tenant, since=since, until=until)


def for_project(project: str, environ: Mapping[str, str] | None = None) -> bootstrap.Container:
    """A container of its own on ``project``: the environment's settings (``os.environ``
    unless given) with that project; the process's environment is left as it is."""
    base = os.environ if environ is None else environ
    settings = bootstrap.Settings.from_environment({**base, "OPENDWS_PROJECT": project})
    return bootstrap.Container(settings)


def _read_request(path: Path) -> dict[str, Any]:
    try:
        document = read_document(path)
    except ScenarioError as error:
        raise InvalidRequest([("file", str(error))]) from None
    if not isinstance(document, dict):
        raise InvalidRequest([("file", f"{path}: a request is a mapping of fields")])
    return document


def _plain(value: Any) -> Any:
    """``value`` as JSON holds it: times in ISO 8601, durations in the short form, tuples as
    lists, a run as its mapping (the message is published as JSON)."""
    if isinstance(value, RunSpec):
        return value.to_json()
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(UTC).isoformat(timespec="seconds")
