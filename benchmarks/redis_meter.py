"""Reading Redis's own counters over a stretch of time: ``CONFIG RESETSTAT`` and ``INFO all`` at the start, ``INFO all``
at the end (``INFO commandstats``, ``stats``, ``cpu``, ``memory``, ``persistence``, ``keyspace``), with what the
reading itself costs taken out; and each process's connections to Redis, from ``/proc``. ``Monitored`` counts, from
``MONITOR``, which process sent each command and which part of the data it touches (``MONITOR`` costs Redis much
more than the commands it shows: measure nothing else while it runs)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

NESTING = ("exec", "evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")
"""Commands whose ``usec`` includes the commands they ran, which commandstats also counts under their own names."""
OWN_CALLS = {"config|resetstat": 1, "info": 1}
"""What the meter itself leaves in commandstats between its reset and its second ``INFO``."""
INFO_REQUEST_BYTES = len(b"*2\r\n$4\r\nINFO\r\n$3\r\nall\r\n")


def parse_info(text: str) -> dict[str, float | dict[str, float]]:
    """``INFO`` text: numbers by field; ``cmdstat_*`` and ``db*`` lines as their ``key=value`` numbers."""
    info: dict[str, float | dict[str, float]] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if not sep or line.startswith("#"):
            continue
        if name.startswith(("cmdstat_", "db")) and "=" in value:
            info[name] = {k: float(v) for k, v in (pair.split("=") for pair in value.split(","))}
        else:
            try:
                info[name] = float(value)
            except ValueError:
                pass
    return info


@dataclass
class Measure:
    """Redis's counters over ``seconds``, and each process's connections to Redis at the end."""

    seconds: float
    before: dict
    after: dict
    own_out: int
    connections: dict[str, int] = field(default_factory=dict)

    def commands(self) -> dict[str, tuple[float, float]]:
        """Calls and ``usec`` by command, the meter's own taken out."""
        table = {}
        for key, stat in self.after.items():
            if key.startswith("cmdstat_"):
                name = key.removeprefix("cmdstat_")
                calls = stat["calls"] - OWN_CALLS.get(name, 0)
                if calls > 0:
                    table[name] = (calls, stat["usec"] - stat["usec_per_call"] * OWN_CALLS.get(name, 0))
        return dict(sorted(table.items(), key=lambda item: -item[1][0]))

    def calls(self) -> float:
        return sum(calls for calls, _ in self.commands().values())

    def command_usec(self) -> float:
        """Command time, each command once (the nesting commands' own ``usec`` left out)."""
        return sum(usec for name, (_, usec) in self.commands().items() if name not in NESTING)

    def delta(self, name: str) -> float:
        return self.after.get(name, 0.0) - self.before.get(name, 0.0)

    def cpu_usec(self) -> float:
        """CPU of Redis's main thread (the one that runs commands), user and system."""
        return (self.delta("used_cpu_user_main_thread") + self.delta("used_cpu_sys_main_thread")) * 1e6

    def net_in(self) -> float:
        return self.delta("total_net_input_bytes") - INFO_REQUEST_BYTES

    def net_out(self) -> float:
        return self.delta("total_net_output_bytes") - self.own_out

    def round_trips(self) -> tuple[float, float]:
        """Reads and writes Redis's event loop served (requests in, replies out), the meter's own taken out."""
        return self.delta("total_reads_processed") - 1, self.delta("total_writes_processed") - 1

    def keys(self) -> float:
        return self.after.get("db0", {}).get("keys", 0) - self.before.get("db0", {}).get("keys", 0)


class Meter:
    """Reads Redis's counters through a connection of its own (RESP2, ``INFO`` unparsed to know its size)."""

    def __init__(self, url: str, port: int, pids: Callable[[], dict[str, int]]) -> None:
        self.redis = redis.Redis.from_url(url, protocol=2)
        self.redis.set_response_callback("INFO", lambda raw, **_: raw)
        self.port, self.pids = port, pids

    def sample(self) -> tuple[dict, int]:
        """``INFO all`` parsed, and the bytes of its reply."""
        raw = self.redis.execute_command("INFO", "all")
        return parse_info(raw.decode()), len(f"${len(raw)}\r\n".encode()) + len(raw) + 2

    def start(self) -> None:
        self.redis.config_resetstat()
        self.before, self.before_bytes = self.sample()
        self.began = time.monotonic()

    def stop(self) -> Measure:
        after, _ = self.sample()
        return Measure(time.monotonic() - self.began, self.before, after, self.before_bytes,
                       {name: redis_connections(pid, self.port) for name, pid in self.pids().items() if name != "redis"})

    def close(self) -> None:
        self.redis.close()


def redis_connections(pid: int, port: int) -> int:
    """Established TCP connections process ``pid`` holds to the Redis on ``port`` of this host."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    inodes.add(f"socket:[{fields[9]}]")
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd) in inodes
        except FileNotFoundError:  # closed meanwhile
            pass
    return count


def client_ports(pid: int, port: int) -> set[int]:
    """The local ports of the established TCP connections process ``pid`` holds to the Redis on ``port``."""
    owned = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            owned.add(os.readlink(fd))
        except FileNotFoundError:  # closed meanwhile
            pass
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                remote = int(fields[2].rsplit(":", 1)[1], 16)
                if remote == port and fields[3] == "01" and f"socket:[{fields[9]}]" in owned:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


MONITORED = re.compile(r'^\S+ \[\d+ ([^\]]+)\] "([^"]*)"(?: "((?:[^"\\]|\\.)*)")?')
"""A ``MONITOR`` line: its client (``address:port``, or ``lua``), its command and its first argument."""
PARTS = (
    ("rq:", "RQ: jobs, registries, the worker's key"),
    ("skillrun:fair:", "fair turns between teams"),
    ("skillrun:doc:", "team, key and library documents"),
    ("skillrun:secrets", "team secrets"),
    ("skillrun:workspace", "kept-workspace registry"),
    ("skillrun:run:", "run records, indexes, events, counts"),
    ("skillrun:", "other Skillrun keys (beats, leases)"),
)
TRANSACTION = {"MULTI", "EXEC", "WATCH", "UNWATCH", "DISCARD"}
MONITOR_START_SECONDS = 0.3
"""Pause after starting ``redis-cli monitor``, so that it is listening before what it should see."""


def part_of(command: str, key: str | None) -> str:
    """Which part of the platform's data a command touches, by its first key (a script's own commands are counted
    where they touch; a transaction's brackets apart)."""
    if command.upper() in TRANSACTION:
        return "transaction brackets (MULTI, EXEC, WATCH)"
    if command.upper() in ("EVAL", "EVALSHA", "SCRIPT"):
        return "script calls (their commands counted where they touch)"
    for prefix, name in PARTS:
        if key is not None and key.startswith(prefix):
            return name
    return "other"


class Monitored:
    """``redis-cli monitor`` on the Redis at ``url`` while it is open: each command counted by the process that
    sent it (``pids``' names; a script's commands by the process that called the script) and by ``part_of``."""

    def __init__(self, url: str, port: int, pids: dict[str, int]) -> None:
        self.port, self.pids = port, pids
        self.owners = self._owners()
        self._out = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(["redis-cli", "-u", url, "monitor"], stdout=self._out,
                                      stderr=subprocess.DEVNULL)
        time.sleep(MONITOR_START_SECONDS)

    def stop(self) -> dict[tuple[str, str], int]:
        """Calls by (process, part) since the start."""
        self._proc.terminate()
        self._proc.wait()
        self.owners |= self._owners()  # connections a pool opened meanwhile
        self._out.seek(0)
        counted: dict[tuple[str, str], int] = {}
        caller = "other"
        for line in self._out.read().decode(errors="replace").splitlines():
            found = MONITORED.match(line)
            if found is None:
                continue
            client, command, key = found.groups()
            if client != "lua":
                caller = self.owners.get(int(client.rsplit(":", 1)[1]), "other")
            where = (caller, part_of(command, key))
            counted[where] = counted.get(where, 0) + 1
        self._out.close()
        return counted

    def _owners(self) -> dict[int, str]:
        return {p: name for name, pid in self.pids.items() if name != "redis" for p in client_ports(pid, self.port)}
