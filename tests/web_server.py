"""A real HTTP server on loopback for the web tools' tests: each path answers what a test set for it, and every
request is recorded (path, query, headers), so a test can assert what was — and what was not — asked.

A route is ``(status, headers, body)`` or a callable taking the request handler and answering itself (to stream a
huge body, say).
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Route = tuple[int, dict[str, str], bytes] | Callable[[BaseHTTPRequestHandler], None]


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes = b""


class _Served:
    """Serving a handler class on a free loopback port from a thread of its own."""

    port: int

    def _serve(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class WebServer(_Served):
    routes: dict[str, Route] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def start(self) -> "WebServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                server.requests.append(Seen(self.command, parts.path, parse_qs(parts.query), dict(self.headers), body))
                route = server.routes.get(parts.path)
                if route is None:
                    route = (404, {"Content-Type": "text/plain"}, b"not found")
                if callable(route):
                    route(self)
                    return
                status, headers, payload = route
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _answer

        self._serve(Handler)
        return self


class ConnectProxy(_Served):
    """An HTTPS (CONNECT) proxy on loopback that resolves names through ``hosts`` and records each tunnel's target."""

    def __init__(self, hosts: dict[str, str]) -> None:
        self.hosts = hosts
        self.tunnels: list[str] = []
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ConnectProxy":
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_CONNECT(self) -> None:
                host, _, port = self.path.rpartition(":")
                proxy.tunnels.append(self.path)
                upstream = socket.create_connection((proxy.hosts.get(host, host), int(port)))
                self.send_response(200, "Connection established")
                self.end_headers()
                sockets = [self.connection, upstream]
                try:
                    while True:
                        readable, _, _ = select.select(sockets, [], [], 5)
                        if not readable:
                            return
                        for source in readable:
                            data = source.recv(65536)
                            if not data:
                                return
                            (upstream if source is self.connection else self.connection).sendall(data)
                finally:
                    upstream.close()

        self._serve(Handler)
        return self
