"""Environments for a Cube sandbox's interpreter, resolved (and, where the sandbox cannot install them itself,
built) on the worker.

The sandbox's interpreter is not on the worker, so uv is told what it is instead: the worker's ``python3`` is the
interpreter uv runs, and a ``pip`` step resolves and installs for the sandbox's Python version and platform
(``--python-version``, ``--python-platform``: its machine and C library). ``WorkerSteps`` makes that translation
around the local runtime's step runner, so a build is contained exactly as a local one (a user id of its own,
bubblewrap, a control group, a uv cache of its own) and the builder's logic (locks, one build per key, size cap,
sealing, the store) is the same.

An environment built so is a relocatable virtual environment holding the sandbox's packages; its interpreter links
and its ``lib/python3.X`` folder are the worker's until the sandbox takes it (``cube_environments``). Bytecode is
not compiled here: it would be the worker's interpreter's.

A sandbox that installs a lock itself takes only the builder's ``resolve``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from worker.cancellation import Cancellation
from worker.config import get_worker_settings
from worker.environments import BuildSettings, EnvironmentBuilder, EnvironmentStore, build_settings, local_target
from worker.environments.steps import SandboxSteps, StepRunner
from worker.environments.target import Target
from worker.errors import DependencyError
from worker.outcome import ProcessOutcome

MANYLINUX_MINORS = (17, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40)
"""The glibc 2.x versions uv's ``--python-platform`` can name (``<machine>-manylinux_2_<x>``)."""
MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
"""Machines as ``platform.machine()`` reports them → as uv names them."""


def uv_platform(target: Target) -> str:
    """uv's ``--python-platform`` for ``target``: the newest manylinux its glibc runs, or musl where the
    interpreter reports no glibc (``platform.libc_ver()`` knows only glibc)."""
    machine = MACHINES.get(target.machine.lower())
    if machine is None:
        raise DependencyError(
            f"{target.label}: environments cannot be resolved for a {target.machine} machine (uv knows x86_64 and "
            "aarch64 Linux); use a sandbox template for one of those (CUBE_TEMPLATE_ID)"
        )
    name, _, version = target.libc.partition("-")
    if name != "glibc":
        return f"{machine}-unknown-linux-musl"
    try:
        minor = int(version.split(".")[1])
    except (IndexError, ValueError) as exc:
        raise DependencyError(f"{target.label}: its C library {target.libc!r} has no version uv can use") from exc
    fitting = [m for m in MANYLINUX_MINORS if m <= minor]
    if not fitting:
        raise DependencyError(
            f"{target.label}: glibc {version} is older than any manylinux (2.17); use a newer sandbox template"
        )
    return f"{machine}-manylinux_2_{fitting[-1]}"


def for_target(args: list[str], target: Target, host_python: str) -> list[str]:
    """uv's ``args`` as run on this host for ``target``: the target's interpreter named becomes this host's
    ``python3``, a ``pip`` step resolves and installs for the target's version and platform, and no bytecode is
    compiled (it would be this host's interpreter's)."""
    translated: list[str] = []
    given = iter(args)
    for arg in given:
        if arg == "--compile-bytecode":
            continue
        translated.append(arg)
        if arg == "--python":
            value = next(given)
            translated.append(host_python if value == target.python else value)
    if args[:1] == ["pip"]:
        translated += ["--python-version", target.version, "--python-platform", uv_platform(target)]
    return translated


class WorkerSteps(StepRunner):
    """Build steps on this host for a sandbox's interpreter (see the module's description): ``inner`` runs them,
    translated by ``for_target``."""

    def __init__(self, inner: StepRunner) -> None:
        self.inner = inner

    async def run(self, folder: Path, uid: int | None, args: list[str], env: dict[str, str], *, target: Target,
                  timeout: float, cancel: Cancellation, tool: str = "uv") -> ProcessOutcome:
        if tool != "uv":
            raise DependencyError(f"the Cube runtime builds Python environments only (not with {tool})")
        host = await asyncio.to_thread(local_target)  # probed once per process
        return await self.inner.run(folder, uid, for_target(args, target, host.python), env, target=target,
                                    timeout=timeout, cancel=cancel)

    def close(self) -> None:
        self.inner.close()


def cube_builder(default_root: Path, settings: BuildSettings | None = None) -> EnvironmentBuilder:
    """The Cube runtime's builder: locks and environments kept in ``SKILLRUN_ENVS_DIR`` or else ``default_root``
    (the same store as the other runtimes'; keys differ by target), each step sandboxed as a local build is on a
    root host."""
    settings = settings or build_settings(sandboxed=os.geteuid() == 0)
    store = EnvironmentStore(get_worker_settings().envs_dir or default_root)
    inner = SandboxSteps(store.root / "bin", ca_bundle=settings.ca_bundle, memory_bytes=settings.memory_bytes,
                         sandboxed=settings.sandboxed)
    return EnvironmentBuilder(store, settings, steps=WorkerSteps(inner))


__all__ = ["WorkerSteps", "cube_builder", "for_target", "uv_platform"]
