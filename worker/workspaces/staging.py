"""Staging: putting a skill's folder into a workspace as ``skills/<name>``.

Three stagers:

* ``TreeSkillStager`` (the default) makes the skill's folders anew in the workspace, writable by the workspace's
  user and sticky, and hard-links each file of the library into them (copies where a link cannot be made): a
  folder of real files that takes new ones. A command may write next to itself (a thumbnail in its working
  folder, a packaged copy of the skill) and remove or replace what it wrote, and ``cp -r`` of it gives real files;
  the skill's own files cannot be changed, removed or replaced, what a command writes stays in the workspace, and
  the library is never touched.
* ``LinkSkillStager`` links each top-level entry of the skill folder into the workspace: no copy, and edits to the
  library show up at once; the staged folder is read-only.
* ``CopySkillStager`` copies the folder (symlinks stay symlinks, never followed); the copy is read-only.

Each staged folder gets the ``work``, ``out`` and ``inputs`` links of the guide. When the host runs as root the
command runs as the workspace's own user, who owns no library file; a library file that user could write
(world-writable) is refused. Staging an unchanged skill again is a signature comparison and nothing more.

A staged folder is built under a temporary name unique to the call (``.staging-<name>-XXXXXXXX``, by ``mkdtemp``)
and put in place by two renames (what is there aside, the new one in), so ``skills/<name>`` is only ever a whole
staged folder: stagers staging one skill at once — threads, processes, two workers on one host — never share a
folder being built, and both succeed (one that finds the other's folder placed between its renames keeps that one).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from worker import defaults
from worker.contract import SkillRef
from worker.errors import StagingError
from worker.roots.folders import reachable_by_others, remove_tree
from worker.roots.library_fetch import locate
from worker.roots.sources import is_url
from worker.workspaces.manager import Workspace

SKILL_FILE = "SKILL.md"
SETTLED_NS = 1_000_000_000
MAX_REMEMBERED_WORKSPACES = 4096
"""Workspaces whose staged skills a stager remembers (a removed workspace is forgotten at once)."""
LOCK_STRIPES = 64
"""Locks that serialise staging into one workspace, shared by workspaces by hash (not one kept per workspace)."""
"""A folder listed this long after its last change keeps its listing while its mtime stays: any later change
gets a later mtime (file system clock ticks are milliseconds)."""
WORKSPACE_LINKS = {"work": "../../work", "out": "../../out", "inputs": "../../work/inputs"}


def resolve_skill_source(skill: SkillRef) -> Path:
    """The real folder of ``skill`` inside its root (a URL root is fetched into the cache once), refusing paths
    that leave the root."""
    return resolve_skill_paths(skill)[1]


def resolve_skill_paths(skill: SkillRef) -> tuple[Path, Path]:
    """The real folders of ``skill``'s library root and of the skill inside it (see ``resolve_skill_source``)."""
    located = locate(skill)
    root = located.resolve() if is_url(located.root) else Path(located.root)
    if not root.is_dir():
        raise StagingError(f"skills root {skill.root!r} is not a directory")
    real_root = root.resolve()
    source = (real_root / skill.path).resolve()
    if source != real_root and real_root not in source.parents:
        raise StagingError(f"skill path {skill.path!r} leaves the skills root {skill.root!r}")
    if not (source / SKILL_FILE).is_file():
        raise StagingError(f"skill {skill.name!r}: no {SKILL_FILE} in {source}")
    return real_root, source


class BaseSkillStager(ABC):
    """Puts a skill folder into a workspace's ``skills/`` directory."""

    kind: str = "base"
    writable: bool = False
    """Whether the workspace's user may add files to the staged folder's folders (``WRITABLE_FOLDER``: theirs to
    remove again, the skill's own not)."""

    def __init__(self) -> None:
        self._signatures: OrderedDict[str, dict[str, str]] = OrderedDict()  # workspace path → skill → signature
        self._signatures_lock = threading.Lock()
        self._sources: dict[tuple[str, str], Path] = {}
        self._locks = [threading.Lock() for _ in range(LOCK_STRIPES)]

    def stage(self, workspace: Workspace, skill: SkillRef) -> Path:
        """Stage ``skill`` into ``workspace`` (or do nothing if it is staged and unchanged); return its folder.

        Runs of one workspace that start together stage one at a time: the later finds the skill staged."""
        with self._locks[hash(workspace.path) % LOCK_STRIPES]:
            return self._stage(workspace, skill)

    def _stage(self, workspace: Workspace, skill: SkillRef) -> Path:
        source = self._sources.get((skill.root, skill.path))
        if source is None:
            source = self._sources[(skill.root, skill.path)] = resolve_skill_source(skill)
        target = workspace.skills_dir / skill.name
        try:
            signature = self._signature(source)
        except FileNotFoundError as exc:
            self._sources.pop((skill.root, skill.path), None)
            raise StagingError(f"skill {skill.name!r}: {source} is gone from its skills root") from exc
        if self._remembered(workspace, skill) == signature and target.is_dir():
            return target
        meta = workspace.read_metadata()
        staged = meta.setdefault("staged", {})
        if staged.get(skill.name, {}).get("signature") == signature and target.is_dir():
            self._remember(workspace, skill, signature)
            return target
        if not self._build(workspace, source, target):
            return target  # another stager's folder is in place: its signature is the one it records
        signature = self._signature(source)  # the build may have chosen how the folder is to be checked
        staged[skill.name] = {"source": str(source), "stager": self.kind, "signature": signature}
        workspace.write_metadata(meta)
        self._remember(workspace, skill, signature)
        return target

    def _remembered(self, workspace: Workspace, skill: SkillRef) -> str | None:
        return self._signatures.get(str(workspace.path), {}).get(skill.name)

    def _remember(self, workspace: Workspace, skill: SkillRef, signature: str) -> None:
        """Note what is staged where, for the ``MAX_REMEMBERED_WORKSPACES`` latest (a forgotten one is read back
        from the workspace's metadata)."""
        key = str(workspace.path)
        with self._signatures_lock:
            self._signatures.setdefault(key, {})[skill.name] = signature
            self._signatures.move_to_end(key)
            while len(self._signatures) > MAX_REMEMBERED_WORKSPACES:
                self._signatures.popitem(last=False)

    def forget(self, workspace: Workspace) -> None:
        """Forget what was staged into ``workspace`` (it is being removed)."""
        with self._signatures_lock:
            self._signatures.pop(str(workspace.path), None)

    def current(self, workspace: Workspace, skill: SkillRef) -> Path | None:
        """The staged folder of ``skill`` when this stager staged it into ``workspace`` and it is unchanged since;
        ``None`` when it must go through ``stage``. Touches nothing but the signature's metadata."""
        source = self._sources.get((skill.root, skill.path))
        if source is None or not self._quick(source):
            return None
        try:
            signature = self._signature(source)
        except FileNotFoundError:
            return None
        if self._remembered(workspace, skill) != signature:
            return None
        target = workspace.skills_dir / skill.name
        return target if os.path.isdir(target) else None

    def linked_source(self, skill: SkillRef) -> Path | None:
        """The library folder a staged ``skill`` links into, which its runs must see (read-only); ``None`` when
        it is staged as a copy (or was never staged by this stager)."""
        return None

    def _signature(self, source: Path) -> str:
        return f"{self.kind}:{source}:{self.signature(source)}"

    def _quick(self, source: Path) -> bool:
        """Whether ``signature(source)`` costs a couple of metadata system calls whatever the skill's size (so
        ``current`` may be called on an event loop)."""
        return False

    @abstractmethod
    def signature(self, source: Path) -> str:
        """A string that changes whenever the staged folder would have to be rebuilt."""

    @abstractmethod
    def _fill(self, workspace: Workspace, source: Path, staging: Path) -> None:
        """Put the skill's entries into the empty folder ``staging``."""

    def _build(self, workspace: Workspace, source: Path, target: Path) -> bool:
        """Build the staged folder under a name of its own (``mkdtemp``: unique per call, whatever the thread or
        process) and rename it into place; ``False`` when another stager put its whole folder in place between the
        two renames (that one is kept, this one discarded). The folder at ``target`` is always a whole one."""
        staging = Path(tempfile.mkdtemp(prefix=f".staging-{target.name}-", dir=target.parent))
        try:
            staging.chmod(0o755)
            self._fill(workspace, source, staging)
            for name, link in WORKSPACE_LINKS.items():
                os.symlink(link, staging / name)
            if self.writable and workspace.uid is not None:
                _open_to_workspace(staging, workspace)
            elif not self.writable and workspace.uid is None:
                # Without a separate user, file modes are what keeps the command out of the staged folder.
                staging.chmod(0o555)
            old = target.with_name(f".old-{target.name}-{os.urandom(8).hex()}")
            with contextlib.suppress(FileNotFoundError):  # nothing staged yet, or another stager moved it away
                os.rename(target, old)
            try:
                os.rename(staging, target)
                placed = True
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                remove_tree(staging)  # another stager placed its folder between the two renames
                placed = False
            remove_tree(old)
            return placed
        except BaseException:
            remove_tree(staging)
            raise


class CopySkillStager(BaseSkillStager):
    """Copies the skill folder into the workspace; the copy is read-only."""

    kind = "copy"

    def signature(self, source: Path) -> str:
        digest = hashlib.sha256()
        for rel, _, info in walk_tree(source):
            digest.update(f"{rel}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_mode}\n".encode())
        return digest.hexdigest()

    def _fill(self, workspace: Workspace, source: Path, staging: Path) -> None:
        for entry in os.scandir(source):
            if entry.name in WORKSPACE_LINKS:
                continue
            dest = staging / entry.name
            if entry.is_dir(follow_symlinks=False):
                shutil.copytree(entry.path, dest, symlinks=True)
            elif entry.is_symlink():
                os.symlink(os.readlink(entry.path), dest)
            else:
                shutil.copy2(entry.path, dest)
        _make_read_only(staging)


class LinkSkillStager(BaseSkillStager):
    """Links the skill's top-level entries into the workspace instead of copying them.

    When commands run as a workspace user (host root), every library file must be unwritable by that user;
    a world-writable file or folder is refused. When that user cannot reach the library at all (for example a
    library under ``/root``), the skill is copied instead, unless ``fallback_to_copy`` is off.
    """

    kind = "link"

    def __init__(self, fallback_to_copy: bool = True) -> None:
        super().__init__()
        self.fallback_to_copy = fallback_to_copy
        self._listings: dict[Path, tuple[int, str]] = {}  # source → (mtime, entries) of settled listings
        self._copied: set[Path] = set()  # sources the workspace user cannot reach, staged as copies

    def signature(self, source: Path) -> str:
        """The folder's mtime and its entries (what linking depends on). The entries are listed again only when
        the mtime moved, or when the last listing was taken so soon after the folder's last change that a change
        in the same clock tick could have left the mtime where it was. A source staged as a copy is checked as
        the copying stager checks it: every file, nested ones included."""
        if source in self._copied:
            return "copied:" + CopySkillStager().signature(source)
        mtime = os.stat(source).st_mtime_ns
        known = self._listings.get(source)
        if known is not None and known[0] == mtime:
            return f"{mtime}:{known[1]}"
        listed_at = time.time_ns()
        entries = ",".join(sorted(os.listdir(source)))
        if listed_at - mtime > SETTLED_NS:
            self._listings[source] = (mtime, entries)
        return f"{mtime}:{entries}"

    def _quick(self, source: Path) -> bool:
        return source not in self._copied

    def linked_source(self, skill: SkillRef) -> Path | None:
        source = self._sources.get((skill.root, skill.path))
        return None if source is None or source in self._copied else source

    def _fill(self, workspace: Workspace, source: Path, staging: Path) -> None:
        if workspace.uid is not None:
            _refuse_writable_by_others(source)
            if not reachable_by_others(source):
                if not self.fallback_to_copy:
                    raise StagingError(
                        f"the workspace user cannot read {source} (a parent folder is not searchable by others); "
                        "use CopySkillStager or make the library readable"
                    )
                CopySkillStager()._fill(workspace, source, staging)
                self._copied.add(source)
                return
        for entry in os.scandir(source):
            if entry.name not in WORKSPACE_LINKS:
                os.symlink(os.path.realpath(entry.path), staging / entry.name)


class TreeSkillStager(BaseSkillStager):
    """Makes the skill's folders in the workspace, holding hard links to the library's files (see the module's
    description). Each folder is root's, in the workspace's group, group-writable and sticky
    (``WRITABLE_FOLDER``): the command adds files, and removes or renames only those it made.

    A file of the library is linked, so it costs no space and an edit made to it in place shows up at once; it
    stays the library's (its owner and mode), so the command cannot change it, only replace it in its own folder.
    Where a link cannot be made (the library is on another file system), where commands run as the library's own
    user (no separate workspace user: a link would let them write the library), and where a file's owner or group
    is a sandbox id (a workspace's: an archive unpacked with its numeric owners), the file is copied instead, the
    copy root's and read-only. Symbolic links are kept as they are; special files, and files and folders others
    may not read (the command could not read them through a link either, but output collection reads as root),
    are left out. The staged folder is made again when a folder of the skill changes (a file added, removed or
    renamed: the folder's mtime moves); what a command wrote in the staged folder goes with it then.
    """

    kind = "tree"
    writable = True

    def __init__(self) -> None:
        super().__init__()
        self._folders: dict[Path, tuple[str, ...]] = {}  # source → its folders (relative), from the last walk
        self._copied: set[Path] = set()  # sources staged as copies (checked file by file)

    def signature(self, source: Path) -> str:
        """Every folder of the skill with its mtime and inode (a file added, removed or renamed moves its folder's
        mtime; one edited in place is the linked file itself). The folders are walked again when one of them moved
        or when the last walk was so soon after a change that another in the same clock tick could have left the
        mtime where it was. A source staged as copies is checked as the copying stager checks it."""
        if source in self._copied:
            return "copied:" + CopySkillStager().signature(source)
        folders = self._folders.get(source)
        if folders is not None:
            stamps = _stamps(source, folders)
            if stamps is not None:
                return stamps
        listed_at = time.time_ns()
        found = tuple(sorted(os.path.relpath(dirpath, source) for dirpath, _, _ in _walk_folders(source)))
        stamps = _stamps(source, found) or ""
        newest = max((int(part.rsplit(":", 2)[1]) for part in stamps.split("\n") if part), default=0)
        if listed_at - newest > SETTLED_NS:
            self._folders[source] = found
        else:
            self._folders.pop(source, None)
        return stamps

    def _quick(self, source: Path) -> bool:
        folders = self._folders.get(source)
        return source not in self._copied and folders is not None and len(folders) <= MAX_QUICK_FOLDERS

    def _fill(self, workspace: Workspace, source: Path, staging: Path) -> None:
        separate_user = workspace.uid is not None
        if separate_user:
            _refuse_writable_by_others(source)
        copied = not separate_user
        for dirpath, dirnames, filenames in _walk_folders(source):
            relative = os.path.relpath(dirpath, source)
            into = staging if relative == "." else staging / relative
            if relative != ".":
                os.mkdir(into, 0o755)
                if separate_user:
                    _open_to_workspace(into, workspace)
            for name in filenames:
                if relative == "." and name in WORKSPACE_LINKS:
                    continue
                copied |= _place_file(os.path.join(dirpath, name), into / name, copy=not separate_user)
        if copied:
            self._copied.add(source)
        else:
            self._copied.discard(source)


MAX_QUICK_FOLDERS = 32
"""A skill with at most this many folders is checked on the event loop (a ``stat`` per folder)."""
WRITABLE_FOLDER = 0o1775
"""A tree-staged folder's mode: root's, writable by the workspace's group, sticky (a file in it may be removed or
renamed by its owner alone: the command's own, not the skill's)."""


def _open_to_workspace(folder: Path, workspace: Workspace) -> None:
    os.lchown(folder, 0, workspace.gid)
    os.chmod(folder, WRITABLE_FOLDER)


def _walk_folders(source: Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk`` of the skill without following links: its folders others may list and enter and, in
    ``filenames``, every other entry (files, links), folders named like the workspace links skipped at the top."""
    for dirpath, dirnames, filenames in os.walk(source):
        if dirpath == str(source):
            filenames += [name for name in dirnames if name in WORKSPACE_LINKS]
            dirnames[:] = [name for name in dirnames if name not in WORKSPACE_LINKS]
        linked = [name for name in dirnames if os.path.islink(os.path.join(dirpath, name))]
        dirnames[:] = sorted(name for name in dirnames if name not in linked and _open_to_others(
            os.path.join(dirpath, name)))
        yield dirpath, dirnames, sorted(filenames + linked)


def _open_to_others(folder: str) -> bool:
    try:
        return os.lstat(folder).st_mode & 0o005 == 0o005
    except OSError:
        return False


def _sandbox_id(number: int) -> bool:
    """Whether ``number`` is a workspace's user or group id (the sandbox range)."""
    return defaults.SANDBOX_UID_BASE <= number < defaults.SANDBOX_UID_BASE + defaults.SANDBOX_UID_COUNT


def _stamps(source: Path, folders: tuple[str, ...]) -> str | None:
    """Each folder's relative path, mtime and inode, a line each; ``None`` when one is gone (walk again)."""
    lines = []
    for relative in folders:
        try:
            info = os.stat(source / relative, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(info.st_mode):
            return None
        lines.append(f"{relative}:{info.st_mtime_ns}:{info.st_ino}")
    return "\n".join(lines)


def _place_file(path: str, dest: Path, *, copy: bool) -> bool:
    """Put the library entry at ``path`` at ``dest``: a link as a link, a file others may read hard-linked (or
    copied when ``copy``, when its owner or group is a sandbox id, or when no link can be made), anything else left
    out; whether it was copied."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(path), dest)
        return False
    if not stat.S_ISREG(info.st_mode) or not info.st_mode & stat.S_IROTH:
        return False
    if not copy and not _sandbox_id(info.st_uid) and not _sandbox_id(info.st_gid):
        try:
            os.link(path, dest, follow_symlinks=False)
            return False
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES):
                raise
    shutil.copy2(path, dest, follow_symlinks=False)
    os.chmod(dest, (stat.S_IMODE(info.st_mode) & 0o555) | 0o444)
    return True


def walk_tree(source: Path) -> Iterator[tuple[str, str, os.stat_result]]:
    """Every entry below ``source`` in a stable order: (path relative to it, full path, ``lstat``)."""
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames.sort()
        for name in sorted(filenames) + dirnames:
            path = os.path.join(dirpath, name)
            yield os.path.relpath(path, source), path, os.lstat(path)


def _make_read_only(top: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(top, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                mode = stat.S_IMODE(os.lstat(path).st_mode)
                os.chmod(path, (mode & 0o555) | 0o444)
        for name in dirnames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                os.chmod(path, 0o555)


def _refuse_writable_by_others(source: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(source):
        for name in [""] + dirnames + filenames:
            path = os.path.join(dirpath, name) if name else dirpath
            info = os.lstat(path)
            if not stat.S_ISLNK(info.st_mode) and info.st_mode & stat.S_IWOTH:
                raise StagingError(
                    f"library file {path} is writable by everyone, so a skill command could change it; "
                    "remove its o+w bit (chmod o-w) before staging"
                )
