"""A loopback HTTP server serving canned responses by path, for fetching skills roots in tests.

A route is ``(status, body, headers)``; ``body`` may be bytes, or a callable that writes to the response
(for slow or never-ending answers). Redirect chains are routes with a ``Location`` header.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, BinaryIO

Body = bytes | Callable[[BinaryIO], None]


class FileServer:
    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, Body, dict[str, str]]] = {}
        self.hits: dict[str, int] = {}
        self.headers: dict[str, list[dict[str, str]]] = {}
        """The headers of each request, by path."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                server.hits[self.path] = server.hits.get(self.path, 0) + 1
                server.headers.setdefault(self.path, []).append(dict(self.headers.items()))
                status, body, headers = server.routes.get(self.path, (404, b"not found", {}))
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                if isinstance(body, bytes):
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.end_headers()
                    try:
                        body(self.wfile)
                    except (BrokenPipeError, ConnectionResetError):
                        pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def add(self, path: str, body: Body, status: int = 200, headers: dict[str, str] | None = None) -> str:
        self.routes[path] = (status, body, headers or {})
        return self.url(path)

    def start(self) -> "FileServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
