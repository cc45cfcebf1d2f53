"""Host mode's ``Bash``: ``bash -c`` in its own process group, output capped, the whole group killed at its timeout
and once the command has ended (so a background child never outlives the call)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from dataclasses import dataclass

DEFAULT_TIMEOUT_SECONDS = 300.0
MAX_TIMEOUT_SECONDS = 3600.0
MAX_OUTPUT_BYTES = 64 * 1024
"""What one stream keeps (the rest is read and dropped, so the command never blocks on a full pipe)."""
TRUNCATION_MARKER = "\n[... {omitted} bytes omitted]\n"
HOST_PATH = "/usr/local/bin:/usr/bin:/bin"
CHUNK_BYTES = 64 * 1024


@dataclass
class BashOutcome:
    stdout: str
    stderr: str
    return_code: int
    timed_out: bool
    duration_ms: int


async def _drain(stream: asyncio.StreamReader, cap: int) -> str:
    kept, omitted = bytearray(), 0
    while chunk := await stream.read(CHUNK_BYTES):
        room = cap - len(kept)
        kept += chunk[:room]
        omitted += max(len(chunk) - room, 0)
    text = kept.decode("utf-8", "replace")
    return text + TRUNCATION_MARKER.format(omitted=omitted) if omitted else text


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def host_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The command's environment, built from scratch (no host secret reaches the model): PATH, HOME, LANG, TERM."""
    env = {"PATH": HOST_PATH, "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8", "TERM": "dumb"}
    env.update(extra or {})
    return env


async def run_bash(command: str, cwd: str, timeout: float, *, env: dict[str, str],
                   output_bytes: int = MAX_OUTPUT_BYTES) -> BashOutcome:
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        shutil.which("bash") or "/bin/bash", "-c", command, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )
    pgid = process.pid  # a new session: its group id is its pid
    readers = [asyncio.ensure_future(_drain(process.stdout, output_bytes)),
               asyncio.ensure_future(_drain(process.stderr, output_bytes))]
    timed_out = False
    try:
        await asyncio.wait_for(process.wait(), timeout)
    except asyncio.TimeoutError:
        timed_out = True
    finally:
        _kill_group(pgid)  # at the timeout, and after the command: whatever it left in the background goes too
        if process.returncode is None:
            await process.wait()
    # A child that left the group (setsid) may still hold a pipe: the output gathered so far is what there is.
    done, pending = await asyncio.wait(readers, timeout=1.0)
    for reader in pending:
        reader.cancel()
    stdout, stderr = (r.result() if r in done else "" for r in readers)
    return BashOutcome(stdout, stderr, process.returncode, timed_out, int((time.monotonic() - started) * 1000))
