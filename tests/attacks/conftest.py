"""The attack suite: every known escape, run for real against the runtimes and the API, asserted contained.

Each test's name says what it defends. The local-runtime attacks need root (per-workspace users, namespaces,
cgroups); the Docker ones a real engine; under ``CI=true`` a missing part fails the test instead of skipping it.
"""

from __future__ import annotations

import pytest

from tests.integration.conftest import docker_engine, docker_runtime_factory  # noqa: F401 - shared fixtures
from worker.contract import RunRequest, SkillRef
from worker.runtimes.local.runtime import LocalWorkspaceRuntime


@pytest.fixture
def run_in(library):
    """A request for the demo skill, in one workspace unless the test names another."""

    def make(command: str, **fields) -> RunRequest:
        fields.setdefault("workspace_id", "attacked")
        return RunRequest(skill=SkillRef(name="demo", root=str(library), path="demo"), command=command, **fields)

    return make


@pytest.fixture
async def held(work_root):
    """A local runtime whose spawners start at once: every run of a workspace but its first goes into its held
    sandbox (``tests.attacks.held``)."""
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        yield runtime
