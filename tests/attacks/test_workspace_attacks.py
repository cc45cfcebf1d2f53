"""Attacks on kept workspaces (owner, limit, removal) as a hostile tenant and as a hostile run would make them, for
real: the API's app over the embedded default (runs in this process on the local runtime) and over a real Redis with
real worker processes. Each test names what it defends; one marked ``xfail(strict=True)`` is an attack that gets
through today (its reason says how), so it fails the suite once the hole is closed and the mark stays.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time

import httpx
import pytest
import redis
from rq import Queue
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from orchestrator.api import create_app
from orchestrator.dispatch import QueueDispatcher
from orchestrator.documents import RedisDocuments
from orchestrator.skills.tools import workspace_id_for
from tests.conftest import IS_ROOT, workspace_dirs
from tests.integration.conftest import worker_env, workers  # noqa: F401 - fixtures
from tests.integration.test_queue import repo  # noqa: F401 - fixtures
from tests.orchestrator.api_helpers import api_in_a_thread, make_services, new_team
from tests.orchestrator.conftest import model_server  # noqa: F401 - fixture
from tests.orchestrator.test_api_runs import held_user_ids
from tests.orchestrator.test_api_workspaces import services_with
from tests.services import unavailable
from worker.artifacts import FileArtifactStore
from worker.config import get_worker_settings
from worker.jobs.consumer import workspaces_queue_name
from worker.contract import RunRequest
from worker.jobs.execute import remove_kept_workspace

HANG_GUARD = 120.0
"""Seconds a wait may take before the test says what never happened (a guard against hangs, not a measure)."""
DEEP = 1500
"""Folders nested in one another by the deep-tree attack (Python 3.11's ``shutil.rmtree`` recurses once per level)."""
DEEP_TREE = f"cd $WORK_DIR && mkdir -p $(printf 'd/%.0s' $(seq {DEEP}))"


def api(services, key: str | None) -> httpx.AsyncClient:
    """The app in this process; an unhandled error is answered 500 (as a server would), not raised into the test."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    transport = httpx.ASGITransport(app=create_app(services=services), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers, timeout=HANG_GUARD,
                             follow_redirects=True)


async def eventually(check, what: str, seconds: float = HANG_GUARD) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def submit(client: httpx.AsyncClient, workspace_id: str | None, command: str = "true", **fields) -> httpx.Response:
    body = {"skill": "python-math", "command": command, "timeout": 90, **fields}
    if workspace_id is not None:
        body["workspace_id"] = workspace_id
    return await client.post("/v1/runs", json=body)


async def run(client: httpx.AsyncClient, workspace_id: str | None, command: str = "true", *, wait: bool = True,
              **fields) -> str:
    answer = await submit(client, workspace_id, command, **fields)
    assert answer.status_code == 202, answer.text
    run_id = answer.json()["id"]
    if wait:
        done = await ended(client, run_id)
        assert done["status"] == "finished" and done["result"]["exit_code"] == 0, done
    return run_id


async def ended(client: httpx.AsyncClient, run_id: str) -> dict:
    deadline = time.monotonic() + HANG_GUARD
    while True:
        record = (await client.get(f"/v1/runs/{run_id}", params={"wait": 30})).json()
        if record["status"] not in ("queued", "started"):
            return record
        assert time.monotonic() < deadline, f"run {run_id} never ended"


async def started(client: httpx.AsyncClient, run_id: str) -> None:
    async def check() -> bool:
        return (await client.get(f"/v1/runs/{run_id}")).json()["status"] != "queued"

    await eventually(check, f"run {run_id} never started")


def names(work_root) -> list[str]:
    """The workspace ids whose folders are in the work root."""
    return sorted(p.name[3:].rsplit("_", 1)[0] for p in workspace_dirs(work_root))


@pytest.fixture
async def embedded(work_root):
    built = services_with(work_root)
    yield built
    await built.close()


@pytest.fixture
def deep_trees(work_root):
    """Takes away what the deep-tree attacks leave (``rm`` walks a deep tree; the suite's own clean-up, like the
    product's, recurses)."""
    yield
    subprocess.run(["rm", "-rf", "--one-file-system", *map(str, workspace_dirs(work_root))], check=False)


def workers_user_ids(work_root) -> list[str]:
    registry = get_worker_settings().uid_registry
    return [e.name for e in registry.iterdir() if e.is_symlink() and os.readlink(e).startswith(f"{work_root}/")]


# ---------------------------------------------------------------------------------------------------------------
# Another team, by id


SPELLINGS = [
    "team-a.w1", "TEAM-A.w1", "team-a.W1", "team-a.w1.", "team-a.w1..", "team-a..w1", "team-a%2Ew1", "team-a%252Ew1",
    "team-a.w1%00", "team-a.w1%0A", "team-a.w1%20", "team-%EF%BD%81.w1", "team-a.w1%E2%80%8B", "..%2Fteam-a.w1",
    "team-b.%2E%2E%2Fteam-a.w1", "team-b..team-a.w1", " team-a.w1", "team-a.w1/", "team-a.w1%2F",
]


async def test_another_team_cannot_read_list_or_remove_a_workspace_by_any_spelling_of_its_id(embedded, work_root):
    async with api(embedded, new_team(embedded, "team-a")) as a, api(embedded, new_team(embedded, "team-b")) as b:
        await run(a, "w1", "echo secret-of-a > $WORK_DIR/secret")
        await run(b, "w9")
        for spelling in SPELLINGS:
            for answer in (await b.get(f"/v1/workspaces/{spelling}"), await b.delete(f"/v1/workspaces/{spelling}")):
                assert answer.status_code in (404, 405, 422), (spelling, answer.status_code, answer.text)
                assert "secret" not in answer.text
        listing = (await b.get("/v1/workspaces", params={"limit": 1000})).json()
        assert [w["id"] for w in listing["data"]] == ["team-b.w9"] and listing["total"] == 1
        one = (await a.get("/v1/workspaces/team-a.w1")).json()
        assert one["state"] == "kept" and one["id"] == "team-a.w1"
        assert names(work_root) == ["team-a.w1", "team-b.w9"]


async def test_another_teams_run_naming_a_workspace_id_runs_in_a_workspace_of_its_own(embedded, work_root):
    async with api(embedded, new_team(embedded, "team-a")) as a, api(embedded, new_team(embedded, "team-b")) as b:
        await run(a, "w1", "echo secret-of-a > $WORK_DIR/secret")
        before = (await a.get("/v1/workspaces/team-a.w1")).json()
        for bad in ("../team-a.w1", "team-a.w1/..", "/team-a.w1", ".team-a.w1", "team-a.w1\n", "x" * 32):
            assert (await submit(b, bad)).status_code == 422, bad
        for named in ("team-a.w1", "team-a", "w1"):
            run_id = await run(b, named, "cat $WORK_DIR/secret 2>&1; ls $WORKSPACE_DIR/..; true", wait=False)
            record = await ended(b, run_id)
            assert record["status"] == "finished", record
            assert "secret-of-a" not in record["result"]["stdout"]
            assert record["workspace_id"] == f"team-b.{named}"
        after = (await a.get("/v1/workspaces/team-a.w1")).json()
        assert after["created_at"] == before["created_at"] and after["runs"] == []
        assert (await b.get("/v1/workspaces/team-a.w1")).status_code == 404
        assert [w["id"] for w in (await a.get("/v1/workspaces")).json()["data"]] == ["team-a.w1"]
        assert names(work_root) == ["team-a.w1", "team-b.team-a", "team-b.team-a.w1", "team-b.w1"]


def tool_run(command: str) -> tuple[dict, dict]:
    """A scripted model's turn: one skill_run call, then an answer."""
    call = {"name": "skill_run", "arguments": {"skill": "python-math", "command": command}}
    return {"tool_calls": [call]}, {"text": "done"}


async def test_another_team_deleting_a_guessed_session_id_leaves_the_sessions_workspace(model_server, work_root):  # noqa: F811
    long_session = "s" * 60  # team-a.<60 characters> is too long for a workspace id: hashed
    model_server.add(*tool_run("echo a > $WORK_DIR/a"), *tool_run("echo a > $WORK_DIR/a"))
    services = services_with(work_root, model_url=model_server.base_url)
    async with api(services, new_team(services, "team-a")) as a, api(services, new_team(services, "team-b")) as b:
        for session in ("chat-1", long_session):
            assert (await a.post("/v1/sessions", json={"session_id": session})).status_code == 201
            assert (await a.post(f"/v1/sessions/{session}/messages", json={"text": "go"})).status_code == 200
        hashed = workspace_id_for("team-a", long_session)
        assert names(work_root) == sorted(["team-a.chat-1", hashed])
        for session in ("chat-1", long_session, "team-a.chat-1", "CHAT-1", "chat-1.", hashed):
            assert (await b.delete(f"/v1/sessions/{session}")).status_code in (404, 422), session
        for session in ("chat-1", long_session):  # the same ids, B's own sessions
            assert (await b.post("/v1/sessions", json={"session_id": session})).status_code == 201
            assert (await b.delete(f"/v1/sessions/{session}")).status_code == 204
        for workspace in ("team-a.chat-1", hashed):
            assert (await b.get(f"/v1/workspaces/{workspace}")).status_code == 404
            assert (await b.delete(f"/v1/workspaces/{workspace}")).status_code == 404
        assert names(work_root) == sorted(["team-a.chat-1", hashed])
        assert (await a.get("/v1/sessions/chat-1")).status_code == 200
        listed = sorted(w["id"] for w in (await a.get("/v1/workspaces")).json()["data"])
        assert listed == sorted(["team-a.chat-1", hashed])  # the hashed one is A's too: its runs name their owner
        assert (await a.delete(f"/v1/sessions/{long_session}")).status_code == 204  # its owner still can
        assert names(work_root) == ["team-a.chat-1"]
    await services.close()


# ---------------------------------------------------------------------------------------------------------------
# The per-team limit


async def test_sessions_with_long_ids_cannot_keep_workspaces_past_the_team_limit(model_server, work_root):  # noqa: F811
    sessions = [f"{n}" * 60 for n in range(3)]
    for _ in sessions:
        model_server.add(*tool_run("echo kept > $WORK_DIR/kept"))
    services = services_with(work_root, model_url=model_server.base_url, workspace_limit=1)
    async with api(services, new_team(services, "team-a")) as a:
        for session in sessions:
            assert (await a.post("/v1/sessions", json={"session_id": session})).status_code == 201
            assert (await a.post(f"/v1/sessions/{session}/messages", json={"text": "go"})).status_code == 200
        kept = len(workspace_dirs(work_root))
        listing = (await a.get("/v1/workspaces")).json()
        assert kept <= 1, f"team-a keeps {kept} workspaces past its limit of 1; it lists {listing['total']}"
    await services.close()


async def test_a_session_tool_run_refused_by_the_team_limit_tells_the_model_and_answers_no_500(model_server, work_root):  # noqa: F811
    model_server.add(*tool_run("echo x > $WORK_DIR/x"))
    services = services_with(work_root, model_url=model_server.base_url, workspace_limit=1)
    async with api(services, new_team(services, "team-a")) as a:
        await run(a, "w1")
        assert (await a.post("/v1/sessions", json={"session_id": "chat"})).status_code == 201
        answer = await a.post("/v1/sessions/chat/messages", json={"text": "go"})
        assert answer.status_code == 200, answer.text
        assert len(model_server.requests) == 2, "the model was not told what became of its tool call"
        told = [m["content"] for m in model_server.requests[1]["messages"] if m["role"] == "tool"]
        assert told and "SKILLRUN_MAX_WORKSPACES_PER_TEAM" in told[0], told
        assert names(work_root) == ["team-a.w1"]
    await services.close()


async def test_concurrent_submissions_on_every_runtime_cannot_pass_the_team_limit(redis_url, shared_dir):
    services = make_services(QueueDispatcher(redis_url, workspace_limit=3), FileArtifactStore(shared_dir / "artifacts"),
                             shared_dir / "data", documents=RedisDocuments(redis_url))
    async with api(services, new_team(services, "team-a")) as a, api(services, new_team(services, "team-b")) as b:
        bodies = []
        for n in range(30):
            fields = {"runtime": ("local", "docker", "cube")[n % 3], "wait_for_environment": True}
            if n % 5 == 4:
                bodies.append((None, {**fields, "keep_workspace": True}))  # a kept workspace without a name
            else:
                bodies.append((f"w{n}", fields))
        answers = await asyncio.gather(*(submit(a, name, **fields) for name, fields in bodies))
        codes = sorted(answer.status_code for answer in answers)
        assert set(codes) <= {202, 409, 422}, [answer.text for answer in answers if answer.status_code >= 500]
        assert codes.count(202) == 3, codes
        listing = (await a.get("/v1/workspaces")).json()
        assert listing["total"] == 3 and len(listing["data"]) == 3
        assert (await submit(b, "w1")).status_code == 202  # the other team's own limit is untouched
    await services.close()


# ---------------------------------------------------------------------------------------------------------------
# Runs and removals of one workspace


async def test_a_one_off_run_naming_a_kept_workspace_does_not_remove_it_under_a_running_run(embedded, work_root):
    async with api(embedded, new_team(embedded, "team-a")) as a:
        kept = await run(a, "w1", "sleep 60", wait=False)
        await started(a, kept)
        one_off = await run(a, "w1", keep_workspace=False)
        await eventually(lambda: _no_task(embedded, one_off), "the one-off run's clean-up never ended")
        survived = names(work_root) == ["team-a.w1"]
        await a.post(f"/v1/runs/{kept}/cancel")
        record = await ended(a, kept)
        assert survived, "the one-off run removed the kept workspace while a run was in it"
        assert record["status"] == "cancelled", record


async def _no_task(services, run_id: str) -> bool:
    return run_id not in services.dispatcher._tasks


async def test_a_workspace_is_not_removed_under_a_running_one_off_run_that_names_it(embedded, work_root):
    async with api(embedded, new_team(embedded, "team-a")) as a:
        await run(a, "w1")
        one_off = await run(a, "w1", "sleep 60", wait=False, keep_workspace=False)
        await started(a, one_off)
        answer = await a.delete("/v1/workspaces/team-a.w1")
        await a.post(f"/v1/runs/{one_off}/cancel")
        await ended(a, one_off)
        assert answer.status_code == 409, answer.status_code


GATED = "echo {mark} > $WORK_DIR/{mark}; until [ -e $WORK_DIR/go ]; do sleep 0.02; done; cat $WORK_DIR/{mark}"
"""A run that leaves a file, waits until the test lets it go (a file ``go`` in its workspace's ``work/``), then
reads its file back: it ends well only if its workspace outlived what happened meanwhile."""


def let_go(work_root) -> None:
    (workspace_dirs(work_root)[0] / "work" / "go").touch()


async def test_a_one_off_run_never_removes_a_named_workspace_under_another_one_off_run(embedded, work_root):
    async with api(embedded, new_team(embedded, "team-a")) as a:
        gated = await run(a, "w1", GATED.format(mark="mine"), wait=False, keep_workspace=False)
        await started(a, gated)
        quick = await run(a, "w1", keep_workspace=False)
        await eventually(lambda: _no_task(embedded, quick), "the quick one-off run's clean-up never ended")
        survived = names(work_root) == ["team-a.w1"]
        if survived:
            let_go(work_root)
        else:
            await a.post(f"/v1/runs/{gated}/cancel")
        record = await ended(a, gated)
        await eventually(lambda: _no_task(embedded, gated), "the last one-off run's clean-up never ended")
        await embedded.dispatcher.runtime("local").idle()
        assert survived, "the first one-off run to end removed the workspace while another run was in it"
        assert record["status"] == "finished" and record["result"]["stdout"] == "mine\n", record
        assert names(work_root) == [], "the workspace outlived the last of its one-off runs"


async def test_a_one_off_run_accepted_before_a_kept_run_of_its_workspace_leaves_the_workspace_kept(embedded,
                                                                                                  work_root):
    async with api(embedded, new_team(embedded, "team-a")) as a:
        one_off = await run(a, "w1", GATED.format(mark="mine"), wait=False, keep_workspace=False)
        await started(a, one_off)
        kept = await run(a, "w1", "echo kept > $WORK_DIR/kept")  # joins it, and registers it kept
        let_go(work_root)
        record = await ended(a, one_off)
        await eventually(lambda: _no_task(embedded, one_off), "the one-off run's clean-up never ended")
        await embedded.dispatcher.runtime("local").idle()
        assert record["status"] == "finished" and record["result"]["stdout"] == "mine\n", record
        assert names(work_root) == ["team-a.w1"], "the one-off run removed a workspace a kept run was in"
        assert (workspace_dirs(work_root)[0] / "work" / "kept").read_text() == "kept\n"
        listed = (await a.get("/v1/workspaces/team-a.w1")).json()
        assert listed["state"] == "kept" and listed["runs"] == [], listed
        again = await ended(a, await run(a, "w1", "cat $WORK_DIR/kept", wait=False))
        assert again["result"]["stdout"] == "kept\n", (kept, again)


async def test_racing_removals_and_runs_of_one_workspace_never_fail_an_accepted_run(redis_url, shared_dir, workers,
                                                                                   work_root):
    workers.start()
    workers.start()
    services = make_services(QueueDispatcher(redis_url), FileArtifactStore(shared_dir / "artifacts"),
                             shared_dir / "data", documents=RedisDocuments(redis_url))
    async with api(services, new_team(services, "team-a")) as a:
        accepted: list[str] = []
        removals = 0
        for n in range(16):
            if n % 2:  # let the runs end first, so the removal is not refused for them
                for run_id in accepted:
                    await ended(a, run_id)
            calls = [lambda: submit(a, "w1", "echo run >> $WORK_DIR/log; sleep 0.1"),
                     lambda: a.delete("/v1/workspaces/team-a.w1"), lambda: submit(a, "w1", "echo run >> $WORK_DIR/log")]
            calls = calls[n % 3:] + calls[:n % 3]  # each takes its turn first
            answers = await asyncio.gather(*(call() for call in calls))
            for answer in answers:
                if answer.request.method == "DELETE":
                    assert answer.status_code in (202, 204, 404, 409), answer.text  # 204: a worker was quicker
                    removals += answer.status_code in (202, 204)
                    continue
                assert answer.status_code in (202, 409), answer.text
                if answer.status_code == 202:
                    accepted.append(answer.json()["id"])
                else:
                    assert "being removed" in answer.json()["detail"]
        assert removals, "no removal was ever accepted: nothing raced"
        assert accepted, "no run was ever accepted"
        for run_id in accepted:
            record = await ended(a, run_id)
            assert record["status"] == "finished" and record["result"]["exit_code"] == 0, record

        async def settled() -> bool:
            entry = await a.get("/v1/workspaces/team-a.w1")
            return entry.status_code == 404 or entry.json()["state"] == "kept"

        await eventually(settled, "the workspace stayed removing")
        kept = (await a.get("/v1/workspaces/team-a.w1")).status_code == 200
        assert names(work_root) == (["team-a.w1"] if kept else [])
        assert len(workers_user_ids(work_root)) == (int(kept) if IS_ROOT else 0)
    await services.close()


async def test_idle_removal_never_removes_a_workspace_whose_run_is_queued(redis_url, workers, repo):  # noqa: F811
    dispatcher = QueueDispatcher(redis_url, workspace_idle_seconds=0.2)
    ref = repo.skill_ref("python-math")
    queued = await dispatcher.submit(RunRequest(skill=ref, command="echo ran > $WORK_DIR/ran; cat $WORK_DIR/ran",
                                                workspace_id="team-a.queued"), owner="team-a")
    time.sleep(0.5)  # longer than the idle time: the workspace's last use is past it
    assert await dispatcher.expire_idle_workspaces() == 0
    entry = await dispatcher.get_workspace("team-a.queued")
    assert entry is not None and entry.state == "kept" and entry.runs == [queued.id]
    workers.start()
    record = await dispatcher.wait(queued.id, HANG_GUARD)
    assert record.status.value == "finished" and record.result.stdout == "ran\n", record
    await dispatcher.close()


# ---------------------------------------------------------------------------------------------------------------
# What a removal leaves, and where it may reach


async def test_a_removal_leaves_no_registry_key_job_user_id_or_folder(redis_url, shared_dir, workers, work_root):
    workers.start()
    services = make_services(QueueDispatcher(redis_url), FileArtifactStore(shared_dir / "artifacts"),
                             shared_dir / "data", documents=RedisDocuments(redis_url))
    connection = redis.Redis.from_url(redis_url)
    assert connection.keys("skillrun:workspace*") == []
    async with api(services, new_team(services, "team-a")) as a, api(services, new_team(services, "team-b")) as b:
        for name in ("w1", "w2", "w3"):
            await run(a, name)
        await run(b, "w1")
        assert len(connection.keys("skillrun:workspace*")) == 4 + 2 + 1  # entries, owner indexes, idle index
        for name in ("w1", "w2", "w3"):
            assert (await a.delete(f"/v1/workspaces/team-a.{name}")).status_code == 202

        async def all_gone() -> bool:  # RQ deletes a job's key just after the job (which forgets the entry) returns
            listed = (await a.get("/v1/workspaces")).json()["total"]
            return listed == 0 and connection.keys("rq:job:workspace-*") == []

        await eventually(all_gone, "a worker never removed team-a's workspaces, or their jobs stayed")
        keys = sorted(key.decode() for key in connection.keys("skillrun:workspace*"))
        assert keys == ["skillrun:workspace:id:team-b.w1", "skillrun:workspace:idle", "skillrun:workspace:owner:team-b"]
        assert [m.decode() for m in connection.zrange("skillrun:workspace:idle", 0, -1)] == ["team-b.w1"]
        assert names(work_root) == ["team-b.w1"]
        assert len(workers_user_ids(work_root)) == (1 if IS_ROOT else 0)
    connection.close()
    await services.close()


async def test_a_crafted_removal_job_cannot_reach_paths_outside_the_work_root(redis_url, shared_dir, workers,
                                                                             work_root):
    workers.start()
    services = make_services(QueueDispatcher(redis_url), FileArtifactStore(shared_dir / "artifacts"),
                             shared_dir / "data", documents=RedisDocuments(redis_url))
    async with api(services, new_team(services, "team-b")) as b:
        await run(b, "w1", "echo mine > $WORK_DIR/mine")
    await services.close()
    canary = shared_dir / "canary"
    canary.mkdir()
    (canary / "file").write_text("still here")
    (work_root / "not-a-workspace").mkdir()
    evil = ["..", "../canary", "../../", "/", ".", "*", "team-b.*", "team-b.w", "team-b.w1/..", "team-b.w1/../../canary",
            ".skillrun", "ws_team-b.w1", f"../{canary.name}/file", str(canary), "team-b.w1\x00", "team-b.w1\n"]
    connection = redis.Redis.from_url(redis_url)
    queue = Queue(workspaces_queue_name("local"), connection=connection, serializer=JSONSerializer)
    jobs = []
    for workspace_id in evil:
        connection.hset(f"skillrun:workspace:id:{workspace_id}", mapping={
            "id": workspace_id, "owner": "team-a", "runtime": "local", "created_at": time.time(),
            "last_used_at": time.time(), "state": "removing"})
        jobs.append(queue.enqueue_call(remove_kept_workspace, args=(workspace_id,), result_ttl=60, failure_ttl=60).id)

    async def all_done() -> bool:
        for job_id in jobs:
            try:
                status = Job.fetch(job_id, connection=connection, serializer=JSONSerializer).get_status()
            except NoSuchJobError:
                continue
            if status not in (JobStatus.FINISHED, JobStatus.FAILED):
                return False
        return True

    await eventually(all_done, "the crafted removal jobs never ended")
    assert (canary / "file").read_text() == "still here"
    assert (work_root / "not-a-workspace").is_dir()
    assert (work_root / ".skillrun").is_dir()
    assert names(work_root) == ["team-b.w1"]
    folder = workspace_dirs(work_root)[0]
    assert (folder / "work" / "mine").read_text() == "mine\n"
    connection.close()


async def test_removal_does_not_follow_links_a_run_planted_out_of_its_workspace(embedded, work_root, shared_dir):
    canary = shared_dir / "canary"
    canary.mkdir(mode=0o755)
    (canary / "file").write_text("still here")
    (canary / "file").chmod(0o644)
    plant = (f"ln -s {canary} $WORK_DIR/dir-link; ln -s {canary}/file $OUTPUT_DIR/file-link; "
             f"ln -s / $WORK_DIR/root-link; ln {canary}/file $WORK_DIR/hard 2>/dev/null; "
             "mkdir -p $WORK_DIR/ro && chmod 000 $WORK_DIR/ro; true")
    async with api(embedded, new_team(embedded, "team-a")) as a:
        await run(a, "w1", plant)
        assert (await a.delete("/v1/workspaces/team-a.w1")).status_code == 204
    assert (canary / "file").read_text() == "still here"
    assert workspace_dirs(work_root) == [] and held_user_ids(embedded, work_root) == []


async def test_a_run_cannot_make_its_workspace_unremovable_with_a_deep_folder_tree(deep_trees, embedded, work_root):
    async with api(embedded, new_team(embedded, "team-a")) as a:
        await run(a, "deep", DEEP_TREE)
        answer = await a.delete("/v1/workspaces/team-a.deep")
        assert answer.status_code == 204, (answer.status_code, answer.text)
        assert workspace_dirs(work_root) == [] and held_user_ids(embedded, work_root) == []


async def test_a_one_off_run_cannot_keep_its_workspace_and_user_id_with_a_deep_folder_tree(deep_trees, embedded,
                                                                                          work_root):
    async with api(embedded, new_team(embedded, "team-a")) as a:
        await run(a, None, DEEP_TREE)
        await embedded.dispatcher.drain()
        assert workspace_dirs(work_root) == [] and held_user_ids(embedded, work_root) == []


async def test_a_run_cannot_make_its_workspace_unremovable_on_a_worker_with_a_deep_folder_tree(
    deep_trees, redis_url, shared_dir, workers, work_root
):
    workers.start()
    services = make_services(QueueDispatcher(redis_url), FileArtifactStore(shared_dir / "artifacts"),
                             shared_dir / "data", documents=RedisDocuments(redis_url))
    connection = redis.Redis.from_url(redis_url)
    job_id = f"workspace-{hashlib.sha256(b'team-a.deep').hexdigest()[:32]}"
    async with api(services, new_team(services, "team-a")) as a:
        await run(a, "deep", DEEP_TREE)
        assert (await a.delete("/v1/workspaces/team-a.deep")).status_code == 202

        async def job_ended() -> bool:
            try:
                status = Job.fetch(job_id, connection=connection, serializer=JSONSerializer).get_status()
            except (NoSuchJobError, InvalidJobOperation):  # done (result_ttl 0): gone, or gone between two reads
                return True
            return status in (JobStatus.FINISHED, JobStatus.FAILED)

        await eventually(job_ended, "the removal job never ended")
        assert workspace_dirs(work_root) == [] and workers_user_ids(work_root) == []
        assert (await a.get("/v1/workspaces/team-a.deep")).status_code == 404
    connection.close()
    await services.close()


async def test_another_teams_queued_runs_do_not_hold_up_a_removal(redis_url, shared_dir, workers):
    workers.start()
    services = make_services(QueueDispatcher(redis_url), FileArtifactStore(shared_dir / "artifacts"),
                             shared_dir / "data", documents=RedisDocuments(redis_url))
    async with api(services, new_team(services, "team-a")) as a, api(services, new_team(services, "team-b")) as b:
        await run(a, "w1")
        flood = [await run(b, None, "sleep 1", wait=False) for _ in range(3)]
        await started(b, flood[0])
        assert (await a.delete("/v1/workspaces/team-a.w1")).status_code == 202
        await started(b, flood[-1])
        state = await a.get("/v1/workspaces/team-a.w1")
        for run_id in flood:
            await ended(b, run_id)
        assert state.status_code == 404, f"team-b's last queued run started first; team-a.w1: {state.text}"
    await services.close()


# ---------------------------------------------------------------------------------------------------------------
# Errors and the command line


async def test_paging_numbers_and_bad_ids_never_answer_500(embedded):
    async with api(embedded, new_team(embedded, "team-a")) as a:
        await run(a, "w1")
        for params in ({"offset": 10**30}, {"limit": 10**30}, {"offset": -1}, {"limit": 0}, {"offset": "1e3"},
                       {"offset": "NaN"}, {"limit": "inf"}, {"offset": 1_000_000, "limit": 1000}, {"offset": 1}):
            answer = await a.get("/v1/workspaces", params=params)
            assert answer.status_code in (200, 422), (params, answer.status_code, answer.text)
        for bad in ("%00", "%FF", "%C0%AE%C0%AE", "a" * 5000, "x" * 65, "team-a.w1%3Bx", "%2E%2E", "\u202e", "team-a.w1~"):
            for method in ("GET", "DELETE"):
                for path in (f"/v1/workspaces/{bad}", f"/v1/sessions/{bad}"):
                    answer = await a.request(method, path)
                    assert answer.status_code < 500, (method, path, answer.status_code, answer.text)
        assert (await a.get("/v1/workspaces/team-a.w1")).status_code == 200


async def test_concurrent_deletes_of_one_workspace_answer_no_500_and_remove_it_once(embedded, work_root):
    async with api(embedded, new_team(embedded, "team-a")) as a:
        await run(a, "w1", "cd $WORK_DIR && for d in $(seq 40); do mkdir $d && (cd $d && touch $(seq 100)); done")
        answers = await asyncio.gather(*(a.delete("/v1/workspaces/team-a.w1") for _ in range(16)))
        codes = [answer.status_code for answer in answers]
        assert set(codes) <= {204, 404, 409} and 204 in codes, [answer.text for answer in answers]
        assert (await a.get("/v1/workspaces")).json()["total"] == 0
        assert workspace_dirs(work_root) == [] and held_user_ids(embedded, work_root) == []
        await run(a, "w1")  # and the name works again
        assert names(work_root) == ["team-a.w1"]


def cli(*args: str, url: str, key: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLRUN_")}
    env.update(SKILLRUN_API_URL=url, SKILLRUN_API_KEY=key)
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "workspaces", *args], capture_output=True,
                          text=True, env=env, timeout=HANG_GUARD)


def test_the_cli_cannot_be_steered_by_a_workspace_id_to_another_endpoint(embedded):
    key = new_team(embedded, "team-a")
    with api_in_a_thread(embedded) as url, httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                                        timeout=HANG_GUARD) as client:
        assert client.post("/v1/sessions", json={"session_id": "keep-me"}).status_code == 201
        removed = cli("rm", "../sessions/keep-me", url=url, key=key)
        assert client.get("/v1/sessions/keep-me").status_code == 200, removed.stdout + removed.stderr
        assert removed.returncode != 0


def test_the_cli_lists_ids_and_errors_without_raw_control_characters(embedded):
    key = new_team(embedded, "team-a")
    with api_in_a_thread(embedded) as url, httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                                        timeout=HANG_GUARD) as client:
        for hostile in ("w\x1b]0;pwned\x07", "w\x1b[2J", "w\u009b2J", "w\r"):
            answer = client.post("/v1/runs", json={"skill": "python-math", "command": "true", "workspace_id": hostile})
            assert answer.status_code == 422, hostile
        listing = cli("list", url=url, key=key)
        assert listing.returncode == 0, listing.stderr
        removed = cli("rm", "team-a.\x1b]0;pwned\x07", url=url, key=key)
        assert removed.returncode != 0
        for text in (listing.stdout, listing.stderr, removed.stdout.replace("\x1b]0;pwned\x07", ""),
                     json.dumps(removed.stderr.replace("team-a.\x1b]0;pwned\x07", ""))):
            assert "\x1b" not in text and "\x9b" not in text, text


@pytest.fixture(autouse=True)
def _needs_root_for_user_ids():
    """Sandbox user ids are what these attacks count; without root there are none (and CI runs as root)."""
    if not IS_ROOT:
        unavailable("the workspace attacks need root (per-workspace user ids): run as root (sudo bash .ci/test)")
