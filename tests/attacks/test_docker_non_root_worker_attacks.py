"""Attacks from a run on the executor of a Docker worker that does not run as root: there the run's user is the
worker's own, which owns the executor's control folder on the host. Each test runs its worker for real, as a user
of its own in a process of its own (in the engine's group, as a non-root worker is), on runc and gVisor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import unavailable

pytestmark = [pytest.mark.docker, pytest.mark.root]  # root: to start the worker as another user

WORKER_UID = 61000
"""The non-root worker's user: no workspace's (30000-59999), no container resident's (65533), no host user's."""
DOCKER_HOST = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
REPO = Path(__file__).resolve().parents[2]
WORKER = r"""
import asyncio, json, os, sys
from worker.contract import RunRequest, SkillRef
from worker.runtimes.docker.runtime import ContainerWorkspaceRuntime

spec = json.loads(sys.argv[1])
os.setgroups([spec["docker_gid"]])  # imported first, as root: the interpreter may live where this user cannot look
os.setgid(spec["uid"])
os.setuid(spec["uid"])


async def main():
    runtimes = [ContainerWorkspaceRuntime(spec["work_root"], oci_runtime=spec["oci_runtime"]) for _ in range(2)]
    results = []
    try:
        for worker, command in spec["runs"]:
            result = await runtimes[worker].run(RunRequest(
                skill=SkillRef(name="demo", root=spec["library"], path="demo"), command=command,
                workspace_id="attacked", timeout=30))
            results.append({"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code,
                            "exec_via": result.timings.exec_via})
    finally:
        for runtime in runtimes:
            runtime.remove_containers()
    print(json.dumps(results))


asyncio.run(main())
"""
"""A non-root worker: two runtimes on one work root (two workers), each run ``(worker, command)`` in turn."""


def _non_root_worker(work_root: Path, library: Path, oci_runtime: str, runs: list[tuple[int, str]]) -> list[dict]:
    """The results of ``runs`` in one workspace of a worker running as ``WORKER_UID``."""
    if not DOCKER_HOST.startswith("unix://"):
        unavailable(f"a worker of another user reaches the engine by its socket's group: DOCKER_HOST={DOCKER_HOST}")
    root = work_root / "non-root"
    root.mkdir()
    os.chown(root, WORKER_UID, WORKER_UID)
    spec = {"work_root": str(root), "library": str(library), "oci_runtime": oci_runtime, "runs": runs,
            "uid": WORKER_UID, "docker_gid": os.stat(DOCKER_HOST.removeprefix("unix://")).st_gid}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, json.dumps(spec)], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={"PATH": os.environ["PATH"], "HOME": str(root), "PYTHONPATH": str(REPO), "DOCKER_HOST": DOCKER_HOST},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


REACH_THE_SOCKET = (  # each line's last says what the attempt got
    "ls -A /.skillrun/control 2>&1 | tail -1; cat /.skillrun/control/token 2>&1 | tail -1; "
    "rm -f /.skillrun/control/sock 2>&1 | tail -1; mv /.skillrun/control/sock /tmp/sock 2>&1 | tail -1; "
    "for path in /.skillrun/control/sock /proc/1/root/.skillrun/control/sock /proc/1/cwd/.skillrun/control/sock; do "
    "python3 -c \"import socket, sys; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(); "
    "print('planted')\" $path 2>&1 | tail -1; done; kill -STOP 1 2>&1 | tail -1"
)


@pytest.mark.parametrize("oci_runtime", ["runc", "runsc"])
def test_docker_a_run_on_a_non_root_worker_cannot_remove_or_replace_the_executor_socket(
        docker_engine, work_root, library, oci_runtime):
    """The worker's user owns the control folder and runs the commands: the folder is out of their reach all the
    same (below a file system only root may enter), the executor is another user, and a second worker, which
    connects by the socket's path, still runs the workspace's next run through the executor."""
    if oci_runtime != "runc":
        docker_engine.require_runtime(oci_runtime)
    attack, after = _non_root_worker(work_root, library, oci_runtime, [
        (0, f"id -u; {REACH_THE_SOCKET}"), (1, "id -u; echo served")])
    uid, *attempts = attack["stdout"].splitlines()
    assert uid == str(WORKER_UID) and len(attempts) == 8, attack
    assert all("Permission denied" in line or "Operation not permitted" in line for line in attempts), attack
    assert (attack["exec_via"], after["exec_via"]) == ("executor", "executor"), (attack, after)
    assert after["stdout"] == f"{WORKER_UID}\nserved\n", after
