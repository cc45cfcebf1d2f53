"""Skills' dependency environments in Cube sandboxes: each made once per sandbox, outside every workspace.

A sandbox's ``python3`` is asked what it is once per sandbox (as the sandbox user, as runs find it): that is its
target (``worker.environments.Target``, runtime ``cube``). The lock of a skill's requirements for that target is
resolved on the worker and kept in the environment store, like the local runtime's, so every sandbox with the same
interpreter installs the same pins. The environment is then made in the sandbox, one of two ways:

* the sandbox reaches the package index (``CUBE_ALLOW_INTERNET``) and can run the worker's ``uv`` (same machine,
  glibc): ``uv`` is uploaded once per sandbox and installs the lock there, hash-checked, as a build user of its
  own (``ENV_INSTALL_SCRIPT``);
* otherwise the worker builds it for the sandbox's Python version and platform (``cube_builds``), keeps it in its
  store, and uploads it as one tar archive, which the sandbox makes its own (``ENV_PLACE_SCRIPT``).

Either way it lands in ``<root>/.skillrun-envs/<environment key>``, root's and read-only to the sandbox user, and
every later run in that sandbox that needs it gets it for nothing: ``VIRTUAL_ENV`` and ``PATH`` name it. It lives
as long as the sandbox; a new sandbox (an idle or closed workspace's next one) makes it again.

A run whose environment is not ready is never run without it: it waits while the environment is made, or, with
``wait_for_environment`` false, fails at once saying so. Ready means made in this sandbox, or, where the worker
builds, built in the store (uploading it is staging, not building). Errors from uv come back with uv's message.
"""

from __future__ import annotations

import asyncio
import platform
import shlex
import tarfile
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from worker import defaults
from worker.config import CubeCodeExecutorConfig
from worker.environments import DeclarationCache, EnvironmentBuilder, EnvironmentInfo, Target
from worker.environments.builder import MESSAGE_CHARS, environment_key, requirements_key
from worker.environments.declarations import Declaration
from worker.environments.manager import check_python
from worker.environments.steps import installed_uv
from worker.environments.store import build_lock, resolve_lock
from worker.environments.target import PROBE
from worker.errors import DependencyError, EnvironmentBuildError, EnvironmentNotReadyError, WorkspaceError
from worker.runtimes.cube.executor import REMOTE_TMP, CubeCodeExecutor, ScriptOutcome, sandbox_error
from worker.runtimes.cube.scripts import (
    ENV_INSTALL_SCRIPT,
    ENV_PLACE_SCRIPT,
    ENV_STATUS_SCRIPT,
    PROBE_SCRIPT,
    SWITCH_USER,
)

ENVS_FOLDER = ".skillrun-envs"
"""The environments' folder in the workspaces folder (a workspace's is ``ws_<id>_<suffix>``: never this)."""
BUILD_UID = 65532
"""The user id an environment is installed as in a sandbox: not the sandbox user's (1000 in the usual templates),
nor one of the worker's sandbox user ids (the test stand-in runs sandbox commands on the worker's host)."""
SCRIPT_GRACE_SECONDS = 60.0
"""Time an environment's round trip gets past its build's own deadline (unpacking, sealing, placing)."""
QUICK_SECONDS = 60.0
"""The longest a sandbox may take to say what its python is, or what environments it has."""


@dataclass
class _Sandbox:
    """What this process knows of one sandbox's environments."""

    target: Target
    user_id: int
    installs_itself: bool
    """It reaches the package index and can run the worker's ``uv``: it installs locks itself."""
    ready: set[str] = field(default_factory=set)
    """Keys of the environments made there."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One environment made at a time in the sandbox (from this process; ``flock`` there for others)."""

    @property
    def build_uid(self) -> int:
        """The user id environments are installed as there (never the sandbox user's)."""
        return BUILD_UID if self.user_id != BUILD_UID else BUILD_UID + 1


@dataclass(frozen=True)
class _Status:
    """What a sandbox has: the environment asked about, the worker's ``uv``."""

    env: bool
    uv: bool


class CubeEnvironments:
    """Skills' environments in Cube sandboxes (see the module's description)."""

    def __init__(self, builder: EnvironmentBuilder, config: CubeCodeExecutorConfig, root: str) -> None:
        """``root``: the sandboxes' workspaces folder, where the environments' folder is made."""
        self.builder = builder
        self.store = builder.store
        self.config = config
        self.root = root.rstrip("/") or "/"
        self.folder = f"{self.root.rstrip('/')}/{ENVS_FOLDER}"
        self._declarations = DeclarationCache()
        self._sandboxes: dict[str, _Sandbox] = {}
        self._probing: dict[str, asyncio.Lock] = {}

    def path(self, key: str) -> str:
        """Where the environment ``key`` is in a sandbox (its ``VIRTUAL_ENV``)."""
        return f"{self.folder}/{key}"

    async def for_run(
        self, executor: CubeCodeExecutor, source: Path, root: Path, name: str, *, wait: bool
    ) -> str | None:
        """The folder of skill ``name``'s environment in the executor's sandbox (``None`` when it declares no
        Python packages): made there before, made now when ``wait`` (or when only its upload is missing), or
        ``EnvironmentNotReadyError``; a skill with Node packages is a ``DependencyError`` (not built here yet). A
        declaration the sandbox's python cannot have is a ``DependencyError``, a failed resolution or install an
        ``EnvironmentBuildError`` with uv's message."""
        declaration = await asyncio.to_thread(self._declarations.get, source, root, name)
        if declaration.node_package is not None:
            raise DependencyError(
                f"skill {name!r} declares Node packages ({', '.join(declaration.node)}); the Cube runtime does not "
                "build Node environments yet: run it on the local or Docker runtime"
            )
        if not declaration.python:
            return None
        sandbox = await self._sandbox(executor, name)
        target = sandbox.target
        check_python(declaration, target, name)
        lock = self.store.lock_text(requirements_key(declaration, target, self.builder.settings))
        key = environment_key(lock, target) if lock is not None else None
        if key in sandbox.ready:
            return self.path(key)
        async with sandbox.lock:
            status = await self._status(executor, key or "")
            if key is None or not status.env:
                try:
                    if sandbox.installs_itself:
                        key = await self._install(executor, sandbox, declaration, name, lock, status, wait=wait)
                    else:
                        key = await self._place(executor, sandbox, declaration, name, key, wait=wait)
                except EnvironmentBuildError as exc:
                    raise EnvironmentBuildError(f"skill {name!r}: {exc}") from exc
            sandbox.ready.add(key)
        return self.path(key)

    def forget_sandbox(self, sandbox_id: str) -> None:
        """Forget a sandbox that is gone (its environments went with it)."""
        self._sandboxes.pop(sandbox_id, None)
        self._probing.pop(sandbox_id, None)

    def close(self) -> None:
        """Release what builds on the worker hold (blocking)."""
        self.builder.close()

    # ---- the sandbox ------------------------------------------------------------------------------------------
    async def _sandbox(self, executor: CubeCodeExecutor, name: str) -> _Sandbox:
        """What the sandbox is, asked once per sandbox."""
        known = self._sandboxes.get(executor.sandbox_id)
        if known is not None:
            return known
        async with self._probing.setdefault(executor.sandbox_id, asyncio.Lock()):
            known = self._sandboxes.get(executor.sandbox_id)
            if known is None:
                known = self._sandboxes[executor.sandbox_id] = await self._probe(executor, name)
            return known

    async def _probe(self, executor: CubeCodeExecutor, name: str) -> _Sandbox:
        """Ask the sandbox's ``python3`` what it is, as the sandbox user. The sandbox installs locks itself when
        the config gives it the internet (``CUBE_ALLOW_INTERNET``; a sandbox connected by id is taken to be as
        configured) and the worker's ``uv`` runs there."""
        script = PROBE_SCRIPT.format(path=shlex.quote(defaults.SANDBOX_PATH), probe=shlex.quote(PROBE))
        done = await executor.run_script(script, timeout=QUICK_SECONDS)
        lines = done.stdout_text.splitlines()
        if done.outcome.exit_code != 0 or len(lines) < 3 or not lines[1].isdigit():
            raise DependencyError(
                f"skill {name!r} declares Python packages, and sandbox {executor.sandbox_id} cannot say what its "
                f"python3 is: {(done.stderr_text or done.stdout_text).strip()[-300:]} (use a sandbox template with "
                "python3: CUBE_TEMPLATE_ID)"
            )
        target = Target.from_probe("cube", lines[2], python=lines[0])
        runs_our_uv = target.machine == platform.machine() and target.libc.startswith("glibc")
        return _Sandbox(target, int(lines[1]), self.config.allow_internet_access and runs_our_uv)

    async def _status(self, executor: CubeCodeExecutor, key: str) -> _Status:
        """Whether the environment ``key`` and ``uv`` are in the sandbox (its environments' folder made)."""
        script = self._folder_values() | {"key": shlex.quote(key), "uv": shlex.quote(self._uv_path())}
        done = await executor.run_script(ENV_STATUS_SCRIPT.format(**script), timeout=QUICK_SECONDS, user="root")
        if done.outcome.exit_code != 0:
            raise WorkspaceError(f"cube: sandbox {executor.sandbox_id}: {done.stderr_text.strip()}")
        lines = done.stdout_text.split()
        return _Status(env="env=1" in lines, uv="uv=1" in lines)

    def _folder_values(self) -> dict[str, str]:
        """What ``ENVS_FOLDER`` is filled with."""
        return {"root": shlex.quote(self.root), "folder": ENVS_FOLDER}

    def _uv_path(self) -> str:
        """Where the worker's ``uv`` goes in a sandbox: named by its size and time, so a worker with another ``uv``
        uploads its own."""
        info = installed_uv().stat()
        return f"{self.folder}/.uv-{info.st_size}-{int(info.st_mtime)}"

    # ---- made in the sandbox ----------------------------------------------------------------------------------
    async def _install(
        self,
        executor: CubeCodeExecutor,
        sandbox: _Sandbox,
        declaration: Declaration,
        name: str,
        lock: str | None,
        status: _Status,
        *,
        wait: bool,
    ) -> str:
        """Install the skill's lock in the sandbox with its own uv (resolving the lock on the worker first when
        there is none); the environment's key."""
        if not wait:
            where = f"not installed in sandbox {executor.sandbox_id} yet"
            raise self._not_ready(name, declaration, sandbox.target, where, "install")
        lock = lock or await self.builder.resolve(declaration, sandbox.target)
        key = environment_key(lock, sandbox.target)
        new_uv = await self._upload_uv(executor) if not status.uv else ""
        tag = uuid.uuid4().hex
        lock_path, ca_path = f"{REMOTE_TMP}/skillrun-lock-{tag}.txt", ""
        files = {lock_path: lock.encode()}
        settings = self.builder.settings
        if settings.ca_bundle:
            ca_path = f"{REMOTE_TMP}/skillrun-ca-{tag}.pem"
            files[ca_path] = await asyncio.to_thread(Path(settings.ca_bundle).read_bytes)
        try:
            for path, data in files.items():
                await executor.sandbox.files.write(path, data, user="root", use_octet_stream=True)
        except Exception as exc:
            raise sandbox_error("uploading an environment's lock", exc, executor.sandbox_id) from exc
        limit = self._limit()
        script = ENV_INSTALL_SCRIPT.format(
            **self._folder_values(),
            **self._build_values(sandbox, key, lock_path, ca_path),
            uv=shlex.quote(self._uv_path()),
            new_uv=shlex.quote(new_uv),
            lock=shlex.quote(lock_path),
            ca=shlex.quote(ca_path),
            cap=settings.max_bytes,
            limit=f"{limit:.3f}",
            path=shlex.quote(defaults.SANDBOX_PATH),
            index=shlex.quote(f"UV_DEFAULT_INDEX={settings.index_url}") if settings.index_url else "",
        )
        done = await executor.run_script(script, timeout=limit, grace=SCRIPT_GRACE_SECONDS, user="root")
        self._check(done, executor, limit)
        return key

    async def _upload_uv(self, executor: CubeCodeExecutor) -> str:
        """Upload the worker's ``uv``; where it was put."""
        binary = await asyncio.to_thread(open, installed_uv(), "rb")
        return await self._upload(executor, binary, "skillrun-uv-{}", "uploading uv")

    async def _upload(self, executor: CubeCodeExecutor, source: IO[bytes], name: str, what: str) -> str:
        """Upload ``source`` as root (compressed on the way) to a new ``name`` (``{}`` is made unique) in the
        sandbox's temporary folder, and close it; where it was put."""
        upload = f"{REMOTE_TMP}/{name.format(uuid.uuid4().hex)}"
        try:
            with source:
                await executor.sandbox.files.write(
                    upload, source, user="root", gzip=True, request_timeout=self.builder.settings.timeout
                )
        except Exception as exc:
            raise sandbox_error(what, exc, executor.sandbox_id) from exc
        return upload

    # ---- built on the worker ----------------------------------------------------------------------------------
    async def _place(
        self,
        executor: CubeCodeExecutor,
        sandbox: _Sandbox,
        declaration: Declaration,
        name: str,
        key: str | None,
        *,
        wait: bool,
    ) -> str:
        """Upload the environment built on the worker (building it first when it is not) for the sandbox to make
        its own; its key."""
        target = sandbox.target
        info = self.store.info(key) if key is not None else None
        if info is None:
            if not wait:
                reqkey = requirements_key(declaration, target, self.builder.settings)
                building = self.store.busy(resolve_lock(reqkey)) or (key and self.store.busy(build_lock(key)))
                state = "being built" if building else "not built yet"
                raise self._not_ready(name, declaration, target, state, "build")
            info = await self.builder.ensure(declaration, target)
        self.store.mark_used(info.key)
        archive = await asyncio.to_thread(_archive, info)
        upload = await self._upload(executor, archive, "skillrun-env-{}.tar", "uploading an environment")
        limit = self._limit()
        script = ENV_PLACE_SCRIPT.format(
            **self._folder_values(),
            **self._build_values(sandbox, info.key, upload),
            archive=shlex.quote(upload),
            version=shlex.quote(target.version),
        )
        done = await executor.run_script(script, timeout=limit, grace=SCRIPT_GRACE_SECONDS, user="root")
        self._check(done, executor, limit)
        return info.key

    # ---- both -------------------------------------------------------------------------------------------------
    def _build_values(self, sandbox: _Sandbox, key: str, *uploads: str) -> dict[str, str]:
        """What ``ENV_BUILD`` is filled with: the environment, the interpreter, what to remove when it is there
        already, and the build's user."""
        return {
            "key": shlex.quote(key),
            "python": shlex.quote(sandbox.target.python),
            "uploads": " ".join(shlex.quote(u) for u in uploads if u),
            "switch": shlex.quote(SWITCH_USER),
            "uid": str(sandbox.build_uid),
        }

    def _limit(self) -> float:
        """How long one environment's steps may take in a sandbox: the build timeout, within ``execute_timeout``."""
        return min(self.builder.settings.timeout, self.config.execute_timeout)

    def _check(self, done: ScriptOutcome, executor: CubeCodeExecutor, limit: float) -> None:
        """Raise what went wrong making an environment in the sandbox, with uv's own message."""
        lines = dict(line.partition("=")[::2] for line in done.stdout_text.splitlines() if "=" in line)
        if "placed" in lines and done.outcome.exit_code == 0:
            return
        where = f"in sandbox {executor.sandbox_id}"
        message = done.stderr_text.strip()[-MESSAGE_CHARS:]
        tail = f"\n{message}" if message else ""
        what, code = lines.get("failed"), lines.get("rc")
        if what == "too big":
            cap = self.builder.settings.max_bytes
            raise EnvironmentBuildError(
                f"the environment grew to {lines.get('size')} bytes {where}, past the cap of {cap} bytes "
                "(SKILLRUN_ENV_MAX_BYTES): declare fewer or smaller packages, or ask the operator for a larger cap"
            )
        if done.outcome.timed_out or code == "137":
            raise EnvironmentBuildError(
                f"{what or 'making the environment'} {where} did not finish within {limit:g} s "
                f"(SKILLRUN_ENV_BUILD_TIMEOUT, at most CUBE_EXECUTE_TIMEOUT); it was stopped.{tail}"
            )
        if what is not None:
            raise EnvironmentBuildError(f"{what} {where} failed (exit {code}):{tail}")
        raise EnvironmentBuildError(f"making the environment {where} failed (exit {done.outcome.exit_code}):{tail}")

    @staticmethod
    def _not_ready(
        name: str, declaration: Declaration, target: Target, state: str, verb: str
    ) -> EnvironmentNotReadyError:
        return EnvironmentNotReadyError(
            f"skill {name!r}: its dependency environment is {state} ({len(declaration.python)} requirement(s) for "
            f"{target.label}); submit the run with wait_for_environment=true to {verb} it first"
        )


def _archive(info: EnvironmentInfo) -> IO[bytes]:
    """The environment as a tar archive of ``env/``, in a temporary file (links kept as links)."""
    archive = tempfile.TemporaryFile()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        tar.add(info.path, arcname="env")
    archive.seek(0)
    return archive


__all__ = ["ENVS_FOLDER", "CubeEnvironments"]
