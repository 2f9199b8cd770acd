"""Settings → adapters → services: the one place that wires opendws together.

:class:`Settings` is everything the environment says, read once by
:meth:`Settings.from_environment` (from ``os.environ`` unless given another mapping):

- ``OPENDWS_PROJECT`` (else ``GOOGLE_CLOUD_PROJECT``, else the local stack's ``demo-opendws``);
  with ``FIRESTORE_EMULATOR_HOST`` or ``PUBSUB_EMULATOR_HOST`` set, the Firestore and Pub/Sub
  clients talk to the emulators (which they find through those variables themselves) with
  anonymous credentials;
- ``OPENDWS_COMPUTE_ENDPOINT``: the Compute Engine / Cloud TPU emulator's URL on one machine;
- timers: ``OPENDWS_TIMER_URL`` (the ``timer`` function's URL; without it there are no timers
  and the reconciler's sweep alone ends runs), ``OPENDWS_TIMER_SERVICE_ACCOUNT`` (the invoker
  Cloud Tasks signs as), ``OPENDWS_TIMER_AUDIENCE`` (default: the URL),
  ``OPENDWS_TASKS_LOCATION`` and ``OPENDWS_TASKS_QUEUE``; on one machine
  ``CLOUD_TASKS_EMULATOR_HOST`` (the Cloud Tasks emulator) and ``OPENDWS_TIMER_CERTS`` (a JSON
  file of the emulator's token certificates, which then replace Google's);
  ``OPENDWS_INVOKER_CHECKED_BY_RUN=true``: Cloud Run's invoker check has verified the timer's
  caller, so the timer reads the claims it is handed without verifying the (stripped)
  signature again (:mod:`opendws.adapters.oidc`);
- how capacity is created: ``OPENDWS_BOOT_IMAGE``, ``OPENDWS_NETWORK`` (the VMs' image and
  network), ``OPENDWS_TPU_RUNTIME_VERSION`` and ``OPENDWS_TPU_TIER`` (one of
  :data:`TPU_TIERS`), ``OPENDWS_AGENT_URL`` (the agent function's URL, which every job VM's
  agent reports to; unset: the VMs carry no agent) and ``OPENDWS_VM_SERVICE_ACCOUNT`` (the
  email of the job VMs' own service account; unset: Compute Engine's default); unset or
  empty, CloudSettings' defaults hold;
- ``OPENDWS_RECONCILE_FOLLOW_UP_SECONDS``: how long one reconcile invocation keeps passing
  every few seconds while requests are provisioning (default 20; the function's timeout must
  be longer); ``OPENDWS_CLOUD_CALLS_IN_FLIGHT`` (default 8) and
  ``OPENDWS_CLOUD_CALLS_PER_MINUTE`` (default 1200, under Compute Engine's per-minute rate
  quotas; ``none``: no budget, for a project whose quotas were raised), the reconciler's cloud
  calls; ``OPENDWS_PASS_BUDGET_SECONDS`` (default 10), how long a pass may run before it
  leaves the rest of its plan to the next one (see ReconcileSettings);
- CI runners: ``OPENDWS_GITHUB_API_URL`` and ``OPENDWS_GITLAB_URL`` (every CI mapping's GitHub
  API or GitLab, another server), for local use ``OPENDWS_GITHUB_APP_ID``,
  ``OPENDWS_GITHUB_APP_KEY_FILE`` and ``OPENDWS_GITLAB_TOKEN_FILE`` (an App and a token from
  files, not Secret Manager), and ``OPENDWS_GITHUB_RUNNER_DIR`` and ``OPENDWS_GITLAB_RUNNER``
  (where the runners are on the VMs);
- the CI hooks' secrets ``OPENDWS_GITHUB_WEBHOOK_SECRET``, ``OPENDWS_GITLAB_WEBHOOK_TOKEN`` and
  ``OPENDWS_HOOK_SECRET``, and the API's keys ``OPENDWS_API_KEYS`` (``tenant:sha256:HEX,…``);
  in Google Cloud, Secret Manager values mounted as these variables;
- the Google identities the API accepts besides its keys: ``OPENDWS_API_AUDIENCES`` (the
  audiences a Google-signed ID token may name, comma-separated: the api's URLs) and
  ``OPENDWS_API_IAP_AUDIENCE`` (the audience of IAP's signed header when IAP is in front of the
  api); neither set: API keys only;
- ``OPENDWS_LOCAL_INTAKE_URL``: on one machine, the local stack's intake endpoint, where
  ``dws config apply`` wires a new tenant's topic;
- metrics: ``OPENDWS_METRICS_EXPORT``, where each process exports its metrics, a comma list
  of :data:`METRIC_EXPORTS` (default ``snapshots``: the store, which the api's ``/metrics``
  serves; Terraform adds ``cloud_monitoring``); ``K_SERVICE`` (set by Cloud Run) names the
  process's service in them.

A :class:`Container` turns one Settings into adapters and services, each built on first use
and only once (thread-safe), so a process holds one set of clients. :func:`container` is the
process's own, built from the environment when first asked for; tests and tools build their
own containers (on the Google clients over emulators, or on :class:`Adapters` they choose) and
install one with :func:`use`.

The Google client libraries are never imported here: the adapters build their clients
(:mod:`opendws.adapters.clients`). Adapters are imported where they are first needed, so a
process loads only the client libraries it uses.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar, cast, overload

from opendws.ports import (
    Clock,
    ConfigStore,
    EventBus,
    Nudger,
    Providers,
    RequestPublisher,
    RequestStore,
    TimerQueue,
)
from opendws.ports.ci import Overrides, RunnerPrograms
from opendws.ports.runs import JobLogReader, RankStore
from opendws.ports.telemetry import Metrics, MetricSnapshots
from opendws.service.access import GoogleAccess
from opendws.service.agents import AgentService, AgentSettings, Sessions
from opendws.service.api import ApiService
from opendws.service.hooks import HookSecrets, HookService
from opendws.service.intake import IntakeService
from opendws.service.queries import QueryService
from opendws.service.reconcile import ReconcileService, ReconcileSettings
from opendws.service.release import EndService
from opendws.service.telemetry import LoggedEvents
from opendws.service.usage import UsageService

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricExporter

    from opendws.adapters.gce import CloudSettings
    from opendws.adapters.oidc import OidcVerifier
    from opendws.ports import PrincipalVerifier

LOCAL_PROJECT = "demo-opendws"
# A process's metric snapshot is forgotten a day after its last export.
METRICS_RETENTION = timedelta(days=1)

# The environment variables that say how capacity is created (Terraform sets them from its
# ``vm_*`` and ``tpu_*`` variables).
CLOUD_SETTINGS_ENVIRONMENT = (
    "OPENDWS_BOOT_IMAGE",
    "OPENDWS_NETWORK",
    "OPENDWS_TPU_RUNTIME_VERSION",
    "OPENDWS_TPU_TIER",
    "OPENDWS_AGENT_URL",
    "OPENDWS_VM_SERVICE_ACCOUNT",
)
# flex_start (the default): FLEX_START queued resources for the request's run duration; spot
# and guaranteed: the queued resource's tier, the slice runs until released.
TPU_TIERS = ("flex_start", "guaranteed", "spot")
# Where a process's metrics go: the store's snapshots (served by the api at /metrics) and
# Cloud Monitoring (OpenTelemetry's Google Cloud exporter).
METRIC_EXPORTS = ("snapshots", "cloud_monitoring")
# Any of these set: the Firestore and Pub/Sub clients talk to the official emulators.
EMULATOR_HOSTS = ("FIRESTORE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST")


@dataclass(frozen=True, slots=True)
class Settings:
    """Where opendws runs and how: everything it takes from its environment. A value, so that
    a test or tool states the whole configuration it runs with."""

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
    # True: Cloud Run checked the timer's caller and stripped the token's signature.
    invoker_checked_by_run: bool = False
    # How long one reconcile invocation keeps following up on provisioning requests.
    reconcile_follow_up: timedelta = timedelta(seconds=20)
    # The reconciler's knobs (cloud calls in flight and per minute, a pass's time budget).
    reconcile_settings: ReconcileSettings = field(default_factory=ReconcileSettings)
    # True: Firestore and Pub/Sub are the official emulators (anonymous credentials).
    on_emulators: bool = False
    # How capacity is created; None: CloudSettings' default (see cloud_settings).
    boot_image: str | None = None
    network: str | None = None
    tpu_runtime_version: str | None = None  # None: each TPU generation its own version
    tpu_tier: str | None = None  # one of TPU_TIERS
    vm_service_account: str | None = None  # None: Compute Engine's default account
    hook_secrets: HookSecrets = field(default_factory=HookSecrets)
    # key_digest(key) → tenant (or "admin"): only the keys' digests are kept
    api_keys: Mapping[str, str] = field(default_factory=dict)
    # The audiences a Google-signed ID token at the API may name (empty: none is accepted),
    # and that of IAP's signed header (None: IAP is not in front of the api).
    api_audiences: tuple[str, ...] = ()
    api_iap_audience: str | None = None
    # The local stack's intake endpoint (``dws up`` sets it): a tenant new to the
    # configuration gets its topic and subscriptions wired there. None: Terraform wires them.
    local_intake_url: str | None = None
    # The agent function (runs on the gangs): its URL (the audience of the VMs' identity
    # tokens; None: no job runs), the emulator's certificates to trust instead of Google's
    # (a JSON file, on one machine), its session key, the Secret Manager endpoint (None:
    # Google's), and the folder of the jobs' output on one machine (None: Cloud Logging).
    agent_url: str | None = None
    agent_certs: str | None = None
    agent_session_key: str | None = None
    secrets_endpoint: str | None = None
    job_logs_dir: str | None = None
    # How agents are timed (OPENDWS_AGENT_HEARTBEAT_SECONDS, OPENDWS_AGENT_LOST_AFTER_SECONDS,
    # OPENDWS_AGENT_LOST_GRACE_SECONDS, OPENDWS_AGENT_REGISTER_WITHIN_SECONDS,
    # OPENDWS_AGENT_STOP_GRACE_SECONDS); AgentSettings' defaults when unset.
    agent: AgentSettings = field(default_factory=AgentSettings)
    # CI runners: other servers and, locally, an App and a token from files
    # (OPENDWS_GITHUB_API_URL, OPENDWS_GITHUB_APP_ID, OPENDWS_GITHUB_APP_KEY_FILE,
    # OPENDWS_GITLAB_URL, OPENDWS_GITLAB_TOKEN_FILE), and where the runners are on the VMs
    # (OPENDWS_GITHUB_RUNNER_DIR: an image's runner, else installed; OPENDWS_GITLAB_RUNNER).
    ci_overrides: Overrides = field(default_factory=Overrides)
    ci_programs: RunnerPrograms = field(default_factory=RunnerPrograms)
    service: str = "opendws"  # the process's service, in its metrics and their instance id
    metrics_export: tuple[str, ...] = ("snapshots",)  # a subset of METRIC_EXPORTS

    def __post_init__(self) -> None:
        if self.tpu_tier is not None and self.tpu_tier not in TPU_TIERS:
            raise ValueError(f"tpu_tier is {self.tpu_tier!r}; it must be one of {_tiers()}")
        unknown = [name for name in self.metrics_export if name not in METRIC_EXPORTS]
        if unknown:
            raise ValueError(
                f"metrics export {', '.join(unknown)} is not one of {', '.join(METRIC_EXPORTS)}"
            )

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """The settings ``environ`` gives (the names in this module's docstring); an empty
        variable counts as unset. Raises ValueError for an OPENDWS_TPU_TIER that is not one of
        :data:`TPU_TIERS`."""

        def env(name: str) -> str | None:
            return environ.get(name) or None

        project = env("OPENDWS_PROJECT") or env("GOOGLE_CLOUD_PROJECT") or LOCAL_PROJECT
        tier = env("OPENDWS_TPU_TIER")
        if tier is not None and tier not in TPU_TIERS:
            raise ValueError(f"OPENDWS_TPU_TIER is {tier!r}; it must be one of {_tiers()}")
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
            invoker_checked_by_run=_flag(environ, "OPENDWS_INVOKER_CHECKED_BY_RUN"),
            reconcile_follow_up=timedelta(
                seconds=float(env("OPENDWS_RECONCILE_FOLLOW_UP_SECONDS") or 20)
            ),
            reconcile_settings=_reconcile_settings(env),
            on_emulators=any(env(name) for name in EMULATOR_HOSTS),
            boot_image=env("OPENDWS_BOOT_IMAGE"),
            network=env("OPENDWS_NETWORK"),
            tpu_runtime_version=env("OPENDWS_TPU_RUNTIME_VERSION"),
            tpu_tier=tier,
            vm_service_account=env("OPENDWS_VM_SERVICE_ACCOUNT"),
            hook_secrets=HookSecrets(
                github=env("OPENDWS_GITHUB_WEBHOOK_SECRET"),
                gitlab=env("OPENDWS_GITLAB_WEBHOOK_TOKEN"),
                generic=env("OPENDWS_HOOK_SECRET"),
            ),
            api_keys=_api_keys(env("OPENDWS_API_KEYS") or ""),
            api_audiences=tuple(
                audience.strip()
                for audience in (env("OPENDWS_API_AUDIENCES") or "").split(",")
                if audience.strip()
            ),
            api_iap_audience=env("OPENDWS_API_IAP_AUDIENCE"),
            local_intake_url=env("OPENDWS_LOCAL_INTAKE_URL"),
            agent_url=env("OPENDWS_AGENT_URL"),
            agent_certs=env("OPENDWS_AGENT_CERTS"),
            agent_session_key=env("OPENDWS_AGENT_SESSION_KEY"),
            secrets_endpoint=env("OPENDWS_SECRETS_ENDPOINT"),
            job_logs_dir=env("OPENDWS_JOB_LOGS_DIR"),
            agent=_agent_settings(env),
            ci_overrides=Overrides(
                github_api_url=env("OPENDWS_GITHUB_API_URL"),
                github_app_id=_integer(env, "OPENDWS_GITHUB_APP_ID"),
                github_app_key_file=env("OPENDWS_GITHUB_APP_KEY_FILE"),
                gitlab_url=env("OPENDWS_GITLAB_URL"),
                gitlab_token_file=env("OPENDWS_GITLAB_TOKEN_FILE"),
            ),
            ci_programs=RunnerPrograms.of(
                env("OPENDWS_GITHUB_RUNNER_DIR"), env("OPENDWS_GITLAB_RUNNER")
            ),
            service=env("K_SERVICE") or "opendws",
            metrics_export=_exports(env("OPENDWS_METRICS_EXPORT")),
        )


def _integer(env: Callable[[str], str | None], name: str) -> int | None:
    """A whole number from ``name`` (unset: None); ValueError naming the variable."""
    text = env(name)
    if text is None:
        return None
    if not text.strip().isdigit():
        raise ValueError(f"{name} is {text!r}; it must be a whole number")
    return int(text)


def _reconcile_settings(env: Callable[[str], str | None]) -> ReconcileSettings:
    """The reconciler's cloud-call limits and pass budget from OPENDWS_CLOUD_CALLS_IN_FLIGHT,
    OPENDWS_CLOUD_CALLS_PER_MINUTE (``none``: no budget) and OPENDWS_PASS_BUDGET_SECONDS
    (unset: defaults); ValueError naming a variable whose value is not usable."""
    default = ReconcileSettings()
    in_flight = _integer(env, "OPENDWS_CLOUD_CALLS_IN_FLIGHT")
    per_minute: int | None = default.cloud_calls_per_minute
    text = env("OPENDWS_CLOUD_CALLS_PER_MINUTE")
    if text is not None:
        per_minute = (
            None
            if text.strip().lower() == "none"
            else _integer(env, "OPENDWS_CLOUD_CALLS_PER_MINUTE")
        )
    budget = default.pass_budget
    text = env("OPENDWS_PASS_BUDGET_SECONDS")
    if text is not None:
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise ValueError(
                f"OPENDWS_PASS_BUDGET_SECONDS is {text!r}; it must be a positive number"
            )
        budget = timedelta(seconds=seconds)
    settings = ReconcileSettings(
        cloud_calls_in_flight=default.cloud_calls_in_flight if in_flight is None else in_flight,
        cloud_calls_per_minute=per_minute,
        pass_budget=budget,
    )
    try:
        settings.call_limits  # noqa: B018 - checked here, where the variables can be named
    except ValueError as error:
        raise ValueError(f"OPENDWS_CLOUD_CALLS_IN_FLIGHT / _PER_MINUTE: {error}") from None
    return settings


def _agent_settings(env: Callable[[str], str | None]) -> AgentSettings:
    """How agents are timed, from the OPENDWS_AGENT_*_SECONDS variables (unset: defaults)."""
    default = AgentSettings()

    def seconds(name: str, fallback: timedelta) -> timedelta:
        text = env(f"OPENDWS_AGENT_{name}_SECONDS")
        if text is None:
            return fallback
        value = float(text)
        if value <= 0:
            raise ValueError(f"OPENDWS_AGENT_{name}_SECONDS is {text!r}; it must be positive")
        return timedelta(seconds=value)

    return AgentSettings(
        heartbeat=seconds("HEARTBEAT", default.heartbeat),
        stop_grace=seconds("STOP_GRACE", default.stop_grace),
        register_within=seconds("REGISTER_WITHIN", default.register_within),
        lost_after=seconds("LOST_AFTER", default.lost_after),
        lost_grace=seconds("LOST_GRACE", default.lost_grace),
    )


def _unique_name() -> str:
    """A name no other process, nor another call in this one, has: host, pid and a random
    suffix (the reconciler's lease holder, a metrics instance)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _exports(text: str | None) -> tuple[str, ...]:
    """``OPENDWS_METRICS_EXPORT`` as names (unset: ``snapshots``; ``none``: nowhere)."""
    if text is None:
        return ("snapshots",)
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    return () if names == ("none",) else names


def _flag(environ: Mapping[str, str], name: str) -> bool:
    """A yes/no variable: ``true`` or ``false`` (any case); unset or empty is false. ValueError
    for anything else, so that a misspelt setting is not silently taken as false."""
    text = (environ.get(name) or "false").strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"{name} is {environ.get(name)!r}; it must be true or false")
    return text == "true"


def _tiers() -> str:
    return ", ".join(TPU_TIERS)


def _api_keys(text: str) -> dict[str, str]:
    """``tenant:sha256:HEX,admin:sha256:HEX`` (each key's digest, as Terraform stores them) as
    ``{digest: tenant}``; a plain ``tenant:key`` is hashed at once, so only digests are kept.
    Pairs without a key are left out."""
    from opendws.service.api import key_digest

    keys: dict[str, str] = {}
    for pair in text.split(","):
        tenant, _, key = pair.strip().partition(":")
        if not (tenant and key):
            continue
        algorithm, _, digest = key.partition(":")
        hashed = algorithm == "sha256" and re.fullmatch(r"[0-9a-f]{64}", digest) is not None
        keys[key if hashed else key_digest(key)] = tenant
    return keys


def cloud_settings(settings: Settings) -> CloudSettings:
    """How capacity is created: CloudSettings' defaults, except where ``settings`` say
    otherwise. No TPU runtime version leaves each TPU generation its own (from the catalog)."""
    from opendws.adapters.gce import CloudSettings

    defaults = CloudSettings(project=settings.project)
    return CloudSettings(
        project=settings.project,
        boot_image=settings.boot_image or defaults.boot_image,
        network=settings.network or defaults.network,
        tpu_runtime_version=settings.tpu_runtime_version or defaults.tpu_runtime_version,
        tpu_tier=settings.tpu_tier or defaults.tpu_tier,
        agent_url=settings.agent_url,
        vm_service_account=settings.vm_service_account,
        tpu_valid_for=defaults.tpu_valid_for,
        operation_timeout=defaults.operation_timeout,
    )


def capacity_providers(
    project: str, *, endpoint: str | None = None, cloud: CloudSettings | None = None
) -> Providers:
    """The capacity providers on the real Compute Engine and Cloud TPU clients, against
    ``endpoint`` (an emulator, anonymously) when given, else Google with application default
    credentials; ``cloud``: how capacity is created (CloudSettings' defaults when not given).
    See :func:`opendws.adapters.clients.capacity_providers`."""
    from opendws.adapters import clients

    return clients.capacity_providers(project, endpoint=endpoint, cloud=cloud)


@dataclass(frozen=True, slots=True, kw_only=True)
class Adapters:
    """What the services keep and exchange their state through (everything but the capacity
    providers and the timers): the store, the configuration, the event bus, the reconciler's
    nudger, the request publisher and the clock. On Google by default; a test may give its
    own (the in-memory fakes) to a :class:`Container`."""

    store: RequestStore
    config: ConfigStore
    events: EventBus
    nudger: Nudger
    publisher: RequestPublisher
    clock: Clock
    # Where processes leave their metrics for /metrics; None: in this process's memory.
    snapshots: MetricSnapshots | None = None
    # The ranks of runs (the agent function's); None: in this process's memory.
    ranks: RankStore | None = None


T = TypeVar("T")


class _Once(Generic[T]):
    """A container member: built by the decorated method on first use, under the container's
    lock, and kept in the instance (where later reads find it without the lock)."""

    def __init__(self, build: Callable[[Container], T]) -> None:
        self._build = build
        self._name = build.__name__
        self.__doc__ = build.__doc__

    def __set_name__(self, owner: type[Container], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, instance: None, owner: type[Container]) -> _Once[T]: ...

    @overload
    def __get__(self, instance: Container, owner: type[Container]) -> T: ...

    def __get__(self, instance: Container | None, owner: type[Container]) -> _Once[T] | T:
        if instance is None:
            return self
        built = instance._built
        if self._name not in built:
            # One reentrant lock per container: a member's build reads other members.
            with instance._lock:
                if self._name not in built:
                    built[self._name] = self._build(instance)
        return cast(T, built[self._name])  # stored by this descriptor, as built


class Container:
    """One Settings' adapters and services, each built on first use and then kept: one
    Firestore client, one Pub/Sub publisher, one set of capacity providers per container.
    Building connects to nothing; the first call does.

    ``adapters``: the store, configuration, event bus, nudger, publisher and clock to wire the
    services on (a test's fakes); by default the Google ones the settings name."""

    def __init__(self, settings: Settings, *, adapters: Adapters | None = None) -> None:
        self.settings = settings
        self._lock = threading.RLock()
        self._built: dict[str, object] = {}
        if adapters is not None:
            self._built["adapters"] = adapters

    # Adapters ---------------------------------------------------------------------------

    @_Once
    def adapters(self) -> Adapters:
        """The Firestore stores, the Pub/Sub event bus, nudger and request publisher (one
        client each, shared), and the system clock."""
        from opendws.adapters import clients
        from opendws.adapters.firestore import (
            FirestoreConfigStore,
            FirestoreMetricSnapshots,
            FirestoreRequestStore,
        )
        from opendws.adapters.pubsub import PubSubEventBus, PubSubNudger, PubSubRequestPublisher
        from opendws.adapters.ranks import FirestoreRankStore
        from opendws.clock import SystemClock

        settings = self.settings
        client = clients.firestore_client(settings.project, anonymous=settings.on_emulators)
        publisher = clients.publisher_client(anonymous=settings.on_emulators)
        return Adapters(
            store=FirestoreRequestStore(client),
            config=FirestoreConfigStore(client),
            events=PubSubEventBus(publisher, settings.project, settings.events_topic),
            nudger=PubSubNudger(publisher, settings.project, settings.ticks_topic),
            publisher=PubSubRequestPublisher(publisher, settings.project),
            clock=SystemClock(),
            snapshots=FirestoreMetricSnapshots(client),
            ranks=FirestoreRankStore(client),
        )

    @_Once
    def events(self) -> EventBus:
        """The event bus the services publish on: the adapters', logging each event."""
        return LoggedEvents(self.adapters.events)

    @_Once
    def snapshots(self) -> MetricSnapshots:
        """Where this process's metrics are exported for /metrics (the adapters', else
        memory)."""
        if self.adapters.snapshots is not None:
            return self.adapters.snapshots
        from opendws.adapters.telemetry import MemoryMetricSnapshots

        return MemoryMetricSnapshots()

    @_Once
    def metrics(self) -> Metrics:
        """This process's meter, exporting where the settings say."""
        from opendws.adapters import clients
        from opendws.adapters.telemetry import OtelMetrics, SnapshotExporter

        settings = self.settings
        instance = f"{settings.service}-{_unique_name()}"
        exporters: list[MetricExporter] = []
        resource: dict[str, str] = {}
        if "snapshots" in settings.metrics_export:
            exporters.append(SnapshotExporter(self.snapshots, instance))
        if "cloud_monitoring" in settings.metrics_export:
            exporters.append(clients.cloud_monitoring_exporter(settings.project))
            resource = clients.google_cloud_resource()
        return OtelMetrics(
            service=settings.service, instance=instance, exporters=exporters, resource=resource
        )

    def metrics_text(self) -> str:
        """Every process's metrics in Prometheus text; snapshots of processes silent for a
        day are forgotten first."""
        from opendws.adapters.telemetry import prometheus_text

        snapshots = self.snapshots
        snapshots.forget_before(self.adapters.clock.now() - METRICS_RETENTION)
        return prometheus_text(snapshots.all())

    @_Once
    def cloud(self) -> CloudSettings:
        """How capacity is created (:func:`cloud_settings`)."""
        return cloud_settings(self.settings)

    @_Once
    def providers(self) -> Providers:
        """The capacity providers on Compute Engine and Cloud TPU (the emulator's, anonymously,
        when the settings name a compute endpoint)."""
        from opendws.adapters import clients

        settings = self.settings
        return clients.capacity_providers(
            settings.project, endpoint=settings.compute_endpoint, cloud=self.cloud
        )

    @_Once
    def timers(self) -> TimerQueue | None:
        """Cloud Tasks timers, or None where no timer URL is configured."""
        settings = self.settings
        if not settings.timer_url:
            return None
        from opendws.adapters import clients
        from opendws.adapters.cloud_tasks import CloudTasksTimerQueue, TimerSettings

        return CloudTasksTimerQueue(
            clients.tasks_client(emulator_host=settings.tasks_emulator_host),
            TimerSettings(
                project=settings.project,
                location=settings.tasks_location,
                queue=settings.tasks_queue,
                url=settings.timer_url,
                service_account=settings.timer_service_account,
                audience=settings.timer_audience,
            ),
        )

    @_Once
    def verifier(self) -> OidcVerifier:
        """Who may call the timer function: Google-issued tokens checked against Google's
        certificates, or — where the settings name the Cloud Tasks emulator's certificates
        (OPENDWS_TIMER_CERTS) — the emulator's tokens (its own issuer, never Google's); with
        OPENDWS_INVOKER_CHECKED_BY_RUN, their claims as Cloud Run hands them on, signature
        stripped."""
        from opendws.adapters.oidc import EMULATOR_ISSUER, GOOGLE_ISSUERS, OidcVerifier

        settings = self.settings
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
            checked_by_run=settings.invoker_checked_by_run,
        )

    @_Once
    def principals(self) -> PrincipalVerifier:
        """The verifier of the Google-signed tokens the API accepts (IAP's signed header, ID
        tokens), for the settings' audiences, against Google's keys."""
        from opendws.adapters.identity import GoogleIdentityVerifier

        settings = self.settings
        return GoogleIdentityVerifier(
            id_token_audiences=frozenset(settings.api_audiences),
            iap_audience=settings.api_iap_audience,
        )

    # Services ---------------------------------------------------------------------------

    @_Once
    def intake(self) -> IntakeService:
        """The intake service: submissions, and cancel/release through the end service (built
        when first needed: submissions need no cloud clients)."""
        adapters = self.adapters
        return IntakeService(
            adapters.store, self.events, adapters.clock, config=adapters.config,
            ending=lambda: self.end, timers=self.timers, nudger=adapters.nudger,
            ranks=adapters.ranks,
        )  # fmt: skip

    @_Once
    def reconcile(self) -> ReconcileService:
        """The reconciler (the lease holder's name is this process's own)."""
        adapters = self.adapters
        return ReconcileService(
            adapters.store, adapters.config, self.providers, self.events, adapters.clock,
            holder=_unique_name(), settings=self.settings.reconcile_settings,
            timers=self.timers, metrics=self.metrics,
        )  # fmt: skip

    @_Once
    def end(self) -> EndService:
        """Release, cancel and timers."""
        adapters = self.adapters
        return EndService(
            adapters.store, adapters.config, self.providers, self.timers, self.events,
            adapters.nudger, adapters.clock, metrics=self.metrics,
        )  # fmt: skip

    @_Once
    def agents(self) -> AgentService:
        """The agent function's service: VM identity tokens checked against Google's keys (or
        the metadata emulator's, OPENDWS_AGENT_CERTS) for the agent URL and this project, an
        order's VMs read from Compute Engine, secrets from Secret Manager, the jobs' output to
        Cloud Logging (or OPENDWS_JOB_LOGS_DIR). Refuses to start without an agent URL or a
        session key of at least 16 bytes."""
        from opendws.adapters import clients
        from opendws.adapters.ci_runners import ProviderRunners
        from opendws.adapters.jobs import CloudLoggingJobLogs, ComputeOrderVms, FolderJobLogs
        from opendws.adapters.oidc import GOOGLE_ISSUERS
        from opendws.adapters.ranks import MemoryRankStore
        from opendws.adapters.secrets import SecretManagerReader
        from opendws.adapters.vm_identity import EMULATOR_ISSUER, VmIdentityVerifier

        settings = self.settings
        if not settings.agent_url:
            raise ValueError("OPENDWS_AGENT_URL: the agent function's URL is not set")
        key = (settings.agent_session_key or "").encode()
        certs = None
        issuers = GOOGLE_ISSUERS
        if settings.agent_certs:
            certs = json.loads(Path(settings.agent_certs).read_text())
            issuers = frozenset({EMULATOR_ISSUER})
        adapters = self.adapters
        secrets = SecretManagerReader.on(settings.secrets_endpoint)
        logs = (
            FolderJobLogs(Path(settings.job_logs_dir))
            if settings.job_logs_dir
            else CloudLoggingJobLogs()
        )
        return AgentService(
            store=adapters.store, ranks=adapters.ranks or MemoryRankStore(),
            verifier=VmIdentityVerifier(
                audience=settings.agent_url, project_id=settings.project, certs=certs,
                issuers=issuers,
            ),
            order_vms=ComputeOrderVms(
                clients.instances_client(settings.compute_endpoint), settings.project
            ),
            secrets=secrets, logs=logs, ending=self.end,
            sessions=Sessions(key, adapters.clock, settings.agent.session_lifetime),
            clock=adapters.clock, settings=settings.agent, config=adapters.config,
            runners=ProviderRunners(secrets, settings.ci_programs, overrides=settings.ci_overrides),
            tpu_nodes=clients.tpu_api(
                settings.project, endpoint=settings.compute_endpoint, cloud=self.cloud
            ),
        )  # fmt: skip

    @_Once
    def job_logs(self) -> JobLogReader:
        """Where the jobs' output is read back: OPENDWS_JOB_LOGS_DIR's files on one machine,
        Cloud Logging otherwise (application default credentials)."""
        from opendws.adapters.jobs import CloudLoggingJobLogs, FolderJobLogs

        settings = self.settings
        if settings.job_logs_dir:
            return FolderJobLogs(Path(settings.job_logs_dir))
        return CloudLoggingJobLogs.reader(settings.project)

    @_Once
    def usage(self) -> UsageService:
        """Usage totals."""
        return UsageService(self.adapters.store)

    @_Once
    def queries(self) -> QueryService:
        """Queue and timeline views."""
        return QueryService(self.adapters.store, self.adapters.store, self.adapters.config)

    @_Once
    def hooks(self) -> HookService:
        """CI webhooks, checked with the settings' secrets."""
        adapters = self.adapters
        return HookService(adapters.config, adapters.publisher, self.settings.hook_secrets)

    @_Once
    def api(self) -> ApiService:
        """The HTTP API, with the settings' keys and, where the settings name an audience,
        Google identities mapped by the configuration's access table (the end service is
        built when first needed: reading needs no cloud clients)."""
        adapters = self.adapters
        settings = self.settings
        google = None
        if settings.api_audiences or settings.api_iap_audience:
            google = GoogleAccess(self.principals, adapters.config, adapters.clock)
        return ApiService(
            adapters.store, self.queries, self.usage, lambda: self.end, adapters.clock,
            settings.api_keys, metrics=self.metrics_text, google=google,
        )  # fmt: skip


class _Process:
    """The process's container, swapped under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.container: Container | None = None


_process = _Process()


def container() -> Container:
    """The process's container: the one :func:`use` installed, else one built from
    ``Settings.from_environment()`` on first use (what the functions run on)."""
    with _process.lock:
        if _process.container is None:
            _process.container = Container(Settings.from_environment())
        return _process.container


def use(replacement: Container | None) -> Container | None:
    """Make ``replacement`` the process's container (None: the next :func:`container` builds
    a fresh one from the environment); returns the one it replaces, to put back."""
    with _process.lock:
        previous, _process.container = _process.container, replacement
        return previous
