"""Settings → adapters → services: the one place that wires opendws together.

Settings come from the environment: ``OPENDWS_PROJECT`` (else ``GOOGLE_CLOUD_PROJECT``, else
the local stack's ``demo-opendws``); the Google clients find the emulators themselves through
``FIRESTORE_EMULATOR_HOST`` and ``PUBSUB_EMULATOR_HOST`` when those are set.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from opendws.service.intake import IntakeService

LOCAL_PROJECT = "demo-opendws"


@dataclass(frozen=True, slots=True)
class Settings:
    """Where opendws runs."""

    project: str
    events_topic: str = "capacity-events"

    @classmethod
    def from_environment(cls) -> Settings:
        project = (
            os.environ.get("OPENDWS_PROJECT")
            or os.environ.get("GOOGLE_CLOUD_PROJECT")
            or LOCAL_PROJECT
        )
        return cls(project=project)


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
