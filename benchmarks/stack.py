"""The deployed stack the API benchmarks drive, all on this host: a redis-server with an append-only file (fsync every
second, Redis's default with it), a team and its API key, the API (``skillrun serve`` with ``SKILLRUN_REDIS_URL``) and
``skillrun worker`` processes of the local runtime, their output discarded.

``Stack`` is a context manager: leaving it, also on Ctrl-C, stops every process it started, Redis too, and removes
its folders.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import redis
from rq import Worker

from benchmarks.figures import scratch_dir
from orchestrator.documents import RedisDocuments
from orchestrator.teams import TeamStore
from tests.orchestrator.api_helpers import new_team
from tests.services import RedisServer, free_port
from worker.roots.folders import remove_tree

ROOT = Path(__file__).resolve().parent.parent
API_START_SECONDS = 60
STOP_SECONDS = 60
IDLE_WAIT_SECONDS = 30


class Stack:
    """Redis, a team, the API and workers; ``result_ttl``: seconds run records are kept (default: Skillrun's)."""

    def __init__(self, prefix: str, result_ttl: int | None = None) -> None:
        self.prefix = prefix
        self.result_ttl = result_ttl
        self.work: Path | None = None
        self.server: RedisServer | None = None
        self.teams: TeamStore | None = None
        self.api: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    def __enter__(self) -> Stack:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _start(self) -> None:
        self.work = scratch_dir(self.prefix)
        self.work_root = self.work / "work"
        self.work_root.mkdir(mode=0o755)
        self.server = RedisServer(persistent=True)
        with redis.Redis.from_url(self.url) as client:
            client.config_set("appendfsync", "everysec")  # Redis's default with append-only
        self.teams = TeamStore(RedisDocuments(self.url))
        self.key = new_team(SimpleNamespace(teams=self.teams), "bench")
        self.env = {**os.environ, "SKILLRUN_REDIS_URL": self.url, "SKILLS_ROOT": str(ROOT / "skills"),
                    "SKILLRUN_DATA_DIR": str(self.work / "data"), "SKILLRUN_WORK_ROOT": str(self.work_root),
                    "SKILLRUN_ARTIFACTS_DIR": str(self.work / "artifacts")}
        if self.result_ttl is not None:
            self.env["SKILLRUN_RESULT_TTL_SECONDS"] = str(self.result_ttl)

    @property
    def url(self) -> str:
        return self.server.url()

    def _spawn(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], env=self.env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start_api(self) -> str:
        """Start the API on a free port and wait until it answers; return its base URL."""
        port = free_port()
        self.api = self._spawn("serve", "--port", str(port))
        self.base_url = f"http://127.0.0.1:{port}"
        wait_for_api(self.base_url, self.api)
        return self.base_url

    def start_worker(self) -> subprocess.Popen:
        self.workers.append(self._spawn("worker"))
        return self.workers[-1]

    def stop_worker(self) -> None:
        """Stop the worker started last."""
        stop(self.workers.pop())

    def pids(self) -> dict[str, int]:
        """The processes by name: ``api``, ``worker1``… and ``redis``."""
        named = {"api": self.api.pid} if self.api else {}
        named |= {f"worker{i}": proc.pid for i, proc in enumerate(self.workers, 1)}
        return named | {"redis": self.server.proc.pid}

    def close(self) -> None:
        procs = [proc for proc in (self.api, *self.workers) if proc is not None]
        for proc in procs:
            proc.terminate()
        for proc in procs:
            reap(proc)
        self.api, self.workers = None, []
        if self.teams is not None:
            self.teams.docs.close()
        if self.server is not None:
            self.server.stop()
        if self.work is not None:
            remove_tree(self.work)
        self.teams = self.server = self.work = None


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    reap(proc)


def reap(proc: subprocess.Popen) -> None:
    """Wait for a terminated ``proc``; kill it after ``STOP_SECONDS``."""
    try:
        proc.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for_api(url: str, api: subprocess.Popen) -> None:
    deadline = time.monotonic() + API_START_SECONDS
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if api.poll() is not None:
            raise SystemExit("the API did not start")
        time.sleep(0.1)
    raise SystemExit(f"the API did not answer within {API_START_SECONDS} s")


def workers_idle(client: redis.Redis, count: int | None = None) -> None:
    """Wait until no worker is busy (a worker removes a one-off run's workspace after storing its result) and, given
    ``count``, that many workers are registered."""
    deadline = time.monotonic() + IDLE_WAIT_SECONDS
    while time.monotonic() < deadline:
        workers = Worker.all(connection=client)
        if all(w.get_state() == "idle" for w in workers) and count in (None, len(workers)):
            return
        time.sleep(0.05)
