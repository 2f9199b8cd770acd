"""The Cloud Tasks emulator, driven by the real ``google-cloud-tasks`` client over gRPC: queues and
tasks behave as in Cloud Tasks (codes, names, views, limits), and tasks really arrive at an HTTP
receiver on time, with Cloud Tasks' headers and a verifiable OIDC token, retried with backoff.

Time is the emulator's clock, a frozen ``ManualClock`` that each test moves: a task is due when
the test has moved the clock to its ``schedule_time``, and ``dispatch_due()`` sends what is due
and returns once every answer is in. So "it did not fire" is asserted right after moving the
clock, never by waiting, and retry times are the backoff itself, computed from the clock.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest
from google.api_core import exceptions
from google.auth import jwt
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

from emulators import CloudTasksEmulator, free_port
from emulators.cloud_tasks import ISSUER
from opendws.clock import ManualClock

LOCATION = "projects/demo-opendws/locations/us-central1"
SERVICE_ACCOUNT = "timer-invoker@demo-opendws.iam.gserviceaccount.com"
AUDIENCE = "https://timer.example/release"
ROOT = Path(__file__).resolve().parents[2]
# The emulator's clock starts this far behind the wall clock: the tokens it signs are dated by
# it, and google.auth checks them against wall time, refusing a token issued in its future.
# Tests move the clock by much less than this.
LAG = timedelta(minutes=5)


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Receiver:
    """A local HTTP endpoint that records every request and answers with ``status``."""

    def __init__(self) -> None:
        self.status = 200
        self._received: list[Received] = []
        self._condition = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                receiver._record(Received(self.command, self.path, dict(self.headers), body))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:
                self._answer()

            def do_GET(self) -> None:
                self._answer()

            def log_message(self, format: str, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # A short poll interval: shutting down waits for the serving loop to look again.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.01,), daemon=True
        )
        self._thread.start()

    def url(self, path: str = "/timer") -> str:
        return f"http://127.0.0.1:{self._server.server_port}{path}"

    def _record(self, received: Received) -> None:
        with self._condition:
            self._received.append(received)
            self._condition.notify_all()

    def received(self) -> list[Received]:
        with self._condition:
            return list(self._received)

    def wait_for(self, count: int, timeout: float = 5.0) -> list[Received]:
        with self._condition:
            self._condition.wait_for(lambda: len(self._received) >= count, timeout)
            return list(self._received)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@pytest.fixture
def clock() -> ManualClock:
    """Frozen: it moves when the test moves it."""
    return ManualClock(datetime.now(UTC) - LAG)


@pytest.fixture
def emulator(clock: ManualClock) -> Iterator[CloudTasksEmulator]:
    """An emulator of the test's own, on the test's clock: no other test's tasks fall due."""
    with CloudTasksEmulator(clock=clock) as running:
        yield running


@pytest.fixture
def client(emulator: CloudTasksEmulator) -> tasks_v2.CloudTasksClient:
    return emulator.client()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    endpoint = Receiver()
    yield endpoint
    endpoint.close()


def make_queue(
    client: tasks_v2.CloudTasksClient,
    *,
    max_attempts: int = 0,
    min_backoff: timedelta | None = None,
    max_backoff: timedelta | None = None,
) -> str:
    """A new queue of the test's own; retry settings left out take Cloud Tasks' defaults."""
    retry = tasks_v2.RetryConfig(max_attempts=max_attempts)
    if min_backoff is not None:
        retry.min_backoff = min_backoff
    if max_backoff is not None:
        retry.max_backoff = max_backoff
    name = f"{LOCATION}/queues/q-{uuid.uuid4().hex[:12]}"
    client.create_queue(parent=LOCATION, queue=tasks_v2.Queue(name=name, retry_config=retry))
    return name


def http_task(
    url: str,
    *,
    name: str = "",
    at: datetime | None = None,
    audience: str = AUDIENCE,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tasks_v2.Task:
    task = tasks_v2.Task(
        name=name,
        http_request=tasks_v2.HttpRequest(
            url=url,
            http_method=tasks_v2.HttpMethod.POST,
            headers=headers or {},
            body=body,
            oidc_token=tasks_v2.OidcToken(service_account_email=SERVICE_ACCOUNT, audience=audience),
        ),
    )
    if at is not None:
        task.schedule_time = at
    return task


def later(clock: ManualClock, seconds: float) -> datetime:
    return clock.now() + timedelta(seconds=seconds)


def bearer(received: Received) -> str:
    scheme, _, token = received.headers["Authorization"].partition(" ")
    assert scheme == "Bearer"
    return token


def gone(client: tasks_v2.CloudTasksClient, name: str) -> bool:
    try:
        client.get_task(name=name)
    except exceptions.NotFound:
        return True
    return False


# ---------------------------------------------------------------------- queues


def test_a_queue_is_created_with_cloud_tasks_defaults_and_can_be_read_back(
    client: tasks_v2.CloudTasksClient,
) -> None:
    name = make_queue(client)

    queue = client.get_queue(name=name)

    assert queue.name == name
    assert queue.state == tasks_v2.Queue.State.RUNNING
    assert queue.retry_config.max_attempts == 100
    assert queue.retry_config.min_backoff == timedelta(seconds=0.1)
    assert queue.retry_config.max_backoff == timedelta(hours=1)
    assert queue.retry_config.max_doublings == 16
    assert queue.rate_limits.max_concurrent_dispatches == 1000
    assert name in [q.name for q in client.list_queues(parent=LOCATION)]


def test_creating_a_queue_twice_is_refused(client: tasks_v2.CloudTasksClient) -> None:
    name = make_queue(client)

    with pytest.raises(exceptions.AlreadyExists):
        client.create_queue(parent=LOCATION, queue=tasks_v2.Queue(name=name))


def test_an_unknown_queue_is_not_found(
    client: tasks_v2.CloudTasksClient, receiver: Receiver
) -> None:
    missing = f"{LOCATION}/queues/never-created"

    with pytest.raises(exceptions.NotFound):
        client.get_queue(name=missing)
    with pytest.raises(exceptions.NotFound):
        client.create_task(parent=missing, task=http_task(receiver.url()))
    with pytest.raises(exceptions.NotFound):
        client.delete_queue(name=missing)


def test_a_queue_outside_its_location_is_invalid(client: tasks_v2.CloudTasksClient) -> None:
    with pytest.raises(exceptions.InvalidArgument):
        client.create_queue(
            parent=LOCATION,
            queue=tasks_v2.Queue(name="projects/other/locations/us-central1/queues/q"),
        )


# ---------------------------------------------------------------------- dispatch


def test_a_task_fires_at_its_schedule_time_with_cloud_tasks_headers(
    clock: ManualClock,
    emulator: CloudTasksEmulator,
    client: tasks_v2.CloudTasksClient,
    receiver: Receiver,
) -> None:
    queue = make_queue(client)
    at = later(clock, 1.0)
    task = client.create_task(
        parent=queue,
        task=http_task(
            receiver.url("/timer?kind=release"),
            name=f"{queue}/tasks/train-42-release-1",
            at=at,
            body=b'{"request_id": "train-42"}',
            headers={"Content-Type": "application/json", "X-Opendws": "yes"},
        ),
    )
    clock.set(at - timedelta(microseconds=1))
    emulator.dispatch_due()
    assert receiver.received() == []  # not a moment early

    clock.set(at)
    emulator.dispatch_due()

    (received,) = receiver.received()
    (attempt,) = [d for d in emulator.dispatched() if d.task == task.name]
    assert attempt.at == at  # on time, by the emulator's clock
    assert task.schedule_time == at
    assert received.method == "POST"
    assert received.path == "/timer?kind=release"
    assert received.body == b'{"request_id": "train-42"}'
    headers = received.headers
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Opendws"] == "yes"
    assert headers["User-Agent"] == "Google-Cloud-Tasks"
    assert headers["X-CloudTasks-QueueName"] == queue.rpartition("/")[2]
    assert headers["X-CloudTasks-TaskName"] == "train-42-release-1"
    assert headers["X-CloudTasks-TaskRetryCount"] == "0"
    assert headers["X-CloudTasks-TaskExecutionCount"] == "0"
    assert float(headers["X-CloudTasks-TaskETA"]) == pytest.approx(at.timestamp(), abs=1e-6)
    assert "X-CloudTasks-TaskPreviousResponse" not in headers
    claims = jwt.decode(bearer(received), certs=emulator.certs(), audience=AUDIENCE)
    assert claims["email"] == SERVICE_ACCOUNT
    assert claims["email_verified"] is True
    assert claims["iss"] == ISSUER
    assert claims["iat"] == int(at.timestamp())  # dated by the emulator's clock
    assert claims["exp"] - claims["iat"] == 3600
    with pytest.raises(ValueError, match="audience"):
        jwt.decode(bearer(received), certs=emulator.certs(), audience="https://someone-else")
    assert gone(client, task.name)
    assert attempt.status == 200
    assert attempt.succeeded


def test_a_move_of_the_clock_wakes_the_dispatcher(
    clock: ManualClock, client: tasks_v2.CloudTasksClient, receiver: Receiver
) -> None:
    """Without ``dispatch_due``: the dispatcher thread hears the clock move, as it does for the
    running clock of a local stack that an operator steps forward."""
    queue = make_queue(client)
    at = later(clock, 600)
    client.create_task(parent=queue, task=http_task(receiver.url(), at=at))

    clock.set(at)

    assert len(receiver.wait_for(1)) == 1


def test_the_token_audience_defaults_to_the_task_url(
    emulator: CloudTasksEmulator, client: tasks_v2.CloudTasksClient, receiver: Receiver
) -> None:
    queue = make_queue(client)
    client.create_task(parent=queue, task=http_task(receiver.url(), audience=""))

    emulator.dispatch_due()

    (received,) = receiver.received()
    claims = jwt.decode(bearer(received), certs=emulator.certs(), audience=receiver.url())
    assert claims["email"] == SERVICE_ACCOUNT


def test_a_deleted_task_never_fires(
    clock: ManualClock,
    emulator: CloudTasksEmulator,
    client: tasks_v2.CloudTasksClient,
    receiver: Receiver,
) -> None:
    queue = make_queue(client)
    task = client.create_task(parent=queue, task=http_task(receiver.url(), at=later(clock, 1.0)))

    client.delete_task(name=task.name)
    clock.advance(timedelta(hours=1))
    emulator.dispatch_due()

    assert receiver.received() == []
    assert emulator.dispatched() == []
    with pytest.raises(exceptions.NotFound):
        client.get_task(name=task.name)
    with pytest.raises(exceptions.NotFound):
        client.delete_task(name=task.name)


def test_failed_attempts_are_retried_with_backoff_then_dropped(
    clock: ManualClock,
    emulator: CloudTasksEmulator,
    client: tasks_v2.CloudTasksClient,
    receiver: Receiver,
) -> None:
    """Cloud Tasks' backoff (``RetryConfig``): ``min_backoff`` after the first failure, doubled
    after each next one; dropped once ``max_attempts`` attempts failed."""
    receiver.status = 503
    queue = make_queue(client, max_attempts=3, min_backoff=timedelta(seconds=0.1))
    task = client.create_task(parent=queue, task=http_task(receiver.url()))
    start = task.schedule_time
    retries_at: list[datetime] = []
    for backoff in (timedelta(seconds=0.1), timedelta(seconds=0.2)):
        emulator.dispatch_due()
        retry_at = client.get_task(name=task.name).schedule_time
        assert retry_at == clock.now() + backoff  # from the failure's answer, by the clock
        clock.set(retry_at - timedelta(microseconds=1))
        emulator.dispatch_due()  # not a moment before its backoff is over
        assert len(receiver.received()) == len(retries_at) + 1
        retries_at.append(retry_at)
        clock.set(retry_at)
    emulator.dispatch_due()
    assert gone(client, task.name)
    clock.advance(timedelta(hours=1))  # the longest backoff: a fourth attempt would be due
    emulator.dispatch_due()

    attempts = receiver.received()
    assert len(attempts) == 3
    retries = [a.headers["X-CloudTasks-TaskRetryCount"] for a in attempts]
    assert retries == ["0", "1", "2"]
    assert [a.headers["X-CloudTasks-TaskExecutionCount"] for a in attempts] == ["0", "1", "2"]
    previous = [a.headers.get("X-CloudTasks-TaskPreviousResponse") for a in attempts]
    assert previous == [None, "503", "503"]
    dispatched = [d for d in emulator.dispatched() if d.task == task.name]
    assert [d.at for d in dispatched] == [start, *retries_at]
    assert retries_at == [start + timedelta(seconds=0.1), start + timedelta(seconds=0.3)]
    assert [d.status for d in dispatched] == [503, 503, 503]
    assert task.name not in [t.name for t in client.list_tasks(parent=queue)]


def test_a_failed_attempt_is_recorded_on_the_task(
    emulator: CloudTasksEmulator, client: tasks_v2.CloudTasksClient, receiver: Receiver
) -> None:
    receiver.status = 500
    queue = make_queue(client, min_backoff=timedelta(seconds=30))
    task = client.create_task(parent=queue, task=http_task(receiver.url()))

    emulator.dispatch_due()

    current = client.get_task(name=task.name)
    assert current.response_count == 1
    assert current.dispatch_count == 1
    assert current.last_attempt.response_status.code == 13  # INTERNAL, from HTTP 500
    assert current.first_attempt.dispatch_time == current.last_attempt.dispatch_time
    retry_in = current.schedule_time - current.last_attempt.response_time
    assert retry_in == timedelta(seconds=30)
    client.delete_task(name=task.name)


def test_an_unreachable_target_is_retried(
    clock: ManualClock, emulator: CloudTasksEmulator, client: tasks_v2.CloudTasksClient
) -> None:
    queue = make_queue(client, max_attempts=2, min_backoff=timedelta(seconds=0.1))
    task = client.create_task(
        parent=queue, task=http_task(f"http://127.0.0.1:{free_port()}/closed")
    )

    emulator.dispatch_due()
    clock.advance(timedelta(seconds=0.1))
    emulator.dispatch_due()

    assert gone(client, task.name)
    attempts = [d for d in emulator.dispatched() if d.task == task.name]
    assert len(attempts) == 2
    assert all(d.status is None and d.error for d in attempts)


# ---------------------------------------------------------------------- names and limits


def test_a_used_task_name_is_refused_while_pending_after_completion_and_after_deletion(
    clock: ManualClock,
    emulator: CloudTasksEmulator,
    client: tasks_v2.CloudTasksClient,
    receiver: Receiver,
) -> None:
    queue = make_queue(client)
    pending, deleted, completed = (f"{queue}/tasks/{kind}" for kind in ("p", "d", "c"))
    for name in (pending, deleted):
        client.create_task(
            parent=queue, task=http_task(receiver.url(), name=name, at=later(clock, 600))
        )
    client.delete_task(name=deleted)
    client.create_task(parent=queue, task=http_task(receiver.url(), name=completed))
    emulator.dispatch_due()
    assert len(receiver.received()) == 1
    assert gone(client, completed)

    for name in (pending, deleted, completed):
        with pytest.raises(exceptions.AlreadyExists):
            client.create_task(parent=queue, task=http_task(receiver.url(), name=name))


def test_a_name_is_free_again_after_the_dedup_window(
    clock: ManualClock, client: tasks_v2.CloudTasksClient, receiver: Receiver
) -> None:
    """A name cannot be reused for about an hour after its task was deleted or executed (tasks
    v2 ``CreateTaskRequest``): the emulator's default window is that hour."""
    queue = make_queue(client)
    name = f"{queue}/tasks/again"
    client.create_task(parent=queue, task=http_task(receiver.url(), name=name, at=later(clock, 60)))
    client.delete_task(name=name)
    clock.advance(timedelta(hours=1) - timedelta(microseconds=1))
    with pytest.raises(exceptions.AlreadyExists):
        client.create_task(parent=queue, task=http_task(receiver.url(), name=name))
    clock.advance(timedelta(microseconds=1))

    again = client.create_task(
        parent=queue, task=http_task(receiver.url(), name=name, at=later(clock, 60))
    )

    assert again.name == name


def test_the_dedup_window_can_be_set(clock: ManualClock, receiver: Receiver) -> None:
    with CloudTasksEmulator(dedup_window=timedelta(seconds=0.2), clock=clock) as emulator:
        client = emulator.client()
        queue = make_queue(client)
        name = f"{queue}/tasks/again"
        client.create_task(
            parent=queue, task=http_task(receiver.url(), name=name, at=later(clock, 60))
        )
        client.delete_task(name=name)
        with pytest.raises(exceptions.AlreadyExists):
            client.create_task(parent=queue, task=http_task(receiver.url(), name=name))
        clock.advance(timedelta(seconds=0.2))

        again = client.create_task(
            parent=queue, task=http_task(receiver.url(), name=name, at=later(clock, 60))
        )

        assert again.name == name


def test_a_task_more_than_30_days_ahead_is_refused(
    clock: ManualClock, client: tasks_v2.CloudTasksClient, receiver: Receiver
) -> None:
    queue = make_queue(client)

    with pytest.raises(exceptions.InvalidArgument, match="30 days"):
        client.create_task(
            parent=queue, task=http_task(receiver.url(), at=later(clock, 30 * 86400 + 60))
        )
    client.create_task(parent=queue, task=http_task(receiver.url(), at=later(clock, 29 * 86400)))


def test_a_task_name_outside_its_queue_is_invalid(
    client: tasks_v2.CloudTasksClient, receiver: Receiver
) -> None:
    queue = make_queue(client)
    other = make_queue(client)

    with pytest.raises(exceptions.InvalidArgument):
        client.create_task(
            parent=queue, task=http_task(receiver.url(), name=f"{other}/tasks/misplaced")
        )
    with pytest.raises(exceptions.InvalidArgument):
        client.create_task(parent=queue, task=http_task(receiver.url(), name=f"{queue}/tasks/a b"))


# ---------------------------------------------------------------------- get, list, delete


def test_get_list_and_delete(
    clock: ManualClock,
    emulator: CloudTasksEmulator,
    client: tasks_v2.CloudTasksClient,
    receiver: Receiver,
) -> None:
    queue = make_queue(client)
    at = later(clock, 3600)
    names = [f"{queue}/tasks/{n}" for n in ("b", "a")]
    for name in names:
        client.create_task(
            parent=queue, task=http_task(receiver.url(), name=name, at=at, body=b"x")
        )
    generated = client.create_task(parent=queue, task=http_task(receiver.url(), at=at))

    listed = list(client.list_tasks(parent=queue))
    basic = client.get_task(name=names[0])
    full = client.get_task(
        request=tasks_v2.GetTaskRequest(name=names[0], response_view=tasks_v2.Task.View.FULL)
    )
    client.delete_task(name=names[1])
    emulator.dispatch_due()

    assert generated.name.startswith(f"{queue}/tasks/")
    assert [t.name for t in listed] == sorted([*names, generated.name])
    assert basic.view == tasks_v2.Task.View.BASIC
    assert basic.http_request.body == b""
    assert full.view == tasks_v2.Task.View.FULL
    assert full.http_request.body == b"x"
    assert basic.schedule_time == at
    assert basic.dispatch_deadline == timedelta(minutes=10)
    assert basic.create_time.microsecond == 0
    assert basic.dispatch_count == 0
    assert [t.name for t in client.list_tasks(parent=queue)] == sorted([names[0], generated.name])
    with pytest.raises(exceptions.NotFound):
        client.get_task(name=names[1])
    with pytest.raises(exceptions.NotFound):
        client.delete_task(name=names[1])
    assert receiver.received() == []


def test_reset_forgets_queues_tasks_and_names(
    clock: ManualClock,
    emulator: CloudTasksEmulator,
    client: tasks_v2.CloudTasksClient,
    receiver: Receiver,
) -> None:
    queue = make_queue(client)
    name = f"{queue}/tasks/kept"
    client.create_task(parent=queue, task=http_task(receiver.url(), name=name, at=later(clock, 60)))

    emulator.reset()

    with pytest.raises(exceptions.NotFound):
        client.get_queue(name=queue)
    client.create_queue(parent=LOCATION, queue=tasks_v2.Queue(name=queue))
    client.create_task(parent=queue, task=http_task(receiver.url(), name=name, at=later(clock, 60)))


# ---------------------------------------------------------------------- running it


def test_stopping_leaves_no_thread_running(receiver: Receiver) -> None:
    """On the system clock, as the local stack runs it: retries go on until it stops."""
    receiver.status = 500
    before = set(threading.enumerate())
    emulator = CloudTasksEmulator().start()
    client = emulator.client()
    queue = make_queue(client, min_backoff=timedelta(seconds=0.1))
    client.create_task(parent=queue, task=http_task(receiver.url()))
    receiver.wait_for(1)

    emulator.stop()

    # The receiver's own request threads may still be finishing; they are not the emulator's.
    left = [t.name for t in set(threading.enumerate()) - before if "process_request" not in t.name]
    assert left == []


def test_standalone_server_prints_its_host_writes_certs_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    certs = tmp_path / "certs.json"
    command = [sys.executable, "-m", "emulators.cloud_tasks", "--certs", str(certs)]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "shared")])}
    server = subprocess.Popen(
        command, cwd=ROOT, env=environment, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        line = server.stdout.readline().strip()
        assert line.startswith("CLOUD_TASKS_EMULATOR_HOST=127.0.0.1:")
        address = line.partition("=")[2]
        (certificate,) = json.loads(certs.read_text()).values()
        assert certificate.startswith("-----BEGIN CERTIFICATE-----")
        channel = grpc.insecure_channel(address)
        client = tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))
        name = f"{LOCATION}/queues/standalone"
        client.create_queue(parent=LOCATION, queue=tasks_v2.Queue(name=name))
        assert client.get_queue(name=name).name == name
        channel.close()
        os.killpg(server.pid, signal.SIGTERM)
        assert server.wait(15) == 0
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(15)
