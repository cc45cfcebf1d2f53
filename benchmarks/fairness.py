"""Fairness between teams on a shared queue: team B's run latency while team A floods it, against B alone.

Redis (started here), ``--workers`` worker processes of the local runtime, and the queue dispatcher in this process.
Each run is ``sleep S`` (``--seconds``). The series:

* B alone      team B submits a run and waits for it, with the queue otherwise empty
* B, A floods  team A queues ``--flood`` runs at once, then team B submits one and waits for it (A's runs are then
               left to drain before the next round)

Each of ``--runs`` rounds measures both. The ratio is B's median latency under the flood against B's alone. Target (issue 18): at most 2×, that is B waits
about one run's duration per worker, not for A's backlog.

Usage: .venv/bin/python benchmarks/fairness.py [--runs N] [--flood N] [--workers N] [--seconds S]
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

from benchmarks.figures import markdown_table, publish, scratch_dir, summary_ms  # noqa: E402
from orchestrator.dispatch import QueueDispatcher  # noqa: E402
from orchestrator.skills import create_default_skill_repository  # noqa: E402
from tests.services import RedisServer  # noqa: E402
from worker.contract import RunRequest  # noqa: E402
from worker.roots.folders import remove_tree  # noqa: E402

SKILL = create_default_skill_repository(str(ROOT / "skills")).skill_ref("python-math")


async def b_run(dispatcher: QueueDispatcher, seconds: float) -> float:
    """Team B submits one run and waits for it: the latency."""
    began = time.perf_counter()
    record = await dispatcher.submit(RunRequest(skill=SKILL, command=f"sleep {seconds}"), owner="team-b")
    record = await dispatcher.wait(record.id, 3600)
    if record is None or record.result is None or record.result.exit_code != 0:
        raise SystemExit(f"a run of team B failed: {record}")
    return time.perf_counter() - began


async def flood(dispatcher: QueueDispatcher, runs: int, seconds: float) -> list:
    """Team A queues ``runs`` runs at once."""
    return list(await asyncio.gather(*(
        dispatcher.submit(RunRequest(skill=SKILL, command=f"sleep {seconds}"), owner="team-a") for _ in range(runs))))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--flood", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=0.05)
    args = parser.parse_args()

    work = scratch_dir("skillrun-bench-fair-")
    server = RedisServer()
    env = {**os.environ, "SKILLRUN_WORK_ROOT": str(work / "work"), "SKILLRUN_ARTIFACTS_DIR": str(work / "artifacts")}
    workers = [subprocess.Popen([sys.executable, "-m", "worker", "--redis-url", server.url()], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(args.workers)]
    dispatcher = QueueDispatcher(server.url())
    alone: list[float] = []
    behind: list[float] = []
    waiting: list[int] = []
    try:
        for _ in range(2):  # the workers are up and warm
            await b_run(dispatcher, args.seconds)
        for i in range(args.runs):
            alone.append(await b_run(dispatcher, args.seconds))
            queued = await flood(dispatcher, args.flood, args.seconds)
            waiting.append((await dispatcher.queue_depths()).get("local", 0))
            behind.append(await b_run(dispatcher, args.seconds))
            for record in queued:  # drained before the next round
                await dispatcher.wait(record.id, 3600)
            print(f"  round {i + 1}/{args.runs}", file=sys.stderr)
    finally:
        await dispatcher.close()
        for proc in workers:
            proc.terminate()
        for proc in workers:
            proc.wait(timeout=60)
        server.stop()
        remove_tree(work)

    base, _ = summary_ms(alone)
    print(f"team B's next run, 'sleep {args.seconds:g}', {args.runs} rounds, {args.workers} workers; in each round team "
          f"A queued {args.flood} runs at once just before it ({min(waiting)}-{max(waiting)} still waiting)")
    print(f"{'series':<12} {'median ms':>10} {'p95 ms':>9} {'ratio':>7}  target: <= 2x")
    rows = []
    for name, samples in (("B alone", alone), ("B, A floods", behind)):
        median, p95 = summary_ms(samples)
        print(f"{name:<12} {median:>10.1f} {p95:>9.1f} {median / base:>7.2f}")
        rows.append([name, f"{median:.1f}", f"{p95:.1f}", f"{median / base:.2f}"])
    publish("fairness", "Fairness between teams",
            f"Team B's next run, `sleep {args.seconds:g}`, {args.runs} rounds, {args.workers} workers; in each round "
            f"team A queued {args.flood} runs at once just before it ({min(waiting)}-{max(waiting)} still waiting). "
            "Target: at most 2x.\n\n" + markdown_table(["series", "median ms", "p95 ms", "ratio"], rows))


if __name__ == "__main__":
    asyncio.run(main())
