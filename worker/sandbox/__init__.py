"""The local runtime's sandbox: bubblewrap, seccomp, control groups, the spawner and ready shells, launchers, a
workspace's held sandbox, running and watching a command, and user-mode networking."""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "worker.sandbox.bubblewrap": ["SandboxSpec", "SandboxStart", "find_bwrap"],
    "worker.sandbox.held": ["HeldStart"],
    "worker.sandbox.process": ["find_bash", "run_process"],
    "worker.sandbox.spawner": ["Spawner"],
    "worker.sandbox.ready_shell": ["ReadyShell"],
    "worker.sandbox.user_network": ["UserNetwork"],
})
