"""The whole system on one machine: every emulator, every function, the topics and push
subscriptions wired as in Google Cloud, a default configuration, and the reconcile ticker.

- the official Firestore and Pub/Sub emulators;
- the project's Compute/TPU emulator (a simulated cloud with a few zones and shapes of finite
  stock, in wall-clock time) and Cloud Tasks emulator (its token certificates in a file the
  ``timer`` function reads);
- every function of ``functions/main.py`` under functions-framework, each its own HTTP server
  in its own process group; each HTTP function (``timer``, ``ci_hook``, ``api``) behind a
  Cloud Run front (:mod:`emulators.cloud_run`) with its service's settings, as Terraform
  deploys it (:data:`SERVICES`): the ``timer`` is internal-only and invokable by the tasks
  account alone, so the Cloud Tasks emulator calls it at the front's internal URL with a token
  for its ``run.app`` URL, and the function reads the claims Cloud Run checked
  (``OPENDWS_INVOKER_CHECKED_BY_RUN``); ``ci_hook``, ``api`` and ``agent`` are public;
- VMs that really run (:class:`emulators.vms.VmHost`): every VM of the simulated cloud that is
  RUNNING gets its own loopback address (its internal IP), its own metadata server, whose
  identity tokens the ``agent`` function is told to trust, and runs the agent as a process of
  its own; a Secret Manager stand-in (:mod:`emulators.secrets`) holds the jobs' secrets, and
  the jobs' output goes to a folder (``OPENDWS_JOB_LOGS_DIR``, read by ``dws logs``);
- a fake GitHub API (:mod:`emulators.github`) with a GitHub App installed on the
  ``example-org`` organization and a fake GitLab (:mod:`emulators.gitlab`) with a token that
  may create runners in group 42; both send their job webhooks to ``ci_hook`` (signed with
  the stack's hook secret). opendws is pointed at them (``OPENDWS_GITHUB_API_URL``,
  ``OPENDWS_GITLAB_URL``, the App's key and the token in files), and a CI job's VM runs the
  stand-in runners of ``emulators/runners/`` (``OPENDWS_GITHUB_RUNNER_DIR``,
  ``OPENDWS_GITLAB_RUNNER``), which take one job from the fakes, run its script and exit;
- one request topic per configured tenant (``capacity-requests-{tenant}``), the admins'
  ``capacity-admin-requests`` and the shared ``capacity-requests`` (heard only when the
  configuration trusts it), each pushed to ``intake`` at a path naming the topic (so that
  functions-framework gives the CloudEvent the topic as its ``source``, as Eventarc does);
  ``capacity-events`` with one subscription per tenant filtered on its ``tenant`` attribute
  (the official emulator ignores filters: local readers apply it themselves, see
  ``ports.passes_event_filter``); ``reconcile-ticks``; a dead-letter topic per push
  subscription (5 delivery attempts); the timers' queue, and the configuration in
  ``config/scheduler``. A tenant added by ``dws config apply`` gets its topic and
  subscriptions too;
- a ticker thread that publishes a tick on ``reconcile-ticks`` every ``tick`` seconds (intake
  and release also nudge it, so admission does not wait for the tick).

It uses the project id ``demo-opendws``. Leaving the ``with`` block stops everything, in
reverse order, with no process left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets as secrets_module
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from emulators.cloud_run import CloudRunFront, Ingress, Service, function_url, run_app_url
from emulators.cloud_tasks import ISSUER as TASKS_ISSUER
from emulators.cloud_tasks import CloudTasksEmulator
from emulators.compute import ComputeEmulator
from emulators.functions import serving
from emulators.github import GitHubEmulator, app_key_pair
from emulators.gitlab import FakeGitLab
from emulators.official import free_port, running
from emulators.secrets import SecretManagerEmulator
from emulators.signing import LocalSigner
from emulators.vms import LOOPBACK_RANGE, VmHost, VmSettings
from opendws.clock import ManualClock
from opendws.service.api import key_digest
from opendws.sim import SimulatedCloud
from opendws.sim.cloud import OPERATION_LATENCY, RateQuotas

PROJECT = "demo-opendws"
TOPICS = ("capacity-requests", "capacity-admin-requests", "capacity-events", "reconcile-ticks")
# The local project's number (Google assigns one to every project) and region: the functions'
# Cloud Run URLs are made of them.
PROJECT_NUMBER = "123456789012"
REGION = "us-central1"
INVOKER = f"opendws-tasks@{PROJECT}.iam.gserviceaccount.com"
# The timer's tasks carry an ID token for its service's run.app URL, as Terraform arms them.
TIMER_AUDIENCE = run_app_url("opendws-timer", PROJECT_NUMBER, REGION)
# Each HTTP function's Cloud Run service, as infra/main.tf deploys it ("Who may call each
# function" in infra/README.md): the timer internal-only and invoked by the tasks account alone
# (Cloud Run checks its token), ci_hook and api public (they check their callers themselves).
SERVICES = {
    "timer": Service(
        "opendws-timer", Ingress.INTERNAL, frozenset({INVOKER}),
        frozenset({TIMER_AUDIENCE, function_url("opendws-timer", PROJECT, REGION)}),
    ),
    "ci_hook": Service("opendws-ci-hook"),
    "api": Service("opendws-api"),
    # Public: the agents on the VMs carry VM identity tokens the function verifies itself.
    "agent": Service("opendws-agent"),
}  # fmt: skip
# What each function's environment adds to the stack's.
FUNCTION_ENVIRONMENT = {"timer": {"OPENDWS_INVOKER_CHECKED_BY_RUN": "true"}}
# How the local agents are timed (short: everything runs on this machine; an agent is lost
# after more than the 10 s between two heartbeats written, ports.runs.HEARTBEAT_WRITE_EVERY).
LOCAL_AGENT_TIMING = {
    "OPENDWS_AGENT_HEARTBEAT_SECONDS": "1", "OPENDWS_AGENT_LOST_AFTER_SECONDS": "12",
    "OPENDWS_AGENT_LOST_GRACE_SECONDS": "2", "OPENDWS_AGENT_STOP_GRACE_SECONDS": "2",
    "OPENDWS_AGENT_REGISTER_WITHIN_SECONDS": "60",
}  # fmt: skip
DELIVERY_ATTEMPTS = 5
# Every function of functions/main.py and how it is triggered.
FUNCTIONS = (
    ("intake", "cloudevent"),
    ("reconcile", "cloudevent"),
    ("timer", "http"),
    ("ci_hook", "http"),
    ("api", "http"),
    ("agent", "http"),
)
# Local-only credentials (the stack listens on 127.0.0.1): the admin's API key and one per
# example tenant, and the CI hooks' shared secret.
LOCAL_KEYS = {
    "admin": "local-admin-key", "vision": "local-vision-key", "speech": "local-speech-key",
    "ci": "local-ci-key",
}  # fmt: skip
# As in Google Cloud, the api is given only the keys' digests.
LOCAL_API_KEYS = ",".join(f"{tenant}:{key_digest(key)}" for tenant, key in LOCAL_KEYS.items())
LOCAL_HOOK_SECRET = "local-hook-secret"
# The default simulated cloud: (zone, shape as the cloud names it, free units).
DEFAULT_STOCK = (
    ("us-central1-a", "a3-highgpu-8g", 8),
    ("us-central1-b", "a3-highgpu-8g", 4),
    ("us-central1-a", "a2-ultragpu-8g", 4),
    ("us-west4-a", "V5LITE_POD", 64),
)
DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "shared/opendws/examples/local-config.yaml"
# The CI systems of the example configuration's mappings, as the local fakes serve them.
LOCAL_GITHUB_APP = 1001
LOCAL_GITHUB_INSTALLATION = 2002
LOCAL_GITHUB_ORG = "example-org"
LOCAL_GITLAB_GROUP = 42
LOCAL_GITLAB_PROJECT = 7  # a project of that group
RUNNERS = Path(__file__).resolve().parent / "runners"


@dataclass
class Stack:
    """A running local stack: where everything is."""

    project: str
    environment: dict[str, str]  # what a process needs to use the stack (clients, functions)
    urls: dict[str, str]  # function → URL (an HTTP function's: its Cloud Run front's)
    logs: dict[str, Path]  # function → the file its output goes to, removed at the end
    cloud: SimulatedCloud
    tasks: CloudTasksEmulator
    fronts: dict[str, CloudRunFront] = field(default_factory=dict)  # HTTP function → front
    vms: VmHost | None = None  # runs the cloud's VMs: their metadata servers and agents
    secrets: SecretManagerEmulator | None = None  # the Secret Manager stand-in
    job_logs: Path | None = None  # where the jobs' output goes, by request and rank
    github: GitHubEmulator | None = None  # the fake GitHub the CI mappings' App lives on
    gitlab: FakeGitLab | None = None  # the fake GitLab
    stop_ticker: threading.Event = field(default_factory=threading.Event)

    def client_environment(self) -> dict[str, str]:
        """The variables any real Google client needs to talk to the stack."""
        keys = ("FIRESTORE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST", "OPENDWS_PROJECT",
                "OPENDWS_COMPUTE_ENDPOINT", "CLOUD_TASKS_EMULATOR_HOST",
                "OPENDWS_LOCAL_INTAKE_URL", "OPENDWS_JOB_LOGS_DIR",
                "OPENDWS_SECRETS_ENDPOINT", "OPENDWS_GITHUB_API_URL",
                "OPENDWS_GITLAB_URL")  # fmt: skip
        return {key: self.environment[key] for key in keys}


Progress = Callable[[str], None]


@contextlib.contextmanager
def local_stack(
    *, tick: timedelta = timedelta(minutes=1), config: Path = DEFAULT_CONFIG,
    progress: Progress = lambda step: None, latency: timedelta = timedelta(seconds=5),
    review_delay: timedelta = timedelta(seconds=30),
    operation_latency: timedelta = OPERATION_LATENCY, rate_quotas: bool = False,
) -> Iterator[Stack]:  # fmt: skip
    """Start the stack (see the module docstring); stop it all when the block ends.
    ``review_delay``: how long the simulated Google takes to approve or decline a calendar
    block (Google does not document its own; 30 s keeps a local run short).
    ``operation_latency``: how long its Compute operations take to be DONE (Google-like by
    default); ``rate_quotas``: whether Google's default Compute Engine API rate quotas are
    enforced."""
    with (
        contextlib.ExitStack() as stack,
        tempfile.TemporaryDirectory(prefix="opendws-stack-") as scratch,
    ):
        progress("starting the Firestore and Pub/Sub emulators")
        official = stack.enter_context(running())
        progress("starting the Compute Engine / Cloud TPU emulator")
        # The VMs run here (VmHost): their internal addresses are loopback ones, so the
        # address in a request's hosts is the one its job listens on.
        cloud = SimulatedCloud(
            ManualClock(running=True), provisioning_latency=latency,
            internal_range=LOOPBACK_RANGE, operation_latency=operation_latency,
        )  # fmt: skip
        if rate_quotas:
            cloud.set_rate_quotas(RateQuotas.google_defaults())
        cloud.set_review_delay(review_delay)
        for zone, shape, units in DEFAULT_STOCK:
            cloud.set_stock(zone, shape, units)
        compute = stack.enter_context(ComputeEmulator(cloud))
        progress("starting the Cloud Tasks emulator")
        certs = Path(scratch) / "tasks-certs.json"
        tasks = stack.enter_context(CloudTasksEmulator(certs_path=certs))
        ports = {name: free_port() for name, _ in FUNCTIONS}
        urls = {name: f"http://127.0.0.1:{port}/" for name, port in ports.items()}
        progress("starting the Cloud Run fronts of the HTTP functions")
        fronts = {
            name: stack.enter_context(
                CloudRunFront(urls[name], service, certs=tasks.certs(),
                              issuers=frozenset({TASKS_ISSUER}))
            )
            for name, service in SERVICES.items()
        }  # fmt: skip
        functions = dict(urls)  # where each function's own server listens
        urls.update({name: front.url for name, front in fronts.items()})
        progress("starting the Secret Manager stand-in")
        secrets = stack.enter_context(SecretManagerEmulator(PROJECT, int(PROJECT_NUMBER)))
        signer = LocalSigner("metadata", datetime.now(UTC))
        agent_certs = Path(scratch) / "agent-certs.json"
        agent_certs.write_text(json.dumps(signer.certs))
        job_logs = Path(scratch) / "jobs"
        progress("starting the fake GitHub and GitLab (their job webhooks go to ci_hook)")
        github, gitlab, ci_files = _ci_systems(stack, Path(scratch), urls["ci_hook"])
        environment = {
            **official.environment(),
            "OPENDWS_PROJECT": PROJECT,
            "OPENDWS_COMPUTE_ENDPOINT": compute.endpoint,
            "CLOUD_TASKS_EMULATOR_HOST": tasks.address,
            # Cloud Tasks reaches the internal-only timer from inside the project.
            "OPENDWS_TIMER_URL": fronts["timer"].internal_url,
            "OPENDWS_TIMER_AUDIENCE": TIMER_AUDIENCE,
            "OPENDWS_TIMER_SERVICE_ACCOUNT": INVOKER,
            "OPENDWS_TIMER_CERTS": str(certs),
            "OPENDWS_API_KEYS": LOCAL_API_KEYS,
            "OPENDWS_GITHUB_WEBHOOK_SECRET": LOCAL_HOOK_SECRET,
            "OPENDWS_GITLAB_WEBHOOK_TOKEN": LOCAL_HOOK_SECRET,
            "OPENDWS_HOOK_SECRET": LOCAL_HOOK_SECRET,
            # Where a tenant's new topic is pushed to (dws config apply wires it locally).
            "OPENDWS_LOCAL_INTAKE_URL": urls["intake"],
            # The agent function: its public URL (the VMs' tokens' audience), the local VMs'
            # signing certificates, its session key, Secret Manager and the jobs' output.
            "OPENDWS_AGENT_URL": urls["agent"],
            "OPENDWS_AGENT_CERTS": str(agent_certs),
            "OPENDWS_AGENT_SESSION_KEY": secrets_module.token_hex(32),
            "OPENDWS_SECRETS_ENDPOINT": secrets.url,
            "OPENDWS_JOB_LOGS_DIR": str(job_logs),
            # Local agents report every second; one silent for 12 s (plus 2 s) is lost.
            **LOCAL_AGENT_TIMING,
            # The CI mappings' GitHub and GitLab: the fakes, the App's key and the token in
            # files, and the stand-in runners the VMs run.
            "OPENDWS_GITHUB_API_URL": github.url,
            "OPENDWS_GITLAB_URL": gitlab.url,
            **ci_files,
            "OPENDWS_GITHUB_RUNNER_DIR": str(RUNNERS / "actions-runner"),
            "OPENDWS_GITLAB_RUNNER": str(RUNNERS / "gitlab-runner"),
        }
        # The stack is this process's business from here on: its clients find it by these.
        stack.enter_context(_environment(environment))
        progress("creating topics, subscriptions, the timers' queue and the configuration")
        _wire_topics(urls)
        _ensure_timer_queue()
        tenants = _load_config(config)
        wire_tenants(PROJECT, tenants, urls["intake"])
        logs = {name: Path(scratch) / f"{name}.log" for name, _ in FUNCTIONS}
        for name, signature in FUNCTIONS:
            front = f" behind its Cloud Run front {urls[name]}" if name in fronts else ""
            progress(f"serving the {name} function on {functions[name]}{front}")
            own = {**environment, **FUNCTION_ENVIRONMENT.get(name, {})}
            stack.enter_context(serving(name, signature, own, port=ports[name], log=logs[name]))
        progress("starting the VMs' host (each VM's metadata server and agent)")
        vms = stack.enter_context(
            VmHost(cloud, VmSettings(
                agent_url=urls["agent"], signer=signer, run_folder=Path(scratch),
                project_id=PROJECT, project_number=int(PROJECT_NUMBER),
            ))
        )  # fmt: skip
        running_stack = Stack(
            project=PROJECT, environment=environment, urls=urls, logs=logs, cloud=cloud,
            tasks=tasks, fronts=fronts, vms=vms, secrets=secrets, job_logs=job_logs,
            github=github, gitlab=gitlab,
        )  # fmt: skip
        ticker = threading.Thread(
            target=_tick, args=(running_stack, tick), name="reconcile-ticker", daemon=True
        )
        ticker.start()
        progress("ready")
        try:
            yield running_stack
        finally:
            running_stack.stop_ticker.set()
            ticker.join(timeout=10)


def _ci_systems(
    stack: contextlib.ExitStack, scratch: Path, hook_url: str
) -> tuple[GitHubEmulator, FakeGitLab, dict[str, str]]:
    """The fake GitHub (an App installed on the example organization, its key in a file) and
    GitLab (a token that may create and delete runners of the example group, in a file), both
    sending their job webhooks to ``hook_url`` with the stack's hook secret; and the variables
    that point opendws at the key and the token."""
    pem, public = app_key_pair()
    key_file = scratch / "github-app.pem"
    key_file.write_text(pem)
    key_file.chmod(0o600)
    github = stack.enter_context(
        GitHubEmulator(webhook_url=hook_url, webhook_secret=LOCAL_HOOK_SECRET)
    )
    github.state.register_app(LOCAL_GITHUB_APP, public, [
        {"id": LOCAL_GITHUB_INSTALLATION, "account": LOCAL_GITHUB_ORG},
    ])  # fmt: skip
    token = "glpat-" + secrets_module.token_urlsafe(20)
    token_file = scratch / "gitlab-token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    gitlab = stack.enter_context(FakeGitLab(webhook_url=hook_url, webhook_token=LOCAL_HOOK_SECRET))
    gitlab.add_project(LOCAL_GITLAB_PROJECT, group_id=LOCAL_GITLAB_GROUP)
    gitlab.add_token(token, scopes=("create_runner", "manage_runner"),
                     owner_of_groups=(LOCAL_GITLAB_GROUP,))  # fmt: skip
    files = {"OPENDWS_GITHUB_APP_KEY_FILE": str(key_file),
             "OPENDWS_GITLAB_TOKEN_FILE": str(token_file)}  # fmt: skip
    return github, gitlab, files


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _wire_topics(urls: dict[str, str]) -> None:
    """Topics, dead-letter topics and the push subscriptions, as in Google Cloud."""
    from google.api_core.exceptions import AlreadyExists
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import pubsub_v1
    from google.pubsub_v1.types import DeadLetterPolicy, PushConfig

    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    publisher = pubsub_v1.PublisherClient(credentials=credentials)
    subscriber = pubsub_v1.SubscriberClient(credentials=credentials)
    names = [*TOPICS, "capacity-requests-dead-letter", "reconcile-ticks-dead-letter"]
    for name in names:
        with contextlib.suppress(AlreadyExists):
            publisher.create_topic(name=publisher.topic_path(PROJECT, name))
    for name, topic, endpoint in (
        ("intake", "capacity-requests",
         _intake_endpoint(urls["intake"], PROJECT, "capacity-requests")),
        ("intake-admin", "capacity-admin-requests",
         _intake_endpoint(urls["intake"], PROJECT, "capacity-admin-requests")),
        ("reconcile", "reconcile-ticks", urls["reconcile"]),
    ):  # fmt: skip
        dead = "reconcile-ticks" if topic == "reconcile-ticks" else "capacity-requests"
        request: dict[str, Any] = {
            "name": subscriber.subscription_path(PROJECT, name),
            "topic": publisher.topic_path(PROJECT, topic),
            "push_config": PushConfig(push_endpoint=endpoint),
            "ack_deadline_seconds": 60,
            "dead_letter_policy": DeadLetterPolicy(
                dead_letter_topic=publisher.topic_path(PROJECT, f"{dead}-dead-letter"),
                max_delivery_attempts=DELIVERY_ATTEMPTS,
            ),
        }
        with contextlib.suppress(AlreadyExists):
            subscriber.create_subscription(request=request)
    subscriber.close()


def _intake_endpoint(intake_url: str, project: str, topic: str) -> str:
    """intake's push endpoint for ``topic``: the path names the topic, which functions-framework
    turns into the CloudEvent's ``source`` (as Eventarc's triggers set it)."""
    return f"{intake_url.rstrip('/')}/projects/{project}/topics/{topic}"


def wire_tenants(project: str, tenants: Iterable[str], intake_url: str) -> list[str]:
    """Each tenant's request topic pushed to intake, and its filtered event subscription
    (``capacity-events-{tenant}``); safe to repeat. Returns the tenants newly wired."""
    from google.api_core.exceptions import AlreadyExists
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import pubsub_v1
    from google.pubsub_v1.types import DeadLetterPolicy, PushConfig

    from opendws.ports import EVENTS_TOPIC, event_filter, requests_topic

    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    publisher = pubsub_v1.PublisherClient(credentials=credentials)
    subscriber = pubsub_v1.SubscriberClient(credentials=credentials)
    added: list[str] = []
    for tenant in tenants:
        topic = requests_topic(tenant)
        try:
            publisher.create_topic(name=publisher.topic_path(project, topic))
        except AlreadyExists:
            continue  # wired before
        added.append(tenant)
        subscriptions: list[dict[str, Any]] = [
            {
                "name": subscriber.subscription_path(project, f"intake-{tenant}"),
                "topic": publisher.topic_path(project, topic),
                "push_config": PushConfig(
                    push_endpoint=_intake_endpoint(intake_url, project, topic)
                ),
                "ack_deadline_seconds": 60,
                "dead_letter_policy": DeadLetterPolicy(
                    dead_letter_topic=publisher.topic_path(
                        project, "capacity-requests-dead-letter"
                    ),
                    max_delivery_attempts=DELIVERY_ATTEMPTS,
                ),
            },
            {
                "name": subscriber.subscription_path(project, f"{EVENTS_TOPIC}-{tenant}"),
                "topic": publisher.topic_path(project, EVENTS_TOPIC),
                "filter": event_filter(tenant),
            },
        ]
        for request in subscriptions:
            with contextlib.suppress(AlreadyExists):
                subscriber.create_subscription(request=request)
    subscriber.close()
    return added


def _ensure_timer_queue() -> None:
    from opendws.bootstrap import Container, Settings

    queue = Container(Settings.from_environment()).timers
    if queue is not None:
        queue.ensure_queue()  # type: ignore[attr-defined]


def _load_config(path: Path) -> list[str]:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import firestore

    from opendws.adapters.firestore import FirestoreConfigStore
    from opendws.clock import SystemClock
    from opendws.config import configuration_to_apply
    from opendws.scenario import read_document

    now = SystemClock().now()
    configuration = configuration_to_apply(read_document(path), source=str(path), now=now)
    client = firestore.Client(project=PROJECT, credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    FirestoreConfigStore(client).save(configuration)
    client.close()  # type: ignore[no-untyped-call]
    return [tenant.name for tenant in configuration.tenants]


def _tick(stack: Stack, every: timedelta) -> None:
    """Publish a reconcile tick every ``every`` until stopped (Cloud Scheduler's job)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import pubsub_v1

    publisher = pubsub_v1.PublisherClient(credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    topic = publisher.topic_path(stack.project, "reconcile-ticks")
    while not stack.stop_ticker.wait(every.total_seconds()):
        with contextlib.suppress(Exception):  # a missed tick is made up by the next one
            publisher.publish(topic, json.dumps({"tick": True}).encode()).result(30)
