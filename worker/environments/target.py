"""What an environment is built for: the interpreter runs will use, its version, the machine and its C library.

Everything here is part of an environment's key, so an environment is only ever used where it was built for. The
local runtime's target is the host's ``python3`` (``local_target``); the Docker runtime's is the sandbox image's,
asked once per image id by a throwaway container (``worker.runtimes.docker.builds.DockerTargets``), with the
same ``PROBE``. A Node environment's target (``NodeTarget``) is the ``node`` runs find, asked ``NODE_PROBE``: its
version and native-module ABI, the machine.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from dataclasses import dataclass

from worker import defaults
from worker.errors import DependencyError

PROBE = (
    "import json, platform, sys; "
    "print(json.dumps({'version': platform.python_version(), 'machine': platform.machine(), "
    "'libc': '-'.join(platform.libc_ver()), 'implementation': sys.implementation.name, "
    "'executable': sys.executable}))"
)
"""What a target's interpreter is asked (run as ``python3 -I -c PROBE``); its answer is one line of JSON."""
NODE_PROBE = ("console.log(JSON.stringify({version: process.version, modules: process.versions.modules, "
              "machine: process.arch, executable: process.execPath}))")
"""What a Node target's ``node`` is asked (run as ``node -e NODE_PROBE``); its answer is one line of JSON."""
NODE_HINT = "apt-get install nodejs npm"


@dataclass(frozen=True)
class Target:
    """One place environments are built for."""

    runtime: str
    python: str
    """The interpreter's path as runs see it."""
    version: str
    machine: str
    libc: str
    implementation: str = "cpython"
    image: str = ""
    """The sandbox image's id, for container runtimes."""

    @property
    def key(self) -> str:
        return json.dumps([self.runtime, self.python, self.implementation, self.version, self.machine, self.libc,
                           self.image])

    @property
    def label(self) -> str:
        where = f" in {self.image[:19]}" if self.image else ""
        return f"{self.runtime}: {self.implementation} {self.version} ({self.python}, {self.machine}){where}"

    @classmethod
    def from_probe(cls, runtime: str, answer: str, *, python: str | None = None, image: str = "") -> "Target":
        """The target a ``PROBE`` answered for (``python``: the interpreter's path as runs see it, else the one
        it reports); ``DependencyError`` when the answer is not the probe's."""
        try:
            facts = json.loads(answer)
            return cls(runtime, python or facts["executable"], facts["version"], facts["machine"], facts["libc"],
                       facts["implementation"], image)
        except (ValueError, KeyError, TypeError) as exc:
            raise DependencyError(f"the {runtime} runtime's python3 did not answer the probe ({answer[-300:]!r})") from exc


@dataclass(frozen=True)
class NodeTarget:
    """One place Node environments are built for: a ``node`` (with ``npm`` beside it) as runs see it."""

    runtime: str
    node: str
    version: str
    modules: str
    """The native-module ABI (``process.versions.modules``): what a compiled addon is built against."""
    machine: str
    image: str = ""

    @property
    def key(self) -> str:
        return json.dumps(["node", self.runtime, self.node, self.version, self.modules, self.machine, self.image])

    @property
    def label(self) -> str:
        where = f" in {self.image[:19]}" if self.image else ""
        return f"{self.runtime}: node {self.version} ({self.node}, {self.machine}){where}"

    @classmethod
    def from_probe(cls, runtime: str, answer: str, *, node: str | None = None, image: str = "") -> "NodeTarget":
        """The target a ``NODE_PROBE`` answered for; ``DependencyError`` when the answer is not the probe's."""
        try:
            facts = json.loads(answer)
            return cls(runtime, node or facts["executable"], facts["version"], str(facts["modules"]),
                       facts["machine"], image)
        except (ValueError, KeyError, TypeError) as exc:
            raise DependencyError(f"the {runtime} runtime's node did not answer the probe ({answer[-300:]!r})") from exc


@functools.cache
def local_node_target() -> NodeTarget:
    """The local runtime's Node target: the ``node`` (and ``npm``) a run finds on its ``PATH`` (the host's)."""
    node = shutil.which("node", path=defaults.SANDBOX_PATH)
    if node is None or shutil.which("npm", path=defaults.SANDBOX_PATH) is None:
        raise DependencyError(
            f"skills with Node dependencies need node and npm on the runs' PATH ({defaults.SANDBOX_PATH}) on the "
            f"local runtime: {NODE_HINT}"
        )
    try:
        done = subprocess.run([node, "-e", NODE_PROBE], capture_output=True, text=True, timeout=30, check=True)
    except (subprocess.SubprocessError, OSError) as exc:
        raise DependencyError(f"cannot ask {node} what it is ({exc})") from exc
    return NodeTarget.from_probe("local", done.stdout, node=node)


@functools.cache
def local_target() -> Target:
    """The local runtime's target: the ``python3`` a run finds on its ``PATH`` (the host's, which the sandbox shows
    read-only)."""
    python = shutil.which("python3", path=defaults.SANDBOX_PATH)
    if python is None:
        raise DependencyError(
            f"skills with Python dependencies need python3 on the runs' PATH ({defaults.SANDBOX_PATH}) on the local "
            "runtime: apt-get install python3"
        )
    try:
        done = subprocess.run([python, "-I", "-c", PROBE], capture_output=True, text=True, timeout=30, check=True)
    except (subprocess.SubprocessError, OSError) as exc:
        raise DependencyError(f"cannot ask {python} what it is ({exc})") from exc
    return Target.from_probe("local", done.stdout, python=python)


__all__ = ["NODE_HINT", "NODE_PROBE", "PROBE", "NodeTarget", "Target", "local_node_target", "local_target"]
