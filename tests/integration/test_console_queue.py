"""The web console over the queue (issue 20): sessions kept in a real Redis, a run submitted from a skill's page and
executed by a real worker process, the operator view reading RQ's workers and the queues, sign-ins bounded per team
and gone from Redis once signed out."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest
import redis

from orchestrator.api import create_app
from orchestrator.config import Settings
from orchestrator.console import RedisConsoleSessions
from orchestrator.dispatch import QueueDispatcher
from orchestrator.documents import RedisDocuments
from tests.orchestrator.api_helpers import make_services, new_team
from worker.artifacts import FileArtifactStore


@pytest.fixture
async def services(redis_url, shared_dir):
    documents = RedisDocuments(redis_url)
    built = make_services(QueueDispatcher(redis_url), FileArtifactStore(shared_dir / "artifacts"), shared_dir / "data",
                          documents=documents)
    yield built
    await built.close()


def _csrf(page: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


async def _signed_in(app, key: str) -> httpx.AsyncClient:
    browser = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://console")
    form = await browser.get("/ui/login")
    answer = await browser.post("/ui/login", data={"key": key, "csrf": _csrf(form.text)})
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/skills", answer.text
    return browser


def _session_keys(url: str) -> list[bytes]:
    return list(redis.Redis.from_url(url).scan_iter("skillrun:console:session:*"))


async def test_a_run_from_the_console_goes_over_the_queue_and_the_operator_view_shows_its_worker(
        redis_url, services, workers):
    app = create_app(Settings(redis_url=redis_url), services=services)
    async with app.router.lifespan_context(app):
        browser = await _signed_in(app, new_team(services, "team-a"))
        assert len(_session_keys(redis_url)) == 1  # kept in Redis, not in this process
        skill = await browser.get("/ui/skills/python-math")
        submitted = await browser.post("/ui/skills/python-math/run", data={
            "csrf": _csrf(skill.text), "command": "python3 scripts/fib.py 7 | tee out/fib.txt",
            "output_files": "out/fib.txt", "runtime": "local"})
        assert submitted.status_code == 303, submitted.text
        run_page = submitted.headers["location"]
        run_id = run_page.rsplit("/", 1)[1]
        queued = await browser.get("/ui/operator")
        assert re.search(r'<tr class="queue" data-runtime="local"><td>local</td><td class="depth">1</td>', queued.text)

        workers.start()
        record = await services.dispatcher.wait(run_id, 60)
        assert record is not None and record.status.value == "finished", record
        page = (await browser.get(run_page)).text
        assert 'data-status="finished"' in page and 'data-ended="true"' in page
        assert "0\n1\n1\n2\n3\n5\n8" in page and 'data-name="out/fib.txt"' in page
        assert record.worker_id and record.worker_id in page
        download = await browser.get(f"{run_page}/files/out/fib.txt")
        assert download.content == b"0\n1\n1\n2\n3\n5\n8\n"

        listed = await services.dispatcher.workers()
        assert len(listed) == 1 and listed[0].alive and "skillrun:local" in listed[0].queues
        assert time.time() - listed[0].last_heartbeat < 120
        operator = (await browser.get("/ui/operator")).text
        assert f"<code>{listed[0].name}</code>" in operator and 'data-alive="true"' in operator
        assert re.search(r'class="ended">1</td>', operator), "the finished run is counted in its minute"

        signed_out = await browser.post("/ui/logout", data={"csrf": _csrf(page)})
        assert signed_out.status_code == 303 and _session_keys(redis_url) == []
        assert (await browser.get("/ui/runs")).headers["location"] == "/ui/login"
        await browser.aclose()


async def test_a_teams_sign_ins_are_bounded_in_redis_and_a_revoked_key_ends_them(redis_url, services):
    sessions = RedisConsoleSessions(redis_url, ttl_seconds=600, per_team=3)
    key = new_team(services, "team-a")
    opened = [await sessions.open("team-a", key.split("_")[1]) for _ in range(5)]
    assert [await sessions.get(token) is not None for token, _ in opened] == [False, False, True, True, True]
    assert len(_session_keys(redis_url)) == 3
    index = redis.Redis.from_url(redis_url)
    assert index.zcard("skillrun:console:team:team-a") == 3 and 0 < index.ttl("skillrun:console:team:team-a") <= 600
    for token, _ in opened:
        await sessions.close(token)
    assert _session_keys(redis_url) == [] and index.zcard("skillrun:console:team:team-a") == 0
    await sessions.aclose()

    app = create_app(Settings(redis_url=redis_url), services=services)
    async with app.router.lifespan_context(app):
        browser = await _signed_in(app, key)
        assert (await browser.get("/ui/skills")).status_code == 200
        await asyncio.to_thread(services.teams.revoke_key, key.split("_")[1])
        assert (await browser.get("/ui/skills")).headers["location"] == "/ui/login"
        assert _session_keys(redis_url) == [], "the revoked key's session is deleted, not only refused"
        await browser.aclose()
