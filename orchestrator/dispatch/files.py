"""``DirectFiles``: a workspace's files reached from the dispatcher's own process, for the file tools' fast path
(``BaseDispatcher.workspace_files``); a run is the way everywhere else."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from worker.redaction import Redactor
from worker.runtimes.host_files import WorkspaceFiles


class DirectFiles:
    """``files`` (``worker.runtimes.host_files``) from async code: each call in a thread. What is read has the team's
    secrets taken out, as a run's output is (``secrets``: their values, looked up per read; ``None``: none here)."""

    def __init__(self, files: WorkspaceFiles, secrets: Callable[[], dict[str, str]] | None = None) -> None:
        self.files = files
        self.secrets = secrets

    async def read(self, path: str, limit: int) -> bytes | None:
        """The file's bytes, redacted; ``None`` when a run must read it."""
        return await asyncio.to_thread(self._read, path, limit)

    async def write(self, path: str, data: bytes, *, append: bool = False) -> bool:
        """Whether ``data`` was written; ``False`` when a run must write it (nothing changed)."""
        return await asyncio.to_thread(self.files.write, path, data, append=append)

    def _read(self, path: str, limit: int) -> bytes | None:
        data = self.files.read(path, limit)
        if data is None or self.secrets is None:
            return data
        return Redactor(self.secrets()).data(data)


__all__ = ["DirectFiles"]
