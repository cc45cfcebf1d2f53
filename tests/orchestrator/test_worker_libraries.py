"""Library versions travel by digest: the API serves a version's archive to workers (their token only), and a worker
on a host without the API's libraries folder fetches it, checks it and caches it; refusals, stalls and wrong bytes
fail the run with the reason and leave nothing in the cache."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from orchestrator.services import Services
from tests.file_server import FileServer
from tests.orchestrator.api_helpers import api_in_a_thread, client, new_team
from tests.orchestrator.test_api_teams import V1, skill_md, tar_gz
from worker.config import get_worker_settings
from worker.contract import RunRequest, SkillRef
from worker.roots.library_fetch import LIBRARY_ROUTE
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

TOKEN = "worker-token-" + "k" * 32
SHA_V1 = hashlib.sha256(V1).hexdigest()


@pytest.fixture
def server():
    srv = FileServer().start()
    yield srv
    srv.stop()


@pytest.fixture
def elsewhere(shared_dir, monkeypatch):
    """A worker's settings on another host: its own URL-root cache, the API's address and token given by the test."""
    cache = shared_dir / "worker-cache"
    monkeypatch.setenv("SKILLS_CACHE_DIR", str(cache))

    def configure(api_url: str | None, token: str | None = TOKEN, fetch_seconds: float | None = None) -> Path:
        for name, value in (("SKILLRUN_API_URL", api_url), ("SKILLRUN_WORKER_TOKEN", token),
                            ("SKILLRUN_LIBRARY_FETCH_SECONDS", None if fetch_seconds is None else str(fetch_seconds))):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        get_worker_settings.cache_clear()
        return cache

    yield configure
    get_worker_settings.cache_clear()


def _far_ref(digest: str = SHA_V1) -> SkillRef:
    """The skill as the API names it, seen from a host where the API's libraries folder does not exist."""
    return SkillRef(name="team-skill", root=f"/srv/api-host/libraries/{digest}", path="team-skill", digest=digest)


def _cache_entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name != "urls") if cache.exists() else []


async def _register_v1(services: Services) -> str:
    key = new_team(services, "team-a")
    async with client(services, key) as c:
        response = await c.post("/v1/libraries/main/upload", params={"filename": "v1.tgz"}, content=V1)
        assert response.status_code == 201, response.text
    return key


async def test_the_api_serves_a_version_archive_to_its_workers_only(services):
    services.worker_token = None
    key = await _register_v1(services)
    route = LIBRARY_ROUTE.format(SHA_V1)
    async with client(services, TOKEN) as worker:
        off = await worker.get(route)
        assert off.status_code == 403 and "SKILLRUN_WORKER_TOKEN" in off.json()["detail"]
    services.worker_token = SecretStr(TOKEN)
    async with client(services, None) as anonymous, client(services, key) as team, client(services, "x" * 40) as wrong, \
            client(services, TOKEN) as worker:
        assert (await anonymous.get(route)).status_code == 401
        assert (await team.get(route)).status_code == 401  # a team key is no worker token
        assert "must match" in (await wrong.get(route)).json()["detail"]
        served = await worker.get(route)
        assert served.status_code == 200 and hashlib.sha256(served.content).hexdigest() == SHA_V1
        assert served.headers["content-type"] == "application/octet-stream"
        assert (await worker.get(LIBRARY_ROUTE.format("ab" * 8))).status_code == 422
        assert (await worker.get(LIBRARY_ROUTE.format("../" + SHA_V1[3:]))).status_code in (404, 422)
        missing = await worker.get(LIBRARY_ROUTE.format("0" * 64))
        assert missing.status_code == 404 and "register it again" in missing.json()["detail"]


async def test_a_worker_without_the_libraries_folder_fetches_the_version_once_and_runs_it(
        services, elsewhere, shared_dir):
    services.worker_token = SecretStr(TOKEN)
    await _register_v1(services)
    with api_in_a_thread(services) as api:
        cache = elsewhere(api)
        runtime = LocalWorkspaceRuntime(shared_dir / "other-host-work")
        try:
            first = await runtime.run(RunRequest(skill=_far_ref(), command="bash scripts/go.sh"))
            assert first.exit_code == 0 and first.stdout == "version one\n", first.stderr
            assert _cache_entries(cache) == [SHA_V1]
            elsewhere(api, token="wrong-" + "t" * 30)  # the cached version needs no fetch
            second = await runtime.run(RunRequest(skill=_far_ref(), command="bash scripts/go.sh"))
            assert second.stdout == "version one\n", second.stderr
        finally:
            await runtime.close()


@pytest.mark.parametrize("fault", ["refused", "wrong-bytes", "stalls", "not-configured"])
async def test_a_library_fetch_that_fails_fails_the_run_with_the_reason_and_caches_nothing(
        server, elsewhere, shared_dir, fault):
    route = LIBRARY_ROUTE.format(SHA_V1)
    if fault == "refused":
        server.add(route, b'{"detail": "wrong worker token"}', status=401)
    elif fault == "wrong-bytes":
        server.add(route, tar_gz({"team-skill/SKILL.md": skill_md("team-skill")}))
    elif fault == "stalls":
        def trickle(out):
            for _ in range(50):
                out.write(b"\x1f")
                out.flush()
                time.sleep(0.1)

        server.add(route, trickle)
    cache = elsewhere(None if fault == "not-configured" else server.url(""), fetch_seconds=0.5)
    runtime = LocalWorkspaceRuntime(shared_dir / "other-host-work")
    try:
        with pytest.raises(RuntimeError) as failure:
            await runtime.run(RunRequest(skill=_far_ref(), command="bash scripts/go.sh"))
    finally:
        await runtime.close()
    expected = {"refused": "HTTP 401", "wrong-bytes": f"expected {SHA_V1}", "stalls": "longer than 0.5 s",
                "not-configured": "set SKILLRUN_API_URL and SKILLRUN_WORKER_TOKEN"}[fault]
    assert expected in str(failure.value)
    assert _cache_entries(cache) == []  # nothing cached, no download left behind
    if fault != "not-configured":
        assert server.headers[route][0]["Authorization"] == f"Bearer {TOKEN}"


async def test_the_worker_token_never_follows_a_redirect_to_another_origin(server, elsewhere, shared_dir):
    other = FileServer().start()
    try:
        archive = other.add("/elsewhere.tgz", V1)
        route = LIBRARY_ROUTE.format(SHA_V1)
        server.add(route, b"", status=302, headers={"Location": archive})
        elsewhere(server.url(""))
        runtime = LocalWorkspaceRuntime(shared_dir / "other-host-work")
        try:
            result = await runtime.run(RunRequest(skill=_far_ref(), command="bash scripts/go.sh"))
        finally:
            await runtime.close()
        assert result.stdout == "version one\n"
        assert server.headers[route][0]["Authorization"] == f"Bearer {TOKEN}"
        assert "Authorization" not in other.headers["/elsewhere.tgz"][0]
    finally:
        other.stop()
