"""The environment store: built dependency environments, content-addressed, shared read-only.

Layout under the store's root (``SKILLRUN_ENVS_DIR``)::

    locks/<requirements key>.txt   a resolved, hash-pinned lock for one requirement set and target
    envs/<environment key>/        a complete environment (a relocatable virtual environment), owned by root
    envs/<environment key>.json    what it holds: target, requirements, locked packages, size, build time
    envs/<environment key>.used    its mtime is the environment's last use
    .building/                     environments being built (a folder per build, renamed into envs/ when done)
    .locks/                        one lock file per key: one build at a time, on this host and any sharing it

An environment is only ever renamed into ``envs/`` once complete, and its ``.json`` is written after it: a reader
that finds the ``.json`` finds the whole environment. Nothing is changed after that; a different lock is a
different key. The root and ``envs/`` can be traversed but not listed by others, so a sandboxed run, which is shown
only its own environment, can have it bound read-only without learning what else is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from worker.workspace import remove_tree

LOCK_POLL_SECONDS = 0.2
USE_TOUCH_SECONDS = 60.0
"""A run marks its environment used at most this often (per process)."""


@dataclass(frozen=True)
class EnvironmentInfo:
    """One built environment, as ``skillrun envs list`` shows it."""

    key: str
    path: Path
    target: str
    requirements: list[str]
    packages: list[str]
    size_bytes: int
    built_at: float
    build_seconds: float
    last_used: float

    def as_json(self) -> dict:
        return {
            "key": self.key, "path": str(self.path), "target": self.target, "requirements": self.requirements,
            "packages": self.packages, "size_bytes": self.size_bytes, "built_at": self.built_at,
            "build_seconds": self.build_seconds, "last_used": self.last_used,
        }


class EnvironmentStore:
    """The folder environments and locks are kept in (see the module's description)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.envs = self.root / "envs"
        self.locks = self.root / "locks"
        self.building = self.root / ".building"
        self._lock_files = self.root / ".locks"
        self._touched: dict[str, float] = {}
        self._made = False

    def ensure(self) -> None:
        """Make the store's folders (idempotent): traversable, not listable, by others."""
        if self._made:
            return
        for folder, mode in ((self.root, 0o711), (self.envs, 0o711), (self.locks, 0o700),
                             (self.building, 0o711), (self._lock_files, 0o700)):
            folder.mkdir(mode=mode, parents=True, exist_ok=True)
            os.chmod(folder, mode)
        self._made = True

    def lock_text(self, requirements_key: str) -> str | None:
        try:
            return (self.locks / f"{requirements_key}.txt").read_text()
        except FileNotFoundError:
            return None

    def save_lock(self, requirements_key: str, text: str) -> None:
        self.ensure()
        _write_atomically(self.locks / f"{requirements_key}.txt", text)

    def path(self, key: str) -> Path:
        return self.envs / key

    def ready(self, key: str) -> bool:
        """Whether the environment ``key`` is built (its description is written last)."""
        return (self.envs / f"{key}.json").is_file()

    def info(self, key: str) -> EnvironmentInfo | None:
        try:
            meta = json.loads((self.envs / f"{key}.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        try:
            last_used = (self.envs / f"{key}.used").stat().st_mtime
        except FileNotFoundError:
            last_used = meta.get("built_at", 0.0)
        return EnvironmentInfo(
            key=key, path=self.path(key), target=meta.get("target", ""), requirements=meta.get("requirements", []),
            packages=meta.get("packages", []), size_bytes=meta.get("size_bytes", 0),
            built_at=meta.get("built_at", 0.0), build_seconds=meta.get("build_seconds", 0.0), last_used=last_used,
        )

    def publish(self, key: str, built: Path, meta: dict) -> None:
        """Move the complete environment ``built`` into place as ``key`` and describe it (the description last)."""
        self.ensure()
        target = self.path(key)
        if target.exists():  # a build that was interrupted before its description was written
            remove_tree(target)
        os.rename(built, target)
        _write_atomically(self.envs / f"{key}.json", json.dumps(meta, indent=1))
        (self.envs / f"{key}.used").touch()

    def mark_used(self, key: str) -> None:
        """Record that a run used ``key`` now (throttled: a file's mtime, touched once a minute at most)."""
        now = time.monotonic()
        if now - self._touched.get(key, -USE_TOUCH_SECONDS) < USE_TOUCH_SECONDS:
            return
        self._touched[key] = now
        with contextlib.suppress(OSError):
            os.utime(self.envs / f"{key}.used")

    def list(self) -> list[EnvironmentInfo]:
        if not self.envs.is_dir():
            return []
        found = [self.info(entry.name[:-5]) for entry in os.scandir(self.envs) if entry.name.endswith(".json")]
        return sorted((info for info in found if info is not None), key=lambda info: info.last_used, reverse=True)

    def remove(self, key: str) -> bool:
        """Remove the environment ``key`` (its description first, so nothing finds it half-removed)."""
        removed = False
        with contextlib.suppress(FileNotFoundError):
            (self.envs / f"{key}.json").unlink()
            removed = True
        with contextlib.suppress(FileNotFoundError):
            (self.envs / f"{key}.used").unlink()
        if self.path(key).exists():
            remove_tree(self.path(key))
            removed = True
        return removed

    def new_build_folder(self, lock: str) -> Path:
        """A new folder for a build done while holding the lock called ``lock``."""
        self.ensure()
        folder = self.building / f"{lock}-{os.urandom(6).hex()}"
        folder.mkdir(mode=0o711)
        return folder

    @contextlib.asynccontextmanager
    async def exclusive(self, name: str) -> AsyncIterator[None]:
        """Hold the lock called ``name`` (one build of a key at a time, across processes), waiting for it on the
        event loop."""
        self.ensure()
        fd = os.open(self._lock_files / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(LOCK_POLL_SECONDS)
            yield
        finally:
            os.close(fd)

    def busy(self, name: str) -> bool:
        """Whether someone holds the lock called ``name`` now (a build under way)."""
        path = self._lock_files / f"{name}.lock"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # enough for flock, also on a read-only mount
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def sweep_builds(self) -> None:
        """Remove build folders that no build holds any more (a worker killed mid-build left them)."""
        if not self.building.is_dir():
            return
        for entry in os.scandir(self.building):
            if not self.busy(entry.name.rsplit("-", 1)[0]):
                remove_tree(Path(entry.path))


def build_lock(key: str) -> str:
    """The name of the lock held while the environment ``key`` is built."""
    return f"env-{key}"


def resolve_lock(key: str) -> str:
    """The name of the lock held while the requirements ``key`` are resolved."""
    return f"lock-{key}"


def folder_size(path: Path) -> int:
    """Bytes of the files under ``path``, walked through folder descriptors without following links (a build may
    be changing it meanwhile: a link it swaps in leads nowhere)."""
    total = 0
    for _, _, files, dir_fd in os.fwalk(path, follow_symlinks=False):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size
    return total


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


__all__ = ["EnvironmentInfo", "EnvironmentStore", "build_lock", "folder_size", "resolve_lock"]
