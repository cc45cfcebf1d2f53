"""Workspaces: one directory per session id, laid out as the guide describes.

::

    <work_root>/ws_<id>_<time_ns>/
    ├── metadata.json
    ├── skills/<name>/        staged skill, read-only to the command, with work, out, inputs links
    ├── work/inputs/          shared working directory and the run's input files
    ├── out/                  output files
    └── runs/run_<timestamp>/ one directory per run ($RUN_DIR, also the command's HOME and TMPDIR)

The same workspace id always maps to the same directory (an index of links under ``<work_root>/.skillrun``),
so ``work/`` and ``out/`` persist across a session's runs, also across processes. A workspace exists once its index
link does (made last); a ``ws_*`` folder no link names is half-made — a worker was killed while creating it, or its
metadata was lost — and is removed, with its disk and user id, once untouched for ``HALF_MADE_SECONDS``
(``sweep_half_made``: by a manager's first ``acquire`` that goes to disk, then at most every
``HALF_MADE_SWEEP_SECONDS``).
A reservation nobody took (no metadata) is left to ``sweep_reserved``, which knows the containers that use one.

When the host process runs as root, file modes do not bind a command that runs as root, so every workspace
gets a user id of its own (allocated from a range, exclusively, across processes): the command runs as that
user, can write ``work/``, ``out/`` and its run directory, cannot write the staged skill or the library, and
cannot read another workspace.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from worker.contract import WORKSPACE_ID_PATTERN
from worker.names import workspace_variables
from worker.errors import WorkspaceError
from worker.roots.folders import reachable_by_others, remove_tree
from worker.workspaces.user_ids import UserIdRegistry

METADATA_FILE = "metadata.json"
METADATA_MODE = 0o644
REGISTRY_DIR = ".skillrun"
SPARE_RUN_DIR = ".next"
MIN_DISK_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Workspace:
    """A workspace directory and the identity its commands run under."""

    id: str
    path: Path
    uid: int | None = None
    gid: int | None = None

    @property
    def skills_dir(self) -> Path:
        return self.path / "skills"

    @property
    def work_dir(self) -> Path:
        return self.path / "work"

    @property
    def inputs_dir(self) -> Path:
        return self.path / "work" / "inputs"

    @property
    def out_dir(self) -> Path:
        return self.path / "out"

    @property
    def runs_dir(self) -> Path:
        return self.path / "runs"

    @property
    def metadata_path(self) -> Path:
        return self.path / METADATA_FILE

    def variables(self, skill_name: str, run_dir: Path) -> dict[str, str]:
        """The six workspace variables of the guide."""
        return workspace_variables(str(self.path), str(run_dir), skill_name)

    def read_metadata(self) -> dict:
        try:
            return json.loads(self.metadata_path.read_text())
        except (OSError, ValueError):
            return {}

    def write_metadata(self, data: dict) -> None:
        """Written aside under a name unique to the call and renamed into place: a reader sees the old or the new,
        and writers at the same moment (threads, processes) never share the file being written."""
        fd, aside = tempfile.mkstemp(prefix=f".{METADATA_FILE}.", suffix=".tmp", dir=self.path)
        try:
            with os.fdopen(fd, "w") as f:
                os.fchmod(f.fileno(), METADATA_MODE)
                f.write(json.dumps(data, indent=2, sort_keys=True))
            os.replace(aside, self.metadata_path)
        except BaseException:
            Path(aside).unlink(missing_ok=True)
            raise


def run_stamp() -> str:
    """The ``<timestamp>`` of ``runs/run_<timestamp>``: UTC, to the microsecond."""
    seconds, micros = divmod(time.time_ns() // 1000, 1_000_000)
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(seconds))}.{micros:06d}"


def default_work_root() -> Path:
    """Where workspaces go unless a work root is named. As root, the system temporary directory (as the guide puts
    them): workspace users must reach their folders. Any other account gets a folder of its own, so two accounts of
    one machine never share one: ``$XDG_CACHE_HOME/skillrun`` (``~/.cache/skillrun``), or ``<tmp>/skillrun-<uid>``
    for an account without a home folder."""
    if os.geteuid() == 0:
        return Path(tempfile.gettempdir())
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(cache):
        return Path(cache) / "skillrun"
    home = os.path.expanduser("~")
    if os.path.isabs(home) and home != "/" and os.path.isdir(home):
        return Path(home) / ".cache" / "skillrun"
    return Path(tempfile.gettempdir()) / f"skillrun-{os.geteuid()}"


WORK_ROOT_HINT = "set SKILLRUN_WORK_ROOT to a folder of your own (or pass work_root)"


def check_work_root(work_root: Path) -> None:
    """Make ``work_root`` if it is not there, and refuse one this account cannot safely use, in one line that says
    what to do (``WorkspaceError``): not a folder, another account's (unless sticky, as ``/tmp`` is), writable by
    others without the sticky bit (another account could swap its workspaces), not writable, on a file system
    mounted ``noexec`` (skills' programs could not run), under a folder others may write in without the sticky bit
    (another account could swap the work root itself); and its registry folder (``.skillrun``) a link, not a
    folder, another account's (that account ran Skillrun here first) or writable by others."""
    euid = os.geteuid()
    try:
        work_root.mkdir(parents=True, exist_ok=True, mode=0o755)
        info = work_root.stat()
    except FileExistsError:
        raise _refused(work_root, "it is not a folder") from None
    except OSError as exc:
        raise _refused(work_root, exc.strerror or str(exc)) from None
    sticky = bool(info.st_mode & stat.S_ISVTX)
    if not stat.S_ISDIR(info.st_mode):
        raise _refused(work_root, "it is not a folder")
    if info.st_uid != euid and not sticky:
        raise _refused(work_root, f"it belongs to uid {info.st_uid}, not to this account (uid {euid})")
    if stat.S_IMODE(info.st_mode) & 0o022 and not sticky:
        raise _refused(work_root, f"others may write in it (mode {stat.S_IMODE(info.st_mode):o}) and it is not sticky")
    if not os.access(work_root, os.W_OK | os.X_OK):
        raise _refused(work_root, "this account may not write in it")
    if os.statvfs(work_root).f_flag & os.ST_NOEXEC:
        raise _refused(work_root, "its file system is mounted noexec, so skills' programs could not run there")
    for above in Path(os.path.realpath(work_root)).parents:
        mode = above.stat().st_mode
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            raise _refused(work_root, f"others may write in {above}, a folder above it, which is not sticky (another "
                                     "account could put a folder of its own in the work root's place)")
    if os.path.lexists(work_root / REGISTRY_DIR):
        check_registry(work_root)


def check_registry(work_root: Path) -> None:
    """Refuse the work root whose registry folder (``.skillrun``, which must be there) is a link, not a folder,
    another account's (that account ran Skillrun here first) or writable by others (``WorkspaceError``)."""
    euid, registry = os.geteuid(), work_root / REGISTRY_DIR
    try:
        found = registry.lstat()
    except OSError as exc:
        raise _refused(work_root, f"{registry}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(found.st_mode) or not stat.S_ISDIR(found.st_mode):
        raise _refused(work_root, f"{registry} is not a folder (a link or a file)")
    if found.st_uid != euid:
        raise _refused(work_root, f"{registry} belongs to uid {found.st_uid} (another account used this work root), "
                                 f"not to this account (uid {euid})")
    if stat.S_IMODE(found.st_mode) & 0o022:
        raise _refused(work_root, f"others may write in {registry} (mode {stat.S_IMODE(found.st_mode):o})")


def _refused(work_root: Path, reason: str) -> WorkspaceError:
    """The one-line refusal of a work root, saying what to do."""
    return WorkspaceError(f"work root {work_root} cannot be used: {reason}; {WORK_ROOT_HINT}")


RESERVED_PREFIX = "ws_reserved_"
"""The start of a reserved folder's name (``WorkspaceManager.reserve``)."""
HALF_MADE_SECONDS = 600.0
"""How long a workspace folder no index link names is left alone: making one (folder, disk, user id, layout, link)
takes seconds, so one this old was left half-made by a worker that died."""
HALF_MADE_SWEEP_SECONDS = 300.0
"""How often ``acquire`` looks for half-made workspace folders (first when a manager first goes to disk)."""
_WORKSPACE_FOLDER = re.compile(r"ws_[A-Za-z0-9][A-Za-z0-9._-]{0,63}_[0-9]+")
"""A workspace's folder name, ``ws_<id>_<time_ns>`` (a reservation's is ``ws_reserved_<hex>_<time_ns>``)."""


class WorkspaceManager:
    """Creates, finds and removes workspaces under one work root."""

    def __init__(
        self,
        work_root: str | os.PathLike[str] | None = None,
        *,
        isolate_users: bool | None = None,
        user_ids: UserIdRegistry | None = None,
        fixed_uid: int | None = None,
        disk_bytes: int | None = None,
    ) -> None:
        """``isolate_users`` gives each workspace a user of its own (default: when running as root);
        ``fixed_uid`` instead gives every workspace the same owner (a container's user, for example);
        ``disk_bytes`` gives each workspace a file system of that size of its own (a loop-mounted ext4 image, root
        only), so a command that fills its workspace gets "no space left" and nothing else runs out of disk."""
        self.work_root = Path(work_root) if work_root is not None else default_work_root()
        self.fixed_uid = fixed_uid
        if disk_bytes is not None and (disk_bytes < MIN_DISK_BYTES or os.geteuid() != 0):
            raise WorkspaceError(f"a workspace disk needs root and at least {MIN_DISK_BYTES} bytes")
        self.disk_bytes = disk_bytes
        self.isolate_users = fixed_uid is None and ((os.geteuid() == 0) if isolate_users is None else isolate_users)
        if (self.isolate_users or fixed_uid is not None) and os.geteuid() != 0:
            raise WorkspaceError("per-workspace users and workspace owners need the host process to run as root")
        self.user_ids = user_ids or UserIdRegistry()
        self._known: dict[str, Workspace] = {}
        self._next_sweep = float("-inf")
        self._checked = False

    @property
    def registry(self) -> Path:
        return self.work_root / REGISTRY_DIR

    def acquire(self, workspace_id: str, *, reserved: Workspace | None = None) -> Workspace:
        """Return the workspace of ``workspace_id``, creating it on first use — in the ``reserved`` folder, if
        given (``reserve``; when the workspace exists already the reservation is left as it was)."""
        if not WORKSPACE_ID_PATTERN.fullmatch(workspace_id):
            raise WorkspaceError(f"invalid workspace id {workspace_id!r}: use 1-64 letters, digits, '.', '_' or '-'")
        known = self._known.get(workspace_id)
        if known is not None and os.path.isdir(known.path):
            return known
        self._ensure_registry()
        if time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + HALF_MADE_SWEEP_SECONDS
            self.sweep_half_made()
        workspace = self._find(workspace_id) or self._create(workspace_id, reserved)
        self._known[workspace_id] = workspace
        return workspace

    def reserve(self) -> Workspace:
        """An empty folder (with its disk and user id) for a workspace that has no id yet, such as one a warm
        container is made for; ``acquire(..., reserved=)`` lays a workspace out in it, ``release`` gives an
        unused one back. Its name starts with ``RESERVED_PREFIX``."""
        self._ensure_registry()
        path = self.work_root / f"{RESERVED_PREFIX}{os.urandom(6).hex()}_{time.time_ns()}"
        path.mkdir(mode=0o700)
        uid = gid = None
        try:
            if self.disk_bytes is not None:
                self._mount_disk(path)
            if self.isolate_users:
                uid = gid = self.user_ids.allocate(path, int.from_bytes(os.urandom(4), "big") % self.user_ids.count)
            elif self.fixed_uid is not None:
                uid = gid = self.fixed_uid
        except BaseException:
            self._discard(path, uid)
            raise
        return Workspace(id="", path=path, uid=uid, gid=gid)

    def release(self, reserved: Workspace) -> None:
        """Give back a reservation no workspace took: its folder, disk and user id."""
        if not (reserved.path / METADATA_FILE).exists():
            self._discard(reserved.path, reserved.uid)

    def sweep_reserved(self, in_use: set[str], older_than: float) -> None:
        """Give back the reservations no workspace took, none of ``in_use`` names, made more than ``older_than``
        seconds ago (a worker that died between reserving and using them): folders, disks and user ids."""
        cutoff = time.time() - older_than
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.work_root):
                if (entry.name.startswith(RESERVED_PREFIX) and entry.name not in in_use
                        and entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff
                        and not os.path.exists(os.path.join(entry.path, METADATA_FILE))):
                    self._discard(Path(entry.path), None)
                    if self.isolate_users:
                        self.user_ids.release_owner(Path(entry.path))

    def sweep_half_made(self, older_than: float = HALF_MADE_SECONDS) -> list[Path]:
        """Remove the workspace folders left half-made (a worker killed while creating one): a ``ws_<id>_<time>``
        folder that no index link names, untouched for ``older_than`` seconds — with its disk and user id. A
        reservation is one only once laid out (it has metadata). Returns the folders removed."""
        named = set()
        with contextlib.suppress(FileNotFoundError), os.scandir(self.registry / "workspaces") as links:
            for link in links:
                with contextlib.suppress(OSError):
                    named.add(os.readlink(link.path))
        cutoff = time.time() - older_than
        removed = []
        with contextlib.suppress(FileNotFoundError), os.scandir(self.work_root) as listing:
            for entry in listing:
                if entry.name in named or not _WORKSPACE_FOLDER.fullmatch(entry.name):
                    continue
                path = Path(entry.path)
                with contextlib.suppress(OSError, WorkspaceError):  # one that cannot be removed is tried next time
                    if (not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_mtime >= cutoff
                            or entry.name.startswith(RESERVED_PREFIX) and not (path / METADATA_FILE).exists()):
                        continue
                    self._discard(path, None)
                    if self.isolate_users:
                        self.user_ids.release_owner(path)
                    removed.append(path)
        return removed

    def find_known(self, workspace_id: str) -> Workspace | None:
        """The workspace of ``workspace_id`` if this manager has used it (no disk access)."""
        return self._known.get(workspace_id)

    def find(self, workspace_id: str) -> Workspace | None:
        """The existing workspace of ``workspace_id``, or ``None``."""
        if not WORKSPACE_ID_PATTERN.fullmatch(workspace_id) or not self.registry.is_dir():
            return None
        return self._find(workspace_id)

    def remove(self, workspace_id: str) -> None:
        """Delete a workspace, its index entry and its user id."""
        workspace = self.find(workspace_id)
        self._known.pop(workspace_id, None)
        if workspace is None:
            return
        self._unmount_disk(workspace.path)
        remove_tree(workspace.path)  # first: a workspace that could not be removed stays findable, to try again
        (self.registry / "workspaces" / workspace_id).unlink(missing_ok=True)
        if workspace.uid is not None and self.isolate_users:
            self.user_ids.release(workspace.uid, workspace.path)

    def new_run_dir(self, workspace: Workspace) -> Path:
        """Create ``runs/run_<timestamp>`` for one run (unique even for runs in the same microsecond): the spare
        folder if one is ready, else a new one."""
        base = self._run_dir_name(workspace)
        spare = self.take_spare_run_dir(workspace, base)
        if spare is not None:
            return spare
        candidate, n = base, 0
        while True:
            try:
                os.mkdir(candidate, 0o700)
                break
            except FileExistsError:
                n += 1
                candidate = f"{base}-{n}"
        if workspace.uid is not None:
            os.chown(candidate, workspace.uid, workspace.gid)
        return Path(candidate)

    def take_spare_run_dir(self, workspace: Workspace, name: str | None = None) -> Path | None:
        """Rename the spare folder ``prepare_run_dir`` left into place as this run's folder; ``None`` if there is
        none. A rename allocates no inode (a ``mkdir`` may wait for the disk to read an inode table block): this
        costs metadata calls only, so it may run on an event loop."""
        name = name or self._run_dir_name(workspace)
        if os.path.lexists(name):
            return None
        try:
            os.rename(f"{workspace.path}/runs/{SPARE_RUN_DIR}", name)
        except OSError:
            return None
        return Path(name)

    @staticmethod
    def _run_dir_name(workspace: Workspace) -> str:
        return f"{workspace.path}/runs/run_{run_stamp()}"

    def prepare_run_dir(self, workspace: Workspace) -> None:
        """Make the spare folder the next ``new_run_dir`` will rename into place (call it off the critical path)."""
        spare = workspace.runs_dir / SPARE_RUN_DIR
        if spare.exists():
            return
        # Made under a private name and renamed: a run never finds a spare that is not yet its user's.
        making = workspace.runs_dir / f"{SPARE_RUN_DIR}-{os.getpid()}-{threading.get_ident()}"
        making.mkdir(mode=0o700)
        if workspace.uid is not None:
            os.chown(making, workspace.uid, workspace.gid)
        os.rename(making, spare)

    def check(self) -> None:
        """Refuse a work root this account cannot use (``check_work_root``), once: on a manager's first use."""
        if not self._checked:
            check_work_root(self.work_root)
            self._checked = True

    def _ensure_registry(self) -> None:
        self.check()
        if self.isolate_users and not reachable_by_others(self.work_root):
            raise WorkspaceError(
                f"work root {self.work_root} (or a folder above it) cannot be entered by other users, so commands "
                "running as a workspace user could not reach their workspace; choose a work root under a folder "
                "with mode o+x (for example /tmp or /var/lib/skillrun)"
            )
        try:
            (self.registry / "workspaces").mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise _refused(self.work_root, exc.strerror or str(exc)) from None
        check_registry(self.work_root)

    def _find(self, workspace_id: str) -> Workspace | None:
        link = self.registry / "workspaces" / workspace_id
        try:
            target = os.readlink(link)
        except FileNotFoundError:
            return None
        path = self.work_root / target
        meta_path = path / METADATA_FILE
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            # The directory was cleaned up from outside (or never finished): forget it and start again.
            link.unlink(missing_ok=True)
            return None
        if meta.get("workspace_id") != workspace_id:
            raise WorkspaceError(f"index entry for {workspace_id!r} points at another workspace ({path})")
        if self.isolate_users:
            uid, gid = meta.get("uid"), meta.get("gid")
            if uid is not None and not self.user_ids.claim(uid, path):
                raise WorkspaceError(f"workspace {workspace_id!r} ({path}) has user id {uid}, which another "
                                     "workspace of this host holds; remove one of them")
        else:  # the workspace's commands ran as this account, which may have written its metadata: not believed
            uid = gid = self.fixed_uid
        return Workspace(id=workspace_id, path=path, uid=uid, gid=gid)

    def _create(self, workspace_id: str, reserved: Workspace | None = None) -> Workspace:
        if reserved is not None:
            path, uid, gid = reserved.path, reserved.uid, reserved.gid
            name = path.name
        else:
            name = f"ws_{workspace_id}_{time.time_ns()}"
            path = self.work_root / name
            path.mkdir(mode=0o700)
            uid = gid = None
        try:
            if reserved is None and self.disk_bytes is not None:
                self._mount_disk(path)
            if reserved is None and self.isolate_users:
                start = int.from_bytes(hashlib.sha256(workspace_id.encode()).digest()[:8], "big")
                uid = gid = self.user_ids.allocate(path, start % self.user_ids.count)
            elif reserved is None and self.fixed_uid is not None:
                uid = gid = self.fixed_uid
            workspace = Workspace(id=workspace_id, path=path, uid=uid, gid=gid)
            self._lay_out(workspace)
            workspace.write_metadata(
                {
                    "workspace_id": workspace_id,
                    "created_at": datetime.now(timezone.utc).isoformat(),
                    "uid": uid,
                    "gid": gid,
                    "staged": {},
                }
            )
            try:
                os.symlink(name, self.registry / "workspaces" / workspace_id)
            except FileExistsError:
                # Another process created this workspace first: use theirs.
                self._discard(path, uid)
                found = self._find(workspace_id)
                if found is None:
                    raise WorkspaceError(f"workspace {workspace_id!r} is being created by another process; retry")
                return found
            return workspace
        except BaseException:
            self._discard(path, uid)
            raise

    def _disk_image(self, path: Path) -> Path:
        return self.registry / "disks" / f"{path.name}.img"

    def _mount_disk(self, path: Path) -> None:
        image = self._disk_image(path)
        image.parent.mkdir(mode=0o700, exist_ok=True)
        with open(image, "wb") as f:
            f.truncate(self.disk_bytes)
        for argv in (["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", str(image)],
                     ["mount", "-o", "loop,nosuid,nodev", str(image), str(path)]):
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                image.unlink(missing_ok=True)
                raise WorkspaceError(
                    f"cannot give workspace {path.name} a {self.disk_bytes}-byte disk: {argv[0]} said "
                    f"{done.stderr.strip() or done.returncode}; this needs root, e2fsprogs and loop devices"
                )
        (path / "lost+found").rmdir()
        path.chmod(0o700)

    def _unmount_disk(self, path: Path) -> None:
        image = self._disk_image(path)
        if image.exists():
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
            image.unlink(missing_ok=True)

    def _discard(self, path: Path, uid: int | None) -> None:
        self._unmount_disk(path)
        remove_tree(path)
        if uid is not None and self.isolate_users:
            self.user_ids.release(uid, path)

    def _lay_out(self, workspace: Workspace) -> None:
        # skills/ and runs/ belong to the host process: a command can neither change its staged skill nor plant
        # links where the next run directory will be created.
        for d in (workspace.skills_dir, workspace.runs_dir):
            d.mkdir(mode=0o755)
        for d in (workspace.work_dir, workspace.inputs_dir, workspace.out_dir):
            d.mkdir(mode=0o700)
        if workspace.uid is not None:
            for d in (workspace.work_dir, workspace.inputs_dir, workspace.out_dir):
                os.chown(d, workspace.uid, workspace.gid)
            # root owns the workspace root and skills/; the workspace's group may enter, nobody else.
            os.chown(workspace.path, 0, workspace.gid)
            os.chmod(workspace.path, 0o750)
