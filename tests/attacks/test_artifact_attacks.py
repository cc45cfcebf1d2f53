"""Attacks on what a run makes the artifact store keep: many files, sparse files that cost no disk in the
workspace, content that redaction lengthens. Each is bounded by the run's own ``artifact_total_bytes`` (every file
at its full size, checked before it is read and again as it is stored), and a file past it is refused with the
reason while the others stand. The store's size is read from its folder, not taken from the result.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
