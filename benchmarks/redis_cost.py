"""What one run costs Redis, and what the API and idle or busy workers cost it with no runs going through.

Starts a redis-server (append-only, fsync every second), the API and ``--workers`` workers of the local runtime
(``benchmarks.stack``), and drives ``--warmup`` runs (not measured). Then, each measured from ``CONFIG RESETSTAT``
and ``INFO all`` before to ``INFO all`` after (the meter's own two calls and bytes taken out):

* idle: the API and K workers (``--idle-workers``), no runs, ``--seconds`` each: commands per second by name,
  the main thread's CPU, and each process's connections to Redis (established TCP sockets, read from ``/proc``).
  Idle and busy windows start halfway between two of the API's sweeps (by its lease's time to live), so that a
  window of a multiple of 5 s holds that many sweeps;
* busy: one long run (``sleep``) on each of the ``--workers`` workers, ``--seconds``: what a running run adds
  (its heartbeat, its waiting caller);
* runs: ``--runs`` one-off runs (``true``) submitted and awaited through the HTTP API at ``--concurrency``, as the
  soak does: commands per run by name, calls, command time (commandstats ``usec``), the main thread's CPU, bytes
  in and out, append-only file bytes; after ``--settle`` seconds (RQ's job summaries gone), keys and memory per
  kept run (expired keys deleted first, by a ``SCAN``).

Last, ``--sampled`` more runs one at a time under ``MONITOR``: their commands per run by the process that sent them
(the API: submission and wait; the workers: the run) and by the part of the data they touch (RQ's bookkeeping, fair
turns, documents, run records, ...), a script's own commands where they touch (as commandstats counts them).

Then the figures: runs/s one Redis core serves if its CPU were the only limit, and what 100 workers change
(connections, heartbeats, the idle background, extrapolated linearly from the K measured and said so).

Usage: .venv/bin/python benchmarks/redis_cost.py [--runs 500] [--workers 2] [--concurrency 8] [--seconds 20]
                                                 [--idle-workers 1,2,4] [--warmup 20] [--settle S]
                                                 [--sampled 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from rq.defaults import DEFAULT_WORKER_TTL  # noqa: E402

from benchmarks.api_runs import Tally, api_client, block, one_run  # noqa: E402
from benchmarks.figures import Recording, preformatted, publish  # noqa: E402
from benchmarks.redis_meter import NESTING, Measure, Meter, Monitored  # noqa: E402
from benchmarks.stack import Stack, workers_idle  # noqa: E402
from orchestrator.dispatch.queue import SWEEP_LEASE_SECONDS  # noqa: E402
from worker import defaults  # noqa: E402
from worker.run_store.redis_store import RunKeys  # noqa: E402

SCALE = 100
"""The worker count the figures extrapolate to."""
TOP = 12
REGISTERED_SECONDS = 1.0
"""Pause after workers registered, so that their start stays out of an idle window."""
TAIL_SECONDS = 1.0
"""Pause after the last result, for the workers' bookkeeping that follows it (RQ's end of the job)."""
START_SECONDS = 60
BUSY_MARGIN_SECONDS = 15
BASELINE_CALLS = 5000
BASELINE_KEY = "redis-cost:baseline"
RQ_DEQUEUE_SECONDS = DEFAULT_WORKER_TTL - 15
"""How long an idle RQ worker's BLPOP blocks before it beats and listens again."""


def baseline(meter: Meter, control: redis.Redis) -> Measure:
    """Plain ``SET`` round trips from one client, no pipelining, before the API and workers start."""
    meter.start()
    for i in range(BASELINE_CALLS):
        control.set(BASELINE_KEY, i)
    measured = meter.stop()
    control.delete(BASELINE_KEY)
    return measured


def mid_sweep(control: redis.Redis) -> None:
    """Return halfway between two sweeps of the API: when its sweep lease has about half its time to live left."""
    key, half = f"{RunKeys().prefix}:lease:sweep", SWEEP_LEASE_SECONDS * 1000 / 2
    deadline = time.monotonic() + START_SECONDS
    while not half - 500 < control.pttl(key) <= half:
        if time.monotonic() > deadline:
            raise SystemExit(f"the API took no sweep lease ({key}) within {START_SECONDS} s")
        time.sleep(0.05)


def set_workers(stack: Stack, control: redis.Redis, count: int) -> None:
    while len(stack.workers) < count:
        stack.start_worker()
    while len(stack.workers) > count:
        stack.stop_worker()
    workers_idle(control, count)
    time.sleep(REGISTERED_SECONDS)


def idle(stack: Stack, meter: Meter, control: redis.Redis, counts: list[int], seconds: float) -> dict[int, Measure]:
    measured = {}
    for count in counts:
        set_workers(stack, control, count)
        mid_sweep(control)
        meter.start()
        time.sleep(seconds)
        measured[count] = meter.stop()
    return measured


async def busy(stack: Stack, meter: Meter, control: redis.Redis, workers: int, seconds: float) -> Measure:
    """One ``sleep`` run on each worker, measured while all of them run."""
    run = {"skill": "python-math", "command": f"sleep {seconds + BUSY_MARGIN_SECONDS:.0f}"}
    tally = Tally()
    async with api_client(stack.base_url, stack.key, workers) as client:
        runs = asyncio.gather(*(one_run(client, tally, run) for _ in range(workers)))
        deadline = time.monotonic() + START_SECONDS
        while control.zcard(RunKeys().running) < workers:
            if time.monotonic() > deadline:
                raise SystemExit(f"{workers} sleep runs did not all start within {START_SECONDS} s")
            await asyncio.sleep(0.05)
        await asyncio.to_thread(mid_sweep, control)
        meter.start()
        await asyncio.sleep(seconds)
        measured = meter.stop()
        await runs
    if tally.failed or tally.lost:
        raise SystemExit(f"the sleep runs did not all finish: {(tally.failed + tally.lost)[:3]}")
    return measured


async def through_api(stack: Stack, runs: int, concurrency: int, tally: Tally) -> None:
    async with api_client(stack.base_url, stack.key, concurrency) as client:
        await block(client, runs, concurrency, tally)


def fit(points: dict[int, float]) -> tuple[float, float]:
    """Least squares ``a + b * k`` through the points (``b`` 0 for a single point)."""
    ks, ys = list(points), list(points.values())
    mean_k, mean_y = sum(ks) / len(ks), sum(ys) / len(ys)
    spread = sum((k - mean_k) ** 2 for k in ks)
    slope = sum((k - mean_k) * (y - mean_y) for k, y in zip(ks, ys)) / spread if spread else 0.0
    return mean_y - slope * mean_k, slope


def rates_table(title: str, measures: dict[str, Measure]) -> None:
    """Commands per second by name, one column per measure, then totals, CPU, bytes and connections."""
    print(title)
    names = list(dict.fromkeys(name for m in measures.values() for name in m.commands()))[:TOP]
    print(f"{'per second':<24}" + "".join(f"{label:>12}" for label in measures))

    def row(label: str, value: Callable[[Measure], float]) -> None:
        print(f"{label:<24}" + "".join(f"{value(m):>12.2f}" for m in measures.values()))

    for name in names:
        row(f"  {name}", lambda m, n=name: m.commands().get(n, (0, 0))[0] / m.seconds)
    row("calls", lambda m: m.calls() / m.seconds)
    row("main-thread CPU us", lambda m: m.cpu_usec() / m.seconds)
    row("bytes in", lambda m: m.net_in() / m.seconds)
    row("bytes out", lambda m: m.net_out() / m.seconds)
    for proc in dict.fromkeys(p for m in measures.values() for p in m.connections):
        print(f"{'connections ' + proc:<24}" + "".join(f"{m.connections.get(proc, '-'):>12}" for m in measures.values()))


def per_run_table(measure: Measure, runs: int) -> None:
    print(f"{'command':<24}{'calls/run':>12}{'usec/run':>12}{'of calls':>10}")
    total = measure.calls()
    for name, (calls, usec) in list(measure.commands().items())[:TOP]:
        nested = " (includes the commands it ran)" if name in NESTING else ""
        print(f"{'  ' + name:<24}{calls / runs:>12.2f}{usec / runs:>12.1f}{calls / total * 100:>9.1f}%{nested}")
    rest = list(measure.commands().values())[TOP:]
    if rest:
        print(f"{'  other':<24}{sum(c for c, _ in rest) / runs:>12.2f}{sum(u for _, u in rest) / runs:>12.1f}"
              f"{sum(c for c, _ in rest) / total * 100:>9.1f}%")


async def sampled(stack: Stack, runs: int) -> tuple[dict[tuple[str, str], int], Tally]:
    """``runs`` runs one at a time under ``MONITOR``: calls by (process, part)."""
    tally = Tally()
    monitored = await asyncio.to_thread(Monitored, stack.url, stack.server.port, stack.pids())
    async with api_client(stack.base_url, stack.key, 1) as client:
        await block(client, runs, 1, tally)
    await asyncio.sleep(TAIL_SECONDS)
    return monitored.stop(), tally


def parts_table(counted: dict[tuple[str, str], int], runs: int) -> None:
    """Calls per run by part (rows) and by process (columns: the API, the workers together, anything else)."""
    def side(process: str) -> str:
        return "workers" if process.startswith("worker") else process

    sides = ["api", "workers", *sorted({side(p) for p, _ in counted} - {"api", "workers"})]
    by_part: dict[str, dict[str, int]] = {}
    for (process, part), calls in counted.items():
        row = by_part.setdefault(part, {})
        row[side(process)] = row.get(side(process), 0) + calls
    print(f"{'part':<58}" + "".join(f"{name:>9}" for name in sides) + f"{'all':>9}")
    for part, row in sorted(by_part.items(), key=lambda item: -sum(item[1].values())):
        print(f"{'  ' + part:<58}" + "".join(f"{row.get(name, 0) / runs:>9.1f}" for name in sides)
              + f"{sum(row.values()) / runs:>9.1f}")
    print(f"{'  all':<58}" + "".join(f"{sum(r.get(name, 0) for r in by_part.values()) / runs:>9.1f}" for name in sides)
          + f"{sum(counted.values()) / runs:>9.1f}")


def run_figures(args: argparse.Namespace, sets: Measure, base: Measure, runs_m: Measure,
                kept: dict) -> list[tuple[str, str]]:
    """Per run, net of the idle background (``base``: the API and as many idle workers, per second), and against
    a plain ``SET`` round trip (``sets``)."""
    n, seconds = args.runs, runs_m.seconds
    set_cpu, set_command = sets.cpu_usec() / BASELINE_CALLS, sets.command_usec() / BASELINE_CALLS
    reads, writes = runs_m.round_trips()
    calls = (runs_m.calls() - base.calls() / base.seconds * seconds) / n
    cpu_idle = base.cpu_usec() / base.seconds
    cpu = (runs_m.cpu_usec() - cpu_idle * seconds) / n
    command = runs_m.command_usec() / n
    traffic, aof = (runs_m.net_in() + runs_m.net_out()) / n, runs_m.delta("aof_current_size") / n
    kept_bytes = (kept["used_memory"] - runs_m.before["used_memory"]) / n
    kept_keys = (kept.get("db0", {}).get("keys", 0) - runs_m.before.get("db0", {}).get("keys", 0)) / n
    core = (1e6 - cpu_idle) / cpu
    return [
        ("calls per run", f"{calls:.1f} ({runs_m.calls() / n:.1f} with the idle background over the block)"),
        ("round trips per run", f"{reads / n:.1f} requests read, {writes / n:.1f} replies written (with the idle "
                                f"background)"),
        ("command time per run", f"{command:.0f} us (commandstats usec; EXEC/EVALSHA not counted twice)"),
        ("main-thread CPU per run", f"{cpu:.0f} us ({runs_m.cpu_usec() / n:.0f} with the idle background's "
                                    f"{cpu_idle:.0f} us/s; I/O, parsing, commands, timers)"),
        ("a plain SET round trip", f"{set_cpu:.1f} us main-thread CPU, {set_command:.2f} us command time (one "
                                   f"client, {BASELINE_CALLS} in a row): a run costs Redis as much as "
                                   f"{cpu / set_cpu:.0f} of them"),
        ("bytes per run", f"in {runs_m.net_in() / n:.0f}, out {runs_m.net_out() / n:.0f}"),
        ("append-only file per run", f"{aof:.0f} bytes"),
        ("keys per kept run", f"{kept_keys:.2f} ({args.settle:.0f} s after the block; right after it "
                              f"{runs_m.keys() / n:.2f})"),
        ("memory per kept run", f"{kept_bytes:.0f} bytes (used_memory; right after the block "
                                f"{runs_m.delta('used_memory') / n:.0f})"),
        ("while measured", f"{n / seconds:.1f} runs/s kept Redis's main thread "
                           f"{runs_m.cpu_usec() / seconds / 1e4:.1f}% busy"),
        ("runs/s of one Redis core", f"{core:.0f} by main-thread CPU; {1e6 / command:.0f} by command time alone "
                                     f"(if Redis's CPU were the only limit; {1e6 / set_cpu:.0f} SETs/s)"),
        ("at that rate", f"network {traffic * core / 1e6:.1f} MB/s, append-only file {aof * core / 1e6:.1f} MB/s"),
        ("retention", f"records kept {defaults.RESULT_TTL_SECONDS / 3600:.0f} h by default: each run/s sustained "
                      f"keeps {kept_bytes * defaults.RESULT_TTL_SECONDS / 2**30:.2f} GiB"),
    ]


def scale_figures(args: argparse.Namespace, idles: dict[int, Measure], busy_m: Measure,
                  runs_m: Measure) -> list[tuple[str, str]]:
    """The background with K idle workers fitted linearly and extrapolated to ``SCALE`` workers; what a running run
    adds; the connections."""
    a, b = fit({k: m.calls() / m.seconds for k, m in idles.items()})
    cpu_a, cpu_b = fit({k: m.cpu_usec() / m.seconds for k, m in idles.items()})
    base = idles[args.workers]
    beat = (busy_m.calls() / busy_m.seconds - base.calls() / base.seconds) / args.workers
    beat_cpu = (busy_m.cpu_usec() / busy_m.seconds - base.cpu_usec() / base.seconds) / args.workers
    beat_out = (busy_m.net_out() / busy_m.seconds - base.net_out() / base.seconds) / args.workers
    measures = (*idles.values(), busy_m, runs_m)
    api = max(m.connections.get("api", 0) for m in measures)
    worker = max(v for m in measures for p, v in m.connections.items() if p != "api")
    return [
        ("idle background", f"{a:.2f} + {b:.3f} x K calls/s, {cpu_a:.0f} + {cpu_b:.1f} x K us CPU/s (least squares "
                            f"over K = {', '.join(map(str, idles))}); an idle worker's BLPOP returns every "
                            f"{RQ_DEQUEUE_SECONDS} s, outside the window"),
        (f"idle at {SCALE} workers", f"{a + SCALE * b:.1f} calls/s, {(cpu_a + SCALE * cpu_b) / 1e4:.2f}% of a core "
                                     f"(extrapolated linearly from the fit)"),
        ("a running run adds", f"{beat:.2f} calls/s, {beat_cpu:.0f} us CPU/s, {beat_out:.0f} bytes out/s (its "
                               f"heartbeat, its waiting caller)"),
        (f"{SCALE} workers all running", f"+{SCALE * beat:.0f} calls/s, {SCALE * beat_cpu / 1e4:.2f}% of a core "
                                         f"(extrapolated linearly)"),
        ("connections", f"API {api}, worker {worker} (most seen); one API and {SCALE} workers: {api + SCALE * worker}"
                        f" (Redis's maxclients: {runs_m.after.get('maxclients', 0):.0f})"),
    ]


def report(args: argparse.Namespace, sets: Measure, idles: dict[int, Measure], busy_m: Measure, runs_m: Measure,
           kept: dict, tally: Tally, parts: dict[tuple[str, str], int]) -> None:
    rates_table(f"\nidle and busy: the API and K workers, {args.seconds:.0f} s each (busy: {args.workers} sleep runs "
                f"running)", {**{f"idle K={k}": m for k, m in idles.items()}, "busy": busy_m})
    print(f"\nper run: {args.runs} runs in {runs_m.seconds:.1f} s ({args.runs / runs_m.seconds:.1f} runs/s), "
          f"concurrency {args.concurrency}, {args.workers} workers; {len(tally.failed)} failed, {len(tally.lost)} "
          f"lost, {len(tally.doubled)} run twice")
    per_run_table(runs_m, args.runs)
    print(f"\nper run, by part and by the process that sent it: {args.sampled} runs one at a time under MONITOR")
    parts_table(parts, args.sampled)
    print("\nfigures:")
    for name, text in (*run_figures(args, sets, idles[args.workers], runs_m, kept),
                       *scale_figures(args, idles, busy_m, runs_m)):
        print(f"  {name + ':':<28}{text}")


def measure(args: argparse.Namespace, stack: Stack, meter: Meter, control: redis.Redis, sets: Measure) -> None:
    asyncio.run(through_api(stack, args.warmup, args.concurrency, Tally()))
    idles = idle(stack, meter, control, args.idle_workers, args.seconds)
    set_workers(stack, control, args.workers)
    busy_m = asyncio.run(busy(stack, meter, control, args.workers, args.seconds))
    workers_idle(control)
    tally = Tally()
    meter.start()
    asyncio.run(through_api(stack, args.runs, args.concurrency, tally))
    time.sleep(TAIL_SECONDS)
    runs_m = meter.stop()
    time.sleep(args.settle)
    for _ in control.scan_iter(count=1000):  # SCAN deletes the expired keys it meets (Redis's active expiry lags)
        pass
    kept, _ = meter.sample()
    parts, one_by_one = asyncio.run(sampled(stack, args.sampled))
    if one_by_one.failed or one_by_one.lost:
        raise SystemExit(f"the sampled runs did not all finish: {(one_by_one.failed + one_by_one.lost)[:3]}")
    report(args, sets, idles, busy_m, runs_m, kept, tally, parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2, help="workers the runs go through (default 2)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20, help="length of each idle and busy window (default 20)")
    parser.add_argument("--idle-workers", default="1,2,4", help="worker counts measured idle (--workers is added)")
    parser.add_argument("--warmup", type=int, default=20, help="runs before measuring (default 20)")
    parser.add_argument("--settle", type=float, help="seconds after the runs until keys and memory per kept run "
                        f"are read (default {defaults.JOB_RESULT_TTL_SECONDS + 5}: RQ's job summaries gone, if kept)")
    parser.add_argument("--sampled", type=int, default=20, help="runs one at a time under MONITOR, counted by part "
                        "and process (default 20)")
    args = parser.parse_args()
    args.idle_workers = sorted({int(k) for k in args.idle_workers.split(",")} | {args.workers})
    args.settle = defaults.JOB_RESULT_TTL_SECONDS + 5 if args.settle is None else args.settle

    printed = Recording()
    with Stack("skillrun-redis-cost-") as stack, closing(Meter(stack.url, stack.server.port, stack.pids)) as meter, \
            redis.Redis.from_url(stack.url) as control:
        print(f"redis_cost: Redis {control.info('server')['redis_version']} (append-only, fsync every second), local "
              f"runtime; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start", flush=True)
        sets = baseline(meter, control)
        stack.start_api()
        for _ in range(args.workers):
            stack.start_worker()
        measure(args, stack, meter, control, sets)
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    publish("redis_cost", "What one run costs Redis",
            "From Redis's own counters (`INFO all`), less the meter's own calls and bytes.\n\n"
            + preformatted(printed.text()))


if __name__ == "__main__":
    main()
