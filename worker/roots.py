"""Skills roots: a local folder, a ``file://`` URL, or an ``http(s)://`` URL of an archive or of one ``SKILL.md``.

A URL root is downloaded and cached by the sha256 of its content, so many versions of one URL live side by side::

    <cache>/tmp-skill-root-XXXXXX/download      the download
    <cache>/tmp-skill-root-XXXXXX/root/         extracted (safely, see ``worker.archives``)
    <cache>/tmp-skill-root-XXXXXX/root/.ready   written last (source, sha256, size)
    <cache>/<sha256 of the content>/            the root/ folder, renamed into place atomically
    <cache>/urls/<sha256(url)>                  the URL's latest digest

A URL may pin its archive: ``https://host/lib.tgz#sha256=<hex>`` (or ``expected_sha256=``); it then resolves to
that digest's folder, and a download is checked before anything is extracted. An unpinned URL resolves to the
digest it last downloaded. An entry with ``.ready`` is used without downloading again; an entry without it is
cleared and fetched again. When several processes fetch one URL at once, the first rename wins and the others use
its entry. Any failure removes the temporary folder and raises ``SkillRootError`` (``UnsafeArchiveError`` for
hostile archives), both ``RuntimeError``s as the guide says.

The cache is bounded (``cache_bytes``, default ``SKILLRUN_URL_CACHE_BYTES``): after a new entry is placed, the
least recently used entries (by the time of ``.ready``, touched at each use) are removed until the total fits.
An entry in use is never removed: a user (``root_in_use``, held for a run) holds a shared ``flock`` on its
``.ready``; eviction takes an exclusive one without waiting and, when it gets it, renames the entry away before
deleting it (a user that locked it meanwhile sees the rename and fetches again). While every other entry is in
use the cache stays over its bound. Leftovers of a process killed mid-fetch or mid-eviction (``tmp-*`` folders and
record files untouched for ``LEFTOVER_SECONDS``) are removed by the next eviction.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from worker.archives import ArchiveLimits, extract_tar, extract_zip
from worker.errors import SkillRootError, UnsafeArchiveError

READY_FILE = ".ready"
LEFTOVER_SECONDS = 3600.0
"""A ``tmp-*`` entry of the cache untouched this long belongs to no live fetch (a download is capped at minutes)."""
URLS_DIR = "urls"
HOLD_ATTEMPTS = 3
"""How often ``root_in_use`` fetches an entry again that was evicted between its resolution and its lock."""
_DIGEST = re.compile(r"[0-9a-f]{64}")
_ARCHIVE_SUFFIXES = {".tar.gz": "tar", ".tgz": "tar", ".tar": "tar", ".zip": "zip"}


@dataclass(frozen=True)
class FetchLimits:
    """How much a URL root may cost to fetch."""

    max_download_bytes: int = 256 * 1024 * 1024
    max_redirects: int = 5
    download_seconds: float = 120.0
    connect_seconds: float = 10.0
    archive: ArchiveLimits = field(default_factory=ArchiveLimits)
    allow_private_addresses: bool = True
    """False refuses URLs (and redirects) to loopback, private, link-local and reserved addresses, however they are
    spelled, and connects only to the addresses it vetted (``worker.addresses``): for URLs a remote caller names,
    so the server cannot be used to reach its own network."""


def default_cache_dir() -> Path:
    """``SKILLS_CACHE_DIR``, else ``$XDG_CACHE_HOME/skillrun/skill-roots`` (``~/.cache/...``)."""
    if os.environ.get("SKILLS_CACHE_DIR"):
        return Path(os.environ["SKILLS_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "skillrun" / "skill-roots"


def is_url(root: str) -> bool:
    return urllib.parse.urlsplit(root).scheme in {"http", "https", "file"}


def resolve_root(
    root: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    limits: FetchLimits | None = None,
    expected_sha256: str | None = None,
    allow_local: bool = True,
    cache_bytes: int | None = None,
) -> Path:
    """The local folder for ``root``, downloading and extracting a URL root into the cache when needed.

    ``allow_local=False`` refuses local paths and ``file://`` URLs (for roots a remote caller named);
    ``cache_bytes`` bounds the cache (default ``SKILLRUN_URL_CACHE_BYTES``).
    """
    text = os.fspath(root)
    scheme = urllib.parse.urlsplit(text).scheme
    if scheme in {"http", "https"}:
        url, pinned = split_pin(text)
        if pinned and expected_sha256 and pinned != expected_sha256.lower():
            raise SkillRootError(f"{text}: pinned to {pinned} but {expected_sha256} was expected")
        return fetch_url_root(url, cache_dir=cache_dir, limits=limits, expected_sha256=expected_sha256 or pinned,
                              cache_bytes=cache_bytes)
    if not allow_local:
        raise SkillRootError(f"skills root {text!r}: only http(s) URLs are allowed here")
    path = Path(urllib.parse.unquote(urllib.parse.urlsplit(text).path)) if scheme == "file" else Path(text)
    if scheme and scheme != "file":
        raise SkillRootError(f"skills root {text!r}: unsupported URL scheme {scheme!r} (use http, https or file)")
    if not path.is_dir():
        raise SkillRootError(f"skills root {text!r} does not exist or is not a directory")
    return path


def split_pin(url: str) -> tuple[str, str | None]:
    """``https://host/lib.tgz#sha256=<hex>`` → (the URL without the fragment, the expected sha256)."""
    base, sep, fragment = url.partition("#")
    if not sep or not fragment.startswith("sha256="):
        return url, None
    digest = fragment[len("sha256="):].lower()
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise SkillRootError(f"{url}: '#sha256=' must be followed by 64 hexadecimal digits")
    return base, digest


def fetch_url_root(
    url: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    limits: FetchLimits | None = None,
    expected_sha256: str | None = None,
    cache_bytes: int | None = None,
) -> Path:
    """The cached, extracted folder of an http(s) URL root: the pinned digest's, else the URL's latest (downloaded
    when the cache has no intact entry for it; the cache is then brought within ``cache_bytes``)."""
    from worker.config import get_worker_settings  # here: a listing of local roots never reads the worker's settings

    limits = limits or FetchLimits()
    bound = get_worker_settings().url_cache_bytes if cache_bytes is None else cache_bytes
    if bound <= 0:
        raise SkillRootError(f"the URL-root cache bound must be a positive number of bytes, not {bound}")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    wanted = expected_sha256.lower() if expected_sha256 is not None else _latest(cache, url)
    if wanted is not None and (cached := _cached(cache / wanted, wanted)) is not None:
        _touch(cached)
        return cached
    work = Path(tempfile.mkdtemp(prefix="tmp-skill-root-", dir=cache))
    try:
        download = work / "download"
        digest, content_type = download_archive(url, download, limits)
        if expected_sha256 is not None and digest != expected_sha256.lower():
            raise SkillRootError(f"{url}: sha256 is {digest}, expected {expected_sha256}")
        final = _extract_and_place(work, download, content_type, cache / digest, url, digest, limits.archive)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _record(cache, url, digest)
    evict(cache, bound, keep=digest)
    return final


@contextlib.contextmanager
def root_in_use(
    root: str,
    *,
    expected_sha256: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_bytes: int | None = None,
) -> Iterator[Path]:
    """The local folder of ``root`` (``resolve_root``); a URL root's cache entry is kept from eviction until the
    block ends (a shared lock on its ``.ready``)."""
    if urllib.parse.urlsplit(root).scheme not in {"http", "https"}:
        yield resolve_root(root)
        return
    for _ in range(HOLD_ATTEMPTS):
        folder = resolve_root(root, expected_sha256=expected_sha256, cache_dir=cache_dir, cache_bytes=cache_bytes)
        fd = _hold(folder)
        if fd is not None:
            break
    else:
        raise SkillRootError(f"{root}: its cache entry was evicted before it could be used, {HOLD_ATTEMPTS} times; "
                             "raise SKILLRUN_URL_CACHE_BYTES")
    try:
        yield folder
    finally:
        os.close(fd)  # releases the lock


def evict(cache: Path, bound: int, *, keep: str | None = None) -> list[str]:
    """Remove the least recently used entries of ``cache`` until their total size is within ``bound`` bytes,
    never ``keep`` nor one in use; forget the URLs whose latest entry is gone; remove leftovers of killed
    processes. Returns the digests removed."""
    _remove_leftovers(cache)
    entries = []
    for entry in os.scandir(cache):
        if _DIGEST.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
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
            if _DIGEST.fullmatch(record.name) and _read_json(Path(record.path)).get("sha256") not in kept:
                Path(record.path).unlink(missing_ok=True)
    return removed


def download_archive(url: str, target: Path, limits: FetchLimits | None = None) -> tuple[str, str]:
    """Download ``url`` into ``target`` within the limits; return (sha256, content type)."""
    # httpx is a third of a command's start-up: it is loaded when a URL is fetched, not by every import of roots
    from worker.downloads import download

    return download(url, target, limits or FetchLimits())


def install_archive(
    archive: Path, *, source: str, content_type: str = "", into: Path, limits: ArchiveLimits | None = None
) -> tuple[Path, str]:
    """Extract ``archive`` (or a single SKILL.md) into ``into/<sha256 of the archive>/``, content-addressed and
    immutable: an intact folder is reused. Returns (folder, sha256)."""
    digest = hashlib.sha256()
    with open(archive, "rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    sha = digest.hexdigest()
    into.mkdir(parents=True, exist_ok=True)
    final = into / sha
    if _cached(final, sha) is not None:
        return final, sha
    shutil.rmtree(final, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix="tmp-skill-root-", dir=into))
    try:
        return _extract_and_place(work, archive, content_type, final, source, sha, limits or ArchiveLimits()), sha
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _extract_and_place(
    work: Path, archive: Path, content_type: str, final: Path, source: str, digest: str, limits: ArchiveLimits,
) -> Path:
    """Extract into ``work/root``, mark it ready, rename it to ``final`` (named by ``digest``); another process's
    intact entry wins a race, a damaged one (no ``.ready``) is replaced."""
    root = work / "root"
    root.mkdir()
    _unpack(source, archive, content_type, root, limits)
    size = sum(os.lstat(os.path.join(folder, name)).st_size for folder, _, names in os.walk(root) for name in names)
    (root / READY_FILE).write_text(json.dumps({"source": source, "sha256": digest, "bytes": size,
                                               "fetched_at": time.time()}))
    for _ in range(2):
        try:
            os.rename(root, final)
            return final
        except OSError:
            winner = _cached(final, digest)
            if winner is not None:
                _touch(winner)
                return winner
            shutil.rmtree(final, ignore_errors=True)
    raise SkillRootError(f"{source}: could not place the cache entry at {final}")


def cached_sha256(folder: Path) -> str | None:
    """The sha256 of the archive a cache entry was extracted from."""
    return _read_json(folder / READY_FILE).get("sha256")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _latest(cache: Path, url: str) -> str | None:
    """The digest ``url`` last downloaded to, as recorded in the cache."""
    return _read_json(cache / URLS_DIR / hashlib.sha256(url.encode()).hexdigest()).get("sha256")


def _record(cache: Path, url: str, digest: str) -> None:
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
                with contextlib.suppress(OSError):
                    if entry.name.startswith("tmp-") and entry.stat(follow_symlinks=False).st_mtime < stale:
                        if entry.is_dir(follow_symlinks=False):
                            shutil.rmtree(entry.path, ignore_errors=True)
                        else:
                            os.unlink(entry.path)


def _touch(entry: Path) -> None:
    """Mark an entry used now (eviction goes by the time of its ``.ready``)."""
    with contextlib.suppress(OSError):
        os.utime(entry / READY_FILE)


def _size(entry: Path) -> int:
    """The bytes an entry holds (recorded when it was placed)."""
    size = _read_json(entry / READY_FILE).get("bytes")
    if isinstance(size, int):
        return size
    return sum(os.lstat(os.path.join(folder, name)).st_size for folder, _, names in os.walk(entry) for name in names)


def _hold(entry: Path) -> int | None:
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
            _touch(entry)
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
            shutil.rmtree(doomed, ignore_errors=True)
            return False
    finally:
        os.close(fd)
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def _cached(final: Path, expected_sha256: str | None) -> Path | None:
    if not (final / READY_FILE).is_file():
        return None
    if expected_sha256 is not None and cached_sha256(final) != expected_sha256.lower():
        return None
    return final


def _unpack(url: str, download: Path, content_type: str, root: Path, limits: ArchiveLimits) -> None:
    kind = _kind(url, download)
    if kind == "zip":
        extract_zip(download, root, limits)
    elif kind == "tar":
        extract_tar(download, root, limits)
    else:
        _single_skill_md(url, download, content_type, root)
    if not any(root.rglob("SKILL.md")):
        raise SkillRootError(f"{url}: the archive holds no SKILL.md")


def _kind(url: str, download: Path) -> str:
    path = urllib.parse.urlsplit(url).path.lower()
    for suffix, kind in _ARCHIVE_SUFFIXES.items():
        if path.endswith(suffix):
            return kind
    with open(download, "rb") as f:
        head = f.read(512)
    if head.startswith(b"PK\x03\x04"):
        return "zip"
    if head.startswith(b"\x1f\x8b") or head[257:262] == b"ustar":
        return "tar"
    return "skill-md"


def _single_skill_md(url: str, download: Path, content_type: str, root: Path) -> None:
    data = download.read_bytes()
    text = data.lstrip(b"\xef\xbb\xbf").lstrip()
    if "html" in content_type.lower() or text[:15].lower().startswith((b"<!doctype", b"<html")):
        raise SkillRootError(f"{url}: the server sent an HTML page, not a SKILL.md or an archive")
    if not text.startswith(b"---"):
        raise SkillRootError(
            f"{url}: not a .tar.gz/.tgz/.zip archive (by extension or magic bytes) and not a SKILL.md (no front matter)"
        )
    if len(data) > 1024 * 1024:
        raise UnsafeArchiveError(f"{url}: a SKILL.md larger than 1 MiB")
    (root / "SKILL.md").write_bytes(data)
