"""A skill's environment, from its declaration to a built folder: what runtimes, the CLI and the API ask.

``SkillEnvironments`` answers three questions about a skill folder (and its library root, for the manifest):

* ``status``: what it declares and whether its environment is ready, being built, failed or not built (no network,
  no build: what ``skillrun skills show`` and ``GET /v1/skills/{name}`` say);
* ``prepare``: resolve and build it now, reporting progress (``skillrun skills prepare``, library registration);
* ``for_run``: the environments a run must have (``RunEnvironment``), built first if the run waits for them, or
  ``EnvironmentNotReadyError``. A skill that declares nothing costs a few ``stat`` calls per run; a ready
  environment one more.

A skill may have two environments: a Python one and a Node one (its ``package.json``), each built, shared and
failed on its own; on the local runtime, a skill that declares Debian packages also has a root filesystem with them
(``worker.environments.systems``). The skill is ready when each of its parts is.

A failed build is remembered for ``RETRY_SECONDS``: runs in that time get its message at once instead of building
again (``prepare`` always tries again); ``status`` says failed, with its message, until the store sweeps the record
(``store.FAILURE_RECORD_SECONDS``). Each build records the target it is for in the store (``record_target``), and a
process's first build sweeps the store (``EnvironmentStore.sweep``: leftovers older than the build timeout).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from worker.environments.builder import (
    EnvironmentBuilder,
    Progress,
    environment_key,
    node_key,
    requirements_key,
)
from worker.environments.browsers import BROWSERS_FOLDER
from worker.environments.declarations import (
    DECLARATION_FILES,
    MANIFEST_FILE,
    Declaration,
    read_declaration,
    read_manifest,
)
from worker.environments.images import ImageStatus
from worker.environments.store import EnvironmentInfo, build_lock, resolve_lock
from worker.environments.systems import SystemRoots, system_lock
from worker.environments.target import NodeTarget, Target, local_node_target
from worker.errors import (
    DependencyError,
    EnvironmentBuildError,
    EnvironmentNotReadyError,
)

RETRY_SECONDS = 300.0
STATE_ORDER = ("invalid", "failed", "building", "not built", "ready")
"""A skill's state on a runtime with two parts (an environment and an image) is the first of theirs in this order."""
T = TypeVar("T")
MAX_DECLARATIONS = 1024
"""Skills whose declarations a ``DeclarationCache`` keeps (the least recently used goes: it is read again when
asked for)."""


@dataclass(frozen=True)
class EnvironmentStatus:
    """What a skill declares and where its environment stands."""

    state: str
    """``none`` (it declares nothing), ``ready``, ``building``, ``not built``, ``failed`` or ``invalid`` (its
    declaration is wrong)."""
    declaration: Declaration = field(default_factory=Declaration)
    info: EnvironmentInfo | None = None
    message: str = ""
    target: str = ""
    image: ImageStatus | None = None
    """The Docker runtime's derived image with the skill's Debian packages, when it declares some."""
    node: "NodeStatus | None" = None
    """Its Node environment, when it declares Node dependencies."""

    def with_node(self, node: "NodeStatus") -> "EnvironmentStatus":
        """This status with the skill's Node environment: ready only when both are, else the state of the part
        that is behind (``STATE_ORDER``) with its message."""
        if self.state == "invalid":
            return replace(self, node=node)
        own = "ready" if self.state == "none" else self.state
        state = min(own, node.state, key=STATE_ORDER.index)
        message = "" if state == "ready" else self.message if state == own else node.message
        return replace(self, state=state, message=message, node=node, target=self.target or node.target)

    def with_image(self, image: ImageStatus) -> "EnvironmentStatus":
        """This status on a runtime that also needs ``image``: ready only when both are, else the state of the part
        that is behind (``STATE_ORDER``) with its message."""
        if self.state == "invalid":
            return replace(self, image=image)
        own = "ready" if self.state == "none" else self.state
        state = min(own, image.state, key=STATE_ORDER.index)
        if state == "ready":
            message = ""
        elif state == own:
            message = self.message
        elif image.summary:
            message = image.summary
        else:
            message = f"the sandbox image with its Debian packages ({', '.join(image.packages)}) is {image.state}" + (
                f": {image.message}" if image.message else "")
        return replace(self, state=state, message=message, image=image)

    def as_json(self) -> dict:
        """The JSON form the CLI's ``--json`` and the API show."""
        return {
            "state": self.state,
            "python": list(self.declaration.python),
            "debian": list(self.declaration.debian),
            "requires_python": self.declaration.requires_python,
            "declared_in": list(self.declaration.sources),
            "target": self.target,
            "key": self.info.key if self.info else None,
            "packages": self.info.packages if self.info else [],
            "size_bytes": self.info.size_bytes if self.info else None,
            "message": self.message,
            "image": self.image.as_json() if self.image else None,
            "node": self.node.as_json() if self.node else None,
        }


@dataclass(frozen=True)
class NodeStatus:
    """Where a skill's Node environment stands (``EnvironmentStatus.node``)."""

    state: str
    """``ready``, ``building``, ``not built``, ``failed`` or ``invalid``."""
    dependencies: tuple[str, ...] = ()
    info: EnvironmentInfo | None = None
    message: str = ""
    target: str = ""

    def as_json(self) -> dict:
        return {
            "state": self.state, "dependencies": list(self.dependencies), "target": self.target,
            "key": self.info.key if self.info else None, "packages": self.info.packages if self.info else [],
            "size_bytes": self.info.size_bytes if self.info else None, "message": self.message,
        }


@dataclass(frozen=True)
class RunEnvironment:
    """What a run of a skill is given: its Python environment and its Node environment (either may be missing)."""

    python: EnvironmentInfo | None = None
    node: EnvironmentInfo | None = None
    system: Path | None = None
    """The root filesystem with its Debian packages the local runtime's sandbox shows instead of the host's."""

    @property
    def folders(self) -> tuple[Path, ...]:
        """The folders shown to the run read-only."""
        return tuple(info.path for info in (self.python, self.node) if info is not None)

    def variables(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with the environments in it: ``VIRTUAL_ENV`` and its ``bin`` first on ``PATH``; ``NODE_PATH`` (so
        ``require`` finds the packages from any folder) and ``node_modules/.bin`` (their commands) next;
        ``PLAYWRIGHT_BROWSERS_PATH`` where an environment holds Playwright (``environments.browsers``)."""
        path, added = env.get("PATH", ""), {}
        for info in (self.node, self.python):
            if info is not None and info.browsers:
                added["PLAYWRIGHT_BROWSERS_PATH"] = str(info.path / BROWSERS_FOLDER)
        if self.node is not None:
            added["NODE_PATH"] = f"{self.node.path}/node_modules"
            path = f"{self.node.path}/node_modules/.bin:{path}"
        if self.python is not None:
            added["VIRTUAL_ENV"] = str(self.python.path)
            path = f"{self.python.path}/bin:{path}"
        return {**env, **added, "PATH": path}


NO_ENVIRONMENT = RunEnvironment()
"""A run of a skill that declares nothing."""


class DeclarationCache:
    """Skills' declarations, read again only when one of the files or folders they come from changed.

    A declaration remembers what it was read from (the skill's folders, its declaration files and scripts, the
    library's manifest) with their ``stat`` results; a look ``stat``s those paths again (no folder listing): a
    file added or removed changes its folder, a file edited changes itself. It keeps the ``size`` most recently
    used skills' (``MAX_DECLARATIONS``)."""

    def __init__(self, size: int = MAX_DECLARATIONS) -> None:
        self.size = size
        self._declarations: OrderedDict[tuple[Path, str], tuple[tuple, Declaration]] = OrderedDict()

    def get(self, skill_dir: Path, root: Path, name: str) -> Declaration:
        """The declaration, read again if it changed (blocks: a thread's, or a caller's that may wait)."""
        cached = self._unchanged(skill_dir, name)
        if cached is not None:
            return cached
        signature = _signature(skill_dir, root)
        declaration = read_declaration(skill_dir, name, read_manifest(root))
        self._declarations[(skill_dir, name)] = (signature, declaration)
        self._declarations.move_to_end((skill_dir, name))
        while len(self._declarations) > self.size:
            self._declarations.popitem(last=False)
        return declaration

    async def look_up(self, skill_dir: Path, root: Path, name: str) -> Declaration:
        """The declaration for a caller on the event loop: from the cache after a few ``stat`` calls when nothing
        changed, otherwise read in a thread (a skill's files may be many and large)."""
        cached = self._unchanged(skill_dir, name)
        if cached is not None:
            return cached
        return await asyncio.to_thread(self.get, skill_dir, root, name)

    def __len__(self) -> int:
        return len(self._declarations)

    def _unchanged(self, skill_dir: Path, name: str) -> Declaration | None:
        cached = self._declarations.get((skill_dir, name))
        if cached is None:
            return None
        signature, declaration = cached
        if not all(_stat_of(path) == facts for path, facts in signature):
            return None
        self._declarations.move_to_end((skill_dir, name))
        return declaration


class SkillEnvironments:
    """Skills' environments for one target (see the module's description)."""

    def __init__(self, builder: EnvironmentBuilder, target: Callable[[], Target],
                 node_target: Callable[[], NodeTarget] = local_node_target, *, systems: bool = False) -> None:
        """``target``: what Python environments are built for; ``node_target``: what Node environments are;
        ``systems``: skills' Debian packages are installed in root filesystems of their own (the local runtime's
        sandbox), else they are another part's (the Docker runtime's image, the host's own ``/usr``)."""
        self.builder = builder
        self.store = builder.store
        self.systems = SystemRoots(builder.store, builder.settings) if systems else None
        self._target = target
        self._node_target = node_target
        self._declarations = DeclarationCache()
        self._swept = False

    @property
    def target(self) -> Target:
        return self._target()

    def close(self) -> None:
        """Release what builds hold (their control-group folder)."""
        self.builder.close()

    def declaration(self, skill_dir: Path, root: Path, name: str) -> Declaration:
        """What the skill declares."""
        return self._declarations.get(skill_dir, root, name)

    async def look_up(self, skill_dir: Path, root: Path, name: str) -> Declaration:
        """What the skill declares, for a caller on the event loop (``DeclarationCache.look_up``)."""
        return await self._declarations.look_up(skill_dir, root, name)

    def status(self, skill_dir: Path, root: Path, name: str) -> EnvironmentStatus:
        try:
            declaration = self.declaration(skill_dir, root, name)
        except DependencyError as exc:
            return EnvironmentStatus("invalid", message=str(exc))
        status = self._python_status(declaration, name)
        if declaration.node_package is not None:
            status = status.with_node(self._node_status(declaration))
        if self.systems is not None and declaration.debian:
            status = status.with_image(self.systems.status(declaration.debian))
        return status

    def _python_status(self, declaration: Declaration, name: str) -> EnvironmentStatus:
        if not declaration.python:
            return EnvironmentStatus("none", declaration, message=_debian_note(declaration))
        target = self.target
        try:
            check_python(declaration, target, name)
        except DependencyError as exc:
            return EnvironmentStatus("invalid", declaration, message=str(exc), target=target.label)
        found = self._lookup(declaration, target)
        if isinstance(found, EnvironmentInfo):
            return EnvironmentStatus("ready", declaration, found, _debian_note(declaration), target.label)
        failure = self._failure(found)
        if self.store.busy(resolve_lock(found[0])) or (found[1] and self.store.busy(build_lock(found[1]))):
            return EnvironmentStatus("building", declaration, target=target.label)
        if failure is not None:
            return EnvironmentStatus("failed", declaration, message=failure[0], target=target.label)
        return EnvironmentStatus("not built", declaration, target=target.label)

    async def prepare(self, skill_dir: Path, root: Path, name: str, progress: Progress | None = None) -> EnvironmentStatus:
        """Resolve and build the skill's environments now (always tries, even after a failure)."""
        try:
            declaration = await self._declarations.look_up(skill_dir, root, name)
        except DependencyError as exc:
            return EnvironmentStatus("invalid", message=str(exc))
        status = await self._prepare_python(declaration, name, progress)
        if declaration.node_package is not None:
            status = status.with_node(await self._prepare_node(declaration, name, progress))
        if self.systems is not None and declaration.debian:
            try:
                await self._build_system(declaration, name, progress)
            except EnvironmentBuildError:
                pass  # recorded: the status says failed, with its message
            status = status.with_image(await asyncio.to_thread(self.systems.status, declaration.debian))
        return status

    async def _prepare_node(self, declaration: Declaration, name: str, progress: Progress | None) -> NodeStatus:
        try:
            node = await asyncio.to_thread(self._node_target)
            info = await self._build_node(declaration, node, name, progress)
        except EnvironmentBuildError as exc:
            return NodeStatus("failed", declaration.node, message=str(exc), target=node.label)
        except DependencyError as exc:
            return NodeStatus("invalid", declaration.node, message=str(exc))
        return NodeStatus("ready", declaration.node, info, target=node.label)

    async def _prepare_python(self, declaration: Declaration, name: str, progress: Progress | None) -> EnvironmentStatus:
        if not declaration.python:
            return EnvironmentStatus("none", declaration, message=_debian_note(declaration))
        try:
            info = await self._build(declaration, self.target, name, progress)
        except EnvironmentBuildError as exc:
            return EnvironmentStatus("failed", declaration, message=str(exc), target=self.target.label)
        except DependencyError as exc:
            return EnvironmentStatus("invalid", declaration, message=str(exc))
        return EnvironmentStatus("ready", declaration, info, _debian_note(declaration), self.target.label)

    def _node_status(self, declaration: Declaration) -> NodeStatus:
        try:
            target = self._node_target()
        except DependencyError as exc:
            return NodeStatus("invalid", declaration.node, message=str(exc))
        key = node_key(declaration, target, self.builder.settings)
        info = self.store.info(key)
        if info is not None:
            return NodeStatus("ready", declaration.node, info, target=target.label)
        if self.store.busy(build_lock(key)):
            return NodeStatus("building", declaration.node, target=target.label)
        failure = self.store.failure(key)
        if failure is not None:
            return NodeStatus("failed", declaration.node, message=failure[0], target=target.label)
        return NodeStatus("not built", declaration.node, target=target.label)

    async def _build_node(self, declaration: Declaration, target: NodeTarget, name: str,
                          progress: Progress | None) -> EnvironmentInfo:
        key = node_key(declaration, target, self.builder.settings)
        info = await self._recorded(key, name, self.builder.ensure_node(declaration, target, progress))
        self.store.mark_used(info.key)
        return info

    async def _build_system(self, declaration: Declaration, name: str, progress: Progress | None) -> Path:
        assert self.systems is not None
        lock = system_lock(self.systems.digest(declaration.debian))
        return await self._recorded(lock, name, self.systems.ensure(declaration.debian, progress))

    async def _recorded(self, failure_key: str, name: str, build: Awaitable[T]) -> T:
        """What ``build`` made, its failure record (under ``failure_key``) cleared; or its failure, recorded and
        raised naming the skill. A process's first build sweeps the store first."""
        if not self._swept:
            self._swept = True
            await asyncio.to_thread(self.store.sweep, self.builder.settings.timeout)
        try:
            info = await build
        except EnvironmentBuildError as exc:
            failure = EnvironmentBuildError(f"skill {name!r}: {exc}")
            self.store.record_failure(failure_key, str(failure))
            raise failure from exc
        self.store.clear_failure(failure_key)
        return info

    async def for_run(self, skill_dir: Path, root: Path, name: str, *, wait: bool) -> RunEnvironment | None:
        """The environments a run of the skill needs (``None`` when it declares none): ready, or built now when
        ``wait``; otherwise ``EnvironmentNotReadyError``. A declaration error is a ``DependencyError``."""
        declaration = await self._declarations.look_up(skill_dir, root, name)
        system = self.systems is not None and bool(declaration.debian)
        if not declaration.python and declaration.node_package is None and not system:
            return None
        python = await self._python_for_run(declaration, name, wait=wait) if declaration.python else None
        node = await self._node_for_run(declaration, name, wait=wait) if declaration.node_package is not None else None
        return RunEnvironment(python, node, await self._system_for_run(declaration, name, wait=wait) if system else None)

    async def _system_for_run(self, declaration: Declaration, name: str, *, wait: bool) -> Path:
        assert self.systems is not None
        digest = self.systems.digest(declaration.debian)
        found = self.systems.built(digest)
        if found is not None:
            return found
        _not_now(name, "root filesystem with its Debian packages", ", ".join(declaration.debian), "local",
                 self.store.failure(system_lock(digest)), lambda: self.store.busy(system_lock(digest)), wait=wait)
        return await self._build_system(declaration, name, None)

    async def _node_for_run(self, declaration: Declaration, name: str, *, wait: bool) -> EnvironmentInfo:
        target = await asyncio.to_thread(self._node_target)  # asked once, then remembered
        key = node_key(declaration, target, self.builder.settings)
        info = self.store.info(key)
        if info is not None:
            self.store.mark_used(key)
            return info
        _not_now(name, "Node environment", f"{len(declaration.node)} package(s) for {target.label}", target.runtime,
                 self.store.failure(key), lambda: self.store.busy(build_lock(key)), wait=wait)
        return await self._build_node(declaration, target, name, None)

    async def _python_for_run(self, declaration: Declaration, name: str, *, wait: bool) -> EnvironmentInfo:
        target = self.target
        found = self._lookup(declaration, target)
        if isinstance(found, EnvironmentInfo):
            self.store.mark_used(found.key)
            return found
        _not_now(name, "dependency environment", f"{len(declaration.python)} requirement(s) for {target.label}",
                 target.runtime, self._failure(found), lambda: bool(self.store.busy(resolve_lock(found[0])) or (
                     found[1] and self.store.busy(build_lock(found[1])))), wait=wait)
        return await self._build(declaration, target, name, None)

    async def _build(self, declaration: Declaration, target: Target, name: str, progress: Progress | None) -> EnvironmentInfo:
        check_python(declaration, target, name)
        reqkey = requirements_key(declaration, target, self.builder.settings)
        await asyncio.to_thread(self.store.record_target, target)
        info = await self._recorded(reqkey, name, self.builder.ensure(declaration, target, progress))
        self.store.mark_used(info.key)
        self.store.link(reqkey, info.key)
        return info

    def _lookup(self, declaration: Declaration, target: Target) -> EnvironmentInfo | tuple[str, str | None]:
        """The built environment, or the requirements key and (when resolved) the environment key to build."""
        reqkey = requirements_key(declaration, target, self.builder.settings)
        lock = self.store.lock_text(reqkey)
        if lock is None:
            return reqkey, None
        key = environment_key(lock, target)
        info = self.store.info(key)
        return info if info is not None else (reqkey, key)

    def _failure(self, found: tuple[str, str | None]) -> tuple[str, float] | None:
        return self.store.failure(found[0])


def _not_now(name: str, what: str, detail: str, runtime: str, failure: tuple[str, float] | None,
             building: Callable[[], bool], *, wait: bool) -> None:
    """Raise why a run cannot have its ``what`` now: it failed less than ``RETRY_SECONDS`` ago (its message), or
    the run will not wait for a build (``building()``: one is under way); return when the run builds it."""
    if failure is not None and time.time() - failure[1] < RETRY_SECONDS:
        raise EnvironmentBuildError(
            f"{failure[0]}\n(this build failed {time.time() - failure[1]:.0f} s ago; runs try it again after "
            f"{RETRY_SECONDS:g} s; `skillrun skills prepare --runtime {runtime}` or registering the library again "
            "tries at once)"
        )
    if not wait:
        raise EnvironmentNotReadyError(
            f"skill {name!r}: its {what} is {'being built' if building() else 'not built yet'} ({detail}); build it "
            f"with `skillrun skills prepare --runtime {runtime}` (or by registering the library version through the "
            "API), or submit the run with wait_for_environment=true to build it first"
        )


def check_python(declaration: Declaration, target: Target, name: str) -> None:
    """``DependencyError`` when the skill's ``requires-python`` excludes the target's Python."""
    if declaration.requires_python and Version(target.version) not in SpecifierSet(declaration.requires_python):
        raise DependencyError(
            f"skill {name!r} requires Python {declaration.requires_python}; {target.label} has {target.version}"
        )


def _debian_note(declaration: Declaration) -> str:
    if not declaration.debian:
        return ""
    return (f"Debian packages ({', '.join(declaration.debian)}) are installed in the Docker runtime's image and in "
            "the local runtime's root filesystem for them")


def _signature(skill_dir: Path, root: Path) -> tuple:
    """Paths everything a declaration is read from, each with its ``stat`` facts: the skill's folders (a file added
    or removed changes its folder), its declaration files and scripts, and the library's manifest (also where it
    is missing: one added later counts)."""
    paths: list[str] = []
    pending = [skill_dir]
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        paths.append(str(folder))
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if not entry.name.startswith(".") and entry.name not in ("__pycache__", "node_modules"):
                    pending.append(Path(entry.path))
            elif entry.name.endswith(".py") or entry.name in DECLARATION_FILES:
                paths.append(entry.path)
    paths.append(str(root / MANIFEST_FILE))
    return tuple((path, _stat_of(path)) for path in paths)


def _stat_of(path: str) -> tuple | None:
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size, info.st_ino, info.st_mode


__all__ = ["NO_ENVIRONMENT", "DeclarationCache", "EnvironmentStatus", "NodeStatus", "RunEnvironment", "SkillEnvironments", "check_python"]
