"""What the attacks on a workspace's held sandbox share: a runtime whose spawners start at once (so every run of a
workspace but its first goes into the held sandbox), running a command and warming a workspace up."""

from __future__ import annotations

import shlex
import textwrap

from worker.runtimes.local.runtime import LocalWorkspaceRuntime

PID_NAMESPACE = "readlink /proc/self/ns/pid"


def py(code: str) -> str:
    """A shell command running ``code`` (dedented) with python3."""
    return f"python3 -c {shlex.quote(textwrap.dedent(code))}"


async def run(runtime: LocalWorkspaceRuntime, make_request, command: str, workspace_id: str, **fields):
    """Run ``command`` in the workspace and wait for the runtime's background work (the next ready shell)."""
    result = await runtime.run(make_request(command, workspace_id=workspace_id, **fields))
    await runtime.idle()
    return result


async def warm_held(runtime: LocalWorkspaceRuntime, make_request, workspace_id: str) -> str:
    """Warm the workspace up and return its held sandbox's PID namespace (the same for two runs in a row)."""
    await run(runtime, make_request, "true", workspace_id)
    first = (await run(runtime, make_request, PID_NAMESPACE, workspace_id)).stdout
    second = (await run(runtime, make_request, PID_NAMESPACE, workspace_id)).stdout
    assert first == second and first.startswith("pid:["), (first, second)
    return first
