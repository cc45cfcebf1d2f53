"""The HTTP API's skills, runs and metrics, on the embedded default and over the queue."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.dispatch import QueueDispatcher
from tests.orchestrator.api_helpers import client as api_client
from tests.orchestrator.api_helpers import make_services, new_team
from tests.orchestrator.test_api_sessions import parse_sse
from worker.artifacts import FileArtifactStore

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "skills"


@pytest.fixture
async def client(services):
    async with api_client(services, new_team(services, "team-a")) as c:
        yield c


async def test_skills_overview_and_one_skill(client):
    listing = (await client.get("/v1/skills")).json()
    assert [s["name"] for s in listing] == [
        "data-chart", "markdown-table", "pdf-report", "python-math", "spreadsheet", "user-file-ops", "weather-tools",
    ]
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
