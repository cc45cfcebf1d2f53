"""Matching output patterns in a workspace without ever leaving it.

Every name is looked up in a folder opened beneath the workspace root one component at a time (``O_NOFOLLOW``),
and a link is followed by reading it and resolving its target here, lexically, against the root — so nothing
outside the workspace is listed, stat'ed or opened, whatever links (``/tmp``, ``/proc/1/root``), loops or renames
a command planted. A path is a tuple of names below the root with no link in it. What cannot be followed is a
``PathRefusedError`` with its name and reason, never an exception out of the walk.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator

from worker.collect.globs import name_matches
from worker.errors import WorkerError

MAX_DEPTH = 64
"""Folders a ``**`` descends below where it starts."""
MAX_PATH_PARTS = 256
MAX_LINKS = 40
MAX_LISTED_ENTRIES = 100_000
"""Folder entries one collection may list, over all its patterns."""

OUTSIDE = "resolves outside the workspace"
MISSING = "cannot be read: No such file or directory"
_NOT_A_FOLDER = "is not a folder"
_MAGIC = re.compile(r"[*?\[]")

Rel = tuple[str, ...]


class PathRefusedError(WorkerError):
    """A path that is not collected (or not followed), its name and why."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(reason)
        self.name = name
        self.reason = reason


class Beneath:
    """A workspace folder, seen only from inside."""

    def __init__(self, root: str, aliases: tuple[str, ...]) -> None:
        """``root`` is the real path; ``aliases`` the paths links written in the workspace may name it by."""
        self.root = root
        self.aliases = [_parts(alias) for alias in aliases]
        self.listed = 0

    def open(self, rel: Rel, last_flags: int = os.O_DIRECTORY) -> int:
        """Open ``rel`` one component at a time, refusing a link anywhere (a folder, or with ``last_flags``)."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for i, part in enumerate(rel):
                flags = os.O_DIRECTORY if i < len(rel) - 1 else last_flags
                fd = _swap(fd, os.open(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | flags, dir_fd=fd))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def inside(self, absolute: str) -> list[str] | None:
        """The names below the root of an absolute path, or ``None`` if it is not in the workspace."""
        parts = _parts(absolute)
        for alias in self.aliases:
            if parts[: len(alias)] == alias and ".." not in parts:
                return parts[len(alias) :]
        return None

    def resolve(self, start: Rel, parts: list[str], shown: str) -> tuple[Rel, os.stat_result]:
        """Where ``parts`` lead from folder ``start``, links followed, and what is there. Raises ``PathRefusedError``
        (named ``shown``, or a dangling link by where it points) when that leaves the workspace, is missing, loops
        or nests too deep; ``OSError`` when a folder on the way cannot be read."""
        current = list(start)
        todo = list(reversed(parts))
        links = 0
        fd = self.open(start)
        try:
            info = os.fstat(fd)
            while todo:
                part = todo.pop()
                if part in ("", "."):
                    continue
                if part == "..":
                    if not current:
                        raise PathRefusedError(shown, OUTSIDE)
                    current.pop()
                    fd = _swap(fd, self.open(tuple(current)))
                    info = os.fstat(fd)
                    continue
                try:
                    info = os.stat(part, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    raise PathRefusedError("/".join([*current, part, *reversed(todo)]), MISSING) from None
                if stat.S_ISLNK(info.st_mode):
                    links += 1
                    if links > MAX_LINKS:
                        raise PathRefusedError(shown, f"cannot be read: more than {MAX_LINKS} links to follow")
                    target = os.readlink(part, dir_fd=fd)
                    if target.startswith("/"):
                        below = self.inside(target)
                        if below is None:
                            raise PathRefusedError(shown, OUTSIDE)
                        current = []
                        fd = _swap(fd, self.open(()))
                        target = "/".join(below)
                    todo.extend(reversed(target.split("/")))
                    continue
                current.append(part)
                if len(current) > MAX_PATH_PARTS:
                    raise PathRefusedError(shown, f"is more than {MAX_PATH_PARTS} folders deep")
                if any(p not in ("", ".") for p in todo):
                    fd = _swap(fd, os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd))
            return tuple(current), info
        finally:
            os.close(fd)

    def entries(self, rel: Rel, shown: str) -> list[tuple[str, bool]]:
        """(name, may be a folder: a folder or a link) of each entry of folder ``rel``, in name order. Raises
        ``PathRefusedError`` once the collection has listed ``MAX_LISTED_ENTRIES``."""
        found: list[tuple[str, bool]] = []
        try:
            fd = self.open(rel)
        except OSError:
            return found
        try:
            with os.scandir(fd) as it:
                for entry in it:
                    self.listed += 1
                    if self.listed > MAX_LISTED_ENTRIES:
                        raise PathRefusedError(shown, f"collection stopped: its patterns listed more than {MAX_LISTED_ENTRIES} entries")
                    found.append((entry.name, entry.is_dir(follow_symlinks=False) or entry.is_symlink()))
        except OSError:
            pass
        finally:
            os.close(fd)
        return sorted(found)

    def folder(self, rel: Rel, name: str, shown: str) -> Rel | PathRefusedError | None:
        """The real folder that entry ``name`` of ``rel`` is or leads to; a ``PathRefusedError`` when it leads somewhere it
        may not; ``None`` when it is not a folder or not there."""
        try:
            where, info = self.resolve(rel, [name], shown)
        except PathRefusedError as refused:
            return None if refused.reason == MISSING else refused
        except OSError as exc:
            return PathRefusedError(shown, f"cannot be read: {exc.strerror or exc}")
        return where if stat.S_ISDIR(info.st_mode) else None

    def match(self, pattern: str, skill_rel: str) -> Iterator[tuple[Rel, os.stat_result] | PathRefusedError]:
        """What ``pattern`` (absolute, or relative to the skill folder ``skill_rel``) matches, depth first,
        names in order: each a path and what is there, or a ``PathRefusedError`` named as written from the pattern's base."""
        if pattern.startswith("/"):
            below = self.inside(pattern)
            if below is None:  # refused before the run
                return
            base: Rel = ()
            segments = [s for s in below if s != "."]
        else:
            try:
                base = self.resolve((), skill_rel.split("/"), skill_rel)[0]
            except (PathRefusedError, OSError):
                return
            segments = _parts(pattern)
        visited: set[Rel] = set()
        stack: list[tuple[Rel, int, Rel]] = [(base, 0, ())]
        while stack:
            rel, i, shown = stack.pop()
            here = "/".join(shown) or "."
            if i == len(segments):  # a pattern ending in ** matches the folder itself
                yield from self._final(rel[:-1], rel[-1], here) if rel else ()
                continue
            seg = segments[i]
            below: list[tuple[Rel, int, Rel]] = []
            if seg == "**":
                stack.append((rel, i + 1, shown))
                if len(shown) >= MAX_DEPTH:
                    yield PathRefusedError(here, f"is more than {MAX_DEPTH} folders deep; not searched further")
                    continue
                for name, maybe_folder in self.entries(rel, here):
                    if name.startswith(".") or not maybe_folder:
                        continue
                    folder = self.folder(rel, name, "/".join((*shown, name)))
                    if isinstance(folder, PathRefusedError):
                        yield folder
                    elif folder is not None and folder not in visited:
                        visited.add(folder)
                        below.append((folder, i, (*shown, name)))
                stack.extend(reversed(below))
                continue
            if _MAGIC.search(seg):
                names = [n for n, _ in self.entries(rel, here) if name_matches(n, seg)]
            else:
                names = [seg]
            for name in names:
                if i == len(segments) - 1:
                    yield from self._final(rel, name, "/".join((*shown, name)))
                    continue
                folder = self.folder(rel, name, "/".join((*shown, name)))
                if isinstance(folder, PathRefusedError):
                    yield folder
                elif folder is not None:
                    below.append((folder, i + 1, (*shown, name)))
            stack.extend(reversed(below))

    def _final(self, rel: Rel, name: str, shown: str) -> Iterator[tuple[Rel, os.stat_result] | PathRefusedError]:
        try:
            yield self.resolve(rel, [name], shown)
        except PathRefusedError as refused:
            if refused.reason != MISSING or refused.name != "/".join((*rel, name)):
                yield refused  # a name that simply is not there matched nothing
        except OSError as exc:
            yield PathRefusedError(shown, f"cannot be read: {exc.strerror or exc}")


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def _swap(old: int, new: int) -> int:
    os.close(old)
    return new
