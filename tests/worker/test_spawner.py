"""Spawners: per-workspace helper processes that start commands as the workspace user (host runs as root)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from worker import spawner as spawner_module
from worker.runtimes.local import LocalWorkspaceRuntime

pytestmark = pytest.mark.root


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


async def test_commands_are_started_by_the_workspace_spawner(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        result = await runtime.run(make_request("echo $PPID; id -u", workspace_id="sp"))
        spawner = runtime._spawners["sp"]
        parent, uid = (int(x) for x in result.stdout.split())
        assert parent == spawner.pid
        assert uid == spawner.uid != 0


async def test_the_spawner_runs_unprivileged(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        await runtime.run(make_request("true", workspace_id="sp"))
        status = _status(runtime._spawners["sp"].pid)
        assert status["Uid"].split()[0] == str(runtime._spawners["sp"].uid)
        assert status["CapEff"] == status["CapBnd"] == "0000000000000000"
        assert status["NoNewPrivs"] == "1"
        assert status["Groups"].split() == []


async def test_auto_mode_starts_a_spawner_only_for_a_reused_workspace(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root, spawners="auto") as runtime:
        await runtime.run(make_request("true", workspace_id="once"))
        assert "once" not in runtime._spawners
        await runtime.run(make_request("true", workspace_id="once"))
        assert "once" in runtime._spawners


async def test_a_killed_spawner_is_replaced_and_no_run_is_lost(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        await runtime.run(make_request("true", workspace_id="sp"))
        old = runtime._spawners["sp"]
        os.kill(old.pid, signal.SIGKILL)
        for _ in range(200):
            if not old.alive:
                break
            time.sleep(0.01)
        result = await runtime.run(make_request("echo still here", workspace_id="sp"))
        assert result.exit_code == 0
        assert result.stdout == "still here\n"
        assert runtime._spawners["sp"] is not old


async def test_a_command_killed_by_a_signal_reports_128_plus_the_signal(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        result = await runtime.run(make_request("kill -TERM $$", workspace_id="sp"))
        assert result.exit_code == 128 + signal.SIGTERM


async def test_closing_the_runtime_stops_its_spawners(work_root, make_request):
    runtime = LocalWorkspaceRuntime(work_root, spawners="eager")
    await runtime.run(make_request("true", workspace_id="sp"))
    pid = runtime._spawners["sp"].pid
    await runtime.close()
    assert not os.path.exists(f"/proc/{pid}") or _status(pid)["State"].startswith("Z")


async def test_a_spawner_stopped_by_a_command_costs_one_reply_timeout_and_no_run(work_root, make_request, monkeypatch):
    monkeypatch.setattr(spawner_module, "REPLY_TIMEOUT_SECONDS", 0.5)
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        await runtime.run(make_request("true", workspace_id="sp"))
        stopped = runtime._spawners["sp"]
        # The command runs as the spawner's own user, so it can stop it.
        await runtime.run(make_request("kill -STOP $PPID", workspace_id="sp"))
        result = await runtime.run(make_request("echo still here", workspace_id="sp"))
        assert (result.exit_code, result.stdout) == (0, "still here\n")
        assert runtime._spawners.get("sp") is not stopped
        assert not os.path.exists(f"/proc/{stopped.pid}") or _status(stopped.pid)["State"].startswith("Z")


async def test_a_command_too_large_for_the_spawner_is_started_directly_and_the_spawner_kept(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        await runtime.run(make_request("true", workspace_id="sp"))
        spawner = runtime._spawners["sp"]
        filler = "x" * (spawner_module.MAX_MESSAGE_BYTES + 1)
        result = await runtime.run(make_request(f": {filler}; echo $PPID", workspace_id="sp"))
        assert result.exit_code == 0
        assert int(result.stdout) != spawner.pid
        assert runtime._spawners["sp"] is spawner and spawner.ready
        result = await runtime.run(make_request("echo $PPID", workspace_id="sp"))
        assert int(result.stdout) == spawner.pid
