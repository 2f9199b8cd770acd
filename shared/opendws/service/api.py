"""The HTTP API behind the ``api`` function and the dashboard, as plain routing over the
services: method + path + headers (+ query parameters) → status + JSON.

    GET  /requests/{id}            a request: state, pool, ETA, ready ETA, position, reason,
                                   its hosts (ACTIVE: rank, name, zone, internal_ip,
                                   external_ip), its run (null: capacity only), its events
    POST /requests/{id}/cancel     cancel it (its tenant, or an admin)
    POST /requests/{id}/release    release it (its tenant, or an admin)
    GET  /queue                    pending requests with positions, ETAs, ready ETAs, reasons
    GET  /timeline?horizon=24h     per pool: its capacity, and the runs, provisioning orders,
                                   orders waiting at Google, calendar blocks and planned starts
                                   that begin within the horizon (24h, 7d or 120d), each with
                                   its kind (opendws.service.queries.SpanKind)
    GET  /quota                    per tenant and accelerator: in use now, nominal, borrowing
                                   limit, the most it could hold
    GET  /usage                    accelerator-hours granted and used, cost, outcomes
    GET  /usage/daily?days=30      per tenant: used accelerator-hours and cost per UTC day
    GET  /metrics                  every process's metrics in Prometheus text (admins only)
    GET  /                         the dashboard page (it calls the routes above)

A query parameter out of its range is answered 400, naming it.

Callers authenticate with ``Authorization: Bearer <key>``; each key belongs to a tenant or to
the admins. Only the keys' SHA-256 digests are kept (:func:`key_digest`); a caller's key is
hashed and compared with every kept digest in constant time. Where Google identities are
accepted (:mod:`opendws.service.access`), IAP's signed header or a Google-signed ID token in
its place names the caller, and the configuration's access table its tenant: a token that
does not verify is answered 401, a verified principal the table lacks 403. A tenant sees and
changes only its own requests and quota (other tenants' holds on the timeline are shown as
``other``, without names); an admin sees all. The page never takes a key from its address: it
asks for one in a sign-in form and keeps it in the browser tab's session storage.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from importlib import resources
from typing import Any

from opendws.ports import Clock, Forbidden, Requests, Unauthorized, hosts_to_json
from opendws.service.access import IAP_HEADER, GoogleAccess, looks_like_jwt
from opendws.service.queries import QueryService
from opendws.service.release import EndOutcome, EndService
from opendws.service.usage import MAX_DAYS, UsageService

ADMIN = "admin"
# Prometheus' text exposition format.
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
# The timeline's horizons, as the dashboard's selector offers them: a day, a week, and the
# longest lead of a calendar block (TPU blocks start up to 120 days ahead).
HORIZONS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "120d": timedelta(days=120)}
DEFAULT_DAYS = 30


class BadParameter(ValueError):
    """A query parameter the route cannot take; the message names it."""


@dataclass(frozen=True, slots=True)
class Response:
    """What to answer: a status, and JSON (or the dashboard's HTML)."""

    status: int
    body: dict[str, Any] | list[Any] | str
    content_type: str | None = None  # for a text body; None: the dashboard's HTML


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str  # or ADMIN
    admin: bool


class ApiService:
    """Routes API calls (see the module docstring)."""

    def __init__(
        self, store: Requests, queries: QueryService, usage: UsageService,
        ending: Callable[[], EndService], clock: Clock, keys: Mapping[str, str],
        metrics: Callable[[], str] | None = None,
        google: GoogleAccess | None = None,
    ) -> None:  # fmt: skip
        self._metrics = metrics  # every process's metrics in Prometheus text
        self._store = store
        self._queries = queries
        self._usage = usage
        self._ending = ending  # built on first use: reading needs no cloud clients
        self._clock = clock
        self._keys = dict(keys)  # key_digest(key) → tenant (or "admin")
        self._google = google  # None: API keys only

    def handle(
        self, method: str, path: str, headers: Mapping[str, str],
        query: Mapping[str, str] | None = None,
    ) -> Response:  # fmt: skip
        parts = [part for part in path.split("/") if part]
        if method == "GET" and parts in ([], ["dashboard"]):
            return Response(200, dashboard_html())
        caller = self._caller(headers)
        if isinstance(caller, Response):
            return caller
        try:
            return self._route(caller, method, parts, query or {})
        except BadParameter as error:
            return Response(400, {"error": str(error)})

    def _route(
        self, caller: Caller, method: str, parts: list[str], query: Mapping[str, str]
    ) -> Response:
        match method, parts:
            case "GET", ["requests", request_id]:
                return self._request(caller, request_id)
            case "POST", ["requests", request_id, ("cancel" | "release") as action]:
                return self._end(caller, request_id, action)
            case "GET", ["queue"]:
                return self._queue(caller)
            case "GET", ["timeline"]:
                return self._timeline(caller, _horizon(query))
            case "GET", ["quota"]:
                return self._quota(caller)
            case "GET", ["usage"]:
                return self._usage_rows(caller)
            case "GET", ["usage", "daily"]:
                return self._usage_daily(caller, _days(query))
            case "GET", ["metrics"]:
                return self._metrics_text(caller)
        return Response(404, {"error": f"no route {method} /{'/'.join(parts)}"})

    def _caller(self, headers: Mapping[str, str]) -> Caller | Response:
        """Who calls (IAP's signed header, else a bearer ID token, else a bearer API key), or
        the 401 / 403 saying why the call is refused."""
        lowered = {key.lower(): value for key, value in headers.items()}
        scheme, _, key = lowered.get("authorization", "").partition(" ")
        bearer = key.strip() if scheme.lower() == "bearer" else ""
        assertion = lowered.get(IAP_HEADER)
        token = bearer if looks_like_jwt(bearer) else None
        if assertion is not None or token is not None:
            if self._google is None:
                return Response(401, {"error": "this API takes API keys only (no Google "
                                               "identity is configured for it)"})  # fmt: skip
            try:
                found = self._google.tenant(assertion=assertion, token=token)
            except Unauthorized as error:
                return Response(401, {"error": str(error)})
            except Forbidden as error:
                return Response(403, {"error": str(error)})
            return Caller(tenant=found, admin=found == ADMIN)
        if not bearer:
            return Response(401, {"error": "give Authorization: Bearer <your API key>"})
        digest = key_digest(bearer).encode()
        known_as: str | None = None
        for known, tenant in self._keys.items():  # every one, so the time says nothing
            if hmac.compare_digest(known.encode(), digest):
                known_as = tenant
        if known_as is None:
            return Response(401, {"error": "this API key is not known: give Authorization: "
                                           "Bearer <your API key>"})  # fmt: skip
        return Caller(tenant=known_as, admin=known_as == ADMIN)

    def _request(self, caller: Caller, request_id: str) -> Response:
        record = self._store.get(request_id)
        if record is None or not (caller.admin or record.tenant == caller.tenant):
            # Another tenant's request is answered as absent: ids of others are not revealed.
            return Response(404, {"error": f"no request {request_id!r}"})
        ready, ready_p90 = self._queries.ready_etas(record, self._clock.now())
        return Response(200, {
            "request_id": request_id, "tenant": record.tenant, "state": record.state.value,
            "pool": record.pool, "eta": _iso(record.eta), "ready_eta": _iso(ready),
            "ready_eta_p90": _iso(ready_p90), "position": record.position,
            "reason": record.reason, "message": record.message,
            "run": None if record.request.run is None else record.request.run.to_json(),
            "hosts": hosts_to_json(record.hosts),
            "events": [event.to_json() for event in self._store.events(request_id)],
        })  # fmt: skip

    def _end(self, caller: Caller, request_id: str, action: str) -> Response:
        record = self._store.get(request_id)
        if record is None or not (caller.admin or record.tenant == caller.tenant):
            # As for reading: another tenant's request is answered as absent.
            return Response(404, {"error": f"no request {request_id!r}"})
        ending = self._ending()
        act = ending.cancel if action == "cancel" else ending.release
        result = act(request_id, caller.tenant, admin=caller.admin)
        # Ownership was checked above: a refusal here is about the state (a running request
        # cannot be cancelled, only released).
        status = 409 if result.outcome is EndOutcome.REFUSED else 200
        state = None if result.state is None else result.state.value
        return Response(status, {"outcome": result.outcome.value, "state": state,
                                 "message": result.message})  # fmt: skip

    def _queue(self, caller: Caller) -> Response:
        tenant = None if caller.admin else caller.tenant
        entries = self._queries.queue(self._clock.now(), tenant=tenant)
        return Response(200, [
            {**asdict(entry), "eta": _iso(entry.eta), "ready_eta": _iso(entry.ready_eta),
             "ready_eta_p90": _iso(entry.ready_eta_p90), "waited": entry.waited.total_seconds()}
            for entry in entries
        ])  # fmt: skip

    def _timeline(self, caller: Caller, horizon: str) -> Response:
        now = self._clock.now()
        end = now + HORIZONS[horizon]
        configured = self._queries.pools()
        # Every configured pool is shown, holding something or not; a pool that holds
        # something but is no longer configured is shown too, without a capacity.
        shown: dict[str, list[dict[str, Any]]] = {pool.pool_id: [] for pool in configured}
        for pool, spans in self._queries.timeline(now, until=end).items():
            shown.setdefault(pool, [])
            for span in spans:
                mine = caller.admin or span.tenant == caller.tenant
                shown[pool].append({
                    "request_id": span.request_id if mine else "other",
                    "tenant": span.tenant if mine else "other",
                    "state": span.state, "kind": span.kind.value, "units": span.units,
                    "start": _iso(span.start), "end": _iso(span.end),
                })  # fmt: skip
        return Response(200, {
            "now": _iso(now), "horizon": horizon, "end": _iso(end),
            "capacity": {pool.pool_id: pool.capacity for pool in configured},
            "pools": dict(sorted(shown.items())),
        })  # fmt: skip

    def _quota(self, caller: Caller) -> Response:
        rows = self._queries.quota(tenant=None if caller.admin else caller.tenant)
        return Response(200, [asdict(row) for row in rows])

    def _usage_daily(self, caller: Caller, days: int) -> Response:
        today = self._clock.now().date()
        series = self._usage.daily(today, days, tenant=None if caller.admin else caller.tenant)
        first = today - timedelta(days=days - 1)
        return Response(200, {
            "days": [(first + timedelta(days=n)).isoformat() for n in range(days)],
            "tenants": [
                {"tenant": s.tenant, "used_hours": list(s.used_hours), "cost": list(s.cost)}
                for s in series
            ],
        })  # fmt: skip

    def _metrics_text(self, caller: Caller) -> Response:
        if not caller.admin:
            # Metrics name every tenant and its usage: for the admins (and their scraper).
            return Response(403, {"error": "metrics are for admins: use an admin key"})
        if self._metrics is None:
            return Response(404, {"error": "metrics are not configured here"})
        return Response(200, self._metrics(), content_type=PROMETHEUS_TEXT)

    def _usage_rows(self, caller: Caller) -> Response:
        rows = self._usage.summary(tenant=None if caller.admin else caller.tenant)
        return Response(200, [
            {"tenant": r.tenant, "accelerator": r.accelerator, "granted_hours": r.granted_hours,
             "used_hours": r.used_hours, "cost": r.cost, "outcomes": dict(r.outcomes)}
            for r in rows
        ])  # fmt: skip


def _horizon(query: Mapping[str, str]) -> str:
    horizon = query.get("horizon", "24h")
    if horizon not in HORIZONS:
        raise BadParameter(f"horizon must be one of {', '.join(HORIZONS)}, not {horizon!r}")
    return horizon


def _days(query: Mapping[str, str]) -> int:
    text = query.get("days", str(DEFAULT_DAYS))
    if not text.isdigit() or not 1 <= int(text) <= MAX_DAYS:
        raise BadParameter(f"days must be a whole number from 1 to {MAX_DAYS}, not {text!r}")
    return int(text)


def key_digest(key: str) -> str:
    """What is kept of an API key: ``sha256:`` and the hex SHA-256 of its UTF-8 bytes (the
    keys are long random strings, so a plain hash is enough: nothing to guess from it)."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def dashboard_html() -> str:
    """The dashboard page (shipped with the package)."""
    return resources.files("opendws").joinpath("dashboard.html").read_text(encoding="utf-8")
