"""How a sandboxed run ends: in a sandbox of its own on bwrap's report of its command's exit, in its workspace's
held sandbox on its command's exit; either way with every process of the run killed before its result is
returned, the result exactly what the command's own end gives, and the sandbox's namespaces and control group
let go once its processes are gone."""

from __future__ import annotations

import os
import signal

import pytest

from tests.processes import running_with, sleeper, wait_none_with
from tests.services import unavailable
from worker import defaults
from worker.runtimes.local.runtime import UNSANDBOXED_NOTE, LocalWorkspaceRuntime
from worker.sandbox.bubblewrap import SandboxStart

pytestmark = pytest.mark.root

PF_EXITING = 0x4
"""``/proc/<pid>/stat``'s flag for a process inside its exit."""


def _done_with(pid: int) -> bool:
    """Whether ``pid`` can run no more code of its own: gone, a zombie, exiting, or with a SIGKILL pending."""
    try:  # the pending signals first: once SIGKILL is taken from them, the exiting flag is set
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return True
    pending = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
    return fields[0] in "ZX" or bool(int(fields[6]) & PF_EXITING) or bool(pending & 1 << (signal.SIGKILL - 1))


@pytest.fixture(params=["direct", "spawned", "ready"])
async def run_in(request: pytest.FixtureRequest, work_root, make_request):
    """Runs in one workspace whose commands start directly (setpriv, a sandbox of their own), or in its held sandbox
    through its spawner: in a shell started for the run, or in a ready shell (prepared after the run before)."""
    mode = request.param
    runtime = LocalWorkspaceRuntime(work_root / mode, spawners="off" if mode == "direct" else "eager",
                                    ready_shells=mode == "ready")
    await runtime.run(make_request("true", workspace_id="end"))

    async def run(command: str, **fields):
        await runtime.idle()  # a ready shell waits for this run
        return await runtime.run(make_request(command, workspace_id="end", **fields))

    yield run
    await runtime.close()


@pytest.mark.parametrize("detach", ["setsid {sleep} &", "nohup {sleep} >/dev/null 2>&1 &", "( {sleep} & )",
                                    "{sleep} &"])
async def test_every_process_of_a_run_is_killed_before_its_result_is_returned(run_in, detach):
    sleep, marker = sleeper()
    result = await run_in(detach.format(sleep=sleep) + "\nsleep 0.2; echo left")
    left = running_with(marker)  # looked at at once: no grace
    assert result.stdout == "left\n" and result.exit_code == 0
    assert all(_done_with(pid) for pid in left), f"{detach!r} could still run when the result came"
    assert wait_none_with(marker)


@pytest.mark.parametrize("run_in", ["direct"], indirect=True)  # a held sandbox's run has no report of its own
async def test_a_run_ends_on_its_sandboxs_report_not_on_bwraps_exit(run_in, monkeypatch):
    reports = []
    exit_code = SandboxStart.exit_code

    def counted(start: SandboxStart) -> int | None:
        code = exit_code(start)
        reports.append(code)
        return code

    monkeypatch.setattr(SandboxStart, "exit_code", counted)
    result = await run_in("echo out; exit 7")
    assert result.exit_code == 7 and result.stdout == "out\n"
    assert reports[-1] == 7


@pytest.mark.parametrize("run_in", ["direct"], indirect=True)
async def test_without_the_sandboxs_report_a_run_ends_when_bwrap_does(run_in, monkeypatch):
    def silent(start: SandboxStart) -> None:
        start.report_closed = True  # as where bwrap ended without a word

    monkeypatch.setattr(SandboxStart, "exit_code", silent)
    sleep, marker = sleeper()
    result = await run_in(f"setsid {sleep} & echo out; echo err >&2; exit 5")
    assert (result.exit_code, result.stdout, result.stderr) == (5, "out\n", "err\n")
    assert wait_none_with(marker)


async def test_a_run_whose_processes_are_slow_to_die_ends_after_the_grace_period_with_them_killed(
    run_in, monkeypatch
):
    # A process of the run with much memory to free outlives the command: its init's end (which waits for it), or
    # its control group's emptying (in a held sandbox), comes after the grace period, here none.
    monkeypatch.setattr(defaults, "KILL_GRACE_SECONDS", 0.0)
    sleep, marker = sleeper()
    argv = ", ".join(f'"{arg}"' for arg in sleep.split())
    hog = f"python3 -c 'import subprocess; x = bytearray(300 << 20); subprocess.run([{argv}])' &"
    result = await run_in(f"{hog}\nsleep 0.5; echo left")
    left = running_with(marker)
    assert result.stdout == "left\n" and result.exit_code == 0
    assert "still ending when its result was taken" in result.stderr
    assert all(_done_with(pid) for pid in left)
    assert wait_none_with(marker)


ENDINGS = [
    "echo out; echo err >&2; exit 3",
    "exit 300",
    "echo before; kill -TERM $$; echo after",
    "kill -KILL $$",
    "set -e; false; echo not-here",
    "trap 'echo trapped' EXIT; echo body",
    "(sleep 0.1; echo from-the-background) & wait; echo after-wait",
    "head -c 1500000 /dev/zero | tr '\\0' a; echo; echo err >&2",
    "python3 -c 'import os, sys; sys.stdout.write(\"x\" * 200000); sys.stdout.flush(); os._exit(9)'",
]


@pytest.mark.parametrize("command", ENDINGS)
async def test_a_sandboxed_run_ends_with_the_output_and_exit_code_of_an_unsandboxed_one(
    run_in, work_root, make_request, command
):
    async with LocalWorkspaceRuntime(work_root / "unboxed", sandbox=False) as unboxed:
        expected = await unboxed.run(make_request(command, workspace_id="end"))
    result = await run_in(command)
    unboxed_stderr = expected.stderr.removesuffix(f"\n[skillrun: {UNSANDBOXED_NOTE}]\n")
    assert unboxed_stderr != expected.stderr  # an unsandboxed run says so
    assert (result.exit_code, result.stdout, result.stderr) == (expected.exit_code, expected.stdout, unboxed_stderr)


async def test_a_runs_namespaces_and_group_are_let_go_once_its_processes_are_gone(work_root, make_request):
    held = _mount_namespaces_held()
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        for _ in range(3):
            result = await runtime.run(make_request("sleep 60 & setsid sleep 60 & echo x", workspace_id="ns"))
            assert result.stdout == "x\n"
            await runtime.idle()
        if runtime.groups.missing is not None:
            unavailable(f"no run groups on this host: {runtime.groups.missing}")
        # runs in the workspace's held sandbox leave the worker no namespace of theirs to hold
        assert _mount_namespaces_held() == held, "the worker holds the namespaces of ended runs"
        # the last run's group is kept at once and taken by the next run's shell, which alone is in it
        kept = runtime.groups.pool._idle.get("ns", [])
        assert all(group.procs() == [] for group in kept)
        waiting = runtime._spawners["ns"].waiting_shell
        assert waiting.cgroup.procs() == [await waiting.spawned.started()]



async def test_a_held_run_that_left_nothing_is_found_ended_without_a_thread(work_root, make_request, monkeypatch):
    # A group's task count includes processes that have exited but are not reaped yet: the init of a first run's
    # sandbox, which bwrap's monitor leaves to the host's init (one that never reaps, as on these machines, leaves it
    # there for good), and the count lags a reaped process by an RCU grace period. The group's process list lists
    # no such process: it says the group is empty, where waking a thread to look cost a warm run a fifth of its time.
    from worker.sandbox import command_watch as watch
    looked = []
    empty_group = watch.empty_group
    monkeypatch.setattr(watch, "empty_group", lambda group: looked.append(group) or empty_group(group))
    async with LocalWorkspaceRuntime(work_root) as runtime:
        for _ in range(2):
            await runtime.run(make_request("true", workspace_id="lag"))
            await runtime.idle()
        looked.clear()
        results = []
        for _ in range(30):
            results.append(await runtime.run(make_request("echo x", workspace_id="lag")))
            await runtime.idle()
    assert all((result.exit_code, result.stdout) == (0, "x\n") for result in results)
    assert looked == [], f"{len(looked)} of 30 runs that left nothing woke a thread to look at their group"

def _mount_namespaces_held() -> int:
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            held += os.readlink(f"/proc/self/fd/{fd}").startswith("mnt:[")
        except OSError:
            continue
    return held


def _zombie_children() -> list[int]:
    """This process's children that have ended and are not reaped."""
    zombies = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            zombies.append(int(entry))
    return zombies


def test_a_runs_own_sandbox_is_reaped_while_the_event_loop_sits_idle_after_the_run(work_root, make_request,
                                                                                    monkeypatch):
    """A queue worker runs its event loop only during a job: bwrap may exit only after the run has ended on its
    report (as on a loaded machine), and must be reaped then all the same, not left a zombie until the next job."""
    import asyncio
    import subprocess
    import time

    loop = asyncio.new_event_loop()
    runtime = LocalWorkspaceRuntime(work_root, spawners="off")
    try:
        loop.run_until_complete(runtime.run(make_request("true", workspace_id="idle-loop")))  # bwrap probed
        with monkeypatch.context() as patched:  # bwrap has not exited yet whenever the run looks
            patched.setattr(subprocess.Popen, "poll", lambda self: None)
            for _ in range(3):
                result = loop.run_until_complete(runtime.run(make_request("echo x", workspace_id="idle-loop")))
                assert result.stdout == "x\n"
        deadline = time.monotonic() + 10  # a hang guard: bwrap ends within milliseconds of its report
        while _zombie_children() and time.monotonic() < deadline:
            time.sleep(0.05)  # the loop is not run meanwhile
        assert _zombie_children() == []
    finally:
        loop.run_until_complete(runtime.close())
        loop.close()
