"""Team quotas over a real Redis, real worker processes and the real API (issue 18, part 3): a team at its quota
that submits a hundred runs at once gets exactly its room in and nothing of the rest stored; its usage frees as runs
start; runs past ``max_running`` wait their turn while other teams' runs go on; a run over a ceiling, or a workspace
past the team's own limit, is refused; a changed quota holds for the next submission."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import pytest
import redis

from orchestrator import quotas as quotas_module
from orchestrator.config import DEFAULT_MAX_WORKSPACES_PER_TEAM, DEFAULT_TEAM_MAX_QUEUED
from orchestrator.dispatch import QueueDispatcher
from orchestrator.documents import RedisDocuments
from orchestrator.quotas import QuotaExceededError, Quotas, TeamQuota
from orchestrator.skills import create_default_skill_repository
from tests.orchestrator.api_helpers import LIBRARY, api_in_a_thread, client, make_services, new_team
from worker.artifacts import FileArtifactStore
from worker.contract import RunRequest
from worker.jobs.fair_queue import line_key
from worker.run_store import RunRecord, RunStatus

QUEUE = "skillrun:local"
DEFAULTS = TeamQuota(max_running=0, max_queued=DEFAULT_TEAM_MAX_QUEUED, max_workspaces=DEFAULT_MAX_WORKSPACES_PER_TEAM)


def quota_services(redis_url: str, shared_dir, defaults: TeamQuota = DEFAULTS):
    """The API's services over the queue, with teams and quotas in Redis (as ``build_services`` makes them)."""
    documents = RedisDocuments(redis_url)
    dispatcher = QueueDispatcher(redis_url)
    dispatcher.quotas = Quotas(documents, defaults)
    return make_services(dispatcher, FileArtifactStore(shared_dir / "artifacts"), shared_dir / "data",
                         documents=documents)


@pytest.fixture
async def services(redis_url, shared_dir):
    built = quota_services(redis_url, shared_dir)
    yield built
    await built.close()


@pytest.fixture
def skill():
    return create_default_skill_repository(str(LIBRARY)).skill_ref("python-math")


class Stored:
    """What Redis holds of runs, read straight from it."""

    def __init__(self, url: str) -> None:
        self.redis = redis.Redis.from_url(url)

    def records(self, team: str | None = None) -> dict[str, RunRecord]:
        """Every run record (``skillrun:run:<id>``, a JSON string) of ``team`` (all teams: ``None``)."""
        found = {}
        for key in self.redis.scan_iter("skillrun:run:*", count=1000):
            if self.redis.type(key) != b"string":
                continue
            raw = self.redis.get(key)
            if not raw or not raw.startswith(b"{"):
                continue
            record = RunRecord.model_validate_json(raw)
            if team is None or record.owner == team:
                found[record.id] = record
        return found

    def event_streams(self) -> set[str]:
        return {key.decode().split(":")[2] for key in self.redis.scan_iter("skillrun:run:*:events", count=1000)}

    def index(self, team: str) -> set[str]:
        return {i.decode() for i in self.redis.zrange(f"skillrun:run:index:{team}", 0, -1)}

    def waiting(self, team: str) -> set[str]:
        return {i.decode() for i in self.redis.zrange(f"skillrun:run:waiting:{team}", 0, -1)}

    def running(self, team: str) -> set[str]:
        return {i.decode() for i in self.redis.zrange(f"skillrun:run:running:{team}", 0, -1)}

    def queued_jobs(self, team: str, queue: str = QUEUE) -> list[str]:
        """The job ids in the RQ queue and in the team's line beside it."""
        return [j.decode() for j in self.redis.lrange(f"rq:queue:{queue}", 0, -1)] + \
            [j.decode() for j in self.redis.lrange(line_key(queue, team), 0, -1)]

    def job_hashes(self) -> set[str]:
        return {key.decode().removeprefix("rq:job:") for key in self.redis.scan_iter("rq:job:*", count=1000)}

    def close(self) -> None:
        self.redis.close()


@pytest.fixture
def stored(redis_url):
    found = Stored(redis_url)
    yield found
    found.close()


def assert_exactly_queued(stored: Stored, team: str, accepted: set[str]) -> None:
    """Nothing half-queued: the accepted runs, and only they, are stored, indexed, announced and enqueued once."""
    assert set(stored.records(team)) == accepted
    assert stored.index(team) == accepted
    assert stored.waiting(team) == accepted
    assert stored.event_streams() == accepted  # no stream of a refused run
    jobs = stored.queued_jobs(team)
    assert sorted(jobs) == sorted(f"{run_id}-1" for run_id in accepted)  # each once, in the queue or the line
    assert stored.job_hashes() == {f"{run_id}-1" for run_id in accepted}  # no RQ job of a refused run


def assert_refused_for_max_queued(answer: httpx.Response) -> None:
    assert answer.status_code == 429, answer.text
    assert "max_queued" in answer.json()["detail"]
    assert int(answer.headers["Retry-After"]) >= 1


RUN = {"skill": "python-math", "command": "true", "timeout": 60}
NOTHING_USED = {"queued": 0, "running": 0, "workspaces": 0, "builds": 0, "artifact_bytes": 0,
                "artifact_bytes_reserved": 0}
"""``GET /v1/quota``'s usage of a team with nothing queued, running, kept, building or stored."""


async def test_a_team_at_its_quota_submitting_100_runs_at_once_through_the_api_gets_exactly_its_room(
        services, stored):
    key = new_team(services, "team-a")
    services.dispatcher.quotas.set("team-a", {"max_queued": 10})
    with api_in_a_thread(services) as url:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120,
                                     limits=httpx.Limits(max_connections=100)) as api:
            answers = await asyncio.gather(*(api.post("/v1/runs", json=RUN) for _ in range(100)))
            accepted = {a.json()["id"] for a in answers if a.status_code == 202}
            assert len(accepted) == 10, [a.status_code for a in answers]
            for answer in answers:
                if answer.status_code != 202:
                    assert_refused_for_max_queued(answer)
            assert_exactly_queued(stored, "team-a", accepted)
            shown = (await api.get("/v1/quota")).json()
            assert shown["quota"]["max_queued"] == 10
            assert shown["usage"] == {**NOTHING_USED, "queued": 10}
            assert_refused_for_max_queued(await api.post("/v1/runs", json=RUN))  # one more, later: still refused


async def test_a_team_at_its_quota_submitting_100_runs_at_once_through_the_dispatcher_gets_exactly_its_room(
        services, stored, skill):
    dispatcher = services.dispatcher
    dispatcher.quotas.set("team-a", {"max_queued": 10})
    outcomes = await asyncio.gather(*(dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a")
                                      for _ in range(100)), return_exceptions=True)
    accepted = {o.id for o in outcomes if isinstance(o, RunRecord)}
    refused = [o for o in outcomes if not isinstance(o, RunRecord)]
    assert len(accepted) == 10 and len(refused) == 90
    for error in refused:
        assert isinstance(error, QuotaExceededError), repr(error)
        assert error.what == "max_queued" and "max_queued" in str(error) and error.retry_after >= 1
    assert_exactly_queued(stored, "team-a", accepted)
    assert await dispatcher.usage("team-a") == (10, 0)


async def test_usage_frees_as_runs_start_and_each_team_sees_its_own_quota_and_usage(services, stored, workers):
    a_key, b_key = new_team(services, "team-a"), new_team(services, "team-b")
    services.dispatcher.quotas.set("team-a", {"max_queued": 3, "max_running": 2})
    async with client(services, a_key) as a, client(services, b_key) as b:
        first = [(await a.post("/v1/runs", json={**RUN, "workspace_id": "kept"})).json()["id"]]
        first += [(await a.post("/v1/runs", json=RUN)).json()["id"] for _ in range(2)]
        assert (await a.post("/v1/runs", json=RUN)).status_code == 429
        b_run = await b.post("/v1/runs", json={**RUN, "command": "sleep 60"})
        assert b_run.status_code == 202
        shown_a, shown_b = (await a.get("/v1/quota")).json(), (await b.get("/v1/quota")).json()
        assert shown_a["quota"] == {**DEFAULTS.model_dump(), "max_queued": 3, "max_running": 2}
        assert shown_a["usage"] == {**NOTHING_USED, "queued": 3, "workspaces": 1}
        assert shown_b["quota"] == DEFAULTS.model_dump()  # the defaults: team-a's own quota is its own
        assert shown_b["usage"] == {**NOTHING_USED, "queued": 1}

        workers.start()
        workers.start()  # one for team-b's long run
        for run_id in first:
            assert (await a.get(f"/v1/runs/{run_id}", params={"wait": 60})).json()["status"] == "finished"
        assert stored.waiting("team-a") == set() and stored.running("team-a") == set()
        again = [await a.post("/v1/runs", json=RUN) for _ in range(3)]  # its room is back
        assert [answer.status_code for answer in again] == [202] * 3
        for answer in again:
            assert (await a.get(f"/v1/runs/{answer.json()['id']}", params={"wait": 60})).json()["status"] == "finished"
        assert (await a.get("/v1/quota")).json()["usage"] == {**NOTHING_USED, "workspaces": 1}
        b_id = b_run.json()["id"]
        await until(lambda: _status(b, b_id, "started"), "team-b's run never started")
        assert (await b.get("/v1/quota")).json()["usage"] == {**NOTHING_USED, "running": 1}
        await b.post(f"/v1/runs/{b_id}/cancel")
        assert (await b.get(f"/v1/runs/{b_id}", params={"wait": 60})).json()["status"] == "cancelled"
        assert (await b.get("/v1/quota")).json()["usage"] == NOTHING_USED


async def until(check, what: str, seconds: float = 60) -> None:
    """Wait for ``check()`` (a bound against hanging, not a figure)."""
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def _status(api, run_id: str, status: str) -> bool:
    return (await api.get(f"/v1/runs/{run_id}")).json()["status"] == status


def assert_one_at_a_time(records: list[RunRecord]) -> None:
    """The runs never overlapped: each started once the one before it had finished."""
    ordered = sorted(records, key=lambda r: r.started_at)
    for before, after in zip(ordered, ordered[1:]):
        assert after.started_at >= before.finished_at, f"{after.id} started while {before.id} ran"


async def test_past_max_running_a_teams_runs_wait_their_turn_while_another_teams_run_on_the_other_worker(
        services, skill, workers):
    dispatcher = services.dispatcher
    dispatcher.quotas.set("team-a", {"max_running": 1})
    workers.start()
    workers.start()
    long = await dispatcher.submit(RunRequest(skill=skill, command="sleep 60", timeout=120), owner="team-a")
    rest = [await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a") for _ in range(3)]
    others = [await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-b") for _ in range(3)]
    for record in others:  # team-b's runs go on while team-a's long run holds its one turn
        assert (await dispatcher.wait(record.id, 60)).status == RunStatus.FINISHED
    assert (await dispatcher.get(long.id)).status == RunStatus.STARTED
    assert [(await dispatcher.get(r.id)).status for r in rest] == [RunStatus.QUEUED] * 3
    assert await dispatcher.usage("team-a") == (3, 1)
    await dispatcher.cancel(long.id)
    done = [await dispatcher.wait(r.id, 60) for r in [long, *rest]]
    assert [r.status for r in done] == [RunStatus.CANCELLED] + [RunStatus.FINISHED] * 3
    assert_one_at_a_time(done)
    assert await dispatcher.usage("team-a") == (0, 0)


CEILINGS = {"max_timeout_seconds": 30.0, "max_memory_bytes": 512 * 1024**2, "max_cpu_seconds": 60,
            "max_disk_bytes": 64 * 1024**2, "max_output_bytes": 1024**2}
AT_CEILING = {"timeout": 30.0, "limits": {"memory_bytes": 512 * 1024**2, "cpu_seconds": 60,
                                          "file_size_bytes": 64 * 1024**2, "stdout_bytes": 1024**2,
                                          "stderr_bytes": 1024**2, "output_total_bytes": 1024**2}}


@pytest.mark.parametrize(("field", "quota", "over"), [
    ("timeout", "max_timeout_seconds", {"timeout": 30.5}),
    ("limits.memory_bytes", "max_memory_bytes", {"limits": {"memory_bytes": 512 * 1024**2 + 1}}),
    ("limits.cpu_seconds", "max_cpu_seconds", {"limits": {"cpu_seconds": 61}}),
    ("limits.file_size_bytes", "max_disk_bytes", {"limits": {"file_size_bytes": 64 * 1024**2 + 1}}),
    ("limits.stdout_bytes", "max_output_bytes", {"limits": {"stdout_bytes": 1024**2 + 1}}),
    ("limits.stderr_bytes", "max_output_bytes", {"limits": {"stderr_bytes": 1024**2 + 1}}),
    ("limits.output_total_bytes", "max_output_bytes", {"limits": {"output_total_bytes": 1024**2 + 1}}),
])
async def test_a_run_over_a_ceiling_of_its_teams_quota_is_refused_naming_both_and_nothing_is_stored(
        services, stored, field, quota, over):
    key = new_team(services, "team-a")
    services.dispatcher.quotas.set("team-a", CEILINGS)
    body = {**RUN, **AT_CEILING, **over,
            "limits": {**AT_CEILING["limits"], **over.get("limits", {})}, "workspace_id": "kept"}
    async with client(services, key) as api:
        refused = await api.post("/v1/runs", json=body)
        assert refused.status_code == 429, refused.text
        detail = refused.json()["detail"]
        assert field in detail and quota in detail and "team-a" in detail
        asked = body["timeout"] if field == "timeout" else body["limits"][field.split(".")[1]]
        assert f"is {asked:g}" in detail if field == "timeout" else f"is {asked}," in detail  # exact, not rounded
        assert "Retry-After" not in refused.headers  # trying again will not help: ask for less
        assert stored.records() == {} and stored.event_streams() == set() and stored.job_hashes() == set()
        assert (await api.get("/v1/quota")).json()["usage"] == NOTHING_USED
        accepted = await api.post("/v1/runs", json={**RUN, **AT_CEILING, "workspace_id": "kept"})  # at it: fine
        assert accepted.status_code == 202, accepted.text
        assert set(stored.records()) == {accepted.json()["id"]}


async def test_a_new_kept_workspace_past_the_teams_own_limit_is_refused_and_within_it_accepted(services, stored):
    a_key, b_key = new_team(services, "team-a"), new_team(services, "team-b")
    services.dispatcher.quotas.set("team-a", {"max_workspaces": 2})
    async with client(services, a_key) as a, client(services, b_key) as b:
        for name in ("w1", "w2", "w1"):
            assert (await a.post("/v1/runs", json={**RUN, "workspace_id": name})).status_code == 202
        refused = await a.post("/v1/runs", json={**RUN, "workspace_id": "w3"})
        assert refused.status_code == 409 and "keeps 2 workspaces, its limit" in refused.json()["detail"]
        assert (await a.post("/v1/runs", json=RUN)).status_code == 202  # a one-off workspace is not kept
        for name in ("w1", "w2", "w3"):  # another team's limit is its own (the default)
            assert (await b.post("/v1/runs", json={**RUN, "workspace_id": name})).status_code == 202
        assert (await a.get("/v1/quota")).json()["usage"]["workspaces"] == 2
        assert (await b.get("/v1/quota")).json()["usage"]["workspaces"] == 3
        assert len(stored.records("team-a")) == 4  # the refused run left no record
        services.dispatcher.quotas.set("team-a", {"max_workspaces": 3})
        assert (await a.post("/v1/runs", json={**RUN, "workspace_id": "w3"})).status_code == 202


async def test_a_changed_quota_holds_for_the_next_submission_in_every_api_process(services, redis_url, shared_dir,
                                                                                   skill, monkeypatch):
    operator = Quotas(RedisDocuments(redis_url), DEFAULTS)  # the command line, another process
    operator.set("team-a", {"max_queued": 1})
    other = quota_services(redis_url, shared_dir)  # a second API process, whose cache is as fresh as can be
    try:
        for dispatcher in (services.dispatcher, other.dispatcher):  # each reads (and caches) the quota
            with pytest.raises(QuotaExceededError, match="max_queued") if dispatcher is other.dispatcher else \
                    contextlib.nullcontext():
                await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a")
        monkeypatch.setattr(quotas_module, "CACHE_SECONDS", 0.0)  # as if the cache time had passed since
        for quota in (services.dispatcher.quotas, other.dispatcher.quotas):
            quota._cache.clear()
        operator.set("team-a", {"max_queued": 2})
        await other.dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a")
        with pytest.raises(QuotaExceededError, match="has 2 runs waiting"):
            await services.dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a")
        operator.set("team-a", {"max_queued": 3, "max_timeout_seconds": 10})
        with pytest.raises(QuotaExceededError, match="max_timeout_seconds"):
            await services.dispatcher.submit(RunRequest(skill=skill, command="true", timeout=11), owner="team-a")
        await services.dispatcher.submit(RunRequest(skill=skill, command="true", timeout=10), owner="team-a")
        operator.set("team-a", {"max_queued": None, "max_timeout_seconds": None})  # back to the defaults
        await other.dispatcher.submit(RunRequest(skill=skill, command="true", timeout=600), owner="team-a")
        assert await services.dispatcher.usage("team-a") == (4, 0)
    finally:
        await other.close()
