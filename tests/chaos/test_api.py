"""The API process SIGKILLed and SIGTERMed under waiting callers, and 500 open waits while runs are submitted.

The API runs as deployed: ``skillrun serve`` over Redis (runs, teams and keys there) in a process of its own, with a
worker process executing the runs. A *holding* run keeps the only worker busy until the test lets it end, so the
runs the callers wait for are still to come when the fault lands.
"""

from __future__ import annotations

import asyncio
import signal

import httpx
import pytest

from tests.chaos import ledger
from tests.chaos.conftest import until
from tests.services import connections_to

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CALLERS = 50


async def _submit(c: httpx.AsyncClient, command: str, **fields) -> str:
    answer = await c.post("/v1/runs", json={"skill": "python-math", "command": command, **fields}, timeout=60)
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]


async def _hold(c: httpx.AsyncClient, work_root, name: str) -> tuple[str, str]:
    """Submit a holding run in workspace ``name`` and wait until its command began; its id and workspace tag."""
    run_id = await _submit(c, ledger.gated(name).command, workspace_id=name)
    tag = f"chaos.{name}"  # the API names a team's workspace <team>.<id>
    await until(lambda: ledger.lines(work_root, tag), 120, f"the holding run {name} beginning")
    return run_id, tag


async def _outcomes(c: httpx.AsyncClient, ids: list[str]) -> list[dict]:
    answers = await asyncio.gather(*(c.get(f"/v1/runs/{run_id}", params={"wait": 120}) for run_id in ids))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
    return [a.json() for a in answers]


async def test_the_api_sigkilled_then_sigtermed_under_50_waiting_callers_loses_no_run_and_every_caller_learns_its_own(
        redis_url, api_processes, workers, work_root):
    api = api_processes(redis_url)
    await api.start()
    workers.start(redis_url)

    async with api.client() as c:
        _, hold = await _hold(c, work_root, "hold-kill")
        killed = [await _submit(c, f"echo killed-{i}") for i in range(CALLERS)]
    async with api.client(CALLERS) as callers:  # SIGKILL: no answer can come; callers are told by their connection
        waits = [asyncio.create_task(callers.get(f"/v1/runs/{run_id}", params={"wait": 300})) for run_id in killed]
        await until(lambda: connections_to(api.port) >= CALLERS, 60, "every caller connected")
        ledger.release(work_root, hold, "go")  # the runs go on while the API is gone
        api.kill()
        outcomes = await asyncio.gather(*waits, return_exceptions=True)
    assert all(isinstance(o, httpx.TransportError) for o in outcomes), [o for o in outcomes if not isinstance(
        o, httpx.TransportError)]  # told at once, not left hanging

    await api.start()  # on the same port: the callers come back
    async with api.client(CALLERS) as c:
        for i, done in enumerate(await _outcomes(c, killed)):
            assert (done["status"], done["attempts"], done["result"]["stdout"]) == ("finished", 1, f"killed-{i}\n"), done
        holding, hold = await _hold(c, work_root, "hold-term")
        termed = [await _submit(c, f"echo termed-{i}") for i in range(CALLERS)]
    async with api.client(CALLERS) as callers:  # SIGTERM: every wait answered with its run as it stands
        waits = [asyncio.create_task(callers.get(f"/v1/runs/{run_id}", params={"wait": 300})) for run_id in termed]
        await until(lambda: connections_to(api.port) >= CALLERS, 60, "every caller connected")
        await asyncio.sleep(1)  # and read by the API (a request not read yet is dropped, not answered)
        api.proc.send_signal(signal.SIGTERM)
        answers = await asyncio.gather(*waits)
        assert await asyncio.to_thread(api.proc.wait, 60) in (0, -signal.SIGTERM)  # 60 s: a hang guard
    assert {(a.status_code, a.json()["status"]) for a in answers} == {(200, "queued")}, [a.text for a in answers]
    assert [a.json()["id"] for a in answers] == termed

    ledger.release(work_root, hold, "go")
    await api.start()
    async with api.client(CALLERS + 10) as c:
        for i, done in enumerate(await _outcomes(c, termed)):
            assert (done["status"], done["attempts"], done["result"]["stdout"]) == ("finished", 1, f"termed-{i}\n"), done
        assert (await _outcomes(c, [holding]))[0]["result"]["stdout"] == "go\n"
    assert all(w.poll() is None for w in workers.procs)


WAITS = 500
WAITED_RUNS = 10
SUBMITTED = 20


async def test_500_open_waits_leave_submissions_answered_and_each_wait_ends_with_its_runs_result(
        redis_url, api_processes, workers, work_root):
    api = api_processes(redis_url)
    await api.start()
    workers.start(redis_url)
    async with api.client() as c:
        _, hold = await _hold(c, work_root, "hold-waits")
        waited = [await _submit(c, f"echo waited-{i}") for i in range(WAITED_RUNS)]
    async with api.client(WAITS) as callers, api.client() as c:
        waits = [asyncio.create_task(callers.get(f"/v1/runs/{waited[i % WAITED_RUNS]}", params={"wait": 300}))
                 for i in range(WAITS)]
        await until(lambda: connections_to(api.port) >= WAITS, 120, f"{WAITS} callers connected")

        # While they wait: submissions, reads and the health check still answer (60 s: a hang guard; before the
        # waits went async, 200 of them left a submission unanswered for minutes).
        submitted = await asyncio.gather(*(_submit(c, f"echo submitted-{i}") for i in range(SUBMITTED)))
        assert (await c.get("/healthz", timeout=60)).status_code == 200
        listed = (await c.get("/v1/runs", params={"status": "queued", "limit": 100}, timeout=60)).json()
        assert set(waited + submitted) <= {r["id"] for r in listed["data"]}
        assert not any(w.done() for w in waits)  # nobody was answered before their run ended

        ledger.release(work_root, hold, "go")
        answers = await asyncio.gather(*waits)
        for i, answer in enumerate(answers):
            done = answer.json()
            assert answer.status_code == 200 and done["id"] == waited[i % WAITED_RUNS], answer.text
            assert (done["status"], done["result"]["stdout"]) == ("finished", f"waited-{i % WAITED_RUNS}\n"), done
        for i, done in enumerate(await _outcomes(c, submitted)):
            assert (done["status"], done["result"]["stdout"]) == ("finished", f"submitted-{i}\n"), done
