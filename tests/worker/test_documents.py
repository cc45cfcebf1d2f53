"""The one record store of both planes, in files and in Redis: the same behaviour from each."""

from __future__ import annotations

import stat
import threading

import pytest
import redis

from worker.errors import DocumentError
from worker.run_store import BaseDocuments, FileDocuments, RedisDocuments


@pytest.fixture(params=["files", "redis"])
def documents(request, tmp_path) -> BaseDocuments:
    if request.param == "files":
        store = FileDocuments(tmp_path / "documents")
    else:
        client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
        client.flushdb()
        store = RedisDocuments(client, "test:doc")
    yield store
    store.close()


def test_documents_are_kept_by_kind_and_id_and_listed_in_id_order(documents):
    documents.put("teams", "b", {"name": "b"})
    documents.put("teams", "a", {"name": "a", "note": "ünïcode ✓"})
    documents.put("keys", "k1", {"team": "a"})
    assert documents.get("teams", "a") == {"name": "a", "note": "ünïcode ✓"} and documents.get("teams", "c") is None
    assert list(documents.items("teams")) == ["a", "b"] and documents.all("teams")[1] == {"name": "b"}
    assert documents.kinds() == ["keys", "teams"]
    assert documents.delete("keys", "k1") and not documents.delete("keys", "k1")
    assert documents.kinds() == ["teams"] and documents.all("keys") == []


@pytest.mark.parametrize(("kind", "doc_id"), [("teams", "../escape"), ("../teams", "a"), ("teams", ".."),
                                              ("teams", "a/b"), ("teams", ""), ("te:ams", "a"), ("teams", "x" * 129)])
def test_a_kind_or_id_that_is_not_a_plain_name_is_refused_and_nothing_is_written(documents, kind, doc_id, tmp_path):
    with pytest.raises(DocumentError, match="invalid document"):
        documents.put(kind, doc_id, {"x": 1})
    assert documents.kinds() == []
    assert not list(tmp_path.rglob("*.json"))


def test_text_no_store_can_keep_is_refused_before_anything_is_written(documents):
    documents.put("teams", "a", {"name": "a"})
    with pytest.raises(DocumentError, match="a teams document cannot be stored"):
        documents.put("teams", "a", {"name": "\udcff"})
    assert documents.get("teams", "a") == {"name": "a"}


def test_a_check_refuses_a_document_before_it_is_written(tmp_path):
    def no_secrets_here(doc, kind):
        if "password" in doc:
            raise ValueError(f"{kind}: no passwords")

    store = FileDocuments(tmp_path, check=no_secrets_here)
    with pytest.raises(ValueError, match="teams: no passwords"):
        store.put("teams", "a", {"password": "x"})
    assert store.get("teams", "a") is None


def test_a_document_that_cannot_be_read_back_says_where_it_lies(tmp_path):
    store = FileDocuments(tmp_path)
    store.put("teams", "a", {"name": "a"})
    (tmp_path / "teams" / "a.json").write_text("[1, 2]")
    with pytest.raises(DocumentError, match=r"teams/a\.json is not a document .*restore it from a backup"):
        store.get("teams", "a")


def test_files_are_private_to_the_user(tmp_path):
    store = FileDocuments(tmp_path / "documents")
    store.put("keys", "k1", {"hash": "..."})
    assert stat.S_IMODE((tmp_path / "documents").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "documents" / "keys").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "documents" / "keys" / "k1.json").stat().st_mode) == 0o600
    assert [p.name for p in (tmp_path / "documents" / "keys").iterdir()] == ["k1.json"]  # no partial file left


def test_a_change_that_reads_first_holds_the_kinds_lock(documents):
    """Increments under the lock from several threads lose none."""
    documents.put("counters", "c", {"n": 0})

    def bump() -> None:
        for _ in range(20):
            with documents.locked("counters"):
                documents.put("counters", "c", {"n": documents.get("counters", "c")["n"] + 1})

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert documents.get("counters", "c") == {"n": 80}
    assert documents.kinds() == ["counters"]  # a lock is not a kind


def test_a_kinds_thread_lock_ends_with_the_last_change_that_held_it(tmp_path):
    """One lock per kind being changed, not one per kind ever changed: none is kept once its changes are done."""
    store = FileDocuments(tmp_path)
    for team in ("team-a", "team-b", "team-c"):
        with store.locked(team):
            assert set(store._kind_locks) == {team}
            store.put(team, "x", {"n": 1})
    assert store._kind_locks == {}
