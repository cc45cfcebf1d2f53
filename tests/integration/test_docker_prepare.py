"""Preparing the Docker runtime's environments ahead of runs, on a real engine: ``skillrun skills prepare --runtime
docker`` (environment and derived image; bad inputs report the resolver's and apt's messages), a run while its
environment is being rebuilt, and library registration in queue mode with a Docker worker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from orchestrator.config import get_settings
from orchestrator.dispatch import InlineDispatcher, QueueDispatcher
from tests.conftest import IS_ROOT, write_skill
from tests.orchestrator.api_helpers import client, make_services, new_team
from tests.orchestrator.test_api_environments import _until_done
from tests.orchestrator.test_api_teams import skill_md, tar_gz
from tests.package_index import PackageIndex, sdist
from worker.artifacts import FileArtifactStore
from worker.config import get_worker_settings
from worker.jobs.consumer import environments_queue_name
from worker.contract import RunRequest, SkillRef
from worker.environments import BuildSettings
from worker.errors import EnvironmentNotReadyError

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
IMPORTS_BETA_AND_JQ = "python -c 'import beta; print(beta.VERSION)'; jq --version"


@pytest.fixture
def make_runtime(docker_runtime_factory, index: PackageIndex):
    """Docker runtimes building from our index and trusting the CA bundle the CLI's builds trust (the derived
    images' tags depend on it); the first one's work root is ``work_root/docker-0``."""
    def make(**fields):
        settings = BuildSettings(**{"index_url": index.url, "sandboxed": IS_ROOT, "timeout": 120.0,
                                    "ca_bundle": CA_BUNDLE, **fields})
        return docker_runtime_factory(build_settings=settings)

    return make


@pytest.fixture
def lib(shared_dir: Path) -> Path:
    return shared_dir / "lib"


@pytest.fixture
def cli(shared_dir: Path, work_root: Path, index: PackageIndex, lib: Path):
    """``skillrun <args> --runtime docker`` as a process, on the first Docker runtime's work root."""
    def run(*args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SKILLRUN_", "SKILLS_"))}
        env.update(SKILLRUN_ENV_INDEX_URL=index.url, SKILLRUN_ENV_CA_BUNDLE=CA_BUNDLE, SKILLS_ROOT=str(lib))
        return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args, "--runtime", "docker", "--work-root",
                               str(work_root / "docker-0")], capture_output=True, text=True, env=env, timeout=400,
                              cwd=str(shared_dir))

    return run


@pytest.mark.timeout(400)
async def test_prepare_for_docker_builds_the_environment_and_image_that_a_run_then_uses_without_a_build(
    cli, lib: Path, make_runtime, docker_engine, derived_images
):
    write_skill(lib, "tables", files={"requirements.txt": "beta\n"})
    (lib / "skillrun.toml").write_text('[skills.tables]\ndebian = ["jq"]\n')
    before = json.loads(cli("skills", "show", "tables", "--json").stdout)["environment"]
    assert before["state"] == "not built" and before["image"]["state"] == "not built", before

    done = cli("skills", "prepare", "tables")
    assert done.returncode == 0, done.stderr
    assert "[1/1] tables: installing 2 package(s)" in done.stderr, done.stderr
    assert "[1/1] tables: building the sandbox image with the Debian packages jq" in done.stderr
    assert done.stdout.splitlines()[1].split()[:2] == ["tables", "ready"], done.stdout
    report = json.loads(cli("skills", "prepare", "tables", "--json").stdout)  # ready: nothing to build
    (entry,) = report["skills"]
    assert report["runtime"] == "docker" and entry["state"] == "ready", entry
    assert entry["target"].startswith("docker: cpython") and entry["packages"] == ["alpha==2.0", "beta==1.0"]
    assert entry["image"]["state"] == "ready" and entry["image"]["packages"] == ["jq"]
    image_id = docker_engine.client.images.get(entry["image"]["tag"]).id

    runtime = make_runtime()  # the same work root, so the same store as the command's
    (info,) = runtime.environments.store.list()
    result = await runtime.run(RunRequest(skill=SkillRef(name="tables", root=str(lib), path="tables"),
                                          workspace_id="prep", command=IMPORTS_BETA_AND_JQ, wait_for_environment=False))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("2.0\njq-"), result.stdout
    assert runtime.container_id("prep", entry["image"]["tag"]) is not None, "not run in the derived image"
    assert [(i.key, i.built_at) for i in runtime.environments.store.list()] == [(entry["key"], info.built_at)], \
        "the run built again"
    assert docker_engine.client.images.get(entry["image"]["tag"]).id == image_id

    shown = cli("skills", "show", "tables")
    assert "environment (docker)" in shown.stdout and "ready: 2 packages" in shown.stdout, shown.stdout
    assert "Debian packages: image ready" in shown.stdout


@pytest.mark.timeout(400)
def test_prepare_for_docker_reports_the_resolvers_and_apts_messages(cli, lib: Path, derived_images):
    write_skill(lib, "missing", files={"requirements.txt": "no-such-package-anywhere\n"})
    write_skill(lib, "torn", files={"requirements.txt": "alpha<2\n"})
    write_skill(lib, "ghost")
    (lib / "skillrun.toml").write_text(
        '[skills.torn]\npython = ["alpha>=2"]\n\n[skills.ghost]\ndebian = ["no-such-package-skillrun"]\n'
    )
    done = cli("skills", "prepare", "--json")
    assert done.returncode == 1, done.stderr
    by_skill = {entry["skill"]: entry for entry in json.loads(done.stdout)["skills"]}
    missing, torn, ghost = by_skill["missing"], by_skill["torn"], by_skill["ghost"]
    assert missing["state"] == "failed" and "resolving the dependencies failed" in missing["message"], missing
    assert "no-such-package-anywhere" in missing["message"]
    assert torn["state"] == "failed" and "alpha<2" in torn["message"] and "alpha>=2" in torn["message"], torn
    assert ghost["state"] == "failed" and ghost["image"]["state"] == "failed", ghost
    assert "Unable to locate package no-such-package-skillrun" in ghost["message"], ghost["message"]

    text = cli("skills", "prepare", "missing")
    assert text.returncode == 1 and "no-such-package-anywhere" in text.stderr, text.stderr


async def test_a_run_while_its_environment_is_being_rebuilt_waits_or_is_told_so(
    make_runtime, lib: Path, dists: Path
):
    sdist(dists, "slow", "1.0", "import time\ntime.sleep(4)\n")
    skill = write_skill(lib, "s", files={"requirements.txt": "slow\n"})
    ref = SkillRef(name="s", root=str(lib), path="s")
    runtime = make_runtime()
    store = runtime.environments.store
    first = await runtime.prepare_environment(skill, lib, "s")
    assert first.state == "ready", first.message
    store.remove(first.info.key)  # an operator's prune: the next build builds it again

    rebuilding = asyncio.ensure_future(runtime.prepare_environment(skill, lib, "s"))
    deadline = time.monotonic() + 60
    while (await asyncio.to_thread(runtime.environment_status, skill, lib, "s")).state != "building":
        assert time.monotonic() < deadline and not rebuilding.done(), "the rebuild was never seen under way"
        await asyncio.sleep(0.05)
    with pytest.raises(EnvironmentNotReadyError, match="is being built"):
        await runtime.run(RunRequest(skill=ref, command="true", wait_for_environment=False))
    waited = await runtime.run(RunRequest(skill=ref, command="python -c 'import slow, sys; print(slow.BUILT, sys.prefix)'"))
    rebuilt = await rebuilding
    assert rebuilt.state == "ready" and rebuilt.info.key == first.info.key
    assert waited.exit_code == 0 and waited.stdout.split() == ["True", str(rebuilt.info.path)], waited.stderr
    assert [info.built_at for info in store.list()] == [rebuilt.info.built_at], "built twice"
    assert list(store.building.iterdir()) == [], "a build folder outlived its build"


@pytest.fixture
def queue_env(index: PackageIndex, work_root: Path, shared_dir: Path, monkeypatch) -> dict[str, str]:
    """Settings of the API (this process) and of the workers it starts: both runtimes prepared, our index."""
    env = {"SKILLRUN_ENV_INDEX_URL": index.url, "SKILLRUN_ENV_BUILD_TIMEOUT_SECONDS": "120",
           "SKILLRUN_ENV_CA_BUNDLE": CA_BUNDLE, "SKILLRUN_WORK_ROOT": str(work_root),
           "SKILLRUN_ARTIFACTS_DIR": str(shared_dir / "artifacts"), "SKILLRUN_HEARTBEAT_TTL_SECONDS": "4",
           "SKILLRUN_PREPARE_RUNTIMES": "local,docker"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_worker_settings.cache_clear()
    get_settings.cache_clear()
    yield env
    get_worker_settings.cache_clear()
    get_settings.cache_clear()


def _burst(url: str, env: dict[str, str], runtime: str) -> None:
    subprocess.run([sys.executable, "-m", "worker", "--redis-url", url, "--burst", "--runtime", runtime],
                   env={**os.environ, **env}, cwd=REPO, check=True, timeout=400)


@pytest.mark.timeout(300)
async def test_registration_in_queue_mode_has_a_docker_worker_prepare_the_docker_environments(
    redis_url: str, queue_env: dict[str, str], shared_dir: Path, derived_images
):
    services = make_services(QueueDispatcher(redis_url), FileArtifactStore(shared_dir / "artifacts"), shared_dir / "data")
    connection = redis.Redis.from_url(redis_url)
    docker_jobs = Queue(environments_queue_name("docker"), connection=connection, serializer=JSONSerializer)
    files = {"tables/SKILL.md": skill_md("tables"), "tables/requirements.txt": b"beta\n",
             "plain/SKILL.md": skill_md("plain"), "skillrun.toml": b'[skills.tables]\ndebian = ["jq"]\n'}
    try:
        async with client(services, new_team(services, "team-a")) as api:
            registered = await api.post("/v1/libraries/tools/upload", params={"filename": "t.tar.gz"},
                                        content=tar_gz(files))
            assert registered.status_code == 201, registered.text
            queued = {(e["runtime"], e["skill"]): e for e in registered.json()["environments"]["skills"]}
            assert [key[0] for key in queued] == ["local", "local", "docker", "docker"]
            assert queued[("docker", "tables")]["state"] == "building", queued
            assert queued[("docker", "tables")]["message"] == "waiting for a worker"
            assert queued[("docker", "plain")]["state"] == "none" and docker_jobs.count == 1

            await asyncio.to_thread(_burst, redis_url, queue_env, "docker")
            report = (await api.get("/v1/libraries/tools/environments")).json()
            entries = {(e["runtime"], e["skill"]): e for e in report["skills"]}
            docker = entries[("docker", "tables")]
            assert docker["state"] == "ready", docker
            assert docker["packages"] == ["alpha==2.0", "beta==1.0"] and docker["target"].startswith("docker: cpython")
            assert docker["image"]["state"] == "ready" and docker["image"]["packages"] == ["jq"]
            assert entries[("local", "tables")]["state"] == "building" and not report["done"], "no local worker ran"

            await asyncio.to_thread(_burst, redis_url, queue_env, "local")
            shown = (await api.get("/v1/skills/tables")).json()
            assert [(e["runtime"], e["state"]) for e in shown["environments"]] == [("local", "ready"), ("docker", "ready")]
            assert shown["environment"]["runtime"] == "local" and shown["environments"][1]["key"] == docker["key"]

            run = await api.post("/v1/runs", json={"skill": "tables", "command": IMPORTS_BETA_AND_JQ,
                                                   "runtime": "docker", "wait_for_environment": False})
            assert run.status_code == 202, run.text
            await asyncio.to_thread(_burst, redis_url, queue_env, "docker")
            ran = (await api.get(f"/v1/runs/{run.json()['id']}", params={"wait": 5})).json()
            assert ran["status"] == "finished" and ran["result"]["stdout"].startswith("2.0\njq-"), ran
    finally:
        connection.close()
        await services.close()


@pytest.mark.timeout(400)
async def test_registration_in_the_embedded_default_prepares_the_docker_environments_through_the_runtime(
    make_runtime, shared_dir: Path, monkeypatch, derived_images
):
    monkeypatch.setenv("SKILLRUN_PREPARE_RUNTIMES", "docker")
    get_settings.cache_clear()
    runtime = make_runtime()
    services = make_services(InlineDispatcher({"docker": runtime}), runtime.artifact_store, shared_dir / "data")
    files = {"tables/SKILL.md": skill_md("tables"), "tables/requirements.txt": b"beta\n",
             "skillrun.toml": b'[skills.tables]\ndebian = ["jq"]\n'}
    try:
        async with client(services, new_team(services, "team-a")) as api:
            registered = await api.post("/v1/libraries/tools/upload", params={"filename": "t.tar.gz"},
                                        content=tar_gz(files))
            assert registered.status_code == 201, registered.text
            (queued,) = registered.json()["environments"]["skills"]
            assert queued["runtime"] == "docker" and queued["state"] == "building", queued
            early = await api.post("/v1/runs", json={"skill": "tables", "command": "true", "runtime": "docker",
                                                     "wait_for_environment": False})
            assert early.status_code == 409 and "wait_for_environment=true" in early.json()["detail"], early.text
            (done,) = (await _until_done(api, "tools", seconds=300))["skills"]
            assert done["state"] == "ready" and done["image"]["state"] == "ready", done
            shown = (await api.get("/v1/skills/tables")).json()
            assert shown["environment"]["runtime"] == "docker" and shown["environment"]["key"] == done["key"]
            run = await api.post("/v1/runs", json={"skill": "tables", "command": IMPORTS_BETA_AND_JQ,
                                                   "runtime": "docker", "wait_for_environment": False})
            ran = (await api.get(f"/v1/runs/{run.json()['id']}", params={"wait": 60})).json()
            assert ran["status"] == "finished" and ran["result"]["stdout"].startswith("2.0\njq-"), ran
    finally:
        await services.close()
        get_settings.cache_clear()
