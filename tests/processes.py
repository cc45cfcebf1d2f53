"""Looking at processes from tests."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def wait_gone(pid: int, seconds: float = 5.0) -> bool:
    """Whether ``pid`` stops running within ``seconds``."""
    return _within(seconds, lambda: not alive(pid))


def _within(seconds: float, done) -> bool:  # noqa: ANN001 - a callable returning bool
    """Whether ``done()`` holds within ``seconds`` (looked at every 20 ms)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if done():
            return True
        time.sleep(0.02)
    return False


def sleeper() -> tuple[str, str]:
    """A ``sleep`` command with an argument no other process has, and that argument: a test finds the process by
    it from the host, whatever its pid is inside a run's sandbox (a PID namespace of its own)."""
    seconds = f"{60 + random.random():.9f}"
    return f"sleep {seconds}", seconds


def running_with(argument: str) -> list[int]:
    """Host pids of running processes with ``argument`` on their command line."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                if argument.encode() in f.read().split(b"\0") and alive(int(entry.name)):
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_none_with(argument: str, seconds: float = 5.0) -> bool:
    """Whether every process with ``argument`` on its command line is gone within ``seconds``."""
    return _within(seconds, lambda: not running_with(argument))


class WorkerProcesses:
    """``python -m worker`` processes of one test (on ``url``, or the one each start names), SIGKILLed at its end if
    still running."""

    def __init__(self, env: dict[str, str], url: str | None = None) -> None:
        self.env = {**os.environ, **env}
        self.url = url
        self.procs: list[subprocess.Popen] = []

    def start(self, url: str | None = None) -> subprocess.Popen:
        command = [sys.executable, "-m", "worker", "--redis-url", url or self.url]
        proc = subprocess.Popen(command, env=self.env, cwd=Path(__file__).resolve().parents[1])
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def running(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p.poll() is None]

    def describe(self) -> str:
        """Each worker's pid, exit code and processes (for a failure's message)."""
        told = []
        for proc in self.procs:
            children = subprocess.run(["ps", "-o", "pid,stat,etime,args", "--ppid", str(proc.pid)], capture_output=True,
                                      text=True).stdout.strip().splitlines()[1:]
            told.append(f"worker {proc.pid} exit {proc.poll()} children {[c[:120] for c in children]}")
        return "; ".join(told)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
