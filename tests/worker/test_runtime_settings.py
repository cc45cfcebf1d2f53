"""One set of defaults: a runtime built by name (``resolve_runtime``), by the Python API's ``create_*`` functions or
by a worker (``jobs.runtime_for``) takes the worker settings' pool size, OCI runtime and limits; a keyword argument
given wins over its setting. Building one starts nothing (the Docker runtime's warm pool begins on ``start()``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.code_executors import (
    create_container_workspace_runtime,
    create_local_workspace_runtime,
)
from worker import defaults
from worker.jobs import execute as jobs
from worker.config import get_worker_settings
from worker.runtimes import resolve_runtime
from worker.runtimes.docker.runtime import ContainerWorkspaceRuntime
from worker.runtimes.local.runtime import LocalWorkspaceRuntime


@pytest.fixture
def settings_env(monkeypatch: pytest.MonkeyPatch):
    """Set ``SKILLRUN_*`` variables for the worker settings, read afresh; the cache is cleared again afterwards."""

    def set_env(**variables: str) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(f"SKILLRUN_{name.upper()}", value)
        get_worker_settings.cache_clear()

    for name in ("DOCKER_POOL_SIZE", "DOCKER_OCI_RUNTIME", "RUN_CPUS", "RUN_TMPFS_BYTES", "WORKSPACE_DISK_BYTES"):
        monkeypatch.delenv(f"SKILLRUN_{name}", raising=False)
    get_worker_settings.cache_clear()
    yield set_env
    get_worker_settings.cache_clear()


def test_docker_runtime_by_name_keeps_a_warm_pool_of_the_workers_default_size(settings_env, tmp_path: Path):
    runtime = resolve_runtime("docker", work_root=tmp_path)
    assert isinstance(runtime, ContainerWorkspaceRuntime)
    assert runtime.pool is not None and runtime.pool.size == defaults.DOCKER_POOL_CONTAINERS == 2
    assert get_worker_settings().docker_pool_size == defaults.DOCKER_POOL_CONTAINERS
    assert runtime.boxes.settings.oci_runtime == "runc" and not runtime.gvisor


def test_docker_runtime_by_name_takes_the_worker_settings(settings_env, tmp_path: Path):
    settings_env(docker_pool_size="3", docker_oci_runtime="runsc", run_cpus="0.5", run_tmpfs_bytes=str(32 * 1024**2))
    for runtime in (resolve_runtime("docker", work_root=tmp_path), create_container_workspace_runtime(tmp_path)):
        assert isinstance(runtime, ContainerWorkspaceRuntime)
        assert runtime.pool is not None and runtime.pool.size == 3
        assert runtime.boxes.settings.oci_runtime == "runsc" and runtime.gvisor
        assert (runtime.cpus, runtime.tmpfs_bytes) == (0.5, 32 * 1024**2)
        assert (runtime.boxes.settings.cpus, runtime.boxes.settings.tmpfs_bytes) == (0.5, 32 * 1024**2)


def test_an_explicit_argument_wins_over_the_setting(settings_env, tmp_path: Path):
    settings_env(docker_pool_size="3", docker_oci_runtime="runsc", run_cpus="0.5")
    runtime = resolve_runtime("docker", work_root=tmp_path, pool_size=0, oci_runtime="runc", cpus=2.0)
    assert runtime.pool is None and runtime.boxes.settings.oci_runtime == "runc" and not runtime.gvisor
    assert runtime.cpus == 2.0
    runtime = create_container_workspace_runtime(tmp_path, pool_size=1)
    assert runtime.pool.size == 1 and runtime.gvisor  # the one named wins; the others are still the settings'


def test_the_local_runtime_takes_the_same_limits_defaults(settings_env, tmp_path: Path):
    settings_env(run_cpus="0.25", run_tmpfs_bytes=str(16 * 1024**2))
    for runtime in (resolve_runtime("local", work_root=tmp_path), create_local_workspace_runtime(tmp_path)):
        assert isinstance(runtime, LocalWorkspaceRuntime)
        assert (runtime.cpus, runtime.tmpfs_bytes) == (0.25, 16 * 1024**2)
    runtime = create_local_workspace_runtime(tmp_path)
    assert resolve_runtime("local", work_root=tmp_path, cpus=None, tmpfs_bytes=8 * 1024**2).cpus is None
    assert runtime.workspaces.disk_bytes is None


def test_a_worker_builds_its_runtimes_as_resolve_runtime_does(settings_env, tmp_path: Path, monkeypatch):
    settings_env(work_root=str(tmp_path), docker_pool_size="4", docker_oci_runtime="runsc", run_cpus="0.75")
    monkeypatch.setattr(jobs, "_runtimes", {})
    worker_docker, worker_local = jobs.runtime_for("docker"), jobs.runtime_for("local")
    api_docker = create_container_workspace_runtime(tmp_path)
    assert (worker_docker.pool.size, worker_docker.boxes.settings, worker_docker.cpus) == (
        api_docker.pool.size, api_docker.boxes.settings, api_docker.cpus) == (4, api_docker.boxes.settings, 0.75)
    assert worker_docker.boxes.settings.oci_runtime == "runsc"
    assert (worker_local.cpus, worker_local.tmpfs_bytes) == (0.75, defaults.SANDBOX_TMPFS_BYTES)


def test_building_a_docker_runtime_starts_nothing(settings_env, tmp_path: Path):
    runtime = resolve_runtime("docker", work_root=tmp_path)
    assert runtime._client is None  # the engine is not even asked for until the first use
    assert runtime.pool._loop is None and runtime.pool._filling is None
