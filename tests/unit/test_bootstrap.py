"""The composition root: the settings one mapping gives, and a container that wires each service
on the adapters those settings name — each built once, on first use."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from opendws import bootstrap
from opendws.adapters import clients
from opendws.adapters.cloud_tasks import CloudTasksTimerQueue
from opendws.adapters.firestore import FirestoreConfigStore, FirestoreRequestStore
from opendws.adapters.memory import (
    MemoryConfigStore,
    MemoryEventBus,
    MemoryNudger,
    MemoryRequestPublisher,
    MemoryRequestStore,
)
from opendws.adapters.mig import MigFlexProvider
from opendws.adapters.oidc import GOOGLE_ISSUERS, OidcVerifier
from opendws.adapters.pubsub import PubSubEventBus, PubSubNudger, PubSubRequestPublisher
from opendws.adapters.reservations import CalendarReservationProvider, TpuCalendarProvider
from opendws.adapters.tpu import TpuQueuedProvider
from opendws.bootstrap import LOCAL_PROJECT, Adapters, Container, Settings
from opendws.clock import SystemClock
from opendws.ports import Configuration
from opendws.service.api import key_digest
from opendws.service.hooks import HookSecrets

ROOT = Path(__file__).resolve().parents[2]
# Nothing listens here: building a client connects to nothing, so none is ever called.
NOWHERE = "127.0.0.1:9"


def holds(service: object, part: object) -> bool:
    """Whether ``service`` keeps ``part`` (itself, not a copy) among its attributes."""
    return any(value is part for value in vars(service).values())


def missing(service: object, *parts: object) -> list[object]:
    """Those of ``parts`` that ``service`` does not keep."""
    return [part for part in parts if not holds(service, part)]


# Settings -------------------------------------------------------------------------------------


def test_an_empty_environment_gives_the_local_stack_and_the_defaults() -> None:
    settings = Settings.from_environment({})
    assert settings == Settings(
        project=LOCAL_PROJECT,
        timer_service_account=f"opendws-tasks@{LOCAL_PROJECT}.iam.gserviceaccount.com",
    )
    assert settings.timer_url is None  # no timers
    assert not settings.on_emulators
    assert settings.reconcile_follow_up == timedelta(seconds=20)
    assert settings.hook_secrets == HookSecrets()
    assert settings.api_keys == {}


def test_every_variable_is_read_from_the_mapping_given() -> None:
    settings = Settings.from_environment({
        "OPENDWS_PROJECT": "prod",
        "GOOGLE_CLOUD_PROJECT": "ignored-when-opendws-project-is-set",
        "OPENDWS_COMPUTE_ENDPOINT": "http://127.0.0.1:8090",
        "OPENDWS_TASKS_LOCATION": "europe-west4",
        "OPENDWS_TASKS_QUEUE": "timers",
        "OPENDWS_TIMER_URL": "https://timer.example/",
        "OPENDWS_TIMER_SERVICE_ACCOUNT": "invoker@prod.iam.gserviceaccount.com",
        "OPENDWS_TIMER_AUDIENCE": "https://audience.example/",
        "CLOUD_TASKS_EMULATOR_HOST": "127.0.0.1:8123",
        "OPENDWS_TIMER_CERTS": "/tmp/certs.json",
        "OPENDWS_RECONCILE_FOLLOW_UP_SECONDS": "7.5",
        "FIRESTORE_EMULATOR_HOST": "127.0.0.1:8080",
        "OPENDWS_BOOT_IMAGE": "projects/p/global/images/family/cuda",
        "OPENDWS_NETWORK": "projects/p/global/networks/ml",
        "OPENDWS_TPU_RUNTIME_VERSION": "v2-alpha-tpuv6e",
        "OPENDWS_TPU_TIER": "spot",
        "OPENDWS_GITHUB_WEBHOOK_SECRET": "gh",
        "OPENDWS_GITLAB_WEBHOOK_TOKEN": "gl",
        "OPENDWS_HOOK_SECRET": "generic",
        "OPENDWS_API_KEYS": f"vision:k1, admin:{key_digest('k2')},broken,:nokey,notenant:",
        "OPENDWS_LOCAL_INTAKE_URL": "http://127.0.0.1:8081",
        "OPENDWS_API_AUDIENCES": "https://api.example/, ,https://run.example",
        "OPENDWS_API_IAP_AUDIENCE": "/projects/1/global/backendServices/2",
    })  # fmt: skip
    assert settings == Settings(
        project="prod",
        compute_endpoint="http://127.0.0.1:8090",
        tasks_location="europe-west4",
        tasks_queue="timers",
        timer_url="https://timer.example/",
        timer_service_account="invoker@prod.iam.gserviceaccount.com",
        timer_audience="https://audience.example/",
        tasks_emulator_host="127.0.0.1:8123",
        timer_certs="/tmp/certs.json",
        reconcile_follow_up=timedelta(seconds=7.5),
        on_emulators=True,
        boot_image="projects/p/global/images/family/cuda",
        network="projects/p/global/networks/ml",
        tpu_runtime_version="v2-alpha-tpuv6e",
        tpu_tier="spot",
        hook_secrets=HookSecrets(github="gh", gitlab="gl", generic="generic"),
        api_keys={key_digest("k1"): "vision", key_digest("k2"): "admin"},  # digests only
        local_intake_url="http://127.0.0.1:8081",
        api_audiences=("https://api.example/", "https://run.example"),
        api_iap_audience="/projects/1/global/backendServices/2",
    )


def test_the_reconcilers_cloud_calls_and_pass_budget_come_from_the_environment() -> None:
    settings = Settings.from_environment({
        "OPENDWS_CLOUD_CALLS_IN_FLIGHT": "16",
        "OPENDWS_CLOUD_CALLS_PER_MINUTE": "none",
        "OPENDWS_PASS_BUDGET_SECONDS": "7.5",
    })  # fmt: skip
    reconcile = settings.reconcile_settings
    assert (reconcile.cloud_calls_in_flight, reconcile.cloud_calls_per_minute) == (16, None)
    assert reconcile.pass_budget == timedelta(seconds=7.5)
    default = Settings.from_environment({}).reconcile_settings
    assert (default.cloud_calls_in_flight, default.cloud_calls_per_minute) == (8, 1200)
    assert (
        Settings.from_environment(
            {"OPENDWS_CLOUD_CALLS_PER_MINUTE": "600"}
        ).reconcile_settings.cloud_calls_per_minute
        == 600
    )


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("OPENDWS_CLOUD_CALLS_IN_FLIGHT", "many", "whole number"),
        ("OPENDWS_CLOUD_CALLS_IN_FLIGHT", "0", "at least one"),
        ("OPENDWS_CLOUD_CALLS_PER_MINUTE", "0", "positive"),
        ("OPENDWS_PASS_BUDGET_SECONDS", "-3", "positive number"),
        ("OPENDWS_PASS_BUDGET_SECONDS", "soon", "positive number"),
    ],
)
def test_a_bad_reconcile_setting_is_refused_naming_it(variable: str, value: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as refused:
        Settings.from_environment({variable: value})
    assert variable.rsplit("_", 1)[0][:20] in str(refused.value)


def test_the_project_falls_back_to_google_cloud_project_then_the_local_stack() -> None:
    assert Settings.from_environment({"GOOGLE_CLOUD_PROJECT": "g"}).project == "g"
    assert Settings.from_environment({"OPENDWS_PROJECT": ""}).project == LOCAL_PROJECT
    default = Settings.from_environment({"OPENDWS_PROJECT": "q"}).timer_service_account
    assert default == "opendws-tasks@q.iam.gserviceaccount.com"


@pytest.mark.parametrize("variable", bootstrap.EMULATOR_HOSTS)
def test_either_emulator_host_means_the_emulators(variable: str) -> None:
    assert Settings.from_environment({variable: "127.0.0.1:8085"}).on_emulators
    assert not Settings.from_environment({variable: ""}).on_emulators


def test_a_bad_tpu_tier_is_refused_when_the_settings_are_read() -> None:
    with pytest.raises(ValueError, match=r"OPENDWS_TPU_TIER is 'ondemand'; it must be one of"):
        Settings.from_environment({"OPENDWS_TPU_TIER": "ondemand"})
    assert Settings.from_environment({"OPENDWS_TPU_TIER": ""}).tpu_tier is None  # the default


def test_the_process_environment_is_not_read_when_a_mapping_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENDWS_PROJECT", "from-the-process")
    monkeypatch.setenv("OPENDWS_TPU_TIER", "ondemand")
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:8085")
    settings = Settings.from_environment({})
    assert (settings.project, settings.on_emulators) == (LOCAL_PROJECT, False)
    with pytest.raises(ValueError, match="OPENDWS_TPU_TIER"):
        Settings.from_environment()  # the default: the process's own


# The container --------------------------------------------------------------------------------


@pytest.fixture
def everything() -> Settings:
    """Settings that name every part: emulators for Firestore and Pub/Sub, Compute Engine and
    Cloud Tasks (anonymous credentials, nothing called), and timers."""
    return Settings(
        project="p", on_emulators=True, compute_endpoint=f"http://{NOWHERE}",
        timer_url="http://127.0.0.1:9/timer", timer_service_account="invoker@p",
        tasks_emulator_host=NOWHERE,
    )  # fmt: skip


def test_the_adapters_are_googles(everything: Settings) -> None:
    adapters = Container(everything).adapters
    assert isinstance(adapters.store, FirestoreRequestStore)
    assert isinstance(adapters.config, FirestoreConfigStore)
    assert isinstance(adapters.events, PubSubEventBus)
    assert isinstance(adapters.nudger, PubSubNudger)
    assert isinstance(adapters.publisher, PubSubRequestPublisher)
    assert isinstance(adapters.clock, SystemClock)


def test_the_providers_timers_and_verifier_are_googles(everything: Settings) -> None:
    container = Container(everything)
    providers = container.providers
    assert isinstance(providers.mig_flex, MigFlexProvider)
    assert isinstance(providers.tpu, TpuQueuedProvider)
    assert isinstance(providers.calendar, CalendarReservationProvider)
    assert isinstance(providers.tpu_calendar, TpuCalendarProvider)
    assert isinstance(container.timers, CloudTasksTimerQueue)
    assert isinstance(container.verifier, OidcVerifier)
    assert container.verifier._issuers == GOOGLE_ISSUERS
    assert container.cloud.project == "p"
    assert Container(Settings(project="p")).timers is None  # no timer URL: no timers


def test_each_service_is_wired_on_the_containers_parts(everything: Settings) -> None:
    container = Container(everything)
    adapters, providers, timers = container.adapters, container.providers, container.timers
    store, config, clock = adapters.store, adapters.config, adapters.clock
    # The services publish on the adapters' bus through the one logging wrapper.
    events = container.events
    assert events._bus is adapters.events  # type: ignore[attr-defined]
    metrics = container.metrics
    intake, end, api = container.intake, container.end, container.api
    assert missing(intake, store, events, clock, config, adapters.nudger, timers) == []
    assert (
        missing(container.reconcile, store, config, providers, events, clock, timers, metrics) == []
    )
    assert (
        missing(end, store, config, providers, timers, events, adapters.nudger, clock, metrics)
        == []
    )
    assert missing(container.usage, store) == []
    assert missing(container.queries, store) == []
    assert missing(container.hooks, config, adapters.publisher, everything.hook_secrets) == []
    assert missing(api, store, container.queries, container.usage, clock) == []
    # The end service the intake and the API reach for (on a cancel, a release) is the one.
    assert intake._ending is not None
    assert intake._ending() is end
    assert api._ending() is end


def test_each_part_is_built_once(everything: Settings) -> None:
    container = Container(everything)
    assert container.adapters is container.adapters
    assert container.providers is container.providers
    assert container.intake is container.intake
    assert container.reconcile is container.reconcile
    assert container.end is container.end
    assert container.api is container.api
    other = Container(everything)
    assert other.adapters is not container.adapters  # a container of its own: clients of its own


def test_parts_are_built_once_under_concurrent_first_use(
    everything: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[str] = []
    real = clients.firestore_client

    def slow(project: str, *, anonymous: bool) -> object:
        built.append(project)
        time.sleep(0.05)  # widen the window in which a second thread could build it too
        return real(project, anonymous=anonymous)

    monkeypatch.setattr(clients, "firestore_client", slow)
    container = Container(everything)
    seen: list[object] = []
    threads = [threading.Thread(target=lambda: seen.append(container.intake)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert built == ["p"]
    assert len({id(service) for service in seen}) == 1


def test_given_adapters_are_used_and_no_google_client_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_: object, **__: object) -> object:
        raise AssertionError("a Google client was built")

    for name in ("firestore_client", "publisher_client", "tasks_client"):
        monkeypatch.setattr(clients, name, refuse)
    memory = Adapters(
        store=MemoryRequestStore(), config=MemoryConfigStore(Configuration()),
        events=MemoryEventBus(), nudger=MemoryNudger(), publisher=MemoryRequestPublisher(),
        clock=SystemClock(),
    )  # fmt: skip
    container = Container(Settings(project="p"), adapters=memory)
    assert container.adapters is memory
    assert holds(container.intake, memory.store)
    assert holds(container.hooks, memory.publisher)
    assert holds(container.api, memory.clock)


# The process's container ----------------------------------------------------------------------


def test_the_process_container_is_built_from_the_environment_once_and_can_be_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENDWS_PROJECT", "from-the-environment")
    previous = bootstrap.use(None)
    try:
        first = bootstrap.container()
        assert first.settings.project == "from-the-environment"
        assert bootstrap.container() is first
        mine = Container(Settings(project="mine"))
        assert bootstrap.use(mine) is first
        assert bootstrap.container() is mine
        assert bootstrap.use(None) is mine
        assert bootstrap.container() is not mine  # built afresh on next use
    finally:
        bootstrap.use(previous)


# What a process loads -------------------------------------------------------------------------


def loaded_after(code: str) -> set[str]:
    """The google.* modules (beyond the namespace packages) a fresh interpreter holds after
    running ``code``."""
    probe = f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"
    shared = str(ROOT / "shared")
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True,
        env={"PYTHONPATH": shared, "PATH": ""}, cwd=ROOT,
    )  # fmt: skip
    loaded = set(result.stdout.split())
    return {name for name in loaded if name.startswith("google.") and name != "google.cloud"}


def test_importing_bootstrap_loads_no_google_client_library() -> None:
    assert loaded_after("import opendws.bootstrap") == set()


def test_an_intake_process_loads_no_compute_or_tasks_client() -> None:
    """The intake function's cold start: Firestore and Pub/Sub only."""
    loaded = loaded_after(
        "from opendws.bootstrap import Container, Settings\n"
        "Container(Settings(project='p', on_emulators=True)).intake"
    )
    assert "google.cloud.firestore" in loaded
    assert not {
        name for name in loaded if name.startswith(("google.cloud.compute", "google.cloud.tasks"))
    }
