"""Throughput of one-off runs through the HTTP API, and where each run's CPU goes.

Starts the deployed stack (``benchmarks.stack``: redis-server with an append-only file, the API, ``--workers``
``skillrun worker`` processes of the local runtime), then, measured in turn ``--repeats`` times:

* runtime alone: ``--baseline-runs`` one-off runs of ``true`` on the local runtime in this process, one after
  another (``LocalWorkspaceRuntime.run``: a new workspace, its sandbox, its removal), the baseline;
* through the API: ``--runs`` one-off runs of ``true`` submitted (``POST /v1/runs``) and awaited (``GET
  /v1/runs/{id}?wait=``) at ``--concurrency``, as a caller drives them, none lost, failed or run twice.

For each it prints runs/s and the CPU a run costs (user and system time from ``/proc``): the API, the workers
themselves, the workers' sandboxes (their children: launcher, ``setpriv``, ``bwrap``, the command's shell), Redis
and this process (the client), and the whole machine's busy time; the ratio of the API's runs/s to the runtime
alone's, and the runs/s the machine's cores would carry at that CPU per run. The target (issue 31) is 150 runs/s
through the API with two workers on a 2-core machine.

Usage: .venv/bin/python benchmarks/api_throughput.py [--runs 1000] [--baseline-runs 200] [--workers 2]
                                                     [--concurrency 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from benchmarks.api_runs import Tally, api_client, block  # noqa: E402
from benchmarks.figures import Recording, markdown_table, publish, scratch_dir  # noqa: E402
from benchmarks.stack import Stack, workers_idle  # noqa: E402
from worker.contract import RunRequest, SkillRef  # noqa: E402
from worker.roots.folders import remove_tree  # noqa: E402
from worker.runtimes.local.runtime import LocalWorkspaceRuntime  # noqa: E402

TARGET_RUNS_PER_SECOND = 150
TICKS = os.sysconf("SC_CLK_TCK")
WARMUP_RUNS = 30


@dataclass(frozen=True)
class Cpu:
    """A process's CPU seconds so far: its own (user, system) and its waited-for children's."""

    user: float
    system: float
    children: float

    @classmethod
    def of(cls, pid: int) -> "Cpu":
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        user, system, child_user, child_system = (int(x) / TICKS for x in fields[11:15])
        return cls(user, system, child_user + child_system)

    @classmethod
    def here(cls) -> "Cpu":
        times = os.times()
        return cls(times.user, times.system, times.children_user + times.children_system)

    def __sub__(self, other: "Cpu") -> "Cpu":
        return Cpu(self.user - other.user, self.system - other.system, self.children - other.children)


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (every core; idle and I/O wait left out)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICKS


@dataclass
class Block:
    runs: int
    seconds: float
    cpu: dict[str, Cpu]
    machine: float

    @property
    def rate(self) -> float:
        return self.runs / self.seconds

    def ms(self, seconds: float) -> float:
        return seconds / self.runs * 1000


async def runtime_alone(runtime: LocalWorkspaceRuntime, skill: SkillRef, runs: int) -> Block:
    before, busy, began = Cpu.here(), machine_busy(), time.perf_counter()
    for _ in range(runs):
        result = await runtime.run(RunRequest(skill=skill, command="true"))
        if result.exit_code != 0:
            raise SystemExit(f"a run of true on the local runtime failed: {result.stderr[:200]}")
        await runtime.end_one_off_workspace(result.workspace_id)
    return Block(runs, time.perf_counter() - began, {"this process": Cpu.here() - before}, machine_busy() - busy)


async def through_api(stack: Stack, runs: int, concurrency: int) -> Block:
    pids = {name: pid for name, pid in stack.pids().items()}
    before = {name: Cpu.of(pid) for name, pid in pids.items()} | {"client": Cpu.here()}
    busy, began, tally = machine_busy(), time.perf_counter(), Tally()
    async with api_client(stack.base_url, stack.key, concurrency) as client:
        await block(client, runs, concurrency, tally)
    seconds = time.perf_counter() - began
    after = {name: Cpu.of(pid) for name, pid in pids.items()} | {"client": Cpu.here()}
    if tally.failed or tally.lost or tally.doubled:
        raise SystemExit(f"runs went wrong: {len(tally.failed)} failed, {len(tally.lost)} lost, {len(tally.doubled)} "
                         f"run twice: {(tally.failed + tally.lost + tally.doubled)[:3]}")
    return Block(runs, seconds, {name: after[name] - before[name] for name in after}, machine_busy() - busy)


def cpu_rows(api: Block) -> list[list[str]]:
    """CPU per run by part: the API, the workers' own, their sandboxes, Redis, the client; the machine."""
    workers = [cpu for name, cpu in api.cpu.items() if name.startswith("worker")]
    parts = {
        "the API": (api.cpu["api"].user, api.cpu["api"].system),
        "the workers (own)": (sum(c.user for c in workers), sum(c.system for c in workers)),
        "their sandboxes (children)": (sum(c.children for c in workers), None),
        "Redis": (api.cpu["redis"].user, api.cpu["redis"].system),
        "the client (this process)": (api.cpu["client"].user, api.cpu["client"].system),
    }
    rows = []
    for name, (user, system) in parts.items():
        total = user + (system or 0)
        rows.append([name, f"{api.ms(total):.2f}", f"{api.ms(user):.2f}" if system is not None else "-",
                     f"{api.ms(system):.2f}" if system is not None else "-"])
    counted = sum(user + (system or 0) for user, system in parts.values())
    rows.append(["all of them", f"{api.ms(counted):.2f}", "", ""])
    rows.append(["the machine, busy", f"{api.ms(api.machine):.2f}", "", ""])
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--baseline-runs", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    printed = Recording()
    cores = os.cpu_count() or 1
    work_root = scratch_dir("skillrun-throughput-")
    runtime = LocalWorkspaceRuntime(work_root)
    skill = SkillRef(name="python-math", root=str(ROOT / "skills"), path="python-math")
    alone: list[Block] = []
    api: list[Block] = []
    try:
        with Stack("skillrun-throughput-") as stack:
            stack.start_api()
            for _ in range(args.workers):
                stack.start_worker()
            with redis.Redis.from_url(stack.url) as control:
                workers_idle(control, args.workers)
                print(f"api_throughput: {args.workers} workers, concurrency {args.concurrency}, {cores} cores, load "
                      f"average {os.getloadavg()[0]:.1f} at the start", flush=True)
                await runtime_alone(runtime, skill, min(WARMUP_RUNS, args.baseline_runs))
                await through_api(stack, WARMUP_RUNS, args.concurrency)
                for repeat in range(args.repeats):
                    alone.append(await runtime_alone(runtime, skill, args.baseline_runs))
                    workers_idle(control)
                    api.append(await through_api(stack, args.runs, args.concurrency))
                    print(f"  repeat {repeat + 1}: runtime alone {alone[-1].rate:.1f} runs/s, through the API "
                          f"{api[-1].rate:.1f} runs/s", flush=True)
    finally:
        await runtime.close()
        remove_tree(work_root)

    best = max(api, key=lambda b: b.rate)
    rate = statistics.median(b.rate for b in api)
    base = statistics.median(b.rate for b in alone)
    base_cpu = statistics.median(b.ms(b.cpu["this process"].user + b.cpu["this process"].system
                                      + b.cpu["this process"].children) for b in alone)
    machine = statistics.median(b.ms(b.machine) for b in api)
    print()
    print(markdown_table(
        ["series", "runs/s (median)", "CPU ms/run", "ratio", f"runs/s on {cores} cores at that CPU"],
        [["runtime alone", f"{base:.1f}", f"{base_cpu:.2f}", "1.00x", f"{cores * 1000 / base_cpu:.0f}"],
         ["through the API", f"{rate:.1f}", f"{machine:.2f}", f"{rate / base:.2f}x", f"{cores * 1000 / machine:.0f}"]]))
    print(f"\nCPU per run through the API, by part (the fastest of {args.repeats} repeats, "
          f"{best.rate:.1f} runs/s):")
    print(markdown_table(["part", "CPU ms/run", "user", "system"], cpu_rows(best)))
    verdict = "met" if rate >= TARGET_RUNS_PER_SECOND else "not met"
    print(f"\ntarget: {TARGET_RUNS_PER_SECOND} runs/s through the API with two workers: {verdict} ({rate:.1f})")
    publish("api_throughput", "Throughput through the API", printed.text())


if __name__ == "__main__":
    asyncio.run(main())
