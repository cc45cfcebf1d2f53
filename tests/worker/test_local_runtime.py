"""The local runtime: environment, timeouts, process clean-up, limits, cwd and inputs."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from tests.conftest import IS_ROOT, workspace_dirs
from tests.host_network import host_address
from tests.processes import running_with, sleeper, wait_none_with
from tests.services import ensure_installed
from worker import defaults
from worker.contract import InputFile, RunLimits
from worker.errors import InvalidRunRequestError
from worker.runtimes.local.runtime import LocalWorkspaceRuntime


async def test_command_runs_in_the_staged_skill_folder_with_the_six_variables(runtime, make_request):
    result = await runtime.run(make_request(
        "pwd; bash scripts/hello.sh; for v in WORKSPACE_DIR SKILLS_DIR WORK_DIR OUTPUT_DIR RUN_DIR SKILL_NAME; "
        "do echo \"$v=${!v}\"; done"
    ))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    values = dict(line.split("=", 1) for line in lines[2:])
    ws = Path(values["WORKSPACE_DIR"])
    assert lines[0] == str(ws / "skills" / "demo")
    assert lines[1] == "hello from demo"
    assert values["SKILLS_DIR"] == str(ws / "skills")
    assert values["WORK_DIR"] == str(ws / "work")
    assert values["OUTPUT_DIR"] == str(ws / "out")
    assert Path(values["RUN_DIR"]).parent == ws / "runs"
    assert Path(values["RUN_DIR"]).name.startswith("run_")
    assert values["SKILL_NAME"] == "demo"


async def test_host_secret_in_the_callers_environment_is_not_visible_to_the_command(runtime, make_request, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2-secret")
    result = await runtime.run(make_request("env; cat /proc/self/environ | tr '\\0' '\\n'"))
    assert result.exit_code == 0
    assert "hunter2-secret" not in result.stdout
    assert "AWS_SECRET_ACCESS_KEY" not in result.stdout
    names = {line.split("=", 1)[0] for line in result.stdout.splitlines() if "=" in line}
    assert {"PATH", "HOME", "LANG", "WORKSPACE_DIR"} <= names


async def test_request_env_reaches_the_command(runtime, make_request):
    result = await runtime.run(make_request('echo "$REGION"', env={"REGION": "asia"}))
    assert result.stdout == "asia\n"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LD_PRELOAD": "/tmp/evil.so"}, "LD_PRELOAD may not be set"),
        ({"BASH_ENV": "/tmp/x"}, "BASH_ENV may not be set"),
        ({"1BAD": "x"}, "'1BAD' is not a valid environment variable name"),
        ({"A-B": "x"}, "'A-B' is not a valid environment variable name"),
        ({"OUTPUT_DIR": "/tmp"}, "OUTPUT_DIR is set by the workspace"),
    ],
)
async def test_unsafe_env_is_refused_before_anything_is_created(runtime, make_request, work_root, env, message):
    with pytest.raises(InvalidRunRequestError) as info:
        await runtime.run(make_request("echo hi", env=env))
    assert message in str(info.value)
    assert info.value.field == "env"
    assert not any(work_root.iterdir())


def test_env_values_that_are_not_strings_are_refused(make_request):
    with pytest.raises(ValueError, match="env"):
        make_request("true", env={"N": 3})


async def test_command_that_outlives_its_timeout_is_killed_with_its_process_group(runtime, make_request):
    sleep, marker = sleeper()
    result = await runtime.run(make_request(f"{sleep} & {sleep}", timeout=0.5))
    assert result.timed_out is True
    assert result.exit_code == 124
    assert wait_none_with(marker), "a background child survived the timeout"


async def test_backgrounded_child_holding_stdout_does_not_hold_the_run(runtime, make_request):
    sleep, marker = sleeper()
    result = await runtime.run(make_request(f"{sleep} & echo done", timeout=60))
    assert result.timed_out is False
    assert result.exit_code == 0
    assert result.stdout == "done\n"
    assert wait_none_with(marker), "the child that held stdout open was left running"


@pytest.mark.root
async def test_detached_child_that_left_the_process_group_is_killed_by_its_user(runtime, make_request):
    sleep, marker = sleeper()
    result = await runtime.run(make_request(f"setsid {sleep} & echo done", timeout=60))
    assert result.exit_code == 0
    assert "done" in result.stdout
    assert wait_none_with(marker), "a setsid child holding the pipes survived the run"


async def test_nonzero_exit_keeps_stdout_and_stderr(runtime, make_request):
    result = await runtime.run(make_request("echo partial; echo broken >&2; exit 3"))
    assert result.exit_code == 3
    assert result.stdout == "partial\n"
    assert result.stderr == "broken\n"
    assert result.timed_out is False


async def test_output_that_is_not_utf8_is_kept_with_replacement_characters(runtime, make_request):
    result = await runtime.run(make_request("printf 'ok \\xff\\xfe end'"))
    assert result.exit_code == 0
    assert result.stdout == "ok \ufffd\ufffd end"


async def test_stdout_beyond_its_cap_is_cut_with_a_marker(runtime, make_request):
    result = await runtime.run(make_request("head -c 100000 /dev/zero | tr '\\0' 'a'", limits=RunLimits(stdout_bytes=1000)))
    assert result.exit_code == 0
    assert result.stdout_truncated is True
    assert result.stdout.startswith("a" * 1000)
    assert "99000 more bytes were not kept" in result.stdout


async def test_resource_limits_are_applied_to_the_command(runtime, make_request):
    limits = RunLimits(open_files=64, file_size_bytes=1024 * 1024, cpu_seconds=30)
    result = await runtime.run(make_request("ulimit -n; ulimit -t; head -c 2000000 /dev/zero > $WORK_DIR/big", limits=limits))
    lines = result.stdout.splitlines()
    assert lines[:2] == ["64", "30"]
    assert result.exit_code != 0  # the write past the file-size limit fails
    assert os.path.getsize(workspace_dirs(runtime.work_root)[0] / "work" / "big") <= 1024 * 1024


async def test_memory_limit_stops_a_large_allocation(runtime, make_request):
    limits = RunLimits(memory_bytes=300 * 1024 * 1024)
    result = await runtime.run(make_request("python3 -c 'x = b\"x\" * (600 * 1024 * 1024)'", limits=limits))
    assert result.exit_code != 0
    if runtime.groups.available:  # the run's control group bounds its memory: killed there
        assert result.oom_killed, result.stderr
    else:  # nothing else does: each process's data limit is
        assert "MemoryError" in result.stderr


RESERVE = ("python3 -c 'import mmap; m = mmap.mmap(-1, 64 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, "
           "prot=0); print(\"reserved\")'")
"""What V8 and Chromium do at start: reserve a range far larger than the memory they will use (no access: 0)."""


async def test_a_program_may_reserve_more_address_space_than_its_memory(runtime, make_request):
    """Under the run's control group (root) or each process's data limit (without run groups): neither counts a
    reservation."""
    result = await runtime.run(make_request(RESERVE, limits=RunLimits(memory_bytes=300 * 1024 * 1024)))
    assert (result.exit_code, result.stdout) == (0, "reserved\n"), result.stderr


@pytest.mark.parametrize("cwd", ["/etc", "../../..", "$WORKSPACE_DIR/.."])
async def test_cwd_outside_the_workspace_is_refused(runtime, make_request, work_root, cwd):
    with pytest.raises(InvalidRunRequestError, match="outside the workspace") as info:
        await runtime.run(make_request("touch escaped", cwd=cwd))
    assert info.value.field == "cwd"
    assert not any(work_root.iterdir())


async def test_cwd_inside_the_workspace_is_used(runtime, make_request):
    result = await runtime.run(make_request("pwd", cwd="$WORK_DIR"))
    assert result.stdout.strip().endswith("/work")


async def test_same_workspace_id_keeps_work_and_out_between_runs(runtime, make_request):
    first = await runtime.run(make_request("echo 1 > $WORK_DIR/state; echo a > out/a.txt", workspace_id="session-1"))
    second = await runtime.run(make_request("cat $WORK_DIR/state out/a.txt", workspace_id="session-1"))
    assert first.exit_code == 0
    assert second.stdout == "1\na\n"
    assert len(workspace_dirs(runtime.work_root)) == 1


async def test_workspace_is_found_again_by_a_new_runtime_instance(work_root, make_request):
    await LocalWorkspaceRuntime(work_root).run(make_request("echo kept > $WORK_DIR/f", workspace_id="s2"))
    result = await LocalWorkspaceRuntime(work_root).run(make_request("cat $WORK_DIR/f", workspace_id="s2"))
    assert result.stdout == "kept\n"


async def test_different_workspace_ids_do_not_share_files(runtime, make_request):
    await runtime.run(make_request("echo private > $WORK_DIR/f", workspace_id="a"))
    result = await runtime.run(make_request("ls $WORK_DIR", workspace_id="b"))
    assert "f" not in result.stdout.split()
    assert len(workspace_dirs(runtime.work_root)) == 2


async def test_workspace_layout_matches_the_guide(runtime, make_request):
    await runtime.run(make_request("true", workspace_id="layout"))
    (ws,) = workspace_dirs(runtime.work_root)
    assert ws.name.startswith("ws_layout_")
    assert {p.name for p in ws.iterdir()} == {"metadata.json", "out", "runs", "skills", "work"}
    staged = ws / "skills" / "demo"
    assert os.readlink(staged / "work") == "../../work"
    assert os.readlink(staged / "out") == "../../out"
    assert os.readlink(staged / "inputs") == "../../work/inputs"
    assert (ws / "work" / "inputs").is_dir()
    runs = [p.name for p in (ws / "runs").iterdir() if not p.name.startswith(".")]
    assert len(runs) == 1 and runs[0].startswith("run_")


async def test_every_run_gets_its_own_run_directory_writable_by_the_command(runtime, make_request):
    seen = set()
    for _ in range(5):
        result = await runtime.run(make_request("touch $RUN_DIR/mine && echo $RUN_DIR", workspace_id="runs"))
        assert result.exit_code == 0, result.stderr
        seen.add(result.stdout.strip())
    assert len(seen) == 5
    assert all(os.path.basename(path).startswith("run_") for path in seen)


async def test_a_command_writes_next_to_itself_but_never_into_the_library(runtime, make_request, library):
    """The staged skill is a folder of the workspace holding the library's files: new files land there (the
    command's to remove again), the skill's own files can be neither changed nor removed, and ``cp -r`` of the
    folder gives real files."""
    before = {p: p.read_bytes() for p in (library / "demo").rglob("*") if p.is_file()}
    result = await runtime.run(make_request(
        "echo x > new-file; echo y >> SKILL.md; echo z > scripts/hello.sh; rm -f scripts/hello.sh; "
        "echo mine > scripts/mine.sh && rm scripts/mine.sh && echo again > scripts/mine.sh; cp -r . $WORK_DIR/copy; "
        "test -L $WORK_DIR/copy/scripts || test -L $WORK_DIR/copy/SKILL.md || echo real files"))
    denied = result.stderr.count("Permission denied") + result.stderr.count("Operation not permitted")
    assert denied == (3 if IS_ROOT else 2), result.stderr
    assert result.stdout == "real files\n"
    (ws,) = workspace_dirs(runtime.work_root)
    staged = ws / "skills" / "demo"
    assert (staged / "new-file").read_text() == "x\n" and (staged / "scripts" / "mine.sh").read_text() == "again\n"
    assert {p: p.read_bytes() for p in (library / "demo").rglob("*") if p.is_file()} == before
    assert not (library / "demo" / "new-file").exists()


@pytest.mark.root
async def test_library_stays_unchanged_even_when_the_host_runs_as_root(runtime, make_request, library):
    before = {p: p.read_bytes() for p in (library / "demo").rglob("*") if p.is_file()}
    result = await runtime.run(make_request(
        "echo pwned >> $SKILLS_DIR/demo/SKILL.md; rm -f scripts/hello.sh; echo pwned > $(readlink -f SKILL.md); "
        "chmod 777 $(readlink -f scripts); touch $(readlink -f scripts)/planted"
    ))
    assert result.stderr.count("Permission denied") == 2, result.stderr  # the staged folder's files are the library's
    after = {p: p.read_bytes() for p in (library / "demo").rglob("*") if p.is_file()}
    assert after == before and not (library / "demo" / "scripts" / "planted").exists()
    assert stat.S_IMODE((library / "demo" / "scripts").stat().st_mode) != 0o777


@pytest.mark.root
async def test_a_command_cannot_read_another_workspace(runtime, make_request):
    first = await runtime.run(make_request("echo secret > $WORK_DIR/secret; echo $WORK_DIR", workspace_id="victim"))
    victim_work = first.stdout.strip()
    result = await runtime.run(make_request(f"cat {victim_work}/secret; ls {victim_work}", workspace_id="attacker"))
    assert "secret\n" not in result.stdout
    assert "No such file or directory" in result.stderr  # not even there: a run's sandbox holds its workspace only


async def test_input_file_lands_in_work_inputs(runtime, make_request):
    request = make_request("cat inputs/notes.txt; cat $WORK_DIR/inputs/sub/b.bin | wc -c", inputs=[
        InputFile(name="notes.txt", content=b"hello notes"),
        InputFile(name="sub/b.bin", content=bytes(range(256))),
    ])
    result = await runtime.run(request)
    assert result.stdout == "hello notes256\n"


@pytest.mark.parametrize("name", ["../../x", "/etc/passwd", "a/../../x", "..", "", "a\\..\\x"])
async def test_input_destination_outside_work_inputs_is_refused(runtime, make_request, work_root, name):
    with pytest.raises(InvalidRunRequestError, match="must be a relative path inside work/inputs"):
        await runtime.run(make_request("true", inputs=[InputFile(name=name, content=b"x")]))
    assert not any(work_root.iterdir())


async def test_input_through_a_planted_symlink_is_refused(runtime, make_request, shared_dir):
    target = shared_dir / "outside"
    target.mkdir(mode=0o777)
    target.chmod(0o777)
    await runtime.run(make_request(f"ln -s {target} $WORK_DIR/inputs/evil", workspace_id="plant"))
    with pytest.raises(InvalidRunRequestError, match="'evil' is not a folder"):
        await runtime.run(make_request("true", workspace_id="plant", inputs=[InputFile(name="evil/x", content=b"x")]))
    assert list(target.iterdir()) == []


async def test_host_path_inputs_need_a_trusted_caller(runtime, make_request, shared_dir):
    host_file = shared_dir / "host.txt"
    host_file.write_text("from host")
    request = make_request("cat inputs/h.txt", inputs=[InputFile(name="h.txt", host_path=str(host_file))])
    with pytest.raises(InvalidRunRequestError, match="host paths are not allowed"):
        await runtime.run(request)
    result = await runtime.run(request, allow_host_paths=True)
    assert result.stdout == "from host"


async def test_input_over_the_size_cap_is_refused(work_root, make_request):
    runtime = LocalWorkspaceRuntime(work_root, input_file_bytes=1000)
    with pytest.raises(InvalidRunRequestError, match="the limit is 1000"):
        await runtime.run(make_request("true", inputs=[InputFile(name="big", content=b"x" * 1001)]))


async def test_cancel_stops_a_running_command(runtime, make_request):
    request = make_request("echo $$ > $WORK_DIR/pid; sleep 60", timeout=60)
    task = asyncio.create_task(runtime.run(request))
    for _ in range(500):
        if runtime.cancel(request.run_id):
            break
        await asyncio.sleep(0.01)
    result = await task
    assert "cancelled" in result.stderr
    assert result.exit_code != 0


async def test_each_phase_is_timed(runtime, make_request):
    result = await runtime.run(make_request("true"))
    assert result.timings.total_ms >= result.timings.exec_ms > 0
    assert result.worker_id
    assert result.duration_ms >= 0


def test_tests_know_whether_they_run_as_root():
    assert IS_ROOT == (os.geteuid() == 0)


async def test_a_work_root_that_does_not_exist_yet_is_created(shared_dir, make_request):
    runtime = LocalWorkspaceRuntime(shared_dir / "new" / "root")
    result = await runtime.run(make_request("echo ok"))
    assert result.stdout == "ok\n"


@pytest.mark.root
async def test_filling_a_workspace_past_its_disk_cap_fails_inside_it_only(shared_dir, make_request):
    runtime = LocalWorkspaceRuntime(shared_dir / "capped", disk_bytes=16 * 1024 * 1024)
    other = await runtime.run(make_request("echo fine > $WORK_DIR/a", workspace_id="neighbour"))
    result = await runtime.run(make_request(
        "head -c 64M /dev/zero > $WORK_DIR/fill; echo status=$?; echo still > out/ok.txt", workspace_id="filler",
        output_files=["out/ok.txt"], limits=RunLimits(file_size_bytes=1024**3)))
    assert "No space left on device" in result.stderr
    assert "status=1" in result.stdout
    assert other.exit_code == 0
    again = await runtime.run(make_request("cat $WORK_DIR/a; df -k $WORK_DIR | tail -1", workspace_id="neighbour"))
    assert again.stdout.startswith("fine\n")
    runtime.remove_workspace("filler")
    runtime.remove_workspace("neighbour")
    assert not [p for p in (shared_dir / "capped").iterdir() if p.name.startswith("ws_")]
    assert not list((shared_dir / "capped" / ".skillrun" / "disks").iterdir())


async def test_a_fifo_planted_at_an_input_name_is_replaced_not_opened(runtime, make_request):
    await runtime.run(make_request("mkfifo $WORK_DIR/inputs/data.txt", workspace_id="fifo"))
    result = await runtime.run(make_request("cat inputs/data.txt", workspace_id="fifo",
                                            inputs=[InputFile(name="data.txt", content=b"real data")]))
    assert result.stdout == "real data"


async def test_shell_in_the_request_env_does_not_choose_the_program(runtime, make_request):
    result = await runtime.run(make_request("echo $SHELL; ulimit -n", env={"SHELL": "/bin/echo"}))
    assert result.stdout.splitlines()[0].endswith("bash")
    assert result.stdout.splitlines()[1] == "1024"


def test_limits_have_ceilings(make_request):
    with pytest.raises(ValueError, match="stdout_bytes"):
        make_request("true", limits={"stdout_bytes": 10**12})


@pytest.mark.root
async def test_commands_have_no_network_unless_asked_and_allowed(shared_dir, make_request):
    import socket

    ensure_installed("slirp4netns", "slirp4netns")  # a network run's own namespace is connected through it
    listener = socket.socket()
    listener.bind((host_address(), 0))  # not loopback: a network run has a namespace of its own
    listener.listen()
    address, port = listener.getsockname()
    probe = f"python3 -c \"import socket; socket.create_connection(('{address}', {port}), timeout=2); print('connected')\""
    try:
        closed = LocalWorkspaceRuntime(shared_dir / "net")
        result = await closed.run(make_request(probe))
        assert "connected" not in result.stdout and result.exit_code != 0
        with pytest.raises(InvalidRunRequestError, match="network access is not allowed"):
            await closed.run(make_request(probe, network=True))
        opened = LocalWorkspaceRuntime(shared_dir / "net2", allow_network=True)
        assert (await opened.run(make_request(probe, network=True))).stdout == "connected\n"
    finally:
        listener.close()


@pytest.mark.root
async def test_a_command_that_leaves_its_process_group_still_dies_at_the_timeout(runtime, make_request):
    escape = (
        "cat > $RUN_DIR/escape.py <<'EOF'\n"
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.setpgid(0, 0)\n"
        "    time.sleep(60)\n"
        "else:\n"
        "    time.sleep(0.2)\n"
        "    os.setpgid(0, pid)\n"
        "    time.sleep(60)\n"
        "EOF\n"
        "exec python3 $RUN_DIR/escape.py"
    )
    result = await runtime.run(make_request(escape, timeout=1))
    assert result.timed_out


async def test_runs_proceed_side_by_side_on_one_event_loop(runtime, make_request):
    # The first run waits for a file only the second run writes: had the first held the loop, the second could not
    # start, and the first would time out.
    waiting = make_request("until [ -e $WORK_DIR/flag ]; do sleep 0.01; done; echo seen", workspace_id="side", timeout=20)
    writing = make_request("sleep 0.2; touch $WORK_DIR/flag", workspace_id="side")
    first, second = await asyncio.gather(runtime.run(waiting), runtime.run(writing))
    assert (first.exit_code, first.stdout, first.timed_out) == (0, "seen\n", False)
    assert second.exit_code == 0


async def test_cancel_from_another_thread_stops_a_running_command(runtime, make_request):
    request = make_request("sleep 60", timeout=60)
    task = asyncio.create_task(runtime.run(request))
    for _ in range(500):
        if await asyncio.to_thread(runtime.cancel, request.run_id):
            break
        await asyncio.sleep(0.01)
    result = await task
    assert result.exit_code != 0 and not result.timed_out
    assert "the run was cancelled" in result.stderr


async def test_a_library_change_between_warm_runs_is_staged_before_the_next(runtime, make_request, library):
    await runtime.run(make_request("true", workspace_id="edit"))
    await runtime.run(make_request("true", workspace_id="edit"))
    (library / "demo" / "NEW.md").write_text("added\n")
    result = await runtime.run(make_request("cat NEW.md", workspace_id="edit"))
    assert result.stdout == "added\n"
    (library / "demo" / "NEW.md").unlink()
    result = await runtime.run(make_request("ls", workspace_id="edit"))
    assert "NEW.md" not in result.stdout.split()


async def test_an_awaiting_caller_that_gives_up_leaves_no_process_behind(runtime, make_request):
    sleep, marker = sleeper()
    task = asyncio.create_task(runtime.run(make_request(f"exec {sleep}", workspace_id="gone", timeout=60)))
    for _ in range(500):
        if running_with(marker):
            break
        await asyncio.sleep(0.01)
    assert running_with(marker)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert wait_none_with(marker), "the command outlived its cancelled caller"


async def test_a_runtime_still_runs_after_close(work_root, make_request):
    runtime = LocalWorkspaceRuntime(work_root)
    await runtime.run(make_request("true", workspace_id="again"))
    await runtime.close()
    for _ in range(2):
        result = await runtime.run(make_request("echo again", workspace_id="again"))
        assert result.stdout == "again\n"
    await runtime.close()


LOOPBACK = """python3 -c '
import socket, threading
server = socket.create_server(("127.0.0.1", 0))
def answer():
    conn, _ = server.accept()
    conn.sendall(conn.recv(16).upper())
    conn.close()
threading.Thread(target=answer).start()
with socket.create_connection(server.getsockname()) as client:
    client.sendall(b"ping")
    print(client.recv(16).decode())
'"""
"""A server the run starts on its loopback, and the run's own request to it (as webapp tests do)."""


async def test_a_run_without_network_reaches_a_server_it_started_on_its_loopback(runtime, make_request):
    for _ in range(3):  # a sandbox of its own first; then, through a spawner, the workspace's held sandbox
        result = await runtime.run(make_request(LOOPBACK, workspace_id="loopback"))
        assert (result.exit_code, result.stdout) == (0, "PING\n"), result.stderr
        await runtime.idle()
    outside = await runtime.run(make_request("(echo > /dev/tcp/1.1.1.1/53) 2>&1; ip -o link 2>/dev/null | wc -l"))
    assert outside.exit_code == 0 and "unreachable" in outside.stdout, outside.stdout  # nothing but loopback


SOCKET_IN_TMPDIR = """python3 -c '
import os, socket, tempfile
folder = tempfile.mkdtemp(prefix="org.chromium.Chromium.")  # where Chromium puts its SingletonSocket
with socket.socket(socket.AF_UNIX) as listener:
    listener.bind(os.path.join(folder, "SingletonSocket"))
print("bound", len(folder))
' && test "$TMPDIR" -ef "$RUN_DIR" && echo same-folder"""
"""A socket made in the run's TMPDIR as Chromium makes its own: the path must fit a socket's 108 bytes."""


async def test_a_socket_made_in_tmpdir_fits_and_lands_in_the_run_folder(runtime, make_request):
    for _ in range(2):  # a sandbox of its own, then (through a spawner) the workspace's held sandbox
        result = await runtime.run(make_request(SOCKET_IN_TMPDIR, workspace_id="socket"))
        assert result.exit_code == 0, result.stderr
        assert result.stdout.startswith("bound") and result.stdout.endswith("same-folder\n"), result.stdout
        await runtime.idle()


async def test_the_runs_user_is_a_user_with_a_home_and_python_is_on_its_path(runtime, make_request):
    look = ("whoami; id -un; id -gn; getent passwd $(id -u) | cut -d: -f1,6,7; echo \"$HOME\"; "
            "python -c 'import sys; print(sys.version_info[0])'; test -w \"$HOME\" && echo home-writable; "
            "getent passwd root | cut -d: -f1")
    for _ in range(2):  # a sandbox of its own, then (through a spawner) the workspace's held sandbox
        result = await runtime.run(make_request(look, workspace_id="who"))
        assert result.exit_code == 0, result.stderr
        lines = result.stdout.splitlines()
        workspace = runtime.workspaces.find("who")
        if IS_ROOT:
            uid, home = workspace.uid, str(workspace.work_dir)
        else:  # a normal account's runs run as the account (named for its id), one home for all: the alias's work/
            uid, home = os.getuid(), f"{defaults.SANDBOX_WORKSPACE_ALIAS}/work"
        assert lines[:3] == [f"skillrun-{uid}"] * 3
        assert lines[3] == f"skillrun-{uid}:{home}:/bin/bash"
        assert lines[4].startswith(str(workspace.path / "runs")) and lines[5] == "3"
        assert lines[6:] == ["home-writable", "root"]  # the host's entries are there too
        await runtime.idle()
    files = runtime.identities.folder / str(uid)
    before = {name: (files / name).read_bytes() for name in ("passwd", "group")}
    changed = await runtime.run(make_request("echo x >> /etc/passwd || echo x >> /etc/group", workspace_id="who"))
    # Root's files to the workspace's own user; a normal account's are on a read-only mount of its sandbox.
    assert changed.exit_code != 0 and ("Permission denied" if IS_ROOT else "Read-only file system") in changed.stderr
    assert {name: (files / name).read_bytes() for name in ("passwd", "group")} == before
