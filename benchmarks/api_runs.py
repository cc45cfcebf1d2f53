"""One-off runs driven through the HTTP API as a caller drives them: submit (``POST /v1/runs``), then wait for the
result (``GET /v1/runs/{id}?wait=``); what went wrong is tallied (failed, lost, run twice)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx

RUN = {"skill": "python-math", "command": "true"}
WAIT_SECONDS = 120


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)


def api_client(base_url: str, key: str, concurrency: int) -> httpx.AsyncClient:
    """A client for ``concurrency`` callers at a time, with the team's key."""
    return httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {key}"},
                             limits=httpx.Limits(max_connections=concurrency * 2), timeout=WAIT_SECONDS + 30)


async def one_run(client: httpx.AsyncClient, tally: Tally, run: dict = RUN) -> None:
    began = time.perf_counter()
    submitted = await client.post("/v1/runs", json=run)
    if submitted.status_code != 202:
        tally.failed.append(f"submit {submitted.status_code}: {submitted.text[:200]}")
        return
    run_id = submitted.json()["id"]
    while True:
        answer = await client.get(f"/v1/runs/{run_id}", params={"wait": WAIT_SECONDS})
        if answer.status_code != 200:
            tally.lost.append(f"{run_id}: {answer.status_code} {answer.text[:200]}")
            return
        record = answer.json()
        if record["status"] in ("finished", "failed", "cancelled"):
            break
    tally.latencies.append(time.perf_counter() - began)
    if record["status"] != "finished" or record["result"]["exit_code"] != 0:
        tally.failed.append(f"{run_id}: {record['status']} {record['error'] or ''}")
    if record["attempts"] != 1:
        tally.doubled.append(run_id)


async def block(client: httpx.AsyncClient, runs: int, concurrency: int, tally: Tally, run: dict = RUN) -> None:
    """``runs`` runs, ``concurrency`` at a time, until every one has ended."""
    left = iter(range(runs))

    async def loop() -> None:
        for _ in left:
            await one_run(client, tally, run)

    await asyncio.gather(*(loop() for _ in range(concurrency)))
