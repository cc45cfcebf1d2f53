"""An npm registry of our own for Node environment tests: packages made here, served over HTTP as npm reads them.

A package is a real npm tarball (``package/package.json`` and its files, gzipped), so a test decides what it holds
and what its install scripts do. The registry answers package documents (``GET /<name>``, scoped names escaped
as npm sends them) and tarballs, on a non-loopback address of the host (builds run in a sandbox that may not reach
the host's loopback), and records every request.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import tarfile
import threading
from dataclasses import dataclass, field
from urllib.parse import unquote

from tests.package_index import host_address


@dataclass
class NpmPackage:
    """One version of a package: its ``package.json`` fields and files (``index.js`` by default)."""

    name: str
    version: str
    files: dict[str, str] = field(default_factory=dict)
    dependencies: dict[str, str] = field(default_factory=dict)
    scripts: dict[str, str] = field(default_factory=dict)
    bin: dict[str, str] = field(default_factory=dict)

    def manifest(self) -> dict:
        manifest = {"name": self.name, "version": self.version, "main": "index.js"}
        for key in ("dependencies", "scripts", "bin"):
            if getattr(self, key):
                manifest[key] = getattr(self, key)
        return manifest

    def tarball(self) -> bytes:
        files = {"index.js": f"module.exports = {{ name: {self.name!r}, version: {self.version!r} }};\n",
                 **self.files, "package.json": json.dumps(self.manifest(), indent=2)}
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            for path, text in sorted(files.items()):
                data = text.encode()
                entry = tarfile.TarInfo(f"package/{path}")
                entry.size = len(data)
                entry.mode = 0o755 if path in self.bin.values() else 0o644
                archive.addfile(entry, io.BytesIO(data))
        return buffer.getvalue()


class NpmRegistry:
    """Serves ``packages`` (add more with ``publish``) until ``close``; ``url`` is what npm's ``registry`` is set
    to."""

    def __init__(self, packages: list[NpmPackage] = ()) -> None:
        self.requests: list[str] = []
        self._documents: dict[str, dict] = {}
        self._tarballs: dict[str, bytes] = {}
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                registry.requests.append(self.path)
                body, kind = registry._answer(self.path)
                if body is None:
                    body, kind = b'{"error":"Not found"}', "application/json"
                    self.send_response(404)
                else:
                    self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((host_address(), 0), Handler)
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}/"
        for package in packages:
            self.publish(package)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def publish(self, package: NpmPackage) -> None:
        data = package.tarball()
        path = f"{package.name}/-/{package.name.rpartition('/')[2]}-{package.version}.tgz"
        self._tarballs[path] = data
        document = self._documents.setdefault(package.name, {"name": package.name, "versions": {}, "dist-tags": {}})
        version = {
            **package.manifest(),
            "dist": {"tarball": self.url + path, "shasum": hashlib.sha1(data).hexdigest(),
                     "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()},
        }
        if any(name in package.scripts for name in ("preinstall", "install", "postinstall")):
            version["hasInstallScript"] = True
        document["versions"][package.version] = version
        document["dist-tags"]["latest"] = package.version

    def _answer(self, path: str) -> tuple[bytes | None, str]:
        path = unquote(path.split("?")[0]).lstrip("/")
        if path in self._tarballs:
            return self._tarballs[path], "application/octet-stream"
        document = self._documents.get(path)
        return (None, "") if document is None else (json.dumps(document).encode(), "application/json")

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
