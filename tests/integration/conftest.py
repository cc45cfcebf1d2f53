"""Fixtures of the integration tests: the Docker engine and container runtimes that always clean up."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.services import DockerEngine
from worker.runtimes.container import ContainerWorkspaceRuntime

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def docker_engine() -> DockerEngine:
    engine = DockerEngine(str(REPO))
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
    leftovers = docker_engine.client.containers.list(all=True, filters={"label": "skillrun.work_root"})
    for container in leftovers:
        if str(work_root) in container.labels.get("skillrun.work_root", ""):
            print(f"removing leftover container {container.id[:12]} of {request.node.name}")
            container.remove(force=True)
