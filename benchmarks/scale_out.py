"""Throughput as workers are added: 500 short runs through Redis with 1, 2 and 4 worker processes.

For each worker count: enqueue the runs, start the workers, wait for every run, then check that none was lost
and none ran twice (each run finished, with one attempt, exactly one ``started`` event). Prints runs per second
and the speed-up over one worker. Starts its own redis-server on a free port.

Usage: .venv/bin/python benchmarks/scale_out.py [--runs N] [--workers 1,2,4]
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

from benchmarks.figures import scratch_dir  # noqa: E402
from orchestrator.dispatch import QueueDispatcher  # noqa: E402
from orchestrator.skills import create_default_skill_repository  # noqa: E402
from tests.services import RedisServer  # noqa: E402
from worker.contract import RunRequest  # noqa: E402
from worker.run_store import RunStatus  # noqa: E402


async def measure(url: str, workers: int, runs: int, work: Path) -> float:
    ref = create_default_skill_repository(str(ROOT / "skills")).skill_ref("python-math")
    dispatcher = QueueDispatcher(url)
    ids = [(await dispatcher.submit(RunRequest(skill=ref, command="echo run $RUN_DIR", workspace_id=f"w{i % 16}"))).id
           for i in range(runs)]
    env = {**os.environ, "SKILLRUN_WORK_ROOT": str(work)}
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "worker", "--redis-url", url, "--burst", "--concurrency", str(workers)],
                            env=env, cwd=ROOT)
    for run_id in ids:
        record = await dispatcher.wait(run_id, 300)
        assert record is not None and record.status == RunStatus.FINISHED, f"run {run_id} lost: {record}"
    elapsed = time.perf_counter() - started
    proc.wait(timeout=120)
    for run_id in ids:
        record = await dispatcher.get(run_id)
        starts = [e for e in await dispatcher.events(run_id) if e.type == "started"]
        assert record.attempts == 1 and len(starts) == 1, f"run {run_id} ran {len(starts)} times"
    await dispatcher.close()
    return runs / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--workers", default="1,2,4")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    results = {}
    for n in counts:
        server = RedisServer()
        work = scratch_dir("skillrun-scale-")
        try:
            results[n] = await measure(server.url(), n, args.runs, work)
            print(f"  {n} worker(s): {results[n]:.1f} runs/s", file=sys.stderr)
        finally:
            server.stop()
            subprocess.run(["rm", "-rf", str(work)], check=False)
    print(f"{args.runs} short runs per point, none lost, none run twice; {os.cpu_count()} cores")
    print(f"{'workers':<8} {'runs/s':>8} {'speed-up':>9}")
    for n in counts:
        print(f"{n:<8} {results[n]:>8.1f} {results[n] / results[counts[0]]:>8.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
