"""The URL-root cache's entries (``worker.roots.sources``): the ``.ready`` mark of an intact entry, the record of each URL's
latest digest, holds on entries in use, eviction of the least recently used, and leftovers of killed processes
(removed with ``worker.roots.folders.remove_tree``, whatever their depth: one left before archives had a depth limit may be
too deep for ``shutil.rmtree``)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
import time
from pathlib import Path

from worker.errors import WorkspaceError
from worker.roots.folders import remove_tree

READY_FILE = ".ready"
LEFTOVER_SECONDS = 3600.0
"""A ``tmp-*`` entry of the cache untouched this long belongs to no live fetch (a download is capped at minutes)."""
URLS_DIR = "urls"
DIGEST = re.compile(r"[0-9a-f]{64}")


def evict(cache: Path, bound: int, *, keep: str | None = None) -> list[str]:
    """Remove the least recently used entries of ``cache`` until their total size is within ``bound`` bytes,
    never ``keep`` nor one in use; forget the URLs whose latest entry is gone; remove leftovers of killed
    processes. Returns the digests removed."""
    _remove_leftovers(cache)
    entries = []
    for entry in os.scandir(cache):
        if DIGEST.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(OSError):
                entries.append((os.stat(os.path.join(entry.path, READY_FILE)).st_mtime_ns, entry.name))
    sizes = {name: _size(cache / name) for _, name in entries}
    total = sum(sizes.values())
    removed = []
    for _, name in sorted(entries):
        if total <= bound:
            break
        if name != keep and _remove_unless_used(cache, name):
            total -= sizes[name]
            removed.append(name)
    kept = set(sizes) - set(removed)
    with contextlib.suppress(FileNotFoundError):
        for record in os.scandir(cache / URLS_DIR):
            if DIGEST.fullmatch(record.name) and read_json(Path(record.path)).get("sha256") not in kept:
                Path(record.path).unlink(missing_ok=True)
    return removed


def cached_sha256(folder: Path) -> str | None:
    """The sha256 of the archive a cache entry (or a library version's folder) was extracted from."""
    digest = read_json(folder / READY_FILE).get("sha256")
    return digest if isinstance(digest, str) and DIGEST.fullmatch(digest) else None


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def latest(cache: Path, url: str) -> str | None:
    """The digest ``url`` last downloaded to, as recorded in the cache."""
    return read_json(cache / URLS_DIR / hashlib.sha256(url.encode()).hexdigest()).get("sha256")


def record(cache: Path, url: str, digest: str) -> None:
    """Record ``digest`` as ``url``'s latest (written aside and renamed: a reader sees the old or the new)."""
    records = cache / URLS_DIR
    records.mkdir(exist_ok=True)
    fd, aside = tempfile.mkstemp(prefix="tmp-", dir=records)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "sha256": digest}, f)
    os.replace(aside, records / hashlib.sha256(url.encode()).hexdigest())


def _remove_leftovers(cache: Path) -> None:
    stale = time.time() - LEFTOVER_SECONDS
    for folder in (cache, cache / URLS_DIR):
        with contextlib.suppress(FileNotFoundError), os.scandir(folder) as listing:
            for entry in listing:
                with contextlib.suppress(OSError, WorkspaceError):  # what cannot be removed is tried again next time
                    if entry.name.startswith("tmp-") and entry.stat(follow_symlinks=False).st_mtime < stale:
                        remove_tree(Path(entry.path))


def touch(entry: Path) -> None:
    """Mark an entry used now (eviction goes by the time of its ``.ready``)."""
    with contextlib.suppress(OSError):
        os.utime(entry / READY_FILE)


def _size(entry: Path) -> int:
    """The bytes an entry holds (recorded when it was placed)."""
    size = read_json(entry / READY_FILE).get("bytes")
    if isinstance(size, int):
        return size
    return sum(os.lstat(os.path.join(folder, name)).st_size for folder, _, names in os.walk(entry) for name in names)


def hold(entry: Path) -> int | None:
    """A shared lock on the entry's ``.ready`` (its descriptor), or ``None`` when the entry was evicted before the
    lock was had (eviction renames it away while holding the lock exclusively)."""
    try:
        fd = os.open(entry / READY_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        now = os.stat(entry / READY_FILE)
        held = os.fstat(fd)
        if (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev):
            touch(entry)
            return fd
    except FileNotFoundError:
        pass
    os.close(fd)
    return None


def _remove_unless_used(cache: Path, name: str) -> bool:
    """Remove the entry ``name`` unless a user holds it: renamed away under an exclusive lock (taken without
    waiting), then deleted."""
    try:
        fd = os.open(cache / name / READY_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        doomed = Path(tempfile.mkdtemp(prefix="tmp-evicted-", dir=cache))
        try:
            os.rename(cache / name, doomed / "root")
        except OSError:
            with contextlib.suppress(OSError):
                doomed.rmdir()  # still empty
            return False
    finally:
        os.close(fd)
    with contextlib.suppress(WorkspaceError):  # a ``tmp-`` leftover: removed by a later eviction
        remove_tree(doomed)
    return True


def intact(final: Path, expected_sha256: str | None) -> Path | None:
    """``final`` when it is a whole entry (its ``.ready`` written last) of ``expected_sha256`` (if given)."""
    if not (final / READY_FILE).is_file():
        return None
    if expected_sha256 is not None and cached_sha256(final) != expected_sha256.lower():
        return None
    return final
