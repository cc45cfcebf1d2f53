"""The memory run store (the embedded default) ends what a run leaves on time, as the Redis store does: an expired
run is never served and is forgotten at the next call, whatever it is, with no later run needed; a team's artifact
tally holds the hours of the artifacts' retention only. Time is a clock the test moves."""

from __future__ import annotations

from worker.contract import RunRequest, RunResult, SkillRef
from worker.run_store import Attempt, MemoryRunStore
from worker.run_store.base import TALLY_SECONDS

TTL_SECONDS = 3600
SKILL = SkillRef(name="demo", root="/nowhere")
ARTIFACT = {"name": "out/a", "version": 1, "mime_type": "text/plain", "size": 10, "sha256": "0" * 64}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _end(store: MemoryRunStore, artifacts: list[dict] | None = None) -> str:
    record = store.create(RunRequest(skill=SKILL, command="true"), "team-a")
    started = store.start(record.id, "w1")
    store.finish(record.id, RunResult(exit_code=0, run_id=record.id, workspace_id="w", runtime="local",
                                      artifact_files=artifacts or []), Attempt.of(started))
    return record.id


def test_an_expired_run_is_neither_served_nor_kept_when_no_run_follows_it():
    clock = Clock()
    store = MemoryRunStore(result_ttl=TTL_SECONDS, clock=clock, artifact_ttl=TTL_SECONDS)
    ended = [_end(store) for _ in range(3)]
    clock.now += TTL_SECONDS + 1
    assert store.get(ended[0]) is None
    assert store._records == {} and store._events == {}
    assert store.events(ended[1]) == [] and store.list() == []
    assert store.stats()["status"] == {}


def test_a_teams_artifact_tally_holds_the_retentions_hours_only_however_long_it_keeps_storing():
    clock = Clock()
    kept_hours = 3
    store = MemoryRunStore(result_ttl=TTL_SECONDS, clock=clock, artifact_ttl=kept_hours * TALLY_SECONDS)
    for _ in range(10 * kept_hours):  # an artifact every hour; nobody asks what the team's tally holds
        _end(store, [ARTIFACT])
        clock.now += TALLY_SECONDS
    assert len(store._artifacts["team-a"]) <= kept_hours + 1
