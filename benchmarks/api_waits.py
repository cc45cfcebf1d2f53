"""Submission latency of the API while callers wait: idle, then with N open ``GET /v1/runs/{id}?wait=300``.

Starts a redis-server and the API (``skillrun serve``, over the queue, in its own process) and no worker, so the
runs stay queued and the waits stay open. Submits ``--submits`` runs one after another with no wait open (the
baseline), opens ``--waits`` waits, lets the API settle (its CPU quiet: every wait authenticated and registered),
submits again, and checks that every wait was still open at the end. Prints median and p95 of each series, the
ratio with waits / idle (the target: within 2x), and the API's CPU per second while the waits are open.

The waits go through a client of their own: an httpx client holding 1,000 connections slows its own next requests
(its pool scans them), which would be the client's cost, not the API's.

Usage: .venv/bin/python benchmarks/api_waits.py [--waits 1000] [--submits 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from benchmarks.figures import markdown_table, publish, scratch_dir, summary_ms  # noqa: E402
from orchestrator.documents import RedisDocuments  # noqa: E402
from orchestrator.teams import TeamStore  # noqa: E402
from tests.orchestrator.api_helpers import new_team  # noqa: E402
from tests.services import RedisServer, connections_to, free_port  # noqa: E402

RUN = {"skill": "python-math", "command": "true"}


async def submit_latencies(client: httpx.AsyncClient, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        began = time.perf_counter()
        response = await client.post("/v1/runs", json=RUN)
        samples.append(time.perf_counter() - began)
        assert response.status_code == 202, response.text
    return samples


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def settled(pid: int, window: float = 1.0, quiet: float = 0.05) -> float:
    """Wait until process ``pid`` uses under ``quiet`` of a core over ``window`` seconds; return that share."""
    while True:
        before = cpu_seconds(pid)
        await asyncio.sleep(window)
        share = (cpu_seconds(pid) - before) / window
        if share < quiet:
            return share


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waits", type=int, default=1000)
    parser.add_argument("--submits", type=int, default=200)
    args = parser.parse_args()

    work = scratch_dir("skillrun-bench-waits-")
    redis_server = RedisServer()
    teams = TeamStore(RedisDocuments(redis_server.url()))
    key = new_team(SimpleNamespace(teams=teams), "bench")
    port = free_port()
    env = {**os.environ, "SKILLRUN_REDIS_URL": redis_server.url(), "SKILLS_ROOT": str(ROOT / "skills"),
           "SKILLRUN_DATA_DIR": str(work / "data")}
    api = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "serve", "--port", str(port)], env=env,
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    limits = httpx.Limits(max_connections=args.waits + 10, max_keepalive_connections=args.waits + 10)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"},
                                     limits=limits, timeout=600) as client:
            while True:
                try:
                    if (await client.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    assert api.poll() is None, "the API did not start"
                    await asyncio.sleep(0.1)
            await submit_latencies(client, 20)  # warm up
            idle = await submit_latencies(client, args.submits)
            run_id = (await client.post("/v1/runs", json=RUN)).json()["id"]
            waiter = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"},
                                       limits=limits, timeout=600)
            waits = [asyncio.create_task(waiter.get(f"/v1/runs/{run_id}", params={"wait": 300}))
                     for _ in range(args.waits)]
            while connections_to(port) < args.waits:
                await asyncio.sleep(0.1)
            idle_cpu = await settled(api.pid)
            waiting = await submit_latencies(client, args.submits)
            still_open = sum(not task.done() for task in waits)
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            await waiter.aclose()
    finally:
        api.terminate()
        api.wait(timeout=60)
        teams.docs.close()
        redis_server.stop()

    base_median, base_p95 = summary_ms(idle)
    median, p95 = summary_ms(waiting)
    print(f"submission latency, {args.submits} submits each; {still_open} of {args.waits} waits open to the end")
    print(f"{'series':<22}{'median ms':>10}{'p95 ms':>10}{'ratio':>8}")
    print(f"{'idle':<22}{base_median:>10.2f}{base_p95:>10.2f}{1:>7.2f}x")
    print(f"{f'{args.waits} open waits':<22}{median:>10.2f}{p95:>10.2f}{median / base_median:>7.2f}x")
    print(f"API CPU with the waits open and nothing else: {idle_cpu * 100:.1f}% of a core")
    publish("api_waits", "Open waits",
            f"Submission latency, {args.submits} submits each; {still_open} of {args.waits} waits open to the end. "
            "Target: within 2x of idle.\n\n"
            + markdown_table(["series", "median ms", "p95 ms", "ratio"],
                             [["idle", f"{base_median:.2f}", f"{base_p95:.2f}", "1.00x"],
                              [f"{args.waits} open waits", f"{median:.2f}", f"{p95:.2f}", f"{median / base_median:.2f}x"]])
            + f"\n\nAPI CPU with the waits open and nothing else: {idle_cpu * 100:.1f}% of a core.")


if __name__ == "__main__":
    asyncio.run(main())
