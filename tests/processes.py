"""Looking at processes from tests."""

from __future__ import annotations

import os
import random
import time


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
