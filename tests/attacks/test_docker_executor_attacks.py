"""Attacks on the Docker runtime's in-container executor: from a run (trace it, read its memory or token, signal
it, reach its socket, see another workspace's), and from outside (a wrong token, malformed frames, a second client
during a run, a link planted in place of its socket). Each runs for real and asserts the executor held."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

from worker.runtimes.docker import executor_inside as inside
from worker.runtimes.docker.executor import ExecutorLink, ExecutorUnavailable

pytestmark = pytest.mark.docker

PTRACE = (
    "python3 -c \"import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
    "print('ptrace', libc.ptrace(16, 1, 0, 0), os.strerror(ctypes.get_errno()))\""
)


def _box(runtime, workspace_id: str):
    (box,) = [box for key, box in runtime.boxes._boxes.items()
              if key[0] == workspace_id or key[0].startswith(f"ws_{workspace_id}_")]  # the workspace's own id
    return box


@pytest.mark.root
async def test_docker_executor_cannot_be_traced_read_signalled_or_reached_by_its_runs(docker_runtime_factory, run_in):
    runtime = docker_runtime_factory()
    result = await runtime.run(run_in(
        f"{PTRACE}; head -c 1 /proc/1/mem 2>&1 | tail -1; cat /proc/1/environ 2>&1 | tail -1; "
        "ls /.skillrun/control 2>&1 | tail -1; "
        "python3 -c \"import socket; socket.socket(socket.AF_UNIX).connect('/.skillrun/control/sock')\" 2>&1 | tail -1; "
        "stat -c '%U %a' /.skillrun; kill -STOP 1; kill -TERM 1; kill -KILL 1; sleep 0.2; echo signalled"))
    lines = result.stdout.splitlines()
    assert lines[0] == "ptrace -1 Operation not permitted"
    assert all("Permission denied" in line for line in lines[1:5]), result.stdout
    assert lines[5] == "root 700" and lines[6] == "signalled"
    container = runtime.container_id("attacked")
    after = await runtime.run(run_in("echo served"))
    assert (after.stdout, after.timings.exec_via) == ("served\n", "executor") and runtime.container_id("attacked") == container


async def test_docker_executor_of_another_workspace_is_out_of_sight(docker_runtime_factory, run_in):
    runtime = docker_runtime_factory()
    await runtime.run(run_in("true", workspace_id="victim"))
    victim_control = _box(runtime, "victim").control
    result = await runtime.run(run_in(
        f"ls -A /.skillrun 2>&1 | tail -1; ls {victim_control} 2>&1 | tail -1; "
        f"ls {victim_control.parent} 2>&1 | tail -1"))
    lines = result.stdout.splitlines()
    assert "Permission denied" in lines[0], result.stdout  # not even its own executor's folders
    assert all("No such file or directory" in line for line in lines[1:3]), result.stdout


@pytest.mark.root
async def test_docker_executor_refuses_a_wrong_token_and_malformed_frames_and_keeps_serving(docker_runtime_factory, run_in):
    runtime = docker_runtime_factory()
    await runtime.run(run_in("true"))
    box = _box(runtime, "attacked")
    with pytest.raises(ExecutorUnavailable, match="did not answer|refused"):
        ExecutorLink.connect(box.control, b"not-the-token", timeout=2)
    for garbage in (inside.HEADER.pack(inside.RUN, 2) + b"{}",  # a run before the token
                    inside.HEADER.pack(inside.AUTH, 2**31) + b"x",  # a frame far past the limit
                    b"\x00" * 3):  # not even a header, then nothing
        with socket.socket(socket.AF_UNIX) as raw:
            raw.settimeout(5)
            raw.connect(str(box.control / "sock"))
            raw.sendall(garbage)
            raw.shutdown(socket.SHUT_WR)
            while raw.recv(4096):  # the executor answers with an error, or nothing, and closes
                pass
    link = ExecutorLink.connect(box.control, box.token)
    link.send(inside.RUN, b"not json")
    kind, payload = link.next_frame(time.monotonic() + 5)
    assert kind == inside.ERROR and b"bad frame" in payload
    link.close()
    after = await runtime.run(run_in("echo still serving"))
    assert (after.stdout, after.timings.exec_via) == ("still serving\n", "executor")


@pytest.mark.root
async def test_docker_executor_takes_no_second_run_while_one_is_under_way(docker_runtime_factory, run_in):
    runtime = docker_runtime_factory()
    await runtime.run(run_in("true"))
    box = _box(runtime, "attacked")
    task = asyncio.create_task(runtime.run(run_in("sleep 2; echo first")))
    await asyncio.sleep(0.5)
    intruder = ExecutorLink.connect(box.control, box.token)
    intruder.send(inside.RUN, json.dumps({"argv": ["/bin/true"], "env": {}, "cwd": "/", "caps": [10, 10],
                                          "scrub": "true"}).encode())
    kind, payload = intruder.next_frame(time.monotonic() + 5)
    intruder.close()
    assert (kind, payload) == (inside.ERROR, b"a run is under way")
    assert (await task).stdout == "first\n"


def test_docker_a_link_planted_in_place_of_the_executor_socket_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    accepted = []
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(elsewhere / "sock"))
        server.listen(1)
        server.settimeout(2)
        waiter = threading.Thread(target=lambda: accepted.append(_accept(server)))
        waiter.start()
        control = tmp_path / "control"
        control.mkdir()
        (control / "sock").symlink_to(elsewhere / "sock")
        with pytest.raises(ExecutorUnavailable, match="not a socket"):
            ExecutorLink.connect(control, b"token", timeout=1)
        (control / "sock").unlink()
        (control / "sock").write_text("not a socket")
        with pytest.raises(ExecutorUnavailable, match="not a socket"):
            ExecutorLink.connect(control, b"token", timeout=1)
        waiter.join()
    assert accepted == [None]  # nothing ever connected to the socket the link pointed at


def _accept(server: socket.socket):  # noqa: ANN202
    try:
        connection, _ = server.accept()
    except TimeoutError:
        return None
    connection.close()
    return "connected"


# ---------------------------------------------------------------------------------------------------------------
# Attacks from a run on what it could leave for the next run of its workspace, on runc and on gVisor (runsc), and
# on the executor's own state. A test that shows a hole (none is known) is marked ``xfail(strict=True)`` with the
# hole as reason.

GVISOR = "runsc"
OCI_RUNTIMES = ["runc", GVISOR]


def _runtime(docker_runtime_factory, docker_engine, oci_runtime: str):  # noqa: ANN202
    if oci_runtime != "runc":
        docker_engine.require_runtime(oci_runtime)
    return docker_runtime_factory(oci_runtime=oci_runtime)


def _the_box(runtime):  # noqa: ANN202
    """The runtime's one container (its key is the workspace's own id, which differs from the request's)."""
    (box,) = runtime.boxes._boxes.values()
    return box


def _only_the_executor_and_the_probe(ps_output: str) -> list[str]:
    """The processes a ``ps -eo args=`` probe saw besides itself, the executor and the ready shell it ran in."""
    return [line for line in ps_output.splitlines()
            if line.split()[:1] != ["ps"] and "__skillrun_command" not in line and "/.skillrun/program/executor.py" not in line]


SYSV_QUEUE = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
if sys.argv[1] == "put":
    queue = libc.msgget(0x5eed, 0o1600)
    message = ctypes.create_string_buffer(8 + 64)
    ctypes.c_long.from_buffer(message).value = 1
    message[8:20] = b"left-behind\0"
    print("put", libc.msgsnd(queue, message, 64, 0))
else:
    queue = libc.msgget(0x5eed, 0)
    if queue < 0:
        print("no queue")
    else:
        message = ctypes.create_string_buffer(8 + 64)
        size = libc.msgrcv(queue, message, 64, 0, 0o4000)
        print("got", message.raw[8:8 + max(size, 0)].split(b"\0")[0].decode())
"""


@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_system_v_ipc_objects_of_a_run_are_not_left_for_the_next_run(
        docker_runtime_factory, docker_engine, run_in, oci_runtime):
    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    put = await runtime.run(run_in(f"python3 -c '{SYSV_QUEUE}' put; ipcmk -M 1048576 >/dev/null"))
    assert put.stdout == "put 0\n", put.stdout + put.stderr
    after = await runtime.run(run_in(f"python3 -c '{SYSV_QUEUE}' get; ipcs -m | grep -c '^0x' || true"))
    assert after.stdout.split("\n")[0] == "no queue", after.stdout
    assert after.stdout.split("\n")[1] == "0", after.stdout


MOUNT_PARENT = 'p=$(dirname "$(dirname "$(dirname "$RUN_DIR")")")'
"""The folder holding the workspace's mount point: one the engine made inside the container's ``/tmp`` on the way
to the bind mount when the work root is under ``/tmp`` (as here, and as by default: ``default_work_root``)."""


@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_a_run_leaves_nothing_in_the_folders_on_the_way_to_its_mounts_for_the_next_run(
        docker_runtime_factory, docker_engine, run_in, oci_runtime):
    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    left = await runtime.run(run_in(
        f'{MOUNT_PARENT}; case "$p" in /tmp/?*) echo under-tmp;; esac; '
        'echo secret > "$p/left-behind" 2>/dev/null; mkdir "$p/left-dir" 2>/dev/null && echo x > "$p/left-dir/f"; true'))
    assert left.stdout == "under-tmp\n", "the work root is not under /tmp: nothing to test"
    after = await runtime.run(run_in(
        f'{MOUNT_PARENT}; cat "$p/left-behind" "$p/left-dir/f" 2>/dev/null; find /tmp -xdev -user "$(id -u)" 2>/dev/null'))
    assert after.stdout == "", after.stdout


@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_a_run_cannot_move_its_workspace_and_skill_mounts_aside_for_the_next_run(
        docker_runtime_factory, docker_engine, run_in, oci_runtime):
    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    await runtime.run(run_in(
        'w=$(dirname "$(dirname "$RUN_DIR")"); p=$(dirname "$w"); mv "$p" "$p.aside" 2>/dev/null; '
        'mkdir -p "$w/skills/demo/scripts" 2>/dev/null && echo "echo HIJACKED" > "$w/skills/demo/scripts/hello.sh"; '
        'true'))
    after = await runtime.run(run_in('bash scripts/hello.sh; test -d "$RUN_DIR" && echo run-dir-there'))
    assert after.stdout == "hello from demo\nrun-dir-there\n", after.stdout + after.stderr


@pytest.mark.root
@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_executor_token_is_unreadable_by_its_runs(docker_runtime_factory, docker_engine, run_in,
                                                                oci_runtime):
    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    result = await runtime.run(run_in(
        "tr '\\0' '\\n' < /proc/1/environ 2>/dev/null; tr '\\0' '\\n' < /proc/self/environ; "
        "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null; done; true"))
    token = _the_box(runtime).token.decode()
    assert token and token not in result.stdout
    assert "SKILLRUN_EXECUTOR_TOKEN" not in result.stdout


@pytest.mark.root
@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_executor_cannot_be_interrupted_or_ended_by_signals_from_its_runs(
        docker_runtime_factory, docker_engine, run_in, oci_runtime):
    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    await runtime.run(run_in("true"))
    container = _the_box(runtime).id
    result = await runtime.run(run_in(
        "for s in TERM INT USR1 USR2 HUP QUIT ALRM PIPE TTIN TTOU TSTP WINCH 40; do kill -$s 1; done; "
        "sleep 0.2; echo signalled", timeout=10))
    assert result.stdout.splitlines()[-1:] == ["signalled"], result.stdout + result.stderr
    after = await runtime.run(run_in("echo served"))
    assert (after.stdout, after.timings.exec_via) == ("served\n", "executor")
    assert _the_box(runtime).id == container


@pytest.mark.root
@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_executor_cannot_be_stopped_traced_or_read_by_its_runs(docker_runtime_factory, docker_engine,
                                                                            run_in, oci_runtime):
    """``SIGSTOP`` cannot be caught, and gVisor delivers it to a namespace's init (Linux drops it): the executor is
    another user than the run's, which may therefore neither signal it, trace it nor read its memory."""
    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    await runtime.run(run_in("true"))
    container = _the_box(runtime).id
    result = await runtime.run(run_in(
        f"kill -STOP 1; sleep 0.2; grep '^State' /proc/1/status; kill -CONT 1; {PTRACE}; "
        "head -c 1 /proc/1/mem 2>&1 | tail -1; echo signalled", timeout=10))
    lines = result.stdout.splitlines()
    assert lines[-1:] == ["signalled"] and "stopped" not in result.stdout, result.stdout
    assert lines[-3] == "ptrace -1 Operation not permitted" and "Permission denied" in lines[-2], result.stdout
    assert "kill: (1) - Operation not permitted" in result.stderr  # refused, not only survived
    after = await runtime.run(run_in("echo served"))
    assert (after.stdout, after.timings.exec_via, _the_box(runtime).id) == ("served\n", "executor", container)


@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
@pytest.mark.parametrize("attack", ["kill -STOP 1; sleep 1", "kill -KILL 1; kill -TERM 1; sleep 1"])
async def test_docker_a_run_that_stops_or_ends_its_executor_ends_and_the_next_run_gets_a_working_container(
        docker_runtime_factory, docker_engine, run_in, oci_runtime, attack):
    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    await runtime.run(run_in("true"))
    result = await runtime.run(run_in(f"{attack}; echo past", timeout=3))  # returns: the worker never waits forever
    assert result.exit_code is not None
    after = await runtime.run(run_in("echo served; ps -eo args="))
    assert after.stdout.startswith("served\n") and after.timings.exec_via == "executor"
    assert _only_the_executor_and_the_probe(after.stdout.split("\n", 1)[1]) == [], after.stdout


MIGRATING = r"""
import os, sys
for _ in range(int(sys.argv[1])):
    if os.fork() == 0:
        os.setsid()
        for fd in (0, 1, 2):
            os.close(fd)
        while True:  # fork and let the parent go: the process id of the chain keeps changing
            try:
                if os.fork():
                    os._exit(0)
            except OSError:
                pass
"""


@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_processes_that_keep_forking_away_do_not_outlive_their_run(
        docker_runtime_factory, docker_engine, run_in, oci_runtime):
    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    result = await runtime.run(run_in(f"python3 -c '{MIGRATING}' 6; sleep 0.5; echo started"))
    assert result.stdout == "started\n"
    after = await runtime.run(run_in("sleep 0.3; ps -eo args="))
    assert _only_the_executor_and_the_probe(after.stdout) == [], after.stdout


@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_processes_in_nested_user_and_pid_namespaces_do_not_outlive_their_run(
        docker_runtime_factory, docker_engine, run_in, oci_runtime):
    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)  # gVisor lets a run make them; runc not
    await runtime.run(run_in(
        "unshare -Urpf --kill-child=0 sh -c 'setsid sleep 1001 & sleep 1002' >/dev/null 2>&1 & "
        "unshare -Ur sh -c 'setsid sleep 1003 &' >/dev/null 2>&1; sleep 0.5; true"))
    after = await runtime.run(run_in("ps -eo args="))
    assert _only_the_executor_and_the_probe(after.stdout) == [], after.stdout


@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_a_run_cannot_inject_a_command_into_the_ready_shell_of_the_next_run(
        docker_runtime_factory, docker_engine, run_in, oci_runtime):
    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    await runtime.run(run_in(
        "setsid bash -c 'while :; do for p in /proc/[0-9]*; do grep -qs __skillrun_command $p/cmdline && "
        "echo \"echo INJECTED\" > $p/fd/0; done 2>/dev/null; done' >/dev/null 2>&1 </dev/null & sleep 0.3; true"))
    after = await runtime.run(run_in("echo next"))
    assert after.stdout == "next\n", after.stdout


@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_a_run_that_closes_or_replaces_its_standard_fds_reports_its_own_exit_code(
        docker_runtime_factory, docker_engine, run_in, oci_runtime):
    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    closed = await runtime.run(run_in("exec 0<&- 1>&- 2>&-; sleep 0.2; exit 7"))
    replaced = await runtime.run(run_in("exec 1>/dev/null 2>&1 </dev/zero; setsid sleep 1001 & exit 9"))
    held = await runtime.run(run_in("setsid sh -c 'sleep 1001' & echo out; echo err >&2; exit 0"))
    assert [(r.exit_code, r.stdout, r.stderr) for r in (closed, replaced, held)] == [
        (7, "", ""), (9, "", ""), (0, "out\n", "err\n")]
    after = await runtime.run(run_in("ps -eo args="))
    assert _only_the_executor_and_the_probe(after.stdout) == [], after.stdout


@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_output_of_detached_writers_stays_within_the_caps_and_out_of_the_next_run(
        docker_runtime_factory, docker_engine, run_in, oci_runtime):
    from worker.contract import RunLimits

    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    limits = RunLimits(stdout_bytes=1000, stderr_bytes=500)
    flood = await runtime.run(run_in(
        "for i in 1 2 3; do setsid sh -c 'while :; do echo late-out; echo late-err >&2; done' & done; "
        "sleep 0.5; exit 3", limits=limits))
    kept = [text.split("\n[skillrun: output truncated here", 1)[0].encode() for text in (flood.stdout, flood.stderr)]
    assert flood.exit_code == 3 and flood.stdout_truncated and flood.stderr_truncated
    assert (len(kept[0]), len(kept[1])) == (1000, 500) and set(kept[0].split()) <= {b"late-out", b"l"}
    after = await runtime.run(run_in("echo second"))
    assert (after.stdout, after.stderr) == ("second\n", "")


@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_a_sigchld_flood_at_the_executor_neither_breaks_it_nor_fills_its_log(
        docker_runtime_factory, docker_engine, run_in, oci_runtime):
    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    result = await runtime.run(run_in(  # the executor handles SIGCHLD, so a run may send it to process 1
        "for i in 1 2; do (while :; do kill -CHLD 1; done) & done; "
        "for i in $(seq 10); do head -c 100000 /dev/zero; sleep 0.02; done | wc -c; exit 4", timeout=60))
    assert (result.exit_code, result.stdout.strip()) == (4, "1000000")
    assert docker_engine.client.api.logs(_the_box(runtime).id) == b""
    after = await runtime.run(run_in("echo served"))
    assert (after.stdout, after.timings.exec_via) == ("served\n", "executor")


@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_scratch_folders_filled_with_unremovable_odd_things_are_emptied_for_the_next_run(
        docker_runtime_factory, docker_engine, run_in, oci_runtime):
    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    await runtime.run(run_in(
        "cd /tmp && for i in $(seq 300); do mkdir d && cd d || break; done; touch deep; chmod 000 /tmp/d; "
        "mkdir -p /tmp/m/n && touch /tmp/m/n/f && chmod 000 /tmp/m/n /tmp/m; mkfifo /tmp/fifo /dev/shm/fifo; "
        "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('/tmp/sock')\"; ln -s / /tmp/root-link; "
        "touch /tmp/-rf /tmp/.hidden '/tmp/new\nline' /dev/mqueue/q 2>/dev/null; mkdir /dev/shm/d && touch /dev/shm/d/x; "
        "head -c 200M /dev/zero > /tmp/fill 2>/dev/null; head -c 200M /dev/zero > /dev/shm/fill 2>/dev/null; true",
        timeout=60))
    after = await runtime.run(run_in(
        "find /tmp /dev/shm /dev/mqueue -xdev -mindepth 1 -user \"$(id -u)\" 2>/dev/null | head -5; "
        "echo x > /tmp/room && echo room"))
    assert after.stdout == "room\n", after.stdout


FORKS = (  # children made until the limit refuses one (at most 120): zombies (never waited for) or sleepers
    "import os, sys, time\nmade = 0\nwhile made < 120:\n    try:\n        pid = os.fork()\n    except OSError:\n"
    "        break\n    if pid == 0:\n        os._exit(0) if sys.argv[1] == 'zombies' else os.execv('/bin/sleep', ['sleep', '1000'])\n"
    "    made += 1\nprint('made', made, flush=True)\ntime.sleep(1000)\n")


@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_a_run_holding_every_process_slot_with_zombies_leaves_a_working_executor(
        docker_runtime_factory, docker_engine, run_in, oci_runtime):
    from worker.contract import RunLimits

    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    result = await runtime.run(run_in(
        f"mkfifo /tmp/made; setsid python3 -c \"{FORKS}\" zombies > /tmp/made & head -1 /tmp/made; echo done",
        limits=RunLimits(processes=64), timeout=60))
    assert result.stdout.startswith("made ") and result.stdout.endswith("done\n"), result.stdout + result.stderr
    after = await runtime.run(run_in("ps -eo args=", limits=RunLimits(processes=64)))
    assert (after.timings.exec_via, _only_the_executor_and_the_probe(after.stdout)) == ("executor", []), after.stdout


@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_a_run_is_held_to_its_process_limit(docker_runtime_factory, docker_engine, run_in, oci_runtime):
    from worker.contract import RunLimits

    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    result = await runtime.run(run_in(
        f"mkfifo /tmp/made; python3 -c \"{FORKS}\" sleepers > /tmp/made & head -1 /tmp/made",
        limits=RunLimits(processes=64), timeout=60))
    assert result.stdout.startswith("made "), result.stdout + result.stderr
    assert int(result.stdout.split()[1]) < 64, result.stdout


async def test_docker_a_long_command_runs_alike_in_a_new_container_and_through_a_ready_shell(
        docker_runtime_factory, run_in):
    runtime = docker_runtime_factory()
    command = "#" + "\u20ac" * 60000 + "\necho long-ran"  # 60,001 characters, 180,000 bytes
    first = await runtime.run(run_in(command))
    second = await runtime.run(run_in(command))
    assert [(r.exit_code, r.stdout) for r in (first, second)] == [(0, "long-ran\n")] * 2, first.stderr


@pytest.mark.parametrize("oci_runtime", OCI_RUNTIMES)
async def test_docker_executor_control_socket_is_out_of_reach_of_its_runs(docker_runtime_factory, docker_engine,
                                                                          run_in, oci_runtime):
    runtime = _runtime(docker_runtime_factory, docker_engine, oci_runtime)
    result = await runtime.run(run_in(
        "ls /.skillrun/control 2>&1 | tail -1; "
        "for path in /.skillrun/control/sock /proc/1/root/.skillrun/control/sock /proc/1/cwd/.skillrun/control/sock; do "
        "python3 -c \"import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1]); print('connected')\" "
        "$path 2>&1 | tail -1; done; "
        "for fd in /proc/1/fd/*; do python3 -c \"import os, socket, sys\n"
        "try:\n    s = socket.socket(fileno=os.open(sys.argv[1], os.O_RDWR))\n    print('got', sys.argv[1])\n"
        "except OSError:\n    pass\" $fd; done 2>/dev/null; true"))
    lines = result.stdout.splitlines()
    assert "connected" not in result.stdout and not [line for line in lines if line.startswith("got")], result.stdout
    assert all("denied" in line or "No such file" in line for line in lines), result.stdout
