"""Where a build step runs: the ``StepRunner`` interface, and the local runtime's runner (``SandboxSteps``).

``EnvironmentBuilder`` decides what a build does (resolve, make the environment, install, seal) and what its
outcome means; a step runner decides only where one ``uv`` or ``npm`` command runs and how it is contained. Either way a step
is treated like a run (it runs code from the package index): its own unprivileged user, an environment made from
scratch, nothing of the host but the build's folder, the ``uv`` binary and the CA bundle, a memory and a process
limit, stopped at its timeout or when cancelled. Unlike a run, it may reach the package index, and nothing else:
through the worker's allow-list proxy (``worker.egress.proxy``), its only way out.

``SandboxSteps`` runs a step on this host: as the build's sandbox user in bubblewrap and a control group of its
own, in a network namespace of its own served by the proxy (root hosts), or as the current user where the host has no
sandbox (with the host's network: a development host's builds are not contained). The Docker runtime's runner,
which runs a step in a throwaway container of the sandbox image, is
``worker.runtimes.docker.builds.ContainerSteps``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import threading
from abc import ABC, abstractmethod
from pathlib import Path

from worker import defaults
from worker.cancellation import Cancellation
from worker.sandbox.cgroups.groups import CgroupLimits, CgroupTree, RunCgroup
from worker.egress.policy import AllowList
from worker.egress.proxy import proxy_environment
from worker.egress.serving import serving_sandbox
from worker.environments.target import NODE_HINT, NodeTarget, Target
from worker.errors import CgroupError, DependencyError
from worker.outcome import ProcessOutcome
from worker.sandbox.process import run_process
from worker.sandbox.bubblewrap import SandboxSpec, find_bwrap

OUTPUT_BYTES = 256 * 1024
"""What is kept of a build step's stdout and stderr (its messages end up in the error)."""
BUILD_PROCESSES = 1024
"""The most processes one build step may have at once."""


class StepRunner(ABC):
    """Runs one ``uv`` or ``npm`` command of a build, contained like a run but with a way to the package index."""

    cheap_steps: bool = False
    """Whether a step costs little beyond its command (a sandbox on this host; not a container): the builder then
    spends one while resolving to spare the install uv's first look at its interpreter."""

    @abstractmethod
    async def run(self, folder: Path, uid: int | None, args: list[str], env: dict[str, str], *,
                  target: Target | NodeTarget, timeout: float, cancel: Cancellation,
                  tool: str = "uv") -> ProcessOutcome:
        """Run ``<tool> <args>`` (``uv``, or the target's ``npm``) in the build folder ``folder`` (which it may write,
        and nothing else) as ``uid`` (the current user when ``None``) with ``env`` plus ``SSL_CERT_FILE`` and
        ``NODE_EXTRA_CA_CERTS`` for the runner's CA bundle, for ``target``, reaching the index or registry ``env``
        names and the operator's allowed hosts alone (``AllowList.for_step``); stopped (and everything it started
        gone) at ``timeout`` seconds or when ``cancel`` is set."""

    def close(self) -> None:
        """Release what the runner holds between steps."""


class SandboxSteps(StepRunner):
    """Build steps on this host: each as the build's sandbox user in bubblewrap and a control group of its own
    when ``sandboxed`` (root hosts), else as the current user. ``uv_folder`` is where the ``uv`` binary is copied
    for sandbox users to run (nothing else of the worker's installation is shown to them). A sandboxed step's only
    way out is an ``EgressProxy`` of its own, to the index and ``allowed_hosts`` (default: the worker's
    ``SKILLRUN_ENV_ALLOWED_HOSTS``), gone when the step ends."""

    cheap_steps = True

    def __init__(self, uv_folder: Path, *, ca_bundle: str | None, memory_bytes: int, sandboxed: bool,
                 allowed_hosts: str | None = None) -> None:
        self.uv_folder = uv_folder
        self.ca_bundle = ca_bundle
        self.memory_bytes = memory_bytes
        self.sandboxed = sandboxed
        self.allowed_hosts = allowed_hosts
        self._tree: CgroupTree | str | None = None
        self._detecting = threading.Lock()  # a build's first steps start together, each in a thread of its own

    async def run(self, folder: Path, uid: int | None, args: list[str], env: dict[str, str], *,
                  target: Target | NodeTarget, timeout: float, cancel: Cancellation,
                  tool: str = "uv") -> ProcessOutcome:
        program = await asyncio.to_thread(self._uv) if tool == "uv" else _npm()
        if self.ca_bundle:
            env = {**env, "SSL_CERT_FILE": self.ca_bundle, "NODE_EXTRA_CA_CERTS": self.ca_bundle}
        if not self.sandboxed:
            return await run_process([program, *args], cwd=str(folder), env=env, timeout=timeout,
                                     stdout_cap=OUTPUT_BYTES, stderr_cap=OUTPUT_BYTES, uid=uid, gid=uid, cancel=cancel)
        allowed = AllowList.for_step(env, self.allowed_hosts)
        uv = program if tool == "uv" else await asyncio.to_thread(self._uv)
        sandbox, cgroup = await asyncio.to_thread(self._sandbox, folder, uv)
        try:
            # A network namespace with loopback alone; the proxy listens there before the step runs.
            async with serving_sandbox(allowed, uid):
                return await run_process(
                    [program, *args], cwd=str(folder), env={**env, **proxy_environment()}, timeout=timeout,
                    stdout_cap=OUTPUT_BYTES, stderr_cap=OUTPUT_BYTES, uid=uid, gid=uid, cancel=cancel,
                    sandbox=sandbox, cgroup=cgroup,
                )
        finally:
            if cgroup is not None:
                await asyncio.to_thread(cgroup.remove)

    def _uv(self) -> str:
        """The ``uv`` binary the steps run: the installed one, copied where a build's user can read it."""
        installed = installed_uv()
        if not self.sandboxed:
            return str(installed)
        self.uv_folder.mkdir(mode=0o755, exist_ok=True)
        info = installed.stat()
        copy = self.uv_folder / f"uv-{info.st_size}-{int(info.st_mtime)}"
        if not copy.exists():
            temporary = self.uv_folder / f".uv-{secrets.token_hex(6)}"
            try:  # the same file, where the store is on the installation's file system (root-owned, 0755)
                os.link(installed, temporary)
            except OSError:
                shutil.copyfile(installed, temporary)
                os.chmod(temporary, 0o755)
            os.replace(temporary, copy)
        return str(copy)

    def _sandbox(self, folder: Path, uv: str) -> tuple[SandboxSpec, RunCgroup | None]:
        find_bwrap()
        shown = [os.path.dirname(uv)]
        bundle = self.ca_bundle
        if bundle and not bundle.startswith(("/etc/", "/usr/")):
            shown.append(bundle)
        with self._detecting:
            if self._tree is None:
                self._tree = CgroupTree.detect()
        cgroup = None
        if isinstance(self._tree, CgroupTree):
            cgroup = self._tree.new_group()
            try:
                cgroup.set_limits(CgroupLimits(self.memory_bytes, BUILD_PROCESSES, None))
            except CgroupError:
                cgroup.remove()
                raise
        return SandboxSpec(str(folder), tuple(shown), served=True), cgroup

    def close(self) -> None:
        if isinstance(self._tree, CgroupTree):
            self._tree.close()
        self._tree = None


def _npm() -> str:
    """The ``npm`` a local Node build runs (the host's, which the sandbox shows read-only with ``/usr``)."""
    npm = shutil.which("npm", path=defaults.SANDBOX_PATH)
    if npm is None:
        raise DependencyError(f"skills with Node dependencies need npm on the local runtime: {NODE_HINT}")
    return npm


def installed_uv() -> Path:
    """The ``uv`` binary installed with skillrun."""
    try:
        import uv as uv_package
    except ImportError as exc:
        raise DependencyError("uv is not installed: pip install uv (it is one of skillrun's dependencies)") from exc
    return Path(uv_package.find_uv_bin())


__all__ = ["BUILD_PROCESSES", "OUTPUT_BYTES", "SandboxSteps", "StepRunner", "installed_uv"]
