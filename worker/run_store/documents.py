"""JSON documents by kind and id: the one record store of both planes, for the control plane's registries (teams,
keys, libraries, egress lists, quotas) and the teams' secrets.

In Redis (``<prefix>:<kind>``, a hash of id → document) when processes share them, or in files (``<root>/<kind>/
<id>.json``, each replaced atomically, private to the user: folders 0700, files 0600) for the embedded default. The
files are reached through folder handles opened without following links: a root or kind folder of another user,
or a link where a folder or a document should be, is refused; one of the user's that others may enter is made
private first; only regular files are read (a FIFO cannot hang a reader). A change that reads first (a count to
check, a value to keep) holds its kind's lock (``locked``): Redis's lock, or the kind folder's ``flock`` with a
thread lock per kind, both given up after ``LOCK_SECONDS``. A document that is not a JSON object, or whose text
cannot be kept (a lone surrogate, NaN, nesting past the parser's depth), is refused before anything is written;
one that cannot be read back is a ``DocumentError`` naming where it lies. Ids and kinds that are not names are
never handed out.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ContextManager

import redis

from worker.errors import DocumentError

LOCK_SECONDS = 10
LOCK_POLL_SECONDS = 0.02
_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

Check = Callable[[Any, str], None]
"""Refuses a document before it is written (raising); given the document and its kind."""


def checked_name(what: str, name: str) -> str:
    """``name`` when it may name a kind or a document (letters, digits, ``.``, ``_``, ``-``; not ``.`` or ``..``)."""
    if not is_name(name):
        raise DocumentError(f"invalid document {what} {name!r}")
    return name


def is_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name)) and name not in {".", ".."}


class BaseDocuments(ABC):
    """Documents by kind and id (see the module docstring); ``check`` refuses a document before it is written."""

    def __init__(self, check: Check | None = None) -> None:
        self.check = check

    def _encoded(self, kind: str, doc: dict[str, Any]) -> str:
        if not isinstance(doc, dict):
            raise DocumentError(f"a {kind} document cannot be stored: a document is a mapping, not {type(doc).__name__}")
        if self.check is not None:
            self.check(doc, kind)
        try:
            encoded = json.dumps(doc, ensure_ascii=False, allow_nan=False)
            encoded.encode()
        except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError: a lone surrogate
            raise DocumentError(f"a {kind} document cannot be stored: {type(exc).__name__}: {exc}") from None
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
        return {doc_id: _decoded(raws[doc_id], self._where(kind, doc_id)) for doc_id in sorted(raws) if is_name(doc_id)}

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
    raw = raw.encode() if isinstance(raw, str) else raw
    try:
        doc = json.loads(raw)
        if _ESCAPED_SURROGATE.search(raw):  # valid JSON for text no store can keep: refused here, where it lies
            json.dumps(doc, ensure_ascii=False).encode()
    except RecursionError:
        raise DocumentError(f"{where} is nested too deep: it cannot be read: restore it from a backup") from None
    except ValueError as exc:  # not JSON, not UTF-8, or a lone surrogate
        raise DocumentError(f"{where} cannot be read ({exc}): restore it from a backup") from None
    if not isinstance(doc, dict):
        raise DocumentError(f"{where} is not a document (a JSON object): it cannot be read: restore it from a backup")
    return doc


class FileDocuments(BaseDocuments):
    def __init__(self, root: str | os.PathLike[str], check: Check | None = None) -> None:
        super().__init__(check)
        self.root = Path(root)
        self._guard = threading.Lock()
        self._kind_locks: dict[str, tuple[threading.Lock, int]] = {}
        """Per kind being changed, its thread lock and how many changes hold or wait for it; dropped with the last."""

    def _where(self, kind: str, doc_id: str) -> str:
        return str(self.root / kind / f"{doc_id}.json")

    @contextlib.contextmanager
    def _folder(self, kind: str | None, *, create: bool) -> Iterator[int | None]:
        """A handle of the root (``kind`` ``None``) or of a kind folder, made when ``create`` (``None`` when it is
        not there and not made)."""
        if create:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.root, 0o700)
        try:  # the root may be reached through a link (the operator's choice of data dir); its owner is checked
            root = _open_folder(str(self.root), None, str(self.root), follow=True)
        except FileNotFoundError:
            yield None
            return
        try:
            if kind is None:
                yield root
                return
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(kind, 0o700, dir_fd=root)
            try:
                folder = _open_folder(kind, root, str(self.root / kind))
            except FileNotFoundError:
                yield None
                return
            try:
                yield folder
            finally:
                os.close(folder)
        finally:
            os.close(root)

    def _read(self, kind: str, doc_id: str) -> bytes | None:
        with self._folder(kind, create=False) as folder:
            return None if folder is None else _read_file(folder, f"{doc_id}.json", self._where(kind, doc_id))

    def _read_all(self, kind: str) -> dict[str, bytes]:
        found = {}
        with self._folder(kind, create=False) as folder:
            if folder is None:
                return {}
            for name in os.listdir(folder):
                doc_id = name[:-len(".json")]
                if name.endswith(".json") and is_name(doc_id):
                    raw = _read_file(folder, name, self._where(kind, doc_id))
                    if raw is not None:  # not deleted since listed
                        found[doc_id] = raw
        return found

    def _write(self, kind: str, doc_id: str, encoded: str) -> None:
        partial = f".{doc_id}.{uuid.uuid4().hex[:8]}.partial"
        with self._folder(kind, create=True) as folder:
            try:
                descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                     0o600, dir_fd=folder)
                with os.fdopen(descriptor, "wb") as out:
                    out.write(encoded.encode())
                os.replace(partial, f"{doc_id}.json", src_dir_fd=folder, dst_dir_fd=folder)
            except OSError as exc:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(partial, dir_fd=folder)
                raise DocumentError(f"{self._where(kind, doc_id)} cannot be written ({exc})") from None

    def delete(self, kind: str, doc_id: str) -> bool:
        where = self._where(checked_name("kind", kind), checked_name("id", doc_id))
        with self._folder(kind, create=False) as folder:
            if folder is None:
                return False
            try:
                os.unlink(f"{doc_id}.json", dir_fd=folder)  # a link there is removed, never what it points to
            except FileNotFoundError:
                return False
            except OSError as exc:
                raise DocumentError(f"{where} cannot be removed ({exc})") from None
        return True

    def kinds(self) -> list[str]:
        with self._folder(None, create=False) as root:
            if root is None:
                return []
            with os.scandir(root) as entries:
                folders = [e.name for e in entries if is_name(e.name) and e.is_dir(follow_symlinks=False)]
        return sorted(kind for kind in folders if self._holds_documents(kind))

    def _holds_documents(self, kind: str) -> bool:
        with self._folder(kind, create=False) as folder:
            return folder is not None and any(
                name.endswith(".json") and is_name(name[:-len(".json")]) for name in os.listdir(folder))

    @contextlib.contextmanager
    def _thread_lock(self, kind: str) -> Iterator[None]:
        """The kind held against this process's other threads (``DocumentError`` past ``LOCK_SECONDS``)."""
        with self._guard:
            lock, users = self._kind_locks.get(kind, (threading.Lock(), 0))
            self._kind_locks[kind] = (lock, users + 1)
        try:
            if not lock.acquire(timeout=LOCK_SECONDS):
                raise DocumentError(f"{self.root / kind} is held by another change for more than {LOCK_SECONDS} s")
            try:
                yield
            finally:
                lock.release()
        finally:
            with self._guard:
                users = self._kind_locks[kind][1] - 1
                if users:
                    self._kind_locks[kind] = (lock, users)
                else:
                    del self._kind_locks[kind]

    @contextlib.contextmanager
    def locked(self, kind: str) -> Iterator[None]:
        deadline = time.monotonic() + LOCK_SECONDS
        with self._thread_lock(checked_name("kind", kind)), self._folder(kind, create=True) as folder:
            while True:
                try:
                    fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise DocumentError(f"{self.root / kind} is held by another process for more than "
                                            f"{LOCK_SECONDS} s") from None
                    time.sleep(LOCK_POLL_SECONDS)
            yield  # the flock goes with the folder's handle


def _open_folder(name: str, parent: int | None, where: str, *, follow: bool = False) -> int:
    """A folder's handle, not through a link (unless ``follow``); one of another user is refused, one others may
    enter made private."""
    try:
        descriptor = os.open(name, _FOLDER_FLAGS & ~os.O_NOFOLLOW if follow else _FOLDER_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        raise
    except OSError as exc:  # a link (ELOOP), a file where the folder should be (ENOTDIR)
        raise DocumentError(f"{where} is not a folder of this store ({exc.strerror})") from None
    info = os.fstat(descriptor)
    if info.st_uid != os.geteuid():
        os.close(descriptor)
        raise DocumentError(f"{where} belongs to uid {info.st_uid}, not to this process's user ({os.geteuid()}): "
                            f"remove it, or point the store elsewhere")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.fchmod(descriptor, 0o700)
    return descriptor


def _read_file(folder: int, name: str, where: str) -> bytes | None:
    """A regular file's bytes (``None`` when there is none, or a link there), never blocking on a FIFO."""
    try:
        descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link: no document of this store (a write replaces it, a delete removes it)
            return None
        raise DocumentError(f"{where} cannot be read ({exc.strerror}): restore it from a backup") from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise DocumentError(f"{where} is not a regular file: it cannot be read: restore it from a backup")
    with os.fdopen(descriptor, "rb") as opened:
        return opened.read()


class RedisDocuments(BaseDocuments):
    def __init__(self, client: redis.Redis, prefix: str, check: Check | None = None) -> None:
        super().__init__(check)
        self.redis = client
        self.prefix = prefix

    def _key(self, kind: str) -> str:
        return f"{self.prefix}:{kind}"

    def _where(self, kind: str, doc_id: str) -> str:
        return f"Redis hash {self._key(kind)}, field {doc_id}"

    @contextlib.contextmanager
    def _hash(self, kind: str) -> Iterator[None]:
        """A command on the kind's hash: a key of another type there is a ``DocumentError`` naming it."""
        try:
            yield
        except redis.exceptions.ResponseError as exc:
            raise DocumentError(f"Redis key {self._key(kind)} is not a hash of documents ({exc}): remove it") from None

    def _read(self, kind: str, doc_id: str) -> bytes | None:
        with self._hash(kind):
            return self.redis.hget(self._key(kind), doc_id)

    def _read_all(self, kind: str) -> dict[str, bytes]:
        with self._hash(kind):
            fields = self.redis.hgetall(self._key(kind))
        return {doc_id.decode("utf-8", "replace"): raw for doc_id, raw in fields.items()}

    def _write(self, kind: str, doc_id: str, encoded: str) -> None:
        with self._hash(kind):
            self.redis.hset(self._key(kind), doc_id, encoded)

    def delete(self, kind: str, doc_id: str) -> bool:
        with self._hash(checked_name("kind", kind)):
            return bool(self.redis.hdel(self._key(kind), checked_name("id", doc_id)))

    def kinds(self) -> list[str]:
        start = len(self.prefix) + 1
        named = {key: key[start:].decode("utf-8", "replace") for key in self.redis.scan_iter(f"{self.prefix}:*",
                                                                                              count=100)}
        named = {key: kind for key, kind in named.items() if is_name(kind)}  # not a kind's lock (<kind>:lock)
        with self.redis.pipeline(transaction=False) as pipe:
            for key in named:
                pipe.type(key)
            types = pipe.execute()
        return sorted(kind for kind, kept_as in zip(named.values(), types) if kept_as == b"hash")  # nor junk

    @contextlib.contextmanager
    def locked(self, kind: str) -> Iterator[None]:
        lock = self.redis.lock(f"{self._key(checked_name('kind', kind))}:lock", timeout=LOCK_SECONDS,
                               blocking_timeout=LOCK_SECONDS)
        try:
            acquired = lock.acquire()
        except redis.exceptions.LockError:
            acquired = False
        if not acquired:
            raise DocumentError(f"Redis key {self._key(kind)}:lock is held by another change for more than "
                                f"{LOCK_SECONDS} s") from None
        try:
            yield
        finally:
            with contextlib.suppress(redis.exceptions.LockError):  # it expired: the change took too long
                lock.release()

    def close(self) -> None:
        self.redis.close()
