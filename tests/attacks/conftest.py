"""The attack suite: every known escape, run for real against the runtimes and the API, asserted contained.

Each test's name says what it defends. The local-runtime attacks need root (per-workspace users, namespaces,
cgroups); the Docker ones a real engine; under ``CI=true`` a missing part fails the test instead of skipping it.
"""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path

import pytest

from tests.conftest import write_skill
from tests.integration.conftest import docker_engine, docker_runtime_factory  # noqa: F401 - shared fixtures
from tests.normal_user import Account, normal_account
from worker.contract import RunRequest, SkillRef
from worker.roots.folders import remove_tree
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


@pytest.fixture(scope="module")
def account() -> Account:
    """The normal account the tests of a normal account's runs run as (``tests.normal_user``)."""
    return normal_account()


@pytest.fixture
def shared() -> Path:
    """A fresh folder every account may enter and read, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="skillrun-normal-"))
    path.chmod(0o755)
    yield path
    remove_tree(path)


@pytest.fixture
def skill_root(shared: Path) -> Path:
    """A library every account may read: ``probe`` and ``other``."""
    root = shared / "library"
    write_skill(root, "probe", body="Probe things.\n", files={"scripts/hello.sh": "echo hello\n"})
    write_skill(root, "other", body="Other things.\n", files={"scripts/other.sh": "echo other\n"})
    return root


@pytest.fixture
def cache(account: Account) -> Path:
    """The account's ``XDG_CACHE_HOME`` for one test (its default work root is ``<cache>/skillrun``), under its
    home; removed afterwards."""
    path = account.home / f".cache-test-{secrets.token_hex(4)}"
    yield path
    remove_tree(path)
