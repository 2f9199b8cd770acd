"""The Cloud Tasks emulator's gRPC face, and :class:`CloudTasksEmulator`, which puts the clock,
the signer, the backend, the dispatcher and the server together.

The Google client packages ship message types but no servicer classes, so the real method paths
of ``google.cloud.tasks.v2.CloudTasks`` are served with ``grpc.method_handlers_generic_handler``;
a method not served is answered ``UNIMPLEMENTED``, gRPC's own answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent import futures
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc
from google.cloud import tasks_v2
from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

from emulators.cloud_tasks.api import SERVICE, Refused
from emulators.cloud_tasks.backend import DEFAULT_DEDUP_WINDOW, Backend, Dispatch
from emulators.cloud_tasks.dispatcher import DISPATCH_DUE_TIMEOUT, Dispatcher
from emulators.cloud_tasks.signer import TokenSigner
from emulators.official import HOST, EmulatorError
from opendws.clock import SystemClock
from opendws.ports import Clock


def _empty(nothing: None) -> bytes:
    """``google.protobuf.Empty`` on the wire: no bytes at all."""
    return b""


def _method(
    fn: Callable[[Any], Any], request_type: Any, response_serialize: Callable[[Any], bytes]
) -> Any:
    """A unary handler for ``fn``: refusals become the gRPC status they carry."""

    def handle(request: Any, context: Any) -> Any:
        try:
            return fn(request)
        except Refused as refusal:
            context.abort(refusal.code, refusal.message)

    return grpc.unary_unary_rpc_method_handler(
        handle,
        request_deserializer=request_type.deserialize,
        response_serializer=response_serialize,
    )


def _service(backend: Backend) -> Any:
    """The generic handler that serves the real method paths of CloudTasks."""
    queue, task = tasks_v2.Queue.serialize, tasks_v2.Task.serialize
    empty = _empty
    methods = {
        "CreateQueue": _method(backend.create_queue, tasks_v2.CreateQueueRequest, queue),
        "GetQueue": _method(backend.get_queue, tasks_v2.GetQueueRequest, queue),
        "ListQueues": _method(
            backend.list_queues, tasks_v2.ListQueuesRequest, tasks_v2.ListQueuesResponse.serialize
        ),
        "DeleteQueue": _method(backend.delete_queue, tasks_v2.DeleteQueueRequest, empty),
        "PurgeQueue": _method(backend.purge_queue, tasks_v2.PurgeQueueRequest, queue),
        "CreateTask": _method(backend.create_task, tasks_v2.CreateTaskRequest, task),
        "GetTask": _method(backend.get_task, tasks_v2.GetTaskRequest, task),
        "ListTasks": _method(
            backend.list_tasks, tasks_v2.ListTasksRequest, tasks_v2.ListTasksResponse.serialize
        ),
        "DeleteTask": _method(backend.delete_task, tasks_v2.DeleteTaskRequest, empty),
    }
    return grpc.method_handlers_generic_handler(SERVICE, methods)


class CloudTasksEmulator:
    """The Cloud Tasks emulator: a gRPC server and a dispatcher thread; a context manager.

    ``address`` (``HOST:PORT``) is what ``grpc.insecure_channel`` takes; ``client()`` builds a
    real client on such a channel. Tokens in dispatched requests verify against ``certs()``
    (also written to ``certs_path`` at start, when given). Stopping stops everything it runs.

    ``clock`` is where every "now" comes from (schedule times, attempts, retries, the
    deduplication window, the tokens' dates): the system clock unless given. A test gives a
    frozen :class:`~opendws.clock.ManualClock`, moves it, and calls :meth:`dispatch_due`.
    """

    def __init__(
        self,
        host: str = HOST,
        port: int = 0,
        *,
        dedup_window: timedelta = DEFAULT_DEDUP_WINDOW,
        certs_path: Path | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._certs_path = certs_path
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._signer = TokenSigner(self._clock.now())
        self._backend = Backend(self._clock, dedup_window)
        self._dispatcher = Dispatcher(self._backend, self._signer, self._clock)
        self._server: Any = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._bound = 0
        self._channels: list[Any] = []

    @property
    def address(self) -> str:
        if self._server is None:
            raise EmulatorError("the Cloud Tasks emulator is not running")
        return f"{self._host}:{self._bound}"

    def start(self) -> Self:
        if self._server is not None:
            return self
        if self._certs_path is not None:
            self._certs_path.write_text(json.dumps(self.certs(), indent=2) + "\n")
        executor = futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="cloud-tasks")
        server = grpc.server(executor, handlers=(_service(self._backend),))
        try:
            bound = server.add_insecure_port(f"{self._host}:{self._port}")
        except RuntimeError as error:
            executor.shutdown()
            raise EmulatorError(f"cannot listen on {self._host}:{self._port}: {error}") from None
        if not bound:
            executor.shutdown()
            raise EmulatorError(f"cannot listen on {self._host}:{self._port}")
        server.start()
        self._dispatcher.start()
        self._server, self._executor, self._bound = server, executor, bound
        return self

    def stop(self) -> None:
        server, executor = self._server, self._executor
        self._server, self._executor = None, None
        # Channels first: a channel whose server went away first logs a GOAWAY to stderr.
        channels, self._channels = self._channels, []
        for channel in channels:
            channel.close()
        if server is not None:
            server.stop(grace=None).wait()
        self._dispatcher.stop()
        if executor is not None:
            executor.shutdown(wait=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def certs(self) -> dict[str, str]:
        """``{kid: certificate PEM}``: what ``google.auth.jwt.decode(token, certs=...)`` takes."""
        return {self._signer.kid: self._signer.certificate}

    def client(self) -> tasks_v2.CloudTasksClient:
        """A real client on an insecure channel to the emulator (closed when it stops)."""
        channel = grpc.insecure_channel(self.address)
        self._channels.append(channel)
        return tasks_v2.CloudTasksClient(transport=CloudTasksGrpcTransport(channel=channel))

    def dispatched(self) -> list[Dispatch]:
        """Every HTTP attempt made since start (or the last reset), oldest first."""
        return self._backend.dispatched()

    def dispatch_due(self, timeout: float = DISPATCH_DUE_TIMEOUT) -> None:
        """Send every task due by the clock's now and return once every answer is recorded
        (see :meth:`~emulators.cloud_tasks.dispatcher.Dispatcher.dispatch_due`)."""
        self._dispatcher.dispatch_due(timeout)

    def reset(self) -> None:
        """Forget queues, tasks, used names and the dispatch log; answers to requests in flight
        are ignored."""
        self._backend.reset()
