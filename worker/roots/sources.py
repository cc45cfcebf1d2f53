"""Skills roots: a local folder, a ``file://`` URL, or an ``http(s)://`` URL of an archive or of one ``SKILL.md``.

A URL root is downloaded and cached by the sha256 of its content, so many versions of one URL live side by side::

    <cache>/tmp-skill-root-XXXXXX/download      the download
    <cache>/tmp-skill-root-XXXXXX/root/         extracted (safely, see ``worker.roots.archives``)
    <cache>/tmp-skill-root-XXXXXX/root/.ready   written last (source, sha256, size)
    <cache>/<sha256 of the content>/            the root/ folder, renamed into place atomically
    <cache>/urls/<sha256(url)>                  the URL's latest digest

A URL may pin its archive: ``https://host/lib.tgz#sha256=<hex>`` (or ``expected_sha256=``); it then resolves to
that digest's folder, and a download is checked before anything is extracted. An unpinned URL resolves to the
digest it last downloaded. An entry with ``.ready`` is used without downloading again; an entry without it is
cleared and fetched again. When several processes fetch one URL at once, the first rename wins and the others use
its entry. Any failure removes the temporary folder (``worker.roots.folders.remove_tree``, at any depth) and raises
``SkillRootError`` (``UnsafeArchiveError`` for hostile archives, one deeper than ``worker.roots.archives.MAX_ARCHIVE_DEPTH``
included), both ``RuntimeError``s as the guide says.

The cache is bounded (``cache_bytes``, default ``SKILLRUN_URL_CACHE_BYTES``): after a new entry is placed, the
least recently used entries (by the time of ``.ready``, touched at each use) are removed until the total fits.
An entry in use is never removed: a user (``root_in_use``, held for a run) holds a shared ``flock`` on its
``.ready``; eviction takes an exclusive one without waiting and, when it gets it, renames the entry away before
deleting it (a user that locked it meanwhile sees the rename and fetches again). While every other entry is in
use the cache stays over its bound. Leftovers of a process killed mid-fetch or mid-eviction (``tmp-*`` folders and
record files untouched for ``LEFTOVER_SECONDS``) are removed by the next eviction (``worker.roots.cache``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tarfile
import tempfile
import time
import urllib.parse
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from worker.roots.archives import ArchiveLimits, FetchLimits, extract_tar, extract_zip
from worker.errors import SkillRootError, UnsafeArchiveError
from worker.roots.folders import remove_tree
from worker.roots.cache import READY_FILE, evict, hold, intact, latest, record, touch

HOLD_ATTEMPTS = 3
"""How often ``root_in_use`` fetches an entry again that was evicted between its resolution and its lock."""
_ARCHIVE_SUFFIXES = {".tar.gz": "tar", ".tgz": "tar", ".tar": "tar", ".zip": "zip"}


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
    headers: Mapping[str, str] | None = None,
) -> Path:
    """The local folder for ``root``, downloading and extracting a URL root into the cache when needed.

    ``allow_local=False`` refuses local paths and ``file://`` URLs (for roots a remote caller named);
    ``cache_bytes`` bounds the cache (default ``SKILLRUN_URL_CACHE_BYTES``); ``headers`` go with a download.
    """
    text = os.fspath(root)
    scheme = urllib.parse.urlsplit(text).scheme
    if scheme in {"http", "https"}:
        url, pinned = split_pin(text)
        if pinned and expected_sha256 and pinned != expected_sha256.lower():
            raise SkillRootError(f"{text}: pinned to {pinned} but {expected_sha256} was expected")
        return fetch_url_root(url, cache_dir=cache_dir, limits=limits, expected_sha256=expected_sha256 or pinned,
                              cache_bytes=cache_bytes, headers=headers)
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
    headers: Mapping[str, str] | None = None,
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
    wanted = expected_sha256.lower() if expected_sha256 is not None else latest(cache, url)
    if wanted is not None and (cached := intact(cache / wanted, wanted)) is not None:
        touch(cached)
        return cached
    work = Path(tempfile.mkdtemp(prefix="tmp-skill-root-", dir=cache))
    try:
        download = work / "download"
        digest, content_type = download_archive(url, download, limits, headers)
        if expected_sha256 is not None and digest != expected_sha256.lower():
            raise SkillRootError(f"{url}: sha256 is {digest}, expected {expected_sha256}")
        final = _extract_and_place(work, download, content_type, cache / digest, url, digest, limits.archive)
    finally:
        remove_tree(work)
    record(cache, url, digest)
    evict(cache, bound, keep=digest)
    return final


@contextlib.contextmanager
def root_in_use(
    root: str,
    *,
    expected_sha256: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_bytes: int | None = None,
    limits: FetchLimits | None = None,
    headers: Mapping[str, str] | None = None,
) -> Iterator[Path]:
    """The local folder of ``root`` (``resolve_root``); a URL root's cache entry is kept from eviction until the
    block ends (a shared lock on its ``.ready``)."""
    if urllib.parse.urlsplit(root).scheme not in {"http", "https"}:
        yield resolve_root(root)
        return
    for _ in range(HOLD_ATTEMPTS):
        folder = resolve_root(root, expected_sha256=expected_sha256, cache_dir=cache_dir, cache_bytes=cache_bytes,
                              limits=limits, headers=headers)
        fd = hold(folder)
        if fd is not None:
            break
    else:
        raise SkillRootError(f"{root}: its cache entry was evicted before it could be used, {HOLD_ATTEMPTS} times; "
                             "raise SKILLRUN_URL_CACHE_BYTES")
    try:
        yield folder
    finally:
        os.close(fd)  # releases the lock


def download_archive(
    url: str, target: Path, limits: FetchLimits | None = None, headers: Mapping[str, str] | None = None
) -> tuple[str, str]:
    """Download ``url`` into ``target`` within the limits (``headers`` to its origin only); return (sha256, content
    type)."""
    # httpx is a third of a command's start-up: it is loaded when a URL is fetched, not by every import of roots
    from worker.roots.downloads import download

    return download(url, target, limits or FetchLimits(), headers)


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
    if intact(final, sha) is not None:
        return final, sha
    remove_tree(final)
    work = Path(tempfile.mkdtemp(prefix="tmp-skill-root-", dir=into))
    try:
        return _extract_and_place(work, archive, content_type, final, source, sha, limits or ArchiveLimits()), sha
    finally:
        remove_tree(work)


def _extract_and_place(
    work: Path, archive: Path, content_type: str, final: Path, source: str, digest: str, limits: ArchiveLimits,
) -> Path:
    """Extract into ``work/root``, mark it ready, rename it to ``final`` (named by ``digest``); another process's
    intact entry wins a race, a damaged one (no ``.ready``) is replaced."""
    root = work / "root"
    root.mkdir()
    size = _unpack(source, archive, content_type, root, limits)
    (root / READY_FILE).write_text(json.dumps({"source": source, "sha256": digest, "bytes": size,
                                               "fetched_at": time.time()}))
    for _ in range(2):
        try:
            os.rename(root, final)
            return final
        except OSError:
            winner = intact(final, digest)
            if winner is not None:
                touch(winner)
                return winner
            remove_tree(final)
    raise SkillRootError(f"{source}: could not place the cache entry at {final}")


def _unpack(url: str, download: Path, content_type: str, root: Path, limits: ArchiveLimits) -> int:
    """Extract ``download`` into ``root``; the bytes written. Its tree is at most ``limits.max_depth`` deep, so the
    walk that looks for a ``SKILL.md`` recurses that often at most."""
    kind = _kind(url, download)
    if kind == "zip":
        size = extract_zip(download, root, limits)
    elif kind == "tar":
        size = extract_tar(download, root, limits)
    else:
        size = _single_skill_md(url, download, content_type, root)
    if not any(root.rglob("SKILL.md")):
        raise SkillRootError(f"{url}: the archive holds no SKILL.md")
    return size


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
    # A zip with a preamble (self-extracting) or an old V7 tar has no magic at its start; the API keeps an upload
    # by its name's suffix, but a worker fetching it by digest (no suffix) must read it the same way
    if zipfile.is_zipfile(download):
        return "zip"
    if _is_tar(download):
        return "tar"
    return "skill-md"


def _is_tar(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except (OSError, tarfile.TarError, EOFError):
        return False


def _single_skill_md(url: str, download: Path, content_type: str, root: Path) -> int:
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
    return len(data)
