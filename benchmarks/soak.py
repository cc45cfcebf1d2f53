"""Soak: N runs through the API, Redis (append-only persistence) and two workers; is anything growing per run?

Starts a redis-server with an append-only file (fsync every second, Redis's default for it), the API (``skillrun
serve`` with ``SKILLRUN_REDIS_URL``) and two ``skillrun worker`` processes, all with a short result TTL
(``--result-ttl``, so that retention takes effect within the soak), and drives ``--runs`` one-off runs (no workspace
id) at concurrency ``--concurrency``: submit, then wait for the result. Every ``--every`` runs it lets the runs in
flight end, waits until their records and RQ jobs have expired and the API's sweep has taken them out of the indexes
and registries (``--settle``), and prints a row: runs/s and p50/p95/p99 of submit-to-result over the block, then what
is left — Redis memory (``used_memory`` less its clients' buffers, which follow the connections open at the moment,
not the runs), keys and entries (the lengths of every hash, sorted set, set, list and stream, a string
counting 1: a structure that only grows shows here while the keys stay flat), workspace folders and sandbox user ids
held, and the RSS of each process. Then the growth per 1,000 runs after retention (first row to last; also shown, not
judged, over the later half of the rows, where a cache bounded by a count that was still filling early no longer
grows), and the targets, PASS or FAIL each: 0 failed, 0 lost, 0 doubled (a run taking a second attempt); growth per
1,000 runs under 0.5% of the start for every resource; p99 of the last block within 1.2x of the first. Last, each
Redis key whose entries changed from the first row to the last. ``--check`` makes a FAIL the exit status.

Usage: .venv/bin/python benchmarks/soak.py [--runs 35000] [--every 5000] [--concurrency 8] [--result-ttl 60]
                                           [--settle S]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from benchmarks.api_runs import Tally, api_client, block  # noqa: E402
from benchmarks.figures import Recording, preformatted, publish  # noqa: E402
from benchmarks.stack import Stack, workers_idle  # noqa: E402
from orchestrator.dispatch.queue import SWEEP_SECONDS  # noqa: E402
from worker import defaults  # noqa: E402
from worker.config import get_worker_settings  # noqa: E402

GROWTH_TARGET = 0.005
"""Largest growth per 1,000 runs after retention, as a share of the resource at the start."""
P99_TARGET = 1.2
RESOURCES = ("redis memory", "redis keys", "redis entries", "folders", "user ids")
RETENTION_MARGIN_SECONDS = 5
Structures = dict[str, tuple[str, int]]
"""Redis's keys, each with its type and how many entries it holds."""


def retention_horizon(result_ttl: int) -> int:
    """Seconds after which every key of an ended run has expired (its record's TTL, its RQ job's) and the API's next
    sweep has taken it out of the run indexes and RQ's registries, and a little."""
    return int(max(result_ttl, defaults.JOB_RESULT_TTL_SECONDS) + SWEEP_SECONDS) + RETENTION_MARGIN_SECONDS


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def held_user_ids(work_root: Path) -> int:
    """Sandbox user ids the host's registry says a workspace under ``work_root`` holds (none as a normal account,
    whose workspaces take none: the registry is root's, and may be closed to it)."""
    registry = get_worker_settings().uid_registry
    if os.geteuid() != 0 or not registry.is_dir():
        return 0
    return sum(1 for e in registry.iterdir() if e.is_symlink() and os.readlink(e).startswith(f"{work_root}/"))


def percentile(ordered: list[float], share: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))] * 1000 if ordered else 0.0


def structures(client: redis.Redis) -> Structures:
    """Every key: its type and how many entries it holds (a string: 1)."""
    sizes = {"hash": client.hlen, "zset": client.zcard, "set": client.scard, "list": client.llen,
             "stream": client.xlen, "string": lambda _key: 1}
    found = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        if kind in sizes:  # not "none": expired between the scan and the look
            found[key.decode()] = (kind, sizes[kind](key))
    return found


def sample(client: redis.Redis, work_root: Path, procs: dict[str, int]) -> tuple[dict[str, float], Structures]:
    """The resources by name, and Redis's keys with their entries (``structures``)."""
    keys = structures(client)
    memory = client.info("memory")
    values = {"redis memory": float(memory["used_memory"] - memory["mem_clients_normal"]),
              "redis keys": float(len(keys)),
              "redis entries": float(sum(entries for _, entries in keys.values())),
              "folders": float(sum(1 for p in work_root.iterdir() if p.name.startswith("ws_"))),
              "user ids": float(held_user_ids(work_root))}
    values |= {f"rss {name}": float(rss_bytes(pid)) for name, pid in procs.items()}
    return values, keys


def mib(value: float) -> str:
    return f"{value / 1024**2:.1f}M"


def shown(name: str, value: float) -> str:
    return mib(value) if name == "redis memory" or name.startswith("rss") else f"{value:.0f}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


async def soak(args: argparse.Namespace, base_url: str, key: str, store: redis.Redis, work_root: Path,
               procs: dict[str, int]) -> bool:
    tally = Tally()
    rows: list[tuple[int, dict[str, float]]] = []
    kept: list[Structures] = []
    block_p99: list[float] = []
    names = ["runs", "runs/s", "p50 ms", "p95 ms", "p99 ms", *RESOURCES, *(f"rss {n}" for n in procs)]
    print(f"soak: {args.runs} runs, concurrency {args.concurrency}, result TTL {args.result_ttl} s, row every "
          f"{args.every} runs, sampled {args.settle} s after its block")
    print("  ".join(f"{n:>13}" for n in names), flush=True)
    async with api_client(base_url, key, args.concurrency) as client:
        done = 0
        while done < args.runs:
            size = min(args.every, args.runs - done)
            first, started = len(tally.latencies), time.monotonic()
            await block(client, size, args.concurrency, tally)
            done += size
            seconds = time.monotonic() - started
            ordered = sorted(tally.latencies[first:])
            block_p99.append(percentile(ordered, 0.99))
            await asyncio.to_thread(workers_idle, store)
            await asyncio.sleep(args.settle)
            values, keys = sample(store, work_root, procs)
            rows.append((done, values))
            kept.append(keys)
            cells = [f"{done}", f"{size / seconds:.1f}", f"{percentile(ordered, 0.5):.1f}",
                     f"{percentile(ordered, 0.95):.1f}", f"{block_p99[-1]:.1f}",
                     *(shown(n, values[n]) for n in names[5:])]
            print("  ".join(f"{c:>13}" for c in cells), flush=True)
    ok = report(args, tally, rows, block_p99)
    changed(kept[0], kept[-1])
    return ok


def changed(first: Structures, last: Structures) -> None:
    """The Redis keys whose entries differ between the first row and the last (what a growth is made of)."""
    moved = {key: (first.get(key, ("-", 0)), last.get(key, ("-", 0))) for key in first.keys() | last.keys()
             if first.get(key) != last.get(key)}
    print(f"redis keys whose entries changed from the first row to the last: {len(moved) or 'none'}")
    for key, ((kind, before), (now_kind, after)) in sorted(moved.items()):
        print(f"  {key} ({now_kind if now_kind != '-' else kind}): {before} -> {after}")


def report(args: argparse.Namespace, tally: Tally, rows: list[tuple[int, dict[str, float]]],
           block_p99: list[float]) -> bool:
    if args.settle < retention_horizon(args.result_ttl):
        print(f"retention: rows were sampled {args.settle} s after their block, before the records and RQ jobs of "
              f"its last runs expired ({retention_horizon(args.result_ttl)} s): they count in the growth")
    (start_runs, start), (end_runs, end) = rows[0], rows[-1]
    span = max(end_runs - start_runs, 1)
    # The later half of the rows on its own: a cache bounded by a count (workspaces remembered per worker process)
    # still filling early shows in the first-to-last growth but not here; growth that goes on shows in both.
    half_runs, half = rows[len(rows) // 2] if len(rows) >= 3 else rows[0]
    half_span = max(end_runs - half_runs, 1)
    print(f"growth per 1,000 runs after retention (runs {start_runs} to {end_runs}; later half: {half_runs} to "
          f"{end_runs}, shown only):")
    print(f"{'resource':>16}  {'start':>10}  {'end':>10}  {'per 1,000':>10}  {'of start':>9}  {'later half':>10}  "
          "target")
    ok = True
    for name in start:
        growth = (end[name] - start[name]) * 1000 / span
        later = (end[name] - half[name]) * 1000 / half_span
        passed = growth <= GROWTH_TARGET * start[name]
        ok &= passed
        share = f"{growth / start[name] * 100:.3f}%" if start[name] else "-"
        later_share = f"{later / start[name] * 100:.3f}%" if start[name] and half_runs != start_runs else "-"
        print(f"{name:>16}  {shown(name, start[name]):>10}  {shown(name, end[name]):>10}  "
              f"{shown(name, growth):>10}  {share:>9}  {later_share:>10}  {verdict(passed)}")
    checks = [
        (f"failed runs: {len(tally.failed)}", not tally.failed),
        (f"lost runs: {len(tally.lost)}", not tally.lost),
        (f"doubled runs (second attempt): {len(tally.doubled)}", not tally.doubled),
        (f"p99 of the last block {block_p99[-1]:.1f} ms within {P99_TARGET}x of the first {block_p99[0]:.1f} ms",
         block_p99[-1] <= P99_TARGET * block_p99[0]),
    ]
    for text, passed in checks:
        ok &= passed
        print(f"{verdict(passed)}  {text}")
    print(f"{verdict(ok)}  all targets")
    for problem in (tally.failed + tally.lost)[:5]:
        print(f"  e.g. {problem}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=35_000)
    parser.add_argument("--every", type=int, default=5_000, help="runs per row (default 5,000)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--result-ttl", type=int, default=60, help="seconds run records are kept (default 60)")
    parser.add_argument("--settle", type=int, help="seconds to wait after each block before sampling (default: "
                        "until the keys of its runs have expired, the result TTL or RQ's 60 s, and 5 s more)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is not met")
    args = parser.parse_args()
    args.every = min(args.every, args.runs)
    args.settle = retention_horizon(args.result_ttl) if args.settle is None else args.settle

    printed = Recording()
    with Stack("skillrun-soak-", result_ttl=args.result_ttl) as stack:
        base_url = stack.start_api()
        for _ in range(2):
            stack.start_worker()
        with redis.Redis.from_url(stack.url) as store:
            ok = asyncio.run(soak(args, base_url, stack.key, store, stack.work_root, stack.pids()))
    publish("soak", "Soak", "Rows once retention has caught up, the growth per 1,000 runs, and a verdict per "
            "target.\n\n" + preformatted(printed.text()))
    sys.exit(1 if args.check and not ok else 0)


if __name__ == "__main__":
    main()
