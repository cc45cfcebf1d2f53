"""A package index of our own for environment tests: real wheels and source distributions, served over HTTP.

Wheels are written by hand (a zip with the metadata files the wheel format asks for); source distributions carry an
in-tree build backend (``backend-path``), so a test decides what a package's build does: succeed, fail, sleep,
write a lot, or try to read what it must not. The index answers the PEP 503 "simple" pages ``uv`` reads, on a
non-loopback address of the host (builds run in a sandbox that may not reach the host's loopback).
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import socket
import tarfile
import textwrap
import threading
import zipfile
from pathlib import Path


def host_address() -> str:
    """An address of this host other than loopback (the one its default route leaves from)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route
        return probe.getsockname()[0]


def wheel(folder: Path, name: str, version: str, module: str, *, requires: tuple[str, ...] = (),
          extra_files: dict[str, bytes] | None = None) -> Path:
    """A pure-Python wheel of ``name`` that installs ``<name>.py`` holding ``module``."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {f"{name.replace('-', '_')}.py": module.encode(), **(extra_files or {})}
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {item}\n" for item in requires
    )
    files[f"{dist}.dist-info/METADATA"] = metadata.encode()
    files[f"{dist}.dist-info/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: skillrun-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(f"{path},sha256={_b64(hashlib.sha256(data).digest())},{len(data)}\n" for path, data in files.items())
    files[f"{dist}.dist-info/RECORD"] = (record + f"{dist}.dist-info/RECORD,,\n").encode()
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name_in, data in files.items():
            archive.writestr(name_in, data)
    return path


def sdist(folder: Path, name: str, version: str, build_code: str) -> Path:
    """A source distribution whose build backend runs ``build_code`` (indented into ``build_wheel``) and then
    builds a wheel of an empty module."""
    dist = f"{name.replace('-', '_')}-{version}"
    backend = textwrap.dedent('''
        import base64, hashlib, os, zipfile

        def _b64(d):
            return base64.urlsafe_b64encode(d).rstrip(b"=").decode()

        def get_requires_for_build_wheel(config_settings=None):
            return []

        def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
            info = os.path.join(metadata_directory, "{dist}.dist-info")
            os.makedirs(info)
            with open(os.path.join(info, "METADATA"), "w") as f:
                f.write("Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n")
            return "{dist}.dist-info"

        def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
        {code}
            files = {{"{module}.py": b"BUILT = True\\n",
                     "{dist}.dist-info/METADATA": b"Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n",
                     "{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}}
            record = "".join(f"{{p}},sha256={{_b64(hashlib.sha256(d).digest())}},{{len(d)}}\\n" for p, d in files.items())
            files["{dist}.dist-info/RECORD"] = (record + "{dist}.dist-info/RECORD,,\\n").encode()
            out = "{dist}-py3-none-any.whl"
            with zipfile.ZipFile(os.path.join(wheel_directory, out), "w") as z:
                for p, d in files.items():
                    z.writestr(p, d)
            return out
    ''').format(dist=dist, name=name, version=version, module=name.replace("-", "_"),
                code=textwrap.indent(textwrap.dedent(build_code), "    "))
    pyproject = (f'[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n'
                 f'[project]\nname = "{name}"\nversion = "{version}"\n')
    pkg_info = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    path = folder / f"{dist}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for member, text in (("pyproject.toml", pyproject), ("backend.py", backend), ("PKG-INFO", pkg_info)):
            data = text.encode()
            entry = tarfile.TarInfo(f"{dist}/{member}")
            entry.size = len(data)
            archive.addfile(entry, io.BytesIO(data))
    return path


class PackageIndex:
    """A PEP 503 index over the distribution files in ``folder``, served until ``close``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.requests: list[str] = []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                self._answer(with_body=True)

            def do_HEAD(self) -> None:  # noqa: N802
                self._answer(with_body=False)

            def _answer(self, *, with_body: bool) -> None:
                index.requests.append(f"{self.command} {self.path}")
                body, kind = index._page(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((host_address(), 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        host, port = self._server.server_address[:2]
        self.url = f"http://{host}:{port}/simple"

    def _page(self, path: str) -> tuple[bytes | None, str]:
        parts = [part for part in path.split("?")[0].split("/") if part]
        if len(parts) == 3 and parts[0] == "files":
            target = self.folder / parts[2]
            return (target.read_bytes(), "application/octet-stream") if target.is_file() else (None, "")
        if len(parts) == 2 and parts[0] == "simple":
            project = _normalise(parts[1])
            links = []
            for file in sorted(self.folder.iterdir()):
                if _normalise(file.name.split("-")[0]) == project:
                    digest = hashlib.sha256(file.read_bytes()).hexdigest()
                    links.append(f'<a href="/files/{project}/{file.name}#sha256={digest}">{file.name}</a>')
            if not links:
                return None, ""
            return f"<html><body>{''.join(links)}</body></html>".encode(), "text/html"
        return None, ""

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
