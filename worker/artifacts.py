"""A filesystem artifact store: output files kept byte for byte, versioned per name, readable by its owner only.

::

    <root>/<scope>/<quoted name>/<version>/data      the bytes
    <root>/<scope>/<quoted name>/<version>/meta.json name, version, MIME type, size, sha256

A scope is a workspace (session) id. Versions start at 1 and are allocated with an exclusive ``mkdir``, so
concurrent writers never share a version. ``prune`` removes versions past their retention (workers call it with
``SKILLRUN_ARTIFACT_TTL_SECONDS``, at least the run records' TTL, so no kept record names a removed version).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from worker.contract import WORKSPACE_ID_PATTERN, ArtifactFile
from worker.errors import ArtifactError

COPY_CHUNK_BYTES = 1024 * 1024
DEFAULT_MAX_ARTIFACT_BYTES = 512 * 1024 * 1024
PRUNE_BATCH = 1000
"""Versions one ``prune`` removes at most."""


class FileArtifactStore:
    """Stores artifacts under ``root``."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes

    def _name_dir(self, scope: str, name: str) -> Path:
        if not WORKSPACE_ID_PATTERN.fullmatch(scope):
            raise ArtifactError(f"invalid artifact scope {scope!r}")
        if not name or "\0" in name or len(name) > 1024:
            raise ArtifactError(f"invalid artifact name {name!r}")
        return self.root / scope / urllib.parse.quote(name, safe="")

    def sink(self, scope: str) -> Callable[[str, int, str], ArtifactFile]:
        """``save_fd`` for one scope: what output collection calls for each file (``collect.ArtifactSink``)."""
        return functools.partial(self.save_fd, scope)

    def save_fd(self, scope: str, name: str, fd: int, mime_type: str) -> ArtifactFile:
        """Copy the whole file behind ``fd`` (from its start) as the next version of ``name``."""

        def chunks() -> Iterator[bytes]:
            offset = 0
            while chunk := os.pread(fd, COPY_CHUNK_BYTES, offset):
                offset += len(chunk)
                yield chunk

        return self._save(scope, name, chunks(), mime_type)

    def save_bytes(self, scope: str, name: str, data: bytes, mime_type: str) -> ArtifactFile:
        """Store ``data`` as the next version of ``name``."""
        return self._save(scope, name, iter([data]), mime_type)

    def _save(self, scope: str, name: str, chunks: Iterator[bytes], mime_type: str) -> ArtifactFile:
        folder = self._name_dir(scope, name)
        for level in (self.root, folder.parent, folder):  # private to the platform: no run or other user reads it
            level.mkdir(mode=0o700, parents=True, exist_ok=True)
        version_dir = self._next_version_dir(folder)
        digest = hashlib.sha256()
        size = 0
        try:
            with _private_file(version_dir / "data", "wb") as out:
                for chunk in chunks:
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise ArtifactError(f"artifact {name!r} is larger than {self.max_bytes} bytes")
                    digest.update(chunk)
                    out.write(chunk)
            artifact = ArtifactFile(
                name=name, version=int(version_dir.name), mime_type=mime_type, size=size, sha256=digest.hexdigest()
            )
            with _private_file(version_dir / "meta.json", "w") as meta:
                meta.write(artifact.model_dump_json())
        except BaseException:
            for leftover in version_dir.iterdir():
                leftover.unlink()
            version_dir.rmdir()
            raise
        return artifact

    def versions(self, scope: str, name: str) -> list[int]:
        folder = self._name_dir(scope, name)
        if not folder.is_dir():
            return []
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and (p / "meta.json").is_file())

    def list(self, scope: str) -> list[ArtifactFile]:
        """The latest version of every artifact in ``scope``."""
        scope_dir = self.root / scope
        if not WORKSPACE_ID_PATTERN.fullmatch(scope) or not scope_dir.is_dir():
            return []
        latest = []
        for folder in sorted(scope_dir.iterdir()):
            name = urllib.parse.unquote(folder.name)
            versions = self.versions(scope, name)
            if versions:
                latest.append(self.info(scope, name, versions[-1]))
        return latest

    def info(self, scope: str, name: str, version: int | None = None) -> ArtifactFile:
        folder = self._version_dir(scope, name, version)
        return ArtifactFile.model_validate_json((folder / "meta.json").read_text())

    def load(self, scope: str, name: str, version: int | None = None) -> bytes:
        return (self._version_dir(scope, name, version) / "data").read_bytes()

    def _version_dir(self, scope: str, name: str, version: int | None) -> Path:
        versions = self.versions(scope, name)
        if not versions:
            raise ArtifactError(f"no artifact {name!r} in {scope!r}")
        chosen = versions[-1] if version is None else version
        if chosen not in versions:
            raise ArtifactError(f"artifact {name!r} has no version {chosen} (versions: {versions})")
        return self._name_dir(scope, name) / str(chosen)

    def prune(self, stored_before: float, limit: int = PRUNE_BATCH) -> int:
        """Remove up to ``limit`` versions stored before the time ``stored_before``, and the name and scope folders
        left empty and unchanged since then; return how many versions went. It reads the whole store's folders."""
        removed = 0
        for scope in _folders(self.root):
            scope_idle = _unchanged_since(scope, stored_before)
            for folder in _folders(scope):
                folder_idle = _unchanged_since(folder, stored_before)
                for version in _folders(folder):
                    if removed >= limit:
                        return removed
                    if _unchanged_since(version / "meta.json", stored_before):
                        shutil.rmtree(version, ignore_errors=True)
                        removed += 1
                if folder_idle:
                    _remove_if_empty(folder)
            if scope_idle:
                _remove_if_empty(scope)
        return removed

    @staticmethod
    def _next_version_dir(folder: Path) -> Path:
        existing = [int(p.name) for p in folder.iterdir() if p.name.isdigit()]
        version = max(existing, default=0) + 1
        while True:
            candidate = folder / str(version)
            try:
                candidate.mkdir(mode=0o700)
                return candidate
            except FileExistsError:
                version += 1


def _private_file(path: Path, mode: str) -> IO:
    """A new file only its owner may read."""
    return open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), mode)


def _folders(path: Path) -> list[Path]:
    with contextlib.suppress(FileNotFoundError):
        return [entry for entry in path.iterdir() if entry.is_dir() and not entry.is_symlink()]
    return []


def _unchanged_since(path: Path, since: float) -> bool:
    """Whether ``path`` exists and was last changed before ``since`` (for a folder: nothing added to it since; a
    writer may be about to use a newer one)."""
    try:
        return path.stat().st_mtime < since
    except FileNotFoundError:  # being written, or pruned by another worker
        return False


def _remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.rmdir()
