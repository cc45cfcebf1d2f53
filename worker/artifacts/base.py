"""What every artifact store does: output files kept byte for byte, versioned per name within a scope.

Every store keeps the same shape under its root (a folder, or a bucket and prefix)::

    <scope>/<quoted name>/<version>/data       the bytes
    <scope>/<quoted name>/<version>/meta.json  name, version, MIME type, size, sha256

A scope is a workspace (session) id. Versions start at 1 and are allocated so that concurrent writers never share
one. A save reads its source once, front to back (``MeteredReader``: hashed, and refused past ``max_bytes`` as it
goes), and writes ``meta.json`` last: a version without it is being written or was abandoned, and is never listed
or served. A save that fails leaves nothing listed. ``prune`` removes versions past their retention (workers call it
with ``SKILLRUN_ARTIFACT_TTL_SECONDS``, at least the run records' TTL, so no kept record names a removed version).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from worker.contract import WORKSPACE_ID_PATTERN, ArtifactFile
from worker.errors import ArtifactError

COPY_CHUNK_BYTES = 1024 * 1024
DEFAULT_MAX_ARTIFACT_BYTES = 512 * 1024 * 1024
PRUNE_BATCH = 1000
"""Versions one ``prune`` removes at most."""
DATA = "data"
META = "meta.json"


class MeteredReader:
    """A source read once from its start (``read_at(size, offset)``), as a file or in chunks: what passes is counted
    and hashed, and more than ``limit`` bytes raise ``ArtifactError`` as soon as they are read."""

    def __init__(self, read_at: Callable[[int, int], bytes], name: str, limit: int) -> None:
        self._read_at = read_at
        self.name = name
        self.limit = limit
        self.size = 0
        self._digest = hashlib.sha256()

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes (fewer only at the end), in one read where the source allows; all that is left, in
        chunks, when ``size`` is negative. Never more than one byte past the limit."""
        whole = size is None or size < 0
        wanted = self.limit + 1 - self.size if whole else min(size, self.limit + 1 - self.size)
        step = COPY_CHUNK_BYTES if whole else wanted
        parts: list[bytes] = []
        got = 0
        while got < wanted and (chunk := self._read_at(min(wanted - got, step), self.size + got)):
            parts.append(chunk)
            got += len(chunk)
        data = b"".join(parts)
        self.size += len(data)
        if self.size > self.limit:
            raise ArtifactError(f"artifact {self.name!r} is larger than {self.limit} bytes")
        self._digest.update(data)
        return data

    def chunks(self) -> Iterator[bytes]:
        while chunk := self.read(COPY_CHUNK_BYTES):
            yield chunk

    def artifact(self, version: int, mime_type: str) -> ArtifactFile:
        """What was read, as version ``version`` (once the source is read to its end)."""
        return ArtifactFile(name=self.name, version=version, mime_type=mime_type, size=self.size,
                            sha256=self._digest.hexdigest())


class _ChunkSource:
    """Chunks as a source ``MeteredReader`` reads at its own sizes, front to back (each read starts where the last
    ended)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._held = bytearray()
        self._offset = 0

    def read_at(self, size: int, offset: int) -> bytes:
        if offset != self._offset:
            raise ArtifactError(f"a stream is read front to back (asked at {offset}, at {self._offset})")
        while len(self._held) < size and (chunk := next(self._chunks, b"")):
            self._held += chunk
        data = bytes(self._held[:size])
        del self._held[:size]
        self._offset += len(data)
        return data


class Body(Protocol):
    """What a stored version is read through: an open file, or an S3 object's body."""

    def read(self, size: int) -> bytes: ...

    def close(self) -> None: ...


@dataclass
class ArtifactStream:
    """A stored version being read: its size, and its bytes in chunks (the body is closed when they end)."""

    size: int
    body: Body

    def chunks(self, chunk_bytes: int = COPY_CHUNK_BYTES) -> Iterator[bytes]:
        with contextlib.closing(self.body):
            while chunk := self.body.read(chunk_bytes):
                yield chunk


class BaseArtifactStore(ABC):
    """An artifact store; ``max_bytes`` caps each artifact."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES) -> None:
        self.max_bytes = max_bytes

    def sink(self, scope: str) -> Callable[[str, int, str, int], ArtifactFile]:
        """``save_fd`` for one scope: what output collection calls for each file (``collect.ArtifactSink``)."""
        return functools.partial(self.save_fd, scope)

    def save_fd(self, scope: str, name: str, fd: int, mime_type: str, max_bytes: int | None = None) -> ArtifactFile:
        """Store the whole file behind ``fd`` (from its start) as the next version of ``name``, refused past
        ``max_bytes`` (the run's room) or the store's own ``max_bytes``, whichever is less."""
        return self._save(scope, name, MeteredReader(lambda size, offset: os.pread(fd, size, offset), name,
                                                     self._cap(max_bytes)), mime_type)

    def save_bytes(self, scope: str, name: str, data: bytes, mime_type: str) -> ArtifactFile:
        """Store ``data`` as the next version of ``name``."""
        view = memoryview(data)
        return self._save(scope, name, MeteredReader(lambda size, offset: bytes(view[offset:offset + size]), name,
                                                     self.max_bytes), mime_type)

    def save_chunks(self, scope: str, name: str, chunks: Iterable[bytes], mime_type: str,
                    max_bytes: int | None = None) -> ArtifactFile:
        """Store what ``chunks`` give, front to back, as the next version of ``name``: a stream of any length held
        a chunk at a time (and refused as it goes past ``max_bytes`` or the store's own, whichever is less)."""
        return self._save(scope, name, MeteredReader(_ChunkSource(chunks).read_at, name, self._cap(max_bytes)),
                          mime_type)

    def _cap(self, max_bytes: int | None) -> int:
        return self.max_bytes if max_bytes is None else min(self.max_bytes, max_bytes)

    @abstractmethod
    def _save(self, scope: str, name: str, reader: MeteredReader, mime_type: str) -> ArtifactFile:
        """Store what ``reader`` gives as a new version of ``name``; when this raises, nothing of it is listed."""

    @abstractmethod
    def versions(self, scope: str, name: str) -> list[int]:
        """The complete versions of ``name`` (those with their ``meta.json``), oldest first."""

    @abstractmethod
    def _names(self, scope: str) -> list[str]:
        """The names stored in ``scope`` (some maybe without a complete version), sorted by their quoted form."""

    @abstractmethod
    def info(self, scope: str, name: str, version: int | None = None) -> ArtifactFile:
        """A version's ``meta.json`` (the latest by default)."""

    @abstractmethod
    def open(self, scope: str, name: str, version: int | None = None) -> ArtifactStream:
        """A version's bytes (the latest by default), to be read in chunks; ``ArtifactError`` when it is not there."""

    @abstractmethod
    def prune(self, stored_before: float, limit: int = PRUNE_BATCH) -> int:
        """Remove up to ``limit`` versions stored before the time ``stored_before``; return how many went."""

    def list(self, scope: str) -> list[ArtifactFile]:
        """The latest version of every artifact in ``scope``."""
        if not WORKSPACE_ID_PATTERN.fullmatch(scope):
            return []
        latest = []
        for name in self._names(scope):
            versions = self.versions(scope, name)
            if versions:
                latest.append(self.info(scope, name, versions[-1]))
        return latest

    def load(self, scope: str, name: str, version: int | None = None) -> bytes:
        """A version's bytes, whole."""
        return b"".join(self.open(scope, name, version).chunks())

    def _chosen_version(self, scope: str, name: str, version: int | None) -> int:
        versions = self.versions(scope, name)
        if not versions:
            raise ArtifactError(f"no artifact {name!r} in {scope!r}")
        chosen = versions[-1] if version is None else version
        if chosen not in versions:
            raise ArtifactError(f"artifact {name!r} has no version {chosen} (versions: {versions})")
        return chosen


def name_key(scope: str, name: str) -> str:
    """``<scope>/<quoted name>``, once both are known to be safe."""
    if not WORKSPACE_ID_PATTERN.fullmatch(scope):
        raise ArtifactError(f"invalid artifact scope {scope!r}")
    if not name or "\0" in name or len(name) > 1024 or name in (".", ".."):
        raise ArtifactError(f"invalid artifact name {name!r}")
    return f"{scope}/{urllib.parse.quote(name, safe='')}"
