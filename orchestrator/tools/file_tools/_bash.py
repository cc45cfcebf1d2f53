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


async def _reader(fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=CHUNK_BYTES)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                os.fdopen(fd, "rb", buffering=0))
    return reader, transport


async def run_bash(command: str, cwd: str, timeout: float, *, env: dict[str, str],
                   output_bytes: int = MAX_OUTPUT_BYTES) -> BashOutcome:
    """Pipes of our own, not asyncio's: its ``wait`` would last as long as a background child holds them open."""
    started = time.monotonic()
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        process = await asyncio.create_subprocess_exec(
            shutil.which("bash") or "/bin/bash", "-c", command, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=out_write, stderr=err_write, start_new_session=True,
        )
    except BaseException:
        for fd in (out_read, err_read):
            os.close(fd)
        raise
    finally:
        os.close(out_write)
        os.close(err_write)
    pgid = process.pid  # a new session: its group id is its pid
    pipes = [await _reader(fd) for fd in (out_read, err_read)]
    readers = [asyncio.ensure_future(_drain(reader, output_bytes)) for reader, _ in pipes]
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
    for _, transport in pipes:
        transport.close()
    stdout, stderr = (r.result() if r in done else "" for r in readers)
    return BashOutcome(stdout, stderr, process.returncode, timed_out, int((time.monotonic() - started) * 1000))
