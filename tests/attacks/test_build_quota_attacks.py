"""Environment builds against the team's quota (issue 30, finding 10): before the fix the builds a library
registration starts were outside every quota, so a team could keep the builders busy with as many library versions
as it could upload. Now each build (one per library version and runtime) takes a place of the team's ``max_builds``
when it starts: a registration that would take one more is refused with 429 (what was exceeded, ``Retry-After``),
nothing of it registered, kept or enqueued; another team is not affected; a build that ends — finished, failed, its
job cancelled — frees its place. In this process (the embedded default) and over Redis, where two API processes
racing for a team's last place let exactly one registration in.

Builds are real: uv installs from a package index of our own (``tests.package_index``); on the queue a worker
process builds (``_burst``).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path

import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from orchestrator.builds import BUILDS_KEY
from orchestrator.config import DEFAULT_TEAM_MAX_BUILDS, Settings
from orchestrator.dispatch import InlineDispatcher, QueueDispatcher
from orchestrator.documents import FileDocuments, RedisDocuments
from orchestrator.quotas import BUILD_RETRY_AFTER_SECONDS, Quotas, TeamQuota
from tests.orchestrator.api_helpers import client, make_services, new_team
from tests.orchestrator.test_api_environments import _burst, _until_done, worker_env  # noqa: F401 - fixture
from tests.orchestrator.test_api_teams import skill_md, tar_gz
from tests.package_index import sdist
from tests.processes import running_with
from worker.artifacts import FileArtifactStore
from worker.jobs.consumer import environments_queue_name
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

pytestmark = pytest.mark.slow

HANG_GUARD = 120.0
"""Seconds a wait may take before the test says what never happened (a guard against hangs, not a measure)."""


def needing(package: str, name: str = "tables") -> bytes:
    """A library whose one skill ``name`` needs ``package`` (so registering it starts a build)."""
    return tar_gz({f"{name}/SKILL.md": skill_md(name), f"{name}/requirements.txt": f"{package}\n".encode()})


PLAIN = tar_gz({"plain/SKILL.md": skill_md("plain")})
"""A library that needs no build."""


def stored(data_dir: Path) -> list[str]:
    """What the libraries folder holds: the versions' folders and the kept archives."""
    folder = data_dir / "libraries"
    return sorted(str(p.relative_to(folder)) for p in folder.glob("*/*") if p.parent.name == "archives") + \
        sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name != "archives")


async def upload(api, name: str, archive: bytes):
    return await api.post(f"/v1/libraries/{name}/upload", params={"filename": "l.tar.gz"}, content=archive)


def assert_refused(answer, held: int, limit: int) -> None:
    assert answer.status_code == 429, (answer.status_code, answer.text)
    assert answer.headers["Retry-After"] == str(BUILD_RETRY_AFTER_SECONDS)
    detail = answer.json()["detail"]
    assert "max_builds" in detail and f"has {held} environment builds" in detail and f"({limit})" in detail, detail


async def until(check, what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


def test_the_operators_default_holds_builds_to_a_quota_that_leaves_room_for_single_team_work():
    assert Settings().default_quota().max_builds == DEFAULT_TEAM_MAX_BUILDS >= 2
    assert TeamQuota(max_builds=3).over(Settings().default_quota()).max_builds == 3


# ---- in this process (the embedded default) ---------------------------------------------------------------------

@pytest.fixture
async def inline(worker_env, work_root: Path, shared_dir: Path):  # noqa: F811
    """The embedded default with a quota of one build per team."""
    runtime = LocalWorkspaceRuntime(work_root)
    services = make_services(InlineDispatcher({"local": runtime}), runtime.artifact_store, shared_dir / "data")
    services.dispatcher.quotas = Quotas(FileDocuments(shared_dir / "data" / "registry"), TeamQuota(max_builds=1))
    yield services
    await services.close()


@pytest.mark.timeout(300)
async def test_inline_a_team_at_its_quota_of_builds_cannot_start_one_and_a_build_that_ends_frees_its_place(
        inline, dists: Path, shared_dir: Path):
    marker = f"{3000 + random.random():.9f}"
    sdist(dists, "endless", "1.0", f'import subprocess\nsubprocess.run(["sleep", "{marker}"])\n')
    data = shared_dir / "data"
    async with client(inline, new_team(inline, "team-a")) as a, client(inline, new_team(inline, "team-b")) as b:
        assert (await upload(a, "slow", needing("endless", "slow"))).status_code == 201
        before = stored(data)

        assert_refused(await upload(a, "tables", needing("beta")), held=1, limit=1)
        assert_refused(await upload(a, "slow", needing("alpha", "slow")), held=1, limit=1)  # a new version too
        assert (await a.get("/v1/quota")).json()["usage"]["builds"] == 1
        assert [lib["name"] for lib in (await a.get("/v1/libraries")).json()] == ["slow"]
        assert stored(data) == before, "a refused version left its folder or archive behind"
        assert inline.environments.builds("team-a") == 1
        assert (await upload(a, "plain", PLAIN)).status_code == 201  # it starts no build: no place needed

        assert (await upload(b, "tables", needing("beta"))).status_code == 201  # another team: its own places
        assert (await b.get("/v1/quota")).json()["usage"]["builds"] == 1
        done = await _until_done(b, "tables", seconds=HANG_GUARD)  # finished: its place is free again
        assert done["skills"][0]["state"] == "ready", done
        assert (await b.get("/v1/quota")).json()["usage"]["builds"] == 0

        (pid,) = running_with(marker)  # team-a's build fails (its installer killed): its place is free again
        os.kill(pid, signal.SIGKILL)

        async def freed() -> bool:
            return (await a.get("/v1/quota")).json()["usage"]["builds"] == 0

        await until(freed, "the failed build kept its place")
        again = await upload(a, "tables", needing("beta"))
        assert again.status_code == 201, again.text
        assert (await _until_done(a, "tables", seconds=HANG_GUARD))["skills"][0]["state"] == "ready"


async def test_inline_registrations_racing_for_a_teams_last_place_let_exactly_one_in(inline, dists: Path):
    marker = f"{3000 + random.random():.9f}"
    sdist(dists, "endless", "1.0", f'import subprocess\nsubprocess.run(["sleep", "{marker}"])\n')
    async with client(inline, new_team(inline, "team-a")) as a:
        # Each its own requirement set, so each needs a build of its own: with one set, a registration that comes
        # once the first build is resolving finds that environment under way and needs no build (nor a place)
        answers = await asyncio.gather(*(upload(a, f"lib{i}", needing(f"endless>=0.{i}", f"skill{i}"))
                                         for i in range(6)))
        codes = sorted(answer.status_code for answer in answers)
        assert codes == [201] + [429] * 5, [answer.text[:200] for answer in answers]
        assert len((await a.get("/v1/libraries")).json()) == 1
        assert inline.environments.builds("team-a") == 1


# ---- over Redis (builds queued for workers) ---------------------------------------------------------------------

def queue_services(redis_url: str, shared_dir: Path, quota: TeamQuota):
    """An API process over the queue, with teams and quotas in Redis."""
    documents = RedisDocuments(redis_url)
    dispatcher = QueueDispatcher(redis_url)
    dispatcher.quotas = Quotas(documents, quota)
    return make_services(dispatcher, FileArtifactStore(shared_dir / "artifacts"), shared_dir / "data",
                         documents=documents)


@pytest.fixture
async def queued(redis_url: str, worker_env, shared_dir: Path):  # noqa: F811
    services = queue_services(redis_url, shared_dir, TeamQuota(max_builds=1))
    yield services
    await services.close()


@pytest.fixture
def preparations(redis_url: str):
    queue = Queue(environments_queue_name("local"), connection=redis.Redis.from_url(redis_url),
                  serializer=JSONSerializer)
    yield queue
    queue.connection.close()


@pytest.mark.timeout(300)
async def test_on_the_queue_a_team_at_its_quota_of_builds_enqueues_nothing_and_a_finished_build_frees_its_place(
        queued, preparations, redis_url: str, worker_env: dict[str, str], shared_dir: Path):  # noqa: F811
    data = shared_dir / "data"
    async with client(queued, new_team(queued, "team-a")) as a, client(queued, new_team(queued, "team-b")) as b:
        assert (await upload(a, "tables", needing("beta"))).status_code == 201
        assert preparations.count == 1
        before = stored(data)

        assert_refused(await upload(a, "other", needing("alpha", "other")), held=1, limit=1)
        assert preparations.count == 1, "a refused build was enqueued"
        assert (await a.get("/v1/quota")).json()["usage"]["builds"] == 1
        assert [lib["name"] for lib in (await a.get("/v1/libraries")).json()] == ["tables"]
        assert stored(data) == before, "a refused version left its folder or archive behind"

        assert (await upload(b, "other", needing("alpha", "other"))).status_code == 201  # another team is served
        assert preparations.count == 2

        await asyncio.to_thread(_burst, redis_url, worker_env)  # a worker builds both: their places are free
        assert (await _until_done(a, "tables", seconds=5))["skills"][0]["state"] == "ready"
        assert (await a.get("/v1/quota")).json()["usage"]["builds"] == 0
        assert (await b.get("/v1/quota")).json()["usage"]["builds"] == 0
        again = await upload(a, "other", needing("alpha", "other"))
        assert again.status_code == 201, again.text


async def test_on_the_queue_a_cancelled_or_lost_build_frees_its_place(queued, preparations, redis_url: str):
    connection = redis.Redis.from_url(redis_url)
    try:
        async with client(queued, new_team(queued, "team-a")) as a:
            assert (await upload(a, "tables", needing("beta"))).status_code == 201
            (job,) = preparations.get_jobs()
            job.cancel()  # the operator cancels it (or it failed: any status but queued and started)
            assert (await a.get("/v1/quota")).json()["usage"]["builds"] == 0
            assert (await upload(a, "other", needing("alpha", "other"))).status_code == 201
            (job,) = preparations.get_jobs()
            connection.delete(job.key)  # its record is gone (expired, or Redis lost it)
            assert (await upload(a, "third", needing("beta", "third"))).status_code == 201
            assert connection.zcard(BUILDS_KEY.format("team-a")) == 1
    finally:
        connection.close()


async def test_on_the_queue_two_api_processes_racing_for_a_teams_last_place_let_exactly_one_in(
        queued, preparations, redis_url: str, shared_dir: Path):
    other = queue_services(redis_url, shared_dir, TeamQuota(max_builds=1))  # its own connections, its own cache
    try:
        key = new_team(queued, "team-a")
        async with client(queued, key) as first, client(other, key) as second:
            answers = await asyncio.gather(*((first if i % 2 else second).post(
                f"/v1/libraries/lib{i}/upload", params={"filename": "l.tar.gz"},
                content=needing("beta", f"skill{i}")) for i in range(8)))
        codes = sorted(answer.status_code for answer in answers)
        assert codes == [201] + [429] * 7, [answer.text[:200] for answer in answers]
        assert preparations.count == 1
        assert len(queued.libraries.list("team-a")) == 1
    finally:
        await other.close()
