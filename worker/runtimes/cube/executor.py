"""Cube sandboxes: opening one through the ``e2b`` SDK, running scripts and code in it, and reporting the SDK's
failures as ``RuntimeUnavailableError`` with what was tried.

``CubeCodeExecutor`` holds one sandbox (created from a template, or connected by ``sandbox_id``). Its
``run_script`` is the one way commands reach a sandbox: output captured within caps, a timeout (never past
``execute_timeout``) and a cancel event honoured, and on either every process that carries the run's marker
killed in the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
import uuid
from dataclasses import dataclass

from e2b import AsyncSandbox
from e2b.exceptions import (
    AuthenticationException,
    NotFoundException,
    SandboxException,
    SandboxNotRunningException,
    TimeoutException,
)
from e2b.sandbox.commands.command_handle import CommandExitException
from pydantic import BaseModel

from worker import defaults
from worker.cancellation import Cancellation
from worker.config import CubeCodeExecutorConfig
from worker.errors import InvalidRunRequestError, RuntimeUnavailableError
from worker.outcome import TIMEOUT_EXIT_CODE, ProcessOutcome, decode_output

REMOTE_TMP = "/tmp"
KILLED_EXIT_CODE = 128 + 9
KILL_ATTEMPTS = 3
"""How often killing a sandbox is asked of the service before its failure is reported."""
KILL_RETRY_SECONDS = 0.5


class CodeExecutionResult(BaseModel):
    """What a bare ``CubeCodeExecutor.execute_code`` returns."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False
    duration_ms: int = 0


def sandbox_error(action: str, exc: BaseException, sandbox_id: str | None = None) -> RuntimeUnavailableError:
    """An ``e2b`` SDK or transport error → ``RuntimeUnavailableError`` saying what failed and what to do."""
    where = f" (sandbox {sandbox_id})" if sandbox_id else ""
    if isinstance(exc, AuthenticationException):
        reason = f"the sandbox service refused the credentials ({exc}); check E2B_API_KEY"
    elif isinstance(exc, SandboxNotRunningException):
        reason = f"the sandbox is gone: it was killed or reached its timeout ({exc})"
    elif isinstance(exc, NotFoundException):
        reason = f"not found: {exc}"
    elif isinstance(exc, TimeoutException):
        reason = f"the sandbox could not be reached in time: {exc}"
    elif isinstance(exc, SandboxException):
        reason = f"the sandbox service failed: {exc}"
    else:
        reason = f"the connection to the sandbox service failed: {type(exc).__name__}: {exc}"
    return RuntimeUnavailableError(f"cube: {action}{where}: {reason}")


async def open_sandbox(config: CubeCodeExecutorConfig, metadata: dict[str, str] | None = None) -> AsyncSandbox:
    """Connect to ``config.sandbox_id``, or create a sandbox from ``config.template_id``."""
    options = config.connection_options()
    try:
        if config.sandbox_id:
            return await AsyncSandbox.connect(config.sandbox_id, **options)
        return await AsyncSandbox.create(
            config.template_id,
            timeout=config.sandbox_timeout,
            metadata=metadata or {},
            allow_internet_access=config.allow_internet_access,
            **options,
        )
    except Exception as exc:  # every SDK and transport failure, reported with what was tried
        action = (
            f"connecting to sandbox {config.sandbox_id}"
            if config.sandbox_id
            else (f"creating a sandbox from template {config.template_id!r} at {config.api_url or 'the E2B API'}")
        )
        raise sandbox_error(action, exc) from exc


@dataclass
class ScriptOutcome:
    """How a script run in a sandbox ended, with its captured output decoded (marked where cut)."""

    outcome: ProcessOutcome
    stdout_text: str
    stderr_text: str


class CubeCodeExecutor:
    """One Cube sandbox and the commands and code run in it."""

    def __init__(
        self, sandbox: AsyncSandbox, config: CubeCodeExecutorConfig | None = None, *, owns_sandbox: bool = True
    ) -> None:
        self.sandbox = sandbox
        self.config = config or CubeCodeExecutorConfig()
        self.owns_sandbox = owns_sandbox

    @classmethod
    async def create(
        cls, config: CubeCodeExecutorConfig | None = None, *, metadata: dict[str, str] | None = None
    ) -> "CubeCodeExecutor":
        """An executor on a new sandbox (or on ``config.sandbox_id``, which it then does not kill on close)."""
        config = config or CubeCodeExecutorConfig()
        return cls(await open_sandbox(config, metadata), config, owns_sandbox=not config.sandbox_id)

    @property
    def sandbox_id(self) -> str:
        return self.sandbox.sandbox_id

    async def execute_code(
        self, code: str, language: str = "python", timeout: float | None = None
    ) -> CodeExecutionResult:
        """Run a code block (``python`` or ``bash``) in the sandbox, within ``timeout`` and ``execute_timeout``."""
        interpreters = {"python": "python3", "python3": "python3", "bash": "bash", "sh": "sh"}
        if language not in interpreters:
            raise InvalidRunRequestError(
                "language", f"{language!r} cannot be run; use one of {', '.join(interpreters)}"
            )
        path = f"{REMOTE_TMP}/skillrun-code-{uuid.uuid4().hex}"
        try:
            await self.sandbox.files.write(path, code.encode(), user=self.config.user, use_octet_stream=True)
        except Exception as exc:
            raise sandbox_error("uploading code", exc, self.sandbox_id) from exc
        script = f"{interpreters[language]} {path}; rc=$?; rm -f {path}; exit $rc"
        done = await self.run_script(script, timeout=timeout, marker=path)
        if done.outcome.timed_out:  # killed before it could remove its code file
            with contextlib.suppress(Exception):
                await self.sandbox.commands.run(f"rm -f {path}", user=self.config.user, timeout=30)
        return CodeExecutionResult(
            stdout=done.stdout_text,
            stderr=done.stderr_text,
            exit_code=done.outcome.exit_code,
            timed_out=done.outcome.timed_out,
            duration_ms=done.outcome.duration_ms,
        )

    async def run_script(
        self,
        script: str,
        *,
        timeout: float | None = None,
        grace: float = 0.0,
        stdout_cap: int = defaults.STDOUT_BYTES,
        stderr_cap: int = defaults.STDERR_BYTES,
        cancel: Cancellation | None = None,
        marker: str | None = None,
        user: str | None = None,
    ) -> ScriptOutcome:
        """Run ``script`` with the sandbox's bash and wait for it, at most ``timeout`` (never past
        ``execute_timeout``) plus ``grace``, or until ``cancel`` is set; then every process whose environment or
        command line holds ``marker`` is killed."""
        limit = min(timeout or self.config.execute_timeout, self.config.execute_timeout) + grace
        buffers = {1: bytearray(), 2: bytearray()}
        caps = {1: stdout_cap, 2: stderr_cap}
        omitted = {1: 0, 2: 0}

        def sink(which: int):  # noqa: ANN202
            def take(text: str) -> None:
                data = text.encode("utf-8", "surrogateescape")
                room = caps[which] - len(buffers[which])
                if room > 0:
                    buffers[which] += data[:room]
                omitted[which] += max(len(data) - max(room, 0), 0)

            return take

        started = time.monotonic()
        try:
            handle = await self.sandbox.commands.run(
                script,
                background=True,
                user=user or self.config.user,
                timeout=0,
                on_stdout=sink(1),
                on_stderr=sink(2),
                request_timeout=self.config.request_timeout,
            )
        except asyncio.CancelledError:
            # The caller gave up while the command was starting: it may be running already.
            await self._kill_quietly(marker)
            raise
        except Exception as exc:
            raise sandbox_error("starting a command", exc, self.sandbox_id) from exc
        waiting = asyncio.ensure_future(handle.wait())
        watchers = {waiting}
        cancelled_wait = asyncio.ensure_future(cancel.wait()) if cancel is not None else None
        if cancelled_wait is not None:
            watchers.add(cancelled_wait)
        timed_out = cancelled = False
        code: int | None = None
        try:
            done, _ = await asyncio.wait(watchers, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
            if waiting in done:
                code = self._exit_code(waiting)
            else:
                cancelled = cancelled_wait is not None and cancelled_wait in done
                timed_out = not cancelled
                await self.kill_marked(marker)
                with contextlib.suppress(Exception):
                    await handle.kill()
                # The stream ends with the killed process; one that does not is let go.
                await asyncio.wait({waiting}, timeout=defaults.KILL_GRACE_SECONDS)
                if not waiting.done():
                    with contextlib.suppress(Exception):
                        await handle.disconnect()
                    await asyncio.wait({waiting}, timeout=defaults.KILL_GRACE_SECONDS)
                    waiting.cancel()
                with contextlib.suppress(BaseException):
                    await waiting
        except asyncio.CancelledError:
            # The caller gave up: what the command started ends before the cancellation goes on.
            await self._kill_quietly(marker, handle)
            waiting.cancel()
            raise
        finally:
            if cancelled_wait is not None:
                cancelled_wait.cancel()
        if timed_out:
            exit_code = TIMEOUT_EXIT_CODE
        elif code is None:
            exit_code = KILLED_EXIT_CODE
        else:
            exit_code = code
        outcome = ProcessOutcome(
            stdout=bytes(buffers[1]),
            stderr=bytes(buffers[2]),
            stdout_omitted=omitted[1],
            stderr_omitted=omitted[2],
            exit_code=exit_code,
            timed_out=timed_out,
            cancelled=cancelled,
            duration_ms=int((time.monotonic() - started) * 1000),
            notes=[],
        )
        return ScriptOutcome(
            outcome,
            decode_output(outcome.stdout, outcome.stdout_omitted),
            decode_output(outcome.stderr, outcome.stderr_omitted),
        )

    def _exit_code(self, waiting: asyncio.Future) -> int:
        try:
            return waiting.result().exit_code
        except CommandExitException as exc:
            return exc.exit_code if exc.exit_code >= 0 else KILLED_EXIT_CODE
        except Exception as exc:
            raise sandbox_error(
                "following a command (the connection was lost while it ran)", exc, self.sandbox_id
            ) from exc

    async def kill_marked(self, marker: str | None) -> None:
        """SIGKILL every process of the sandbox user whose environment holds ``RUN_DIR=<marker>`` or whose command
        line holds ``marker`` (what a run started, backgrounded or not)."""
        if not marker:
            return
        script = KILL_SCRIPT.format(marker=shlex.quote(marker)) + "exit 0"
        with contextlib.suppress(Exception):
            await self.sandbox.commands.run(
                script, user=self.config.user, timeout=30, request_timeout=self.config.request_timeout
            )

    async def _kill_quietly(self, marker: str | None, handle=None) -> None:  # noqa: ANN001 - the SDK's handle
        with contextlib.suppress(Exception):
            await self.kill_marked(marker)
            if handle is not None:
                await handle.kill()

    async def close(self) -> None:
        """Kill the sandbox if this executor created it (a failure is not reported: see ``kill``)."""
        if self.owns_sandbox:
            with contextlib.suppress(Exception):
                await self.sandbox.kill()

    async def kill(self) -> None:
        """Kill the sandbox, asking again after a failure (a service's passing error must not leave a sandbox up
        until its timeout); one already gone counts as killed. ``RuntimeUnavailableError`` when the service keeps
        failing."""
        for attempt in range(1, KILL_ATTEMPTS + 1):
            try:
                await self.sandbox.kill()
                return
            except Exception as exc:  # every SDK and transport failure
                if attempt == KILL_ATTEMPTS:
                    raise sandbox_error("killing the sandbox", exc, self.sandbox_id) from exc
            await asyncio.sleep(KILL_RETRY_SECONDS)


KILL_SCRIPT = (
    'm={marker}; for pass in 1 2 3 4 5 6 7 8 9 10; do k=; for p in /proc/[0-9]*; do '
    '[ -O "$p" ] && [ "$p" != /proc/$$ ] || continue; hit=; '
    'while IFS= read -r -d \'\' e; do [ "$e" = "RUN_DIR=$m" ] && hit=1 && break; done 2>/dev/null < "$p/environ"; '
    '[ -z "$hit" ] && while IFS= read -r -d \'\' a; do case $a in *"$m"*) hit=1; break;; esac; done 2>/dev/null < "$p/cmdline"; '
    '[ -n "$hit" ] && kill -9 "${{p#/proc/}}" 2>/dev/null && k=1; done; [ -z "$k" ] && break; done\n'
)
"""Kill by marker, in bash builtins only (no process per candidate). A process forked after a pass listed
``/proc`` escapes that pass, so passes repeat until one kills nothing (at most ten)."""


__all__ = [
    "KILL_SCRIPT",
    "CodeExecutionResult",
    "CubeCodeExecutor",
    "ScriptOutcome",
    "open_sandbox",
    "sandbox_error",
]
