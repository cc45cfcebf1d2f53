"""Real services for tests: a Redis server started on a free loopback port, and a Docker engine.

When ``redis-server`` is missing it is installed with apt-get where the tests run as root; otherwise the test
fails under CI (``CI=true``) and is skipped elsewhere, with a message saying what to install.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

import docker
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


def connections_to(port: int) -> int:
    """Established TCP connections the server on ``port`` (on this host) holds."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                count += int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01"
    return count


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


SANDBOX_IMAGE = "skillrun/sandbox:latest"
BASE_IMAGE = "skillrun/base:bookworm"
GVISOR = "runsc"
GVISOR_ARGS = ("--network=none", "--host-uds=create")
"""gVisor's options here: no network of its own (its netstack cannot be set up on this kind of host), and Unix
sockets its sandboxes may create on mounted folders (the Docker runtime's executor listens on one)."""
IMAGES = (SANDBOX_IMAGE, "skillrun/worker:latest", "skillrun/api:latest")


def docker_engine_for(repo_root: str) -> "DockerEngine":
    """The test session's one Docker engine (every conftest's ``docker_engine`` fixture is this one, so the engine
    the tests start is known as theirs wherever it was first asked for)."""
    global _ENGINE
    if _ENGINE is None:
        _ENGINE = DockerEngine(repo_root)  # kept before the images are built: a dockerd it started stays known as ours
    _ENGINE.ensure_images()
    return _ENGINE


_ENGINE: "DockerEngine | None" = None


class DockerEngine:
    """A Docker engine to test against: the running one, or a ``dockerd`` started (and installed) here as root;
    plus the sandbox image, built with ``images/build.sh`` when missing."""

    def __init__(self, repo_root: str) -> None:
        self._docker = docker
        self.repo_root = repo_root
        self.started: subprocess.Popen | None = None
        self.client = self._connect() or self._start_engine()
        self._images_ready = False

    def _connect(self):  # noqa: ANN202 - a DockerClient or None
        try:
            client = self._docker.from_env(timeout=10)
            client.ping()
            return client
        except Exception:  # noqa: BLE001 - any failure means: no engine answers
            return None

    def _start_engine(self):  # noqa: ANN202
        if os.geteuid() != 0:
            unavailable("no Docker engine answers: start one (sudo dockerd) or run the tests as root to start it")
        ensure_installed("dockerd", "docker.io")
        log = open(os.path.join(tempfile.gettempdir(), "skillrun-test-dockerd.log"), "ab")
        config = os.path.join(tempfile.mkdtemp(prefix="skillrun-dockerd-"), "daemon.json")
        with open(config, "w") as f:
            json.dump({"runtimes": {GVISOR: {"path": self._runsc(), "runtimeArgs": list(GVISOR_ARGS)}}}, f)
        self._argv = ["dockerd", "--config-file", config]
        self.started = subprocess.Popen(self._argv, stdout=log, stderr=log)
        return self._await_engine()

    def _await_engine(self):  # noqa: ANN202
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            client = self._connect()
            if client is not None:
                return client
            time.sleep(0.5)
        unavailable("dockerd did not come up within 60 s; see /tmp/skillrun-test-dockerd.log")

    def _runsc(self) -> str:
        """gVisor's runsc: the one ``.ci/setup --test`` put in .venv/bin (Debian 13's), else one on PATH."""
        fetched = os.path.join(self.repo_root, ".venv", "bin", "runsc")
        return fetched if os.access(fetched, os.X_OK) else shutil.which("runsc") or fetched

    def require_runtime(self, name: str) -> None:
        """Stop the test, saying how to register it, unless the engine has the OCI runtime ``name``."""
        if name not in self.client.info().get("Runtimes", {}):
            unavailable(f"the Docker engine has no {name!r} runtime: bash .ci/setup --test fetches gVisor's runsc into "
                        f".venv/bin; register it in the engine's daemon.json as \"runtimes\": {{\"{name}\": {{\"path\": "
                        f"\"{self._runsc()}\", \"runtimeArgs\": {json.dumps(list(GVISOR_ARGS))}}}}} and restart dockerd "
                        "(the tests do it when they start dockerd themselves)")

    def ensure_images(self) -> None:
        """Build the images when one is missing, was not built from its Dockerfile as it is now, or the base
        image's packages are not those of ``images/base/packages.txt`` (then ``images/build.sh`` builds the base
        again); once per session."""
        if not self._images_ready:
            self._ensure_image(self.repo_root)
            self._images_ready = True

    def _ensure_image(self, repo_root: str) -> None:
        with open(os.path.join(repo_root, "images", "base", "packages.txt")) as f:
            packages = ",".join(line.strip() for line in f if line.strip() and not line.startswith("#"))
        try:
            for image in IMAGES:
                name = image.split("/", 1)[1].split(":", 1)[0]
                with open(os.path.join(repo_root, "images", name, "Dockerfile"), "rb") as dockerfile:
                    digest = hashlib.sha256(dockerfile.read()).hexdigest()
                if (self.client.images.get(image).labels or {}).get("skillrun.dockerfile") != digest:
                    raise self._docker.errors.ImageNotFound(f"{image} is not built from its Dockerfile")
            base = self.client.images.get(BASE_IMAGE)
            if (base.labels or {}).get("skillrun.base.packages") == packages:
                return
        except self._docker.errors.ImageNotFound:
            pass
        ensure_installed("debootstrap", "debootstrap")
        bundle = "/etc/ssl/certs/ca-certificates.crt"
        args = ["bash", os.path.join(repo_root, "images", "build.sh")] + (["--ca-bundle", bundle] if os.path.exists(bundle) else [])
        if subprocess.run(args, cwd=repo_root, timeout=1200).returncode != 0:
            unavailable(f"could not build {', '.join(IMAGES)} with images/build.sh")

    def restart(self) -> None:
        """Stop the engine the tests started (its containers end, as in any restart without live restore) and
        start it again. Stops the test, saying why, when the engine is not the tests' own."""
        if self.started is None:
            unavailable("restarting the Docker engine needs the one the tests start: stop the running dockerd first")
        self.started.terminate()
        self.started.wait(timeout=60)
        log = open(os.path.join(tempfile.gettempdir(), "skillrun-test-dockerd.log"), "ab")
        self.started = subprocess.Popen(self._argv, stdout=log, stderr=log)
        self._await_engine().close()  # the tests' client (and the runtimes holding it) reconnect by themselves

    def stop(self) -> None:
        """Close the client and stop the engine the tests started (once; later calls do nothing)."""
        self.client.close()
        started, self.started = self.started, None
        if started is not None:
            started.terminate()
            try:
                started.wait(timeout=30)
            except subprocess.TimeoutExpired:
                started.kill()
