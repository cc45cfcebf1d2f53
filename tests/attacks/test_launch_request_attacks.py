"""The launcher's request (its folder and command line, in a memfd it reads once a byte on its pipe says the request
is there) and a worker's run groups, tried as root with one-off runs: the request reaches the sandbox exactly, none of
its handles reaches the command, and a worker running many one-off runs holds no more handles than at its start."""

from __future__ import annotations

import hashlib
import os

import pytest

from worker.runtimes.local.runtime import LocalWorkspaceRuntime
from worker.sandbox.launcher import Launcher

pytestmark = pytest.mark.root
RUNS = 40


def _handles() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
async def one_offs(work_root):
    rt = LocalWorkspaceRuntime(work_root, spawners="off")
    yield rt
    await rt.close()


async def _first_run(runtime: LocalWorkspaceRuntime, make_request, command: str) -> tuple:
    """Run ``command`` and make sure it started a sandbox of its own through a launcher (a one-off run, once the
    runtime's launchers are waiting: they are started in the background by its first run)."""
    warm = await runtime.run(make_request("true"))
    await runtime.end_one_off_workspace(warm.workspace_id)
    await runtime.idle()
    launched = []
    original = Launcher.launch

    def spy(self, argv, cwd):
        launched.append((argv, cwd))
        return original(self, argv, cwd)

    Launcher.launch = spy
    try:
        result = await runtime.run(make_request(command))
    finally:
        Launcher.launch = original
    return result, launched


async def test_a_long_odd_command_line_reaches_the_sandbox_exactly(one_offs, make_request):
    # Past a hundred kilobytes (the command's limit is 128 Ki characters), newlines, quotes, leading dashes, an empty argument: what the shell gets is what was sent
    odd = "-n" + "x" * 120_000 + "\n'\"$HOME\\\t-- \u00e9"
    command = "printf '%s' \"$1\" | sha256sum; printf '%s' \"$2\" | wc -c"
    result, launched = await _first_run(one_offs, make_request, f"bash -c {_quoted(command)} _ {_quoted(odd)} ''")
    assert launched, "the run did not start through a launcher"
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split()[0] == hashlib.sha256(odd.encode()).hexdigest()
    assert result.stdout.split()[-1] == "0"


async def test_no_handle_of_the_launcher_reaches_the_command(one_offs, make_request):
    result, launched = await _first_run(one_offs, make_request, "ls /proc/self/fd; readlink /proc/self/fd/* || true")
    assert launched
    listed = [line for line in result.stdout.splitlines() if line.strip().isdigit()]
    assert sorted(int(n) for n in listed) == [0, 1, 2, 3], result.stdout  # 3: ls's own listing of the folder
    assert "memfd" not in result.stdout and "skillrun-launch" not in result.stdout, result.stdout


async def test_many_one_off_runs_leave_the_worker_no_more_handles_than_its_first(one_offs, make_request):
    first = await one_offs.run(make_request("true"))
    await one_offs.end_one_off_workspace(first.workspace_id)
    await one_offs.idle()
    before = _handles()
    for _ in range(RUNS):
        result = await one_offs.run(make_request("true"))
        assert result.exit_code == 0, result.stderr
        await one_offs.end_one_off_workspace(result.workspace_id)
    await one_offs.idle()
    assert _handles() <= before + 2, sorted(os.readlink(f"/proc/self/fd/{n}") for n in os.listdir("/proc/self/fd")
                                           if os.path.exists(f"/proc/self/fd/{n}"))


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
