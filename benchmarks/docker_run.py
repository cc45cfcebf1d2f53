"""The Docker runtime against the engine's own baselines, measured in one run.

* warm: a run in a workspace whose container is up (exec per run, with staging, variables, collection)
  vs a bare ``docker exec`` into a running container (the Docker SDK's exec_run);
* cold: the first run of a new workspace (create the workspace, stage, start the container, run)
  vs ``docker run --rm`` of the same image (the SDK's containers.run with remove=True).

Needs a running Docker engine and the sandbox image (images/build.sh).
Usage: .venv/bin/python benchmarks/docker_run.py [--runs N] [--cold-runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import docker  # noqa: E402

from benchmarks.figures import scratch_dir, summary_ms  # noqa: E402
from worker.contract import RunRequest, SkillRef  # noqa: E402
from worker.runtimes.container import DEFAULT_IMAGE, ContainerWorkspaceRuntime  # noqa: E402


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--cold-runs", type=int, default=20)
    args = parser.parse_args()
    client = docker.from_env()
    work = scratch_dir("skillrun-docker-bench-")
    runtime = ContainerWorkspaceRuntime(work, client=client)
    skill = SkillRef(name="python-math", root=str(ROOT / "skills"), path="python-math")
    bare_container = client.containers.run(DEFAULT_IMAGE, ["sleep", "infinity"], detach=True, network_mode="none")
    series: dict[str, list[float]] = {"bare exec": [], "warm run": [], "docker run --rm": [], "cold run": []}
    try:
        await runtime.run(RunRequest(skill=skill, command="true", workspace_id="warm"))
        for i in range(args.runs):
            t = time.perf_counter()
            bare_container.exec_run(["bash", "-c", "echo hi"])
            series["bare exec"].append(time.perf_counter() - t)
            t = time.perf_counter()
            result = await runtime.run(RunRequest(skill=skill, command="echo hi", workspace_id="warm"))
            series["warm run"].append(time.perf_counter() - t)
            assert result.stdout == "hi\n", result
            await runtime.idle()
        for i in range(args.cold_runs):
            t = time.perf_counter()
            client.containers.run(DEFAULT_IMAGE, ["bash", "-c", "echo hi"], remove=True, network_mode="none")
            series["docker run --rm"].append(time.perf_counter() - t)
            t = time.perf_counter()
            result = await runtime.run(RunRequest(skill=skill, command="echo hi", workspace_id=f"cold-{i}"))
            series["cold run"].append(time.perf_counter() - t)
            assert result.stdout == "hi\n", result
            runtime.remove_containers()
    finally:
        bare_container.remove(force=True)
        await runtime.close()
    print(f"docker runtime vs the engine, {args.runs} warm and {args.cold_runs} cold runs, command 'echo hi'")
    print(f"{'series':<16} {'median ms':>10} {'p95 ms':>8} {'ratio':>7}")
    for name, base in (("bare exec", "bare exec"), ("warm run", "bare exec"),
                       ("docker run --rm", "docker run --rm"), ("cold run", "docker run --rm")):
        (median, p95), (base_median, _) = summary_ms(series[name]), summary_ms(series[base])
        print(f"{name:<16} {median:>10.1f} {p95:>8.1f} {median / base_median:>6.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
