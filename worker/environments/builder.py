"""Building environments: resolve a requirement set to a lock, install the lock, with ``uv``, as untrusted code.

A build runs code from the package index (a source distribution's build backend runs whatever it likes), so it is
treated like a run: each step runs through a step runner (``worker.environments.steps``) that contains it as a run
is contained — on the local runtime as a sandbox user id of its own in bubblewrap and a control group, on the
Docker runtime in a throwaway container of the sandbox image — with an environment made from scratch and nothing
of the host but the build's own folder, the ``uv`` binary and the CA bundle. It differs from a run in one way only:
it may reach the network (the package index). It runs under a timeout, a memory limit and a cap on the
environment's size, watched while it grows.

The build's ``uv`` cache is its own and goes with it: a build never sees what another build left, so one skill's
hostile source distribution cannot plant a file that another team's environment would then install. Environments are
still shared by key, and a second library version with the same requirements builds nothing at all. For the same
reason resolving and installing have folders (and caches, and user ids) of their own: the resolver may run the build
backend of a package it then drops, and an environment is shared by its lock, so what ran while resolving must not
reach what the install puts in an environment others may use.

A cold build waits for uv's own work only: while the requirements are resolved, the install's folder is readied in
a sandbox of its own (the environment made and, where steps are cheap, its interpreter looked at once, which uv keeps
in that folder's cache and would otherwise do first when installing); then one step installs the lock with its
bytecode compiled.

A Node environment (``ensure_node``) is one ``npm`` step, contained the same way and reaching only the npm
registry: the skill's ``package.json`` (and its lock, installed exactly with ``npm ci``) installed without
development dependencies into a folder of its own, keyed by those two files, the registry and the ``node`` it is
for; its install scripts run in the sandbox, like a source distribution's build backend. What it publishes holds
``node_modules`` and the lock npm wrote.

The result belongs to root and is read-only to everyone else: the build's user id goes back to the pool and may
next belong to a workspace, which must not be able to change an environment other runs use.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from worker import defaults
from worker.cancellation import Cancellation
from worker.egress.policy import REGISTRY_VARIABLE
from worker.environments.browsers import link_browsers
from worker.environments.declarations import Declaration, read_plain_file
from worker.environments.steps import SandboxSteps, StepRunner
from worker.environments.store import (
    EnvironmentInfo,
    EnvironmentStore,
    bounded_walk,
    build_lock,
    entry_bytes,
    folder_size,
    resolve_lock,
)
from worker.environments.target import NodeTarget, Target
from worker.errors import EnvironmentBuildError
from worker.roots.folders import remove_tree
from worker.outcome import ProcessOutcome
from worker.workspaces.user_ids import UserIdRegistry

MESSAGE_CHARS = 4000
"""What of a failed step's output an error quotes (its end, where the resolver or installer says what failed)."""
SIZE_POLL_SECONDS = 1.0
MAX_LOCK_BYTES = 4 * 1024 * 1024
"""The largest lock a resolving step may write."""
MAX_NODE_LOCK_BYTES = 16 * 1024 * 1024
"""The largest ``package-lock.json`` a Node build may write (it is read for the packages it installed)."""
NPM_REGISTRY = "https://registry.npmjs.org/"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuildSettings:
    """How builds run (from the worker settings)."""

    index_url: str | None = None
    ca_bundle: str | None = None
    timeout: float = 900.0
    max_bytes: int = 1024**3
    memory_bytes: int = 4 * 1024**3
    sandboxed: bool = True
    """Each step as a sandbox user id of its own (root hosts); off, as the current user (a non-root host)."""
    npm_registry: str = NPM_REGISTRY
    debian_suite: str | None = None
    """The Debian (or Ubuntu) release the local runtime's root filesystems are built of (``None``: the host's)."""
    debian_mirror: str | None = None
    """Where their packages come from (``None``: Debian's, or Ubuntu's on an Ubuntu host)."""
    system_max_bytes: int = 4 * 1024**3
    """The largest a root filesystem may grow."""


def requirements_key(declaration: Declaration, target: Target, settings: BuildSettings) -> str:
    """What a lock is resolved from: the requirements, the target, the index."""
    return _digest({"python": list(declaration.python), "target": target.key, "index": settings.index_url or ""})


def environment_key(lock: str, target: Target) -> str:
    """What an environment is built from: its lock and its target."""
    return _digest({"lock": lock, "target": target.key})


def node_key(declaration: Declaration, target: NodeTarget, settings: BuildSettings) -> str:
    """What a Node environment is built from: its ``package.json`` and lock, the target, the registry."""
    return _digest({"package": declaration.node_package, "lock": declaration.node_lock or "", "target": target.key,
                    "registry": settings.npm_registry})


def node_packages(lock: str) -> list[str]:
    """``name@version`` of every package a ``package-lock.json`` (version 2 or 3) installed, sorted."""
    try:
        entries = json.loads(lock).get("packages", {})
    except (ValueError, AttributeError, RecursionError):
        return []
    found = set()
    for path, entry in entries.items() if isinstance(entries, dict) else ():
        if path and isinstance(entry, dict) and isinstance(entry.get("version"), str) and not entry.get("link"):
            found.add(f"{path.rpartition('node_modules/')[2]}@{entry['version']}")
    return sorted(found)


def locked_packages(lock: str) -> list[str]:
    """``name==version`` of every package a lock pins."""
    return [line.split()[0] for line in lock.splitlines() if line and not line[0].isspace() and "==" in line]


class EnvironmentBuilder:
    """Resolves and builds environments into a store (see the module's description)."""

    def __init__(self, store: EnvironmentStore, settings: BuildSettings, registry: UserIdRegistry | None = None,
                 steps: StepRunner | None = None):
        """``steps`` runs the build's steps (default: on this host, ``SandboxSteps``)."""
        self.store = store
        self.settings = settings
        self.registry = registry if registry is not None else (UserIdRegistry() if settings.sandboxed else None)
        self._swept = False
        self.steps = steps or SandboxSteps(store.root / "bin", ca_bundle=settings.ca_bundle,
                                           memory_bytes=settings.memory_bytes, sandboxed=settings.sandboxed)

    async def ensure(self, declaration: Declaration, target: Target, progress: Progress | None = None) -> EnvironmentInfo:
        """The environment of ``declaration`` for ``target``: found in the store, or built now. A requirement set
        resolved before is installed from its kept lock; a new one is resolved while the install's folder is
        readied. One resolution of a requirement set and one build of an environment at a time, across processes:
        a caller that finds one under way waits."""
        async with self._resolved(declaration, target, progress, install=True) as (lock, readied):
            return await self._install(lock, target, declaration, progress, readied)

    async def resolve(self, declaration: Declaration, target: Target, progress: Progress | None = None) -> str:
        """The lock of ``declaration`` for ``target``, kept in the store: found, or resolved now (for a target
        whose environments are installed elsewhere, such as a Cube sandbox)."""
        async with self._resolved(declaration, target, progress, install=False) as (lock, _):
            return lock

    @contextlib.asynccontextmanager
    async def _resolved(
        self, declaration: Declaration, target: Target, progress: Progress | None, *, install: bool
    ) -> AsyncIterator[tuple[str, tuple[Path, int | None] | None]]:
        """The lock, and, when it was resolved now for an ``install``, a build folder readied for installing it
        meanwhile (``_ready``; held until the context ends); ``None`` when the lock was kept from before."""
        if not self._swept:  # what builds killed with their worker left behind
            self._swept = True
            await asyncio.to_thread(self.store.sweep_builds)
        key = requirements_key(declaration, target, self.settings)
        lock = self.store.lock_text(key)
        if lock is not None:
            yield lock, None
            return
        async with self.store.exclusive(resolve_lock(key)):
            lock = self.store.lock_text(key)
            if lock is not None:
                yield lock, None
                return
            _say(progress, f"resolving {len(declaration.python)} requirement(s)")
            async with contextlib.AsyncExitStack() as stack:
                folder, uid = await stack.enter_async_context(self._build_folder(resolve_lock(key)))
                readied = await stack.enter_async_context(self._build_folder(resolve_lock(key))) if install else None
                stop = Cancellation()
                readying = asyncio.ensure_future(self._ready(*readied, target, stop)) if readied else None
                (folder / "requirements.in").write_text("\n".join(declaration.python) + "\n")
                try:
                    await self._step(folder, uid, target, [
                        "pip", "compile", "requirements.in", "--python", target.python, "--generate-hashes",
                        "--no-header", "--no-annotate", "--quiet", "--output-file", "lock.txt",
                    ], "resolving the dependencies")
                    # Read as root: a link the build planted there could lead anywhere on the host.
                    lock = read_plain_file(
                        folder / "lock.txt", MAX_LOCK_BYTES, "the build's lock.txt", EnvironmentBuildError
                    )
                except BaseException:
                    if readying is not None:
                        stop.set()
                        await asyncio.gather(readying, return_exceptions=True)
                    raise
                self.store.save_lock(key, lock)
                if readying is not None:
                    await readying
                yield lock, readied

    async def _install(self, lock: str, target: Target, declaration: Declaration, progress: Progress | None,
                       readied: tuple[Path, int | None] | None = None) -> EnvironmentInfo:
        """The environment of ``lock``: found, or installed (in ``readied``, a build folder readied for it while it
        was resolved, when there is one)."""
        key = environment_key(lock, target)

        async def install(started: float) -> None:
            nonlocal readied
            _say(progress, f"installing {len(locked_packages(lock))} package(s)")
            async with contextlib.AsyncExitStack() as stack:
                if readied is None:
                    readied = await stack.enter_async_context(self._build_folder(build_lock(key)))
                    await self._make_environment(*readied, target)
                folder, uid = readied
                locked = _write_input(folder, lock)
                await self._step(folder, uid, target, [
                    "pip", "sync", "--python", "env/bin/python", "--require-hashes", "--compile-bytecode", "--quiet",
                    locked,
                ], "installing the dependencies", watch=folder / "env")
                await self._publish(key, folder / "env", started, {
                    "target": target.label, "requirements": list(declaration.python),
                }, lambda: locked_packages(lock))

        return await self._found_or_built(key, install, progress)

    async def ensure_node(self, declaration: Declaration, target: NodeTarget,
                          progress: Progress | None = None) -> EnvironmentInfo:
        """The Node environment of ``declaration`` for ``target``: found in the store, or installed now with
        ``npm`` (``npm ci`` when the skill has a lock). One build of an environment at a time, across processes."""
        key = node_key(declaration, target, self.settings)

        async def install(started: float) -> None:
            _say(progress, f"installing {len(declaration.node)} Node package(s) with npm")
            async with self._build_folder(build_lock(key)) as (folder, uid):
                env = folder / "env"
                env.mkdir()
                files = {"package.json": declaration.node_package or "{}\n"}
                if declaration.node_lock is not None:
                    files["package-lock.json"] = declaration.node_lock
                for name, text in files.items():
                    (env / name).write_text(text)
                if uid is not None:
                    for path in (env, *env.iterdir()):
                        os.lchown(path, uid, uid)
                command = "ci" if declaration.node_lock is not None else "install"
                await self._step(folder, uid, target, [
                    command, "--prefix", "env", "--omit=dev", "--no-audit", "--no-fund", "--loglevel=error",
                ], "installing the Node packages", watch=env, tool="npm")
                await self._publish(key, env, started, {
                    "kind": "node", "target": target.label, "requirements": list(declaration.node),
                }, lambda: node_packages(_written_lock(env)))

        return await self._found_or_built(key, install, progress)

    async def _found_or_built(self, key: str, build: Callable[[float], Awaitable[None]],
                              progress: Progress | None) -> EnvironmentInfo:
        """The environment ``key``: found in the store, or made by ``build`` (given the time it started), one build
        of it at a time across processes (a caller that finds one under way waits, then finds its result)."""
        info = self.store.info(key)
        if info is not None:
            return info
        async with self.store.exclusive(build_lock(key)):
            info = self.store.info(key)
            if info is not None:
                return info
            started = time.monotonic()
            await build(started)
        _say(progress, f"built in {time.monotonic() - started:.1f} s")
        return self.store.info(key)

    async def _publish(self, key: str, env: Path, started: float, described: dict,
                       packages: Callable[[], list[str]]) -> None:
        """Seal the built ``env`` (``_seal``), refuse it past the size cap, link Playwright's browsers in it when it
        holds Playwright (``browsers.link_browsers``), and publish it as ``key`` with its description: ``described``
        plus its ``packages()`` (read once it is sealed), size and build time."""
        size = await asyncio.to_thread(_seal, env)
        if size > self.settings.max_bytes:
            raise EnvironmentBuildError(_too_big(size, self.settings.max_bytes))
        browsers = await asyncio.to_thread(link_browsers, env)
        self.store.publish(key, env, {
            "key": key, **described, "packages": packages(), "size_bytes": size, "built_at": time.time(),
            "build_seconds": round(time.monotonic() - started, 3), "browsers": browsers,
        })

    async def _ready(self, folder: Path, uid: int | None, target: Target, stop: Cancellation) -> None:
        """Ready ``folder`` for installing while the lock is resolved (``stop``ped if resolving fails): the empty
        environment and, where steps are cheap (``StepRunner.cheap_steps``), uv's look at its interpreter, kept in
        the folder's cache for the install."""
        await self._make_environment(folder, uid, target, stop)
        if self.steps.cheap_steps:
            await self._step(folder, uid, target, ["python", "find", "env/bin/python"],
                             "looking at the environment's interpreter", cancel=stop)

    async def _make_environment(self, folder: Path, uid: int | None, target: Target,
                                cancel: Cancellation | None = None) -> None:
        await self._step(folder, uid, target, ["venv", "--relocatable", "--quiet", "--python", target.python, "env"],
                         "making the environment", cancel=cancel)

    @contextlib.asynccontextmanager
    async def _build_folder(self, lock: str) -> AsyncIterator[tuple[Path, int | None]]:
        """A new build folder (removed afterwards) and, sandboxed, the sandbox user id that owns it while it exists."""
        folder = self.store.new_build_folder(lock)
        try:
            for name in ("home", "tmp", "cache"):
                (folder / name).mkdir()
            uid = await asyncio.to_thread(self._own, folder) if self.settings.sandboxed else None
            yield folder, uid
        finally:
            await asyncio.to_thread(remove_tree, folder)

    async def _step(self, folder: Path, uid: int | None, target: Target | NodeTarget, args: list[str], what: str,
                    watch: Path | None = None, cancel: Cancellation | None = None, tool: str = "uv") -> None:
        """Run ``<tool> <args>`` (``uv`` or ``npm``) in ``folder`` as ``uid`` through the step runner (stopped when
        ``cancel`` is set); ``EnvironmentBuildError`` with the tool's own message when it fails, runs out of time
        or grows the environment past the size cap."""
        env = {
            "PATH": defaults.SANDBOX_PATH, "HOME": str(folder / "home"), "TMPDIR": str(folder / "tmp"),
            "LANG": defaults.SANDBOX_LANG,
        }
        if tool == "npm":
            env.update({
                REGISTRY_VARIABLE: self.settings.npm_registry, "npm_config_cache": str(folder / "cache"),
                "npm_config_userconfig": str(folder / "home" / ".npmrc"),
                "npm_config_globalconfig": str(folder / "home" / "npmrc"), "npm_config_update_notifier": "false",
                "npm_config_progress": "false",
            })
        else:
            env.update({
                "UV_CACHE_DIR": str(folder / "cache"), "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never",
                "UV_NO_PROGRESS": "1", "UV_LINK_MODE": "hardlink",
            })
            if self.settings.index_url:
                env["UV_DEFAULT_INDEX"] = self.settings.index_url
        cancel = cancel or Cancellation()
        too_big: list[str] = []
        watcher = asyncio.ensure_future(_watch_size(watch, self.settings.max_bytes, cancel, too_big)) if watch else None
        try:
            outcome = await self.steps.run(folder, uid, args, env, target=target, timeout=self.settings.timeout,
                                           cancel=cancel, tool=tool)
        finally:
            if watcher is not None:
                watcher.cancel()
        if too_big:
            raise EnvironmentBuildError(too_big[0])
        if outcome.timed_out:
            raise EnvironmentBuildError(
                f"{what} did not finish within {self.settings.timeout:g} s (SKILLRUN_ENV_BUILD_TIMEOUT); "
                f"it was stopped.{_tail(outcome)}"
            )
        if outcome.oom_killed:
            raise EnvironmentBuildError(f"{what} ran out of memory ({self.settings.memory_bytes} bytes).{_tail(outcome)}")
        if outcome.exit_code != 0:
            raise EnvironmentBuildError(f"{what} failed ({tool} exited with {outcome.exit_code}):{_tail(outcome, tool)}")

    def _own(self, folder: Path) -> int:
        """A sandbox user id for the build in ``folder`` (held while the folder exists), owning the folder."""
        uid = self.registry.allocate(folder, secrets.randbelow(self.registry.count))
        for path in (folder, *folder.iterdir()):
            os.lchown(path, uid, uid)
        return uid

    def close(self) -> None:
        self.steps.close()


async def _watch_size(folder: Path, limit: int, cancel: Cancellation, failed: list[str]) -> None:
    """Stop the build (``cancel``) once ``folder`` holds more than ``limit`` bytes, or once its size cannot be
    measured (a tree nested too deep), saying why in ``failed``."""
    while True:
        await asyncio.sleep(SIZE_POLL_SECONDS)
        try:
            size = await asyncio.to_thread(folder_size, folder)
        except Exception as exc:  # noqa: BLE001 - a watcher that stopped would leave the build unbounded
            failed.append(f"the environment's size could not be measured ({exc}); the build was stopped")
            cancel.set()
            return
        if size > limit:
            failed.append(_too_big(size, limit))
            cancel.set()
            return


def _write_input(folder: Path, lock: str) -> str:
    """Write the lock for the install step under a new name (the folder may hold what a resolving step planted:
    nothing there is opened, followed or replaced); the name."""
    name = f"install-{secrets.token_hex(8)}.txt"
    try:
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise EnvironmentBuildError(f"cannot write the lock into the build folder ({exc.strerror})") from exc
    with os.fdopen(fd, "w") as handle:
        handle.write(lock)
    return name


def _seal(env: Path) -> int:
    """Give the environment to root, read-only to everyone else (folders and executables 0755, files 0644); the
    bytes it takes (``store.entry_bytes`` of every entry: folders and links count too). Walked through folder
    descriptors without following links (no process of the build is left, but what it left may point anywhere on
    the host): an ``env`` that is not a real folder, or one nested too deep (``store.bounded_walk``), is refused."""
    if not stat.S_ISDIR(os.lstat(env).st_mode):
        raise EnvironmentBuildError("the build's environment folder is not a folder (a link?); it was refused")
    root = os.geteuid() == 0
    size = 0
    for _, _, names, dir_fd in bounded_walk(env):
        if root:
            os.fchown(dir_fd, 0, 0)
        os.fchmod(dir_fd, 0o755)
        size += entry_bytes(os.fstat(dir_fd))
        for name in names:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if root:
                os.chown(name, 0, 0, dir_fd=dir_fd, follow_symlinks=False)
            size += entry_bytes(info)
            if stat.S_ISLNK(info.st_mode):
                continue
            os.chmod(name, 0o755 if info.st_mode & 0o111 else 0o644, dir_fd=dir_fd)
    return size


def _written_lock(env: Path) -> str:
    """The ``package-lock.json`` npm wrote (read as root without following a link: the build may have planted
    one); ``{}`` when it wrote none (nothing was installed) or left something else there."""
    try:
        return read_plain_file(env / "package-lock.json", MAX_NODE_LOCK_BYTES, "the build's package-lock.json",
                               EnvironmentBuildError)
    except EnvironmentBuildError:
        return "{}"


def _too_big(size: int, limit: int) -> str:
    return (f"the environment grew to {size} bytes, past the cap of {limit} bytes (SKILLRUN_ENV_MAX_BYTES): declare "
            "fewer or smaller packages, or ask the operator for a larger cap")


def _tail(outcome: ProcessOutcome, tool: str = "uv") -> str:
    """The end of a failed step's output; npm's without the command's usage it appends and the path of a log
    that goes with the build folder."""
    text = (outcome.stderr or outcome.stdout).decode("utf-8", errors="replace").strip()
    if tool == "npm":
        kept = []
        for line in text.splitlines():
            if line.strip() in ("npm error Usage:", "npm error Options:"):
                break
            if "A complete log of this run can be found in" not in line:
                kept.append(line)
        text = "\n".join(kept).strip()
    return "\n" + text[-MESSAGE_CHARS:] if text else ""


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


__all__ = [
    "BuildSettings",
    "EnvironmentBuilder",
    "environment_key",
    "locked_packages",
    "node_key",
    "node_packages",
    "requirements_key",
]
