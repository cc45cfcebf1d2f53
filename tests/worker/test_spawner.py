"""Spawners: per-workspace helper processes that start commands as the workspace user (host runs as root)."""

from __future__ import annotations

import os
import shlex
import signal
import time

import pytest

from tests.processes import sleeper, wait_gone, wait_none_with
from worker.sandbox import spawner as spawner_module
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

pytestmark = pytest.mark.root


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


async def test_commands_are_started_by_the_workspace_spawner(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root, spawners="eager", sandbox=False) as runtime:
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
    async with LocalWorkspaceRuntime(work_root, spawners="eager", sandbox=False) as runtime:
        await runtime.run(make_request("true", workspace_id="sp"))
        stopped = runtime._spawners["sp"]
        # The command runs as the spawner's own user, so it can stop it.
        await runtime.run(make_request("kill -STOP $PPID", workspace_id="sp"))
        result = await runtime.run(make_request("echo still here", workspace_id="sp"))
        assert (result.exit_code, result.stdout) == (0, "still here\n")
        assert runtime._spawners.get("sp") is not stopped
        assert not os.path.exists(f"/proc/{stopped.pid}") or _status(stopped.pid)["State"].startswith("Z")


async def test_a_command_too_large_for_the_spawner_is_started_directly_and_the_spawner_kept(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root, spawners="eager", sandbox=False) as runtime:
        await runtime.run(make_request("true", workspace_id="sp"))
        spawner = runtime._spawners["sp"]
        filler = "x" * (spawner_module.MAX_MESSAGE_BYTES + 1)
        result = await runtime.run(make_request(f": {filler}; echo $PPID", workspace_id="sp"))
        assert result.exit_code == 0
        assert int(result.stdout) != spawner.pid
        assert runtime._spawners["sp"] is spawner and spawner.ready
        result = await runtime.run(make_request("echo $PPID", workspace_id="sp"))
        assert int(result.stdout) == spawner.pid


LOADER = spawner_module.READY_SHELL_LOADER

FIDELITY_COMMANDS = [
    "echo $LINENO; no_such_command_here; echo $?",
    "return 3; echo after",
    "exit 7",
    'echo "$0"',
    "env | cut -d= -f1 | sort",
    "echo $SECONDS",
    "ls /proc/self/fd | sort -n | tr '\\n' ' '",
    "pwd; cd / && pwd",
    "cat; echo stdin-done",
    "printf '%s\\n' 'quotes \" and '\\'' and $ and \\\\ and é'",
    "set -e; false; echo not-here",
    "cat <<EOF\nline one\n$SKILL_NAME\nEOF\necho $LINENO",
    'test "$HOME" = "$RUN_DIR" && test "$TMPDIR" -ef "$RUN_DIR" && test -d "$RUN_DIR" && echo own-run-dir',
    "ulimit -n; ulimit -u",
    "trap 'echo trapped' EXIT; echo body",
    "if then",
]


@pytest.mark.parametrize("command", FIDELITY_COMMANDS)
async def test_a_ready_shell_runs_a_command_as_bash_c_does(work_root, make_request, command):
    async with LocalWorkspaceRuntime(work_root / "plain", spawners="off") as plain, \
            LocalWorkspaceRuntime(work_root / "ready", spawners="eager") as ready:
        expected = await plain.run(make_request(command, workspace_id="fid"))
        await ready.run(make_request("true", workspace_id="fid"))
        probe = await ready.run(make_request('echo "$BASH_EXECUTION_STRING"', workspace_id="fid"))
        assert probe.stdout == LOADER + "\n"
        result = await ready.run(make_request(command, workspace_id="fid"))

        def seen(run, runtime: LocalWorkspaceRuntime) -> tuple[str, str, int]:  # noqa: ANN001
            folder = str(runtime.workspaces.find_known("fid").path)
            return run.stdout.replace(folder, "<ws>"), run.stderr.replace(folder, "<ws>"), run.exit_code

        if command == "if then":  # the one difference: the parser names eval, not -c
            assert result.exit_code == expected.exit_code == 2
            assert "-c: line 1: syntax error" in expected.stderr and "eval: line 1: syntax error" in result.stderr
        else:
            assert seen(result, ready) == seen(expected, plain)


async def test_a_run_with_another_environment_or_folder_does_not_use_the_ready_shell(work_root, make_request):
    # The waiting shell was started with the last run's environment and folder: a run with others gets a shell of
    # its own (in the held sandbox, one started for it; its script exports the run's folder variables alone).
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        await runtime.run(make_request("true", workspace_id="rs"))
        await runtime.idle()
        other_env = await runtime.run(make_request('echo "$X"; pwd', workspace_id="rs", env={"X": "1"}))
        assert other_env.stdout.split("\n")[0] == "1"
        await runtime.idle()
        other_cwd = await runtime.run(make_request('echo "$X"; pwd', workspace_id="rs", cwd="$WORK_DIR"))
        work_dir = str(runtime.workspaces.find_known("rs").work_dir)
        assert other_cwd.stdout == f"\n{work_dir}\n"
        await runtime.idle()
        same = await runtime.run(make_request('echo "$BASH_EXECUTION_STRING"; pwd', workspace_id="rs", cwd="$WORK_DIR"))
        assert same.stdout == f"{LOADER}\n{work_dir}\n"



async def test_a_ready_shell_whose_folder_was_replaced_while_it_started_is_not_used(work_root, make_request):
    # A skill restaged (a new folder put at its path) while the spawner changes into the old one: the shell must
    # not fit, or a run would go where its files are gone ('getcwd: cannot access parent directories').
    async with LocalWorkspaceRuntime(work_root, spawners="eager", sandbox=False) as runtime:
        await runtime.run(make_request("true", workspace_id="rs"))
        await runtime.idle()
        spawner = runtime._spawners["rs"]
        folder = runtime.workspaces.find_known("rs").work_dir / "skill"
        folder.mkdir()
        os.chown(folder, spawner.uid, spawner.gid)
        send = spawner.send

        def send_then_replace(*args, **kwargs):
            spawned = send(*args, **kwargs)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not any(
                    os.path.realpath(f"/proc/{child}/cwd") == str(folder) for child in _children(spawner.pid)):
                time.sleep(0.001)
            folder.rename(folder.with_name("skill.old"))
            folder.mkdir()
            return spawned

        spawner.send = send_then_replace
        env = {"PATH": "/usr/bin:/bin"}
        shell = spawner.ready_shell(runtime._bash, env, str(folder))
        try:
            assert not shell.fits(env, str(folder)), "a shell in the replaced folder fits"
        finally:
            shell.discard()


def _children(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return children.read().split()
    except OSError:
        return []

async def test_a_killed_ready_shell_costs_nothing_but_its_speed(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        await runtime.run(make_request("true", workspace_id="rs"))
        await runtime.idle()
        shell = runtime._spawners["rs"].waiting_shell
        pid = await shell.spawned.started()
        os.kill(pid, signal.SIGKILL)
        assert wait_gone(pid)
        result = await runtime.run(make_request('echo still here; echo "$BASH_EXECUTION_STRING"', workspace_id="rs"))
        assert result.exit_code == 0
        assert result.stdout.splitlines()[0] == "still here" and LOADER not in result.stdout


async def test_a_command_longer_than_one_pipe_write_runs_without_the_ready_shell(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        await runtime.run(make_request("true", workspace_id="rs"))
        filler = "x" * 5000
        result = await runtime.run(make_request(f': {filler}; echo "${{#BASH_EXECUTION_STRING}}"', workspace_id="rs"))
        assert result.exit_code == 0 and int(result.stdout) > 5000


async def test_a_ready_shell_that_times_out_is_killed_with_what_it_started(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        await runtime.run(make_request("true", workspace_id="rs"))
        sleep, marker = sleeper()
        result = await runtime.run(make_request(f"{sleep} & {sleep}", workspace_id="rs", timeout=0.5))
        assert result.timed_out and result.exit_code == 124
        assert wait_none_with(marker)


async def test_closing_the_runtime_ends_its_ready_shells(work_root, make_request):
    runtime = LocalWorkspaceRuntime(work_root, spawners="eager")
    await runtime.run(make_request("true", workspace_id="rs"))
    await runtime.idle()
    pid = await runtime._spawners["rs"].waiting_shell.spawned.started()
    await runtime.close()
    assert wait_gone(pid)


async def test_another_process_of_the_workspace_cannot_slip_a_script_into_the_ready_shell(work_root, make_request):
    # A process a run left behind (detached, holding no pipe) waits for the next ready shell and tries to write a
    # script of its own into it through /proc. Without the sandbox (in which it would neither outlive its run nor
    # see the next shell) the pipe's own permissions refuse it.
    attacker = (
        "shopt -s nullglob; for _ in $(seq 1000); do for fd in /proc/[0-9]*/fd/3; do "
        "grep -qs 'source /proc/self/fd/3' ${fd%/fd/3}/cmdline || continue; "
        "{ echo 'echo injected' > $fd && echo written || echo refused; } > $WORK_DIR/attack 2>&1; exit; "
        "done; sleep 0.02; done"
    )
    async with LocalWorkspaceRuntime(work_root, spawners="eager", sandbox=False) as runtime:
        await runtime.run(make_request("true", workspace_id="rs"))
        detach = f"setsid bash -c {shlex.quote(attacker)} </dev/null >/dev/null 2>&1 & sleep 0.3"  # out of the group
        await runtime.run(make_request(detach, workspace_id="rs"))
        await runtime.idle()
        attack_file = runtime.workspaces.find_known("rs").work_dir / "attack"
        for _ in range(1000):
            if attack_file.exists() and attack_file.read_text():
                break
            time.sleep(0.02)
        assert "refused" in attack_file.read_text() and "Permission denied" in attack_file.read_text()
        result = await runtime.run(make_request('echo legit; echo "$BASH_EXECUTION_STRING"', workspace_id="rs"))
        assert result.stdout == f"legit\n{LOADER}\n"


async def test_idle_waits_until_the_next_runs_shell_has_started(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        await runtime.run(make_request("true", workspace_id="rs"))
        await runtime.idle()
        pid = await runtime._spawners["rs"].waiting_shell.spawned.started()
        # bash has run the loader's first command: fd 4, the pipe it closes to say it started, is closed (or
        # already holds the script pipe, reopened for reading)
        fd4 = f"/proc/{pid}/fd/4"
        assert not os.path.exists(fd4) or os.readlink(fd4) == os.readlink(f"/proc/{pid}/fd/3")
