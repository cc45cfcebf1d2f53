"""Skills' dependency environments over the HTTP API: GET a skill, registration that builds (in this process, or on
a queue worker), per-skill progress, the resolver's message, runs that will not wait, and manifest problems.

Builds are real: uv resolves and installs from a package index of our own (``tests.package_index``), which the
API's environments are pointed at through ``SKILLRUN_ENV_INDEX_URL``.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import redis
from pydantic import ValidationError
from rq import Queue
from rq.job import JobStatus
from rq.serializers import JSONSerializer

from orchestrator.builds import QueuedEnvironments
from orchestrator.config import Settings
from orchestrator.dispatch import InlineDispatcher, QueueDispatcher
from orchestrator.skills import create_default_skill_repository
from tests.conftest import write_skill
from tests.orchestrator.api_helpers import client, make_services, new_team
from tests.orchestrator.test_api_teams import skill_md, tar_gz
from tests.package_index import PackageIndex, sdist
from tests.processes import running_with
from worker.artifacts import FileArtifactStore
from worker.config import get_worker_settings
from worker.jobs.consumer import environments_queue_name
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
IMPORTS_BETA = "python -c 'import beta; print(beta.VERSION)'"
LIBRARY = {
    "tables/SKILL.md": skill_md("tables"),
    "tables/requirements.txt": b"beta\n",
    "plain/SKILL.md": skill_md("plain"),
    "missing/SKILL.md": skill_md("missing"),
    "missing/requirements.txt": b"no-such-package-anywhere\n",
    "wrong/SKILL.md": skill_md("wrong"),
    "wrong/requirements.txt": b"-r other.txt\n",
    "skillrun.toml": b'[skills.ghost]\npython = ["alpha"]\n',
}


@pytest.fixture
def worker_env(index: PackageIndex, work_root: Path, shared_dir: Path, monkeypatch) -> dict[str, str]:
    """The settings builds read, for this process and the workers it starts: our index, the test's work root."""
    env = {"SKILLRUN_ENV_INDEX_URL": index.url, "SKILLRUN_ENV_BUILD_TIMEOUT_SECONDS": "120",
           "SKILLRUN_WORK_ROOT": str(work_root), "SKILLRUN_ARTIFACTS_DIR": str(shared_dir / "artifacts"),
           "SKILLRUN_HEARTBEAT_TTL_SECONDS": "4"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_worker_settings.cache_clear()
    yield env
    get_worker_settings.cache_clear()


@pytest.fixture
async def inline(worker_env, work_root: Path, shared_dir: Path):
    """The embedded default, whose own library (the team sees it until it registers one) has a skill ``tables``."""
    server_library = shared_dir / "server-library"
    write_skill(server_library, "tables", files={"requirements.txt": "beta\n"})
    runtime = LocalWorkspaceRuntime(work_root)
    services = make_services(InlineDispatcher({"local": runtime}), runtime.artifact_store, shared_dir / "data")
    services.repository = create_default_skill_repository(str(server_library), use_cached_repository=True)
    yield services
    await services.close()


async def _until_done(api, library: str, seconds: float = 120) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        report = (await api.get(f"/v1/libraries/{library}/environments")).json()
        if report["done"]:
            return report
        assert time.monotonic() < deadline, report
        await asyncio.sleep(0.2)


def _by_skill(report: dict) -> dict[str, dict]:
    return {entry["skill"]: entry for entry in report["skills"]}


async def _run(api, skill: str, command: str, **fields) -> dict:
    submitted = await api.post("/v1/runs", json={"skill": skill, "command": command, **fields})
    assert submitted.status_code == 202, submitted.text
    return (await api.get(f"/v1/runs/{submitted.json()['id']}", params={"wait": 60})).json()


async def test_registration_builds_each_skills_environment_and_the_skill_shows_it(inline):
    async with client(inline, new_team(inline, "team-a")) as api:
        before = (await api.get("/v1/skills/tables")).json()["environment"]
        assert before["state"] == "not built" and before["python"] == ["beta"], before
        assert before["declared_in"] == ["requirements.txt"] and before["key"] is None
        refused = await api.post("/v1/runs", json={"skill": "tables", "command": "true", "wait_for_environment": False})
        assert refused.status_code == 409, refused.text
        assert "not built yet" in refused.json()["detail"] and "wait_for_environment=true" in refused.json()["detail"]

        registered = await api.post("/v1/libraries/tools/upload", params={"filename": "t.tar.gz"}, content=tar_gz(LIBRARY))
        assert registered.status_code == 201, registered.text
        report = registered.json()["environments"]
        assert report["library"] == "tools" and report["version"] == 1 and not report["done"]
        assert {s: e["state"] for s, e in _by_skill(report).items()} == {
            "missing": "building", "plain": "none", "tables": "building", "wrong": "invalid"}
        assert "pip options such as '-r'" in _by_skill(report)["wrong"]["message"]
        assert report["problems"] == ["skillrun.toml names skills that do not exist: ghost"]

        done = _by_skill(await _until_done(api, "tools"))
        assert done["tables"]["state"] == "ready" and done["tables"]["packages"] == ["alpha==2.0", "beta==1.0"]
        assert done["tables"]["size_bytes"] > 0 and done["tables"]["target"].startswith("local: cpython")
        assert done["missing"]["state"] == "failed"
        assert "no-such-package-anywhere" in done["missing"]["message"], done["missing"]["message"]
        assert "resolving the dependencies failed" in done["missing"]["message"]
        shown = (await api.get("/v1/skills/tables")).json()["environment"]
        assert shown["state"] == "ready" and shown["key"] == done["tables"]["key"]

        ran = await _run(api, "tables", IMPORTS_BETA, wait_for_environment=False)
        assert ran["status"] == "finished" and ran["result"]["stdout"] == "2.0\n", ran
        failed = await _run(api, "missing", "true")  # it waits, but the build failed a moment ago: it fails, saying why
        assert failed["status"] == "failed" and "no-such-package-anywhere" in failed["error"], failed
        refused = await api.post("/v1/runs", json={"skill": "missing", "command": "true", "wait_for_environment": False})
        assert refused.status_code == 409 and "building its dependency environment failed" in refused.json()["detail"]
        assert (await api.get("/v1/libraries/tools/environments", params={"version": 2})).status_code == 404


async def test_a_manifest_that_cannot_be_read_is_a_problem_of_the_registration_not_a_crash(inline):
    files = {**LIBRARY, "skillrun.toml": b"[skills.tables\npython = 1\n"}
    async with client(inline, new_team(inline, "team-a")) as api:
        registered = await api.post("/v1/libraries/torn/upload", params={"filename": "t.tar.gz"}, content=tar_gz(files))
        assert registered.status_code == 201, registered.text
        report = registered.json()["environments"]
    assert report["problems"][0].startswith("skillrun.toml: not valid TOML"), report["problems"]
    assert report["done"] and all(entry["state"] == "invalid" for entry in report["skills"]), report


async def test_closing_the_api_stops_a_build_under_way(worker_env, work_root: Path, shared_dir: Path, dists: Path):
    marker = f"{3000 + random.random():.9f}"
    sdist(dists, "endless", "1.0", f'import subprocess\nsubprocess.run(["sleep", "{marker}"])\n')
    runtime = LocalWorkspaceRuntime(work_root)
    services = make_services(InlineDispatcher({"local": runtime}), runtime.artifact_store, shared_dir / "data")
    files = {"slow/SKILL.md": skill_md("slow"), "slow/requirements.txt": b"endless\n"}
    async with client(services, new_team(services, "team-a")) as api:
        registered = await api.post("/v1/libraries/slow/upload", params={"filename": "s.tar.gz"}, content=tar_gz(files))
        assert registered.status_code == 201, registered.text
        deadline = time.monotonic() + 60
        while not running_with(marker):
            assert time.monotonic() < deadline, (await api.get("/v1/libraries/slow/environments")).json()
            await asyncio.sleep(0.1)
        building = _by_skill((await api.get("/v1/libraries/slow/environments")).json())["slow"]
        assert building["state"] == "building" and building["message"].startswith("installing"), building
    await services.close()
    assert running_with(marker) == [], "the build outlived the API"


def _burst(url: str, env: dict[str, str]) -> None:
    """Drain the local runtime's queues (runs, then environment preparations) with one worker process."""
    subprocess.run([sys.executable, "-m", "worker", "--redis-url", url, "--burst", "--runtime", "local"],
                   env={**os.environ, **env}, cwd=REPO, check=True, timeout=240)


@pytest.mark.timeout(300)
async def test_on_the_queue_a_worker_builds_each_version_once_and_the_api_reads_the_shared_store(
    redis_url: str, worker_env: dict[str, str], shared_dir: Path
):
    services = make_services(QueueDispatcher(redis_url), FileArtifactStore(shared_dir / "artifacts"), shared_dir / "data")
    preparations = Queue(environments_queue_name("local"), connection=redis.Redis.from_url(redis_url),
                         serializer=JSONSerializer)
    try:
        async with client(services, new_team(services, "team-a")) as api:
            upload = tar_gz(LIBRARY)
            first = await api.post("/v1/libraries/tools/upload", params={"filename": "t.tar.gz"}, content=upload)
            again = await api.post("/v1/libraries/tools/upload", params={"filename": "t.tar.gz"}, content=upload)
            assert first.status_code == again.status_code == 201, first.text
            assert again.json()["current"] == 1 and preparations.count == 1, "one version, one preparation job"
            queued = _by_skill(again.json()["environments"])
            assert queued["tables"]["state"] == "building" and queued["tables"]["message"] == "waiting for a worker"
            refused = await api.post("/v1/runs", json={"skill": "tables", "command": "true", "wait_for_environment": False})
            assert refused.status_code == 409 and "being built (waiting for a worker)" in refused.json()["detail"]

            await asyncio.to_thread(_burst, redis_url, worker_env)
            done = _by_skill(await _until_done(api, "tools", seconds=5))
            assert done["tables"]["state"] == "ready" and done["tables"]["packages"] == ["alpha==2.0", "beta==1.0"]
            assert done["missing"]["state"] == "failed" and "no-such-package-anywhere" in done["missing"]["message"]
            assert (await api.get("/v1/skills/tables")).json()["environment"]["key"] == done["tables"]["key"]

            ready = await api.post("/v1/runs", json={"skill": "tables", "command": IMPORTS_BETA, "wait_for_environment": False})
            failing = await api.post("/v1/runs", json={"skill": "missing", "command": "true"})
            assert ready.status_code == failing.status_code == 202, ready.text + failing.text
            await asyncio.to_thread(_burst, redis_url, worker_env)
            ran = (await api.get(f"/v1/runs/{ready.json()['id']}", params={"wait": 5})).json()
            assert ran["status"] == "finished" and ran["result"]["stdout"] == "2.0\n", ran
            failed = (await api.get(f"/v1/runs/{failing.json()['id']}", params={"wait": 5})).json()
            assert failed["status"] == "failed" and "no-such-package-anywhere" in failed["error"], failed
    finally:
        preparations.connection.close()
        await services.close()


async def test_a_preparation_whose_worker_died_is_reported_and_queued_again_by_the_next_registration(
    redis_url: str, worker_env: dict[str, str], shared_dir: Path
):
    services = make_services(QueueDispatcher(redis_url), FileArtifactStore(shared_dir / "artifacts"), shared_dir / "data")
    connection = redis.Redis.from_url(redis_url)
    preparations = Queue(environments_queue_name("local"), connection=connection, serializer=JSONSerializer)
    try:
        async with client(services, new_team(services, "team-a")) as api:
            upload = tar_gz(LIBRARY)
            assert (await api.post("/v1/libraries/tools/upload", content=upload)).status_code == 201
            (job,) = preparations.get_jobs()
            preparations.remove(job)  # taken by a worker that died at once: started long ago, no heartbeat
            job.set_status(JobStatus.STARTED)
            job.started_at = datetime.now(timezone.utc) - timedelta(minutes=5)
            job.save()
            lost = _by_skill((await api.get("/v1/libraries/tools/environments")).json())["tables"]
            assert lost["state"] == "failed" and "its worker stopped" in lost["message"], lost
            again = _by_skill((await api.post("/v1/libraries/tools/upload", content=upload)).json()["environments"])
            assert again["tables"]["state"] == "building" and again["tables"]["message"] == "waiting for a worker"
            assert preparations.count == 1
    finally:
        connection.close()
        await services.close()


def test_the_runtimes_to_prepare_are_a_checked_setting():
    assert Settings(prepare_runtimes="docker, local,docker").runtimes_to_prepare() == ["docker", "local"]
    assert Settings().runtimes_to_prepare() == ["local"]
    with pytest.raises(ValidationError, match="must be some of local, docker"):
        Settings(prepare_runtimes="local,cube")


def test_before_a_docker_worker_recorded_its_target_a_skills_docker_environment_is_not_built(
    worker_env, shared_dir: Path
):
    lib = shared_dir / "lib"
    tables, plain = write_skill(lib, "tables", files={"requirements.txt": "beta\n"}), write_skill(lib, "plain")
    # no Redis call: statuses read the store
    environments = QueuedEnvironments(redis.Redis(), ["local", "docker"], workers=get_worker_settings())
    waiting = environments.status("docker", lib, tables, "tables")
    assert waiting.state == "not built" and "no Docker worker has built" in waiting.message
    assert environments.status("docker", lib, plain, "plain").state == "none"
