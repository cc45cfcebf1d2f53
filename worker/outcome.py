"""What executing a command gives back, whichever runtime executed it: ``ProcessOutcome``, the exit code of a
command past its timeout, and captured output as text with a marker where it was cut."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from worker import defaults

if TYPE_CHECKING:
    from worker.egress.proxy import Refusals

TIMEOUT_EXIT_CODE = 124
"""A command killed at its timeout ends with this code (as ``timeout(1)``'s)."""


@dataclass
class ProcessOutcome:
    stdout: bytes
    stderr: bytes
    stdout_omitted: int
    stderr_omitted: int
    exit_code: int
    timed_out: bool
    cancelled: bool
    duration_ms: int
    notes: list[str]
    oom_killed: bool = False
    gone: asyncio.Future[None] | None = None
    """For a sandboxed run: done once the sandbox's init has ended, and with it every process of the run (the
    result may come while the kernel is still ending them, all SIGKILLed), and bwrap and the init are reaped, or
    after ``worker.sandbox.process.GONE_TIMEOUT_SECONDS``."""
    lingering: bool = False
    """For a run in a held sandbox: some process of the run was still there after the grace period (the caller
    gives the held sandbox up)."""
    via: str = ""
    """How the command reached its sandbox, where a runtime has more than one way (``RunTimings.exec_via``)."""
    egress: Refusals | None = None
    """For a run with an egress allow-list: what its proxy refused (``worker.egress.proxy.Refusals``)."""


def decode_output(data: bytes, omitted: int) -> str:
    """A command's captured output as text (invalid UTF-8 replaced), with a marker where it was cut."""
    text = data.decode("utf-8", "replace")
    if omitted:
        text += defaults.TRUNCATION_MARKER.format(omitted=omitted)
    return text


__all__ = ["TIMEOUT_EXIT_CODE", "ProcessOutcome", "decode_output"]
