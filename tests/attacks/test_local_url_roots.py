"""A tenant that makes the URL-root cache evict cannot take a library away from another tenant's run in flight.

A local run's staged skill links into its library's folder in the cache (``SKILLS_CACHE_DIR``); the cache is bounded
(``SKILLRUN_URL_CACHE_BYTES``) and each new library fetched evicts the least recently used. A hostile team runs
skills of libraries of its own on the same worker, each fetch pushing the cache past its bound (here one byte:
everything not in use goes), while the victim's run waits half-way through; the victim's run must go on reading its
staged files. The local runtime holds the run's cache entry for the whole run (``HostWorkspaceRuntime._holding_root``,
``worker.roots.library_fetch.skill_root_in_use``), as the Docker runtime does. As root, for real.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import tarfile

import pytest

from tests.file_server import FileServer
from worker.config import get_worker_settings
from worker.contract import RunRequest, SkillRef
from worker.roots.cache import evict
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

pytestmark = pytest.mark.root

HANG_GUARD_SECONDS = 60.0
ATTACKER_LIBRARIES = 4
VICTIM = (
    "touch $WORK_DIR/started; until [ -e $WORK_DIR/go ]; do sleep 0.02; done; "
    "bash scripts/run.sh; head -1 SKILL.md; cat data.txt"
)


def library(name: str, data: bytes) -> bytes:
    """A library archive with one skill, ``name``, that has a script and a data file."""
    files = {
        f"lib/{name}/SKILL.md": f"---\nname: {name}\ndescription: The {name} skill.\n---\nDo things.\n".encode(),
        f"lib/{name}/scripts/run.sh": b"echo ran\n",
        f"lib/{name}/data.txt": data,
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path, content in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(content), 0o644
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


@pytest.fixture
def server() -> FileServer:
    served = FileServer().start()
    yield served
    served.stop()


@pytest.fixture
def cache(shared_dir, monkeypatch):
    """A URL-root cache that workspace users can reach (so staged skills link into it, not copy it) and whose bound
    is one byte: every fetch evicts every entry no run holds."""
    folder = shared_dir / "url-cache"
    monkeypatch.setenv("SKILLS_CACHE_DIR", str(folder))
    monkeypatch.setenv("SKILLRUN_URL_CACHE_BYTES", "1")
    get_worker_settings.cache_clear()
    yield folder
    get_worker_settings.cache_clear()


def skill_of(server: FileServer, name: str, data: bytes) -> SkillRef:
    archive = library(name, data)
    url = server.add(f"/{name}.tar.gz", archive)
    return SkillRef(name=name, root=url, path=f"lib/{name}", digest=hashlib.sha256(archive).hexdigest())


async def test_another_tenants_fetches_cannot_evict_a_library_under_a_running_run(work_root, server, cache):
    victim = skill_of(server, "victim-skill", b"the victim's data\n")
    async with LocalWorkspaceRuntime(work_root) as runtime:
        running = asyncio.create_task(runtime.run(RunRequest(skill=victim, command=VICTIM, workspace_id="victim")))

        async def started() -> None:
            while (workspace := runtime.workspaces.find("victim")) is None or \
                    not (workspace.work_dir / "started").exists():
                await asyncio.sleep(0.02)

        await asyncio.wait_for(started(), HANG_GUARD_SECONDS)
        for n in range(ATTACKER_LIBRARIES):  # each fetch evicts all it can: the bound is one byte
            theirs = skill_of(server, f"attacker-{n}", b"x" * 4096)
            result = await runtime.run(RunRequest(skill=theirs, command="cat data.txt | wc -c",
                                                  workspace_id=f"attacker-{n}"))
            assert result.stdout.strip() == "4096", result.stderr
        assert victim.digest not in evict(cache, 1), "a forced eviction removed the library of a run in flight"
        (runtime.workspaces.find("victim").work_dir / "go").touch()
        result = await asyncio.wait_for(running, HANG_GUARD_SECONDS)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "ran\n---\nthe victim's data\n", result.stdout
    assert victim.digest in evict(cache, 1), "the library stayed held after its run ended"
