"""Debian root filesystems for the local runtime's sandbox: a skill's Debian packages, installed once per set.

The Docker runtime installs a skill's Debian packages (``debian = [...]`` in its library's ``skillrun.toml``) into a
derived image; the local runtime installs the same set into a root filesystem of its own, which its sandbox shows
as ``/usr`` (and the top-level links into it), ``/etc`` and ``/var`` instead of the host's
(``SandboxSpec.system``). A root filesystem is made with ``debootstrap`` (the minimal variant) of the host's own
Debian release (``SKILLRUN_ENV_DEBIAN_SUITE``, from ``SKILLRUN_ENV_DEBIAN_MIRROR``), holding ``BASE_PACKAGES`` — what
every sandbox has: bash, coreutils, Python (the one environments are built for: the same release's), Node — and the
skill's packages with everything they depend on. Its digest is the sha256 of the release, the mirror, the base and
the sorted packages and the CA bundle it trusts, so one set is built once and shared by every skill and workspace
that declares it.

A build runs as root: ``debootstrap`` makes the base, then ``apt-get install`` in the new root (``chroot``) adds the
skill's packages, as the Docker runtime's derived image does. The packages come only from the signed Debian archive
(debootstrap checks the release's signature with the host's archive keyring, apt with the root's), the skill names
them and nothing more, and their maintainer scripts run inside the new root. It is held
to the environment builds' timeout and to ``SKILLRUN_ENV_SYSTEM_MAX_BYTES`` (the folder is measured while it grows;
past either, the build is killed and the folder removed). The packages downloaded are kept in one folder the
store's builds share (``systems/.debs``), so a second set downloads only what the first did not; builds therefore
go one at a time per store (the lock ``system-debs``), and two skills asking for the same set wait for one build
(the lock ``system-<digest>``). A package the archive does not have fails the build with its name,
recorded in the store (``locks/system-<digest>.failed``, by ``worker.environments.manager`` as for environments):
runs in the next ``RETRY_SECONDS`` get it at once, ``status`` says failed, and ``prepare`` tries again.

Layout under the environment store's root::

    systems/<digest>/        a complete root filesystem, owned by root, read-only to runs
    systems/<digest>.json    what it holds: release, mirror, packages, size, build time (written last: a reader that
                             finds it finds the whole root)
    systems/<digest>.used    its mtime is the root's last use
    systems/.debs/           the packages builds downloaded (emptied by ``envs prune``)

``remove`` (``skillrun envs rm``, ``envs prune``) takes a root, its records, failure and lock file.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from worker.environments.builder import BuildSettings, Progress
from worker.environments.images import ROOTFS_TAG, ImageStatus, bundle_digest
from worker.environments.store import EnvironmentStore, folder_size
from worker.errors import EnvironmentBuildError
from worker.roots.folders import remove_tree
from worker.sandbox.bubblewrap import SANDBOX_HOSTNAME

BASE_PACKAGES = ("bash", "ca-certificates", "coreutils", "libatomic1", "nodejs", "procps", "python3", "python3-yaml")
"""What every root filesystem holds besides a skill's packages (the Docker sandbox image's run-time part;
``libatomic1`` for the Node binaries packages bring, such as Playwright's driver)."""
DEBS_LOCK = "system-debs"
POLL_SECONDS = 0.5
SIZE_EVERY_SECONDS = 5.0
MESSAGE_LINES = 20
STEPS = (
    (re.compile(r"^I: (Retrieving|Validating) "), "downloading the base system"),
    (re.compile(r"^I: (Extracting|Unpacking|Installing) "), "unpacking the base system"),
    (re.compile(r"^I: Configuring "), "configuring the base system"),
    (re.compile(r"^(Hit|Get):\d+ \S+ \S+ InRelease"), "reading the package lists"),
    (re.compile(r"^Get:\d+ \S+ \S+ \S+ \S+ \S+ \S+ \["), "downloading the packages"),
    (re.compile(r"^Unpacking "), "unpacking the packages"),
    (re.compile(r"^Setting up "), "configuring the packages"),
)
"""What the build says as it goes: the first line of each step reports it, once."""
MISSING_DEBS = re.compile(r"^E: (?:Unable to locate package (\S+)|Package '(\S+)' has no installation candidate)$",
                          re.MULTILINE)
BUILD_SCRIPT = r"""
set -eu
root=$1 suite=$2 mirror=$3 debs=$4 base=$5
shift 5
debootstrap --variant=minbase --cache-dir="$debs" --include="$base" "$suite" "$root" "$mirror"
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
mount -t proc proc "$root/proc"
mount --bind "$debs" "$root/var/cache/apt/archives"
chroot "$root" apt-get -q -o APT::Sandbox::User=root update
chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get -q -o APT::Sandbox::User=root install -y \
    --no-install-recommends -- "$@"
umount "$root/var/cache/apt/archives" "$root/proc"
rm "$root/usr/sbin/policy-rc.d"
"""
"""A root's build: debootstrap the base, then ``apt-get install`` the skill's packages in it (apt orders their
configuration, which debootstrap's ``--include`` does not: Chromium's dependencies fail there), with the store's
downloads as apt's archive and no service started (``policy-rc.d``)."""


def system_lock(digest: str) -> str:
    """The name of the lock a build of ``digest`` holds, and of its failure record."""
    return f"system-{digest}"


@dataclass(frozen=True)
class SystemInfo:
    """A built root filesystem, as ``systems/<digest>.json`` describes it."""

    digest: str
    path: Path
    suite: str
    packages: tuple[str, ...]
    size_bytes: int
    built: float
    last_used: float

    def as_json(self) -> dict:
        return {"digest": self.digest, "path": str(self.path), "suite": self.suite, "packages": list(self.packages),
                "size_bytes": self.size_bytes, "built": self.built, "last_used": self.last_used}


@functools.cache
def host_release() -> tuple[str, str]:
    """This host's distribution and release name (``/etc/os-release``: ``ID``, ``VERSION_CODENAME``); empty where it
    says none."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            key, _, value = line.partition("=")
            fields[key.strip()] = value.strip().strip('"')
    return fields.get("ID", ""), fields.get("VERSION_CODENAME", "")


def default_mirror(distribution: str) -> str:
    return "http://archive.ubuntu.com/ubuntu" if distribution == "ubuntu" else "http://deb.debian.org/debian"


class SystemRoots:
    """Root filesystems in ``store`` (see the module's description)."""

    def __init__(self, store: EnvironmentStore, settings: BuildSettings) -> None:
        self.store = store
        self.settings = settings
        self.folder = store.root / "systems"
        distribution, release = host_release()
        self.suite = settings.debian_suite or release
        self.mirror = settings.debian_mirror or default_mirror(distribution)

    @functools.cached_property
    def _bundle_digest(self) -> str:
        return bundle_digest(self.settings.ca_bundle)

    def digest(self, packages: tuple[str, ...]) -> str:
        """The content digest of the root filesystem with ``packages``."""
        content = json.dumps({"suite": self.suite, "mirror": self.mirror, "base": BASE_PACKAGES,
                              "packages": sorted(set(packages)), "ca_bundle": self._bundle_digest})
        return hashlib.sha256(content.encode()).hexdigest()

    def path(self, digest: str) -> Path:
        return self.folder / digest

    def info(self, digest: str) -> SystemInfo | None:
        """The built root ``digest``, or ``None``."""
        try:
            meta = json.loads((self.folder / f"{digest}.json").read_text())
        except (OSError, ValueError):
            return None
        try:
            last_used = (self.folder / f"{digest}.used").stat().st_mtime
        except OSError:
            last_used = meta.get("built", 0.0)
        return SystemInfo(digest, self.path(digest), meta.get("suite", ""), tuple(meta.get("packages", ())),
                          meta.get("size_bytes", 0), meta.get("built", 0.0), last_used)

    def status(self, packages: tuple[str, ...]) -> ImageStatus:
        """Where the root filesystem with ``packages`` stands (a few ``stat`` calls; no build)."""
        digest = self.digest(packages)
        if self.complete(digest):
            return ImageStatus(f"{ROOTFS_TAG}{digest}", "ready", packages)
        failure = self.store.failure(system_lock(digest))
        if self.store.busy(system_lock(digest)):
            state, message = "building", f"installing the Debian packages {', '.join(packages)}"
        elif failure is not None:
            state, message = "failed", failure[0]
        else:
            state, message = "not built", why_not_buildable()
        summary = f"the root filesystem with its Debian packages ({', '.join(packages)}) is {state}" + (
            f": {message}" if message else "")
        return ImageStatus(f"{ROOTFS_TAG}{digest}", state, packages, message, summary)

    def complete(self, digest: str) -> bool:
        """Whether the root ``digest`` is built and still there (its record, and its ``/usr/bin``: a root removed
        behind the store's back is built again)."""
        return (self.folder / f"{digest}.json").is_file() and (self.path(digest) / "usr/bin").is_dir()

    def built(self, digest: str) -> Path | None:
        """The root ``digest`` if it is built (two ``stat`` calls), marked used."""
        if not self.complete(digest):
            return None
        self.mark_used(digest)
        return self.path(digest)

    async def ensure(self, packages: tuple[str, ...], progress: Progress | None = None) -> Path:
        """The root filesystem with ``packages``, built now unless it was (waiting for a build of the same set
        under way); ``EnvironmentBuildError`` with what went wrong."""
        digest = self.digest(packages)
        async with self.store.exclusive(system_lock(digest)):
            if not self.complete(digest):
                async with self.store.exclusive(DEBS_LOCK):
                    await self._build(digest, sorted(set(packages)), progress)
        self.mark_used(digest)
        return self.path(digest)

    async def _build(self, digest: str, packages: list[str], progress: Progress | None) -> None:
        problem = why_not_buildable()
        if problem:
            raise EnvironmentBuildError(problem)
        if not self.suite:
            raise EnvironmentBuildError("this host names no release in /etc/os-release: set SKILLRUN_ENV_DEBIAN_SUITE "
                                        "(and SKILLRUN_ENV_DEBIAN_MIRROR) to the one root filesystems are built of")
        await asyncio.to_thread(self._make_folders)
        build = await asyncio.to_thread(self.store.new_build_folder, system_lock(digest))
        try:
            root = build / "root"
            await self._build_root(root, packages, progress)
            await asyncio.to_thread(self._finish, root)
            size_bytes = await asyncio.to_thread(folder_size, root)
            if size_bytes > self.settings.system_max_bytes:
                raise self._too_large(packages)
            await asyncio.to_thread(self._publish, digest, root, packages, size_bytes)
        finally:
            await asyncio.to_thread(remove_tree, build)

    def _make_folders(self) -> None:
        """The store's ``systems`` and ``.debs`` folders, made here: a link or a folder of another user's planted
        in their place is refused (what runs are shown would be theirs to change)."""
        self.store.ensure()
        for folder in (self.folder, self.folder / ".debs"):
            folder.mkdir(mode=0o711, exist_ok=True)
            info = os.lstat(folder)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
                raise EnvironmentBuildError(
                    f"{folder} is not a folder of this worker's own (a link, another user's, or writable by others): "
                    "remove it; root filesystems are built only in the store's own folder")

    async def _build_root(self, root: Path, packages: list[str], progress: Progress | None) -> None:
        """Build the root in ``root`` (``BUILD_SCRIPT``), reporting its steps, measured and timed as it goes."""
        if progress is not None:
            progress(f"building a Debian {self.suite} root with {', '.join(packages)} from {self.mirror}")
        # A mount and PID namespace of its own: the file systems the build mounts in the new root (/proc, /sys)
        # and every process a maintainer script leaves go with it, however it ends; and it ends with this worker
        # (setpriv's parent-death signal), which holds its lock, timeout and size cap.
        process = await asyncio.create_subprocess_exec(
            "setpriv", "--pdeathsig", "KILL", "unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child",
            "sh", "-c", BUILD_SCRIPT, "build-root", str(root), self.suite, self.mirror, str(self.folder / ".debs"),
            ",".join(BASE_PACKAGES), *packages,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
        )
        lines: list[str] = []
        reader = asyncio.ensure_future(self._read(process, lines, progress))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.timeout
        next_size = loop.time() + SIZE_EVERY_SECONDS
        problem: EnvironmentBuildError | None = None
        try:
            while process.returncode is None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(process.wait()), POLL_SECONDS)
                if process.returncode is not None:
                    break
                if loop.time() > deadline:
                    problem = EnvironmentBuildError(
                        f"installing the Debian packages {', '.join(packages)} did not finish within "
                        f"{self.settings.timeout:g} s (SKILLRUN_ENV_BUILD_TIMEOUT); it was stopped")
                elif loop.time() > next_size:
                    next_size = loop.time() + SIZE_EVERY_SECONDS
                    if await asyncio.to_thread(folder_size, root) > self.settings.system_max_bytes:
                        problem = self._too_large(packages)
                if problem is not None:
                    break
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
            await reader
        if problem is not None:
            raise problem
        if process.returncode != 0:
            output = "\n".join(lines)
            missing = [a or b for a, b in MISSING_DEBS.findall(output)]
            if missing:
                raise EnvironmentBuildError(
                    f"Debian {self.suite} has no package named {', '.join(missing)} (as apt found at {self.mirror}); "
                    "check the name in skillrun.toml (apt-cache search, packages.debian.org)")
            raise EnvironmentBuildError(
                f"installing the Debian packages {', '.join(packages)} failed (the build exited with "
                f"{process.returncode}):\n" + "\n".join(lines[-MESSAGE_LINES:]))

    @staticmethod
    async def _read(process: asyncio.subprocess.Process, lines: list[str], progress: Progress | None) -> None:
        """Keep the build's last lines and report each of its steps once, as it begins."""
        assert process.stdout is not None
        reported: set[str] = set()
        async for raw in process.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip()
            lines.append(line)
            del lines[:-MESSAGE_LINES * 5]
            for pattern, step in STEPS:
                if progress is not None and step not in reported and pattern.match(line):
                    reported.add(step)
                    progress(step)

    def _too_large(self, packages: list[str]) -> EnvironmentBuildError:
        return EnvironmentBuildError(
            f"the root filesystem with the Debian packages {', '.join(packages)} grew past "
            f"{self.settings.system_max_bytes} bytes (SKILLRUN_ENV_SYSTEM_MAX_BYTES); it was stopped")

    def _finish(self, root: Path) -> None:
        """What a sandbox needs of a root and debootstrap leaves out or behind: the CA bundle builds trust (for runs
        with network where TLS is intercepted), an empty ``resolv.conf`` to show a network run's own over, the
        sandbox's host name and loopback in place of the build host's (debootstrap copies them), no package lists
        or downloads."""
        if self.settings.ca_bundle and os.path.isfile(self.settings.ca_bundle):
            bundle = Path(self.settings.ca_bundle).read_bytes()
            with open(root / "etc/ssl/certs/ca-certificates.crt", "ab") as trusted:
                trusted.write(b"\n" + bundle)
        for name, text in (("resolv.conf", ""), ("hostname", f"{SANDBOX_HOSTNAME}\n"),
                           ("hosts", f"127.0.0.1\tlocalhost {SANDBOX_HOSTNAME}\n::1\tlocalhost\n")):
            (root / "etc" / name).unlink(missing_ok=True)
            (root / "etc" / name).write_text(text)
        for folder in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in os.scandir(root / folder) if (root / folder).is_dir() else ():
                if entry.is_file(follow_symlinks=False):
                    os.unlink(entry.path)

    def _publish(self, digest: str, root: Path, packages: list[str], size_bytes: int) -> None:
        os.chmod(root, 0o755)
        final = self.path(digest)
        (self.folder / f"{digest}.json").unlink(missing_ok=True)
        if os.path.lexists(final):
            remove_tree(final)  # a build killed between its rename and its record, or a root half removed
        os.rename(root, final)
        meta = {"suite": self.suite, "mirror": self.mirror, "packages": packages, "base": list(BASE_PACKAGES),
                "size_bytes": size_bytes, "built": time.time()}
        (self.folder / f"{digest}.used").touch()
        temporary = self.folder / f".{digest}.json.tmp"
        temporary.write_text(json.dumps(meta))
        os.rename(temporary, self.folder / f"{digest}.json")

    def mark_used(self, digest: str) -> None:
        """Record that a run used ``digest`` now (``EnvironmentStore.touch_use``)."""
        self.store.touch_use(self.folder / f"{digest}.used")

    def list(self) -> list[SystemInfo]:
        """Every built root, the most recently used first."""
        if not self.folder.is_dir():
            return []
        found = [self.info(entry.name[:-5]) for entry in os.scandir(self.folder) if entry.name.endswith(".json")
                 and not entry.name.startswith(".")]
        return sorted((info for info in found if info is not None), key=lambda info: info.last_used, reverse=True)

    def remove(self, digest: str) -> bool:
        """Remove the root ``digest`` (its description first, so nothing finds it half-removed), its use record,
        failure record and lock file; whether there was one. A sandbox that shows it keeps its mount until it ends."""
        removed = False
        with contextlib.suppress(FileNotFoundError):
            (self.folder / f"{digest}.json").unlink()
            removed = True
        (self.folder / f"{digest}.used").unlink(missing_ok=True)
        if self.path(digest).exists():
            remove_tree(self.path(digest))
            removed = True
        self.store.clear_failure(system_lock(digest))
        self.store.remove_lock_file(system_lock(digest))
        return removed


    def downloads_bytes(self) -> int:
        """What the packages builds downloaded take (``systems/.debs``)."""
        folder = self.folder / ".debs"
        return folder_size(folder) if folder.is_dir() and not folder.is_symlink() else 0

    async def empty_downloads(self) -> int:
        """Empty the downloads builds share (``envs prune``: they only spare the next build a download, the archive
        keeps the packages), once no build uses them (the lock ``system-debs``); the bytes freed."""
        folder = self.folder / ".debs"
        if not folder.is_dir() or folder.is_symlink():
            return 0
        async with self.store.exclusive(DEBS_LOCK):
            freed = await asyncio.to_thread(self.downloads_bytes)
            for entry in await asyncio.to_thread(lambda: list(os.scandir(folder))):
                if entry.is_dir(follow_symlinks=False):
                    await asyncio.to_thread(remove_tree, Path(entry.path))
                else:
                    os.unlink(entry.path)
        return freed


def why_not_buildable() -> str:
    """Why this host cannot build root filesystems (empty when it can): it needs root and debootstrap."""
    if os.geteuid() != 0:
        return ("root filesystems for Debian packages are built as root (debootstrap): run the worker as root, or "
                "the skill on the Docker runtime")
    if shutil.which("debootstrap", path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
        return "install debootstrap (apt-get install debootstrap): the local runtime builds skills' Debian packages with it"
    return ""


__all__ = ["BASE_PACKAGES", "SystemInfo", "SystemRoots", "host_release", "system_lock", "why_not_buildable"]
