"""The Google client libraries' clients, built in one place for the adapters to run on.

Each builder makes a real client: against Google with application default credentials, or
against an emulator — the official Firestore and Pub/Sub emulators (which the clients find
themselves through ``FIRESTORE_EMULATOR_HOST`` / ``PUBSUB_EMULATOR_HOST``; they take no
credentials, so the clients get anonymous ones), the project's Cloud Tasks emulator (plain
gRPC at a host:port) and its Compute Engine / Cloud TPU emulator (REST at a URL). Builders
connect to nothing: the first call does.

The client libraries are imported inside the builders, so that a process imports only those it
uses (an intake function never loads Compute Engine's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opendws.ports import Providers

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.cloud import compute_v1, firestore, pubsub_v1, tasks_v2
    from opentelemetry.sdk.metrics.export import MetricExporter

    from opendws.adapters.gce import CloudSettings
    from opendws.adapters.tpu import TpuQueuedProvider

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def anonymous_credentials() -> Credentials:
    """Credentials for an emulator, which checks none."""
    from google.auth.credentials import AnonymousCredentials

    return AnonymousCredentials()  # type: ignore[no-untyped-call]  # google-auth is untyped here


def instances_client(endpoint: str | None = None) -> compute_v1.InstancesClient:
    """A Compute Engine instances client: against ``endpoint`` (an emulator) with anonymous
    credentials when given; Google's with application default credentials otherwise."""
    from google.cloud import compute_v1

    if endpoint is None:
        return compute_v1.InstancesClient()
    return compute_v1.InstancesClient(
        client_options={"api_endpoint": endpoint}, credentials=anonymous_credentials()
    )


def firestore_client(project: str, *, anonymous: bool) -> firestore.Client:
    """A Firestore client for ``project`` (anonymous: against the emulator)."""
    from google.cloud import firestore

    credentials = anonymous_credentials() if anonymous else None
    return firestore.Client(project=project, credentials=credentials)


def publisher_client(*, anonymous: bool) -> pubsub_v1.PublisherClient:
    """A Pub/Sub publisher that sends each message at once (anonymous: against the emulator)."""
    from google.cloud import pubsub_v1

    # One message per call: send at once instead of waiting up to 10 ms to fill a batch.
    return pubsub_v1.PublisherClient(
        batch_settings=pubsub_v1.types.BatchSettings(max_messages=1),
        credentials=anonymous_credentials() if anonymous else None,
    )


def cloud_monitoring_exporter(project: str) -> MetricExporter:
    """OpenTelemetry's Cloud Monitoring exporter for ``project`` (metric types
    ``workload.googleapis.com/<name>``; application default credentials)."""
    from opentelemetry.exporter.cloud_monitoring import CloudMonitoringMetricsExporter

    return CloudMonitoringMetricsExporter(project_id=project)


def google_cloud_resource() -> dict[str, str]:
    """What OpenTelemetry's Google Cloud detector finds about where this process runs (on
    Cloud Run: the service, revision, region and instance), which the Cloud Monitoring
    exporter maps to its monitored resource; empty outside Google Cloud."""
    from opentelemetry.resourcedetector.gcp_resource_detector import (
        GoogleCloudResourceDetector,
    )

    detected = GoogleCloudResourceDetector(raise_on_error=False).detect()
    return {str(k): str(v) for k, v in detected.attributes.items()}


def tasks_client(*, emulator_host: str | None = None) -> tasks_v2.CloudTasksClient:
    """A Cloud Tasks client: Google's, or the emulator's at ``emulator_host`` (host:port) over
    a plain gRPC channel (the emulator speaks neither TLS nor OAuth)."""
    from google.cloud import tasks_v2

    if emulator_host is None:
        return tasks_v2.CloudTasksClient()
    import grpc
    from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

    channel = grpc.insecure_channel(emulator_host)
    return tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))


def capacity_providers(
    project: str,
    *,
    endpoint: str | None = None,
    credentials: Credentials | None = None,
    cloud: CloudSettings | None = None,
) -> Providers:
    """The capacity providers on the real Compute Engine clients (``v1``; resize requests on
    ``beta``) and the Cloud TPU ``v2alpha1`` REST API (an authorized session: google-cloud-tpu
    has no flex-start fields) — against ``endpoint`` (an emulator) when given, with anonymous
    credentials there; with application default credentials otherwise. ``cloud`` says how
    capacity is created (CloudSettings' defaults for ``project`` when not given)."""
    import google.auth
    from google.auth.transport.requests import AuthorizedSession
    from google.cloud import compute_v1, compute_v1beta

    from opendws.adapters.gce import CloudSettings
    from opendws.adapters.mig import MigFlexProvider
    from opendws.adapters.reservations import CalendarReservationProvider, TpuCalendarProvider
    from opendws.adapters.tpu import TpuQueuedProvider

    settings = cloud if cloud is not None else CloudSettings(project=project)
    if endpoint is not None and credentials is None:
        credentials = anonymous_credentials()
    options = {"api_endpoint": endpoint} if endpoint is not None else None
    common: dict[str, Any] = {"client_options": options, "credentials": credentials}
    if credentials is None:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    instances = compute_v1.InstancesClient(**common)
    future_reservations = compute_v1.FutureReservationsClient(**common)
    advice = compute_v1.AdviceClient(**common)
    reservations = compute_v1.ReservationsClient(**common)
    zone_operations = compute_v1.ZoneOperationsClient(**common)
    return Providers(
        mig_flex=MigFlexProvider(
            settings,
            templates=compute_v1.InstanceTemplatesClient(**common),
            groups=compute_v1.InstanceGroupManagersClient(**common),
            # Named VMs in a resize request are a Preview field: beta (opendws.adapters.mig).
            resize_requests=compute_v1beta.InstanceGroupManagerResizeRequestsClient(**common),
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
            zone_operations=zone_operations,
        ),
        tpu_calendar=TpuCalendarProvider(
            settings,
            future_reservations=future_reservations,
            session=AuthorizedSession(credentials),  # type: ignore[no-untyped-call]
            endpoint=endpoint,
            advice=advice,
            reservations=reservations,
            zone_operations=zone_operations,
        ),
    )


def tpu_api(
    project: str, *, endpoint: str | None = None, cloud: CloudSettings | None = None
) -> TpuQueuedProvider:
    """The Cloud TPU ``v2alpha1`` REST API of ``project`` (its nodes, as the agent function
    reads them), against ``endpoint`` (an emulator, anonymously) when given, with application
    default credentials otherwise."""
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    from opendws.adapters.gce import CloudSettings
    from opendws.adapters.tpu import TpuQueuedProvider as Tpu

    settings = cloud if cloud is not None else CloudSettings(project=project)
    if endpoint is not None:
        credentials: Credentials = anonymous_credentials()
    else:
        credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
    return Tpu(settings, session, endpoint=endpoint)
