"""Review of issue 30's artifact bounds: the team quota ``max_artifact_bytes`` (orchestrator.quotas.hold_artifacts,
checked at submission) and the run's ``limits.artifact_total_bytes``; and what a failed run's record says.

A run is held to what the team had left *when it was submitted*: runs submitted together, or queued behind one
another, are each given the whole room. The store's size is read from its folder (``stored_bytes``)."""

from __future__ import annotations

import asyncio

import pytest

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


@pytest.mark.xfail(strict=True, reason="four runs submitted at once by a team with max_artifact_bytes 50 MiB (one "
                                       "running at a time) are each left the whole 50 MiB at submission, and the "
                                       "room is never checked again when a queued run starts: 160 MiB stored "
                                       "(the overshoot grows with max_queued, each run up to 64 GiB)")
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
    assert stored_bytes(services) <= 50 * MiB, (len(accepted), stored_bytes(services))


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
