"""An "allowed public host" for runs with an egress allow-list: an HTTP server of the test's on the host's loopback,
its name pinned to that address with the operator's ``SKILLRUN_EGRESS_PINNED_HOSTS`` (meant for tests and private
deployments; without it a name must resolve to public addresses). No traffic leaves the machine."""

from __future__ import annotations

import http.server
import threading

import pytest

from worker.config import get_worker_settings

ALLOWED = "api.allowed-egress.net"
"""The allowed host's name: pinned to the test's server on 127.0.0.1."""


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server interface
        body = f"reached {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def allowed_server(monkeypatch) -> int:
    """The server's port, for one test; a GET of ``/path`` answers ``reached /path``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("SKILLRUN_EGRESS_PINNED_HOSTS", f"{ALLOWED}=127.0.0.1")
    get_worker_settings.cache_clear()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    get_worker_settings.cache_clear()
