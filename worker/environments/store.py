"""The environment store: built dependency environments, content-addressed, shared read-only.

Layout under the store's root (``SKILLRUN_ENVS_DIR``)::

    locks/<requirements key>.txt   a resolved, hash-pinned lock for one requirement set and target
    locks/<name>.failed            the last failed build of a requirement set (named by its requirements key) or
                                   of a derived image (``image-<digest>``): its message and time
    envs/<environment key>/        a complete environment (a relocatable virtual environment, or a Node
                                   environment's package.json, lock and node_modules), owned by root
    envs/<environment key>.json    what it holds: target, requirements, locked packages, size, build time
    envs/<environment key>.used    its mtime is the environment's last use
    envs/<environment key>.locks   the requirements keys whose locks it was built from, one a line
    images/<digest>.used           a derived Docker image's last use (``worker.runtimes.docker.images``)
    targets/<runtime>.json         the target the runtime's workers last built for (what the API reads)
    .building/                     environments being built (a folder per build, renamed into envs/ when done)
    .locks/<name>.lock             one lock file per key: one build at a time, on this host and any sharing it

An environment is only ever renamed into ``envs/`` once complete, and its ``.json`` is written after it: a reader
that finds the ``.json`` finds the whole environment. Nothing is changed after that; a different lock is a
different key. The root and ``envs/`` can be traversed but not listed by others, so a sandboxed run, which is shown
only its own environment, can have it bound read-only without learning what else is there.

What goes when (every file above has an end):

* ``remove(key)`` (``skillrun envs rm``, ``envs prune``): the environment, its ``.json``, ``.used`` and ``.locks``,
  the lock records and failure records of the requirements keys it lists, and their lock files no one holds;
* ``prune_records(cutoff)`` (``envs prune``): lock records no environment lists (resolved but never installed
  here: a failed install, or a Cube target's, installed in its sandbox) and failure records, older than the cutoff
  and than ``RECORD_GRACE_SECONDS`` (a build under way is younger);
* ``sweep(stale_seconds)`` (a worker's first build, ``envs prune``): build folders no build holds, lock files no one
  holds untouched for ``stale_seconds`` (the build timeout), temporary files as old, failure records older than
  ``FAILURE_RECORD_SECONDS``;
* ``images/<digest>.used``, the image's failure record and lock file go with its image (``DerivedImages.remove``,
  ``envs prune``); ``targets/`` holds one file per runtime, overwritten.

A lock file is removed only by a process holding it, and a process that got a lock checks that the file it holds
is still the one at the path (else it takes the new one): so removal never lets two builds run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from worker.environments.target import Target
from worker.errors import EnvironmentBuildError
from worker.roots.folders import remove_tree, still_at

LOCK_POLL_SECONDS = 0.2
USE_TOUCH_SECONDS = 60.0
"""A run marks its environment used at most this often (per process)."""
RECORD_GRACE_SECONDS = 3600.0
"""A lock record no environment lists is left alone this long (its environment may be being installed)."""
FAILURE_RECORD_SECONDS = 7 * 24 * 3600.0
"""A failure record older than this is swept (what ``status`` says of a build that failed that long ago: not built)."""


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
    kind: str = "python"
    """``python`` (a virtual environment) or ``node`` (a folder holding ``node_modules``)."""
    browsers: bool = False
    """Whether it holds Playwright, with links to the Debian Chromium where it looks (``environments.browsers``)."""

    def as_json(self) -> dict:
        return {
            "key": self.key, "kind": self.kind, "path": str(self.path), "target": self.target,
            "requirements": self.requirements,
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
        self.images = self.root / "images"
        self.targets = self.root / "targets"
        self._lock_files = self.root / ".locks"
        self._touched: dict[Path, float] = {}
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

    def link(self, requirements_key: str, key: str) -> None:
        """Record that the environment ``key`` was built from the lock of ``requirements_key`` (so removing the
        environment removes the lock record too)."""
        listed = self.envs / f"{key}.locks"
        with contextlib.suppress(FileNotFoundError):
            if requirements_key in listed.read_text().split():
                return
        fd = os.open(listed, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, f"{requirements_key}\n".encode())  # one small append: whole, also beside another's
        finally:
            os.close(fd)

    def failure(self, name: str) -> tuple[str, float] | None:
        """The message and time of the last failed build called ``name``, if it is recorded."""
        try:
            data = json.loads((self.locks / f"{name}.failed").read_text())
            return data["message"], data["at"]
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def record_failure(self, name: str, message: str) -> None:
        self.ensure()
        _write_atomically(self.locks / f"{name}.failed", json.dumps({"message": message, "at": time.time()}))

    def clear_failure(self, name: str) -> None:
        (self.locks / f"{name}.failed").unlink(missing_ok=True)

    def record_target(self, target: Target) -> None:
        """Record the target ``target.runtime``'s workers build for now (the API, which may have no engine to ask
        for the sandbox image, reads it)."""
        self.ensure()
        self.targets.mkdir(mode=0o711, exist_ok=True)
        _write_atomically(self.targets / f"{target.runtime}.json", json.dumps(asdict(target)))

    def recorded_target(self, runtime: str) -> Target | None:
        """The target ``runtime``'s workers last recorded, if any."""
        try:
            return Target(**json.loads((self.targets / f"{runtime}.json").read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return None

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
            kind=meta.get("kind", "python"), browsers=meta.get("browsers", False) is True,
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
        """Record that a run used ``key`` now (``touch_use``)."""
        self.touch_use(self.envs / f"{key}.used")

    def touch_use(self, record: Path) -> None:
        """Set the use record ``record``'s mtime to now: throttled, once a minute at most per record and process
        (``USE_TOUCH_SECONDS``); a record that is gone is left so."""
        now = time.monotonic()
        if now - self._touched.get(record, -USE_TOUCH_SECONDS) < USE_TOUCH_SECONDS:
            return
        self._touched[record] = now
        with contextlib.suppress(OSError):
            os.utime(record)

    def list(self) -> list[EnvironmentInfo]:
        if not self.envs.is_dir():
            return []
        found = [self.info(entry.name[:-5]) for entry in os.scandir(self.envs) if entry.name.endswith(".json")]
        return sorted((info for info in found if info is not None), key=lambda info: info.last_used, reverse=True)

    def remove(self, key: str) -> bool:
        """Remove the environment ``key`` and what belongs to it (its description first, so nothing finds it
        half-removed): its use and lock list, the lock and failure records of the requirements it lists, and
        their lock files no one holds."""
        removed = False
        with contextlib.suppress(FileNotFoundError):
            (self.envs / f"{key}.json").unlink()
            removed = True
        with contextlib.suppress(FileNotFoundError):
            (self.envs / f"{key}.used").unlink()
        if self.path(key).exists():
            remove_tree(self.path(key))
            removed = True
        listed = self.envs / f"{key}.locks"
        try:
            requirement_keys = set(listed.read_text().split())
        except FileNotFoundError:
            requirement_keys = set()
        for reqkey in requirement_keys:
            (self.locks / f"{reqkey}.txt").unlink(missing_ok=True)
            self.clear_failure(reqkey)
            self.remove_lock_file(resolve_lock(reqkey))
        listed.unlink(missing_ok=True)
        self.remove_lock_file(build_lock(key))
        return removed

    def prune_records(self, cutoff: float) -> list[str]:
        """Remove lock records no environment lists and failure records, last written before ``cutoff`` (and
        ``RECORD_GRACE_SECONDS`` ago); the names of the files removed."""
        if not self.locks.is_dir():
            return []
        cutoff = min(cutoff, time.time() - RECORD_GRACE_SECONDS)
        listed: set[str] = set()
        for entry in os.scandir(self.envs) if self.envs.is_dir() else ():
            if entry.name.endswith(".locks"):
                with contextlib.suppress(OSError):
                    listed.update(Path(entry.path).read_text().split())
        removed = []
        for entry in os.scandir(self.locks):
            stem, _, kind = entry.name.rpartition(".")
            if kind == "failed" or (kind == "txt" and stem not in listed):
                if _older(entry, cutoff):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        removed.append(entry.name)
        return removed

    def sweep(self, stale_seconds: float) -> None:
        """Remove what no one will use (see the module's description): build folders no build holds, lock files
        no one holds and temporary files untouched for ``stale_seconds``, failure records older than
        ``FAILURE_RECORD_SECONDS``."""
        self.sweep_builds()
        stale = time.time() - stale_seconds
        if self._lock_files.is_dir():
            for entry in os.scandir(self._lock_files):
                if entry.name.endswith(".lock") and _older(entry, stale):
                    self.remove_lock_file(entry.name[:-5])
        for folder in (self.locks, self.envs, self.images, self.targets):
            for entry in os.scandir(folder) if folder.is_dir() else ():
                if entry.name.startswith(".") and entry.name.endswith(".tmp") and _older(entry, stale):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
        if self.locks.is_dir():
            forgotten = time.time() - FAILURE_RECORD_SECONDS
            for entry in os.scandir(self.locks):
                if entry.name.endswith(".failed") and _older(entry, forgotten):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)

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
        path = self._lock_files / f"{name}.lock"
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                await asyncio.sleep(LOCK_POLL_SECONDS)
                continue
            if still_at(fd, path):
                break
            os.close(fd)  # removed (or replaced) by a sweep between our open and our lock: take the one there now
        try:
            os.utime(fd)  # its mtime is its last use: a sweep leaves a recently used lock file alone
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

    def remove_lock_file(self, name: str) -> None:
        """Remove the lock file called ``name`` if no one holds it (holding it while it goes: see ``exclusive``)."""
        path = self._lock_files / f"{name}.lock"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if still_at(fd, path):
                os.unlink(path)
        except (BlockingIOError, FileNotFoundError):
            pass
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


MAX_DEPTH = 256
"""The deepest an environment's folders may be nested (npm nests a package's own dependencies: a few levels)."""
ENTRY_BYTES = 512
"""What an entry counts for at least against the size cap (an empty file, folder or link still takes an inode)."""


def bounded_walk(path: Path) -> Iterator[tuple[str, list[str], list[str], int]]:
    """``os.fwalk`` of ``path`` without following links; ``EnvironmentBuildError`` once a folder is nested more than
    ``MAX_DEPTH`` deep (a walk recurses once per level: a tree deep enough would exhaust the interpreter's stack)."""
    base = len(Path(path).parts)
    for top, dirs, files, dir_fd in os.fwalk(path, follow_symlinks=False):
        if dirs and len(Path(top).parts) - base >= MAX_DEPTH:
            raise EnvironmentBuildError(f"the environment's folders are nested more than {MAX_DEPTH} deep; it was "
                                        "refused")
        yield top, dirs, files, dir_fd


def entry_bytes(info: os.stat_result) -> int:
    """What one entry costs the disk: its blocks, and at least ``ENTRY_BYTES``."""
    return max(info.st_blocks * 512, ENTRY_BYTES)


def folder_size(path: Path) -> int:
    """Bytes the entries under ``path`` take (``entry_bytes`` each: files, folders and links alike), walked through
    folder descriptors without following links (a build may be changing it meanwhile: a link it swaps in leads
    nowhere); ``EnvironmentBuildError`` for a tree nested too deep (``bounded_walk``)."""
    total = 0
    for _, dirs, files, dir_fd in bounded_walk(path):
        for name in dirs + files:
            with contextlib.suppress(OSError):
                total += entry_bytes(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
    return total


def _older(entry: os.DirEntry, cutoff: float) -> bool:
    try:
        return entry.stat(follow_symlinks=False).st_mtime < cutoff
    except FileNotFoundError:
        return False


def _write_atomically(path: Path, text: str) -> None:
    """Write ``path`` through a temporary file of this writer's own (processes and threads may write one at once)."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    temporary.write_text(text)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


__all__ = ["EnvironmentInfo", "EnvironmentStore", "bounded_walk", "build_lock", "entry_bytes", "folder_size", "resolve_lock"]
