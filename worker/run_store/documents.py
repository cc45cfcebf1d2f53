"""JSON documents by kind and id: the one record store of both planes, for the control plane's registries (teams,
keys, libraries, egress lists, quotas) and the teams' secrets.

In Redis (``<prefix>:<kind>``, a hash of id → document) when processes share them, or in files (``<root>/<kind>/
<id>.json``, each replaced atomically, private to the user: folders 0700, files 0600) for the embedded default. A
change that reads first (a count to check, a value to keep) holds the kind's lock (``locked``): Redis's lock, or the
kind folder's ``flock`` with a thread lock. A document whose text cannot be written (a lone surrogate) is refused
before anything is; one that cannot be read back is a ``DocumentError`` naming where it lies.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ContextManager

import redis

from worker.errors import DocumentError

LOCK_SECONDS = 10
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")

Check = Callable[[Any, str], None]
"""Refuses a document before it is written (raising); given the document and its kind."""


def checked_name(what: str, name: str) -> str:
    """``name`` when it may name a kind or a document (letters, digits, ``.``, ``_``, ``-``; not ``.`` or ``..``)."""
    if not _NAME.match(name) or name in {".", ".."}:
        raise DocumentError(f"invalid document {what} {name!r}")
    return name


class BaseDocuments(ABC):
    """Documents by kind and id (see the module docstring); ``check`` refuses a document before it is written."""

    def __init__(self, check: Check | None = None) -> None:
        self.check = check

    def _encoded(self, kind: str, doc: dict[str, Any]) -> str:
        if self.check is not None:
            self.check(doc, kind)
        try:
            encoded = json.dumps(doc, ensure_ascii=False)
            encoded.encode()
        except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError: a lone surrogate
            raise DocumentError(f"a {kind} document cannot be stored: {exc}") from None
        return encoded

    def get(self, kind: str, doc_id: str) -> dict[str, Any] | None:
        """The document, or ``None``."""
        raw = self._read(checked_name("kind", kind), checked_name("id", doc_id))
        return None if raw is None else _decoded(raw, self._where(kind, doc_id))

    def put(self, kind: str, doc_id: str, doc: dict[str, Any]) -> None:
        self._write(checked_name("kind", kind), checked_name("id", doc_id), self._encoded(kind, doc))

    def items(self, kind: str) -> dict[str, dict[str, Any]]:
        """Every document of ``kind`` by id, in id order."""
        raws = self._read_all(checked_name("kind", kind))
        return {doc_id: _decoded(raws[doc_id], self._where(kind, doc_id)) for doc_id in sorted(raws)}

    def all(self, kind: str) -> list[dict[str, Any]]:
        """Every document of ``kind``, in id order."""
        return list(self.items(kind).values())

    @abstractmethod
    def delete(self, kind: str, doc_id: str) -> bool:
        """``False`` when there was no such document."""

    @abstractmethod
    def kinds(self) -> list[str]:
        """The kinds that hold a document."""

    @abstractmethod
    def locked(self, kind: str) -> ContextManager[None]:
        """The kind held against other threads and processes for a change that reads first."""

    def close(self) -> None:
        """Release connections."""

    @abstractmethod
    def _where(self, kind: str, doc_id: str) -> str: ...

    @abstractmethod
    def _read(self, kind: str, doc_id: str) -> str | bytes | None: ...

    @abstractmethod
    def _read_all(self, kind: str) -> dict[str, str | bytes]: ...

    @abstractmethod
    def _write(self, kind: str, doc_id: str, encoded: str) -> None: ...


def _decoded(raw: str | bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise DocumentError(f"{where} cannot be read ({exc}): restore it from a backup") from None
    if not isinstance(doc, dict):
        raise DocumentError(f"{where} is not a document (a JSON object): restore it from a backup")
    return doc


class FileDocuments(BaseDocuments):
    def __init__(self, root: str | os.PathLike[str], check: Check | None = None) -> None:
        super().__init__(check)
        self.root = Path(root)
        self._lock = threading.Lock()  # with the flock: not re-entrant, as a second flock of the folder is not

    def _where(self, kind: str, doc_id: str) -> str:
        return str(self.root / kind / f"{doc_id}.json")

    def _read(self, kind: str, doc_id: str) -> str | None:
        try:
            return (self.root / kind / f"{doc_id}.json").read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise DocumentError(f"{self._where(kind, doc_id)} cannot be read ({exc})") from None

    def _read_all(self, kind: str) -> dict[str, str]:
        folder = self.root / kind
        if not folder.is_dir():
            return {}
        found = {}
        for path in folder.glob("*.json"):
            with contextlib.suppress(FileNotFoundError):  # deleted since listed
                found[path.stem] = path.read_text()
        return found

    def _write(self, kind: str, doc_id: str, encoded: str) -> None:
        folder = self._folder(kind)
        descriptor, partial = tempfile.mkstemp(dir=folder, prefix=f".{doc_id}.", suffix=".partial")
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as out:  # mkstemp makes it 0600
                out.write(encoded)
            os.replace(partial, folder / f"{doc_id}.json")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
            raise

    def _folder(self, kind: str) -> Path:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)  # the root private too, not only its kinds
        folder = self.root / kind
        folder.mkdir(exist_ok=True, mode=0o700)
        return folder

    def delete(self, kind: str, doc_id: str) -> bool:
        try:
            os.unlink(self.root / checked_name("kind", kind) / f"{checked_name('id', doc_id)}.json")
        except FileNotFoundError:
            return False
        return True

    def kinds(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and _NAME.match(p.name) and any(p.glob("*.json")))

    @contextlib.contextmanager
    def locked(self, kind: str) -> Iterator[None]:
        folder = self._folder(checked_name("kind", kind))
        with self._lock:
            descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX)
                yield
            finally:
                os.close(descriptor)


class RedisDocuments(BaseDocuments):
    def __init__(self, client: redis.Redis, prefix: str, check: Check | None = None) -> None:
        super().__init__(check)
        self.redis = client
        self.prefix = prefix

    def _key(self, kind: str) -> str:
        return f"{self.prefix}:{kind}"

    def _where(self, kind: str, doc_id: str) -> str:
        return f"Redis hash {self._key(kind)}, field {doc_id}"

    def _read(self, kind: str, doc_id: str) -> bytes | None:
        return self.redis.hget(self._key(kind), doc_id)

    def _read_all(self, kind: str) -> dict[str, bytes]:
        return {doc_id.decode(): raw for doc_id, raw in self.redis.hgetall(self._key(kind)).items()}

    def _write(self, kind: str, doc_id: str, encoded: str) -> None:
        self.redis.hset(self._key(kind), doc_id, encoded)

    def delete(self, kind: str, doc_id: str) -> bool:
        return bool(self.redis.hdel(self._key(checked_name("kind", kind)), checked_name("id", doc_id)))

    def kinds(self) -> list[str]:
        start = len(self.prefix) + 1
        found = {key.decode()[start:] for key in self.redis.scan_iter(f"{self.prefix}:*", count=100)}
        return sorted(kind for kind in found if _NAME.match(kind))  # not a kind's lock, <kind>:lock

    def locked(self, kind: str) -> ContextManager[None]:
        return self.redis.lock(f"{self._key(checked_name('kind', kind))}:lock", timeout=LOCK_SECONDS,
                               blocking_timeout=LOCK_SECONDS)

    def close(self) -> None:
        self.redis.close()
