"""Team skill libraries: named, versioned sets of skills, each version pinned by its archive's sha256.

A version comes from a URL (fetched with the limits of ``worker.roots.sources``) or an uploaded archive; it is extracted
once, safely, into ``<libraries dir>/<sha256>/`` (content-addressed, immutable) and its archive is kept as
``<libraries dir>/archives/<sha256>``: a worker that shares the folder reads it, one on another host fetches the
archive by its digest (``GET /v1/worker/libraries/<sha256>``, ``worker.roots.library_fetch``). An archive refused — hostile
(``worker.roots.archives``: a path rule, a limit, more than ``MAX_ARCHIVE_DEPTH`` folders deep) or holding no usable skill —
leaves nothing in the folder, whatever its depth. Each library has a current version; a team's runs and agents see
its libraries' current versions.

Bounded: a team keeps at most ``max_libraries`` libraries (one more is refused, ``LibraryLimitError``) and each library
its ``versions_kept`` newest versions and its current one; an older version is removed when a new one comes — its
folder and archive too, unless another library holds the same bytes. A run already queued on a removed version fails
saying it is gone.

Registering is two steps, so that what depends on a version's content can refuse it first: ``fetch`` or ``unpack``
(``Unpacked``: extracted and checked, nothing registered), then ``register`` — or ``discard``, which removes what was
unpacked unless a library holds the same bytes. ``add_from_url`` and ``add_from_file`` do both steps.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from orchestrator.config import DEFAULT_MAX_LIBRARIES, DEFAULT_VERSIONS_KEPT
from orchestrator.documents import BaseDocuments
from orchestrator.errors import OrchestratorError, SkillError
from orchestrator.skills.repository import FsSkillRepository
from worker.errors import SkillRootError
from worker.roots import DIGEST, FetchLimits, download_archive, install_archive, remove_tree

LIBRARY_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
ARCHIVES_DIR = "archives"


class LibraryError(OrchestratorError):
    """A library cannot be registered or changed; the message says why."""


class LibraryLimitError(LibraryError):
    """A team has as many libraries as it may keep."""


class LibraryVersion(BaseModel):
    version: int
    sha256: str
    size: int
    skill_count: int
    source: str
    created_at: float = Field(default_factory=time.time)


class Library(BaseModel):
    team_id: str
    name: str
    versions: list[LibraryVersion] = Field(default_factory=list)
    current: int | None = None

    def version(self, number: int | None = None) -> LibraryVersion | None:
        number = self.current if number is None else number
        return next((v for v in self.versions if v.version == number), None)


@dataclass(frozen=True)
class Unpacked:
    """A version fetched or uploaded, extracted and checked (its folder and archive kept), not registered yet."""

    team_id: str
    name: str
    sha256: str
    size: int
    skill_count: int
    source: str


class LibraryRegistry:
    def __init__(self, documents: BaseDocuments, libraries_dir: Path, limits: FetchLimits | None = None, *,
                 versions_kept: int = DEFAULT_VERSIONS_KEPT, max_libraries: int = DEFAULT_MAX_LIBRARIES) -> None:
        """By default URLs that lead to private or local addresses are refused (``FetchLimits``)."""
        self.docs = documents
        self.dir = Path(libraries_dir)
        self.limits = limits or FetchLimits(allow_private_addresses=False)
        self.versions_kept = versions_kept
        self.max_libraries = max_libraries

    @staticmethod
    def _doc_id(team_id: str, name: str) -> str:
        if not LIBRARY_NAME.fullmatch(name):
            raise LibraryError(f"library name {name!r}: use 1-64 lowercase letters, digits, '-' and '_' (no '/' or '..')")
        return f"{team_id}.{name}"

    def get(self, team_id: str, name: str) -> Library | None:
        doc = self.docs.get("libraries", self._doc_id(team_id, name))
        return Library(**doc) if doc else None

    def list(self, team_id: str) -> list[Library]:
        return [Library(**d) for d in self.docs.all("libraries") if d["team_id"] == team_id]

    def root(self, version: LibraryVersion | Unpacked) -> Path:
        return self.dir / version.sha256

    def archive(self, sha256: str) -> Path | None:
        """The kept archive of the version whose archive has digest ``sha256``, if there is one."""
        path = self.dir / ARCHIVES_DIR / sha256
        return path if DIGEST.fullmatch(sha256) and path.is_file() else None

    def current_roots(self, team_id: str) -> list[Path]:
        """The folders of the team's libraries' current versions."""
        return [self.root(v) for lib in self.list(team_id) if (v := lib.version()) is not None]

    def add_from_url(self, team_id: str, name: str, url: str) -> Library:
        return self.register(self.fetch(team_id, name, url))

    def add_from_file(self, team_id: str, name: str, archive: Path, filename: str = "upload") -> Library:
        return self.register(self.unpack(team_id, name, archive, filename))

    def fetch(self, team_id: str, name: str, url: str) -> Unpacked:
        """The archive at ``url`` downloaded (within the fetch limits) and extracted as a version of ``name``."""
        if not url.startswith(("http://", "https://")):
            raise LibraryError(f"{url!r}: a library URL must be http(s)")
        self._room_for(team_id, name)
        with tempfile.TemporaryDirectory(dir=self._tmp()) as tmp:
            archive = Path(tmp) / "download"
            try:
                _, content_type = download_archive(url, archive, self.limits)
            except SkillRootError as exc:
                raise LibraryError(str(exc)) from exc
            return self._unpack(team_id, name, archive, url, content_type)

    def unpack(self, team_id: str, name: str, archive: Path, filename: str = "upload") -> Unpacked:
        """The uploaded ``archive`` extracted as a version of ``name``."""
        self._room_for(team_id, name)
        return self._unpack(team_id, name, archive, f"upload:{filename}", "")

    def register(self, unpacked: Unpacked) -> Library:
        """``unpacked`` as the newest version of its library (the same bytes again: that version), now current."""
        library = self.get(unpacked.team_id, unpacked.name) or Library(team_id=unpacked.team_id, name=unpacked.name)
        existing = next((v for v in library.versions if v.sha256 == unpacked.sha256), None)
        if existing is None:
            existing = LibraryVersion(version=max((v.version for v in library.versions), default=0) + 1,
                                      sha256=unpacked.sha256, size=unpacked.size, skill_count=unpacked.skill_count,
                                      source=unpacked.source)
            library.versions.append(existing)
        library.current = existing.version
        dropped = self._trim(library)
        self.docs.put("libraries", self._doc_id(unpacked.team_id, unpacked.name), library.model_dump())
        self._remove_unheld(dropped)
        return library

    def discard(self, unpacked: Unpacked) -> None:
        """Forget ``unpacked`` unregistered: its folder and archive go, unless a library holds the same bytes."""
        self._remove_unheld([unpacked.sha256])

    def set_current(self, team_id: str, name: str, number: int) -> Library:
        library = self.get(team_id, name)
        if library is None:
            raise LibraryError(f"no library {name!r}")
        if library.version(number) is None:
            raise LibraryError(f"library {name!r} has no version {number} (versions: {[v.version for v in library.versions]})")
        library.current = number
        self.docs.put("libraries", self._doc_id(team_id, name), library.model_dump())
        return library

    def _tmp(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        return self.dir

    def _unpack(self, team_id: str, name: str, archive: Path, source: str, content_type: str) -> Unpacked:
        try:
            root, sha = install_archive(archive, source=source, content_type=content_type, into=self._tmp(),
                                        limits=self.limits.archive)
        except SkillRootError as exc:
            raise LibraryError(f"{source}: {exc}") from exc
        try:
            skills = FsSkillRepository(root).summaries()
        except SkillError as exc:
            self._remove_unheld([sha])
            raise LibraryError(f"{source}: {exc}") from exc
        if not skills:
            self._remove_unheld([sha])
            raise LibraryError(f"{source}: no usable skill in the archive")
        self._keep_archive(archive, sha)
        return Unpacked(team_id=team_id, name=name, sha256=sha, size=archive.stat().st_size, skill_count=len(skills),
                        source=source)

    def _room_for(self, team_id: str, name: str) -> None:
        """Refuse a new library past the team's limit (a new version of one it has is always welcome)."""
        self._doc_id(team_id, name)
        if self.get(team_id, name) is None and len(self.list(team_id)) >= self.max_libraries:
            raise LibraryLimitError(f"team {team_id} keeps {self.max_libraries} libraries, its limit "
                                    "(SKILLRUN_MAX_LIBRARIES_PER_TEAM); add a version to one of them instead")

    def _trim(self, library: Library) -> list[str]:
        """Keep the ``versions_kept`` newest versions and the current one; return the digests of those dropped."""
        ordered = sorted(library.versions, key=lambda v: v.version, reverse=True)
        kept = [v for i, v in enumerate(ordered) if i < self.versions_kept or v.version == library.current]
        library.versions = sorted(kept, key=lambda v: v.version)
        return [v.sha256 for v in ordered if v not in kept]

    def _remove_unheld(self, digests: list[str]) -> None:
        """Remove the folders and archives of ``digests`` that no library holds any more."""
        held = {v.sha256 for doc in self.docs.all("libraries") for v in Library(**doc).versions}
        for sha in set(digests) - held:
            remove_tree(self.dir / sha)
            (self.dir / ARCHIVES_DIR / sha).unlink(missing_ok=True)

    def _keep_archive(self, archive: Path, sha: str) -> None:
        """Keep the archive under its digest (copied aside and renamed into place: a reader sees all of it or none)."""
        kept = self.dir / ARCHIVES_DIR
        kept.mkdir(parents=True, exist_ok=True)
        if (kept / sha).is_file():
            return
        fd, aside = tempfile.mkstemp(prefix="tmp-", dir=kept)
        try:
            with os.fdopen(fd, "wb") as out, open(archive, "rb") as source:
                shutil.copyfileobj(source, out, 1024 * 1024)
            os.replace(aside, kept / sha)
        except BaseException:
            Path(aside).unlink(missing_ok=True)
            raise
