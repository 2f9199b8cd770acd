"""What the project's HTTP emulators share: a WSGI application served by werkzeug on a daemon
thread, from :meth:`BackgroundServer.start` to :meth:`BackgroundServer.stop` (safe to repeat),
as a context manager, without a log line per request."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, Self

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from emulators.official import EmulatorError


class QuietHandler(WSGIRequestHandler):
    """Do not log every request to stderr."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        return None


class BackgroundServer:
    """Serves :meth:`application` on ``host:port`` (0: a free port) on a daemon thread.
    ``what`` names the emulator in errors; ``thread_name`` its thread."""

    def __init__(self, host: str, port: int, *, what: str, thread_name: str) -> None:
        self._host = host
        self._port = port
        self._what = what
        self._thread_name = thread_name
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    def application(self) -> Any:
        """The WSGI application to serve (each subclass's own)."""
        raise NotImplementedError

    @property
    def address(self) -> str:
        """``host:port`` while it runs; EmulatorError otherwise."""
        if self._server is None:
            raise EmulatorError(f"{self._what} is not running")
        return f"{self._host}:{self._server.server_port}"

    def start(self) -> Self:
        if self._server is not None:
            return self
        try:
            server = make_server(self._host, self._port, self.application(), threaded=True,
                                 request_handler=QuietHandler)  # fmt: skip
        except OSError as error:
            raise EmulatorError(f"{self._what} on {self._host}:{self._port}: {error}") from None
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name=self._thread_name, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server, self._thread = None, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


__all__ = ["BackgroundServer", "QuietHandler"]
