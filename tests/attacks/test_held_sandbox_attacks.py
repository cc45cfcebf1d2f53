"""More attacks on a workspace's held sandbox (``worker.sandbox.held``), as a hostile tenant would try them.

Each run goes through the public API (``LocalWorkspaceRuntime.run``) as root, with real users, namespaces, control
groups and bubblewrap. The first runs of a workspace warm it up, so the runs after go into its held sandbox, where
the spawner is pid 1 and the runs before ran (asserted by ``_held``). Each test's name says what it defends; an
attack that succeeds is kept as a strict ``xfail`` whose reason names the hole.
"""

from __future__ import annotations

import asyncio
import textwrap
import uuid

import pytest

from tests.attacks.held import PID_NAMESPACE, py, run, warm_held
from tests.processes import running_with, sleeper, wait_none_with
from tests.services import unavailable
from worker.contract import RunLimits
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

pytestmark = pytest.mark.root

SESSION = uuid.uuid4().hex[:8]


def ws(name: str) -> str:
    return f"heldx-{name}-{SESSION}"


async def _run(runtime: LocalWorkspaceRuntime, make_request, command: str, name: str, **fields):
    return await run(runtime, make_request, command, ws(name), **fields)


async def _held(runtime: LocalWorkspaceRuntime, make_request, name: str) -> str:
    return await warm_held(runtime, make_request, ws(name))


LIMITS = "echo $(ulimit -n) $(ulimit -f) $(ulimit -t) $(ulimit -c) $(ulimit -u) $(ulimit -s) $(ulimit -d)"


async def test_a_run_cannot_lower_the_resource_limits_the_spawner_hands_the_next_run(held, make_request):
    namespace = await _held(held, make_request, "rlimit")
    before = (await _run(held, make_request, LIMITS, "rlimit")).stdout
    # limits the run's own ulimit line does not set: the next run silently gets a tiny stack and data segment
    attack = py("""
        import resource
        for limit, value in ((resource.RLIMIT_STACK, 256 << 10), (resource.RLIMIT_DATA, 128 << 20)):
            try:
                resource.prlimit(1, limit, (value, value))
                print("lowered", limit)
            except OSError as exc:
                print("refused", limit, exc.errno)
        """)
    assert "lowered" in (await _run(held, make_request, attack, "rlimit")).stdout  # pid 1 took them
    after = await _run(held, make_request, f"{PID_NAMESPACE}; {LIMITS}", "rlimit")
    # the worker saw pid 1's limits changed: the next run is in a held sandbox made anew, with the limits it had
    assert after.stdout.splitlines()[0] != namespace.strip()
    assert after.stdout.splitlines()[1] == before.strip(), (before, after.stdout)


async def test_a_run_cannot_make_every_later_run_of_its_workspace_fail(held, make_request):
    await _held(held, make_request, "brick")
    attack = py("""
        import resource
        resource.prlimit(1, resource.RLIMIT_CPU, (100, 100))
        print("lowered")
        """)
    assert (await _run(held, make_request, attack, "brick")).stdout == "lowered\n"
    for _ in range(3):
        after = await _run(held, make_request, "echo ok", "brick")
    assert (after.exit_code, after.stdout) == (0, "ok\n"), after


async def test_a_run_cannot_renice_or_pin_the_spawner_for_the_next_run(held, make_request):
    namespace = await _held(held, make_request, "nice")
    look = f"{PID_NAMESPACE}; nice; taskset -p $$ | sed 's/.*: //'; ionice -p $$; chrt -p $$ | head -1 | sed 's/.*: //'"
    before = (await _run(held, make_request, look, "nice")).stdout
    attack = py("""
        import os
        for name, call in (("nice", lambda: os.setpriority(os.PRIO_PROCESS, 1, 19)),
                           ("affinity", lambda: os.sched_setaffinity(1, {0})),
                           ("ioprio", lambda: os.system("ionice -c 3 -p 1")),
                           ("idle", lambda: os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0)))):
            try:
                call()
                print(name, "set")
            except OSError as exc:
                print(name, "refused", exc.errno)
        """)
    assert "nice set" in (await _run(held, make_request, attack, "nice")).stdout  # pid 1 took it
    after = (await _run(held, make_request, look, "nice")).stdout
    # the worker saw pid 1 changed: the next run is in a held sandbox made anew, with the settings it had
    assert before.splitlines()[0] == namespace.strip() != after.splitlines()[0]
    assert after.splitlines()[1:] == before.splitlines()[1:], (before, after)


async def test_a_run_that_leaves_the_spawner_no_descriptors_gets_the_held_sandbox_remade(held, make_request):
    namespace = await _held(held, make_request, "nofile")
    before = (await _run(held, make_request, LIMITS, "nofile")).stdout
    attack = py("""
        import resource
        resource.prlimit(1, resource.RLIMIT_NOFILE, (3, 3))
        print("lowered")
        """)
    assert (await _run(held, make_request, attack, "nofile")).stdout == "lowered\n"
    for _ in range(3):
        after = await _run(held, make_request, f"{PID_NAMESPACE}; {LIMITS}", "nofile")
        assert after.exit_code == 0, after
    # the spawner could take no request (no room for their descriptors): its sandbox was given up for a new one
    assert after.stdout.splitlines()[0] != namespace.strip()
    assert after.stdout.splitlines()[1] == before.strip()


async def test_a_run_cannot_kill_pid_1_or_the_next_run_with_kill_minus_one_or_stop(held, make_request):
    namespace = await _held(held, make_request, "killall")
    spawner = held._spawners[ws("killall")]
    sleep, marker = sleeper()
    result = await _run(held, make_request, f"({sleep} &); kill -STOP 1; kill -9 -1; echo survived", "killall",
                        timeout=60)
    assert result.stdout == "survived\n"  # kill -1 spares its caller
    assert wait_none_with(marker, 5.0)
    after = await _run(held, make_request, f"{PID_NAMESPACE}; echo ok", "killall")
    assert after.stdout == namespace + "ok\n"
    assert held._spawners[ws("killall")] is spawner and spawner.alive


async def test_a_run_that_floods_pid_1_with_sigchld_and_orphans_zombies_does_not_hang_the_next(held, make_request):
    namespace = await _held(held, make_request, "zombies")
    attack = py("""
        import os, signal, time
        # children that exit and are never reaped (zombies), then a parent gone: all are handed to pid 1
        for _ in range(30):
            if os.fork() == 0:
                for _ in range(5):
                    if os.fork() == 0:
                        os._exit(0)
                os._exit(0)  # its five zombies become pid 1's
        deadline = time.monotonic() + 2
        n = 0
        while time.monotonic() < deadline:
            os.kill(1, signal.SIGCHLD)
            n += 1
        print("sent", n > 0)
        """)
    result = await _run(held, make_request, attack, "zombies", limits=RunLimits(processes=200), timeout=60)
    assert result.stdout == "sent True\n", result.stdout + result.stderr
    look = py("""
        import os
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                print("zombie", pid, fields[1])
        """)
    after = await _run(held, make_request, f"{PID_NAMESPACE}; {look}", "zombies")
    assert after.stdout == namespace, after.stdout


async def test_a_fork_bomb_left_running_at_the_end_of_a_run_is_gone_before_the_next(held, make_request):
    namespace = await _held(held, make_request, "bomb")
    sleep, marker = sleeper()
    bomb = f"bomb() {{ {sleep} & bomb & bomb & }}; (bomb &) >/dev/null 2>&1; sleep 0.2; echo lit"
    result = await _run(held, make_request, bomb, "bomb", limits=RunLimits(processes=60), timeout=60)
    assert "lit" in result.stdout
    assert wait_none_with(marker, 5.0), "a process of the fork bomb outlived its run"
    after = await _run(held, make_request, f"{PID_NAMESPACE}; ls /proc | grep -c '^[0-9]'", "bomb")
    lines = after.stdout.splitlines()
    assert lines[0] == namespace.strip() and int(lines[1]) <= 5, after.stdout


async def test_a_run_finds_no_control_group_file_system_to_move_itself_out_of_its_group(held, make_request):
    await _held(held, make_request, "cgroupfs")
    attack = py("""
        import os
        found = [line.split()[4] for line in open("/proc/self/mountinfo") if " - cgroup" in line]
        print("cgroup mounts", len(found))
        moved = 0
        for top in ["/sys/fs/cgroup", *found]:
            for folder, _, files in os.walk(top):
                if "cgroup.procs" in files or "tasks" in files:
                    for name in ("cgroup.procs", "tasks"):
                        try:
                            with open(os.path.join(folder, name), "w") as procs:
                                procs.write(str(os.getpid()))
                            moved += 1
                        except OSError:
                            pass
        print("moved", moved)
        """)
    result = await _run(held, make_request, attack, "cgroupfs")
    assert result.stdout == "cgroup mounts 0\nmoved 0\n", result.stdout + result.stderr


async def test_files_planted_beside_the_mount_points_in_tmp_are_gone_for_the_next_run(held, make_request):
    await _held(held, make_request, "beside")
    # The workspace and the skill are shown under /tmp (the tests' roots): bwrap made their parent folders on the
    # held sandbox's /tmp, owned by the workspace user. Plant files in them, and make one unreadable.
    plant = textwrap.dedent("""
        d=$(dirname "$WORKSPACE_DIR"); case "$d" in /tmp/*) ;; *) echo not-under-tmp; exit 0;; esac
        echo secret > "$d/planted"; top=/tmp/$(echo "${d#/tmp/}" | cut -d/ -f1)
        echo secret > "$top/planted-top"; mkdir -p "$top/hidden/deep" && echo s > "$top/hidden/deep/f"
        chmod 0 "$top/hidden/deep" "$top/hidden"; chmod 0711 "$top" 2>/dev/null; echo planted
        """)
    planted = await _run(held, make_request, plant, "beside")
    if planted.stdout.strip() == "not-under-tmp":
        unavailable("these attacks need the tests' work root under /tmp (the workspace is not shown there here)")
    assert planted.stdout == "planted\n", planted.stdout + planted.stderr
    look = 'find /tmp -name "planted*" -o -name hidden 2>/dev/null; echo done'
    after = await _run(held, make_request, look, "beside")
    assert after.exit_code == 0 and after.stdout == "done\n", after.stdout + after.stderr


async def test_a_listener_left_on_loopback_or_an_abstract_socket_is_gone_for_the_next_run(held, make_request):
    await _held(held, make_request, "listen")
    listen = py("""
        import os, socket
        tcp = socket.socket(); tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind(("127.0.0.1", 47123)); tcp.listen()
        unix = socket.socket(socket.AF_UNIX); unix.bind("\\0skillrun-left"); unix.listen()
        if os.fork() == 0:
            os.setsid()
            while True:
                tcp.accept()[0].sendall(b"poisoned")
        print("listening")
        """)
    assert (await _run(held, make_request, listen, "listen")).stdout == "listening\n"
    probe = py("""
        import socket
        for family, address in ((socket.AF_INET, ("127.0.0.1", 47123)), (socket.AF_UNIX, "\\0skillrun-left")):
            s = socket.socket(family)
            s.settimeout(5)
            try:
                s.connect(address)
                print("connected", address)
            except OSError:
                pass
        print("probed")
        """)
    after = await _run(held, make_request, probe, "listen")
    assert after.stdout == "probed\n", after.stdout + after.stderr


async def test_a_run_of_one_workspace_reaches_no_socket_or_process_of_another_workspaces_held_sandbox(
    held, make_request
):
    await _held(held, make_request, "victim")
    await _held(held, make_request, "spy")
    sleep, marker = sleeper()
    listen = py(f"""
        import os, socket, time
        tcp = socket.socket(); tcp.bind(("127.0.0.1", 47124)); tcp.listen()
        unix = socket.socket(socket.AF_UNIX); unix.bind("\\0skillrun-victim"); unix.listen()
        open(os.environ["WORK_DIR"] + "/listening", "w").close()
        os.execvp("sh", ["sh", "-c", {sleep!r}])
        """)
    victim = asyncio.create_task(_run(held, make_request, listen, "victim", timeout=60))
    try:
        for _ in range(3000):
            if running_with(marker):
                break
            await asyncio.sleep(0.01)
        assert running_with(marker), "the victim's run did not start"
        probe = py("""
            import os, signal, socket
            MARKER = bytes.fromhex("%s")
            for family, address in ((socket.AF_INET, ("127.0.0.1", 47124)), (socket.AF_UNIX, "\\0skillrun-victim")):
                s = socket.socket(family)
                s.settimeout(5)
                try:
                    s.connect(address)
                    print("connected", address)
                except OSError:
                    pass
            for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
                if MARKER in open(f"/proc/{pid}/cmdline", "rb").read():
                    print("sees", pid)
            print("probed")
            """ % marker.encode().hex())
        spy = await _run(held, make_request, probe, "spy")
        assert spy.stdout == "probed\n", spy.stdout + spy.stderr
    finally:
        victim.cancel()
        await asyncio.gather(victim, return_exceptions=True)


async def test_a_run_that_exhausts_its_memory_leaves_pid_1_and_another_tenants_next_run_working(held, make_request):
    namespace = await _held(held, make_request, "oom")
    spawner = held._spawners[ws("oom")]
    hog = py("""
        import os
        blocks = []
        for _ in range(4):
            if os.fork() == 0:
                break
        while True:
            blocks.append(bytearray(16 << 20))
        """)
    hogged = await _run(held, make_request, hog, "oom", limits=RunLimits(memory_bytes=64 << 20), timeout=60)
    assert hogged.oom_killed, hogged  # five processes of ~64 MB each: the group's limit holds for the run as a whole
    after = await _run(held, make_request, f"{PID_NAMESPACE}; echo ok", "oom")
    assert after.stdout == namespace + "ok\n" and not after.oom_killed
    assert held._spawners[ws("oom")] is spawner and spawner.alive
    other = await _run(held, make_request, "echo other", "oom-other")
    assert other.stdout == "other\n" and not other.oom_killed


async def test_the_run_folder_and_home_of_one_run_are_not_the_next_runs(held, make_request):
    await _held(held, make_request, "home")
    first = await _run(held, make_request, 'echo left > "$HOME/.bashrc"; echo left > "$TMPDIR/x"; echo "$HOME"',
                       "home")
    second = await _run(held, make_request, 'echo "$HOME"; cat "$TMPDIR/x" 2>/dev/null; ls -A "$HOME"', "home")
    assert second.stdout.splitlines()[0] != first.stdout.strip()
    assert "left" not in second.stdout and ".bashrc" not in second.stdout, second.stdout


async def test_a_detached_process_does_not_survive_into_another_skills_rebuilt_held_sandbox(
    held, make_request, library
):
    from tests.conftest import write_skill
    from worker.contract import SkillRef

    write_skill(library, "other", files={"scripts/x.sh": "echo other\n"})
    await _held(held, make_request, "rebuild")
    sleep, marker = sleeper()
    await _run(held, make_request, f"(setsid {sleep} >/dev/null 2>&1 &); echo left", "rebuild")
    other = SkillRef(name="other", root=str(library), path="other")
    for _ in range(2):
        seen = await _run(held, make_request, f"pgrep -fc {marker} || true", "rebuild", skill=other)
        assert seen.stdout.strip() == "0", seen.stdout
    assert wait_none_with(marker, 1.0)


async def test_a_fork_bomb_at_the_default_process_limit_leaves_nothing_running(held, make_request):
    namespace = await _held(held, make_request, "bigbomb")
    sleep, marker = sleeper()
    bomb = f"bomb() {{ {sleep} & bomb & bomb & }}; (bomb &) >/dev/null 2>&1; sleep 1; echo lit"
    result = await _run(held, make_request, bomb, "bigbomb", timeout=60)
    assert "lit" in result.stdout
    assert wait_none_with(marker, 10.0), "a process of the fork bomb outlived its run"
    after = await _run(held, make_request, f"{PID_NAMESPACE}; ls /proc | grep -c '^[0-9]'", "bigbomb")
    lines = after.stdout.splitlines()
    assert int(lines[1]) <= 5, after.stdout
    assert lines[0] == namespace.strip() or not running_with(marker)  # given up or emptied: nothing of it left


@pytest.mark.parametrize("change", ["chmod 0 \"$top\"", "mv \"$top\" \"$top.moved\" && mkdir -p \"$WORK_DIR\""])
async def test_a_run_that_breaks_the_folders_above_its_workspace_in_tmp_leaves_the_next_runs_working(
    held, make_request, change
):
    await _held(held, make_request, "above")
    attack = (f'top=/tmp/$(echo "${{WORKSPACE_DIR#/tmp/}}" | cut -d/ -f1); case "$WORKSPACE_DIR" in /tmp/*) ;; '
              f'*) echo not-under-tmp; exit 0;; esac; {change} && echo changed')
    done = await _run(held, make_request, attack, "above")
    if done.stdout.strip() == "not-under-tmp":
        unavailable("these attacks need the tests' work root under /tmp (the workspace is not shown there here)")
    assert done.stdout == "changed\n", done.stdout + done.stderr
    for _ in range(2):
        after = await _run(held, make_request, 'echo ok; ls "$WORK_DIR" >/dev/null && echo listed; ls /tmp', "above")
        assert after.exit_code == 0 and after.stdout.startswith("ok\nlisted\n"), after
        assert ".moved" not in after.stdout


async def test_a_run_cannot_change_the_held_sandboxs_hostname_for_the_next(held, make_request):
    namespace = await _held(held, make_request, "uts")
    look = f"{PID_NAMESPACE}; hostname"
    before = (await _run(held, make_request, look, "uts")).stdout
    attack = py("""
        import socket
        try:
            socket.sethostname("poisoned")
            print("renamed")
        except OSError:
            pass
        print("tried")
        """)
    assert (await _run(held, make_request, attack, "uts")).stdout == "tried\n"
    after = (await _run(held, make_request, look, "uts")).stdout
    assert after == before and after.startswith(namespace)


IPC_SETTINGS = "cat /proc/sys/kernel/shmmax /proc/sys/kernel/shmmni /proc/sys/kernel/msgmax /proc/sys/kernel/msgmnb"


async def test_a_run_cannot_change_the_ipc_limits_the_next_run_of_its_workspace_gets(held, make_request):
    namespace = await _held(held, make_request, "ipcsysctl")
    before = (await _run(held, make_request, IPC_SETTINGS, "ipcsysctl")).stdout
    attack = py("""
        for name, value in (("shmmax", "4096"), ("shmmni", "0"), ("msgmax", "1"), ("msgmnb", "1")):
            try:
                with open("/proc/sys/kernel/" + name, "w") as setting:
                    setting.write(value)
                print("set", name)
            except OSError:
                pass
        print("tried")
        """)
    assert "set shmmni" in (await _run(held, make_request, attack, "ipcsysctl")).stdout  # the namespace took it
    # the spawner puts the namespace's IPC limits back before the next shell: the same held sandbox, as it was
    after = await _run(held, make_request, f"{PID_NAMESPACE}; {IPC_SETTINGS}; ipcmk -M 8192 >/dev/null && echo made",
                       "ipcsysctl")
    assert after.stdout == namespace + before + "made\n", after.stdout + after.stderr


async def test_a_tree_in_tmp_too_deep_to_empty_gets_the_held_sandbox_given_up_not_the_next_run_failed(
    held, make_request
):
    await _held(held, make_request, "deep")
    sandbox = held._spawners[ws("deep")]  # the held sandbox's spawner (its PID namespace's number may be reused)
    plant = py("""
        import os
        os.chdir("/tmp")
        for _ in range(1500):  # deeper than the spawner's recursion limit
            os.mkdir("d")
            os.chdir("d")
        open("secret", "w").write("left")
        print("planted")
        """)
    assert (await _run(held, make_request, plant, "deep")).stdout == "planted\n"
    for _ in range(2):
        after = await _run(held, make_request, f"{PID_NAMESPACE}; ls /tmp; echo end", "deep")
        assert after.exit_code == 0 and after.stdout.splitlines()[-1] == "end", after
        assert "\nd\n" not in after.stdout
    assert held._spawners[ws("deep")] is not sandbox and not sandbox.alive  # a new held sandbox; the old one gone


async def test_first_runs_of_two_workspaces_through_launchers_share_no_network_namespace(held, make_request):
    sleep, marker = sleeper()
    listen = py(f"""
        import os, socket
        tcp = socket.socket(); tcp.bind(("127.0.0.1", 47125)); tcp.listen()
        unix = socket.socket(socket.AF_UNIX); unix.bind("\\0skillrun-first"); unix.listen()
        os.execvp("sh", ["sh", "-c", {sleep!r}])
        """)
    victim = asyncio.create_task(_run(held, make_request, listen, "first-victim", timeout=60))
    try:
        for _ in range(3000):
            if running_with(marker):
                break
            await asyncio.sleep(0.01)
        assert running_with(marker), "the victim's run did not start"
        probe = py("""
            import socket
            for family, address in ((socket.AF_INET, ("127.0.0.1", 47125)), (socket.AF_UNIX, "\\0skillrun-first")):
                s = socket.socket(family)
                s.settimeout(5)
                try:
                    s.connect(address)
                    print("connected", address)
                except OSError:
                    pass
            print(open("/proc/net/unix").read().count("skillrun-first"), "seen")
            """)
        spy = await _run(held, make_request, probe, "first-spy")
        assert spy.stdout == "0 seen\n", spy.stdout + spy.stderr
    finally:
        victim.cancel()
        await asyncio.gather(victim, return_exceptions=True)
    assert wait_none_with(marker, 5.0)
