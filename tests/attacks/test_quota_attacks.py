"""A hostile team against its quota (issue 18, part 3), over a real Redis, real worker processes and the real API:
racing past ``max_queued`` (many API processes, priority runs, kept workspaces), racing past ``max_workspaces``,
leaving counts wrong (cancels, a worker killed mid-run), starving another team with priority runs, breaking
``max_running`` across queues, and making the API answer 500. Each test's name says what it defends."""

from __future__ import annotations

import asyncio
import time


from orchestrator.dispatch import QueueDispatcher, WorkspaceConflictError
from orchestrator.quotas import QuotaExceededError
from tests.integration.conftest import worker_env, workers  # noqa: F401 - shared fixtures
from tests.integration.test_quotas import (  # noqa: F401 - fixtures
    RUN,
    Stored,
    assert_exactly_queued,
    assert_one_at_a_time,
    quota_services,
    services,
    skill,
    stored,
)
from tests.orchestrator.api_helpers import client, new_team
from worker.contract import RunRequest
from worker.jobs.fair_queue import line_key
from worker.run_store import RunRecord, RunStatus

QUEUE = "skillrun:local"


def split(outcomes: list) -> tuple[set[str], list[BaseException]]:
    return {o.id for o in outcomes if isinstance(o, RunRecord)}, [o for o in outcomes if not isinstance(o, RunRecord)]


async def until(check, what: str, seconds: float = 60) -> None:
    """Wait for ``check()`` (a bound against hanging, not a figure)."""
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_two_api_processes_racing_100_submissions_admit_exactly_max_queued(services, stored, redis_url,
                                                                                shared_dir, skill):
    other = quota_services(redis_url, shared_dir)  # a second API process: its own connections, its own cache
    try:
        services.dispatcher.quotas.set("team-a", {"max_queued": 10})
        outcomes = await asyncio.gather(*(
            (services.dispatcher if i % 2 else other.dispatcher).submit(
                RunRequest(skill=skill, command="true"), owner="team-a", priority=i % 3 == 0)
            for i in range(100)), return_exceptions=True)
        accepted, refused = split(outcomes)
        assert len(accepted) == 10
        assert all(isinstance(e, QuotaExceededError) and e.what == "max_queued" for e in refused), refused[:3]
        assert_exactly_queued(stored, "team-a", accepted)
    finally:
        await other.close()


async def test_priority_runs_racing_at_the_quota_are_admitted_exactly_and_each_job_is_queued_once(services, stored,
                                                                                                  skill):
    dispatcher = services.dispatcher
    dispatcher.quotas.set("team-a", {"max_queued": 10, "max_running": 1})
    first = [await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a") for _ in range(4)]
    outcomes = await asyncio.gather(*(dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a",
                                                        priority=True) for _ in range(100)), return_exceptions=True)
    accepted, refused = split(outcomes)
    assert len(accepted) == 6 and len(refused) == 94
    assert_exactly_queued(stored, "team-a", accepted | {r.id for r in first})
    assert len(stored.redis.lrange(f"rq:queue:{QUEUE}", 0, -1)) == 1  # still one turn of the team in the queue


async def test_kept_workspace_runs_racing_at_the_quota_leave_no_workspace_of_a_refused_run(services, stored, skill):
    dispatcher = services.dispatcher
    dispatcher.quotas.set("team-a", {"max_queued": 10})
    outcomes = await asyncio.gather(*(dispatcher.submit(
        RunRequest(skill=skill, command="true", workspace_id=f"team-a.w{i}", keep_workspace=True), owner="team-a")
        for i in range(100)), return_exceptions=True)
    accepted, refused = split(outcomes)
    assert len(accepted) == 10
    assert all(isinstance(e, QuotaExceededError) for e in refused), refused[:3]
    assert_exactly_queued(stored, "team-a", accepted)
    entries, kept = await dispatcher.list_workspaces("team-a", 0, 1000)
    assert kept == 10, f"refused runs left {kept - 10} kept workspaces behind"
    assert {run for e in entries for run in e.runs} == accepted


async def test_kept_workspaces_racing_past_the_teams_own_limit_get_exactly_the_limit(services, stored, skill):
    dispatcher = services.dispatcher
    dispatcher.quotas.set("team-a", {"max_workspaces": 5})
    outcomes = await asyncio.gather(*(dispatcher.submit(
        RunRequest(skill=skill, command="true", workspace_id=f"team-a.w{i}", keep_workspace=True), owner="team-a")
        for i in range(50)), return_exceptions=True)
    accepted, refused = split(outcomes)
    assert len(accepted) == 5
    assert all(isinstance(e, WorkspaceConflictError) and "its limit" in str(e) for e in refused), refused[:3]
    assert (await dispatcher.list_workspaces("team-a"))[1] == 5
    assert_exactly_queued(stored, "team-a", accepted)


async def test_cancelling_queued_runs_frees_max_queued_at_once_and_no_more(services, stored, skill):
    dispatcher = services.dispatcher
    dispatcher.quotas.set("team-a", {"max_queued": 10})
    queued = [await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a") for _ in range(10)]
    for record in queued[3:6]:
        assert (await dispatcher.cancel(record.id)).status == RunStatus.CANCELLED
        assert (await dispatcher.cancel(record.id)).status == RunStatus.CANCELLED  # twice frees nothing more
    assert await dispatcher.usage("team-a") == (7, 0)
    outcomes = await asyncio.gather(*(dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a")
                                      for _ in range(20)), return_exceptions=True)
    accepted, _ = split(outcomes)
    assert len(accepted) == 3
    assert stored.waiting("team-a") == {r.id for r in queued[:3] + queued[6:]} | accepted


async def test_cancelled_runs_do_not_pile_up_in_the_teams_line(services, stored, skill):
    dispatcher = services.dispatcher
    dispatcher.quotas.set("team-a", {"max_queued": 10})
    await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a")  # the team's turn in the queue
    for _ in range(5):
        burst = [await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a") for _ in range(9)]
        for record in burst:
            await dispatcher.cancel(record.id)
    assert await dispatcher.usage("team-a") == (1, 0)
    assert stored.redis.llen(line_key(QUEUE, "team-a")) == 0, "cancelled runs wait in the team's line"


async def test_a_worker_killed_mid_run_gives_its_teams_running_slot_back_after_the_lost_run_sweep(
        redis_url, shared_dir, stored, skill, workers):  # noqa: F811
    built = quota_services(redis_url, shared_dir)
    dispatcher: QueueDispatcher = built.dispatcher
    dispatcher.max_attempts = 1
    try:
        dispatcher.quotas.set("team-a", {"max_running": 1})
        victim = workers.start()
        lost = await dispatcher.submit(RunRequest(skill=skill, command="sleep 60", timeout=120), owner="team-a")
        after = await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a")

        async def started() -> bool:
            return dispatcher.store.get(lost.id).status == RunStatus.STARTED

        await until(started, "the run never started")
        assert await dispatcher.usage("team-a") == (1, 1)
        workers.kill(victim)
        workers.start()

        async def recovered() -> bool:
            await dispatcher.sweep_lost()
            return dispatcher.store.get(after.id).status == RunStatus.FINISHED

        await until(recovered, "the team's next run never ran after its worker died")
        failed = dispatcher.store.get(lost.id)
        assert failed.status == RunStatus.FAILED and "stopped beating" in failed.error
        assert await dispatcher.usage("team-a") == (0, 0)
        assert stored.running("team-a") == set() and stored.waiting("team-a") == set()
    finally:
        await built.close()


async def test_priority_runs_cannot_starve_another_team(services, skill, worker_env, redis_url):  # noqa: F811
    from tests.integration.test_queue import burst

    dispatcher = services.dispatcher
    flood = [await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a", priority=i % 2 == 0)
             for i in range(20)]
    b = await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-b")
    more = [await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a", priority=True)
            for _ in range(10)]
    await asyncio.to_thread(burst, redis_url, worker_env)
    done = [await dispatcher.wait(r.id, 60) for r in [*flood, b, *more]]
    assert all(r.status == RunStatus.FINISHED for r in done)
    order = [r.id for r in sorted(done, key=lambda r: r.started_at)]
    assert order.index(b.id) <= 1, "team-b's run waited behind team-a's priority runs"


async def test_max_running_holds_across_the_shared_queue_and_a_nodes_queue(services, skill, workers):  # noqa: F811
    dispatcher = services.dispatcher
    workers.start()
    workers.start()
    placed = await dispatcher.submit(RunRequest(skill=skill, command="true", workspace_id="team-a.kept",
                                                keep_workspace=True), owner="team-a")
    assert (await dispatcher.wait(placed.id, 60)).status == RunStatus.FINISHED  # the workspace lives on a node now
    dispatcher.quotas.set("team-a", {"max_running": 1})
    runs = [await dispatcher.submit(RunRequest(skill=skill, command="sleep 2"), owner="team-a"),
            await dispatcher.submit(RunRequest(skill=skill, command="sleep 2", workspace_id="team-a.kept",
                                               keep_workspace=True), owner="team-a")]
    done = [await dispatcher.wait(r.id, 60) for r in runs]
    assert all(r.status == RunStatus.FINISHED for r in done)
    assert_one_at_a_time(done)


async def test_hostile_submissions_at_and_over_the_quota_never_make_the_api_answer_500(services, stored):
    key = new_team(services, "team-a")
    services.dispatcher.quotas.set("team-a", {"max_queued": 2, "max_timeout_seconds": 30, "max_output_bytes": 0})
    RUN30 = {**RUN, "timeout": 30}
    bodies = [
        {**RUN30, "limits": {"stdout_bytes": 0, "stderr_bytes": 0, "output_total_bytes": 0}},
        {**RUN30, "limits": {"stdout_bytes": 0, "stderr_bytes": 0, "output_total_bytes": 0}, "priority": True,
         "workspace_id": "w"},
        {**RUN30, "limits": {"stdout_bytes": 5}},  # asked for over a ceiling of 0
        {**RUN30, "timeout": 1e308}, {**RUN30, "timeout": -1}, {**RUN30, "timeout": "NaN"}, {**RUN30, "timeout": None},
        {**RUN30, "limits": {"memory_bytes": 10**30}}, {**RUN30, "limits": {"cpu_seconds": -1}},
        {**RUN30, "limits": None}, {**RUN30, "priority": "yes please"}, {**RUN30, "priority": None},
        {**RUN30, "limits": {"stdout_bytes": 0, "stderr_bytes": 0, "output_total_bytes": 0}},  # at max_queued
    ]
    async with client(services, key) as api:
        answers = [await api.post("/v1/runs", json=body) for body in bodies]
        answers += await asyncio.gather(*(api.post("/v1/runs", json=bodies[0]) for _ in range(30)))
        answers.append(await api.get("/v1/quota"))
    codes = [a.status_code for a in answers]
    assert all(code < 500 for code in codes), [(c, a.text[:200]) for c, a in zip(codes, answers) if c >= 500]
    assert codes[:2] == [202, 202] and codes[2] == 429 and codes[-1] == 200
    assert "limits.stdout_bytes" in answers[2].json()["detail"]
    assert all(code == 429 for code in codes[12:-1])
    assert len(stored.records("team-a")) == 2


async def test_another_teams_quota_and_usage_are_not_shown_to_a_team(services):
    a_key, b_key = new_team(services, "team-a"), new_team(services, "team-b")
    services.dispatcher.quotas.set("team-a", {"max_queued": 3, "max_running": 1})
    async with client(services, a_key) as a, client(services, b_key) as b:
        assert (await a.post("/v1/runs", json={**RUN, "workspace_id": "mine"})).status_code == 202
        shown_b = (await b.get("/v1/quota", params={"team": "team-a"})).json()
        assert shown_b["quota"]["max_queued"] != 3 and shown_b["usage"] == {
            "queued": 0, "running": 0, "workspaces": 0, "builds": 0, "artifact_bytes": 0, "artifact_bytes_reserved": 0}
        assert (await b.get("/v1/quota", headers={"X-Team": "team-a"})).json() == shown_b
    async with client(services, None) as anonymous:
        assert (await anonymous.get("/v1/quota")).status_code == 401
