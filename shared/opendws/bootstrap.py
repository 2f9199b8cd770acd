"""Settings → adapters → services: the one place that wires opendws together.

Settings come from the environment: ``OPENDWS_PROJECT`` (else ``GOOGLE_CLOUD_PROJECT``, else
the local stack's ``demo-opendws``); the Google clients find the emulators themselves through
``FIRESTORE_EMULATOR_HOST`` and ``PUBSUB_EMULATOR_HOST`` when those are set.
"""

from __future__ import annotations

import functools
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from opendws.service.intake import IntakeService
from opendws.service.reconcile import Providers, ReconcileService

LOCAL_PROJECT = "demo-opendws"


@dataclass(frozen=True, slots=True)
class Settings:
    """Where opendws runs."""

    project: str
    events_topic: str = "capacity-events"
    # The Compute Engine / Cloud TPU endpoint: None for Google's; the local emulator's URL
    # (OPENDWS_COMPUTE_ENDPOINT) on one machine.
    compute_endpoint: str | None = None

    @classmethod
    def from_environment(cls) -> Settings:
        project = (
            os.environ.get("OPENDWS_PROJECT")
            or os.environ.get("GOOGLE_CLOUD_PROJECT")
            or LOCAL_PROJECT
        )
        return cls(project=project, compute_endpoint=os.environ.get("OPENDWS_COMPUTE_ENDPOINT"))


def _credentials() -> object | None:
    """Anonymous credentials against the emulators (they need none); None means the default
    (application default credentials) in a real project."""
    if os.environ.get("FIRESTORE_EMULATOR_HOST") or os.environ.get("PUBSUB_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()  # type: ignore[no-untyped-call]  # google-auth is untyped here
    return None


@functools.cache
def intake_service(settings: Settings | None = None) -> IntakeService:
    """The intake service on Firestore and Pub/Sub (built once per process)."""
    from google.cloud import firestore, pubsub_v1

    from opendws.adapters.clock import SystemClock
    from opendws.adapters.firestore import FirestoreRequestStore
    from opendws.adapters.pubsub import PubSubEventBus

    settings = settings or Settings.from_environment()
    credentials = _credentials()
    store = FirestoreRequestStore(
        firestore.Client(project=settings.project, credentials=credentials)
    )
    # One event per invocation: send at once instead of waiting up to 10 ms to fill a batch.
    publisher = pubsub_v1.PublisherClient(
        batch_settings=pubsub_v1.types.BatchSettings(max_messages=1), credentials=credentials
    )
    bus = PubSubEventBus(publisher, settings.project, settings.events_topic)
    return IntakeService(store, bus, SystemClock())


@functools.cache
def reconcile_service(settings: Settings | None = None) -> ReconcileService:
    """The reconciler on Firestore, Pub/Sub and the Compute Engine / Cloud TPU APIs (built once
    per process; the lease holder's name is this process's own)."""
    from google.cloud import firestore, pubsub_v1

    from opendws.adapters.clock import SystemClock
    from opendws.adapters.firestore import FirestoreConfigStore, FirestoreRequestStore
    from opendws.adapters.pubsub import PubSubEventBus

    settings = settings or Settings.from_environment()
    credentials = _credentials()
    client = firestore.Client(project=settings.project, credentials=credentials)
    publisher = pubsub_v1.PublisherClient(credentials=credentials)
    return ReconcileService(
        FirestoreRequestStore(client),
        FirestoreConfigStore(client),
        capacity_providers(settings.project, endpoint=settings.compute_endpoint),
        PubSubEventBus(publisher, settings.project, settings.events_topic),
        SystemClock(),
        holder=f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
    )


def capacity_providers(
    project: str, *, endpoint: str | None = None, credentials: object | None = None
) -> Providers:
    """The three capacity providers on the real Compute Engine and Cloud TPU clients — against
    ``endpoint`` (an emulator) when given, with anonymous credentials there."""
    from google.cloud import compute_v1, tpu_v2

    from opendws.adapters.gce import CloudSettings
    from opendws.adapters.mig import MigFlexProvider
    from opendws.adapters.reservations import CalendarReservationProvider
    from opendws.adapters.tpu import TpuQueuedProvider

    if endpoint is not None and credentials is None:
        from google.auth.credentials import AnonymousCredentials

        credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]  # untyped here
    options = {"api_endpoint": endpoint} if endpoint is not None else None
    common: dict[str, Any] = {"client_options": options, "credentials": credentials}
    settings = CloudSettings(project=project)
    return Providers(
        mig_flex=MigFlexProvider(
            settings,
            templates=compute_v1.InstanceTemplatesClient(**common),
            groups=compute_v1.InstanceGroupManagersClient(**common),
            resize_requests=compute_v1.InstanceGroupManagerResizeRequestsClient(**common),
        ),
        tpu=TpuQueuedProvider(settings, tpu_v2.TpuClient(transport="rest", **common)),
        calendar=CalendarReservationProvider(
            settings,
            future_reservations=compute_v1.FutureReservationsClient(**common),
            instances=compute_v1.InstancesClient(**common),
        ),
    )
