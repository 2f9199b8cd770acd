"""Timers end to end on one machine: the Cloud Tasks emulator dispatches a task to the
``timer`` function under functions-framework, deployed as Terraform deploys it — behind its
Cloud Run service (the local front, emulators.cloud_run), internal-only and invokable by the
tasks account alone, which checks the task's OIDC token and hands it on with its signature
replaced by ``SIGNATURE_REMOVED_BY_GOOGLE``; the function reads the checked claims
(``OPENDWS_INVOKER_CHECKED_BY_RUN``) and ends the run — in Firestore (official emulator), on
the Compute Engine emulator, and with its event on Pub/Sub. An early release deletes the timer
so it never fires; a lost timer is caught by the reconciler's sweep; a forged or misdirected
call changes nothing.

Sources: run/docs/authenticating/service-to-service and run/docs/troubleshooting
#signature-removed (einride/iam-go ``iamgoogle/signature.go``): a service that requires
authentication gets the caller's token with its signature removed, so a timer that verified it
again would refuse every call; run/docs/securing/ingress: Cloud Tasks of the project reaches an
internal-only service, the internet does not.

The Cloud Tasks emulator runs on a frozen clock of the test's, a while behind the wall clock
that the function reads: a timer due now by the function's clock is still ahead for the
emulator until the test moves its clock there, and ``dispatch_due()`` returns once the function
has answered. So "it never fired" is a fact once the clock has passed the timer, not a wait.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from emulators import CloudTasksEmulator, ComputeEmulator, Emulators, free_port
from emulators.cloud_run import CloudRunFront, Ingress, Service, function_url, run_app_url
from emulators.cloud_tasks import ISSUER, Dispatch
from emulators.functions import serving
from opendws.clock import ManualClock
from opendws.domain.states import RequestState
from opendws.ports import Change, Configuration, Order, RequestRecord, StatusEvent
from opendws.service.timers import release_timer
from opendws.sim import SimulatedCloud
from tests.builders import A3, H100, flex, pool
from tests.world import submit, tenants_for

S = RequestState
ZONE = "us-central1-a"
POOL = f"{ZONE}/{A3}"
INVOKER = "opendws-tasks@test-project.iam.gserviceaccount.com"
# The timer's Cloud Run service: its tasks carry a token for its run.app URL, as Terraform arms
# them; its function URL is the other audience Google accepts.
AUDIENCE = run_app_url("opendws-timer", "123456789012", "us-central1")
AUDIENCES = frozenset({AUDIENCE, function_url("opendws-timer", "p", "us-central1")})
SERVICE = Service("opendws-timer", Ingress.INTERNAL, frozenset({INVOKER}), AUDIENCES)
RUN = timedelta(minutes=10)
# How far the emulator's clock starts behind the wall clock: more than a test takes, so that a
# timer due by the function's clock is not yet due for the emulator; less than a token's hour,
# so that the tokens it dates by its clock are neither expired nor issued in the future.
LAG = timedelta(minutes=1)


@dataclass
class Stack:
    project: str
    url: str  # the timer's Cloud Run service, from inside the project (where Cloud Tasks calls)
    public_url: str  # the same service, from the internet
    tasks: CloudTasksEmulator
    clock: ManualClock  # the emulator's, frozen
    cloud: SimulatedCloud
    store: Any
    ending: Any  # an EndService wired as in production, from the test's side
    timers: Any  # the CloudTasksTimerQueue
    providers: Any

    def active(self, request_id: str, ends_in: timedelta) -> RequestRecord:
        """A request running in the pool whose run ends ``ends_in`` from now: submitted and
        provisioned in the cloud, its record moved to ACTIVE as the reconciler would."""
        now = datetime.now(UTC)
        started = now + ends_in - RUN
        request = flex(request_id, vm_count=2, run=RUN, locations=(ZONE,),
                       submitted_at=started - timedelta(minutes=1))  # fmt: skip
        record = submit(self.store, request)
        for version, state in enumerate((S.PROVISIONING, S.ACTIVE), start=1):
            self.store.change(
                request_id,
                Change(
                    expected_version=version,
                    state=state,
                    pool=POOL,
                    attempt=1,
                    event=StatusEvent(
                        request_id=request_id,
                        tenant="t",
                        state=state,
                        previous_state=record.state,
                        at=started,
                    ),
                ),
            )
        home = pool(zone=ZONE, capacity=4)
        self.providers.mig_flex.provision(Order(request=request, pool=home, attempt=1))
        stored: RequestRecord | None = self.store.get(request_id)
        assert stored is not None
        return stored


@pytest.fixture
def stack(official_emulators: Emulators, emulator_project: str, tmp_path: Path) -> Iterator[Stack]:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore, pubsub_v1

    from opendws.bootstrap import Container, Settings, capacity_providers

    credentials = AnonymousCredentials()
    publisher = pubsub_v1.PublisherClient(credentials=credentials)
    for topic in ("capacity-events", "reconcile-ticks"):
        publisher.create_topic(name=publisher.topic_path(emulator_project, topic))
    cloud = SimulatedCloud(
        ManualClock(running=True),
        provisioning_latency=timedelta(0),
        operation_latency=timedelta(0),
    )
    cloud.set_stock(ZONE, A3, 4)
    certs = tmp_path / "certs.json"
    port = free_port()
    clock = ManualClock(datetime.now(UTC) - LAG)
    with (
        CloudTasksEmulator(certs_path=certs, clock=clock) as tasks,
        ComputeEmulator(cloud) as compute,
        CloudRunFront(f"http://127.0.0.1:{port}/", SERVICE, certs=tasks.certs(),
                      issuers=frozenset({ISSUER})) as front,
    ):  # fmt: skip
        url = front.internal_url
        environment = {
            **official_emulators.environment(),
            "OPENDWS_PROJECT": emulator_project,
            "OPENDWS_COMPUTE_ENDPOINT": compute.endpoint,
            "OPENDWS_TIMER_URL": url,
            "OPENDWS_TIMER_AUDIENCE": AUDIENCE,
            "OPENDWS_TIMER_SERVICE_ACCOUNT": INVOKER,
            "OPENDWS_TIMER_CERTS": str(certs),
            "CLOUD_TASKS_EMULATOR_HOST": tasks.address,
            # As Terraform sets it on the timer, whose service Cloud Run guards.
            "OPENDWS_INVOKER_CHECKED_BY_RUN": "true",
        }
        settings = Settings(
            project=emulator_project, compute_endpoint=compute.endpoint, timer_url=url,
            timer_audience=AUDIENCE, timer_service_account=INVOKER,
            tasks_emulator_host=tasks.address, on_emulators=True,
        )  # fmt: skip
        container = Container(settings)
        queue = container.timers
        assert queue is not None
        queue.ensure_queue()  # type: ignore[attr-defined]
        db = firestore.Client(project=emulator_project, credentials=credentials)
        from opendws.adapters.firestore import FirestoreConfigStore, FirestoreRequestStore

        FirestoreConfigStore(db).save(
            Configuration(pools=(pool(zone=ZONE, capacity=4),), tenants=tenants_for(H100))
        )
        with serving("timer", "http", environment, port=port):
            yield Stack(
                project=emulator_project, url=url, public_url=front.url, tasks=tasks,
                clock=clock, cloud=cloud,
                store=FirestoreRequestStore(db), ending=container.end, timers=queue,
                providers=capacity_providers(emulator_project, endpoint=compute.endpoint),
            )  # fmt: skip
        db.close()


def dispatches(stack: Stack, name: str) -> list[Dispatch]:
    return [d for d in stack.tasks.dispatched() if d.task.endswith(name)]


def test_a_timer_fires_on_time_and_releases_the_capacity(stack: Stack) -> None:
    record = stack.active("train", ends_in=timedelta(0))  # by the function's clock
    timer = release_timer(record, record.since)  # type: ignore[arg-type]
    assert stack.cloud.stock(ZONE, A3) == 2
    stack.timers.arm(timer, datetime.now(UTC))
    stack.clock.set(timer.fire_at - timedelta(microseconds=1))
    stack.tasks.dispatch_due()
    assert dispatches(stack, timer.name) == []  # not a moment early
    stack.clock.set(timer.fire_at)
    # (The function's first call also builds its clients: allow for that cold start.)
    stack.tasks.dispatch_due(timeout=30)
    # dispatch_due returned once the function had answered, after its last step.
    assert stack.store.get("train").state is S.EXPIRED
    [dispatch] = dispatches(stack, timer.name)
    assert dispatch.status == 200
    assert dispatch.at == timer.fire_at  # on time, by the emulator's clock
    assert stack.cloud.stock(ZONE, A3) == 4
    events = stack.store.events("train")
    assert (events[-1].state, events[-1].reason) == (S.EXPIRED, "RUN_TIME_UP")
    [usage] = stack.store.usage("t")
    assert usage.started_at is not None
    held = usage.ended_at - usage.started_at  # from ACTIVE to the moment the timer ended it
    assert timedelta(0) <= held - RUN < timedelta(seconds=15)
    assert usage.used_hours == pytest.approx(16 * held / timedelta(hours=1))


def test_an_early_release_deletes_the_timer_and_it_never_fires(stack: Stack) -> None:
    record = stack.active("early", ends_in=timedelta(minutes=1))
    timer = release_timer(record, record.since)  # type: ignore[arg-type]
    stack.timers.arm(timer, datetime.now(UTC))
    result = stack.ending.release("early", "t")
    assert result.state is S.RELEASED
    stack.clock.set(timer.fire_at + timedelta(seconds=1))  # past the moment it was due
    stack.tasks.dispatch_due()
    assert dispatches(stack, timer.name) == []
    assert stack.store.get("early").state is S.RELEASED
    assert stack.cloud.stock(ZONE, A3) == 4


def test_a_retried_timer_creation_makes_one_task(stack: Stack) -> None:
    record = stack.active("twice", ends_in=timedelta(hours=1))
    timer = release_timer(record, record.since)  # type: ignore[arg-type]
    now = datetime.now(UTC)
    stack.timers.arm(timer, now)
    stack.timers.arm(timer, now)
    client = stack.tasks.client()
    queue = stack.timers._settings.queue_path
    assert [t.name.rsplit("/", 1)[-1] for t in client.list_tasks(parent=queue)] == [timer.name]


def post(url: str, body: dict[str, Any], token: str | None) -> int:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def forged_token(audience: str) -> str:
    """A well-formed token for the right caller, signed by a key that is not the emulator's."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from google.auth import crypt, jwt

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()  # fmt: skip
    now = int(time.time())
    claims = {"iss": "opendws-cloud-tasks-emulator", "aud": audience, "email": INVOKER,
              "email_verified": True, "iat": now, "exp": now + 600}  # fmt: skip
    signer = crypt.RSASigner.from_string(pem, key_id="forged")
    token: bytes = jwt.encode(signer, claims)
    return token.decode()


def test_a_forged_missing_or_misdirected_timer_call_changes_nothing(stack: Stack) -> None:
    """Cloud Run answers them (run/docs/troubleshooting): 401 without a token, 403 for one
    that does not verify or is not the invoker's for this service, 404 from the internet."""
    record = stack.active("guarded", ends_in=timedelta(seconds=-5))  # already due
    timer = release_timer(record, record.since)  # type: ignore[arg-type]
    body = timer.to_json()
    assert post(stack.url, body, None) == 401
    assert post(stack.url, body, "not-a-jwt") == 403
    forged = forged_token(AUDIENCE)
    assert post(stack.url, body, forged) == 403
    # Claims with the mark of Cloud Run's check do not pass Cloud Run itself.
    assert post(stack.url, body, f"{forged.rpartition('.')[0]}.SIGNATURE_REMOVED_BY_GOOGLE") == 403
    # Internal-only: from outside the project no call is found, whatever its token.
    assert post(stack.public_url, body, forged) == 404
    assert post(stack.public_url, body, None) == 404
    # A genuine token from the emulator, but minted for another audience: forbidden.
    from opendws.adapters.cloud_tasks import CloudTasksTimerQueue, TimerSettings

    elsewhere = CloudTasksTimerQueue(
        stack.tasks.client(),
        TimerSettings(project=stack.project, location="us-central1", queue="opendws-timers",
                      url=stack.url, service_account=INVOKER, audience="another-service"),
    )  # fmt: skip
    elsewhere.arm(timer, datetime.now(UTC))
    stack.clock.set(timer.fire_at)
    stack.tasks.dispatch_due()
    assert {d.status for d in dispatches(stack, timer.name)} == {403}
    assert stack.store.get("guarded").state is S.ACTIVE
    assert stack.cloud.stock(ZONE, A3) == 2
