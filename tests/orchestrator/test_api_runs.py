"""The HTTP API's skills, runs and metrics, on the embedded default and over the queue."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from orchestrator.dispatch import QueueDispatcher
from orchestrator.documents import RedisDocuments
from orchestrator.teams import TeamStore
from tests.conftest import EXAMPLE_SKILLS, IS_ROOT, workspace_dirs
from tests.orchestrator.api_helpers import api_in_a_thread, make_services, new_team
from tests.orchestrator.api_helpers import client as api_client
from tests.orchestrator.test_api_sessions import parse_sse
from tests.services import RedisServer, connections_to, free_port
from worker.artifacts import FileArtifactStore

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "skills"


@pytest.fixture
async def client(services):
    async with api_client(services, new_team(services, "team-a")) as c:
        yield c


async def test_skills_overview_and_one_skill(client):
    listing = (await client.get("/v1/skills")).json()
    assert [s["name"] for s in listing] == EXAMPLE_SKILLS
    weather = (await client.get("/v1/skills/weather-tools")).json()
    assert weather["tools"] == ["get_current_weather", "get_weather_forecast", "search_city_by_name"]
    assert weather["docs"] == ["API_REFERENCE.md"]
    missing = await client.get("/v1/skills/nope")
    assert missing.status_code == 404 and "unknown skill 'nope'" in missing.json()["detail"]


async def test_submit_wait_read_files_and_artifacts(client):
    body = {
        "skill": "data-chart", "command": "python3 scripts/chart.py inputs/data.csv",
        "output_files": ["$OUTPUT_DIR/*.{png,csv}"], "save_as_artifacts": True,
        "inputs": [{"name": "data.csv", "content": base64.b64encode(b"label,value\na,1\nb,3\n").decode()}],
    }
    submitted = await client.post("/v1/runs", json=body)
    assert submitted.status_code == 202
    run_id = submitted.json()["id"]
    done = (await client.get(f"/v1/runs/{run_id}", params={"wait": 30})).json()
    assert done["status"] == "finished", done
    assert done["result"]["exit_code"] == 0
    png = await client.get(f"/v1/runs/{run_id}/files/out/chart.png")
    assert png.headers["content-type"] == "image/png" and png.content.startswith(b"\x89PNG")
    csv = await client.get(f"/v1/runs/{run_id}/files/out/summary.csv")
    assert csv.headers["content-type"].startswith("text/csv") and csv.text.startswith("label,value,share")
    artifact = await client.get(f"/v1/runs/{run_id}/artifacts/out/chart.png")
    assert artifact.content == png.content
    assert (await client.get(f"/v1/runs/{run_id}/files/out/nope.txt")).status_code == 404
    assert (await client.get(f"/v1/runs/{run_id}/artifacts/out/nope.txt")).status_code == 404
    assert (await client.get("/v1/runs/does-not-exist")).status_code == 404


def held_user_ids(services, work_root: Path) -> list[str]:
    """The sandbox user ids the registry says a workspace under ``work_root`` holds."""
    registry = services.dispatcher.runtime("local").workspaces.user_ids.path
    if not IS_ROOT and not os.access(registry, os.R_OK | os.X_OK):
        return []  # a normal account's workspaces take no user ids; the registry, root's, is absent or closed to it
    return [e.name for e in registry.iterdir() if e.is_symlink() and os.readlink(e).startswith(f"{work_root}/")]


async def test_one_off_runs_leave_no_workspace_nor_user_id_and_their_files_are_still_served(client, services, work_root):
    body = {"skill": "python-math", "command": "python3 scripts/fib.py 5 > out/fib.txt", "output_files": ["out/fib.txt"],
            "save_as_artifacts": True}
    ids = [(await client.post("/v1/runs", json=body)).json()["id"] for _ in range(4)]
    for run_id in ids:
        assert (await client.get(f"/v1/runs/{run_id}", params={"wait": 60})).json()["status"] == "finished"
    await services.dispatcher.drain()
    assert workspace_dirs(work_root) == []
    assert held_user_ids(services, work_root) == []
    served = await client.get(f"/v1/runs/{ids[0]}/files/out/fib.txt")
    assert served.status_code == 200 and served.text.split() == ["0", "1", "1", "2", "3"]
    artifact = await client.get(f"/v1/runs/{ids[-1]}/artifacts/out/fib.txt")
    assert artifact.status_code == 200 and artifact.content == served.content


@pytest.mark.parametrize(("fields", "kept"), [
    ({"workspace_id": "mine"}, True),
    ({"keep_workspace": True}, True),
    ({"workspace_id": "mine", "keep_workspace": False}, False),
])
async def test_a_named_workspace_or_one_asked_to_be_kept_stays(client, services, work_root, fields, kept):
    run_id = (await client.post("/v1/runs", json={"skill": "python-math", "command": "true", **fields})).json()["id"]
    assert (await client.get(f"/v1/runs/{run_id}", params={"wait": 60})).json()["status"] == "finished"
    await services.dispatcher.drain()
    assert len(workspace_dirs(work_root)) == kept
    assert len(held_user_ids(services, work_root)) == (kept if IS_ROOT else 0)


async def test_events_stream_queued_started_finished_with_timings(client):
    run_id = (await client.post("/v1/runs", json={"skill": "python-math", "command": "echo hi"})).json()["id"]
    items = parse_sse((await client.get(f"/v1/runs/{run_id}/events")).text)
    assert [k for k, _ in items] == ["queued", "started", "finished"]
    assert items[1][1]["data"]["queue_ms"] >= 0
    assert items[2][1]["data"]["timings"]["exec_ms"] > 0


async def test_list_filters_by_status_and_cancel_stops_a_run(client):
    slow = (await client.post("/v1/runs", json={"skill": "python-math", "command": "sleep 30", "timeout": 60})).json()["id"]
    quick = (await client.post("/v1/runs", json={"skill": "python-math", "command": "true"})).json()["id"]
    await client.get(f"/v1/runs/{quick}", params={"wait": 10})
    finished = (await client.get("/v1/runs", params={"status": "finished"})).json()
    assert [r["id"] for r in finished["data"]] == [quick]
    cancelled = await client.post(f"/v1/runs/{slow}/cancel")
    assert cancelled.status_code == 200
    done = (await client.get(f"/v1/runs/{slow}", params={"wait": 10})).json()
    assert done["status"] == "cancelled"
    assert "cancelled" in done["result"]["stderr"]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"skill": "python-math", "command": "true", "runtime": "vm"}, 422, "runtime"),
        ({"skill": "python-math", "command": "true", "timeout": -1}, 422, "timeout"),
        ({"skill": "python-math", "command": "true", "env": {"N": 3}}, 422, "env"),
        ({"skill": "python-math", "command": "true", "env": {"LD_PRELOAD": "x"}}, 422, "LD_PRELOAD"),
        ({"skill": "python-math", "command": "true", "output_files": ["../../etc/passwd"]}, 422, "may not contain '..'"),
        ({"skill": "nope", "command": "true"}, 404, "unknown skill"),
        ({"skill": "python-math", "command": "true", "inputs": [{"name": "x", "host_path": "/etc/passwd"}]}, 422, "host_path"),
    ],
)
async def test_bad_run_requests_are_refused_and_nothing_is_queued(client, body, status, message):
    response = await client.post("/v1/runs", json=body)
    assert response.status_code == status
    assert message in json.dumps(response.json())
    assert (await client.get("/v1/runs")).json()["count"] == 0


async def test_an_input_over_the_cap_is_refused(client):
    big = base64.b64encode(b"\0" * (64 * 1024 * 1024 + 1)).decode()
    response = await client.post("/v1/runs", json={"skill": "python-math", "command": "true",
                                                   "inputs": [{"name": "big.bin", "content": big}]})
    assert response.status_code == 422 and "the limit is" in response.json()["detail"]
    assert (await client.get("/v1/runs")).json()["count"] == 0


async def test_metrics_in_prometheus_text(client):
    run_id = (await client.post("/v1/runs", json={"skill": "python-math", "command": "true"})).json()["id"]
    await client.get(f"/v1/runs/{run_id}", params={"wait": 10})
    text = (await client.get("/metrics")).text
    assert 'skillrun_runs{status="finished"} 1' in text
    assert 'skillrun_run_duration_seconds_bucket{le="+Inf"} 1' in text
    assert "skillrun_run_duration_seconds_count 1" in text
    assert "# TYPE skillrun_queue_depth gauge" in text


async def test_the_api_over_the_queue_with_a_worker_process(redis_url, work_root, shared_dir):
    env = {**os.environ, "SKILLRUN_WORK_ROOT": str(work_root), "SKILLRUN_ARTIFACTS_DIR": str(shared_dir / "artifacts")}
    dispatcher = QueueDispatcher(redis_url)
    services = make_services(dispatcher, FileArtifactStore(shared_dir / "artifacts"), shared_dir / "data")
    async with api_client(services, new_team(services, "team-q")) as c:
        ids = [(await c.post("/v1/runs", json={"skill": "python-math", "command": f"echo {i} > out/n.txt",
                                               "output_files": ["out/n.txt"], "save_as_artifacts": True})).json()["id"]
               for i in range(3)]
        metrics = (await c.get("/metrics")).text
        assert 'skillrun_queue_depth{runtime="local"} 3' in metrics
        assert 'skillrun_runs{status="queued"} 3' in metrics
        subprocess.run([sys.executable, "-m", "worker", "--redis-url", redis_url, "--burst"], env=env, cwd=REPO,
                       check=True, timeout=120)
        for i, run_id in enumerate(ids):
            done = (await c.get(f"/v1/runs/{run_id}", params={"wait": 10})).json()
            assert done["status"] == "finished"
            assert (await c.get(f"/v1/runs/{run_id}/artifacts/out/n.txt")).text == f"{i}\n"
        metrics = (await c.get("/metrics")).text
        assert 'skillrun_queue_depth{runtime="local"} 0' in metrics
        assert 'skillrun_runs{status="finished"} 3' in metrics
    await services.close()


async def _until(done, seconds: float = 60.0) -> bool:
    """Whether ``done()`` holds within ``seconds`` (a bound against hanging, not a figure)."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def test_open_waits_hold_no_thread_a_submission_still_answers_and_a_wait_ends_with_its_client(
        redis_url, shared_dir):
    # 200 waits and 20 event streams of a run no worker takes: before, each held one of the API's few threads (a
    # submission then got no answer for minutes) and went on after its client left.
    waits, streams = 200, 20
    dispatcher = QueueDispatcher(redis_url)
    services = make_services(dispatcher, FileArtifactStore(shared_dir / "artifacts"), shared_dir / "data")
    key = new_team(services, "team-w")
    with api_in_a_thread(services) as url:
        limits = httpx.Limits(max_connections=waits + streams + 10)
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, limits=limits,
                                     timeout=120) as c:
            run_id = (await c.post("/v1/runs", json={"skill": "python-math", "command": "true"})).json()["id"]
            threads_before = threading.active_count()
            waiting = [asyncio.create_task(c.get(f"/v1/runs/{run_id}", params={"wait": 300})) for _ in range(waits)]
            waiting += [asyncio.create_task(_read_stream(c, f"/v1/runs/{run_id}/events")) for _ in range(streams)]
            assert await _until(lambda: len(dispatcher.waiters) == waits + streams), f"{len(dispatcher.waiters)} open"
            assert threading.active_count() - threads_before < 10, "open waits hold threads"
            submitted = await c.post("/v1/runs", json={"skill": "python-math", "command": "true"})
            assert submitted.status_code == 202
            assert not any(task.done() for task in waiting)
            for task in waiting:  # the clients go: their connections close
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
        assert await _until(lambda: len(dispatcher.waiters) == 0), f"{len(dispatcher.waiters)} waits outlived their clients"
    await services.close()


async def test_redis_away_is_503_with_a_reason_and_a_run_whose_record_vanished_is_lost_not_unknown(shared_dir):
    server = RedisServer()  # its own: this test stops it and starts it again empty
    try:
        dispatcher = QueueDispatcher(server.url())
        services = make_services(dispatcher, FileArtifactStore(shared_dir / "artifacts"), shared_dir / "data")
        async with api_client(services, new_team(services, "team-r")) as c:
            run_id = (await c.post("/v1/runs", json={"skill": "python-math", "command": "true"})).json()["id"]
            waiter = asyncio.create_task(c.get(f"/v1/runs/{run_id}", params={"wait": 120}))
            assert await _until(lambda: len(dispatcher.waiters) == 1)
            server.halt()
            for answer in [await c.get(f"/v1/runs/{run_id}"), await c.get("/v1/runs"), await c.get("/healthz"),
                           await c.post("/v1/runs", json={"skill": "python-math", "command": "true"}),
                           await c.post(f"/v1/runs/{run_id}/cancel")]:
                assert answer.status_code == 503, answer.text
                assert int(answer.headers["Retry-After"]) > 0
                assert "Redis" in answer.json()["detail"]
            server.start()  # without its data
            lost = await waiter
            assert lost.status_code == 410 and "was lost" in lost.json()["detail"], lost.text
            for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/events"):
                answer = await c.get(path)
                assert answer.status_code == 410 and "was lost" in answer.json()["detail"], answer.text
            unknown = await c.get(f"/v1/runs/{run_id[:-8]}00000000")  # a wrong id: its check does not hold
            assert unknown.status_code == 404 and "no run" in unknown.json()["detail"]
        async with api_client(services, new_team(services, "team-other")) as other:
            assert (await other.get(f"/v1/runs/{run_id}")).status_code == 404  # another team's id: unknown to it
        await services.close()
    finally:
        server.stop()


class _ApiProcess:
    """``skillrun serve`` over Redis in a process of its own (started again on the same port), and a team's key."""

    def __init__(self, redis_url: str, data_dir: Path) -> None:
        teams = TeamStore(RedisDocuments(redis_url))
        self.key = new_team(SimpleNamespace(teams=teams), "team-p")
        teams.docs.close()
        self.port = free_port()
        self.env = {**os.environ, "SKILLRUN_REDIS_URL": redis_url, "SKILLS_ROOT": str(LIBRARY),
                    "SKILLRUN_DATA_DIR": str(data_dir)}
        self.proc: subprocess.Popen | None = None

    async def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "serve", "--port", str(self.port)],
                                     env=self.env, cwd=REPO)
        assert await _until(lambda: self.proc.poll() is not None or _answers(self.port)), "the API did not start"

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", timeout=120,
                                 headers={"Authorization": f"Bearer {self.key}"})

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def api_process(redis_url, shared_dir):
    api = _ApiProcess(redis_url, shared_dir / "api-data")
    yield api
    api.stop()


async def test_sigterm_ends_the_api_at_once_answering_its_waits_and_closing_its_streams(api_process):
    # Before, SIGTERM took 49 s (and once never ended): uvicorn waits for open requests, and waits lasted minutes.
    await api_process.start()
    async with api_process.client() as c:
        run_id = (await c.post("/v1/runs", json={"skill": "python-math", "command": "true"})).json()["id"]
        waits = [asyncio.create_task(c.get(f"/v1/runs/{run_id}", params={"wait": 300})) for _ in range(50)]
        streams = [asyncio.create_task(_read_stream(c, f"/v1/runs/{run_id}/events")) for _ in range(5)]
        assert await _until(lambda: connections_to(api_process.port) >= 55)
        await asyncio.sleep(0.5)  # connected, and read: a request not yet read would be dropped, not answered
        api_process.proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        answers = await asyncio.gather(*waits)
        texts = await asyncio.gather(*streams)
        assert await asyncio.to_thread(api_process.proc.wait, 30) in (0, -signal.SIGTERM)  # as the signal asks
        print(f"the API ended {time.monotonic() - stopped:.2f} s after SIGTERM")
    assert {(a.status_code, a.json()["status"]) for a in answers} == {(200, "queued")}
    for text in texts:
        assert [kind for kind, _ in parse_sse(text)] == ["queued", "closing"], text


async def test_sigterm_ends_the_api_even_while_an_agent_turn_streams_its_answer(api_process):
    # A model that accepts the connection and never answers: the turn would stream for as long as the model client
    # waits (minutes), and uvicorn waits for open requests. The API ends after its grace period instead.
    with socket.socket() as model:
        model.bind(("127.0.0.1", 0))
        model.listen(8)
        api_process.env |= {"OPENAI_BASE_URL": f"http://127.0.0.1:{model.getsockname()[1]}/v1",
                            "OPENAI_API_KEY": "test", "SKILLRUN_MODEL": "stalled"}
        await api_process.start()
        async with api_process.client() as c:
            assert (await c.post("/v1/sessions", json={"session_id": "stalled"})).status_code == 201
            turn = asyncio.create_task(c.post("/v1/sessions/stalled/messages", json={"text": "hi"}))
            assert await _until(lambda: connections_to(model.getsockname()[1]) >= 1)  # the model was asked
            api_process.proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(api_process.proc.wait, 60) in (0, -signal.SIGTERM)
            with contextlib.suppress(httpx.HTTPError):
                await turn


async def test_an_api_killed_under_its_waiting_callers_loses_no_run(api_process, redis_url, work_root, shared_dir):
    await api_process.start()
    async with api_process.client() as c:
        run_id = (await c.post("/v1/runs", json={"skill": "python-math", "command": "echo survived"})).json()["id"]
        waits = [asyncio.create_task(c.get(f"/v1/runs/{run_id}", params={"wait": 300})) for _ in range(50)]
        assert await _until(lambda: connections_to(api_process.port) >= 50)
        api_process.stop()  # SIGKILL
        outcomes = await asyncio.gather(*waits, return_exceptions=True)
    assert all(isinstance(outcome, httpx.TransportError) for outcome in outcomes), outcomes  # told, not left hanging
    await api_process.start()
    env = {**os.environ, "SKILLRUN_WORK_ROOT": str(work_root), "SKILLRUN_ARTIFACTS_DIR": str(shared_dir / "artifacts")}
    await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "worker", "--redis-url", redis_url, "--burst"],
                            env=env, cwd=REPO, check=True, timeout=120)
    async with api_process.client() as c:
        done = (await c.get(f"/v1/runs/{run_id}", params={"wait": 60})).json()
    assert (done["status"], done["result"]["stdout"], done["attempts"]) == ("finished", "survived\n", 1)


async def _read_stream(client: httpx.AsyncClient, path: str) -> str:
    async with client.stream("GET", path) as response:
        return "".join([chunk async for chunk in response.aiter_text()])  # raises if cut off


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


async def test_with_teams_in_redis_too_every_route_answers_503_while_redis_is_away(shared_dir):
    server = RedisServer()
    try:
        services = make_services(QueueDispatcher(server.url()), FileArtifactStore(shared_dir / "artifacts"),
                                 shared_dir / "data", documents=RedisDocuments(server.url()))
        async with api_client(services, new_team(services, "team-t")) as c:
            assert (await c.get("/v1/skills")).status_code == 200
            server.halt()
            for path in ("/v1/skills", "/v1/runs", "/metrics", "/healthz"):  # the key's check needs Redis too
                answer = await c.get(path)
                assert answer.status_code == 503 and answer.headers["Retry-After"], (path, answer.text)
                assert "Redis" in answer.json()["detail"] and "cannot be reached" in answer.json()["detail"]
        await services.close()
    finally:
        server.stop()


async def test_files_and_artifacts_whose_names_hold_a_line_break_or_odd_characters_are_served(client):
    # A run may name its files anything a file system allows: what the result lists, the API serves.
    names = ["out/two\nlines.txt", "out/tab\there.txt", "out/100% sure?.txt", "out/#hash.txt", "out/ünï.txt"]
    command = "; ".join(f"printf %s {shlex.quote(name)} > {shlex.quote(name)}" for name in names)
    body = {"skill": "python-math", "command": command, "output_files": ["out/*"], "save_as_artifacts": True}
    run_id = (await client.post("/v1/runs", json=body)).json()["id"]
    done = (await client.get(f"/v1/runs/{run_id}", params={"wait": 30})).json()
    assert sorted(f["name"] for f in done["result"]["output_files"]) == sorted(names), done["result"]
    for name in names:
        quoted = urllib.parse.quote(name)
        served = await client.get(f"/v1/runs/{run_id}/files/{quoted}")
        assert (served.status_code, served.text) == (200, name), (name, served.text)
        artifact = await client.get(f"/v1/runs/{run_id}/artifacts/{quoted}")
        assert (artifact.status_code, artifact.text) == (200, name), (name, artifact.text)
