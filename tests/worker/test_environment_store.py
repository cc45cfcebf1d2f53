"""Every file the environment store makes has an end: what ``remove``, ``prune_records`` and ``sweep`` take, what
they leave, and a lock file swept between a builder's open and its lock; the declaration cache's bound."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
from pathlib import Path

import pytest

from tests.conftest import write_skill
from worker.environments import DeclarationCache, EnvironmentStore
from worker.environments import store as store_module
from worker.environments.store import (
    FAILURE_RECORD_SECONDS,
    RECORD_GRACE_SECONDS,
    build_lock,
    resolve_lock,
)

LONG_AGO = time.time() - 30 * 24 * 3600


def _age(path: Path, when: float = LONG_AGO) -> None:
    os.utime(path, (when, when))


def _built(store: EnvironmentStore, key: str, *reqkeys: str) -> None:
    """An environment ``key`` as a build leaves it, from the locks of ``reqkeys``."""
    built = store.new_build_folder(build_lock(key)) / "env"
    (built / "bin").mkdir(parents=True)
    store.publish(key, built, {"key": key, "target": "local: test", "packages": ["alpha==1.0"]})
    for reqkey in reqkeys:
        store.save_lock(reqkey, f"alpha==1.0 # {reqkey}\n")
        store.link(reqkey, key)


def _files(store: EnvironmentStore) -> set[str]:
    return {str(path.relative_to(store.root)) for path in store.root.rglob("*") if not path.is_dir()}


async def _take_and_release(store: EnvironmentStore, *names: str) -> None:
    for name in names:
        async with store.exclusive(name):
            pass


async def test_removing_an_environment_removes_its_lock_records_failures_and_lock_files(tmp_path: Path):
    store = EnvironmentStore(tmp_path / "store")
    _built(store, "k1", "r1", "r2")
    _built(store, "k2", "r3")
    store.record_failure("r1", "an old failure of r1")
    await _take_and_release(store, build_lock("k1"), resolve_lock("r1"), resolve_lock("r2"), build_lock("k2"))
    before = _files(store)
    assert {"locks/r1.txt", "locks/r1.failed", "envs/k1.locks", ".locks/env-k1.lock", ".locks/lock-r2.lock"} <= before

    assert store.remove("k1")
    assert _files(store) == {"envs/k2.json", "envs/k2.used", "envs/k2.locks", "locks/r3.txt", ".locks/env-k2.lock"}
    assert not store.path("k1").exists() and store.path("k2").is_dir()


async def test_a_lock_file_someone_holds_is_not_removed(tmp_path: Path):
    store = EnvironmentStore(tmp_path / "store")
    _built(store, "k1", "r1")
    async with store.exclusive(build_lock("k1")):
        store.remove("k1")
        assert store.busy(build_lock("k1")), "the holder's lock file went while it held it"
        store.sweep(0)
        assert store.busy(build_lock("k1"))
    store.sweep(0)
    assert not (store.root / ".locks" / "env-k1.lock").exists()


def test_prune_records_removes_unlisted_locks_and_failures_older_than_the_cutoff(tmp_path: Path):
    store = EnvironmentStore(tmp_path / "store")
    _built(store, "k1", "r1")
    store.save_lock("orphan", "alpha==1.0\n")  # resolved, never installed here
    store.save_lock("young-orphan", "alpha==1.0\n")
    store.record_failure("failed", "no such package")
    store.record_failure("image-feed", "apt: Unable to locate package")
    for name in ("r1.txt", "orphan.txt", "failed.failed", "image-feed.failed"):
        _age(store.locks / name)
    _age(store.locks / "young-orphan.txt", time.time() - RECORD_GRACE_SECONDS / 2)

    removed = store.prune_records(time.time())
    assert sorted(removed) == ["failed.failed", "image-feed.failed", "orphan.txt"]
    assert sorted(os.listdir(store.locks)) == ["r1.txt", "young-orphan.txt"]
    assert store.prune_records(LONG_AGO - 1) == []


def test_sweep_removes_stale_lock_files_temporary_files_and_old_failure_records(tmp_path: Path):
    store = EnvironmentStore(tmp_path / "store")
    asyncio.run(_take_and_release(store, "stale", "fresh"))
    _age(store.root / ".locks" / "stale.lock", time.time() - 100)
    store.record_failure("old", "failed a week ago")
    store.record_failure("recent", "failed a moment ago")
    _age(store.locks / "old.failed", time.time() - FAILURE_RECORD_SECONDS - 60)
    left = store.envs / ".k9.json.1234.tmp"  # a writer killed between write and rename
    left.write_text("{}")
    _age(left, time.time() - 100)
    (store.envs / ".k8.json.1234.tmp").write_text("{}")
    left_build = store.new_build_folder("env-k7")

    store.sweep(stale_seconds=50)
    assert sorted(os.listdir(store.root / ".locks")) == ["fresh.lock"]
    assert sorted(os.listdir(store.locks)) == ["recent.failed"]
    assert sorted(os.listdir(store.envs)) == [".k8.json.1234.tmp"]
    assert not left_build.exists()


async def test_a_lock_file_swept_between_open_and_lock_is_not_the_lock_taken(tmp_path: Path, monkeypatch):
    store = EnvironmentStore(tmp_path / "store")
    asyncio.get_running_loop()
    await _take_and_release(store, "race")
    real_flock = fcntl.flock
    swept = []

    def flock_after_a_sweep(fd: int, operation: int) -> None:
        if not swept:  # a sweep removes the (unheld) file after this builder opened it, before it locks
            swept.append(True)
            os.unlink(store.root / ".locks" / "race.lock")
        real_flock(fd, operation)

    monkeypatch.setattr(store_module.fcntl, "flock", flock_after_a_sweep)
    async with store.exclusive("race"):
        monkeypatch.setattr(store_module.fcntl, "flock", real_flock)
        assert swept
        assert store.busy("race"), "the builder holds a removed file: another would take the new one at once"


def test_failure_and_target_records_read_back(tmp_path: Path):
    from worker.environments import Target

    store = EnvironmentStore(tmp_path / "store")
    assert store.failure("r") is None and store.recorded_target("docker") is None
    store.record_failure("r", "the resolver said no")
    assert store.failure("r")[0] == "the resolver said no"
    store.clear_failure("r")
    assert store.failure("r") is None
    target = Target("docker", "/usr/bin/python3", "3.11.2", "x86_64", "glibc-2.36", image="sha256:abc")
    store.record_target(target)
    assert store.recorded_target("docker") == target
    assert json.loads((store.targets / "docker.json").read_text())["image"] == "sha256:abc"


def test_the_declaration_cache_keeps_the_most_recently_used_skills(tmp_path: Path):
    cache = DeclarationCache(size=2)
    skills = [write_skill(tmp_path, name, files={"requirements.txt": f"{name}-pkg\n"}) for name in ("a", "b", "c")]
    assert cache.get(skills[0], tmp_path, "a").python == ("a-pkg",)
    cache.get(skills[1], tmp_path, "b")
    cache.get(skills[0], tmp_path, "a")  # a is used again: b is now the least recently used
    cache.get(skills[2], tmp_path, "c")
    assert len(cache) == 2
    assert cache._unchanged(skills[1], "b") is None, "the least recently used skill was kept past the bound"
    assert cache._unchanged(skills[0], "a") is not None and cache._unchanged(skills[2], "c") is not None


@pytest.mark.parametrize("size", [1, 5])
def test_the_declaration_cache_never_holds_more_than_its_size(tmp_path: Path, size: int):
    cache = DeclarationCache(size=size)
    for number in range(8):
        cache.get(write_skill(tmp_path, f"s{number}"), tmp_path, f"s{number}")
        assert len(cache) <= size
