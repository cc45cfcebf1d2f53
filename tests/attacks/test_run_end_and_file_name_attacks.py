"""Attacks on four changes: a run's control group counted empty by two cheap reads (``RunCgroup.empty``), a run of
another skill getting a sandbox of its own while the held one is busy, run file names matching any character
(``orchestrator.api.file_paths``) and the 404 an MCP call of an ended session gets instead of the SDK's 500."""

from __future__ import annotations

import asyncio
import os
import shlex
import urllib.parse
import uuid

import httpx
import pytest

from tests.attacks.console_fixtures import asgi
from tests.attacks.held import PID_NAMESPACE, py, run, warm_held
from tests.attacks.test_mcp_attacks import (  # noqa: F401 - shared fixtures
    _post_in_background,
    api,
    secrets,
    server_library,
    start_api,
)
from tests.conftest import write_skill
from tests.orchestrator.test_api_runs import client  # noqa: F401 - shared fixture
from tests.processes import _within, running_with, sleeper, wait_none_with
from worker.contract import SkillRef

SESSION = uuid.uuid4().hex[:8]


def ws(name: str) -> str:
    return f"runend-{name}-{SESSION}"


def threads_with(argument: str) -> list[str]:
    """Host ``pid/tid`` of every live thread with ``argument`` on its command line. A thread-group leader that
    exited while its other threads run is a zombie with no memory (its own ``cmdline`` is empty, so
    ``running_with`` misses it); its live threads still show the command line."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            tids = os.listdir(f"/proc/{entry.name}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{entry.name}/task/{tid}/cmdline", "rb") as f:
                    if argument.encode() not in f.read().split(b"\0"):
                        continue
                with open(f"/proc/{entry.name}/task/{tid}/stat") as f:
                    if f.read().split(")")[-1].split()[0] not in ("Z", "X"):
                        found.append(f"{entry.name}/{tid}")
            except (OSError, IndexError):
                continue
    return found


def none_threads_with(argument: str, seconds: float) -> bool:
    return _within(seconds, lambda: not threads_with(argument))


# ---- 1. a run's control group counted empty while something lives -------------------------------------------------

LEADER_EXITS = """
    import ctypes, os, sys, threading, time
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    beat = os.path.join(os.environ["WORK_DIR"], "beat")
    def work():
        while True:
            with open(beat, "a") as f:
                f.write("x")
            time.sleep(0.05)
    for _ in range(3):
        threading.Thread(target=work).start()
    time.sleep(0.2)
    ctypes.CDLL(None).pthread_exit(None)
    """


@pytest.mark.root
async def test_a_process_whose_leader_exited_keeps_its_run_group_from_counting_as_empty(held, make_request):
    # The main thread leaves with pthread_exit (a zombie leader, cmdline empty) while three threads go on: the
    # group's procs list and task count must still show it, and the run's end must kill it.
    await warm_held(held, make_request, ws("leader"))
    workspace = held.workspaces.find(ws("leader"))
    marker = f"leader-{uuid.uuid4().hex}"
    command = f"{py(LEADER_EXITS)} {marker} </dev/null >/dev/null 2>&1; sleep 0.5; echo started"
    result = await run(held, make_request, command, ws("leader"))
    assert result.stdout == "started\n", result
    assert none_threads_with(marker, 5), f"threads of a run outlived it: {threads_with(marker)}"
    beat = workspace.work_dir / "beat"
    size = beat.stat().st_size
    await asyncio.sleep(0.5)
    assert beat.stat().st_size == size, "a thread of the run still writes after its end"
    found = await run(held, make_request, "cat /proc/[0-9]*/task/*/cmdline 2>/dev/null | tr '\\0' '\\n' | "
                      f"grep -cx '[{marker[0]}]{marker[1:]}' || true", ws("leader"))  # never grep's own line
    assert found.stdout.strip() == "0", found


@pytest.mark.root
async def test_a_chain_of_processes_forking_as_the_run_ends_does_not_survive_it(held, make_request):
    # Each process forks its successor and exits, many times a second: at every moment one lives, briefly.
    await warm_held(held, make_request, ws("chain"))
    marker = f"chain-{uuid.uuid4().hex}"
    chain = py("""
        import os, time
        os.setsid()
        while True:
            if os.fork():
                os._exit(0)
            time.sleep(0.001)
        """)
    command = f"({chain} {marker} </dev/null >/dev/null 2>&1 &); sleep 0.3; echo started"
    result = await run(held, make_request, command, ws("chain"))
    assert result.stdout == "started\n", result
    assert await asyncio.to_thread(wait_none_with, marker, 5), running_with(marker)
    await asyncio.sleep(0.3)
    assert not running_with(marker)
    found = await run(held, make_request, f"ps -eo args= | grep -c -- '{marker}$' || true", ws("chain"))
    assert found.stdout.strip() == "0", found


@pytest.mark.root
async def test_many_detached_sleepers_a_stopped_process_and_a_threaded_zombie_leader_all_die_with_the_run(held, make_request):
    # Everything at once, exiting the run's shell immediately so the group is looked at while they settle.
    await warm_held(held, make_request, ws("many"))
    sleep, marker = sleeper()
    leader_marker = f"many-{uuid.uuid4().hex}"
    stopped = py("""
        import os, signal
        if os.fork() == 0:
            os.setsid()
            os.kill(os.getpid(), signal.SIGSTOP)
        """)
    command = (f"for i in 1 2 3 4 5 6 7 8; do (setsid {sleep} </dev/null >/dev/null 2>&1 &); done; "
               f"{stopped} {marker} </dev/null >/dev/null 2>&1; "
               f"{py(LEADER_EXITS)} {leader_marker} </dev/null >/dev/null 2>&1; exit 0")
    result = await run(held, make_request, command, ws("many"))
    assert result.exit_code == 0, result
    assert await asyncio.to_thread(wait_none_with, marker, 5), running_with(marker)
    assert none_threads_with(leader_marker, 5), threads_with(leader_marker)


# ---- 2. a run of another skill while the held sandbox is busy -----------------------------------------------------

@pytest.mark.root
async def test_a_run_of_another_skill_beside_a_busy_held_sandbox_sees_nothing_of_it_and_nothing_leaks(
    held, make_request, library
):
    write_skill(library, "other", files={"scripts/x.sh": "echo other\n"})
    namespace = await warm_held(held, make_request, ws("beside"))
    workspace = held.workspaces.find(ws("beside"))
    sleep, marker = sleeper()
    secret = uuid.uuid4().hex
    first = asyncio.create_task(held.run(make_request(
        f"echo {secret} > /tmp/first-secret; echo {secret} > /dev/shm/first-secret; ({sleep} &); "
        "touch $WORK_DIR/started; until [ -e $WORK_DIR/go ]; do sleep 0.05; done; echo done",
        workspace_id=ws("beside"), timeout=60)))
    for _ in range(500):
        if (workspace.work_dir / "started").exists():
            break
        await asyncio.sleep(0.01)
    demo = library / "demo"
    other = SkillRef(name="other", root=str(library), path="other")
    look = (f"{PID_NAMESPACE}; ls {shlex.quote(str(demo))} >/dev/null 2>&1 && echo sees-demo; "
            "cat /tmp/first-secret /dev/shm/first-secret 2>/dev/null; "
            f"ps -eo args= | grep -q -- '{marker}$' && echo sees-sleeper; echo end")
    second = await held.run(make_request(look, workspace_id=ws("beside"), skill=other))
    (workspace.work_dir / "go").touch()
    ended = await first
    await held.idle()
    assert (ended.exit_code, ended.stdout) == (0, "done\n"), ended
    seen, said = second.stdout.split("\n", 1)
    assert seen != namespace.strip() and said == "end\n", second.stdout
    assert await asyncio.to_thread(wait_none_with, marker, 5), "the first run's process outlived both runs"
    # Afterwards the other skill's runs are held (its folder is the workspace's, as the first skill's: the same
    # sandbox serves both), and nothing of the first run is left in it.
    again = (await run(held, make_request, PID_NAMESPACE, ws("beside"), skill=other)).stdout
    once_more = (await run(held, make_request, PID_NAMESPACE, ws("beside"), skill=other)).stdout
    assert again == once_more, (again, once_more, namespace)
    leftover = await run(held, make_request, "cat /tmp/first-secret /dev/shm/first-secret 2>/dev/null; "
                         f"ls {shlex.quote(str(demo))} >/dev/null 2>&1 && echo sees-demo; echo end", ws("beside"),
                         skill=other)
    assert leftover.stdout == "end\n", leftover.stdout
    assert not running_with(marker)


# ---- 3. run file names that match any character -------------------------------------------------------------------

async def _finished(client, body: dict) -> dict:  # noqa: F811
    run_id = (await client.post("/v1/runs", json=body)).json()["id"]
    done = (await client.get(f"/v1/runs/{run_id}", params={"wait": 30})).json()
    assert done["status"] == "finished", done
    return done


async def _raw_get(client, raw: str) -> httpx.Response:  # noqa: F811
    """GET ``raw`` (a path, percent-encoded as sent) straight into the app, as a server hands it over: httpx would
    remove ``.`` and ``..`` segments first."""
    status, headers, body = await asgi(client._transport.app, "GET", raw, list(client.headers.items()))
    return httpx.Response(status, headers=headers, content=body)


async def test_run_file_routes_serve_only_the_runs_own_files_whatever_the_name_and_never_inject_headers(
    client, work_root  # noqa: F811
):
    names = ["out/a.txt", "out/x\r\nSet-Cookie: evil=1.txt", "out/..", "out/%2e%2e.txt"]
    command = "; ".join(f"printf %s {shlex.quote(n)} > {shlex.quote(n)}" for n in names if n != "out/..")
    body = {"skill": "python-math", "command": f"mkdir -p out; {command}; echo hidden > secret.txt",
            "output_files": ["out/*"], "save_as_artifacts": True}
    done = await _finished(client, body)
    run_id = done["id"]
    listed = sorted(f["name"] for f in done["result"]["output_files"])
    assert "out/x\r\nSet-Cookie: evil=1.txt" in listed, listed
    other = await _finished(client, {"skill": "python-math", "command": "mkdir -p out; echo theirs > out/b.txt",
                                     "output_files": ["out/*"], "save_as_artifacts": True})
    assert [f["name"] for f in other["result"]["output_files"]] == ["out/b.txt"]
    refused = [
        "out/../secret.txt", "secret.txt", "out/%2e%2e/secret.txt", "out%2f..%2fsecret.txt", "out/a.txt%00",
        "out/a.txt%00.png", "%2e%2e/%2e%2e/etc/passwd", "/etc/passwd", "%2fetc%2fpasswd", "out/./a.txt",
        "out//a.txt", "out/a.txt/", "out/b.txt", "out/a.txt%0d%0aX-Evil:%201", "out/" + "a" * 5000,
        "out/" + "%2e%2e/" * 2000 + "x", "%ff%fe", "out/a.txt%3Fx=1%0A", "..", "%2e%2e", "out/a.txt/..", "out/x/../a.txt",
    ]
    sane = await _raw_get(client, f"/v1/runs/{run_id}/files/out/a.txt")
    assert (sane.status_code, sane.text) == (200, "out/a.txt"), sane.text  # the raw request does reach the route
    for kind in ("files", "artifacts"):
        for name in refused:
            # Sent as a server gets it: no client folds the dot segments away first.
            answer = await _raw_get(client, f"/v1/runs/{run_id}/{kind}/{name}")
            assert answer.status_code in (404, 422), (kind, name, answer.status_code, answer.text[:200])
            assert "hidden" not in answer.text and "theirs" not in answer.text, (kind, name)
            assert "x-evil" not in answer.headers and "set-cookie" not in answer.headers, answer.headers
        for name in listed:
            answer = await client.get(f"/v1/runs/{run_id}/{kind}/{urllib.parse.quote(name)}")
            assert (answer.status_code, answer.text) == (200, name), (kind, name, answer.status_code)
            assert "set-cookie" not in answer.headers, answer.headers
            disposition = answer.headers["content-disposition"]
            assert "\r" not in disposition and "\n" not in disposition, disposition
            assert disposition.endswith("''" + urllib.parse.quote(name.rsplit("/", 1)[-1])), disposition


# ---- 4. the 404 for a call of an ended session ----------------------------------------------------------------------

async def test_mcp_a_call_answers_normally_while_another_session_of_its_team_ends_and_after_a_delete_is_404(api):  # noqa: F811
    alpha = api.key("alpha")
    kept, ended = api.open(alpha), api.open(alpha)
    command, argument = sleeper()
    short = f"{command} & pid=$!; sleep 1; kill $pid; echo finished"
    call, http = await _post_in_background(api, alpha, kept, {"skill": "notes", "command": short})
    async with http:
        assert await asyncio.to_thread(_within, 30, lambda: bool(running_with(argument))), "the run never started"
        assert api.delete(alpha, ended).status_code == 200  # another session ends mid-call
        answer = await asyncio.wait_for(call, 60)
    assert answer.status_code == 200, answer.text  # not rewritten into the ended session's 404
    result = answer.json()["result"]
    assert not result.get("isError") and "finished" in str(result), result
    # The SDK's answers that are not 5xx on an ended session are left as they are; the session's end is a 404.
    gone = api.post(alpha, ended, {"jsonrpc": "2.0", "id": 5, "method": "ping"})
    assert gone.status_code == 404, gone.text
    assert "result" in api.rpc(alpha, kept, "ping")
    # A malformed body on an ended session is still the parse error (400), not rewritten.
    bad = api.post(alpha, ended, b"{not json")
    assert bad.status_code == 400, bad.text


async def test_mcp_calls_on_a_forged_or_another_teams_session_id_are_4xx_never_5xx_and_run_nothing(api):  # noqa: F811
    alpha, beta = api.key("alpha"), api.key("beta")
    session = api.open(alpha)
    before = api.runs_of(alpha), api.runs_of(beta)
    call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call",
            "params": {"name": "skill_run", "arguments": {"skill": "notes", "command": "echo ran"}}}
    for key, session_id in ((alpha, uuid.uuid4().hex), (alpha, "x" * 4000), (beta, session), (alpha, "\u00e9\u00e9")):
        try:
            answer = api.post(key, session_id, call)
        except UnicodeEncodeError:  # a header httpx will not send
            continue
        assert 400 <= answer.status_code < 500, (session_id[:20], answer.status_code, answer.text)
    assert (api.runs_of(alpha), api.runs_of(beta)) == before
    assert "result" in api.rpc(alpha, session, "ping")  # the session beta named is still alpha's, and alive
