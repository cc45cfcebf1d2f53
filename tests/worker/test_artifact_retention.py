"""Retention of artifacts: versions stored before the cutoff go (a bounded number per call), with the folders they
leave empty; newer versions and their folders stay. Ages are set on the files, not waited for."""

from __future__ import annotations

import os
import time

import pytest
from pydantic import ValidationError

from worker.artifacts import FileArtifactStore
from worker.config import WorkerSettings

DAY = 24 * 3600


def _age(store: FileArtifactStore, scope: str, name: str, version: int, seconds: float) -> None:
    """Make a stored version (and its folders) look ``seconds`` old."""
    then = time.time() - seconds
    folder = store._name_dir(scope, name)
    for path in (folder / str(version) / "meta.json", folder, folder.parent):
        os.utime(path, (then, then))


def test_versions_older_than_the_cutoff_go_with_the_folders_they_leave_empty(tmp_path):
    store = FileArtifactStore(tmp_path / "artifacts")
    store.save_bytes("one-off", "out/a.txt", b"old", "text/plain")
    store.save_bytes("session", "out/b.txt", b"old", "text/plain")
    store.save_bytes("session", "out/b.txt", b"new", "text/plain")
    _age(store, "one-off", "out/a.txt", 1, 2 * DAY)
    _age(store, "session", "out/b.txt", 1, 2 * DAY)
    assert store.prune(time.time() - DAY) == 2
    assert not (tmp_path / "artifacts" / "one-off").exists()
    assert store.versions("session", "out/b.txt") == [2]
    assert store.load("session", "out/b.txt") == b"new"


def test_one_prune_removes_a_bounded_number_of_versions(tmp_path):
    store = FileArtifactStore(tmp_path / "artifacts")
    for _ in range(5):
        store.save_bytes("s", "f", b"x", "text/plain")
    for version in range(1, 6):
        _age(store, "s", "f", version, 2 * DAY)
    assert store.prune(time.time() - DAY, limit=3) == 3
    assert len(store.versions("s", "f")) == 2
    assert store.prune(time.time() - DAY, limit=3) == 2
    assert store.versions("s", "f") == []


def test_artifacts_are_kept_at_least_as_long_as_the_run_records_that_name_them():
    assert WorkerSettings(result_ttl_seconds=60, artifact_ttl_seconds=60).artifacts_kept_seconds == 60
    assert WorkerSettings(result_ttl_seconds=7 * DAY).artifacts_kept_seconds == 7 * DAY
    with pytest.raises(ValidationError, match="at least result_ttl_seconds"):
        WorkerSettings(result_ttl_seconds=3600, artifact_ttl_seconds=60)


async def test_the_embedded_default_prunes_artifacts_after_its_runs_and_keeps_records_for_the_settings_ttl(
    tmp_path, work_root, monkeypatch, make_request
):
    from orchestrator.api.app import build_services
    from orchestrator.config import Settings
    from worker import jobs

    monkeypatch.setattr(jobs, "_pruned_at", float("-inf"))  # this process has not pruned yet
    settings = Settings(work_root=work_root, artifacts_dir=tmp_path / "artifacts", data_dir=tmp_path / "data",
                        result_ttl_seconds=120)
    services = build_services(settings)
    try:
        assert services.dispatcher.result_ttl == 120
        store = services.dispatcher.runtime("local").artifact_store
        store.save_bytes("old-session", "out/a.txt", b"old", "text/plain")
        _age(store, "old-session", "out/a.txt", 1, 2 * DAY)
        await services.dispatcher.run(make_request("true"))
        await services.dispatcher.drain()
        assert store.versions("old-session", "out/a.txt") == []
    finally:
        await services.close()
