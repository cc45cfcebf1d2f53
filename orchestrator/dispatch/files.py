"""``DirectFiles``: a workspace's files reached from the dispatcher's own process, for the file tools' fast path
(``BaseDispatcher.workspace_files``); a run is the way everywhere else."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TypeVar

from worker.runtimes import WorkspaceFiles
from worker.secrets import Redactor

T = TypeVar("T")


class DirectFiles:
    """``files`` (``worker.runtimes.host_files``) from async code: each call in a thread. What is read has the team's
    secrets taken out, as a run's output is (``secrets``: their values, looked up per read; ``None``: none here)."""

    def __init__(self, files: WorkspaceFiles, secrets: Callable[[], dict[str, str]] | None = None) -> None:
        self.files = files
        self.secrets = secrets

    async def read_text(self, path: str, limit: int, decode: Callable[[bytes], str]) -> str | None:
        """The file's text (``decode``: its bytes to text, or an exception the caller answers), redacted as text —
        so a secret is found in whatever encoding the file holds it; ``None`` when a run must read it."""
        return await _settled(self._read_text, path, limit, decode)

    async def write(self, path: str, data: bytes, *, append: bool = False, max_size: int | None = None) -> bool:
        """Whether ``data`` was written; ``False`` when a run must write it (nothing changed)."""
        return await _settled(functools.partial(self.files.write, append=append, max_size=max_size), path, data)

    def _read_text(self, path: str, limit: int, decode: Callable[[bytes], str]) -> str | None:
        data = self.files.read(path, limit)
        if data is None:
            return None
        text = decode(data)
        return text if self.secrets is None else Redactor(self.secrets()).text(text)


async def _settled(work: Callable[..., T], *args: object) -> T:
    """``work(*args)`` in a thread; a caller cancelled meanwhile waits for it to end before it goes on (a thread
    cannot be stopped, and the workspace it acts in is held only until the caller leaves)."""
    done = asyncio.ensure_future(asyncio.to_thread(work, *args))
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        await asyncio.wait([done])
        raise


__all__ = ["DirectFiles"]
