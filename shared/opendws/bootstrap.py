"""Settings → adapters → services: the one place that wires opendws together.

Settings come from the environment:

- ``OPENDWS_PROJECT`` (else ``GOOGLE_CLOUD_PROJECT``, else the local stack's ``demo-opendws``);
  the Google clients find the Firestore and Pub/Sub emulators themselves through
  ``FIRESTORE_EMULATOR_HOST`` and ``PUBSUB_EMULATOR_HOST`` when those are set;
- ``OPENDWS_COMPUTE_ENDPOINT``: the Compute Engine / Cloud TPU emulator's URL on one machine;
- timers: ``OPENDWS_TIMER_URL`` (the ``timer`` function's URL; without it there are no timers
  and the reconciler's sweep alone ends runs), ``OPENDWS_TIMER_SERVICE_ACCOUNT`` (the invoker
  Cloud Tasks signs as), ``OPENDWS_TIMER_AUDIENCE`` (default: the URL),
  ``OPENDWS_TASKS_LOCATION`` and ``OPENDWS_TASKS_QUEUE``; on one machine
  ``CLOUD_TASKS_EMULATOR_HOST`` (the Cloud Tasks emulator) and ``OPENDWS_TIMER_CERTS`` (a JSON
  file of the emulator's token certificates, which then replace Google's);
- how capacity is created: ``OPENDWS_BOOT_IMAGE``, ``OPENDWS_NETWORK`` (the VMs' image and
  network), ``OPENDWS_TPU_RUNTIME_VERSION`` and ``OPENDWS_TPU_TIER`` (``guaranteed`` or ``spot``);
- ``OPENDWS_RECONCILE_FOLLOW_UP_SECONDS``: how long one reconcile invocation keeps passing
  every few seconds while requests are provisioning (default 20; the function's timeout must
  be longer).

Every builder is cached: one set of clients and services per process.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from opendws.ports import TimerQueue
from opendws.service.api import ApiService
from opendws.service.hooks import HookSecrets, HookService
from opendws.service.intake import IntakeService
from opendws.service.queries import QueryService
from opendws.service.reconcile import Providers, ReconcileService
from opendws.service.release import EndService
from opendws.service.usage import UsageService

LOCAL_PROJECT = "demo-opendws"


@dataclass(frozen=True, slots=True)
class Settings:
    """Where opendws runs."""

    project: str
    events_topic: str = "capacity-events"
    ticks_topic: str = "reconcile-ticks"
    # The Compute Engine / Cloud TPU endpoint: None for Google's; the emulator's URL locally.
    compute_endpoint: str | None = None
    tasks_location: str = "us-central1"
    tasks_queue: str = "opendws-timers"
    timer_url: str | None = None  # None: no timers
    timer_service_account: str = ""
    timer_audience: str = ""
    tasks_emulator_host: str | None = None
    timer_certs: str | None = None  # path of the emulator's certificates (JSON)
    # How long one reconcile invocation keeps following up on provisioning requests.
    reconcile_follow_up: timedelta = timedelta(seconds=20)

    @classmethod
    def from_environment(cls) -> Settings:
        env = os.environ.get
        project = env("OPENDWS_PROJECT") or env("GOOGLE_CLOUD_PROJECT") or LOCAL_PROJECT
        return cls(
            project=project,
            compute_endpoint=env("OPENDWS_COMPUTE_ENDPOINT"),
            tasks_location=env("OPENDWS_TASKS_LOCATION") or "us-central1",
            tasks_queue=env("OPENDWS_TASKS_QUEUE") or "opendws-timers",
            timer_url=env("OPENDWS_TIMER_URL"),
            timer_service_account=env("OPENDWS_TIMER_SERVICE_ACCOUNT")
            or f"opendws-tasks@{project}.iam.gserviceaccount.com",
            timer_audience=env("OPENDWS_TIMER_AUDIENCE") or "",
            tasks_emulator_host=env("CLOUD_TASKS_EMULATOR_HOST"),
            timer_certs=env("OPENDWS_TIMER_CERTS"),
            reconcile_follow_up=timedelta(
                seconds=float(env("OPENDWS_RECONCILE_FOLLOW_UP_SECONDS") or 20)
            ),
        )


def _credentials() -> object | None:
    """Anonymous credentials against the emulators (they need none); None means the default
    (application default credentials) in a real project."""
    if os.environ.get("FIRESTORE_EMULATOR_HOST") or os.environ.get("PUBSUB_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()  # type: ignore[no-untyped-call]  # google-auth is untyped here
    return None


# Clients ------------------------------------------------------------------------------------


@functools.cache
def _firestore(project: str) -> Any:
    from google.cloud import firestore

    return firestore.Client(project=project, credentials=_credentials())


@functools.cache
def _publisher() -> Any:
    from google.cloud import pubsub_v1

    # One message per call: send at once instead of waiting up to 10 ms to fill a batch.
    return pubsub_v1.PublisherClient(
        batch_settings=pubsub_v1.types.BatchSettings(max_messages=1), credentials=_credentials()
    )


def _parts(settings: Settings) -> tuple[Any, Any, Any, Any, Any]:
    """Store, configuration, event bus, nudger and clock on the real adapters."""
    from opendws.adapters.firestore import FirestoreConfigStore, FirestoreRequestStore
    from opendws.adapters.pubsub import PubSubEventBus, PubSubNudger
    from opendws.clock import SystemClock

    client = _firestore(settings.project)
    publisher = _publisher()
    return (
        FirestoreRequestStore(client),
        FirestoreConfigStore(client),
        PubSubEventBus(publisher, settings.project, settings.events_topic),
        PubSubNudger(publisher, settings.project, settings.ticks_topic),
        SystemClock(),
    )


# Services -----------------------------------------------------------------------------------


@functools.cache
def intake_service(settings: Settings | None = None) -> IntakeService:
    """The intake service: submissions, and cancel/release through the end service."""
    settings = settings or Settings.from_environment()
    store, config, bus, nudger, clock = _parts(settings)
    return IntakeService(
        store, bus, clock, config=config, ending=lambda: end_service(settings),
        timers=timer_queue(settings), nudger=nudger,
    )  # fmt: skip


@functools.cache
def reconcile_service(settings: Settings | None = None) -> ReconcileService:
    """The reconciler (the lease holder's name is this process's own)."""
    settings = settings or Settings.from_environment()
    store, config, bus, _, clock = _parts(settings)
    return ReconcileService(
        store, config, capacity_providers(settings.project, endpoint=settings.compute_endpoint),
        bus, clock, holder=f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
        timers=timer_queue(settings),
    )  # fmt: skip


def reconcile_follow_up(settings: Settings | None = None) -> timedelta:
    """How long a reconcile invocation follows up on provisioning requests."""
    return (settings or Settings.from_environment()).reconcile_follow_up


@functools.cache
def end_service(settings: Settings | None = None) -> EndService:
    """Release, cancel and timers."""
    settings = settings or Settings.from_environment()
    store, config, bus, nudger, clock = _parts(settings)
    providers = capacity_providers(settings.project, endpoint=settings.compute_endpoint)
    return EndService(store, config, providers, timer_queue(settings), bus, nudger, clock)


@functools.cache
def usage_service(settings: Settings | None = None) -> UsageService:
    """Usage totals."""
    settings = settings or Settings.from_environment()
    return UsageService(_parts(settings)[0])


@functools.cache
def timer_queue(settings: Settings | None = None) -> TimerQueue | None:
    """Cloud Tasks timers, or None where no timer URL is configured."""
    settings = settings or Settings.from_environment()
    if not settings.timer_url:
        return None
    from google.cloud import tasks_v2

    from opendws.adapters.cloud_tasks import CloudTasksTimerQueue, TimerSettings

    if settings.tasks_emulator_host:
        import grpc
        from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

        channel = grpc.insecure_channel(settings.tasks_emulator_host)
        client = tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))
    else:
        client = tasks_v2.CloudTasksClient()
    return CloudTasksTimerQueue(
        client,
        TimerSettings(
            project=settings.project,
            location=settings.tasks_location,
            queue=settings.tasks_queue,
            url=settings.timer_url,
            service_account=settings.timer_service_account,
            audience=settings.timer_audience,
        ),
    )


@functools.cache
def timer_verifier(settings: Settings | None = None) -> Any:
    """Who may call the timer function: Google-issued tokens checked against Google's
    certificates, or — locally, where OPENDWS_TIMER_CERTS names the Cloud Tasks emulator's
    certificates — the emulator's tokens (its own issuer, never Google's)."""
    from opendws.adapters.oidc import EMULATOR_ISSUER, GOOGLE_ISSUERS, OidcVerifier

    settings = settings or Settings.from_environment()
    certs = None
    issuers = GOOGLE_ISSUERS
    if settings.timer_certs:
        certs = json.loads(Path(settings.timer_certs).read_text())
        issuers = frozenset({EMULATOR_ISSUER})
    return OidcVerifier(
        audience=settings.timer_audience or settings.timer_url or "",
        callers=frozenset({settings.timer_service_account}),
        certs=certs,
        issuers=issuers,
    )


def capacity_providers(
    project: str, *, endpoint: str | None = None, credentials: object | None = None
) -> Providers:
    """The capacity providers on the real Compute Engine clients and the Cloud TPU
    ``v2alpha1`` REST API (an authorized session: google-cloud-tpu has no flex-start fields) —
    against ``endpoint`` (an emulator) when given, with anonymous credentials there; with
    application default credentials otherwise."""
    import google.auth
    from google.auth.transport.requests import AuthorizedSession
    from google.cloud import compute_v1

    from opendws.adapters.mig import MigFlexProvider
    from opendws.adapters.reservations import CalendarReservationProvider, TpuCalendarProvider
    from opendws.adapters.tpu import TpuQueuedProvider

    if endpoint is not None and credentials is None:
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]  # untyped here
    options = {"api_endpoint": endpoint} if endpoint is not None else None
    common: dict[str, Any] = {"client_options": options, "credentials": credentials}
    settings = cloud_settings(project)
    if credentials is None:
        credentials, _ = google.auth.default(
            scopes=["https://www.googleapis.com/auth/cloud-platform"]
        )
    instances = compute_v1.InstancesClient(**common)
    future_reservations = compute_v1.FutureReservationsClient(**common)
    advice = compute_v1.AdviceClient(**common)
    reservations = compute_v1.ReservationsClient(**common)
    return Providers(
        mig_flex=MigFlexProvider(
            settings,
            templates=compute_v1.InstanceTemplatesClient(**common),
            groups=compute_v1.InstanceGroupManagersClient(**common),
            resize_requests=compute_v1.InstanceGroupManagerResizeRequestsClient(**common),
            instances=instances,
        ),
        tpu=TpuQueuedProvider(
            settings,
            AuthorizedSession(credentials),  # type: ignore[no-untyped-call]
            endpoint=endpoint,
        ),
        calendar=CalendarReservationProvider(
            settings,
            future_reservations=future_reservations,
            instances=instances,
            advice=advice,
            reservations=reservations,
        ),
        tpu_calendar=TpuCalendarProvider(
            settings,
            future_reservations=future_reservations,
            session=AuthorizedSession(credentials),  # type: ignore[no-untyped-call]
            endpoint=endpoint,
            advice=advice,
            reservations=reservations,
        ),
    )


# The environment variables that say how capacity is created (Terraform sets them from its
# ``vm_*`` and ``tpu_*`` variables).
CLOUD_SETTINGS_ENVIRONMENT = (
    "OPENDWS_BOOT_IMAGE",
    "OPENDWS_NETWORK",
    "OPENDWS_TPU_RUNTIME_VERSION",
    "OPENDWS_TPU_TIER",
)
# flex_start (the default): FLEX_START queued resources for the request's run duration; spot
# and guaranteed: the queued resource's tier, the slice runs until released.
TPU_TIERS = ("flex_start", "guaranteed", "spot")


def cloud_settings(project: str) -> Any:
    """How capacity is created: CloudSettings' defaults, except where the environment says
    otherwise. Raises ValueError for a TPU tier that is not one of :data:`TPU_TIERS`. An empty
    or absent OPENDWS_TPU_RUNTIME_VERSION leaves each TPU generation its own version (from the
    catalog)."""
    from opendws.adapters.gce import CloudSettings

    env = os.environ.get
    defaults = CloudSettings(project=project)
    tier = env("OPENDWS_TPU_TIER") or defaults.tpu_tier
    if tier not in TPU_TIERS:
        raise ValueError(f"OPENDWS_TPU_TIER is {tier!r}; it must be one of {', '.join(TPU_TIERS)}")
    return CloudSettings(
        project=project,
        boot_image=env("OPENDWS_BOOT_IMAGE") or defaults.boot_image,
        network=env("OPENDWS_NETWORK") or defaults.network,
        tpu_runtime_version=env("OPENDWS_TPU_RUNTIME_VERSION") or defaults.tpu_runtime_version,
        tpu_tier=tier,
        tpu_valid_for=defaults.tpu_valid_for,
        operation_timeout=defaults.operation_timeout,
    )


@functools.cache
def request_publisher(settings: Settings | None = None) -> Any:
    """What the CLI publishes request messages with."""
    from opendws.adapters.pubsub import PubSubRequestPublisher

    settings = settings or Settings.from_environment()
    return PubSubRequestPublisher(_publisher(), settings.project)


@functools.cache
def request_store(settings: Settings | None = None) -> Any:
    """The request store (for reading state and events)."""
    return _parts(settings or Settings.from_environment())[0]


@functools.cache
def config_store(settings: Settings | None = None) -> Any:
    """The configuration store."""
    return _parts(settings or Settings.from_environment())[1]


@functools.cache
def query_service(settings: Settings | None = None) -> QueryService:
    """Queue and timeline views."""
    return QueryService(_parts(settings or Settings.from_environment())[0])


@functools.cache
def hook_service(settings: Settings | None = None) -> HookService:
    """CI webhooks, with the secrets from the environment (in Google Cloud, Secret Manager
    values mounted as these variables)."""
    settings = settings or Settings.from_environment()
    secrets = HookSecrets(
        github=os.environ.get("OPENDWS_GITHUB_WEBHOOK_SECRET") or None,
        gitlab=os.environ.get("OPENDWS_GITLAB_WEBHOOK_TOKEN") or None,
        generic=os.environ.get("OPENDWS_HOOK_SECRET") or None,
    )
    return HookService(_parts(settings)[1], request_publisher(settings), secrets)


@functools.cache
def api_service(settings: Settings | None = None) -> ApiService:
    """The HTTP API; keys from ``OPENDWS_API_KEYS`` (``tenant:key,admin:key``; in Google
    Cloud, a Secret Manager value mounted as that variable)."""
    settings = settings or Settings.from_environment()
    store = _parts(settings)[0]
    keys: dict[str, str] = {}
    for pair in (os.environ.get("OPENDWS_API_KEYS") or "").split(","):
        tenant, _, key = pair.strip().partition(":")
        if tenant and key:
            keys[key] = tenant
    return ApiService(
        store, QueryService(store), UsageService(store), lambda: end_service(settings),
        _parts(settings)[4], keys,
    )  # fmt: skip
