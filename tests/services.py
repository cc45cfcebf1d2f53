"""Real services for tests: a Redis server started on a free loopback port.

When ``redis-server`` is missing it is installed with apt-get where the tests run as root; otherwise the test
fails under CI (``CI=true``) and is skipped elsewhere, with a message saying what to install.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def unavailable(message: str) -> None:
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def ensure_installed(binary: str, package: str) -> str:
    found = shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-qq", package], check=False, capture_output=True, timeout=600)
        found = shutil.which(binary)
        if found:
            return found
    unavailable(f"{binary} is not installed: run 'sudo apt-get install {package}' (bash .ci/setup --test does it as root)")
    raise AssertionError("unreachable")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A private redis-server: loopback only, no persistence, its own temporary directory."""

    def __init__(self, persistent: bool = False) -> None:
        self.binary = ensure_installed("redis-server", "redis-server")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="skillrun-redis-")
        self.persistent = persistent
        self.start()

    def start(self) -> None:
        """Start (or restart) the server; a persistent one keeps its data in an append-only file across restarts."""
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes" if self.persistent else "no", "--appendfsync", "always",
             "--dir", self.dir, "--databases", "64"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.02)
        self.stop()
        unavailable(f"redis-server did not start on port {self.port}")

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def halt(self) -> None:
        """Stop the server process, keeping its data folder."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.dir, ignore_errors=True)
