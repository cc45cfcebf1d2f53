"""Attacks on what a run makes the artifact store keep: many files, sparse files that cost no disk in the
workspace, content that redaction lengthens. Each is bounded by the run's own ``artifact_total_bytes`` (every file
at its full size, checked before it is read and again as it is stored), and a file past it is refused with the
reason while the others stand. The store's size is read from its folder, not taken from the result.

A team's quota of stored artifacts (``max_artifact_bytes``) counts what its ended runs keep and the room its runs
going hold: each run saving artifacts is given its room when it is accepted, atomically with the check (memory and
Redis stores, one or two dispatchers submitting at once), and gives it back in the write that ends it, however it
ends, tallying what it stored instead.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from orchestrator.dispatch import QueueDispatcher
from orchestrator.documents import FileDocuments
from orchestrator.errors import UnavailableError
from orchestrator.quotas import ARTIFACT_RETRY_AFTER_SECONDS, QuotaExceededError, Quotas, TeamQuota
from orchestrator.skills import create_default_skill_repository
from tests.attacks.test_secret_attacks import (  # noqa: F401 - the secrets fixtures
    key,
    put_secret,
    run,
    secret_library,
    services,
    store,
)
from tests.orchestrator.api_helpers import LIBRARY, client, new_team
from tests.orchestrator.conftest import model_server  # noqa: F401 - the scripted model
from worker.contract import RunRequest, RunResult, SkillRef
from worker.run_store import ArtifactRoomRefusedError, MemoryRunStore, RedisRunStore, RunRecord, RunStatus
from worker.run_store.fencing import Attempt

MiB = 1024 * 1024


def stored_bytes(services) -> int:  # noqa: F811
    """What the artifact store's folder holds (the files' data, as allocated or not)."""
    root = Path(services.artifact_store.root)
    return sum(os.path.getsize(path) for path in root.rglob("data")) if root.is_dir() else 0


async def test_many_files_store_no_more_than_the_runs_artifact_total(services):  # noqa: F811
    async with client(services, new_team(services, "team-a")) as api:
        answer = (await run(api, skill="plain", command="for i in 1 2 3 4 5; do head -c 30M /dev/zero > out/$i; done",
                            output_files=["out/*"], save_as_artifacts=True, omit_inline_content=True,
                            limits={"output_total_bytes": MiB, "artifact_total_bytes": 100 * MiB})).json()
    result = answer["result"]
    assert [artifact["name"] for artifact in result["artifact_files"]] == ["out/1", "out/2", "out/3"]
    assert [(skipped["name"], skipped["reason"]) for skipped in result["skipped_files"]] == [
        ("out/4", f"is {30 * MiB} bytes, more than the {10 * MiB} the run's artifacts may still hold "
                  "(limits.artifact_total_bytes)"),
        ("out/5", f"is {30 * MiB} bytes, more than the {10 * MiB} the run's artifacts may still hold "
                  "(limits.artifact_total_bytes)")]
    assert stored_bytes(services) == 90 * MiB  # it stored 152 MiB past a 1 MiB output_total_bytes before


async def test_sparse_files_count_at_their_full_size(services):  # noqa: F811
    async with client(services, new_team(services, "team-a")) as api:
        answer = (await run(api, skill="plain", command="truncate -s 100M out/a out/b out/c; du -k out/a",
                            output_files=["out/*"], save_as_artifacts=True, omit_inline_content=True,
                            limits={"artifact_total_bytes": 150 * MiB})).json()
    result = answer["result"]
    assert int(result["stdout"].split()[0]) <= 8  # no disk in the workspace
    assert [artifact["name"] for artifact in result["artifact_files"]] == ["out/a"]
    assert [skipped["name"] for skipped in result["skipped_files"]] == ["out/b", "out/c"]
    assert stored_bytes(services) == 100 * MiB  # three sparse files became 300 MiB in the store before


async def test_content_that_redaction_lengthens_is_refused_once_it_passes_the_room_left(services):  # noqa: F811
    password = "pw8bytes"  # 8 bytes, and each becomes the 18 of [redacted:DB_PASS]
    command = 'for i in $(seq 100000); do printf %s "$DB_PASS"; done > out/passwords; head -c 100 /dev/zero > out/z'
    size = 100000 * len(password)
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "DB_PASS", password)
        answer = await run(api, skill="github", command=command, secrets=["DB_PASS"], output_files=["out/*"],
                           save_as_artifacts=True, omit_inline_content=True,
                           limits={"artifact_total_bytes": size + 1000})
    result = answer.json()["result"]
    (skipped,) = result["skipped_files"]
    assert skipped["name"] == "out/passwords" and "could not be stored as an artifact" in skipped["reason"]
    assert f"larger than {size + 1000} bytes" in skipped["reason"]
    assert [artifact["name"] for artifact in result["artifact_files"]] == ["out/z"]
    assert stored_bytes(services) == 100 and password not in answer.text


@pytest.mark.parametrize("total", [-1, 64 * 1024**3 + 1])
async def test_an_artifact_total_outside_its_bounds_is_refused_before_anything_runs(services, total):  # noqa: F811
    async with client(services, new_team(services, "team-a")) as api:
        refused = await api.post("/v1/runs", json={"skill": "plain", "command": "true",
                                                   "limits": {"artifact_total_bytes": total}})
        assert refused.status_code == 422 and "artifact_total_bytes" in refused.text
        assert (await api.get("/v1/runs")).json()["count"] == 0


# ---- the team's quota of stored artifacts --------------------------------------------------------------------------

async def test_a_teams_stored_artifacts_stop_at_its_quota_and_other_teams_are_not_counted(services):  # noqa: F811
    services.dispatcher.quotas = Quotas(FileDocuments(services.teams.docs.root), TeamQuota(max_queued=1000))
    services.dispatcher.quotas.set("team-a", {"max_artifact_bytes": 50 * MiB})

    async def save(api, command: str, **fields) -> dict:
        return (await run(api, skill="plain", command=command, output_files=["out/*"], save_as_artifacts=True,
                          omit_inline_content=True, **fields)).json()["result"]

    async with client(services, new_team(services, "team-a")) as api, \
            client(services, new_team(services, "team-b")) as other:
        first = await save(api, "head -c 30M /dev/zero > out/a")
        second = await save(api, "head -c 15M /dev/zero > out/b; head -c 15M /dev/zero > out/c")
        third = await save(api, "head -c 5M /dev/zero > out/d")
        refused = await api.post("/v1/runs", json={"skill": "plain", "command": "true", "save_as_artifacts": True})
        plain = (await run(api, skill="plain", command="echo still runs")).json()["result"]
        elsewhere = await save(other, "head -c 40M /dev/zero > out/e")
        usage = (await api.get("/v1/quota")).json()["usage"]
    assert [a["name"] for a in first["artifact_files"]] == ["out/a"]
    assert [a["name"] for a in second["artifact_files"]] == ["out/b"]
    assert second["skipped_files"] == [{"name": "out/c", "reason": f"is {15 * MiB} bytes, more than the {5 * MiB} "
                                                                   "the run's artifacts may still hold "
                                                                   "(limits.artifact_total_bytes)"}]
    assert [a["name"] for a in third["artifact_files"]] == ["out/d"]
    assert refused.status_code == 429 and "max_artifact_bytes" in refused.text
    assert refused.headers["retry-after"] == str(ARTIFACT_RETRY_AFTER_SECONDS)
    assert plain["stdout"] == "still runs\n"  # a run saving no artifact is not held back
    assert [a["name"] for a in elsewhere["artifact_files"]] == ["out/e"]
    assert (usage["artifact_bytes"], usage["artifact_bytes_reserved"]) == (50 * MiB, 0)
    assert stored_bytes(services) == 90 * MiB


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_teams_artifact_tally_ends_with_the_artifacts_retention(kind, redis_url):
    now = [1_000_000.0]
    clock = lambda: now[0]  # noqa: E731
    connection = redis.Redis.from_url(redis_url)
    runs = (MemoryRunStore(clock=clock, artifact_ttl=7200) if kind == "memory"
             else RedisRunStore(connection, clock=clock, artifact_ttl=7200))
    for hour in range(5):
        record = runs.create(RunRequest(skill=SkillRef(name="demo", root="/r"), command="true"), owner="team-a")
        started = runs.start(record.id, "w")
        result = RunResult(run_id=record.id, workspace_id=record.request.workspace_id, runtime="local", exit_code=0,
                           artifact_files=[{"name": "x", "version": 1, "mime_type": "text/plain", "size": 1000,
                                            "sha256": "0" * 64}])
        runs.finish(record.id, result, Attempt.of(started))
        now[0] += 3600
    assert runs.team_artifact_bytes("team-a") == 2000  # the runs of the last two hours; older artifacts are gone
    assert runs.team_artifact_bytes("team-b") == 0
    now[0] += 3 * 3600
    assert runs.team_artifact_bytes("team-a") == 0
    if kind == "redis":  # the tally shrinks with what it counts, and goes with the last of it
        assert not connection.exists(runs.keys.team_artifacts("team-a"))


# ---- the room a run saving artifacts holds, from its acceptance to its end ----------------------------------------

QUOTA = 50 * MiB
ENDINGS = ["finished", "failed", "cancelled while queued", "cancelled while started", "lost"]
STORED = {"finished": 10 * MiB, "cancelled while started": 10 * MiB}
"""What a run that ended so had stored (its result's artifacts); the others ended with no result."""


def saving(asked: int, **fields) -> RunRequest:
    return RunRequest(skill=SkillRef(name="demo", root="/r"), command="true", output_files=["out/*"],
                      save_as_artifacts=True, limits={"artifact_total_bytes": asked}, **fields)


def stored_result(record: RunRecord, size: int) -> RunResult:
    return RunResult(run_id=record.id, workspace_id=record.request.workspace_id, runtime="local", exit_code=0,
                     artifact_files=[{"name": "out/a", "version": 1, "mime_type": "application/octet-stream",
                                      "size": size, "sha256": "0" * 64}] if size else [])


def lose(runs: RedisRunStore, record: RunRecord, max_attempts: int) -> RunRecord:
    """The worker of the started ``record`` died: its heartbeat is gone, and the run is recovered."""
    runs.redis.delete(runs.keys.part(record.id, "heartbeat"))
    recovered, _ = runs.requeue_lost(record.id, max_attempts)
    return recovered


def end(runs, record: RunRecord, how: str) -> RunRecord:
    """End ``record`` the way ``how`` says."""
    if how == "cancelled while queued":
        return runs.request_cancel(record.id)
    started = runs.start(record.id, "w")
    if how == "lost":  # retried first: the run goes on, and so does its hold; then lost out of attempts
        assert lose(runs, started, 2).status == RunStatus.QUEUED
        assert runs.team_artifact_reserved(record.owner) == QUOTA
        return lose(runs, runs.start(record.id, "w"), 2)
    if how == "failed":
        return runs.fail(record.id, "the runtime broke", Attempt.of(started))
    if how == "cancelled while started":
        runs.request_cancel(record.id)
    return runs.finish(record.id, stored_result(record, STORED[how]), Attempt.of(started))


def run_store(kind: str, redis_url: str):
    if kind == "memory":
        return MemoryRunStore(artifact_ttl=7200)
    return RedisRunStore(redis.Redis.from_url(redis_url), artifact_ttl=7200)


@pytest.mark.parametrize(("kind", "how"), [(kind, how) for kind in ("memory", "redis") for how in ENDINGS
                                           if (kind, how) != ("memory", "lost")])  # in memory: this process's runs
def test_a_runs_room_is_held_from_its_acceptance_until_it_ends_then_what_it_stored_is_kept(kind, how, redis_url):
    runs = run_store(kind, redis_url)
    first = runs.create(saving(30 * MiB), "team-a", artifact_limit=QUOTA)
    second = runs.create(saving(30 * MiB), "team-a", artifact_limit=QUOTA)  # 20 MiB are left of the 50
    with pytest.raises(ArtifactRoomRefusedError) as refused:
        runs.create(saving(1), "team-a", artifact_limit=QUOTA)
    plain = runs.create(RunRequest(skill=SkillRef(name="demo", root="/r"), command="true"), "team-a",
                        artifact_limit=QUOTA)  # saves no artifact: never held back, holds nothing
    other = runs.create(saving(30 * MiB), "team-b", artifact_limit=QUOTA)
    assert (first.artifact_bytes_reserved, second.artifact_bytes_reserved, plain.artifact_bytes_reserved) == \
        (30 * MiB, 20 * MiB, 0)
    assert runs.get(second.id).request.limits.artifact_total_bytes == 20 * MiB  # stored as accepted: lowered
    assert (refused.value.kept, refused.value.reserved, refused.value.limit) == (0, QUOTA, QUOTA)
    assert len(runs.list(owner="team-a")) == 2 + 1  # nothing of the refused run
    assert (runs.team_artifact_reserved("team-a"), runs.team_artifact_reserved("team-b")) == (QUOTA, 30 * MiB)

    ended = end(runs, first, how)
    assert ended.status.done, ended
    stored = STORED.get(how, 0)
    assert (runs.team_artifact_bytes("team-a"), runs.team_artifact_reserved("team-a")) == (stored, 20 * MiB)
    third = runs.create(saving(QUOTA), "team-a", artifact_limit=QUOTA)
    assert third.artifact_bytes_reserved == QUOTA - 20 * MiB - stored

    for going in (second, third, other):
        runs.request_cancel(going.id)
    assert (runs.team_artifact_reserved("team-a"), runs.team_artifact_reserved("team-b")) == (0, 0)
    assert runs.team_artifact_bytes("team-a") == stored
    if kind == "redis":  # each hold went with its run, and the hash with the last of them
        assert not runs.redis.exists(runs.keys.team_reserved("team-a"), runs.keys.team_reserved("team-b"))


def test_a_hold_whose_run_record_is_gone_or_ended_counts_no_more(redis_url):
    runs = RedisRunStore(redis.Redis.from_url(redis_url), artifact_ttl=7200)
    gone = runs.create(saving(QUOTA), "team-a", artifact_limit=QUOTA)
    kept = runs.create(saving(QUOTA), "team-b", artifact_limit=QUOTA)
    runs.redis.delete(runs.keys.record(gone.id))  # removed by hand, or lost with a flushed database
    given = runs.create(saving(10 * MiB), "team-a", artifact_limit=QUOTA)
    assert given.artifact_bytes_reserved == 10 * MiB
    assert runs.redis.hgetall(runs.keys.team_reserved("team-a")) == {given.id.encode(): str(10 * MiB).encode()}
    ended = given.model_copy(update={"status": RunStatus.FINISHED})  # by a writer that left its hold
    runs.redis.set(runs.keys.record(given.id), ended.model_dump_json(), ex=60)
    assert runs.team_artifact_reserved("team-a") == 0 and not runs.redis.exists(runs.keys.team_reserved("team-a"))
    assert runs.team_artifact_reserved("team-b") == QUOTA and runs.get(kept.id) is not None


def test_runs_created_at_once_in_memory_are_given_no_more_room_than_the_quota():
    runs = MemoryRunStore(artifact_ttl=7200)

    def submit_and_store_it_all(_: int) -> int:
        """A run asking for 4 MiB, which stores all it was given; what it was given (0: refused)."""
        try:
            record = runs.create(saving(4 * MiB), "team-a", artifact_limit=QUOTA)
        except ArtifactRoomRefusedError:
            return 0
        started = runs.start(record.id, "w")
        runs.finish(record.id, stored_result(record, record.artifact_bytes_reserved), Attempt.of(started))
        return record.artifact_bytes_reserved

    with ThreadPoolExecutor(8) as pool:
        given = [room for room in pool.map(submit_and_store_it_all, range(40)) if room]
    assert sorted(given) == [2 * MiB] + [4 * MiB] * 12  # all of the 50 MiB, and no more
    assert (runs.team_artifact_bytes("team-a"), runs.team_artifact_reserved("team-a")) == (QUOTA, 0)


@pytest.fixture
def skill():
    return create_default_skill_repository(str(LIBRARY)).skill_ref("python-math")


async def test_runs_submitted_at_once_through_two_queue_dispatchers_are_given_no_more_room_than_the_quota(
        redis_url, skill, tmp_path):
    # No quota of queued runs: its count, watched too, would make the submissions take turns by itself
    quotas = Quotas(FileDocuments(tmp_path), TeamQuota(max_running=0, max_queued=0, max_artifact_bytes=QUOTA))
    dispatchers = [QueueDispatcher(redis_url), QueueDispatcher(redis_url)]
    for dispatcher in dispatchers:
        dispatcher.quotas = quotas
    runs = dispatchers[0].store

    async def submit(number: int) -> RunRecord | QuotaExceededError:
        request = RunRequest(skill=skill, command="true", output_files=["out/*"], save_as_artifacts=True,
                             limits={"artifact_total_bytes": 4 * MiB})
        try:
            return await dispatchers[number % 2].submit(request, owner="team-a")
        except QuotaExceededError as exc:
            return exc

    def end_storing_half(record: RunRecord) -> None:
        started = runs.start(record.id, "w")
        runs.finish(record.id, stored_result(record, record.artifact_bytes_reserved // 2), Attempt.of(started))

    try:
        answers = await asyncio.gather(*(submit(number) for number in range(40)))
        accepted = [answer for answer in answers if isinstance(answer, RunRecord)]
        assert {answer.what for answer in answers if not isinstance(answer, RunRecord)} == {"max_artifact_bytes"}
        assert sorted(record.artifact_bytes_reserved for record in accepted) == [2 * MiB] + [4 * MiB] * 12
        assert {record.id: runs.get(record.id).request.limits.artifact_total_bytes for record in accepted} == \
            {record.id: record.artifact_bytes_reserved for record in accepted}  # each stored with its room
        assert runs.team_artifact_reserved("team-a") == QUOTA and len(runs.list(owner="team-a")) == len(accepted)

        # Runs end, each storing half its room, while more are submitted: what they give back is shared, no more
        ending = [asyncio.to_thread(end_storing_half, record) for record in accepted]
        more = await asyncio.gather(*ending, *(submit(number) for number in range(20)))
        later = [answer for answer in more[len(ending):] if isinstance(answer, RunRecord)]
        kept, reserved = runs.team_artifact_bytes("team-a"), runs.team_artifact_reserved("team-a")
        assert kept == QUOTA // 2
        assert reserved == sum(record.artifact_bytes_reserved for record in later) <= QUOTA - kept
    finally:
        for dispatcher in dispatchers:
            await dispatcher.close()


async def test_a_submission_that_fails_before_it_is_enqueued_holds_no_room(redis_url, skill, tmp_path,
                                                                           monkeypatch):
    dispatcher = QueueDispatcher(redis_url)
    dispatcher.quotas = Quotas(FileDocuments(tmp_path), TeamQuota(max_running=0, max_queued=0,
                                                                  max_artifact_bytes=QUOTA))

    def redis_went_away(*args, **kwargs):
        raise redis.ConnectionError("gone")

    monkeypatch.setattr(dispatcher, "_enqueue", redis_went_away)
    request = RunRequest(skill=skill, command="true", output_files=["out/*"], save_as_artifacts=True)
    try:
        with pytest.raises(UnavailableError):
            await dispatcher.submit(request, owner="team-a")
        assert dispatcher.store.team_artifact_reserved("team-a") == 0
        assert dispatcher.store.get(request.run_id) is None
    finally:
        await dispatcher.close()


async def test_the_teams_usage_shows_the_room_its_runs_going_hold_until_they_end(services):  # noqa: F811
    services.dispatcher.quotas = Quotas(FileDocuments(services.teams.docs.root), TeamQuota(max_queued=1000))
    services.dispatcher.quotas.set("team-a", {"max_artifact_bytes": QUOTA})
    body = {"skill": "plain", "command": "sleep 60", "timeout": 120, "output_files": ["out/*"],
            "save_as_artifacts": True}
    async with client(services, new_team(services, "team-a")) as api:
        first = await api.post("/v1/runs", json={**body, "limits": {"artifact_total_bytes": 20 * MiB}})
        second = await api.post("/v1/runs", json=body)  # asks for the default 512 MiB: given the 30 left
        refused = await api.post("/v1/runs", json=body)
        going = (await api.get("/v1/quota")).json()["usage"]
        for answer in (first, second):
            await api.post(f"/v1/runs/{answer.json()['id']}/cancel")
            ended = await api.get(f"/v1/runs/{answer.json()['id']}", params={"wait": 60})
            assert ended.json()["status"] == "cancelled", ended.text
        after = (await api.get("/v1/quota")).json()["usage"]
    assert (first.status_code, second.status_code, refused.status_code) == (202, 202, 429)
    assert "max_artifact_bytes" in refused.text and f"hold {QUOTA} more" in refused.text
    assert refused.headers["retry-after"] == str(ARTIFACT_RETRY_AFTER_SECONDS)
    assert services.dispatcher.store.get(second.json()["id"]).request.limits.artifact_total_bytes == 30 * MiB
    assert (going["artifact_bytes"], going["artifact_bytes_reserved"]) == (0, QUOTA)
    assert (after["artifact_bytes"], after["artifact_bytes_reserved"]) == (0, 0)
