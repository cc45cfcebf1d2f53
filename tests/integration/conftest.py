"""Fixtures of the integration tests: the Docker engine, the Cube stand-in, runtimes that always clean up, and
worker processes on the test's Redis."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import docker.errors
import pytest

from tests.cube_server import CubeStandIn
from tests.processes import WorkerProcesses
from tests.services import DockerEngine, docker_engine_for
from worker.jobs import execute as jobs
from worker.config import CubeCodeExecutorConfig, CubeWorkspaceConfig, get_worker_settings
from worker.runtimes.docker.runtime import ContainerWorkspaceRuntime
from worker.runtimes.docker.images import PACKAGES_LABEL
from worker.runtimes.cube.runtime import CubeCodeExecutor, CubeWorkspaceRuntime

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def docker_engine() -> DockerEngine:
    engine = docker_engine_for(str(REPO))
    yield engine
    engine.stop()


@pytest.fixture
def docker_runtime_factory(docker_engine, work_root, request):
    """Container runtimes for one test; their containers are removed afterwards, even when the test failed."""
    made: list[ContainerWorkspaceRuntime] = []

    def make(**options) -> ContainerWorkspaceRuntime:
        runtime = ContainerWorkspaceRuntime(work_root / f"docker-{len(made)}", client=docker_engine.client, **options)
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.remove_containers()
    # Another runtime (of this test or another session) may remove a container between listing and inspecting.
    leftovers = docker_engine.client.containers.list(
        all=True, filters={"label": "skillrun.work_root"}, ignore_removed=True
    )
    for container in leftovers:
        if str(work_root) in container.labels.get("skillrun.work_root", ""):
            print(f"removing leftover container {container.id[:12]} of {request.node.name}")
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


@pytest.fixture(scope="session")
def cube_standin() -> CubeStandIn:
    """The E2B-compatible stand-in, on loopback for the whole session."""
    with CubeStandIn() as server:
        yield server


@pytest.fixture
def cube_runtime_factory(cube_standin, shared_dir):
    """Cube runtimes on the stand-in, each with its own remote root; sandboxes a test leaves are killed afterwards."""
    made: list[CubeWorkspaceRuntime] = []
    before = set(cube_standin.sandboxes)

    def make(executor: CubeCodeExecutor | None = None, idle_seconds: float = 600.0, **config) -> CubeWorkspaceRuntime:
        remote = cube_remote_root(shared_dir, f"cube-{len(made)}", cube_standin)
        settings = cube_config(cube_standin, **config)
        runtime = CubeWorkspaceRuntime(
            executor, config=settings, work_root=shared_dir / f"cube-local-{len(made)}",
            workspace_cfg=CubeWorkspaceConfig(root=str(remote), idle_seconds=idle_seconds),
        )
        made.append(runtime)
        return runtime

    make.made = made
    yield make
    for sandbox_id in set(cube_standin.sandboxes) - before:
        cube_standin.forget(sandbox_id)


def cube_config(standin: CubeStandIn, **fields) -> CubeCodeExecutorConfig:
    fields = {"api_url": standin.url, "sandbox_url": standin.url, "api_key": standin.api_key, **fields}
    return CubeCodeExecutorConfig(**fields)


def cube_remote_root(shared_dir: Path, name: str, standin: CubeStandIn) -> Path:
    """A folder standing for the sandbox's workspace root, writable by the stand-in's sandbox user."""
    remote = shared_dir / name
    remote.mkdir()
    if os.geteuid() == 0:
        os.chown(remote, standin.user_uid, standin.user_uid)
    return remote


@pytest.fixture
def derived_images(docker_engine):
    """Derived images a test makes are removed after it (the next session builds them again)."""
    before = {image.id for image in docker_engine.client.images.list(filters={"label": PACKAGES_LABEL})}
    yield
    for image in docker_engine.client.images.list(filters={"label": PACKAGES_LABEL}):
        if image.id not in before:
            for container in docker_engine.client.containers.list(all=True, filters={"ancestor": image.id}):
                container.remove(force=True)
            docker_engine.client.images.remove(image.id, force=True)


@pytest.fixture
def worker_env(work_root, shared_dir, monkeypatch):
    env = {
        "SKILLRUN_WORK_ROOT": str(work_root), "SKILLRUN_ARTIFACTS_DIR": str(shared_dir / "artifacts"),
        "SKILLRUN_HEARTBEAT_TTL_SECONDS": "4",  # short, yet safe from a loaded machine's stalls
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    get_worker_settings.cache_clear()
    jobs._runtimes.clear()
    yield env
    get_worker_settings.cache_clear()
    jobs._runtimes.clear()


@pytest.fixture
def workers(redis_url, worker_env):
    group = WorkerProcesses(worker_env, redis_url)
    yield group
    group.stop()
