"""Attacks on what a run makes the artifact store keep: many files, sparse files that cost no disk in the
workspace, content that redaction lengthens. Each is bounded by the run's own ``artifact_total_bytes`` (every file
at its full size, checked before it is read and again as it is stored), and a file past it is refused with the
reason while the others stand. The store's size is read from its folder, not taken from the result.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

from orchestrator.documents import FileDocuments
from orchestrator.quotas import ARTIFACT_RETRY_AFTER_SECONDS, Quotas, TeamQuota
from tests.attacks.test_secret_attacks import (  # noqa: F401 - the secrets fixtures
    key,
    put_secret,
    run,
    secret_library,
    services,
    store,
)
from tests.orchestrator.api_helpers import client, new_team
from tests.orchestrator.conftest import model_server  # noqa: F401 - the scripted model
from worker.contract import RunRequest, RunResult, SkillRef
from worker.run_store import MemoryRunStore, RedisRunStore
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
    assert usage["artifact_bytes"] == 50 * MiB
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
