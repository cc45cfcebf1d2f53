"""Attacks on two changes: launchers reading their request from a memfd once a byte on a pipe says it is there
(``worker.sandbox.launcher``), and waits woken by a run's ending events only (``RunWaiters.watch(ends_only=True)``,
``BaseDispatcher.wait``), with a look reading a run's heartbeat only when it is started
(``AsyncRunReader.get_beating``).

The launcher attacks run real launchers: with the local runtime as root (spawners off, so every sandboxed run after
the first is launched; a spy on ``Launcher.launch`` checks that it was), and alone, with a real bash and a group
that takes nothing, for what bwrap would otherwise hide. The wait attacks use the real ``QueueDispatcher`` on a real
Redis, with the waiters' periodic look pushed out to an hour: a wait that returns was woken, or reached its own
timeout. Deadlines here only guard against hangs. Each hole found is kept as a test of the safe behaviour.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import hashlib
import json
import os
import re
import shlex
import signal
import textwrap
import uuid
from pathlib import Path

import pytest

from orchestrator.dispatch import QueueDispatcher
from orchestrator.dispatch import base as dispatch_base
from orchestrator.dispatch import queue as dispatch_queue
from tests.integration import conftest as integration_fixtures
from tests.integration.test_queue import burst
from tests.services import unavailable
from worker.contract import RunRequest, RunResult, SkillRef
from worker.errors import InvalidRunRequestError
from worker.run_store import Attempt, RunStatus
from worker.runtimes.local.runtime import LocalWorkspaceRuntime
from worker.sandbox import launcher as launcher_module
from worker.sandbox.launcher import Launcher
from worker.validation import MAX_COMMAND_CHARS, validate_request

BASH = "/usr/bin/bash"
PYTHON = "/usr/bin/python3"
SESSION = uuid.uuid4().hex[:8]
pytestmark = pytest.mark.root

HANG_GUARD_SECONDS = 20.0
"""Longest any one step is waited for: only to turn a hang into a failure, never a measure."""


def ws(name: str) -> str:
    return f"{name}-{SESSION}"


def _py(code: str) -> str:
    return f"exec python3 -c {shlex.quote(textwrap.dedent(code))}"


def _worker_fds() -> dict[int, str]:
    """This process's descriptors and what each is."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return found


def _memfds() -> list[int]:
    return [fd for fd, target in _worker_fds().items() if "memfd:skillrun-launch" in target]


# --- Launchers in the local runtime --------------------------------------------------------------------------------


@pytest.fixture
async def launching(work_root, monkeypatch):
    """A local runtime whose sandboxed runs after the first are all launched (no spawners, so no ready shells),
    and the list of launches (argv, cwd, launcher) the runs made."""
    launches: list[tuple[list[str], str, Launcher]] = []
    launch = Launcher.launch

    def spied(self, argv, cwd):
        launches.append((list(argv), cwd, self))
        return launch(self, argv, cwd)

    monkeypatch.setattr(Launcher, "launch", spied)
    async with LocalWorkspaceRuntime(work_root, spawners="off") as runtime:
        yield runtime, launches


async def _launchers_waiting(runtime: LocalWorkspaceRuntime, make_request) -> None:
    await runtime.run(make_request("true", workspace_id=ws("warm-up")))  # sets up the run groups and launchers
    await runtime.idle()
    if runtime.groups.missing is not None:
        unavailable(f"no run groups on this host: {runtime.groups.missing}")
    assert runtime.groups.launchers is not None and len(runtime.groups.launchers.waiting) == \
        launcher_module.SPARE_LAUNCHERS, "no launcher waits for a run"


SEE_DESCRIPTORS = _py("""
    import json, os
    own = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            own[name] = os.readlink("/proc/self/fd/" + name)
        except OSError:
            pass  # the listing's own descriptor, closed by now
    memfds, launchers = [], []
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            for name in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if "memfd" in os.readlink(f"/proc/{pid}/fd/{name}"):
                        memfds.append(f"{pid}/{name}")
                except OSError:
                    pass
        except OSError:
            pass
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if b"map" + b"file -d" in cmdline.read():  # a launcher's script (not this one's text)
                    launchers.append(pid)
        except OSError:
            pass
    print(json.dumps({"own": own, "memfds": memfds, "launchers": launchers}))
""")


async def test_a_launched_command_holds_nothing_of_its_launcher_and_sees_no_other_launchers_request(
    launching, make_request
):
    runtime, launches = launching
    await _launchers_waiting(runtime, make_request)
    waiting = runtime.groups.launchers.waiting
    # Not vacuous: the launchers waiting meanwhile hold their requests' memfds, as root, on this host
    for launcher in waiting:
        assert "memfd:skillrun-launch" in os.readlink(f"/proc/{launcher.proc.pid}/fd/{launcher._request}")
    before = len(launches)
    result = await runtime.run(make_request(SEE_DESCRIPTORS, workspace_id=ws("fds")))
    assert len(launches) == before + 1, "the run was not launched"
    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout)
    assert sorted(seen["own"], key=int) == ["0", "1", "2"], seen["own"]
    assert seen["own"]["0"] == "/dev/null" and all(seen["own"][fd].startswith("pipe:") for fd in ("1", "2"))
    assert seen["memfds"] == [] and seen["launchers"] == [], seen


async def test_a_launched_command_gets_exactly_its_command_line_in_an_odd_folder(launching, make_request):
    runtime, launches = launching
    await _launchers_waiting(runtime, make_request)
    await runtime.run(make_request("true", workspace_id=ws("odd")))
    folder_name = "-odd\n dir \x01\x7f é"
    folder = runtime.workspaces.find_known(ws("odd")).path / "work" / folder_name
    folder.mkdir(mode=0o755)
    filler = "".join(f"# line {i} -n -- -e '\"\\ \t\x01\x7f $(id) * é☃\n" for i in range(2_500))  # ~100 KB
    look = "python3 -c " + shlex.quote(textwrap.dedent("""
        import hashlib, os
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
            print(repr(os.getcwd()), hashlib.sha256(cmdline.read()).hexdigest())
    """))  # not exec'd: its parent is the command's bash
    command = f"-x() {{ :; }}\n{filler}\n{look}\nexit $?\n"  # look not last: bash would exec it
    before = len(launches)
    result = await runtime.run(make_request(command, workspace_id=ws("odd"), cwd=f"$WORK_DIR/{folder_name}"))
    assert len(launches) == before + 1, "the run was not launched"
    assert result.exit_code == 0, result.stderr[-2000:]
    argv, cwd, _ = launches[-1]
    assert cwd == str(folder)
    bash_argv = argv[-3:]
    assert bash_argv[1] == "-c" and bash_argv[2].endswith(command)
    printed_cwd, digest = result.stdout.rsplit(" ", 1)
    assert ast.literal_eval(printed_cwd) == str(folder)
    assert digest.strip() == hashlib.sha256(b"".join(a.encode() + b"\0" for a in bash_argv)).hexdigest()


async def test_the_worker_holds_no_more_descriptors_after_many_launched_runs(launching, make_request):
    runtime, launches = launching
    earlier = set(_memfds())  # of other tests' runtimes, if any
    await _launchers_waiting(runtime, make_request)
    for i in range(6):  # every workspace's folder made, its groups kept (two an owner)
        await runtime.run(make_request("true", workspace_id=ws(f"many-{i % 3}")))
        await runtime.idle()
    seen = _worker_fds()
    count, before = len(seen), len(launches)
    for i in range(12):
        result = await runtime.run(make_request("echo $((6 * 7))", workspace_id=ws(f"many-{i % 3}")))
        assert (result.exit_code, result.stdout) == (0, "42\n")
        await runtime.idle()
    assert len(launches) == before + 12
    after = _worker_fds()
    assert len(after) == count, {fd: target for fd, target in after.items() if seen.get(fd) != target}
    waiting = {launcher._request for launcher in runtime.groups.launchers.waiting}
    assert set(_memfds()) - earlier == waiting  # the waiting launchers' requests, and no more


async def test_a_launch_into_a_launcher_killed_meanwhile_leaks_nothing_in_the_worker(
    launching, make_request, monkeypatch
):
    runtime, launches = launching
    await _launchers_waiting(runtime, make_request)
    doomed: list[tuple[int, int]] = []
    launch = Launcher.launch  # the fixture's spy

    def killed_first(self, argv, cwd):
        os.killpg(self.proc.pid, signal.SIGKILL)
        os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)  # dead (not reaped): its pipes' ends are gone
        doomed.extend((fd, os.fstat(fd).st_ino) for fd in (self.start.info_r, self.start.block_w))
        return launch(self, argv, cwd)

    monkeypatch.setattr(Launcher, "launch", killed_first)
    before = len(launches)
    for _ in range(2):  # each run starts its sandbox without the dead launcher
        result = await runtime.run(make_request("echo hi", workspace_id=ws("doomed")))
        assert (result.exit_code, result.stdout) == (0, "hi\n"), result.stderr
        await runtime.idle()
    assert len(launches) == before + 2 and len(doomed) == 4, "the runs were not launched"
    leaked = []
    for fd, inode in doomed:
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino == inode:
                leaked.append(fd)
    assert leaked == [], f"still open in the worker: {[(fd, _worker_fds().get(fd)) for fd in leaked]}"


async def test_a_command_holding_a_nul_is_not_run_cut_short_by_a_launcher(launching, make_request):
    runtime, launches = launching
    await _launchers_waiting(runtime, make_request)
    before = len(launches)
    with pytest.raises(InvalidRunRequestError, match="NUL"):
        await runtime.run(make_request("echo before\0echo after; echo $0", workspace_id=ws("nul")))
    assert len(launches) == before and runtime.workspaces.find(ws("nul")) is None


def _longest_command() -> str:
    """A command as long as validation allows, of 4-byte characters (512 KiB: four times one argument's cap), that
    says whether it ran whole and saw no positional parameter."""
    head, tail = 'echo "start $# $1"\n: \'', '\'\necho "end $((6 * 7))"\n'
    return head + "😀" * (MAX_COMMAND_CHARS - len(head) - len(tail)) + tail


async def test_a_command_as_long_as_validation_allows_runs_whole_in_a_launched_sandbox(launching, make_request):
    runtime, launches = launching
    await _launchers_waiting(runtime, make_request)
    request = make_request(_longest_command(), workspace_id=ws("long"))
    validate_request(request)
    before = len(launches)
    result = await runtime.run(request)
    assert len(launches) == before + 1, "the run was not launched"
    assert (result.exit_code, result.stdout) == (0, "start 0 \nend 42\n"), result.stderr[-500:]


async def test_a_command_as_long_as_validation_allows_runs_whole_through_a_spawner(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root) as runtime:
        for _ in range(2):  # its sandbox's first run, then one the workspace's spawner starts
            result = await runtime.run(make_request(_longest_command(), workspace_id=ws("long-spawned")))
            assert (result.exit_code, result.stdout) == (0, "start 0 \nend 42\n"), result.stderr[-500:]


# --- Launchers alone: a real bash, a group that takes nothing ------------------------------------------------------


class _NoGroup:
    """A stand-in for a launcher's run group: the launcher is placed nowhere."""

    def add(self, pid: int) -> None:
        pass


def _script_fds(launcher: Launcher) -> tuple[int, int]:
    """The numbers the launcher's bash reads its go byte and its request on."""
    script = launcher.proc.args[-1]
    return int(re.search(r"<&(\d+)", script).group(1)), int(re.search(r"-u (\d+)", script).group(1))


REPORT = textwrap.dedent("""
    import os, sys
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink("/proc/self/fd/" + name)
        except OSError:
            pass
    with open("/proc/self/cmdline", "rb") as cmdline:
        sys.stdout.buffer.write(repr((os.getcwd(), fds)).encode() + b"\\n" + cmdline.read())
""")


def test_a_launcher_execs_exactly_the_argv_and_folder_sent_and_closes_its_request(tmp_path):
    folder = tmp_path / "-odd\n dir \x01\x7f"
    folder.mkdir()
    odd = ["", "-n", "--", "-e", "a\nb", "\t lead", "\x01", "\x7f", "\x01\x01", "a\x7fb", "\x01\x7f\x01", "é☃",
           "$(id)", "*", "'\"\\", *(c * 100_000 for c in "xyzw"), ""]  # ~400 KB: ten times a pipe's buffer
    argv = [PYTHON, "-c", REPORT, *odd]
    launcher = Launcher(BASH, _NoGroup())
    try:
        go, request = _script_fds(launcher)
        launcher.launch(argv, str(folder))
        assert launcher._go == launcher._request == -1  # the worker's copies are closed
        out, err = launcher.proc.communicate(timeout=HANG_GUARD_SECONDS)
    finally:
        launcher.discard()
    assert launcher.proc.returncode == 0, err
    head, _, cmdline = out.partition(b"\n")
    cwd, fds = ast.literal_eval(head.decode())
    assert cmdline == b"".join(part.encode() + b"\0" for part in argv)
    assert cwd == str(folder)
    # its own three, and the sandbox's ends that bwrap is to take: neither the go pipe nor the request
    assert sorted(fds) == sorted({0, 1, 2, *launcher.fds}) and go not in fds and request not in fds, fds
    assert not any("memfd" in target for target in fds.values()), fds


def test_a_launcher_runs_nothing_when_its_go_pipe_closes_without_the_byte(tmp_path):
    # The worker wrote the request and died before the go byte: its end of the pipe closes, the launcher must not
    # take the request it finds in the file
    marker = tmp_path / "ran"
    launcher = Launcher(BASH, _NoGroup())
    try:
        request = b"".join(part.encode() + b"\0" for part in ["/", "/usr/bin/touch", str(marker)])
        assert os.pwrite(launcher._request, request, 0) == len(request)
        os.close(launcher._go)
        launcher._go = -1
        out, err = launcher.proc.communicate(timeout=HANG_GUARD_SECONDS)
    finally:
        launcher.discard()
    assert launcher.proc.returncode == 1 and out == b"" and err == b""
    assert not marker.exists()


def test_discarded_and_dead_launchers_give_back_every_descriptor_of_the_worker():
    seen = _worker_fds()
    unused: list[Launcher] = []
    try:
        unused.extend(Launcher(BASH, _NoGroup()) for _ in range(3))
        assert sorted(set(_memfds()) - set(seen)) == sorted(launcher._request for launcher in unused)
        for launcher in unused:
            launcher.discard()
        assert [launcher.proc.returncode for launcher in unused] == [-signal.SIGKILL] * 3
        dead = Launcher(BASH, _NoGroup())
        unused.append(dead)
        os.killpg(dead.proc.pid, signal.SIGKILL)
        os.waitid(os.P_PID, dead.proc.pid, os.WEXITED | os.WNOWAIT)
        with pytest.raises(BrokenPipeError):
            dead.launch(["/usr/bin/true"], "/")
        assert dead._go == dead._request == -1  # the request's ends are closed even so
        dead.discard()
    finally:
        for launcher in unused:
            launcher.discard()  # again: a no-op for those already discarded
    new = {fd: target for fd, target in _worker_fds().items() if seen.get(fd) != target}
    assert new == {}, new


# --- Waits on a real Redis -----------------------------------------------------------------------------------------


LIBRARY = Path(__file__).resolve().parents[2] / "skills"
worker_env = integration_fixtures.worker_env
"""A worker process's environment (a fixture of the integration tests)."""


@pytest.fixture
def no_idle_looks(monkeypatch):
    """A waiter looks again only when woken (or at its own timeout): its periodic look is an hour away."""
    monkeypatch.setattr(dispatch_base, "_look_after", lambda: 3600.0)


@pytest.fixture
async def dispatchers(redis_url, no_idle_looks):
    """Two API processes' dispatchers on one Redis (the second acts for "another process")."""
    made = [QueueDispatcher(redis_url, max_attempts=2), QueueDispatcher(redis_url, max_attempts=2)]
    yield made
    for dispatcher in made:
        await dispatcher.close()


def _request(command: str = "true") -> RunRequest:
    return RunRequest(skill=SkillRef(name="python-math", root=str(LIBRARY), path="python-math"), command=command)


def _result(run_id: str, stdout: str = "") -> RunResult:
    return RunResult(exit_code=0, stdout=stdout, run_id=run_id, workspace_id="w", runtime="local")


async def _subscribed(dispatcher: QueueDispatcher) -> None:
    """Start the dispatcher's change subscription and return once Redis counts it."""
    dispatcher.start()
    for _ in range(int(HANG_GUARD_SECONDS / 0.02)):
        [(_, subscribers)] = dispatcher.redis.pubsub_numsub(dispatcher.store.keys.changes)
        if subscribers:
            await asyncio.sleep(0.05)  # its wake-up of every waiter (on subscribing) has passed
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the change subscription never started")


async def _blocked_wait(dispatcher: QueueDispatcher, run_id: str, timeout: float = 3600.0) -> asyncio.Task:
    """A wait for ``run_id``, returned once it has looked and sleeps on its change event."""
    await _subscribed(dispatcher)
    task = asyncio.ensure_future(dispatcher.wait(run_id, timeout))
    for _ in range(int(HANG_GUARD_SECONDS / 0.01)):
        assert not task.done(), f"the wait returned at once: {task.result()}"
        if any(change._waiters for change in dispatcher.waiters._waiting.get(run_id, ())):
            return task
        await asyncio.sleep(0.01)
    raise AssertionError("the wait never slept")


async def _returned(task: asyncio.Task):
    return await asyncio.wait_for(task, HANG_GUARD_SECONDS)


async def _messages_handled(dispatcher: QueueDispatcher) -> None:
    """Return once the listener has handled every message published so far (they are handled in order): a sentinel
    run's change wakes a plain watcher of it."""
    sentinel = f"sentinel-{uuid.uuid4().hex}"
    with dispatcher.watch(sentinel) as changed:
        dispatcher.redis.publish(dispatcher.store.keys.changes, f"{sentinel} started")
        await asyncio.wait_for(changed.wait(), HANG_GUARD_SECONDS)


async def test_a_wait_returns_a_run_cancelled_while_queued_by_another_process(dispatchers):
    waiting, other = dispatchers
    record = await waiting.submit(_request())
    task = await _blocked_wait(waiting, record.id)
    await other.cancel(record.id)
    done = await _returned(task)
    assert done.status == RunStatus.CANCELLED and done.started_at is None


async def test_a_wait_sleeps_through_a_lost_workers_retry_and_returns_the_retried_attempts_end(dispatchers):
    waiting, other = dispatchers
    store = waiting.store
    record = await waiting.submit(_request())
    store.start(record.id, "lost-worker")
    task = await _blocked_wait(waiting, record.id)
    store.redis.delete(store.keys.part(record.id, "heartbeat"))  # its worker died
    assert await other.sweep_lost() == 1  # another API process retries it
    second = Attempt.of(store.start(record.id, "next-worker"))
    await _messages_handled(waiting)
    [change] = waiting.waiters._waiting[record.id]
    assert not change.is_set() and not task.done()  # a retry and a start are no end
    store.finish(record.id, _result(record.id, "second attempt"), second)
    done = await _returned(task)
    assert (done.status, done.attempts, done.result.stdout) == (RunStatus.FINISHED, 2, "second attempt")
    assert [e.type for e in await waiting.events(record.id)] == ["queued", "started", "retried", "started", "finished"]


async def test_a_wait_returns_a_run_the_lost_run_sweep_failed(redis_url, no_idle_looks, monkeypatch):
    monkeypatch.setattr(dispatch_queue, "SWEEP_SECONDS", 0.2)
    dispatcher = QueueDispatcher(redis_url, max_attempts=1)
    try:
        store = dispatcher.store
        record = await dispatcher.submit(_request())
        store.start(record.id, "lost-worker")
        task = await _blocked_wait(dispatcher, record.id)  # its look saw it beating
        store.redis.delete(store.keys.part(record.id, "heartbeat"))
        done = await _returned(task)  # woken by the sweep's "failed"
        assert done.status == RunStatus.FAILED and "stopped beating" in done.error
        assert [e.type for e in await dispatcher.events(record.id)] == ["queued", "started", "failed"]
    finally:
        await dispatcher.close()


async def test_a_wait_returns_an_end_published_while_its_subscription_was_down(dispatchers):
    waiting, _ = dispatchers
    store = waiting.store
    record = await waiting.submit(_request())
    attempt = Attempt.of(store.start(record.id, "w"))
    task = await _blocked_wait(waiting, record.id)
    assert waiting.redis.client_kill_filter(_type="pubsub") >= 1  # the subscription drops
    [(_, subscribers)] = waiting.redis.pubsub_numsub(store.keys.changes)
    assert subscribers == 0
    store.finish(record.id, _result(record.id, "ended unheard"), attempt)  # published to nobody
    done = await _returned(task)  # the subscription came back, and woke every waiter
    assert (done.status, done.result.stdout) == (RunStatus.FINISHED, "ended unheard")
    # and it hears the next ends
    later = await waiting.submit(_request())
    later_task = await _blocked_wait(waiting, later.id)
    await waiting.cancel(later.id)
    assert (await _returned(later_task)).status == RunStatus.CANCELLED


async def test_a_wait_with_a_timeout_returns_the_run_as_it_stands_at_its_timeout(dispatchers):
    waiting, _ = dispatchers
    store = waiting.store
    queued = await waiting.submit(_request())
    started = await waiting.submit(_request())
    store.start(started.id, "w")
    tasks = [await _blocked_wait(waiting, run_id, timeout=1.0) for run_id in (queued.id, started.id)]
    for run_id in (queued.id, started.id):  # changes that end nothing, and one of unknown kind
        waiting.redis.publish(store.keys.changes, f"{run_id} cancelling")
        waiting.redis.publish(store.keys.changes, run_id)
    records = [await _returned(task) for task in tasks]
    assert [(r.id, r.status) for r in records] == [(queued.id, RunStatus.QUEUED), (started.id, RunStatus.STARTED)]
    assert (await _returned(asyncio.ensure_future(waiting.wait(queued.id, 0)))).status == RunStatus.QUEUED


@pytest.mark.parametrize("message", ["{id}", "{id} ", "{id} no-such-event", "{id}  finished"])
async def test_a_wait_sees_an_end_announced_by_a_message_of_any_shape_or_at_the_latest_at_its_timeout(
    dispatchers, message
):
    # The record ends without the store's own announcement; then a message that names the run comes. One of
    # unknown kind wakes the wait at once; one saying another event does not, and the wait answers at its timeout
    # — either way with the ended record, never the one before.
    waiting, _ = dispatchers
    store = waiting.store
    record = await waiting.submit(_request())
    task = await _blocked_wait(waiting, record.id, timeout=2.0)
    ended = store.get(record.id).model_copy(update={"status": RunStatus.FINISHED, "result": _result(record.id, "x")})
    store.redis.set(store.keys.record(record.id), ended.model_dump_json())
    waiting.redis.publish(store.keys.changes, message.format(id=record.id))
    done = await _returned(task)
    assert (done.status, done.result.stdout) == (RunStatus.FINISHED, "x")


# One change message whose text is not UTF-8 once ended the change subscription for good (the listener decoded it
# whole and died of the UnicodeDecodeError): it is read with errors replaced now
async def test_a_garbled_change_message_does_not_deafen_the_waits(redis_url, no_idle_looks):
    waiting = QueueDispatcher(redis_url)
    try:
        store = waiting.store
        record = await waiting.submit(_request())
        attempt = Attempt.of(store.start(record.id, "w"))
        task = await _blocked_wait(waiting, record.id)
        waiting.redis.publish(store.keys.changes, record.id.encode() + b" \xff\xfe")
        store.finish(record.id, _result(record.id, "heard"), attempt)
        try:
            done = await asyncio.wait_for(task, HANG_GUARD_SECONDS)
        except TimeoutError:
            listen = waiting._background["listen"]
            pytest.fail(f"the wait never woke; the listener: {listen.exception() if listen.done() else 'running'!r}")
        assert done.status == RunStatus.FINISHED
    finally:
        closing = await asyncio.gather(waiting.close(), return_exceptions=True)
        with contextlib.suppress(Exception):  # what a failed close left open
            await waiting.reader.close()
            waiting.redis.close()
    assert closing == [None], f"close() raised {closing[0]!r}"


async def test_a_look_whose_run_ends_between_its_record_and_heartbeat_reads_returns_the_end(dispatchers):
    waiting, _ = dispatchers
    store = waiting.store
    record = await waiting.submit(_request())
    attempt = Attempt.of(store.start(record.id, "w"))
    depths = await waiting.queue_depths()
    exists = waiting.reader.redis.exists

    async def ended_meanwhile(*keys):
        await asyncio.to_thread(store.finish, record.id, _result(record.id, "done"), attempt)
        return await exists(*keys)

    waiting.reader.redis.exists = ended_meanwhile
    try:
        looked = await waiting.look(record.id)
    finally:
        del waiting.reader.redis.exists
    assert (looked.status, looked.attempts, looked.result.stdout) == (RunStatus.FINISHED, 1, "done")
    assert [e.type for e in await waiting.events(record.id)] == ["queued", "started", "finished"]
    assert await waiting.queue_depths() == depths  # nothing enqueued again


async def test_a_look_whose_run_is_retried_between_its_two_reads_enqueues_no_second_retry(dispatchers):
    waiting, other = dispatchers
    store = waiting.store
    record = await waiting.submit(_request())
    store.start(record.id, "lost-worker")
    depths = await waiting.queue_depths()
    exists = waiting.reader.redis.exists

    async def retried_meanwhile(*keys):
        store.redis.delete(store.keys.part(record.id, "heartbeat"))
        assert await other.sweep_lost() == 1
        return await exists(*keys)

    waiting.reader.redis.exists = retried_meanwhile
    try:
        looked = await waiting.look(record.id)
    finally:
        del waiting.reader.redis.exists
    assert (looked.status, looked.attempts) == (RunStatus.QUEUED, 1)
    assert [e.type for e in await waiting.events(record.id)] == ["queued", "started", "retried"]
    assert (await waiting.queue_depths())["local"] == depths["local"] + 1  # the one retry, not two


async def test_a_wait_is_woken_by_the_end_a_real_worker_process_publishes(dispatchers, redis_url, worker_env):
    waiting, _ = dispatchers
    record = await waiting.submit(_request("echo from a worker; echo to stderr >&2"))
    task = await _blocked_wait(waiting, record.id)
    await asyncio.to_thread(burst, redis_url, worker_env)
    done = await _returned(task)
    assert (done.status, done.result.stdout, done.result.stderr) == (RunStatus.FINISHED, "from a worker\n",
                                                                     "to stderr\n")
