"""A test's own HTTP server on loopback, served from a thread: the stand-ins the tests put in
front of the agent (an agent function, a metadata server, a release download)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that keeps the test's output clean (no line per request)."""

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(handler: type[BaseHTTPRequestHandler], port: int = 0) -> ThreadingHTTPServer:
    """``handler`` served on 127.0.0.1:``port`` (0: any free one) until :func:`stop`."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    return server


def stop(server: ThreadingHTTPServer | None) -> None:
    """Stop serving and free the port (None: nothing was served)."""
    if server is not None:
        server.shutdown()
        server.server_close()
