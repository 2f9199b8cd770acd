"""Cloud Functions entry points: decode, call one service, map errors.

Every function logs in Cloud Logging's structured JSON (one line per record on stdout, with
the invocation's trace; :mod:`opendws.adapters.logs`) and exports its metrics when the
invocation ends (:class:`opendws.adapters.telemetry.OtelMetrics`)."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import flask
import functions_framework
from cloudevents.http import CloudEvent

from opendws import bootstrap
from opendws.adapters import logs
from opendws.adapters.oidc import Forbidden, Unauthorized, invocation_token
from opendws.ports import Timer, topic_of_source
from opendws.ports.records import nudge_served
from opendws.service.hooks import MAX_BODY, too_large
from opendws.service.intake import AnnouncementPending, Delivery
from opendws.service.reconcile import PassReport

log = logging.getLogger("opendws.functions")
logs.configure(bootstrap.Settings.from_environment().project)
# Between the follow-up passes of one reconcile invocation.
FOLLOW_UP_INTERVAL = timedelta(seconds=2)


@contextlib.contextmanager
def invocation(trace: logs.Trace | None) -> Iterator[bootstrap.Container]:
    """One invocation: logs carry its trace; its metrics are exported when it ends (raised
    or not)."""
    container = bootstrap.container()
    with logs.traced(trace):
        try:
            yield container
        finally:
            try:
                container.metrics.flush()
            except Exception as error:  # metrics must never fail the work itself
                log.warning("metrics not exported: %s", error)


def event_trace(event: CloudEvent) -> logs.Trace | None:
    """A CloudEvent's trace: its ``traceparent`` extension (Eventarc sets it)."""
    parent = event.get("traceparent")
    return logs.trace_of({"traceparent": str(parent)}) if parent else None


@functions_framework.cloud_event
def intake(event: CloudEvent) -> None:
    """A request topic (``capacity-requests-{tenant}``, the admins', the shared one) →
    Firestore: one Pub/Sub message (Eventarc's messagePublished CloudEvent, whose ``source``
    names the topic: who the message speaks for). Bad input is answered with a REJECTED
    event; only transient faults raise. A duplicate that finds its request stored but not yet
    announced is a retry by design: one WARNING line, and a 409 answer without a traceback,
    which Pub/Sub takes as a negative acknowledgement and redelivers (any status but 102,
    200, 201, 202 or 204: https://cloud.google.com/pubsub/docs/push); a 5xx would count as
    the function failing."""
    with invocation(event_trace(event)) as container:
        try:
            container.intake.handle(delivery_of(event))
        except AnnouncementPending as pending:
            log.warning("intake: message %s to be redelivered: %s", event["id"], pending)
            flask.abort(409, description=str(pending))


@functions_framework.cloud_event
def reconcile(event: CloudEvent) -> None:
    """``reconcile-ticks`` → reconcile passes (a tick from Cloud Scheduler or a nudge; the
    message's content does not matter). While requests are provisioning, it follows up with a
    pass every few seconds for a while, so capacity becomes ACTIVE without waiting for the next
    tick. A pass that finds the lease taken asks its holder for one more pass and returns;
    the holder runs it at once when its own ends (nudges during a pass are coalesced, never
    dropped), for up to twice the follow-up time (an ask still open then is served by the
    next nudge or tick).

    A message that a pass has already served is acknowledged after one read of the lease and
    nothing else (:func:`already_served`): a burst of nudges costs reads, not a write and a
    pass each on the one lease document. Such a message starts no follow-up of its own, so an
    invocation that stops following up while requests are still provisioning, after a window
    in which its passes moved some, hands the follow-up on: it publishes one nudge, which no
    pass has served yet (:func:`hand_on`). A window in which nothing moved (orders waiting in
    Google's queue) hands nothing on: the tick looks again."""
    with invocation(event_trace(event)) as container:
        if already_served(container, event):
            return
        window = container.settings.reconcile_follow_up.total_seconds()
        deadline = time.monotonic() + window
        moved = False  # whether a pass of this invocation moved a request
        while True:
            report = container.reconcile.run_pass()
            moved = moved or bool(report.transitions)
            fields = {"trigger": event["id"], **summary(report)}
            log.info("reconcile pass: %s", report.outcome.value, extra={"fields": fields})
            if report.ran and container.settings.agent_url:
                # Runs whose agents were lost are released (service.agents.sweep).
                lost = container.agents.sweep()
                if lost:
                    log.warning("runs released, agents lost: %s", ", ".join(lost))
            if report.again and time.monotonic() < deadline + window:
                continue
            if not report.ran or report.in_flight == 0:
                return
            if time.monotonic() >= deadline:
                if moved:
                    hand_on(container, report.in_flight)
                return
            time.sleep(FOLLOW_UP_INTERVAL.total_seconds())


def hand_on(container: bootstrap.Container, in_flight: int) -> None:
    """Publish one nudge for the follow-up of ``in_flight`` provisioning requests, which a
    fresh invocation takes on (best effort, as every nudge: the tick is the backstop)."""
    try:
        container.adapters.nudger.nudge(f"follow-up: {in_flight} provisioning")
    except Exception as error:
        log.warning("follow-up not handed on (the next tick looks again): %s", error)


def already_served(container: bootstrap.Container, event: CloudEvent) -> bool:
    """Whether a ``reconcile-ticks`` message needs no pass of its own, by its Pub/Sub publish
    time and one plain read of the lease (:func:`~opendws.ports.records.nudge_served`: a pass
    that took the lease after the message was published and gave it up having read the
    requests has seen what the message announces; or the holder owes one more pass already).

    Why this rule: every nudge is published after the change it announces is stored (intake
    after the request is created, release after the final state is written), a tick stands
    for the time it was published, and every pass reads the requests after it takes the lease
    — so a pass that took it later has seen the change or the time. Judging that takes one
    document read (no transaction: no lock that the pass's fenced writes would wait on, and
    no write), where asking the holder takes a transaction and, once per pass, a write, and a
    free lease a pass of its own (two writes). Firestore sustains about one write a second to
    one document (https://cloud.google.com/firestore/docs/best-practices, "Hotspots";
    https://cloud.google.com/firestore/quotas, writes and transactions), so hundreds of
    nudges a second must not each write the lease. The times compared come from two clocks
    (Pub/Sub stamps ``publishTime`` when it receives the publish:
    https://cloud.google.com/pubsub/docs/reference/rest/v1/PubsubMessage), hence a margin
    (:data:`~opendws.ports.records.CLOCK_MARGIN`); a message without a publish time, or a
    lease that cannot be read, runs a pass as before."""
    message: dict[str, Any] = (event.data or {}).get("message") or {}
    published = message.get("publishTime")
    if not published:
        return False
    try:
        view = container.adapters.store.lease_view()
    except Exception as error:  # the pass reads and reports what is wrong
        log.warning("reconcile: lease not read (a pass runs): %s", error)
        return False
    if not nudge_served(view, _instant(str(published)), container.adapters.clock.now()):
        return False
    log.info("reconcile: %s already served (or owed) by a pass that starts after it", event["id"])
    return True


def summary(report: PassReport) -> dict[str, Any]:
    """A pass report as one structured log entry."""
    return {
        "ran": report.ran,
        "stale": report.stale,
        "transitions": report.transition_counts(),
        "provisioned": len(report.provisioned),
        "released": len(report.released),
        "leaks": len(report.leaks),
        "observed_pools": report.observed_pools,
        "observed_all": report.observed_all,
        "published": report.published,
        "in_flight": report.in_flight,
        "again": report.again,
    }


@functions_framework.http
def timer(request: flask.Request) -> tuple[dict[str, Any], int]:
    """A Cloud Tasks timer is due: check the caller's OIDC token (or, behind Cloud Run's
    invoker check, the claims Cloud Run handed on: opendws.adapters.oidc), then end (or start)
    what the timer is for. 401/403 for a caller that is not the configured invoker, 400 for a
    body that is not a timer; a timer that no longer applies is acknowledged (200) and
    ignored."""
    with invocation(logs.trace_of(dict(request.headers))) as container:
        try:
            container.verifier.verify(invocation_token(dict(request.headers)))
        except Unauthorized as error:
            return {"error": str(error)}, 401
        except Forbidden as error:
            return {"error": str(error)}, 403
        try:
            due = Timer.from_json(request.get_json(force=True, silent=False))
        except (ValueError, KeyError, TypeError) as error:
            return {"error": f"not a timer: {error}"}, 400
        result = container.end.fire(due)
        return {"outcome": result.outcome.value, "message": result.message}, 200


@functions_framework.http
def agent(request: flask.Request) -> tuple[dict[str, Any], int]:
    """The agents on the gangs' VMs (see opendws.service.agents): public at Cloud Run — each
    call carries a VM identity token or the session it was exchanged for, which the service
    verifies itself. 400 for a body that is not a JSON object."""
    with invocation(logs.trace_of(dict(request.headers))) as container:
        body = request.get_json(force=True, silent=True)
        if body is None and request.get_data():
            return {"error": "the body is not JSON"}, 400
        if body is not None and not isinstance(body, dict):
            return {"error": "the body must be a JSON object"}, 400
        answer = container.agents.handle(
            request.path, request.headers.get("Authorization"), body or {}
        )
        return answer.body, answer.status


@functions_framework.http
def ci_hook(request: flask.Request) -> tuple[dict[str, Any], int]:
    """A CI system's webhook (GitHub workflow_job, GitLab job events, or the generic signed
    hook) → a submit or release on capacity-requests. 401 for a bad signature."""
    with invocation(logs.trace_of(dict(request.headers))) as container:
        if (request.content_length or 0) > MAX_BODY:  # refused before the body is read
            result = too_large(None)
        else:
            result = container.hooks.handle(dict(request.headers), request.get_data())
        return {"message": result.message, "request_id": result.request_id}, result.status


@functions_framework.http
def api(request: flask.Request) -> flask.Response:
    """The HTTP API and the dashboard (see opendws.service.api)."""
    with invocation(logs.trace_of(dict(request.headers))) as container:
        answer = container.api.handle(
            request.method, request.path, dict(request.headers), request.args.to_dict()
        )
    if isinstance(answer.body, str):
        kind = answer.content_type or "text/html; charset=utf-8"
        return flask.Response(answer.body, status=answer.status, content_type=kind)
    return flask.Response(
        json.dumps(answer.body), status=answer.status, mimetype="application/json"
    )


def delivery_of(event: CloudEvent) -> Delivery:
    """The Pub/Sub message inside a ``google.cloud.pubsub.topic.v1.messagePublished`` event."""
    message: dict[str, Any] = (event.data or {}).get("message", {})
    published = message.get("publishTime") or event["time"]
    return Delivery(
        data=base64.b64decode(message.get("data", "")),
        message_id=str(message.get("messageId") or event["id"]),
        published_at=_instant(published),
        attributes=dict(message.get("attributes") or {}),
        # The topic it was published on (//pubsub.googleapis.com/projects/P/topics/T): who it
        # speaks for. Eventarc sets it; a push subscription whose endpoint path names the
        # topic gets it from functions-framework.
        topic=topic_of_source(str(event["source"] or "")),
    )


def _instant(text: str) -> datetime:
    instant = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return instant if instant.tzinfo else instant.replace(tzinfo=UTC)


__all__ = ["agent", "api", "ci_hook", "delivery_of", "intake", "reconcile", "timer"]
