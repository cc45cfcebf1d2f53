"""Throughput as workers are added: 500 short runs through Redis with 1, 2 and 4 workers.

For each worker count: enqueue the runs, start the workers, wait for every run, then check that none was lost
and none ran twice (each run finished, with one attempt, exactly one ``started`` event). Prints runs per second
and the speed-up over one worker. Starts its own redis-server on a free port.

``--containers``: each worker in a container of its own (the worker image, ``images/build.sh``) with no shared
volume — as on separate machines, so each is a node of its own and a kept workspace's runs go to the node it was
placed on. The workers start first and the runs are submitted once every node beats (placement picks among live
nodes), so this mode's clock runs from the first submission; the processes mode's from the workers' start.

``--runtime docker``: the runs execute on the Docker runtime (a container per kept workspace, reached through its
executor; the containers are made by the first runs, which are counted).

Usage: .venv/bin/python benchmarks/scale_out.py [--runs N] [--workers 1,2,4] [--containers] [--runtime docker]
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

from benchmarks.figures import markdown_table, publish, scratch_dir  # noqa: E402
from orchestrator.dispatch import QueueDispatcher  # noqa: E402
from orchestrator.skills import create_default_skill_repository  # noqa: E402
from tests.services import RedisServer  # noqa: E402
from worker.contract import RunRequest  # noqa: E402
from worker.jobs.nodes import live_nodes  # noqa: E402
from worker.run_store import RunStatus  # noqa: E402


async def measure(url: str, workers: int, runs: int, work: Path, containers: bool, runtime: str) -> float:
    ref = create_default_skill_repository(str(ROOT / "skills")).skill_ref("python-math")
    dispatcher = QueueDispatcher(url)
    requests = [RunRequest(skill=ref, command="echo run $RUN_DIR", workspace_id=f"w{i % 16}", runtime=runtime)
                for i in range(runs)]
    if containers:
        stop = _worker_containers(url, workers)
        while len(live_nodes(dispatcher.redis, "local")) < workers:
            await asyncio.sleep(0.1)
        started = time.perf_counter()
        ids = [(await dispatcher.submit(request)).id for request in requests]
    else:
        ids = [(await dispatcher.submit(request)).id for request in requests]
        env = {**os.environ, "SKILLRUN_WORK_ROOT": str(work)}
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "worker", "--redis-url", url, "--burst", "--concurrency",
                                 str(workers), "--runtime", runtime], env=env, cwd=ROOT)
        stop = lambda: proc.wait(timeout=120)  # noqa: E731 - burst workers end once the queue is empty
    try:
        for run_id in ids:
            record = await dispatcher.wait(run_id, 300)
            assert record is not None and record.status == RunStatus.FINISHED, f"run {run_id} lost: {record}"
        elapsed = time.perf_counter() - started
    finally:
        stop()
    for run_id in ids:
        record = await dispatcher.get(run_id)
        starts = [e for e in await dispatcher.events(run_id) if e.type == "started"]
        assert record.attempts == 1 and len(starts) == 1, f"run {run_id} ran {len(starts)} times"
    await dispatcher.close()
    return runs / elapsed


def _worker_containers(url: str, count: int):
    """``count`` worker containers on the host's network (Redis on loopback), each with only its own file system;
    the skills folder mounted read-only at the path runs name it by. Returns what removes them."""
    import docker

    try:
        client = docker.from_env()
        client.images.get("skillrun/worker:latest")
    except docker.errors.DockerException as exc:
        raise SystemExit(f"--containers needs a Docker engine and the worker image: start dockerd and run "
                         f"images/build.sh ({exc})") from None
    skills = str(ROOT / "skills")
    boxes = [client.containers.run(
        "skillrun/worker:latest", ["python", "-m", "worker", "--redis-url", url], detach=True, network_mode="host",
        cap_add=["SYS_ADMIN"], security_opt=["seccomp=unconfined", "apparmor=unconfined"], init=True,
        volumes={skills: {"bind": skills, "mode": "ro"}},
        environment={"SKILLRUN_UID_REGISTRY": "/var/lib/skillrun/workspaces/.skillrun/uid-registry"},
    ) for _ in range(count)]

    def remove() -> None:
        for box in boxes:
            box.reload()
            if box.status != "running":  # it should not have stopped: say how it ended
                print(f"worker container {box.short_id} {box.status}: {box.logs(tail=20).decode(errors='replace')}",
                      file=sys.stderr)
            box.remove(force=True)

    return remove


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--containers", action="store_true", help="each worker in a container of its own, no shared volume")
    parser.add_argument("--runtime", choices=["local", "docker"], default="local",
                        help="where the runs execute (docker: each workspace's container, through its executor)")
    args = parser.parse_args()
    if args.containers and args.runtime != "local":
        parser.error("--containers measures the local runtime (its worker containers have no Docker engine)")
    counts = [int(n) for n in args.workers.split(",")]
    results = {}
    for n in counts:
        server = RedisServer()
        work = scratch_dir("skillrun-scale-")
        try:
            results[n] = await measure(server.url(), n, args.runs, work, args.containers, args.runtime)
            print(f"  {n} worker(s): {results[n]:.1f} runs/s", file=sys.stderr)
        finally:
            server.stop()
            subprocess.run(["rm", "-rf", str(work)], check=False)
    where = "workers in containers of their own, no shared volume" if args.containers else "worker processes"
    print(f"{args.runs} short runs per point on the {args.runtime} runtime ({where}; 16 kept workspaces), none lost, "
          f"none run twice; {os.cpu_count()} cores")
    print(f"{'workers':<8} {'runs/s':>8} {'speed-up':>9}")
    for n in counts:
        print(f"{n:<8} {results[n]:>8.1f} {results[n] / results[counts[0]]:>8.2f}x")
    publish("scale_out", "Scale-out",
            f"{args.runs} short runs per point on the {args.runtime} runtime ({where}; 16 kept workspaces), none lost, "
            f"none run twice.\n\n" + markdown_table(
                ["workers", "runs/s", "speed-up over one"],
                [[n, f"{results[n]:.1f}", f"{results[n] / results[counts[0]]:.2f}x"] for n in counts]))


if __name__ == "__main__":
    asyncio.run(main())
