"""Shared fixtures: a skill library and a local runtime in folders other users can enter.

Commands run as a per-workspace user when the tests run as root, so the work root and the library live under a
fresh folder in /tmp with mode 0755 (pytest's own tmp_path is private to its user).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest
import redis

from orchestrator.dispatch import InlineDispatcher
from tests.artifact_stores import CREDENTIALS, S3Server
from tests.orchestrator.api_helpers import make_services
from tests.package_index import PackageIndex, wheel
from tests.services import RedisServer, docker_engine_for, unavailable
from worker.artifacts import BaseArtifactStore, FileArtifactStore
from worker.contract import RunRequest, SkillRef
from worker.roots.folders import remove_tree
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

pytest_plugins = ["tests.system_roots"]  # the root filesystem fixtures (figlet_store, fresh_store)

EXAMPLE_SKILLS = [
    "data-chart", "doc-to-pdf", "docx-memo", "markdown-table", "page-screenshot", "pdf-report", "python-math",
    "spreadsheet", "user-file-ops", "weather-tools", "webapp-check",
]
"""The skills of the repository's example library, ``skills/`` (which the embedded default serves), by name."""
IS_ROOT = os.geteuid() == 0


def pytest_collection_finish(session: pytest.Session) -> None:
    """With Docker tests among those to run, start the engine and build the images now, before any test: a first
    build (debootstrap, a few minutes) does not fit in one test's timeout, so it is not left to a fixture."""
    if session.config.option.collectonly or not any(item.get_closest_marker("docker") for item in session.items):
        return
    try:
        docker_engine_for(str(Path(__file__).resolve().parents[1]))
    except (pytest.skip.Exception, pytest.fail.Exception):
        pass  # the Docker tests' fixture says so again, in each test


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("root") and not IS_ROOT:
        unavailable("needs root to test per-workspace users: run the suite as root (sudo bash .ci/test)")


@pytest.fixture
def shared_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="skillrun-test-"))
    path.chmod(0o755)
    yield path
    # Workspace disks (loop mounts) a test left mounted go first.
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(str(path) + "/")]
    for point in sorted(points, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    remove_tree(path)


def write_skill(root: Path, name: str, body: str = "Run things.\n", files: dict[str, str] | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: The {name} skill.\n---\n{body}")
    for rel, content in (files or {}).items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content))
    return folder


@pytest.fixture
def library(shared_dir: Path) -> Path:
    root = shared_dir / "library"
    write_skill(
        root,
        "demo",
        files={
            "scripts/hello.sh": "echo \"hello from $SKILL_NAME\"\n",
            "USAGE.md": "Call scripts/hello.sh.\n",
        },
    )
    return root


@pytest.fixture
def dists(shared_dir: Path) -> Path:
    """Distributions of a package index of our own: alpha 1.0 and 2.0, and beta 1.0 (which needs alpha>=2)."""
    folder = shared_dir / "dists"
    folder.mkdir()
    wheel(folder, "alpha", "1.0", "VERSION = '1.0'\n")
    wheel(folder, "alpha", "2.0", "VERSION = '2.0'\n")
    wheel(folder, "beta", "1.0", "from alpha import VERSION\n", requires=("alpha>=2",))
    return folder


@pytest.fixture
def index(dists: Path) -> PackageIndex:
    """``dists`` served over HTTP on a non-loopback address of the host, for one test."""
    served = PackageIndex(dists)
    yield served
    served.close()


@pytest.fixture
def work_root(shared_dir: Path) -> Path:
    path = shared_dir / "work"
    path.mkdir(mode=0o755)
    return path


@pytest.fixture(params=["direct", "spawner"] if IS_ROOT else ["direct"])
async def runtime(request: pytest.FixtureRequest, work_root: Path) -> LocalWorkspaceRuntime:
    """The local runtime; as root, once starting each command directly (setpriv) and once through a spawner."""
    rt = LocalWorkspaceRuntime(work_root, spawners="off" if request.param == "direct" else "eager")
    yield rt
    await rt.close()


@pytest.fixture
def make_request(library: Path):
    def make(command: str, **fields) -> RunRequest:
        fields.setdefault("skill", SkillRef(name="demo", root=str(library), path="demo"))
        return RunRequest(command=command, **fields)

    return make


@pytest.fixture
async def services(work_root):
    """The API's services on the embedded default (inline runs, file registries) for one test."""
    runtime = LocalWorkspaceRuntime(work_root)
    built = make_services(InlineDispatcher({"local": runtime}), runtime.artifact_store, work_root.parent / "data")
    yield built
    await built.close()


def workspace_dirs(work_root: Path) -> list[Path]:
    return sorted(p for p in work_root.iterdir() if p.name.startswith("ws_"))


@pytest.fixture(scope="session")
def redis_server() -> RedisServer:
    server = RedisServer()
    yield server
    server.stop()


_databases = itertools.cycle(range(1, 64))


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """An empty database of the test Redis server, for one test."""
    url = redis_server.url(next(_databases))
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    return url


@pytest.fixture(scope="session")
def s3_server() -> S3Server:
    """moto's S3 emulator for the session, with test credentials in the environment for boto3's chain."""
    server = S3Server()
    saved = {name: os.environ.get(name) for name in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    yield server
    server.stop()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(params=["file", "s3"])
def artifact_store(request: pytest.FixtureRequest, tmp_path: Path) -> BaseArtifactStore:
    """Each artifact store: a folder, and a new bucket of the S3 emulator."""
    if request.param == "file":
        yield FileArtifactStore(tmp_path / "artifacts")
        return
    store = request.getfixturevalue("s3_server").store()
    yield store
    S3Server.empty(store)
