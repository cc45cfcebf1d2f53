"""Per-run overhead of the local runtime against a bare ``subprocess.run(["bash", "-c", cmd])``.

All are measured in this process, interleaved, each series going first in turn and background housekeeping
awaited between measurements, so a noisy machine slows all alike; the figure that matters is the ratio of
medians. The series:

* bare       subprocess.run(["bash", "-c", cmd], capture_output=True)
* ready bash a bash started before the measurement and waiting on its stdin, given the command and read to its end:
             the fair baseline of a warm run, which is a ready shell too (the next one is started between
             measurements and waited for until it reads its stdin, as the runtime starts its next ready shell in
             the background and `idle` waits for it)
* warm       a run in an existing workspace (skill already staged): the everyday case
* cold       the first run of a new workspace: create + stage + run
* shared-uid (as root only) a warm run with per-workspace users turned off, to show what that isolation costs
* unboxed    (as root only) warm and cold runs with the sandbox turned off (bubblewrap, PID namespace, per-run
             control group), to show what it costs

As root, the same bare, ready, warm and cold series are then measured again as a normal account (the tests' one,
``tests.normal_user``, made if missing), whose runs are sandboxed in unprivileged user namespaces without workspace
users or control groups: a second process of this script (``--series-json``), with its own same-run baselines,
printed beside root's. Run as a normal account, the script measures that account's series alone.

Usage: .venv/bin/python benchmarks/local_run.py [--runs N] [--command CMD] [--series-json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest  # noqa: E402

from benchmarks.figures import markdown_table, publish, scratch_dir, summary_ms  # noqa: E402
from tests.normal_user import REPO, normal_account, run_as  # noqa: E402
from tests.normal_user import python as account_python  # noqa: E402
from worker.contract import RunRequest, SkillRef  # noqa: E402
from worker.runtimes.local.runtime import LocalWorkspaceRuntime  # noqa: E402

LIBRARY = Path(__file__).resolve().parent.parent / "skills"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--command", default="echo hello")
    parser.add_argument("--series-json", action="store_true",
                        help="print this account's series as JSON, publish nothing (root's run of the script asks so)")
    args = parser.parse_args()
    rows = await measure(args)
    if args.series_json:
        print(json.dumps(rows))
        return
    as_root = os.geteuid() == 0
    print(f"local runtime vs bare bash -c, {args.runs} runs each, command {args.command!r}, "
          f"{'root (per-workspace users)' if as_root else 'non-root'}")
    _print(rows)
    account_rows, account = (_as_normal_account(args) if as_root else (None, None))
    if account_rows is not None:
        print(f"as the normal account {account} (sandboxed in unprivileged user namespaces, no control groups):")
        _print(account_rows)
    tables = markdown_table(["series", "median ms", "p95 ms", "ratio (median)"], [_cells(row) for row in rows])
    if account_rows is not None:
        tables += (f"\n\nThe same series as the normal account `{account}` (not root: sandboxed in unprivileged user "
                   "namespaces, without workspace users or control groups), in a process of its own with its own "
                   "baselines:\n\n"
                   + markdown_table(["series", "median ms", "p95 ms", "ratio (median)"],
                                    [_cells(row) for row in account_rows]))
    publish("local_run", "Local runtime",
            f"{args.runs} runs of each series, command `{args.command}`, "
            f"{'as root (per-workspace users)' if as_root else 'not root'}. The ratio is each median against its "
            "baseline: `bare` (`bash -c`) for the series after it, and `warm/ready` is warm against the ready bash.\n\n"
            + tables)


def _print(rows: list[list]) -> None:
    print(f"{'series':<10} {'median ms':>10} {'p95 ms':>8} {'ratio (median)':>15}  (warm/ready: warm against ready bash)")
    for name, med, p95, ratio in rows:
        print(f"{name:<10} {med:>10.2f} {p95:>8.2f} {ratio:>15.2f}")


def _cells(row: list) -> list[str]:
    name, med, p95, ratio = row
    return [name, f"{med:.2f}", f"{p95:.2f}", f"{ratio:.2f}"]


def _as_normal_account(args: argparse.Namespace) -> tuple[list[list] | None, str | None]:
    """The series measured again by this script as the tests' normal account (``--series-json``)."""
    try:
        account = normal_account()
    except (pytest.skip.Exception, pytest.fail.Exception) as exc:
        print(f"the normal account's series: not measured ({exc})", file=sys.stderr)
        return None, None
    print(f"  the same series as the normal account {account.name}", file=sys.stderr)
    done = run_as(account, [account_python(account), str(Path(__file__).resolve()), "--runs", str(args.runs),
                            "--command", args.command, "--series-json"], cwd=REPO, timeout=3600)
    if done.returncode != 0:
        print(f"the normal account's series failed: {done.stderr[-2000:]}", file=sys.stderr)
        return None, None
    return json.loads(done.stdout.splitlines()[-1]), account.name


async def measure(args: argparse.Namespace) -> list[list]:
    """Every series of this account: name, median and p95 in milliseconds, ratio of medians to its baseline."""

    work_root = scratch_dir("skillrun-bench-")
    runtime = LocalWorkspaceRuntime(work_root)
    as_root = os.geteuid() == 0
    shared_runtime = LocalWorkspaceRuntime(work_root / "shared", isolate_users=False) if as_root else None
    unboxed_runtime = LocalWorkspaceRuntime(work_root / "unboxed", sandbox=False) if as_root else None
    runtimes = [rt for rt in (runtime, shared_runtime, unboxed_runtime) if rt is not None]
    skill = SkillRef(name="python-math", root=str(LIBRARY), path="python-math")
    bare, ready, warm, cold, shared, unboxed, cold_unboxed, cold_bare = [], [], [], [], [], [], [], []
    waiting = [_ready_bash()]
    try:
        for rt in runtimes:
            await rt.run(RunRequest(skill=skill, command=args.command, workspace_id="warm"))
        async def run_bare() -> None:
            subprocess.run(["bash", "-c", args.command], capture_output=True)

        async def run_ready() -> None:
            shell = waiting.pop()
            shell.communicate(args.command.encode())

        async def run_in(rt: LocalWorkspaceRuntime) -> None:
            result = await rt.run(RunRequest(skill=skill, command=args.command, workspace_id="warm"))
            assert result.exit_code == 0, result.stderr

        series = [(bare, run_bare), (ready, run_ready), (warm, lambda: run_in(runtime))]
        if as_root:
            series += [(shared, lambda: run_in(shared_runtime)), (unboxed, lambda: run_in(unboxed_runtime))]
        for i in range(args.runs):
            # Each series goes first as often as the others: what one leaves behind lands on all alike.
            for samples, step in series[i % len(series):] + series[: i % len(series)]:
                t = time.perf_counter()
                await step()
                samples.append(time.perf_counter() - t)
                # Between two runs of a session a model is thinking; let housekeeping (the next spare run
                # folder) finish, so it does not land on the next measurement.
                for rt in runtimes:
                    await rt.idle()
                if not waiting:
                    waiting.append(_ready_bash())
            if (i + 1) % 50 == 0:
                print(f"  {i + 1}/{args.runs} warm runs of each", file=sys.stderr)
        # New workspaces in a phase of their own: each leaves the kernel tearing down its network namespace for
        # a while after the run, which would otherwise land on whichever warm measurement came next.
        cold_series = [(cold, runtime)] + ([(cold_unboxed, unboxed_runtime)] if as_root else [])
        for i in range(args.runs):
            t = time.perf_counter()
            subprocess.run(["bash", "-c", args.command], capture_output=True)
            cold_bare.append(time.perf_counter() - t)
            for samples, rt in cold_series[i % len(cold_series):] + cold_series[: i % len(cold_series)]:
                t = time.perf_counter()
                result = await rt.run(RunRequest(skill=skill, command=args.command, workspace_id=f"cold-{i}"))
                samples.append(time.perf_counter() - t)
                assert result.exit_code == 0, result.stderr
            if (i + 1) % 50 == 0:
                print(f"  {i + 1}/{args.runs} cold runs", file=sys.stderr)
    finally:
        for shell in waiting:
            shell.kill()
            shell.wait()
        for rt in runtimes:
            await rt.close()
        shutil.rmtree(work_root, ignore_errors=True)

    series = [("bare", bare, bare), ("ready bash", ready, bare), ("warm", warm, bare), ("warm/ready", warm, ready)]
    series += [("shared-uid", shared, bare), ("unboxed", unboxed, bare)] if as_root else []
    series += [("bare", cold_bare, cold_bare), ("cold", cold, cold_bare)]
    series += [("cold-unbox", cold_unboxed, cold_bare)] if as_root else []
    rows = []
    for name, samples, baseline in series:
        (med, p95), (base, _) = summary_ms(samples), summary_ms(baseline)
        rows.append([name, med, p95, med / base])
    return rows


def _ready_bash() -> subprocess.Popen:
    """A bash waiting for its script on stdin, its output piped: the baseline's ready shell. It is returned once it
    has answered a first line, so it waits on its stdin as the runtime's ready shells do when ``idle`` returns (a
    bash still starting would land its start on whichever measurement came next)."""
    shell = subprocess.Popen(["bash"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    shell.stdin.write(b"echo up\n")
    shell.stdin.flush()
    if shell.stdout.readline() != b"up\n":
        raise RuntimeError("the baseline's ready bash did not start")
    return shell


if __name__ == "__main__":
    asyncio.run(main())
