"""The filesystem artifact store: ``<root>/<scope>/<quoted name>/<version>/{data,meta.json}``, readable by its owner
only. A version is allocated with an exclusive ``mkdir``, so concurrent writers never share one; a save that fails
removes its folder. The embedded default, and a folder every worker and the API share."""

from __future__ import annotations

import contextlib
import os
import shutil
import urllib.parse
from pathlib import Path
from typing import IO

from worker.artifacts.base import (
    DATA,
    DEFAULT_MAX_ARTIFACT_BYTES,
    META,
    PRUNE_BATCH,
    ArtifactStream,
    BaseArtifactStore,
    MeteredReader,
    name_key,
)
from worker.contract import ArtifactFile
from worker.errors import ArtifactError


class FileArtifactStore(BaseArtifactStore):
    """Stores artifacts under ``root``."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES) -> None:
        super().__init__(max_bytes)
        self.root = Path(root)

    def _name_dir(self, scope: str, name: str) -> Path:
        return self.root / name_key(scope, name)

    def _save(self, scope: str, name: str, reader: MeteredReader, mime_type: str) -> ArtifactFile:
        folder = self._name_dir(scope, name)
        for level in (self.root, folder.parent, folder):  # private to the platform: no run or other user reads it
            level.mkdir(mode=0o700, parents=True, exist_ok=True)
        version_dir = self._next_version_dir(folder)
        try:
            with _private_file(version_dir / DATA, "wb") as out:
                for chunk in reader.chunks():
                    out.write(chunk)
            artifact = reader.artifact(int(version_dir.name), mime_type)
            with _private_file(version_dir / META, "w") as meta:
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
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and (p / META).is_file())

    def _names(self, scope: str) -> list[str]:
        return [urllib.parse.unquote(folder.name) for folder in sorted(_folders(self.root / scope))]

    def info(self, scope: str, name: str, version: int | None = None) -> ArtifactFile:
        folder = self._name_dir(scope, name) / str(self._chosen_version(scope, name, version))
        return ArtifactFile.model_validate_json((folder / META).read_text())

    def open(self, scope: str, name: str, version: int | None = None) -> ArtifactStream:
        chosen = self._chosen_version(scope, name, version)
        try:
            body = (self._name_dir(scope, name) / str(chosen) / DATA).open("rb")
        except FileNotFoundError as exc:  # pruned since it was listed
            raise ArtifactError(f"artifact {name!r} version {chosen} is gone") from exc
        return ArtifactStream(os.fstat(body.fileno()).st_size, body)

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
                    if _unchanged_since(version / META, stored_before):
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
