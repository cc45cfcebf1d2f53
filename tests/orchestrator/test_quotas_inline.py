"""Team quotas in the embedded (inline) dispatcher: past ``max_running`` a team's runs wait their turn, in order,
while other teams' runs go on; a run cancelled while it waits ends at once, never started; ``max_queued`` counts the
waiting ones and refuses the rest with nothing stored."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestrator.dispatch import InlineDispatcher
from orchestrator.documents import FileDocuments
from orchestrator.quotas import QuotaExceededError, Quotas, TeamQuota
from worker.run_store import RunRecord, RunStatus
from worker.runtimes.local.runtime import LocalWorkspaceRuntime


@pytest.fixture
async def dispatcher(work_root, shared_dir):
    runtime = LocalWorkspaceRuntime(work_root)
    inline = InlineDispatcher({"local": runtime})
    inline.quotas = Quotas(FileDocuments(shared_dir / "registry"), TeamQuota(max_running=0, max_queued=1000))
    yield inline
    await inline.close()


async def until(check, what: str, seconds: float = 60) -> None:
    """Wait for ``check()`` (a bound against hanging, not a figure)."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def status(dispatcher: InlineDispatcher, record: RunRecord) -> RunStatus:
    return dispatcher.store.get(record.id).status


def assert_one_at_a_time(records: list[RunRecord]) -> None:
    ordered = sorted(records, key=lambda r: r.started_at)
    for before, after in zip(ordered, ordered[1:]):
        assert after.started_at >= before.finished_at, f"{after.id} started while {before.id} ran"


async def test_past_max_running_a_teams_runs_never_overlap_while_another_teams_run_meanwhile(dispatcher,
                                                                                             make_request):
    dispatcher.quotas.set("team-a", {"max_running": 1})
    long = await dispatcher.submit(make_request("sleep 60", timeout=120), owner="team-a")
    rest = [await dispatcher.submit(make_request("true"), owner="team-a") for _ in range(3)]
    await until(lambda: status(dispatcher, long) == RunStatus.STARTED, "team-a's first run never started")
    others = [await dispatcher.submit(make_request("true"), owner="team-b") for _ in range(3)]
    for record in others:  # no cap of team-b's waits for team-a's runs
        assert (await dispatcher.wait(record.id, 60)).status == RunStatus.FINISHED
    assert [status(dispatcher, r) for r in rest] == [RunStatus.QUEUED] * 3
    assert dispatcher.store.team_usage("team-a") == (3, 1)
    await dispatcher.cancel(long.id)
    done = [await dispatcher.wait(r.id, 60) for r in [long, *rest]]
    assert [r.status for r in done] == [RunStatus.CANCELLED] + [RunStatus.FINISHED] * 3
    assert_one_at_a_time(done)
    assert [r.id for r in sorted(done[1:], key=lambda r: r.started_at)] == [r.id for r in rest]  # in order
    await dispatcher.drain()
    assert dispatcher.store.team_usage("team-a") == (0, 0)
    assert dispatcher._running == {}


async def test_a_run_cancelled_while_it_waits_for_its_teams_turn_ends_at_once_and_never_starts(dispatcher,
                                                                                                 make_request):
    dispatcher.quotas.set("team-a", {"max_running": 1, "max_queued": 2})
    long = await dispatcher.submit(make_request("sleep 60", timeout=120), owner="team-a")
    await until(lambda: status(dispatcher, long) == RunStatus.STARTED, "team-a's first run never started")
    waiting = await dispatcher.submit(make_request("echo never"), owner="team-a")
    after = await dispatcher.submit(make_request("echo after"), owner="team-a")
    with pytest.raises(QuotaExceededError, match="max_queued"):
        await dispatcher.submit(make_request("true"), owner="team-a")
    cancelled = await dispatcher.cancel(waiting.id)
    assert cancelled.status == RunStatus.CANCELLED and cancelled.started_at is None
    assert waiting.id not in dispatcher._tasks or dispatcher._tasks[waiting.id].cancelling()
    assert (await dispatcher.wait(waiting.id, 1)).status == RunStatus.CANCELLED  # ended, not waiting on
    assert status(dispatcher, long) == RunStatus.STARTED
    late = await dispatcher.submit(make_request("true"), owner="team-a")  # its place in max_queued is free at once
    await dispatcher.cancel(long.id)
    assert (await dispatcher.wait(after.id, 60)).result.stdout == "after\n"
    assert (await dispatcher.wait(late.id, 60)).status == RunStatus.FINISHED
    await dispatcher.drain()
    gone = dispatcher.store.get(waiting.id)
    assert gone.status == RunStatus.CANCELLED and gone.started_at is None and gone.result is None
    assert [e.type for e in dispatcher.store.events(waiting.id)] == ["queued", "cancelled"]


async def test_a_team_at_max_queued_submitting_100_runs_at_once_gets_exactly_its_room(dispatcher, make_request):
    dispatcher.quotas.set("team-a", {"max_running": 1, "max_queued": 10})
    long = await dispatcher.submit(make_request("sleep 60", timeout=120), owner="team-a")
    await until(lambda: status(dispatcher, long) == RunStatus.STARTED, "team-a's first run never started")
    outcomes = await asyncio.gather(*(dispatcher.submit(make_request("true"), owner="team-a") for _ in range(100)),
                                    return_exceptions=True)
    accepted = [o for o in outcomes if isinstance(o, RunRecord)]
    assert len(accepted) == 10
    assert all(isinstance(o, QuotaExceededError) and o.what == "max_queued" for o in outcomes
               if not isinstance(o, RunRecord))
    assert {r.id for r in dispatcher.store.list(owner="team-a", limit=1000)} == {long.id, *(r.id for r in accepted)}
    await dispatcher.cancel(long.id)
    for record in accepted:
        assert (await dispatcher.wait(record.id, 60)).status == RunStatus.FINISHED


async def test_a_run_the_model_waits_on_holds_its_teams_turn_too(dispatcher, make_request):
    """``run`` (the skill_run tool's path) is held to max_running as ``submit`` is; cancelling its caller while it
    waits for the turn cancels the run before it starts."""
    dispatcher.quotas.set("team-a", {"max_running": 1})
    long = await dispatcher.submit(make_request("sleep 60", timeout=120), owner="team-a")
    await until(lambda: status(dispatcher, long) == RunStatus.STARTED, "team-a's first run never started")
    request = make_request("echo waited")
    caller = asyncio.create_task(dispatcher.run(request, owner="team-a"))
    await until(lambda: dispatcher.store.get(request.run_id) is not None, "the run was never accepted")
    assert status(dispatcher, dispatcher.store.get(request.run_id)) == RunStatus.QUEUED
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    stopped = dispatcher.store.get(request.run_id)
    assert stopped.status == RunStatus.CANCELLED and stopped.started_at is None
    second = make_request("echo second")
    caller = asyncio.create_task(dispatcher.run(second, owner="team-a"))
    await dispatcher.cancel(long.id)
    assert (await caller).stdout == "second\n"


async def test_a_run_cancelled_just_as_its_turn_comes_hands_the_turn_on(dispatcher, make_request, monkeypatch):
    """The turn handed to a waiting run (the one notified when a run of its team ended) is not lost when that run
    is cancelled before it takes it: the next waiting run starts."""
    dispatcher.quotas.set("team-a", {"max_running": 1})
    long = await dispatcher.submit(make_request("sleep 60", timeout=120), owner="team-a")
    await until(lambda: status(dispatcher, long) == RunStatus.STARTED, "team-a's first run never started")
    unlucky = await dispatcher.submit(make_request("echo unlucky"), owner="team-a")
    after = await dispatcher.submit(make_request("echo after"), owner="team-a")
    await until(lambda: len(dispatcher._turns["team-a"]._waiters) == 2, "the runs never waited for their turn")
    turn = dispatcher._turns["team-a"]
    notify = turn.notify

    def notify_then_cancel(n: int = 1) -> None:  # the cancel lands between the turn handed over and taken
        notify(n)
        if dispatcher.store.get(unlucky.id).status == RunStatus.QUEUED:
            dispatcher.store.request_cancel(unlucky.id)  # what dispatcher.cancel does, at that very moment
            dispatcher._tasks[unlucky.id].cancel()

    monkeypatch.setattr(turn, "notify", notify_then_cancel)
    await dispatcher.cancel(long.id)
    assert (await dispatcher.wait(unlucky.id, 60)).status == RunStatus.CANCELLED
    done = await dispatcher.wait(after.id, 30)
    assert done.status == RunStatus.FINISHED, "the turn went with the cancelled run: the next one waits for ever"
    assert done.result.stdout == "after\n"


async def test_a_ceiling_under_a_default_lowers_the_default_and_refuses_only_what_is_asked_for_past_it(dispatcher,
                                                                                                      make_request):
    dispatcher.quotas.set("team-a", {"max_timeout_seconds": 30, "max_memory_bytes": 256 * 1024**2})
    record = await dispatcher.submit(make_request("true"), owner="team-a")  # the defaults: 300 s, 4 GiB
    assert (record.request.timeout, record.request.limits.memory_bytes) == (30, 256 * 1024**2)
    assert (await dispatcher.wait(record.id, 60)).status == RunStatus.FINISHED
    with pytest.raises(QuotaExceededError, match=r"timeout is 31, over team team-a's quota max_timeout_seconds"):
        await dispatcher.submit(make_request("true", timeout=31), owner="team-a")
    assert dispatcher.store.team_usage("team-a") == (0, 0) and len(dispatcher.store.list(owner="team-a")) == 1
