"""Review of issue 30's artifact bounds: the team quota ``max_artifact_bytes`` and the run's
``limits.artifact_total_bytes``; and what a failed run's record says.

A run saving artifacts is given the room its team has left when it is accepted, and that room is held for it until
it ends (the run store's ``hold_artifact_room``), so runs submitted together, or queued behind one another, share the
room and never each get the whole of it. The store's size is read from its folder (``stored_bytes``)."""

from __future__ import annotations

import asyncio

from orchestrator.documents import FileDocuments
from orchestrator.quotas import Quotas, TeamQuota
from tests.attacks.test_artifact_attacks import stored_bytes
from tests.attacks.test_secret_attacks import (  # noqa: F401 - the secrets fixtures
    SECRET,
    WAIT,
    everything_of,
    key,
    leaked,
    put_secret,
    run,
    secret_library,
    services,
    store,
)
from tests.orchestrator.api_helpers import client, new_team
from tests.orchestrator.conftest import model_server  # noqa: F401 - the scripted model

MiB = 1024 * 1024


async def test_runs_submitted_together_keep_no_more_than_the_teams_artifact_quota(services):  # noqa: F811
    services.dispatcher.quotas = Quotas(FileDocuments(services.teams.docs.root), TeamQuota(max_queued=1000))
    services.dispatcher.quotas.set("team-a", {"max_artifact_bytes": 50 * MiB, "max_running": 1})
    async with client(services, new_team(services, "team-a")) as api:
        submitted = await asyncio.gather(*(api.post("/v1/runs", json={
            "skill": "plain", "command": f"head -c 40M /dev/zero > out/{i}", "output_files": ["out/*"],
            "save_as_artifacts": True, "omit_inline_content": True}) for i in range(4)))
        accepted = [answer.json()["id"] for answer in submitted if answer.status_code == 202]
        for run_id in accepted:
            ended = await api.get(f"/v1/runs/{run_id}", params={"wait": WAIT})
            assert ended.json()["status"] in ("finished", "failed"), ended.text
        usage = (await api.get("/v1/quota")).json()["usage"]
    # The first accepted asked for the default 512 MiB and was given, and held, the whole 50: the others found
    # nothing left while it ran (one accepted after it ended would be given the 10 left, and its 40 MiB refused)
    assert accepted and all(answer.status_code == 429 and "max_artifact_bytes" in answer.text
                            for answer in submitted if answer.status_code != 202)
    assert stored_bytes(services) == 40 * MiB
    assert (usage["artifact_bytes"], usage["artifact_bytes_reserved"]) == (40 * MiB, 0)


async def test_a_secret_in_a_failed_runs_reason_and_events_never_comes_back(services):  # noqa: F811
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        submitted = await api.post("/v1/runs", json={"skill": "github", "command": "true", "secrets": ["GH_TOKEN"],
                                                     "cwd": f"work/missing-{SECRET}"})
        if submitted.status_code != 202:  # refused before it ran: the refusal itself must not repeat the value
            assert leaked(submitted.text) == [], submitted.text
            return
        run_id = submitted.json()["id"]
        answer = await api.get(f"/v1/runs/{run_id}", params={"wait": WAIT})
        assert answer.json()["status"] in ("failed", "finished"), answer.text
        assert leaked(await everything_of(api, run_id)) == []


async def test_a_secret_in_an_output_files_name_and_a_skipped_files_reason_never_comes_back(services):  # noqa: F811
    command = ('mkdir -p "out/$GH_TOKEN" && head -c 2M /dev/zero > "out/$GH_TOKEN/big" && '
               'echo hi > "out/x-$GH_TOKEN.txt" && ln -s /etc/passwd "out/l-$GH_TOKEN"')
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        answer = await run(api, skill="github", command=command, secrets=["GH_TOKEN"], output_files=["out/**"],
                           save_as_artifacts=True, limits={"artifact_total_bytes": MiB})
        result = answer.json()["result"]
        assert result["skipped_files"], result  # the big file and the link were refused, naming them
        assert leaked(await everything_of(api, answer.json()["id"])) == []
