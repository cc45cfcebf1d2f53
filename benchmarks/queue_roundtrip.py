"""Round trip of a trivial run: through the queue (Redis + RQ + a worker process) vs the inline dispatcher.

Three series, interleaved, in one process: ``inline`` (InlineDispatcher.run in this process), ``queue``
(QueueDispatcher.run: Redis, a worker process, the result back), and ``api`` (POST /v1/runs then
GET /v1/runs/{id}?wait=30 through the ASGI app on the queue). Prints medians, p95 and what the queue adds.
Starts its own redis-server on a free port (needs ``redis-server`` installed).

Usage: .venv/bin/python benchmarks/queue_roundtrip.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from benchmarks.figures import markdown_table, publish, scratch_dir, summary_ms  # noqa: E402
from orchestrator.api import Services, create_app  # noqa: E402
from orchestrator.assistant import create_assistant  # noqa: E402
from orchestrator.config import Settings  # noqa: E402
from orchestrator.dispatch import InlineDispatcher, QueueDispatcher  # noqa: E402
from orchestrator.documents import FileDocuments  # noqa: E402
from orchestrator.libraries import LibraryRegistry  # noqa: E402
from orchestrator.sessions import InMemorySessionService  # noqa: E402
from orchestrator.skills import create_default_skill_repository  # noqa: E402
from orchestrator.teams import TeamStore  # noqa: E402
from tests.services import RedisServer  # noqa: E402
from worker.artifacts import FileArtifactStore  # noqa: E402
from worker.contract import RunRequest  # noqa: E402
from worker.runtimes.local.runtime import LocalWorkspaceRuntime  # noqa: E402


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()

    work = scratch_dir("skillrun-bench-")
    redis_server = RedisServer()
    env = {**os.environ, "SKILLRUN_WORK_ROOT": str(work / "queue"), "SKILLRUN_ARTIFACTS_DIR": str(work / "artifacts")}
    worker = subprocess.Popen([sys.executable, "-m", "worker", "--redis-url", redis_server.url()], env=env, cwd=ROOT)
    repository = create_default_skill_repository(str(ROOT / "skills"), use_cached_repository=True)  # as the API has it
    ref = repository.skill_ref("python-math")
    inline = InlineDispatcher({"local": LocalWorkspaceRuntime(work / "inline")})
    queue = QueueDispatcher(redis_server.url())
    settings = Settings(model="m", openai_api_key="k", openai_base_url="http://127.0.0.1:9/v1")
    documents = FileDocuments(work / "registry")
    services = Services(repository=repository, dispatcher=queue, session_service=InMemorySessionService(),
                        agent_factory=lambda repo: create_assistant(settings, repo, queue), app_name="bench",
                        artifact_store=FileArtifactStore(work / "artifacts"), teams=TeamStore(documents),
                        libraries=LibraryRegistry(documents, work / "libraries"))
    services.teams.create_team("bench")
    key = services.teams.create_key("bench")[1]
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(services=services)), base_url="http://bench",
                               headers={"Authorization": f"Bearer {key}"})
    series: dict[str, list[float]] = {"inline": [], "queue": [], "api": []}
    try:
        await queue.run(RunRequest(skill=ref, command="true", workspace_id="warm"))  # the worker is up
        for i in range(args.runs):
            t = time.perf_counter()
            await inline.run(RunRequest(skill=ref, command="echo hi", workspace_id="warm"))
            series["inline"].append(time.perf_counter() - t)

            t = time.perf_counter()
            result = await queue.run(RunRequest(skill=ref, command="echo hi", workspace_id="warm"))
            series["queue"].append(time.perf_counter() - t)
            assert result.stdout == "hi\n"

            t = time.perf_counter()
            run_id = (await client.post("/v1/runs", json={"skill": "python-math", "command": "echo hi",
                                                          "workspace_id": "warm"})).json()["id"]
            done = (await client.get(f"/v1/runs/{run_id}", params={"wait": 30})).json()
            series["api"].append(time.perf_counter() - t)
            assert done["status"] == "finished", done
            if (i + 1) % 50 == 0:
                print(f"  {i + 1}/{args.runs}", file=sys.stderr)
    finally:
        await client.aclose()
        await inline.close()
        await queue.close()
        worker.terminate()
        worker.wait()
        redis_server.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)

    base, _ = summary_ms(series["inline"])
    print(f"trivial run round trip, {args.runs} runs each (one worker process)")
    print(f"{'series':<8} {'median ms':>10} {'p95 ms':>8} {'added over inline (median)':>28}")
    rows = []
    for name, samples in series.items():
        med, p95 = summary_ms(samples)
        print(f"{name:<8} {med:>10.2f} {p95:>8.2f} {med - base:>25.2f} ms")
        rows.append([name, f"{med:.2f}", f"{p95:.2f}", f"{med - base:.2f} ms"])
    publish("queue_roundtrip", "Queue round trip",
            f"A trivial run's round trip, {args.runs} runs of each series (one worker process), interleaved.\n\n"
            + markdown_table(["series", "median ms", "p95 ms", "added over inline (median)"], rows))


if __name__ == "__main__":
    asyncio.run(main())
