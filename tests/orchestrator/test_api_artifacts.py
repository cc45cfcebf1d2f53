"""Artifacts through the API, from each store (a folder, an S3 bucket): streamed with their type and length, a clear
404 for one the store does not hold, 503 while the store is away; and a worker on another "machine" (no shared
folder) saving to the S3 store what the API serves."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from orchestrator.dispatch import InlineDispatcher, QueueDispatcher
from tests.artifact_stores import S3Server
from tests.orchestrator.api_helpers import api_in_a_thread, make_services, new_team
from tests.orchestrator.api_helpers import client as api_client
from worker.artifacts import ArtifactStream, FileArtifactStore, create_artifact_store
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

REPO = Path(__file__).resolve().parents[2]
BIG = 12 * 1024 * 1024 + 5


@pytest.fixture
async def runtime(work_root, artifact_store):
    """The local runtime saving artifacts to each store."""
    rt = LocalWorkspaceRuntime(work_root, artifact_store=artifact_store)
    yield rt
    await rt.close()


async def _finished(client: httpx.AsyncClient, body: dict) -> dict:
    run_id = (await client.post("/v1/runs", json=body)).json()["id"]
    done = (await client.get(f"/v1/runs/{run_id}", params={"wait": 60})).json()
    assert done["status"] == "finished", done
    return done


async def test_a_large_artifact_streams_with_its_type_and_length(runtime, shared_dir):
    services = make_services(InlineDispatcher({"local": runtime}), runtime.artifact_store, shared_dir / "data")
    key = new_team(services, "team-a")
    with api_in_a_thread(services) as url:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as c:
            done = await _finished(c, {
                "skill": "python-math",
                "command": f"head -c {BIG} /dev/urandom > out/big.bin; echo '<b>hi</b>' > out/p.html",
                "output_files": ["out/*"], "save_as_artifacts": True, "omit_inline_content": True,
            })
            saved = {a["name"]: a for a in done["result"]["artifact_files"]}
            async with c.stream("GET", f"/v1/runs/{done['id']}/artifacts/out/big.bin") as answer:
                assert answer.status_code == 200
                assert answer.headers["content-length"] == str(BIG) and "transfer-encoding" not in answer.headers
                assert answer.headers["content-type"] == "application/octet-stream"
                digest = hashlib.sha256()
                async for chunk in answer.aiter_raw():
                    digest.update(chunk)
            assert digest.hexdigest() == saved["out/big.bin"]["sha256"]
            page = await c.get(f"/v1/runs/{done['id']}/artifacts/out/p.html")
            assert page.text == "<b>hi</b>\n" and page.headers["content-type"].startswith("text/html")
            assert page.headers["content-disposition"].startswith("attachment")
            assert page.headers["x-content-type-options"] == "nosniff"
    await services.close()


async def test_the_api_sends_an_artifact_while_the_store_is_still_reading_it(runtime, shared_dir, monkeypatch):
    store = runtime.artifact_store
    services = make_services(InlineDispatcher({"local": runtime}), store, shared_dir / "data")
    read_on = threading.Event()
    opened_by_store = store.open

    def held_after_its_first_chunk(*args) -> ArtifactStream:
        opened = opened_by_store(*args)
        return ArtifactStream(opened.size, _Held(opened.body, read_on))

    monkeypatch.setattr(store, "open", held_after_its_first_chunk)
    key = new_team(services, "team-a")
    with api_in_a_thread(services) as url:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as c:
            done = await _finished(c, {"skill": "python-math", "command": f"head -c {BIG} /dev/zero > out/big.bin",
                                       "output_files": ["out/*"], "save_as_artifacts": True,
                                       "omit_inline_content": True})
            received = 0
            async with c.stream("GET", f"/v1/runs/{done['id']}/artifacts/out/big.bin") as answer:
                async for chunk in answer.aiter_raw():
                    if not read_on.is_set():  # the first bytes came while the store held the rest back
                        assert 0 < len(chunk) < BIG
                        read_on.set()
                    received += len(chunk)
            assert received == BIG
    await services.close()


class _Held:
    """A stored version's body that gives its first chunk, then waits for ``read_on``."""

    def __init__(self, body, read_on: threading.Event) -> None:
        self.body = body
        self.read_on = read_on
        self.reads = 0

    def read(self, size: int) -> bytes:
        self.reads += 1
        if self.reads == 2:
            assert self.read_on.wait(10), "the API sent nothing before the store read the whole artifact"
        return self.body.read(size)

    def close(self) -> None:
        self.body.close()


async def test_an_artifact_the_store_never_received_is_a_clear_404(runtime, shared_dir, tmp_path, request):
    # The API reads another (empty) store than the runs wrote to: what a misconfigured deployment would see.
    elsewhere = (FileArtifactStore(tmp_path / "elsewhere") if isinstance(runtime.artifact_store, FileArtifactStore)
                 else request.getfixturevalue("s3_server").store())
    services = make_services(InlineDispatcher({"local": runtime}), elsewhere, shared_dir / "data")
    async with api_client(services, new_team(services, "team-a")) as c:
        done = await _finished(c, {"skill": "python-math", "command": "echo x > out/x.txt",
                                   "output_files": ["out/x.txt"], "save_as_artifacts": True, "workspace_id": "kept"})
        missing = await c.get(f"/v1/runs/{done['id']}/artifacts/out/x.txt")
        assert missing.status_code == 404
        assert missing.json()["detail"] == "no artifact 'out/x.txt' in 'team-a.kept'"
    await services.close()


async def test_a_download_while_the_blob_store_is_away_is_503_with_the_reason(s3_server, work_root, shared_dir):
    store = s3_server.store()
    runtime = LocalWorkspaceRuntime(work_root, artifact_store=store)
    services = make_services(InlineDispatcher({"local": runtime}), store, shared_dir / "data")
    async with api_client(services, new_team(services, "team-a")) as c:
        done = await _finished(c, {"skill": "python-math", "command": "echo x > out/x.txt",
                                   "output_files": ["out/x.txt"], "save_as_artifacts": True})
        s3_server.stop()
        try:
            away = await c.get(f"/v1/runs/{done['id']}/artifacts/out/x.txt")
        finally:
            s3_server.start()
        assert away.status_code == 503 and away.headers["retry-after"]
        assert away.json()["detail"].startswith(
            f"the blob store {store.url} could not list the versions of 'out/x.txt'")
        assert (await c.get(f"/v1/runs/{done['id']}/artifacts/out/x.txt")).text == "x\n"
    await services.close()


async def test_a_worker_sharing_no_folder_with_the_api_saves_artifacts_it_serves(s3_server, redis_url, work_root,
                                                                                 shared_dir):
    blob_url = s3_server.blob_url()
    worker_dir = shared_dir / "worker-artifacts"
    env = {**os.environ, "SKILLRUN_WORK_ROOT": str(work_root), "SKILLRUN_BLOB_URL": blob_url,
           "SKILLRUN_ARTIFACTS_DIR": str(worker_dir)}  # the blob URL wins: this folder stays empty
    services = make_services(QueueDispatcher(redis_url), create_artifact_store(blob_url, None), shared_dir / "data")
    async with api_client(services, new_team(services, "team-q")) as c:
        body = {"skill": "python-math", "command": "echo far > out/n.txt", "output_files": ["out/n.txt"],
                "save_as_artifacts": True}
        run_id = (await c.post("/v1/runs", json=body)).json()["id"]
        subprocess.run([sys.executable, "-m", "worker", "--redis-url", redis_url, "--burst"], env=env, cwd=REPO,
                       check=True, timeout=120)
        assert (await c.get(f"/v1/runs/{run_id}", params={"wait": 10})).json()["status"] == "finished"
        assert (await c.get(f"/v1/runs/{run_id}/artifacts/out/n.txt")).text == "far\n"
    assert not worker_dir.exists()
    S3Server.empty(services.artifact_store)
    await services.close()
