"""The Docker runtime against a warm local run and the engine's own baselines, measured in one run.

Warm (interleaved: each series goes first in turn, background work awaited between measurements):
* local       a warm run of the local runtime in this process (same skill and command): the target's baseline
* bare exec   a bare ``docker exec`` into a running container of the sandbox image (the SDK's exec_run)
* warm        a run in a workspace whose container is up, through the container's executor (staging, variables,
              the end of the run and collection included)
and, when the engine has gVisor (``runsc``), ``bare exec`` and ``warm`` again in gVisor containers.

Cold (the first run of a new workspace: create the workspace, stage, start the container, run):
* docker run  ``docker run`` of the same image and command, waited for to its end; its removal is not timed, as the
              cold run's container is removed after the measurement too (like with like)
* cold        the first run of a new workspace, its container made for it
* pool        the first run of a new workspace that takes a warm container (``pool_size=2``; the pool's refill
              is awaited between measurements, as a model's thinking time would cover it)
* by name     the same through the Python API's path, ``resolve_runtime("docker")`` with the worker settings' pool
              (``SKILLRUN_DOCKER_POOL_SIZE``, default 2), begun by ``start(skill)`` instead of a warming run
and all four again on gVisor.

Needs a running Docker engine and the sandbox image (images/build.sh).
Usage: .venv/bin/python benchmarks/docker_run.py [--runs N] [--cold-runs N] [--no-gvisor]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import docker  # noqa: E402

from benchmarks.figures import Recording, preformatted, publish, scratch_dir, summary_ms  # noqa: E402
from worker.contract import RunRequest, SkillRef  # noqa: E402
from worker.runtimes import resolve_runtime  # noqa: E402
from worker.runtimes.docker.runtime import DEFAULT_IMAGE, ContainerWorkspaceRuntime  # noqa: E402
from worker.runtimes.local.runtime import LocalWorkspaceRuntime  # noqa: E402

COMMAND = "echo hi"
SKILL = SkillRef(name="python-math", root=str(ROOT / "skills"), path="python-math")
GVISOR = "runsc"


async def interleaved(steps: dict[str, Callable[[], Awaitable[None]]], rounds: int, idle: Callable[[], Awaitable[None]],
                      label: str) -> dict[str, list[float]]:
    """Time each step ``rounds`` times, each going first in turn, ``idle`` awaited after every measurement."""
    samples: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    for i in range(rounds):
        for name in order[i % len(order):] + order[: i % len(order)]:
            started = time.perf_counter()
            await steps[name]()
            samples[name].append(time.perf_counter() - started)
            await idle()
        if (i + 1) % 50 == 0 or i + 1 == rounds:
            print(f"  {i + 1}/{rounds} {label}", file=sys.stderr)
    return samples


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--cold-runs", type=int, default=20)
    parser.add_argument("--no-gvisor", action="store_true", help="leave gVisor out even where the engine has it")
    args = parser.parse_args()
    client = docker.from_env()
    oci = ["runc"] + ([GVISOR] if not args.no_gvisor and GVISOR in client.info().get("Runtimes", {}) else [])
    work = scratch_dir("skillrun-docker-bench-")
    local = LocalWorkspaceRuntime(work / "local")
    docker_runtimes = {name: ContainerWorkspaceRuntime(work / name, client=client, oci_runtime=name) for name in oci}
    pooled = {name: ContainerWorkspaceRuntime(work / f"{name}-pool", client=client, oci_runtime=name, pool_size=2)
              for name in oci}
    named = {name: resolve_runtime("docker", work_root=work / f"{name}-named", client=client, oci_runtime=name)
             for name in oci}
    bare = {name: client.containers.run(DEFAULT_IMAGE, ["sleep", "infinity"], detach=True, network_mode="none",
                                        runtime=name) for name in oci}
    everything = [local, *docker_runtimes.values(), *pooled.values(), *named.values()]

    async def idle() -> None:
        for runtime in everything:
            await runtime.idle()

    def run_in(runtime, workspace_id: str) -> Callable[[], Awaitable[None]]:  # noqa: ANN001
        async def step() -> None:
            result = await runtime.run(RunRequest(skill=SKILL, command=COMMAND, workspace_id=workspace_id))
            assert result.stdout == "hi\n", result
        return step

    def bare_exec(name: str) -> Callable[[], Awaitable[None]]:
        async def step() -> None:
            assert bare[name].exec_run(["bash", "-c", COMMAND]).output == b"hi\n"
        return step

    try:
        for runtime in named.values():
            await runtime.start(SKILL)  # fills for the skill's library at once: no run taught it
        for runtime in everything:
            if runtime not in named.values():
                await runtime.run(RunRequest(skill=SKILL, command="true", workspace_id="warm"))
        warm_steps = {"local": run_in(local, "warm")}
        for name, runtime in docker_runtimes.items():
            warm_steps[f"bare exec/{name}"] = bare_exec(name)
            warm_steps[f"warm/{name}"] = run_in(runtime, "warm")
        warm = await interleaved(warm_steps, args.runs, idle, "warm rounds")
        cold: dict[str, list[float]] = {}
        for name, runtime in docker_runtimes.items():
            counter = iter(range(10**6))
            pool = pooled[name]

            async def docker_run(name: str = name) -> None:
                container = client.containers.run(DEFAULT_IMAGE, ["bash", "-c", COMMAND], detach=True,
                                                  network_mode="none", runtime=name)
                assert container.wait()["StatusCode"] == 0

            async def cold_run(runtime=runtime) -> None:  # noqa: ANN001
                await run_in(runtime, f"cold-{next(counter)}")()

            taken: list[str] = []
            taken_by_name: list[str] = []

            async def pool_run(pool=pool, taken=taken) -> None:  # noqa: ANN001
                taken.append(f"cold-{next(counter)}")
                await run_in(pool, taken[-1])()

            async def named_run(runtime=named[name], taken=taken_by_name) -> None:  # noqa: ANN001
                taken.append(f"cold-{next(counter)}")
                await run_in(runtime, taken[-1])()

            async def clean_up(runtime=runtime, pool=pool, taken=taken, by_name=named[name],  # noqa: ANN001
                               taken_by_name=taken_by_name) -> None:
                for container in client.containers.list(all=True, filters={"ancestor": DEFAULT_IMAGE, "status": "exited"}):
                    container.remove(force=True)
                runtime.remove_containers()
                while taken:  # a taken container goes with its workspace; the warm ones stay
                    pool.remove_workspace(taken.pop())
                while taken_by_name:
                    by_name.remove_workspace(taken_by_name.pop())
                await pool.idle()
                await by_name.idle()

            await run_in(pool, "warming")()  # the pool learns what new workspaces need, and fills
            await pool.idle()
            cold |= {f"{key}/{name}": value for key, value in (await interleaved(
                {"docker run": docker_run, "cold": cold_run, "pool": pool_run, "by name": named_run}, args.cold_runs,
                clean_up,
                f"cold rounds ({name})")).items()}
    finally:
        for container in bare.values():
            container.remove(force=True)
        for runtime in everything:
            await runtime.close()

    printed = Recording()
    print(f"docker runtime ({', '.join(oci)}), {args.runs} warm and {args.cold_runs} cold runs, command {COMMAND!r}")
    print(f"{'series':<22} {'median ms':>10} {'p95 ms':>8} {'vs local':>9} {'vs engine':>10}")
    local_median = summary_ms(warm["local"])[0]
    print(f"{'local (warm)':<22} {local_median:>10.2f} {summary_ms(warm['local'])[1]:>8.2f} {1:>8.2f}x {'':>10}")
    for name in oci:
        bare_median, bare_p95 = summary_ms(warm[f"bare exec/{name}"])
        median, p95 = summary_ms(warm[f"warm/{name}"])
        print(f"{'bare docker exec/' + name:<22} {bare_median:>10.2f} {bare_p95:>8.2f} {bare_median / local_median:>8.2f}x {1:>9.2f}x")
        print(f"{'warm run/' + name:<22} {median:>10.2f} {p95:>8.2f} {median / local_median:>8.2f}x {median / bare_median:>9.3f}x")
    for name in oci:
        base_median, base_p95 = summary_ms(cold[f"docker run/{name}"])
        median, p95 = summary_ms(cold[f"cold/{name}"])
        print(f"{'docker run/' + name:<22} {base_median:>10.1f} {base_p95:>8.1f} {'':>9} {1:>9.2f}x")
        print(f"{'first run/' + name:<22} {median:>10.1f} {p95:>8.1f} {'':>9} {median / base_median:>9.2f}x")
        median, p95 = summary_ms(cold[f"pool/{name}"])
        print(f"{'first run, pool/' + name:<22} {median:>10.1f} {p95:>8.1f} {'':>9} {median / base_median:>9.3f}x")
        median, p95 = summary_ms(cold[f"by name/{name}"])
        print(f"{'first run, by name/' + name:<22} {median:>10.1f} {p95:>8.1f} {'':>9} {median / base_median:>9.3f}x")
    publish("docker_run", "Docker runtime",
            "Warm runs against a warm local run and a bare `docker exec`; first runs against `docker run` of the same "
            "image and command.\n\n" + preformatted(printed.text()))


if __name__ == "__main__":
    asyncio.run(main())
