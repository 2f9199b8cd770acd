"""The RequestStore on Cloud Firestore (google-cloud-firestore).

Layout: ``requests/{request_id}`` holds the request, its state and a version; its queries'
composite indexes are declared in ``infra/modules/firestore``. ``requests/{request_id}/events/
{seq}`` holds one event per state change, ``seq`` a zero-padded counter so that document order
is event order, and ``expire_at`` the time after which Firestore's TTL policy (on the
``events`` collection group) may delete it. Creation is one batch with create-if-absent
preconditions; every change is one transaction that reads the record, applies the pure rules
of :class:`~opendws.ports.Change` to it (which check the version it read) — and, for the
reconciler's writes, the fencing token of the lease in ``leases/reconciler``, read in the same
transaction, so a reconciler that lost the lease cannot write. Learned pool cool-downs live in
``pool_status/{pool id, URL-quoted}``; the configuration in ``config/scheduler``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import quote

from google.api_core.exceptions import Aborted, AlreadyExists, NotFound
from google.cloud import firestore
from google.cloud.firestore import SERVER_TIMESTAMP
from google.cloud.firestore_v1.base_query import FieldFilter

from opendws.config import configuration_from_document, configuration_to_document
from opendws.domain.model import Mode
from opendws.domain.readiness import ReadySample, samples_after
from opendws.domain.states import RequestState
from opendws.ports import (
    NOT_FINAL,
    Change,
    Changes,
    Configuration,
    CreateOutcome,
    Fence,
    RequestRecord,
    StaleWrite,
    StatusEvent,
    UnknownRequest,
    UsageEntry,
    Watermark,
    asked_again,
    check_fence,
    cooldown_after,
    hosts_from_json,
    hosts_to_json,
    lanes_from_document,
    lanes_to_document,
    lease_released,
    next_lease,
    request_from_document,
    request_to_document,
)
from opendws.ports.records import LeaseView, pass_started, served_after_release
from opendws.ports.telemetry import Buckets, Labels, MetricSnapshot, labels_of_mapping

T = TypeVar("T")

REQUESTS = "requests"
EVENTS = "events"
LEASES = "leases"
RECONCILER_LEASE = "reconciler"
POOL_STATUS = "pool_status"
USAGE = "usage"
CONFIG = "config"
METRICS = "metrics"  # one metric snapshot per process (opendws.ports.telemetry)
SCHEDULER_CONFIG = "scheduler"
# How long an event record is kept: longer than any request lives (a calendar block may start
# 120 days ahead and run 90), so a live request never loses its history.
EVENT_RETENTION = timedelta(days=400)
MICROSECOND = timedelta(microseconds=1)  # ready samples store their durations in these
# Every write of a request sets this to its commit time (a server timestamp): what
# FirestoreRequestStore.changes reads by.
CHANGED_AT = "changed_at"
_BEGINNING = datetime.min.replace(tzinfo=UTC)  # the watermark of a store never written
# On the lease: another pass was asked for while it was held (ReconcilerLease.acquire_lease),
# when its holder's pass started, and when the last pass that read the requests started
# (opendws.ports.records.LeaseView).
AGAIN = "again"
STARTED_AT = "started_at"
SERVED_FROM = "served_from"
# The event record's TTL field (infra/modules/firestore sets the TTL policy on it).
EVENT_EXPIRY_FIELD = "expire_at"


def _event_id(seq: int) -> str:
    return f"{seq:08d}"


class FirestoreRequestStore:
    """RequestStore over a Firestore client (the emulator when FIRESTORE_EMULATOR_HOST is set)."""

    def __init__(self, client: firestore.Client, collection: str = REQUESTS) -> None:
        self._client = client
        self._requests = client.collection(collection)
        self._lease = client.collection(LEASES).document(RECONCILER_LEASE)
        self._pool_status = client.collection(POOL_STATUS)
        self._usage = client.collection(USAGE)
        self._reads = _ReadCount()

    @property
    def documents_read(self) -> int:
        """How many documents this store has read so far (each a billed read): every get,
        in or out of a transaction, and every document a query returned."""
        return self._reads.total

    def create(self, record: RequestRecord, event: StatusEvent) -> CreateOutcome:
        document = self._requests.document(record.request_id)
        batch = self._client.batch()
        batch.create(
            document, {**_record_fields(record), "events": 1, CHANGED_AT: SERVER_TIMESTAMP}
        )
        batch.create(document.collection(EVENTS).document(_event_id(1)), _event_fields(event, 1))
        try:
            batch.commit()
        except AlreadyExists:
            existing = self.get(record.request_id)
            if existing is not None and existing.digest == record.digest:
                return CreateOutcome.DUPLICATE
            return CreateOutcome.CONFLICT
        return CreateOutcome.CREATED

    def get(self, request_id: str) -> RequestRecord | None:
        snapshot = self._reads.one(self._requests.document(request_id).get())
        data = snapshot.to_dict() if snapshot.exists else None
        return None if data is None else _record(data)

    def change(
        self, request_id: str, change: Change, *, fence: Fence | None = None
    ) -> RequestRecord:
        document = self._requests.document(request_id)

        @firestore.transactional
        def apply(transaction: firestore.Transaction) -> RequestRecord:
            snapshot = self._read_fenced(transaction, fence, document)
            data = snapshot.to_dict() if snapshot.exists else None
            if data is None:
                raise UnknownRequest(request_id)
            changed = change.apply(_record(data))
            # Only what a change may change is written (the outbox cursor, moved by
            # mark_announced, is left alone); ``outbox`` until its event is published.
            fields = _record_fields(changed)
            written = {name: fields[name] for name in _CHANGED_FIELDS}
            transaction.update(document, {**written, "outbox": True, CHANGED_AT: SERVER_TIMESTAMP})
            transaction.create(
                document.collection(EVENTS).document(_event_id(changed.events)),
                _event_fields(change.event, changed.events),
            )
            if change.usage is not None:
                transaction.set(self._usage.document(request_id), _usage_fields(change.usage))
            return changed

        with _contention(f"{request_id} was changed by another writer meanwhile"):
            result: RequestRecord = apply(self._client.transaction())
        return result

    def events(self, request_id: str) -> list[StatusEvent]:
        stream = self._requests.document(request_id).collection(EVENTS).order_by("seq").stream()
        return [_event(snapshot.to_dict() or {}) for snapshot in self._reads.each(stream)]

    def mark_announced(self, request_id: str, count: int) -> None:
        document = self._requests.document(request_id)
        if count <= 1:
            # A creation's event (intake): one write with a server-side maximum, monotonic
            # without a read; created records are not in the outbox (redelivery covers them).
            try:
                document.update(
                    {"announced": firestore.Maximum(count), CHANGED_AT: SERVER_TIMESTAMP}
                )
            except NotFound:
                raise UnknownRequest(request_id) from None
            return

        @firestore.transactional
        def mark(transaction: firestore.Transaction) -> None:
            snapshot = self._reads.one(document.get(transaction=transaction))
            data = snapshot.to_dict() if snapshot.exists else None
            if data is None:
                raise UnknownRequest(request_id)
            announced = max(int(data.get("announced", 0)), count)
            outbox = int(data.get("events", 1)) > announced
            transaction.update(
                document,
                {"announced": announced, "outbox": outbox, CHANGED_AT: SERVER_TIMESTAMP},
            )

        with _contention(f"{request_id} was changed by another writer meanwhile"):
            mark(self._client.transaction())

    def unannounced(self) -> list[RequestRecord]:
        query = self._requests.where(filter=FieldFilter("outbox", "==", True))
        records = [_record(s.to_dict() or {}) for s in self._reads.each(query.stream())]
        return sorted(records, key=lambda r: (r.request.submitted_at, r.request_id))

    def in_states(self, *states: RequestState) -> list[RequestRecord]:
        # Needs the composite index (state, submitted_at) declared in infra/modules/firestore.
        query = self._requests.where(
            filter=FieldFilter("state", "in", [s.value for s in states])
        ).order_by("submitted_at")
        records = [_record(s.to_dict() or {}) for s in self._reads.each(query.stream())]
        # Equal submission times come back in any order: settle them by id.
        return sorted(records, key=lambda r: (r.request.submitted_at, r.request_id))

    def changes(self, since: Watermark | None) -> Changes:
        # Every write sets CHANGED_AT to its commit time (a server timestamp), and Firestore's
        # queries are strongly consistent (v1 API, CommitResponse.commit_time: any read at an
        # equal or later read_time sees the commit): once a read has seen a commit time, every
        # later commit gets a later one. So "CHANGED_AT >= the newest seen" misses nothing; the
        # newest ones are read again (the reader keeps the higher version). The single-field
        # index Firestore keeps on CHANGED_AT makes this cost what changed.
        if since is None:
            newest = self._requests.order_by(CHANGED_AT, direction=firestore.Query.DESCENDING)
            latest = [s.to_dict() or {} for s in self._reads.each(newest.limit(1).stream())]
            mark = latest[0].get(CHANGED_AT) if latest else None
            records = tuple(self.in_states(*NOT_FINAL))
            return Changes(records, Watermark(mark or _BEGINNING))
        mark = since.position
        if not isinstance(mark, datetime):
            raise TypeError(f"not a watermark of this store: {since!r}")
        query = self._requests.where(filter=FieldFilter(CHANGED_AT, ">=", mark)).order_by(
            CHANGED_AT
        )
        found: list[RequestRecord] = []
        for snapshot in self._reads.each(query.stream()):
            data = snapshot.to_dict() or {}
            mark = max(mark, data[CHANGED_AT])
            found.append(_record(data))
        return Changes(tuple(found), Watermark(mark))

    def usage(self, tenant: str | None = None) -> list[UsageEntry]:
        query = self._usage
        if tenant is not None:
            query = query.where(filter=FieldFilter("tenant", "==", tenant))  # type: ignore[assignment]
        entries = [_usage_entry(s.to_dict() or {}) for s in self._reads.each(query.stream())]
        return sorted(entries, key=lambda u: (u.ended_at, u.request_id))

    def acquire_lease(
        self, holder: str, now: datetime, ttl: timedelta, *, ask_again: bool = False
    ) -> Fence | None:
        @firestore.transactional
        def take(transaction: firestore.Transaction) -> Fence | None:
            view = _lease_view(self._reads.one(self._lease.get(transaction=transaction)).to_dict())
            current = view.fence
            lease = next_lease(current, holder, now, ttl)
            again = asked_again(view.again, current, lease, ask=ask_again)
            if lease is not None:
                started = pass_started(view.started_at, current, lease, now)
                transaction.set(
                    self._lease,
                    {**_fence_fields(lease), AGAIN: again, STARTED_AT: started,
                     SERVED_FROM: view.served_from},
                )  # fmt: skip
            elif again != view.again:
                transaction.update(self._lease, {AGAIN: again})
            return lease

        try:
            with _contention("the lease is being taken by another reconciler"):
                result: Fence | None = take(self._client.transaction())
        except StaleWrite:
            return None  # another reconciler is taking it right now
        return result

    def release_lease(self, fence: Fence, *, served: bool = False) -> bool:
        @firestore.transactional
        def give_up(transaction: firestore.Transaction) -> bool:
            view = _lease_view(self._reads.one(self._lease.get(transaction=transaction)).to_dict())
            released = lease_released(view.fence, fence)
            if released is None:
                return False
            transaction.update(
                self._lease,
                {"expires_at": released.expires_at,
                 SERVED_FROM: served_after_release(view, released, served=served)},
            )  # fmt: skip
            return view.again

        try:
            with _contention("the lease changed hands meanwhile"):
                again: bool = give_up(self._client.transaction())
        except StaleWrite:
            return False  # taken over meanwhile: its holder serves what was asked
        return again

    def lease_view(self) -> LeaseView:
        # A plain read (no transaction: it takes no lock that a pass's fenced writes would
        # wait on), strongly consistent as every Firestore read is.
        return _lease_view(self._reads.one(self._lease.get()).to_dict())

    def mark_pool_short(self, pool_id: str, until: datetime, fence: Fence | None = None) -> None:
        def short(data: dict[str, Any]) -> dict[str, Any] | None:
            cooldown = cooldown_after(data.get("short_until"), until)
            return None if cooldown is None else {"short_until": cooldown}

        self._update_pool(pool_id, fence, short)

    def pool_shortages(self) -> dict[str, datetime]:
        shortages: dict[str, datetime] = {}
        for snapshot in self._reads.each(self._pool_status.stream()):
            data = snapshot.to_dict() or {}
            if data.get("short_until") is not None:
                shortages[data["pool_id"]] = data["short_until"]
        return shortages

    def record_ready(self, pool_id: str, *samples: ReadySample, fence: Fence | None = None) -> None:
        def ready(data: dict[str, Any]) -> dict[str, Any] | None:
            kept = samples_after(_samples(data), *samples)
            if kept is None:
                return None
            return {"ready": [
                {"request_id": k.request_id, "at": k.at, "took_us": k.took // MICROSECOND}
                for k in kept
            ]}  # fmt: skip

        self._update_pool(pool_id, fence, ready)

    def _update_pool(
        self, pool_id: str, fence: Fence | None,
        fields: Callable[[dict[str, Any]], dict[str, Any] | None],
    ) -> None:  # fmt: skip
        """One fenced read-modify-write of ``pool_status/{pool_id}``: ``fields`` of what is
        stored gives the fields to write (None: nothing to write), merged, so that the pool's
        other fields (its cool-down, its ready samples) stay as they are."""
        document = self._pool_status.document(quote(pool_id, safe=""))

        @firestore.transactional
        def update(transaction: firestore.Transaction) -> None:
            self._check_fence(transaction, fence)
            snapshot = self._reads.one(document.get(transaction=transaction))
            changed = fields((snapshot.to_dict() or {}) if snapshot.exists else {})
            if changed is not None:
                transaction.set(document, {"pool_id": pool_id, **changed}, merge=True)

        with _contention(f"{pool_id}'s status was changed by another writer meanwhile"):
            update(self._client.transaction())

    def ready_samples(self) -> dict[str, tuple[ReadySample, ...]]:
        samples: dict[str, tuple[ReadySample, ...]] = {}
        for snapshot in self._reads.each(self._pool_status.stream()):
            data = snapshot.to_dict() or {}
            kept = _samples(data)
            if kept:
                samples[data["pool_id"]] = kept
        return samples

    def _read_fenced(
        self, transaction: firestore.Transaction, fence: Fence | None,
        document: firestore.DocumentReference,
    ) -> firestore.DocumentSnapshot[Any]:  # fmt: skip
        """``document`` read in ``transaction``, with the lease when ``fence`` is given, in
        one call (BatchGetDocuments: one round trip, not two); refused as _check_fence says."""
        if fence is None:
            return self._reads.one(document.get(transaction=transaction))
        snapshots = {
            snapshot.reference.path: snapshot
            for snapshot in self._reads.each(transaction.get_all([self._lease, document]))
        }
        lease = snapshots[self._lease.path]
        check_fence(fence, _fence(lease.to_dict() if lease.exists else None))
        return snapshots[document.path]

    def _check_fence(self, transaction: firestore.Transaction, fence: Fence | None) -> None:
        """Refuse the transaction's write once the lease has changed hands. Reading the lease
        in the transaction makes a concurrent takeover conflict with it: one of them retries
        and then sees the other."""
        if fence is not None:
            lease = self._reads.one(self._lease.get(transaction=transaction)).to_dict()
            check_fence(fence, _fence(lease))


class FirestoreConfigStore:
    """ConfigStore in one document, ``config/scheduler``."""

    def __init__(self, client: firestore.Client) -> None:
        self._document = client.collection(CONFIG).document(SCHEDULER_CONFIG)
        self._reads = _ReadCount()

    @property
    def documents_read(self) -> int:
        """How many documents this store has read so far (one per load)."""
        return self._reads.total

    def load(self) -> Configuration:
        snapshot = self._reads.one(self._document.get())
        data = snapshot.to_dict() if snapshot.exists else None
        if data is None:
            return Configuration()
        return configuration_from_document(data, source="Firestore config/scheduler")

    def save(self, configuration: Configuration) -> None:
        self._document.set(configuration_to_document(configuration))


class FirestoreMetricSnapshots:
    """MetricSnapshots in the ``metrics`` collection: one document per process, replaced at
    each export (one writer each, so no transaction is needed)."""

    def __init__(self, client: firestore.Client) -> None:
        self._metrics = client.collection(METRICS)

    def put(self, snapshot: MetricSnapshot) -> None:
        self._metrics.document(quote(snapshot.instance, safe="")).set(_snapshot_fields(snapshot))

    def all(self) -> list[MetricSnapshot]:
        found = [_snapshot(s.to_dict() or {}) for s in self._metrics.stream()]
        return sorted(found, key=lambda s: (s.at, s.instance))

    def forget_before(self, cutoff: datetime) -> int:
        old = self._metrics.where(filter=FieldFilter("at", "<", cutoff)).stream()
        gone = 0
        for snapshot in old:
            snapshot.reference.delete()
            gone += 1
        return gone


def _snapshot_fields(snapshot: MetricSnapshot) -> dict[str, Any]:
    return {
        "instance": snapshot.instance,
        "at": snapshot.at,
        "values": [
            {"name": name, "labels": dict(labels), "value": value}
            for name, series in snapshot.values.items()
            for labels, value in series.items()
        ],
        "histograms": [
            {"name": name, "labels": dict(labels), "count": b.count, "sum": b.sum,
             "counts": list(b.counts)}
            for name, series in snapshot.histograms.items()
            for labels, b in series.items()
        ],
    }  # fmt: skip


def _snapshot(data: dict[str, Any]) -> MetricSnapshot:
    values: dict[str, dict[Labels, float]] = {}
    for item in data.get("values", []):
        labels = labels_of_mapping(item["labels"])
        values.setdefault(item["name"], {})[labels] = float(item["value"])
    histograms: dict[str, dict[Labels, Buckets]] = {}
    for item in data.get("histograms", []):
        labels = labels_of_mapping(item["labels"])
        histograms.setdefault(item["name"], {})[labels] = Buckets(
            count=int(item["count"]), sum=float(item["sum"]),
            counts=tuple(int(c) for c in item["counts"]),
        )  # fmt: skip
    return MetricSnapshot(
        instance=data["instance"], at=data["at"], values=values, histograms=histograms
    )


class _ReadCount:
    """Counts documents read (thread-safe: one store serves concurrent requests)."""

    def __init__(self) -> None:
        self.total = 0
        self._lock = threading.Lock()

    def one(self, snapshot: T) -> T:
        self._add(1)
        return snapshot

    def each(self, snapshots: Iterable[T]) -> Iterator[T]:
        for snapshot in snapshots:
            self._add(1)
            yield snapshot

    def _add(self, n: int) -> None:
        with self._lock:
            self.total += n


@contextlib.contextmanager
def _contention(what: str) -> Iterator[None]:
    """A transaction that kept colliding with other writers until the client gave up: the
    writer's view is stale (StaleWrite), not a fault to crash on. The client retries a commit
    that Firestore aborted (``Aborted``: contention) and, out of attempts, raises a ValueError
    from the last ``Aborted``; a read Firestore aborts raises ``Aborted`` itself."""
    try:
        yield
    except Aborted as error:
        raise StaleWrite(f"{what} ({error})") from error
    except ValueError as error:
        if not isinstance(error.__cause__, Aborted):
            raise
        raise StaleWrite(f"{what} ({error.__cause__})") from error


def _usage_fields(usage: UsageEntry) -> dict[str, Any]:
    return {
        "request_id": usage.request_id,
        "tenant": usage.tenant,
        "accelerator": usage.accelerator,
        "mode": usage.mode.value,
        "outcome": usage.outcome.value,
        "granted_hours": usage.granted_hours,
        "used_hours": usage.used_hours,
        "started_at": usage.started_at,
        "ended_at": usage.ended_at,
        "cost": usage.cost,
    }


def _usage_entry(data: dict[str, Any]) -> UsageEntry:
    return UsageEntry(
        request_id=data["request_id"],
        tenant=data["tenant"],
        accelerator=data["accelerator"],
        mode=Mode(data["mode"]),
        outcome=RequestState(data["outcome"]),
        granted_hours=float(data["granted_hours"]),
        used_hours=float(data["used_hours"]),
        started_at=data.get("started_at"),
        ended_at=data["ended_at"],
        cost=None if data.get("cost") is None else float(data["cost"]),
    )


def _fence(data: dict[str, Any] | None) -> Fence | None:
    if data is None:
        return None
    return Fence(holder=data["holder"], token=int(data["token"]), expires_at=data["expires_at"])


def _lease_view(data: dict[str, Any] | None) -> LeaseView:
    if data is None:
        return LeaseView(fence=None)
    return LeaseView(
        fence=_fence(data), again=bool(data.get(AGAIN)), started_at=data.get(STARTED_AT),
        served_from=data.get(SERVED_FROM),
    )  # fmt: skip


def _fence_fields(fence: Fence) -> dict[str, Any]:
    return {"holder": fence.holder, "token": fence.token, "expires_at": fence.expires_at}


# The fields of a stored request that a Change writes (Change.apply); the rest — what it asks
# for, its digest, its outbox cursor — is written once at creation or by mark_announced.
_CHANGED_FIELDS = (
    "state", "version", "updated_at", "reason", "message", "pool", "eta", "first_eta",
    "position", "attempt", "lanes", "since", "events", "hosts",
)  # fmt: skip


def _record_fields(record: RequestRecord) -> dict[str, Any]:
    return {
        "request": request_to_document(record.request),
        "tenant": record.tenant,
        "submitted_at": record.request.submitted_at,
        "state": record.state.value,
        "version": record.version,
        "digest": record.digest,
        "updated_at": record.updated_at,
        "reason": record.reason,
        "message": record.message,
        "pool": record.pool,
        "eta": record.eta,
        "first_eta": record.first_eta,
        "announced": record.announced,
        "events": record.events,
        "attempt": record.attempt,
        "lanes": lanes_to_document(record.lanes),
        "since": record.since,
        "position": record.position,
        "hosts": hosts_to_json(record.hosts),
    }


def _record(data: dict[str, Any]) -> RequestRecord:
    return RequestRecord(
        request=request_from_document(data["request"]),
        state=RequestState(data["state"]),
        version=int(data["version"]),
        digest=data["digest"],
        updated_at=data["updated_at"],
        reason=data.get("reason"),
        message=data.get("message", ""),
        pool=data.get("pool"),
        eta=data.get("eta"),
        first_eta=data.get("first_eta"),
        announced=int(data.get("announced", 0)),
        events=int(data.get("events", 1)),
        attempt=int(data.get("attempt", 0)),
        lanes=lanes_from_document(data.get("lanes")),
        since=data.get("since"),
        position=data.get("position"),
        hosts=hosts_from_json(data.get("hosts")),
    )


def _event_fields(event: StatusEvent, seq: int) -> dict[str, Any]:
    # A timestamp (not the ISO text of ``at``): TTL policies act on timestamp fields only.
    return {**event.to_json(), "seq": seq, EVENT_EXPIRY_FIELD: event.at + EVENT_RETENTION}


def _event(data: dict[str, Any]) -> StatusEvent:
    stored = {"seq", EVENT_EXPIRY_FIELD}
    return StatusEvent.from_json({key: value for key, value in data.items() if key not in stored})


def _samples(data: dict[str, Any]) -> tuple[ReadySample, ...]:
    """A pool status document's ready samples, as stored by ``record_ready``."""
    return tuple(
        ReadySample(
            request_id=item["request_id"],
            at=item["at"],
            took=int(item["took_us"]) * MICROSECOND,
        )
        for item in data.get("ready") or ()
    )
