"""The Cube runtime's per-run overhead, against the E2B stand-in on loopback, measured in one run.

* local run: a warm local-runtime run of the command (the baseline the issue asks for);
* bare sandbox command: the ``e2b`` SDK's own ``commands.run`` of the command in a sandbox (the floor of any
  remote run: one command round trip through the SDK and the in-sandbox daemon);
* cube run: a warm Cube-runtime run (prepare the workspace, run, clean up);
* cube run + outputs: the same with an output file collected (pack, download, mirror, collect).

The stand-in runs sandbox commands on this machine, so the ratios show what skillrun adds on top of the
protocol, not a real network's latency.
Usage: .venv/bin/python benchmarks/cube_run.py [--runs N]
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

from benchmarks.figures import markdown_table, publish, scratch_dir, summary_ms  # noqa: E402
from tests.cube_server import CubeStandIn  # noqa: E402
from worker.config import CubeCodeExecutorConfig, CubeWorkspaceConfig  # noqa: E402
from worker.contract import RunRequest, SkillRef  # noqa: E402
from worker.runtimes.cube.runtime import CubeWorkspaceRuntime  # noqa: E402
from worker.runtimes.local.runtime import LocalWorkspaceRuntime  # noqa: E402

COMMAND = "echo hello"


async def timed(series: list[float], call) -> object:  # noqa: ANN001
    started = time.perf_counter()
    result = await call()
    series.append(time.perf_counter() - started)
    return result


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    work = scratch_dir("skillrun-cube-bench-")
    remote = work / "remote"
    remote.mkdir()
    skill = SkillRef(name="python-math", root=str(ROOT / "skills"), path="python-math")
    series: dict[str, list[float]] = {
        "local run": [],
        "bare sandbox command": [],
        "cube run": [],
        "cube run + outputs": [],
    }
    with CubeStandIn() as standin:
        if os.geteuid() == 0:
            os.chown(remote, standin.user_uid, standin.user_uid)
        config = CubeCodeExecutorConfig(api_url=standin.url, sandbox_url=standin.url, api_key=standin.api_key)
        cube = CubeWorkspaceRuntime(
            config=config, workspace_cfg=CubeWorkspaceConfig(root=str(remote)), work_root=work / "cube"
        )
        local = LocalWorkspaceRuntime(work / "local")
        warm = RunRequest(skill=skill, command=COMMAND, workspace_id="warm")
        outputs = RunRequest(
            skill=skill, command=f"{COMMAND} > out/hello.txt", workspace_id="warm", output_files=["out/*.txt"]
        )
        try:
            await local.run(warm)
            await cube.run(warm)
            sandbox = (await cube.executor_for("warm")).sandbox
            for _ in range(args.runs):
                result = await timed(series["local run"], lambda: local.run(warm))
                assert result.stdout == "hello\n", result
                await local.idle()
                bare = await timed(series["bare sandbox command"], lambda: sandbox.commands.run(COMMAND, user="user"))
                assert bare.stdout == "hello\n"
                result = await timed(series["cube run"], lambda: cube.run(warm))
                assert result.stdout == "hello\n", result
                await cube.idle()
                result = await timed(series["cube run + outputs"], lambda: cube.run(outputs))
                assert result.output_files[0].content == "hello\n", result
                await cube.idle()
        finally:
            await cube.close_workspace("warm")
            await cube.close()
            await local.close()
    print(f"cube runtime against the E2B stand-in, {args.runs} warm runs each, command {COMMAND!r}")
    print(f"{'series':<22} {'median ms':>10} {'p95 ms':>8} {'vs local':>9} {'vs bare':>8}")
    local, _ = summary_ms(series["local run"])
    bare, _ = summary_ms(series["bare sandbox command"])
    rows = []
    for name, samples in series.items():
        median, p95 = summary_ms(samples)
        print(f"{name:<22} {median:>10.1f} {p95:>8.1f} {median / local:>8.1f}x {median / bare:>7.2f}x")
        rows.append([name, f"{median:.1f}", f"{p95:.1f}", f"{median / local:.1f}x", f"{median / bare:.2f}x"])
    publish("cube_run", "Cube runtime",
            f"The Cube runtime against the E2B stand-in on loopback, {args.runs} warm runs of each series, command "
            f"`{COMMAND}`.\n\n" + markdown_table(["series", "median ms", "p95 ms", "vs local run", "vs bare sandbox command"],
                                                  rows))


if __name__ == "__main__":
    asyncio.run(main())
