"""Chaos tests (issue #13): real Redis, real worker and API processes, and containers — killed, restarted, cut off.

Redis runs as a container of an image built here from ``images/redis`` (on the local base image: no registry), once
per machine and tagged by the digest of its Dockerfile and base; testcontainers starts and removes it, and the
engine's own API (the ``docker`` SDK) SIGKILLs it, starts it again, and cuts a worker container off the network
it shares with Redis. testcontainers' reaper (Ryuk) is pulled from a registry, so it is off: every fixture here
removes what it started, also when its test failed.

Workers and the API run as processes of this checkout (``python -m worker``, ``skillrun serve``); a worker that must
be cut off from Redis runs in the ``skillrun/worker`` image with this checkout's ``worker/`` mounted over the
image's copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import docker.errors
import httpx
import pytest
import redis

from orchestrator.documents import RedisDocuments
from orchestrator.teams import TeamStore
from tests.integration.conftest import docker_engine  # noqa: F401 - the same session-wide engine
from tests.orchestrator.api_helpers import new_team
from tests.processes import WorkerProcesses
from tests.services import BASE_IMAGE, DockerEngine, free_port, unavailable

try:
    from testcontainers.core.config import testcontainers_config
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.network import Network
except ImportError:  # bash .ci/setup --test installs it (the test extra)
    testcontainers_config = DockerContainer = Network = None

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "skills"
WORKER_IMAGE = "skillrun/worker:latest"
REDIS_IMAGE = "skillrun/chaos-redis"
LABEL = "skillrun.chaos"
"""Label of every container and network these tests make (with the test's name), to find leftovers by."""
HEARTBEAT_TTL_SECONDS = 4
"""The workers' heartbeat TTL here: a killed worker's run is found lost within seconds (the sweep runs every 5 s)."""

if testcontainers_config is not None:
    testcontainers_config.ryuk_disabled = True  # the reaper's image needs a registry; fixtures clean up instead


def need_testcontainers() -> None:
    if DockerContainer is None:
        unavailable("testcontainers is not installed: run 'bash .ci/setup --test' (or pip install -e '.[test]')")


async def until(done: Callable[[], object], seconds: float = 60.0, what: str = "the condition",
                explain: Callable[[], object] | None = None) -> None:
    """Wait until ``done()`` is true; ``seconds`` is a bound against hanging, not a figure the test checks.
    ``explain()`` says what things looked like when it did not happen."""
    deadline = time.monotonic() + seconds
    while True:
        outcome = done()
        if asyncio.iscoroutine(outcome):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() > deadline:
            seen = explain() if explain is not None else None
            if asyncio.iscoroutine(seen):
                seen = await seen
            raise AssertionError(f"{what} did not happen within {seconds:.0f} s" + (f": {seen}" if seen else ""))
        await asyncio.sleep(0.05)


# --- Redis in a container -------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def redis_image(docker_engine: DockerEngine) -> str:  # noqa: F811 - the imported fixture
    """``skillrun/chaos-redis:<digest>``, built once per machine (the digest covers the Dockerfile and the base)."""
    need_testcontainers()
    client = docker_engine.client
    dockerfile = (REPO / "images" / "redis" / "Dockerfile").read_bytes()
    base = client.images.get(BASE_IMAGE)
    tag = f"{REDIS_IMAGE}:{hashlib.sha256(dockerfile + base.id.encode()).hexdigest()[:12]}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    try:
        client.images.build(path=str(REPO / "images" / "redis"), buildargs={"BASE": BASE_IMAGE}, tag=tag, rm=True,
                            labels={LABEL: "redis"})
    except (docker.errors.BuildError, docker.errors.APIError) as exc:
        unavailable(f"could not build {tag} from images/redis: {exc}")
    for image in client.images.list(REDIS_IMAGE):  # earlier builds of ours (an older Dockerfile or base)
        if tag not in image.tags:
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(image.id)
    return tag


@pytest.fixture(scope="session")
def worker_image(docker_engine: DockerEngine) -> str:  # noqa: F811 - the imported fixture
    """``skillrun/worker:latest`` as this checkout builds it (``images/worker``), built once per test session: the
    engine's layer cache makes that quick when nothing changed, and an image left by an older checkout (without a
    dependency added since) is never used."""
    try:
        docker_engine.client.images.build(path=str(REPO), dockerfile="images/worker/Dockerfile", rm=True,
                                          buildargs={"BASE": BASE_IMAGE}, tag=WORKER_IMAGE)
    except (docker.errors.BuildError, docker.errors.APIError) as exc:
        unavailable(f"could not build {WORKER_IMAGE} from images/worker: {exc}")
    return WORKER_IMAGE


class RedisInDocker:
    """A Redis server in a container, published on a loopback port of its own (kept across restarts)."""

    def __init__(self, image: str, name: str, *, persistent: bool, network: Network | None = None) -> None:
        self.port = free_port()
        command = ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--dir", "/data", "--save", "",
                   "--appendonly", "yes" if persistent else "no"]
        self.container = DockerContainer(image).with_command(command).with_kwargs(labels={LABEL: name})
        self.container.ports["6379/tcp"] = ("127.0.0.1", self.port)
        if network is not None:
            self.container.with_network(network)

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def address_on(self, network: Network) -> str:
        """Its address on ``network`` (for a container there)."""
        self.docker.reload()
        return self.docker.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]

    @property
    def docker(self):  # noqa: ANN201 - docker.models.containers.Container
        return self.container.get_wrapped_container()

    def start(self) -> RedisInDocker:
        self.container.start()
        self.wait_ready()
        return self

    def wait_ready(self, seconds: float = 60.0) -> None:
        client = redis.Redis.from_url(self.url(), socket_connect_timeout=1, socket_timeout=5)
        deadline = time.monotonic() + seconds
        try:
            while True:
                try:
                    client.ping()  # BusyLoadingError (a ConnectionError) while it reads its append-only file
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"Redis in {self.docker.short_id} did not answer: {self.logs()}") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL the server (it is the container's first process) and wait for the container to stop."""
        self.docker.kill(signal="SIGKILL")
        self.docker.wait(timeout=60)

    def restart(self) -> None:
        """Start the killed container again: the same port, and its append-only file if it keeps one."""
        self.docker.start()
        self.wait_ready()

    def logs(self) -> str:
        with contextlib.suppress(docker.errors.APIError):
            return self.docker.logs(tail=30).decode(errors="replace")
        return ""

    def remove(self) -> None:
        with contextlib.suppress(docker.errors.APIError, AttributeError):
            self.container.stop()


@pytest.fixture
def redis_containers(redis_image, request):
    """Make Redis containers for one test (``make(persistent=..., network=...)``); all are removed after it."""
    made: list[RedisInDocker] = []

    def make(*, persistent: bool, network: Network | None = None) -> RedisInDocker:
        server = RedisInDocker(redis_image, request.node.name, persistent=persistent, network=network)
        made.append(server)
        return server.start()

    yield make
    for server in made:
        server.remove()


@pytest.fixture
def chaos_network(docker_engine, request):  # noqa: F811 - the imported fixture
    """A Docker network of this test's own (testcontainers), removed after it with whatever is still on it."""
    need_testcontainers()
    network = Network(docker_network_kw={"labels": {LABEL: request.node.name}}).create()
    yield network
    with contextlib.suppress(docker.errors.APIError):
        held = docker_engine.client.networks.get(network.id)
        held.reload()
        for container_id in held.attrs.get("Containers") or {}:
            with contextlib.suppress(docker.errors.APIError):
                held.disconnect(container_id, force=True)
        network.remove()


def worker_container(image: str, network: Network, redis_address: str, work_root: Path, artifacts: Path,  # noqa: ANN201
                     name: str):
    """A queue worker in the ``skillrun/worker`` image (``image``: the ``worker_image`` fixture's), a testcontainers
    ``DockerContainer``, not started, running this checkout's ``worker/`` (mounted over the image's copy), as compose
    runs it, with its own work root and the shared artifact store at the host's paths."""
    need_testcontainers()
    mounts = [(str(REPO / "worker"), "/opt/skillrun/app/worker", "ro"), (str(LIBRARY), str(LIBRARY), "ro"),
              (str(work_root), str(work_root), "rw"), (str(artifacts), str(artifacts), "rw")]
    container = DockerContainer(image, volumes=mounts).with_network(network)
    container.with_envs(SKILLRUN_REDIS_URL=f"redis://{redis_address}:6379/0", SKILLRUN_WORK_ROOT=str(work_root),
                        SKILLRUN_ARTIFACTS_DIR=str(artifacts), SKILLRUN_HEARTBEAT_TTL_SECONDS=str(HEARTBEAT_TTL_SECONDS),
                        PYTHONDONTWRITEBYTECODE="1")
    return container.with_kwargs(init=True, cap_add=["SYS_ADMIN"], labels={LABEL: name},
                                 security_opt=["seccomp=unconfined", "apparmor=unconfined"])


# --- processes ------------------------------------------------------------------------------------------------------

@pytest.fixture
def worker_env(work_root: Path, shared_dir: Path) -> dict[str, str]:
    return {"SKILLRUN_WORK_ROOT": str(work_root), "SKILLRUN_ARTIFACTS_DIR": str(shared_dir / "artifacts"),
            "SKILLRUN_HEARTBEAT_TTL_SECONDS": str(HEARTBEAT_TTL_SECONDS)}


@pytest.fixture
def workers(worker_env):
    group = WorkerProcesses(worker_env)
    yield group
    group.stop()


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class ApiProcess:
    """``skillrun serve`` over Redis in a process of its own, as deployed (teams and keys in Redis too), started
    again on the same port after it was killed; and a key of team ``chaos``."""

    def __init__(self, redis_url: str, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.redis_url = redis_url
        self.port = free_port()
        self.env = {**os.environ, "SKILLRUN_REDIS_URL": redis_url, "SKILLS_ROOT": str(LIBRARY),
                    "SKILLRUN_DATA_DIR": str(data_dir), **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.key = self.new_key()

    def new_key(self) -> str:
        teams = TeamStore(RedisDocuments(self.redis_url))
        try:
            return new_team(SimpleNamespace(teams=teams), "chaos")
        finally:
            teams.docs.close()

    async def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "serve", "--port", str(self.port)],
                                     env=self.env, cwd=REPO)
        await until(lambda: self.proc.poll() is not None or _answers(self.port), 60, "the API answering")
        assert self.proc.poll() is None, f"the API exited with {self.proc.returncode}"

    def client(self, connections: int = 100) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        return httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", timeout=120, limits=limits,
                                 headers={"Authorization": f"Bearer {self.key}"})

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def api_processes(shared_dir):
    """Make API processes for one test (``make(redis_url)``); each is SIGKILLed at its end if still running."""
    made: list[ApiProcess] = []

    def make(redis_url: str, **env: str) -> ApiProcess:
        api = ApiProcess(redis_url, shared_dir / f"api-data-{len(made)}", env)
        made.append(api)
        return api

    yield make
    for api in made:
        api.kill()
