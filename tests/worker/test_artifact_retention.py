"""Retention of artifacts (a folder, an S3 bucket: each test runs against both): versions stored before the cutoff
go (a bounded number per call), with the folders they leave empty; newer versions and their folders stay. Ages are
set on the files or the emulator's objects, not waited for."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from tests.artifact_stores import age, leftovers
from worker.config import WorkerSettings

DAY = 24 * 3600


def test_versions_older_than_the_cutoff_go_with_the_folders_they_leave_empty(artifact_store):
    store = artifact_store
    store.save_bytes("one-off", "out/a.txt", b"old", "text/plain")
    store.save_bytes("session", "out/b.txt", b"old", "text/plain")
    store.save_bytes("session", "out/b.txt", b"new", "text/plain")
    age(store, "one-off", "out/a.txt", 1, 2 * DAY)
    age(store, "session", "out/b.txt", 1, 2 * DAY)
    assert store.prune(time.time() - DAY) == 2
    assert leftovers(store, "one-off", "out/a.txt") == []
    assert store.list("one-off") == []
    assert store.versions("session", "out/b.txt") == [2]
    assert store.load("session", "out/b.txt") == b"new"


def test_one_prune_removes_a_bounded_number_of_versions(artifact_store):
    store = artifact_store
    for _ in range(5):
        store.save_bytes("s", "f", b"x", "text/plain")
    for version in range(1, 6):
        age(store, "s", "f", version, 2 * DAY)
    assert store.prune(time.time() - DAY, limit=3) == 3
    assert len(store.versions("s", "f")) == 2
    assert store.prune(time.time() - DAY, limit=3) == 2
    assert store.versions("s", "f") == []


def test_artifacts_are_kept_at_least_as_long_as_the_run_records_that_name_them():
    assert WorkerSettings(result_ttl_seconds=60, artifact_ttl_seconds=60).artifacts_kept_seconds == 60
    assert WorkerSettings(result_ttl_seconds=7 * DAY).artifacts_kept_seconds == 7 * DAY
    with pytest.raises(ValidationError, match="at least result_ttl_seconds"):
        WorkerSettings(result_ttl_seconds=3600, artifact_ttl_seconds=60)


@pytest.mark.parametrize("where", ["artifacts_dir", "blob_url"])
async def test_the_embedded_default_prunes_artifacts_after_its_runs_and_keeps_records_for_the_settings_ttl(
    tmp_path, work_root, monkeypatch, make_request, request, where
):
    from orchestrator.api.app import build_services
    from orchestrator.config import Settings
    from worker.jobs import execute as jobs

    monkeypatch.setattr(jobs, "_pruned_at", float("-inf"))  # this process has not pruned yet
    store_setting = ({"artifacts_dir": tmp_path / "artifacts"} if where == "artifacts_dir"
                     else {"blob_url": request.getfixturevalue("s3_server").blob_url()})
    settings = Settings(work_root=work_root, data_dir=tmp_path / "data", result_ttl_seconds=120, **store_setting)
    services = build_services(settings)
    try:
        assert services.dispatcher.result_ttl == 120
        store = services.dispatcher.runtime("local").artifact_store
        assert services.artifact_store is store
        store.save_bytes("old-session", "out/a.txt", b"old", "text/plain")
        age(store, "old-session", "out/a.txt", 1, 2 * DAY)
        await services.dispatcher.run(make_request("true"))
        await services.dispatcher.drain()
        assert store.versions("old-session", "out/a.txt") == []
    finally:
        await services.close()
