"""Skill repositories: find the skills under one or more roots, list them, load them.

A root is a folder that is a skill (has ``SKILL.md``) or holds skill folders, nested up to ``MAX_DEPTH`` deep.
A broken ``SKILL.md`` is reported in ``problems()`` and never hides the other skills; when two folders declare
the same name, the first (in root order) is used and the second is reported.

``FsSkillRepository`` keeps what it parsed, with the summaries' search index, and on each call asks whether
anything under the roots changed (one inotify read on Linux, else file and folder modification times): edited,
added and removed skills are seen by the next call, and a ``SKILL.md`` whose modification time and size did not
change is never parsed again. ``CachedSkillRepository`` also keeps loaded skills (body and docs) until their files
change, and can keep the summaries in a file between processes.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config import get_settings
from orchestrator.errors import (
    SkillNotFoundError,
    SkillsRootNotFoundError,
    SkillValidationError,
)
from orchestrator.skills._watch import FolderWatch
from orchestrator.skills.search import SkillIndex
from orchestrator.skills.skill import (
    SKILL_FILE,
    Skill,
    SkillSummary,
    list_docs,
    load_skill,
    read_skill_file,
    split_front_matter,
    validate_summary,
)
from orchestrator.skills.summary_cache import Stamp, SummaryCache
from worker.errors import SkillRootError
from worker.roots import FetchLimits, cached_sha256, is_url, resolve_root, split_pin

if TYPE_CHECKING:
    from worker.contract import SkillRef
    from worker.runtimes import BaseWorkspaceRuntime

MAX_DEPTH = 4


@dataclass(frozen=True)
class SkillProblem:
    """Why a skill folder was left out, or (``warning``) what a usable skill's front matter does that the Agent
    Skills format does not allow."""

    path: str
    field: str
    message: str
    warning: bool = False

    def __str__(self) -> str:
        return f"{self.path}: {self.field}: {self.message}"

    @property
    def kind(self) -> str:
        return "warning" if self.warning else "problem"


@dataclass
class _Entry:
    summary: SkillSummary
    folder: str  # a string: a Path per skill costs a listing of 2,000 skills more than its walk
    root: Path

    @property
    def skill_dir(self) -> Path:
        return Path(self.folder)


MISSING = -1
"""A scanned folder's modification time when it did not exist: a root removed is seen when it comes back."""


def _stamp(info: os.stat_result) -> Stamp:
    return info.st_mtime_ns, info.st_size, info.st_ino, info.st_ctime_ns


@dataclass
class _Scan:
    """One look at the roots: the usable skills, the problems, and what to stat to know it is still current."""

    entries: dict[str, _Entry] = field(default_factory=dict)
    problems: list[SkillProblem] = field(default_factory=list)
    folders: dict[str, int] = field(default_factory=dict)  # scanned folder → mtime_ns (or MISSING)
    skill_files: dict[str, Stamp] = field(default_factory=dict)  # every SKILL.md seen → its stamp
    parsed: dict[str, tuple[Stamp, SkillSummary]] = field(default_factory=dict)  # readable SKILL.md → summary
    refused: dict[str, SkillProblem] = field(default_factory=dict)  # a name declared by no usable skill → why
    _summaries: list[SkillSummary] | None = None
    search_index: SkillIndex | None = None  # built on first use (or read back from a summary cache)

    def summaries(self) -> list[SkillSummary]:
        if self._summaries is None:
            self._summaries = [self.entries[name].summary for name in sorted(self.entries)]
        return self._summaries

    def index(self) -> SkillIndex:
        if self.search_index is None:
            self.search_index = SkillIndex(self.summaries())
        return self.search_index


class BaseSkillRepository(ABC):
    """Where an agent and the CLI find skills."""

    def __init__(self, workspace_runtime: BaseWorkspaceRuntime | None = None) -> None:
        self.workspace_runtime = workspace_runtime

    @abstractmethod
    def summaries(self) -> list[SkillSummary]:
        """Name and description of every usable skill, sorted by name (the overview tier)."""

    @abstractmethod
    def get(self, name: str) -> Skill:
        """The whole skill: body, tools, docs. Raises ``SkillNotFoundError`` or ``SkillValidationError``."""

    @abstractmethod
    def path(self, name: str) -> Path:
        """The folder of the skill ``name``."""

    @abstractmethod
    def problems(self) -> list[SkillProblem]:
        """Skill folders that could not be used, and why."""

    @abstractmethod
    def skill_ref(self, name: str) -> SkillRef:
        """What a run request needs to stage the skill ``name``."""

    def skill_list(self) -> list[str]:
        return [s.name for s in self.summaries()]

    def refused(self) -> dict[str, SkillProblem]:
        """The names that only refused skills declare, each with why it was refused (where the name was read)."""
        return {}

    def index(self) -> SkillIndex:
        """The search index of the current summaries (repositories that know their version keep it)."""
        return SkillIndex(self.summaries())


class FsSkillRepository(BaseSkillRepository):
    """Skills read from folders on disk, as they are at each call: a ``SKILL.md`` is parsed again only when its
    modification time or size changed, and the summaries and their index are kept until something under the roots
    changes."""

    def __init__(
        self,
        paths: str | os.PathLike[str] | list[str | os.PathLike[str]],
        workspace_runtime: BaseWorkspaceRuntime | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        fetch_limits: FetchLimits | None = None,
        strict: bool | None = None,
    ) -> None:
        """``paths``: folders, ``file://`` URLs, or http(s) URLs of archives or of one SKILL.md (fetched into the
        cache here, once; see ``worker.roots.sources``). ``strict``: refuse skills whose front matter has warnings
        (default: ``Settings.strict_skills``)."""
        super().__init__(workspace_runtime)
        self.strict = get_settings().strict_skills if strict is None else strict
        raw = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        self.roots: list[Path] = []
        self._origins: dict[Path, tuple[str, str | None]] = {}
        for root in raw:
            text = os.fspath(root)
            if is_url(text) and not text.startswith("file:"):
                path = resolve_root(text, cache_dir=cache_dir, limits=fetch_limits).resolve()
                self._origins[path] = (split_pin(text)[0], cached_sha256(path))
            else:
                try:
                    path = resolve_root(text).resolve()
                except SkillRootError as exc:
                    raise SkillsRootNotFoundError(text) from exc
                if (sha := cached_sha256(path)) is not None:  # a library version: a worker elsewhere fetches it
                    self._origins[path] = (str(path), sha)
            self.roots.append(path)
        self._cached: _Scan | None = None
        self._watch: FolderWatch | None = None
        self._watch_tried = False
        self._lock = threading.Lock()

    def _current(self) -> _Scan:
        with self._lock:  # the API asks from several threads; one of them rescans, the others wait for it
            cached = self._cached
            if cached is not None and self._fresh(cached):
                return cached
            if self._watch is not None:
                self._watch.close()
            self._watch, self._watch_tried = None, False
            previous = self._previous()
            scan = self._cached = self._scan(previous)
            if cached is not None and scan.parsed == cached.parsed and scan.problems == cached.problems:
                scan._summaries, scan.search_index = cached._summaries, cached.search_index  # the same set
            self._scanned(scan, previous)
            return scan

    def _previous(self) -> Mapping[str, tuple[Stamp, SkillSummary]] | None:
        """What the next scan may take without parsing: the last scan's summaries."""
        return self._cached.parsed if self._cached is not None else None

    def _scanned(self, scan: _Scan, previous: Mapping[str, tuple[Stamp, SkillSummary]] | None) -> None:
        """Called with every new scan (a subclass may keep it)."""

    def _fresh(self, scan: _Scan) -> bool:
        """Whether ``scan`` is still current. The watch starts on the first reuse of a scan (a one-shot command
        never pays for it); that first time, modification times cover what changed before it started."""
        if self._watch is not None:
            return not self._watch.changed()
        if not self._watch_tried:
            self._watch_tried = True
            self._watch = FolderWatch.start(scan.folders)
        return self._still_valid(scan)

    @staticmethod
    def _still_valid(scan: _Scan) -> bool:
        for folder, mtime in scan.folders.items():
            try:
                now = os.stat(folder).st_mtime_ns
            except OSError:
                now = MISSING
            if now != mtime:
                return False
        try:
            return all(_stamp(os.stat(skill_file)) == stamp for skill_file, stamp in scan.skill_files.items())
        except OSError:
            return False

    def summaries(self) -> list[SkillSummary]:
        return list(self._current().summaries())

    def index(self) -> SkillIndex:
        return self._index_of(self._current())

    def _index_of(self, scan: _Scan) -> SkillIndex:
        return scan.index()

    def problems(self) -> list[SkillProblem]:
        return list(self._current().problems)

    def refused(self) -> dict[str, SkillProblem]:
        return dict(self._current().refused)

    def listing(self, query: str | None = None) -> tuple[list[SkillSummary], list[SkillProblem]]:
        """Every skill sorted by name (or, with ``query``, the matching ones best first) and the problems, from
        one look at the roots."""
        scan = self._current()
        if query is None:
            return list(scan.summaries()), list(scan.problems)
        index = self._index_of(scan)
        return [hit.summary for hit in index.search(query, len(index))], list(scan.problems)

    def _entry(self, name: str) -> _Entry:
        scan = self._current()
        entry = scan.entries.get(name)
        if entry is None:
            refused = scan.refused.get(name)
            if refused is not None:
                raise SkillNotFoundError(name, [], reason=str(refused))
            raise SkillNotFoundError(name, scan.index().closest_names(name))
        return entry

    def path(self, name: str) -> Path:
        return self._entry(name).skill_dir

    def get(self, name: str) -> Skill:
        entry = self._entry(name)
        return load_skill(entry.skill_dir, entry.root)

    def skill_ref(self, name: str) -> SkillRef:
        """A URL root is referred to by its URL and archive digest, so a worker elsewhere fetches the same bytes; a
        library version's folder by its path and archive digest (``worker.roots.library_fetch``)."""
        from worker.contract import SkillRef  # here: listing skills does not load the run contract

        entry = self._entry(name)
        url, digest = self._origins.get(entry.root, (str(entry.root), None))
        return SkillRef(name=name, root=url, digest=digest, path=entry.skill_dir.relative_to(entry.root).as_posix())

    def _scan(self, previous: Mapping[str, tuple[Stamp, SkillSummary]] | None = None) -> _Scan:
        """Walk the roots; a SKILL.md whose stamp is in ``previous`` is not parsed again."""
        scan = _Scan()
        for root in self.roots:
            for folder, info in self._skill_dirs(root, scan):
                skill_file = os.path.join(folder, SKILL_FILE)
                stamp = scan.skill_files[skill_file] = _stamp(info)
                known = previous.get(skill_file) if previous else None
                try:
                    summary = known[1] if known is not None and known[0] == stamp else _read_summary(Path(skill_file))
                except SkillValidationError as exc:
                    self._refuse(scan, exc.skill, SkillProblem(exc.path, exc.field, exc.message))
                    continue
                scan.parsed[skill_file] = (stamp, summary)
                other = scan.entries.get(summary.name)
                if other is not None:
                    scan.problems.append(
                        SkillProblem(
                            skill_file, "name",
                            f"{summary.name!r} is already declared by {os.path.join(other.folder, SKILL_FILE)}; this one is ignored",
                        )
                    )
                    continue
                if summary.warnings and self.strict:
                    for at, message in summary.warnings:
                        self._refuse(scan, summary.name, SkillProblem(skill_file, at, f"{message} (refused: "
                                                                                      "strict skills)"))
                    continue
                scan.problems.extend(SkillProblem(skill_file, at, message, warning=True)
                                     for at, message in summary.warnings)
                scan.entries[summary.name] = _Entry(summary, folder, root)
        for name in scan.entries:
            scan.refused.pop(name, None)  # another folder's skill of that name is used
        return scan

    @staticmethod
    def _refuse(scan: _Scan, name: str | None, problem: SkillProblem) -> None:
        scan.problems.append(problem)
        if name is not None:
            scan.refused.setdefault(name, problem)

    @staticmethod
    def _skill_dirs(root: Path, scan: _Scan) -> list[tuple[str, os.stat_result]]:
        """Every skill folder under ``root`` with its ``SKILL.md``'s stat: a folder that has one is not listed (one
        stat), only the others are (to go deeper)."""
        found: list[tuple[str, os.stat_result]] = []

        def walk(folder: str, depth: int) -> None:  # paths as strings: a Path per folder costs more than the walk
            try:
                scan.folders[folder] = os.stat(folder).st_mtime_ns
            except OSError as exc:
                scan.folders[folder] = MISSING
                scan.problems.append(SkillProblem(folder, "folder", f"cannot be read: {exc.strerror}"))
                return
            skill_file = os.path.join(folder, SKILL_FILE)
            with contextlib.suppress(OSError):
                info = os.stat(skill_file)
                if stat.S_ISREG(info.st_mode):
                    if os.path.islink(skill_file) and not _inside(folder, skill_file):
                        scan.problems.append(SkillProblem(skill_file, "file", "is a link out of the skill's folder"))
                    else:
                        found.append((folder, info))
                    return
            if depth >= MAX_DEPTH:
                return
            try:
                with os.scandir(folder) as listing:
                    entries = sorted(listing, key=lambda e: e.name)
            except OSError as exc:
                scan.problems.append(SkillProblem(folder, "folder", f"cannot be read: {exc.strerror}"))
                return
            for entry in entries:
                if entry.is_dir() and not entry.name.startswith("."):
                    walk(entry.path, depth + 1)

        walk(str(root), 0)
        return found


class CachedSkillRepository(FsSkillRepository):
    """Like ``FsSkillRepository`` (same arguments), and also keeps each loaded skill (body and docs) until one of
    its files changes.

    ``summary_cache``: a file where the parsed summaries are kept between processes (the command line starts a new
    process per command); entries whose file changed since are parsed again.
    """

    def __init__(self, *args: Any, summary_cache: str | os.PathLike[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._skills: dict[str, tuple[tuple, Skill]] = {}
        self._summary_cache = SummaryCache(summary_cache) if summary_cache is not None else None

    def _previous(self) -> Mapping[str, tuple[Stamp, SkillSummary]] | None:
        previous = super()._previous()
        if previous is None and self._summary_cache is not None:
            return self._summary_cache.load()
        return previous

    def _scanned(self, scan: _Scan, previous: Mapping[str, tuple[Stamp, SkillSummary]] | None) -> None:
        for name in list(self._skills):  # loaded skills the library no longer has
            if name not in scan.entries:
                self._skills.pop(name, None)
        if self._summary_cache is not None and scan.parsed != previous:
            self._summary_cache.save(scan.parsed)

    def _index_of(self, scan: _Scan) -> SkillIndex:
        if scan.search_index is None and self._summary_cache is not None:
            scan.search_index = self._summary_cache.index(scan.summaries())
        return scan.index()

    def get(self, name: str) -> Skill:
        entry = self._entry(name)
        try:
            stamp = _tree_stamp(entry.skill_dir)
        except OSError:  # removed since the scan
            raise SkillNotFoundError(name, []) from None
        hit = self._skills.get(name)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        skill = load_skill(entry.skill_dir, entry.root)
        self._skills[name] = (stamp, skill)
        return skill


def _read_summary(skill_file: Path) -> SkillSummary:
    data, _ = split_front_matter(read_skill_file(skill_file), str(skill_file))
    return validate_summary(data, str(skill_file))


def _inside(folder: str, path: str) -> bool:
    inside = os.path.realpath(folder)
    return os.path.commonpath([inside, os.path.realpath(path)]) == inside


def _tree_stamp(skill_dir: Path) -> tuple:
    paths = [skill_dir / SKILL_FILE, *list_docs(skill_dir)]
    stamps = []
    for path in paths:
        info = path.stat()
        stamps.append((str(path), *_stamp(info)))
    return tuple(stamps)


def create_default_skill_repository(
    paths: str | os.PathLike[str] | list[str | os.PathLike[str]],
    workspace_runtime: BaseWorkspaceRuntime | None = None,
    use_cached_repository: bool = False,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    fetch_limits: FetchLimits | None = None,
    strict: bool | None = None,
) -> BaseSkillRepository:
    """The guide's entry point: a repository over ``paths`` (one root or a list; folders or URLs), cached if asked."""
    cls = CachedSkillRepository if use_cached_repository else FsSkillRepository
    return cls(paths, workspace_runtime=workspace_runtime, cache_dir=cache_dir, fetch_limits=fetch_limits,
               strict=strict)
