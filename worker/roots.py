"""Skills roots: a local folder, a ``file://`` URL, or an ``http(s)://`` URL of an archive or of one ``SKILL.md``.

A URL root is downloaded once and cached, as the guide lays out::

    <cache>/tmp-skill-root-XXXXXX/download      the download
    <cache>/tmp-skill-root-XXXXXX/root/         extracted (safely, see ``worker.archives``)
    <cache>/tmp-skill-root-XXXXXX/root/.ready   written last
    <cache>/<sha256(url)>/                      the root/ folder, renamed into place atomically

A URL may pin its archive: ``https://host/lib.tgz#sha256=<hex>`` (or ``expected_sha256=``); the download is then
checked before anything is extracted.

An entry with ``.ready`` is used without downloading again (when an expected sha256 is given it must match the
recorded one); an entry without it is cleared and fetched again. When several processes fetch one URL at once,
the first rename wins and the others use its entry. Any failure removes the temporary folder and raises
``SkillRootError`` (``UnsafeArchiveError`` for hostile archives), both ``RuntimeError``s as the guide says.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from worker.archives import ArchiveLimits, extract_tar, extract_zip
from worker.errors import SkillRootError, UnsafeArchiveError

READY_FILE = ".ready"
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
) -> Path:
    """The local folder for ``root``, downloading and extracting a URL root into the cache when needed.

    ``allow_local=False`` refuses local paths and ``file://`` URLs (for roots a remote caller named).
    """
    text = os.fspath(root)
    scheme = urllib.parse.urlsplit(text).scheme
    if scheme in {"http", "https"}:
        url, pinned = split_pin(text)
        if pinned and expected_sha256 and pinned != expected_sha256.lower():
            raise SkillRootError(f"{text}: pinned to {pinned} but {expected_sha256} was expected")
        return fetch_url_root(url, cache_dir=cache_dir, limits=limits, expected_sha256=expected_sha256 or pinned)
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
) -> Path:
    """The cached, extracted folder of an http(s) URL root (downloaded on first use)."""
    limits = limits or FetchLimits()
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    final = cache / hashlib.sha256(url.encode()).hexdigest()
    cached = _cached(final, expected_sha256)
    if cached is not None:
        return cached
    if final.exists():
        shutil.rmtree(final, ignore_errors=True)  # no .ready, or another digest: fetch again
    work = Path(tempfile.mkdtemp(prefix="tmp-skill-root-", dir=cache))
    try:
        download = work / "download"
        digest, content_type = download_archive(url, download, limits)
        if expected_sha256 is not None and digest != expected_sha256.lower():
            raise SkillRootError(f"{url}: sha256 is {digest}, expected {expected_sha256}")
        return _extract_and_place(work, download, content_type, final, url, digest, limits.archive, expected_sha256)
    finally:
        shutil.rmtree(work, ignore_errors=True)


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
        return _extract_and_place(work, archive, content_type, final, source, sha, limits or ArchiveLimits(), sha), sha
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _extract_and_place(
    work: Path, archive: Path, content_type: str, final: Path, source: str, digest: str, limits: ArchiveLimits,
    expected_sha256: str | None,
) -> Path:
    """Extract into ``work/root``, mark it ready, rename it to ``final``; another process's entry wins a race."""
    root = work / "root"
    root.mkdir()
    _unpack(source, archive, content_type, root, limits)
    (root / READY_FILE).write_text(json.dumps({"source": source, "sha256": digest, "fetched_at": time.time()}))
    try:
        os.rename(root, final)
    except OSError:
        winner = _cached(final, expected_sha256)
        if winner is None:
            raise SkillRootError(f"{source}: could not place the cache entry at {final}") from None
        return winner
    return final


def cached_sha256(folder: Path) -> str | None:
    """The sha256 of the archive a cache entry was extracted from."""
    try:
        return json.loads((folder / READY_FILE).read_text()).get("sha256")
    except (OSError, ValueError):
        return None


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
