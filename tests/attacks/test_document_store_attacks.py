"""Attacks on the one record store (``worker.run_store.documents``) and what stands on it: the team secrets store
(``worker.secrets.store``, with its move of the earlier one-file-per-team layout) and the control plane's registries
(``orchestrator.documents``, whose ``keys`` kind authenticates every API call).

The attacker is a hostile caller of the store's methods (names at the edge of the rule, documents no JSON reader
takes back, nesting past the parser's depth), a hostile co-tenant of the host or of the Redis (a root or kind folder
made before the store made it, a symlink where a folder or a document should be, keys under the prefix that are
not hashes or not UTF-8, a lock held and never let go), and bad data on disk (a document or an earlier team file
that is not a mapping, not UTF-8, too deep, a directory, a FIFO, a symlink, names that are no secret's).

Each test states what should hold. One that fails names a weakness still open; one that passes proves the design
withstands that attack. Nothing here sleeps past a second: a wait that would last for ever is bounded by a join
timeout, and the test then lets the waiter go.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import secrets as pysecrets
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis
from cryptography.fernet import Fernet

from orchestrator.documents import FileDocuments as RegistryFiles
from orchestrator.errors import UnencodableTextError
from orchestrator.teams import TeamStore, _hash
from worker.errors import DocumentError, SecretError
from worker.run_store import documents as documents_module
from worker.run_store.documents import (
    BaseDocuments,
    FileDocuments,
    RedisDocuments,
    checked_name,
)
from worker.secrets.store import (
    REDIS_PREFIX,
    FileSecretStore,
    RedisSecretStore,
    SecretBox,
)

REPO = Path(__file__).resolve().parents[2]
PREFIX = "attack:doc"
DEEP = 100_000
"""Deeper than any JSON parser or encoder of CPython recurses."""


def deep_list(depth: int = DEEP) -> list:
    top: list = []
    inner = top
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return top


# --- fixtures -------------------------------------------------------------------------------------------------------

@pytest.fixture
def client(redis_url):
    connection = redis.Redis.from_url(redis_url)
    yield connection
    connection.close()


@pytest.fixture(params=["files", "redis"])
def documents(request, tmp_path) -> BaseDocuments:
    if request.param == "files":
        store: BaseDocuments = FileDocuments(tmp_path / "documents")
    else:
        store = RedisDocuments(request.getfixturevalue("client"), PREFIX)
    return store


def plant(documents: BaseDocuments, kind: str, doc_id: str, raw: bytes) -> None:
    """``raw`` stored as the document ``kind``/``doc_id`` behind the store's back (bad data on disk or in Redis)."""
    if isinstance(documents, FileDocuments):
        folder = documents.root / kind
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{doc_id}.json").write_bytes(raw)
    else:
        documents.redis.hset(f"{documents.prefix}:{kind}", doc_id, raw)


@pytest.fixture
def key() -> str:
    return Fernet.generate_key().decode()


@pytest.fixture
def box(key) -> SecretBox:
    return SecretBox(key)


def entry(box: SecretBox, team: str, name: str, value: str, at: float = 1_700_000_000.0) -> dict:
    """A secret as the earlier layout (and the documents) keep it."""
    return {"sealed": box.seal(team, name, value), "bytes": len(value.encode()), "created_at": at, "updated_at": at}


def earlier_file(folder: Path, team: str, entries: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{team}.json"
    path.write_text(json.dumps(entries))
    return path


def in_a_thread(target, *args) -> tuple[threading.Thread, dict]:
    """``target(*args)`` started in a daemon thread; what it returned or raised lands in the dict."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["returned"] = target(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["raised"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


# --- 1. names at the edge of the rule -------------------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "doc_id"), [("teams", "a\n"), ("teams\n", "a"), ("teams", "team-a.lib\n")])
def test_a_name_with_a_trailing_newline_is_refused_like_any_other_non_name(documents, kind, doc_id, tmp_path):
    """``$`` matches before a final newline: ``_NAME.match`` lets ``"a\\n"`` through, a second ``a`` that prints the
    same (a file ``a\\n.json``, a Redis field ``a\\n``), and ``kinds()`` lists a folder ``teams\\n``."""
    with pytest.raises(DocumentError, match="invalid document"):
        checked_name("id", doc_id) if kind == "teams" else checked_name("kind", kind)
    with pytest.raises(DocumentError, match="invalid document"):
        documents.put(kind, doc_id, {"x": 1})
    assert documents.kinds() == []


@pytest.mark.parametrize("doc_id", [".hidden", "...", "a.json", "-rf", "_", "x" * 128, ".a.k3j4h.partial", "A.B-c_d"])
def test_names_at_the_edge_of_the_rule_round_trip_and_stay_in_their_kind(documents, doc_id):
    for kind in ("...", "k" * 128, "teams"):
        documents.put(kind, doc_id, {"id": doc_id})
    documents.put("teams", "other", {"id": "other"})
    assert documents.get("teams", doc_id) == {"id": doc_id}
    assert documents.items("...") == {doc_id: {"id": doc_id}}
    assert sorted(documents.items("teams")) == sorted([doc_id, "other"])
    assert documents.kinds() == sorted(["...", "k" * 128, "teams"])
    assert documents.delete("teams", doc_id) and documents.get("teams", doc_id) is None
    assert documents.items("teams") == {"other": {"id": "other"}} and documents.get("...", doc_id) == {"id": doc_id}


# --- 2. documents no store can keep, or no reader can take back -----------------------------------------------------

def test_a_lone_surrogate_in_a_key_is_refused_before_anything_is_written(documents, tmp_path):
    documents.put("teams", "a", {"name": "a"})
    with pytest.raises(DocumentError, match="cannot be stored"):
        documents.put("teams", "a", {"\udcffname": "a"})
    with pytest.raises(UnencodableTextError):
        RegistryFiles(tmp_path / "registry").put("teams", "a", {"notes": {"\ud800": 1}})
    assert documents.get("teams", "a") == {"name": "a"}
    assert not (tmp_path / "registry" / "teams").exists()


@pytest.mark.parametrize("doc", [[1, 2], "text", None, 7])
def test_a_document_that_is_not_a_mapping_is_refused_before_it_is_written(documents, doc):
    """``put`` takes any JSON value; ``get``/``items`` then refuse it as "not a document", so one bad ``put`` makes
    the whole kind unreadable (``items`` raises for every reader)."""
    documents.put("teams", "good", {"name": "good"})
    with pytest.raises(DocumentError):
        documents.put("teams", "bad", doc)
    assert documents.items("teams") == {"good": {"name": "good"}}, "the kind must stay readable"


def test_nan_or_infinity_is_refused_as_not_json(documents):
    """``json.dumps`` writes ``NaN``/``Infinity``, which no JSON parser but Python's reads (RFC 8259 has none): the
    document could not be read back by jq, redis-cli consumers or a strict restore."""
    for value in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(DocumentError, match="cannot be stored"):
            documents.put("quotas", "team-a", {"max_runs": value})
    assert documents.get("quotas", "team-a") is None


def test_a_document_nested_too_deep_to_encode_is_a_document_error(documents, tmp_path):
    """``json.dumps`` raises ``RecursionError`` (a ``RuntimeError``): neither ``TypeError`` nor ``ValueError``, so it
    passes ``_encoded`` as it is (a 500), though ``check_text`` walks any depth on purpose."""
    for store in (documents, RegistryFiles(tmp_path / "registry")):
        with pytest.raises(DocumentError, match="cannot be stored"):
            store.put("sessions", "s1", {"state": deep_list()})
        assert store.get("sessions", "s1") is None


def test_a_stored_document_nested_too_deep_to_decode_is_a_document_error(documents):
    plant(documents, "teams", "deep", b'{"a": ' + b"[" * DEEP + b"]" * DEEP + b"}")
    with pytest.raises(DocumentError, match="deep.*cannot be read"):
        documents.get("teams", "deep")
    with pytest.raises(DocumentError, match="cannot be read"):
        documents.items("teams")


def test_a_stored_document_holding_an_escaped_lone_surrogate_is_a_document_error(documents):
    """``"\\udcff"`` is valid JSON that decodes to a lone surrogate: handed out, it fails whoever encodes it next (an
    answer's body, a ``put`` of the same document), far from where it lies."""
    plant(documents, "teams", "a", b'{"name": "\\udcff"}')
    with pytest.raises(DocumentError, match="cannot be read"):
        documents.get("teams", "a")


def test_a_stored_document_that_is_not_utf8_is_a_document_error(documents):
    plant(documents, "teams", "a", b'{"name": "\xff\xfe"}')
    with pytest.raises(DocumentError, match="cannot be read"):
        documents.get("teams", "a")
    with pytest.raises(DocumentError, match="cannot be read"):
        documents.items("teams")


def test_a_document_is_read_back_as_the_utf8_it_was_written_in_whatever_the_locale(tmp_path):
    """``_write`` writes UTF-8; ``_read``/``_read_all`` use ``read_text()``, the locale's encoding: under a non-UTF-8
    locale a stored ``ü`` reads back as an error or as other characters."""
    FileDocuments(tmp_path / "documents").put("teams", "a", {"note": "ünïcode ✓"})
    code = ("import json, sys; from worker.run_store.documents import FileDocuments; "
            f"d = FileDocuments({str(tmp_path / 'documents')!r}); "
            "print(json.dumps([d.get('teams', 'a'), d.all('teams')]))")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0",
           "PYTHONUTF8": "0", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          encoding="utf-8", timeout=60, check=False)
    failure = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    assert done.returncode == 0, f"reading a UTF-8 document under LC_ALL=C fails: {failure}"
    assert json.loads(done.stdout) == [{"note": "ünïcode ✓"}, [{"note": "ünïcode ✓"}]]


# --- 3. files: junk, symlinks, folders the store did not make -------------------------------------------------------

def test_junk_in_the_root_or_a_kind_folder_is_no_kind_and_no_document(tmp_path):
    root = tmp_path / "documents"
    store = FileDocuments(root)
    store.put("teams", "a", {"name": "a"})
    (root / "keys").write_text("{}")  # a file, not a folder
    (root / "bad name").mkdir()
    (root / "bad name" / "x.json").write_text("{}")
    (root / "empty").mkdir()
    (root / "crashed").mkdir()
    (root / "crashed" / ".a.abcdefgh.partial").write_text('{"half": ')  # a write cut short
    (root / "notes.json").write_text("{}")
    (root / "teams" / ".b.abcdefgh.partial").write_text('{"half": ')
    (root / "teams" / "README.txt").write_text("hello")
    assert store.kinds() == ["teams"]
    assert store.items("teams") == {"a": {"name": "a"}}
    assert store.items("crashed") == {} and store.items("empty") == {} and store.get("teams", "b") is None


def test_a_folder_named_like_a_document_is_a_document_error_not_an_os_error(tmp_path):
    store = FileDocuments(tmp_path / "documents")
    store.put("teams", "a", {"name": "a"})
    (tmp_path / "documents" / "teams" / "b.json").mkdir()
    with pytest.raises(DocumentError, match=r"b\.json"):
        store.get("teams", "b")
    with pytest.raises(DocumentError, match=r"b\.json"):  # _read_all catches no OSError: IsADirectoryError escapes
        store.items("teams")
    with pytest.raises(DocumentError, match=r"b\.json"):
        store.delete("teams", "b")


def test_ids_that_are_not_names_are_not_handed_out(documents):
    """``items`` hands out whatever ids it finds (a file ``bad name.json``, a Redis field ``../x``), ids that
    ``get`` and ``delete`` then refuse: a document nobody can remove through the store."""
    documents.put("teams", "a", {"name": "a"})
    plant(documents, "teams", "bad name", b"{}")
    plant(documents, "teams", "x\ny", b"{}")
    if isinstance(documents, RedisDocuments):
        plant(documents, "teams", "../x", b"{}")
    def is_name(doc_id: str) -> bool:
        try:
            checked_name("id", doc_id)
        except DocumentError:
            return False
        return True

    handed_out = [doc_id for doc_id in documents.items("teams") if not is_name(doc_id)]
    assert handed_out == [], f"items() hands out ids that get() and delete() refuse: {handed_out}"


def test_a_kind_folder_that_is_a_symlink_is_not_written_through(tmp_path):
    """Another user who could make ``<root>/keys`` before the store did (a root left writable, or made under /tmp)
    points it elsewhere: ``mkdir(exist_ok=True)`` accepts the link and ``mkstemp(dir=...)`` follows it."""
    root, elsewhere = tmp_path / "documents", tmp_path / "elsewhere"
    root.mkdir(mode=0o700)
    elsewhere.mkdir()
    (root / "keys").symlink_to(elsewhere)
    store = FileDocuments(root)
    with pytest.raises(DocumentError):
        store.put("keys", "k1", {"secret_sha256": "..."})
    assert list(elsewhere.iterdir()) == [], "a document was written outside the root, through the symlink"


def test_a_kind_folder_that_is_a_symlink_is_not_read_a_forged_key_there_does_not_authenticate(tmp_path):
    root, elsewhere = tmp_path / "registry", tmp_path / "elsewhere"
    teams = TeamStore(RegistryFiles(root))
    teams.create_team("team-a")
    elsewhere.mkdir()
    forged = "f" * 40
    (elsewhere / "abcdefabcdef.json").write_text(json.dumps({
        "id": "abcdefabcdef", "team_id": "team-a", "secret_sha256": _hash(forged), "created_at": 1.0}))
    (root / "keys").symlink_to(elsewhere)
    try:
        authenticated = teams.authenticate(f"sr_abcdefabcdef_{forged}")
    except DocumentError:
        authenticated = None
    assert authenticated is None, "a key planted outside the root, behind a symlinked kind folder, authenticates"
    assert "keys" not in teams.docs.kinds()


def test_deleting_through_a_kind_folder_that_is_a_symlink_removes_nothing_outside(tmp_path):
    root, elsewhere = tmp_path / "documents", tmp_path / "elsewhere"
    root.mkdir(mode=0o700)
    elsewhere.mkdir()
    victim = elsewhere / "victim.json"
    victim.write_text("precious")
    (root / "teams").symlink_to(elsewhere)
    store = FileDocuments(root)
    try:
        store.delete("teams", "victim")
    except DocumentError:
        pass
    assert victim.exists(), "delete followed the symlinked kind folder and removed a file outside the root"


def test_a_document_that_is_a_symlink_is_not_read_through(tmp_path):
    root, outside = tmp_path / "documents", tmp_path / "outside.json"
    store = FileDocuments(root)
    store.put("teams", "a", {"name": "a"})
    outside.write_text('{"name": "from outside the root"}')
    (root / "teams" / "b.json").symlink_to(outside)
    for read in (lambda: store.get("teams", "b"), lambda: store.items("teams").get("b")):
        try:
            found = read()
        except DocumentError:
            found = None
        assert found is None, f"a symlinked document was followed out of the root: {found}"


def test_writing_or_deleting_a_document_that_is_a_symlink_touches_the_link_not_its_target(tmp_path):
    root, outside = tmp_path / "documents", tmp_path / "outside.json"
    store = FileDocuments(root)
    store.put("teams", "a", {"name": "a"})
    outside.write_text("precious")
    (root / "teams" / "b.json").symlink_to(outside)
    store.put("teams", "b", {"name": "b"})  # os.replace replaces the link itself
    assert outside.read_text() == "precious" and not (root / "teams" / "b.json").is_symlink()
    assert stat.S_IMODE((root / "teams" / "b.json").stat().st_mode) == 0o600
    (root / "teams" / "c.json").symlink_to(outside)
    assert store.delete("teams", "c")  # unlink removes the link
    assert outside.read_text() == "precious"
    (root / "teams" / "d.json").symlink_to(tmp_path / "missing.json")  # dangling: no document, no error
    assert store.get("teams", "d") is None and sorted(store.items("teams")) == ["a", "b"]


def test_a_root_or_kind_folder_others_may_write_is_made_private_before_anything_is_written(tmp_path):
    """``mkdir(exist_ok=True, mode=0o700)`` leaves a folder that already exists as it was: a root or kind folder
    made 0777 beforehand (by another user, or by a careless umask) lets others swap documents in — an API key in
    ``keys`` — or the kind folder for a symlink."""
    root = tmp_path / "documents"
    root.mkdir()
    (root / "keys").mkdir()
    os.chmod(root, 0o777)
    os.chmod(root / "keys", 0o777)
    store = FileDocuments(root)
    try:
        store.put("keys", "k1", {"secret_sha256": "..."})
    except DocumentError:
        return  # refusing is as good as tightening
    assert stat.S_IMODE(root.stat().st_mode) == 0o700, "the root stays writable by others"
    assert stat.S_IMODE((root / "keys").stat().st_mode) == 0o700, "the kind folder stays writable by others"


@pytest.mark.root
def test_a_kind_folder_owned_by_another_user_is_refused(tmp_path):
    root = tmp_path / "documents"
    root.mkdir(mode=0o700)
    (root / "keys").mkdir(mode=0o700)
    os.chown(root / "keys", 65534, 65534)  # nobody's: made by someone else before the store ran
    store = FileDocuments(root)
    with pytest.raises(DocumentError):
        store.put("keys", "k1", {"secret_sha256": "..."})
    assert list((root / "keys").iterdir()) == []


def test_a_rewritten_document_is_private_even_if_the_old_file_was_not(tmp_path):
    store = FileDocuments(tmp_path / "documents")
    store.put("keys", "k1", {"v": 1})
    os.chmod(tmp_path / "documents" / "keys" / "k1.json", 0o666)
    store.put("keys", "k1", {"v": 2})
    assert stat.S_IMODE((tmp_path / "documents" / "keys" / "k1.json").stat().st_mode) == 0o600
    assert store.get("keys", "k1") == {"v": 2}


def test_a_fifo_where_a_document_lies_does_not_hang_its_readers(tmp_path):
    """``read_text()`` of a FIFO blocks in ``open`` until someone writes to it: ``items`` of the kind (every run of
    a team reads its secrets so) waits for ever."""
    store = FileDocuments(tmp_path / "documents")
    store.put("teams", "a", {"name": "a"})
    fifo = tmp_path / "documents" / "teams" / "b.json"
    os.mkfifo(fifo)
    thread, _ = in_a_thread(store.items, "teams")
    thread.join(1.0)
    hung = thread.is_alive()
    os.close(os.open(fifo, os.O_RDWR))  # let it go: a writer came and went, the reader sees the end
    thread.join(10)
    assert not hung, "items() blocked on a FIFO at teams/b.json: open documents O_NONBLOCK|O_NOFOLLOW, refuse non-files"


# --- 4. Redis: keys under the prefix the store did not write -------------------------------------------------------

def test_a_redis_key_with_the_prefix_that_is_not_a_hash_is_no_kind_and_a_document_error(client):
    store = RedisDocuments(client, PREFIX)
    store.put("teams", "a", {"name": "a"})
    client.set(f"{PREFIX}:keys", "not a hash")
    client.rpush(f"{PREFIX}:quotas", "x")
    for call in (lambda: store.get("keys", "k1"), lambda: store.items("keys"),
                 lambda: store.put("quotas", "team-a", {"x": 1})):
        with pytest.raises(DocumentError, match=f"{PREFIX}:(keys|quotas)"):  # not redis's WRONGTYPE: a 500
            call()
    assert store.kinds() == ["teams"], "keys that are no hash are listed as kinds"


def test_a_redis_key_or_field_that_is_not_utf8_does_not_break_kinds_or_items(client):
    store = RedisDocuments(client, PREFIX)
    store.put("teams", "a", {"name": "a"})
    client.hset(f"{PREFIX}:".encode() + b"\xff\xfe", "x", "{}")
    try:
        kinds = store.kinds()
    except DocumentError:
        kinds = None
    except UnicodeDecodeError as exc:
        pytest.fail(f"kinds() crashes on a key that is not UTF-8 (any_stored at the API's start too): {exc}")
    assert kinds in (["teams"], None)
    client.hset(f"{PREFIX}:teams", b"\xff", "{}")
    try:
        items = store.items("teams")
    except DocumentError:
        return
    except UnicodeDecodeError as exc:
        pytest.fail(f"items() crashes on a field that is not UTF-8: {exc}")
    assert items == {"a": {"name": "a"}}


def test_keys_beside_the_kinds_are_not_kinds(client):
    store = RedisDocuments(client, PREFIX)
    store.put("teams", "a", {"name": "a"})
    with store.locked("teams"):
        assert store.kinds() == ["teams"]  # its lock, teams:lock, is none
    client.hset(f"{PREFIX}x:other", "a", "{}")  # a longer prefix
    client.hset(f"{PREFIX}:a:b", "a", "{}")  # a colon: no kind's name
    client.hset(f"{PREFIX}:", "a", "{}")  # the empty kind
    client.hset("other:doc:teams", "a", "{}")
    assert store.kinds() == ["teams"]
    assert RedisDocuments(client, "attack").kinds() == []  # "attack:doc" is no kind: it holds a colon


# --- 5. locks -------------------------------------------------------------------------------------------------------

def _bump(make, times: int, start) -> None:
    documents = make()
    start.wait(10)
    for _ in range(times):
        with documents.locked("counters"):
            documents.put("counters", "c", {"n": documents.get("counters", "c")["n"] + 1})
    documents.close()


@pytest.mark.parametrize("backend", ["files", "redis"])
def test_locks_of_separate_processes_exclude_each_other(backend, tmp_path, request):
    if backend == "files":
        def make() -> BaseDocuments:
            return FileDocuments(tmp_path / "documents")
    else:
        url = request.getfixturevalue("redis_url")

        def make() -> BaseDocuments:
            return RedisDocuments(redis.Redis.from_url(url), PREFIX)
    first = make()
    first.put("counters", "c", {"n": 0})
    context = multiprocessing.get_context("fork")
    start = context.Event()
    processes = [context.Process(target=_bump, args=(make, 25, start)) for _ in range(3)]
    for process in processes:
        process.start()
    start.set()
    for process in processes:
        process.join(60)
    assert [process.exitcode for process in processes] == [0, 0, 0]
    assert first.get("counters", "c") == {"n": 75}


def test_a_redis_lock_a_crashed_holder_left_expires(client):
    store = RedisDocuments(client, PREFIX)
    lock = store.locked("teams")
    lock.__enter__()  # and never __exit__: the holder died
    ttl = client.pttl(f"{PREFIX}:teams:lock")
    assert 0 < ttl <= documents_module.LOCK_SECONDS * 1000


def test_a_redis_lock_held_for_ever_is_given_up_on_not_waited_for(client, monkeypatch):
    monkeypatch.setattr(documents_module, "LOCK_SECONDS", 0.2)
    store = RedisDocuments(client, PREFIX)
    client.set(f"{PREFIX}:teams:lock", "stuck")  # no expiry: a co-tenant of the Redis, or a hand-made key
    with pytest.raises(DocumentError, match="held by another change"), store.locked("teams"):
        store.put("teams", "a", {"name": "a"})
    assert store.get("teams", "a") is None


def test_a_file_lock_held_by_a_stuck_process_is_given_up_on_like_redis_s(tmp_path, monkeypatch):
    """Redis's lock is waited for ``LOCK_SECONDS`` and then refused; the kind folder's ``flock`` is taken with a
    blocking ``LOCK_EX`` and waited for for ever — a hung process (a stuck NFS read, a debugger) stops every change
    of that kind, and with it, holding the store's one thread lock, every change of every kind in this process."""
    monkeypatch.setattr(documents_module, "LOCK_SECONDS", 0.2)
    store = FileDocuments(tmp_path / "documents")
    store.put("teams", "a", {"name": "a"})
    holder = subprocess.Popen(
        [sys.executable, "-c", ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
                                "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()"),
         str(tmp_path / "documents" / "teams")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"

        def change() -> None:
            with store.locked("teams"):
                store.put("teams", "a", {"name": "changed"})

        thread, _ = in_a_thread(change)
        thread.join(1.0)
        hung = thread.is_alive()
    finally:
        holder.stdin.close()  # the stuck holder ends: its flock goes with it
        holder.wait(10)
    thread.join(10)
    assert not hung, "locked() waited past LOCK_SECONDS on a kind folder's flock: take it LOCK_NB in a bounded loop"


def test_one_kinds_lock_does_not_hold_another_kind(documents):
    """A per-kind lock: team-a's secrets held (a slow change, a stuck flock) must not stop team-b's. The files' one
    ``threading.Lock`` per store is taken for every kind, so it does — and a nested lock of two kinds deadlocks."""
    held, release = threading.Event(), threading.Event()

    def hold_a() -> None:
        with documents.locked("team-a"):
            held.set()
            release.wait(10)

    def change_b() -> None:
        with documents.locked("team-b"):
            documents.put("team-b", "x", {"n": 1})

    holder, _ = in_a_thread(hold_a)
    assert held.wait(10)
    other, _ = in_a_thread(change_b)
    other.join(1.0)
    blocked = other.is_alive()
    release.set()
    holder.join(10)
    other.join(10)
    assert not blocked, "a change of kind team-b waited for the lock of kind team-a"
    assert documents.get("team-b", "x") == {"n": 1}


# --- 6. the secrets store: the earlier layout and documents of the wrong shape --------------------------------------

def test_an_earlier_file_colliding_with_a_newer_document_keeps_the_newer_and_moves_the_rest(tmp_path, box):
    folder = tmp_path / "secrets"
    store = FileSecretStore(folder, box)
    store.set("team-a", "GH_TOKEN", "new-value-set-since")
    earlier_file(folder, "team-a", {"GH_TOKEN": entry(box, "team-a", "GH_TOKEN", "old-value-of-before"),
                                    "NPM_TOKEN": entry(box, "team-a", "NPM_TOKEN", "npm-value-of-before")})
    assert store.reveal_all("team-a") == {"GH_TOKEN": "new-value-set-since", "NPM_TOKEN": "npm-value-of-before"}
    assert not (folder / "team-a.json").exists()
    assert [s.name for s in store.list("team-a")] == ["GH_TOKEN", "NPM_TOKEN"]


def _reveal_in_a_process(folder: Path, key: str, start, results, set_one: bool) -> None:
    store = FileSecretStore(folder, SecretBox(key))
    start.wait(10)
    try:
        if set_one:
            store.set("team-a", "SET_DURING_MOVE", "a-value-set-during-the-move")
        results.put(("ok", store.reveal_all("team-a")))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        results.put(("raised", repr(exc)))


def test_processes_moving_one_earlier_file_at_once_move_it_once_and_lose_nothing(tmp_path, key, box):
    folder = tmp_path / "secrets"
    values = {f"TOKEN_{i}": f"value-of-token-{i}-{pysecrets.token_hex(8)}" for i in range(12)}
    earlier_file(folder, "team-a", {name: entry(box, "team-a", name, value) for name, value in values.items()})
    context = multiprocessing.get_context("fork")
    start, results = context.Event(), context.Queue()
    processes = [context.Process(target=_reveal_in_a_process, args=(folder, key, start, results, i == 0))
                 for i in range(5)]
    for process in processes:
        process.start()
    start.set()
    outcomes = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(30)
    assert all(kind == "ok" for kind, _ in outcomes), outcomes
    for _, revealed in outcomes:
        assert {name: revealed[name] for name in values} == values  # each saw every earlier secret, none half-moved
    final = FileSecretStore(folder, box).reveal_all("team-a")
    assert final == {**values, "SET_DURING_MOVE": "a-value-set-during-the-move"}
    assert not (folder / "team-a.json").exists()


@pytest.mark.parametrize("content", ["[]", "null", '"text"', '{"GH_TOKEN": "sealed-as-a-string"}',
                                     '{"GH_TOKEN": {"bytes": 9}}', '{"GH_TOKEN": [1]}', "", "{" * 10])
def test_earlier_files_that_are_not_mappings_of_secrets_are_refused_and_nothing_is_moved(tmp_path, box, content):
    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "team-a.json").write_text(content)
    store = FileSecretStore(folder, box)
    store.set("team-b", "GH_TOKEN", "team-b-own-value")
    with pytest.raises(SecretError, match=r"team-a\.json .*restore it from a backup"):
        store.reveal_all("team-a")
    with pytest.raises(SecretError, match=r"team-a\.json"):
        store.set("team-a", "OTHER_TOKEN", "another-value-1")
    assert (folder / "team-a.json").read_text() == content and not list(folder.glob("team-a/*.json"))
    assert store.reveal_all("team-b") == {"GH_TOKEN": "team-b-own-value"}


@pytest.mark.parametrize("bad", ["../x", "a/b", "MY-TOKEN", "LD_PRELOAD", "GH_TOKEN\n", "WORK_DIR", ""])
def test_an_earlier_file_with_an_entry_named_unlike_a_secret_is_refused_whole_and_nothing_is_moved(tmp_path, box,
                                                                                                   bad):
    """The move writes each entry under its name as it is: a name no secret may have (``LD_PRELOAD``, ``MY-TOKEN``,
    ``GH_TOKEN\\n``) becomes a stored secret, and one that is no document id (``../x``) fails half-way with a
    ``DocumentError`` (not a ``SecretError``: a 500), the entries before it already moved."""
    folder = tmp_path / "secrets"
    earlier_file(folder, "team-a", {"GH_TOKEN": entry(box, "team-a", "GH_TOKEN", "a-good-value-1"),
                                    bad: entry(box, "team-a", bad, "a-bad-named-value")})
    store = FileSecretStore(folder, box)
    with pytest.raises(SecretError, match=r"team-a\.json"):
        store.reveal_all("team-a")
    moved = sorted(p.name for p in (folder / "team-a").iterdir()) if (folder / "team-a").exists() else []
    assert moved == [], f"moved before the refusal: {moved}"
    assert (folder / "team-a.json").exists()


def test_an_earlier_file_nested_too_deep_is_a_secret_error(tmp_path, box):
    """``json.loads`` raises ``RecursionError``, which ``except (OSError, ValueError)`` does not catch."""
    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "team-a.json").write_text('{"GH_TOKEN": {"sealed": "x", "pad": ' + "[" * DEEP + "]" * DEEP + "}}")
    with pytest.raises(SecretError, match=r"team-a\.json .*restore it from a backup"):
        FileSecretStore(folder, box).reveal_all("team-a")


def test_an_earlier_file_that_is_a_symlink_is_not_followed(tmp_path, box):
    """A ``<team>.json`` pointing elsewhere is read and moved in as the team's secrets (and the link removed): the
    move takes what lies outside the store for the team's own."""
    folder, outside = tmp_path / "secrets", tmp_path / "outside.json"
    folder.mkdir()
    outside.write_text(json.dumps({"PLANTED": entry(box, "team-a", "PLANTED", "a-planted-value")}))
    (folder / "team-a.json").symlink_to(outside)
    store = FileSecretStore(folder, box)
    try:
        revealed = store.reveal_all("team-a")
    except SecretError:
        revealed = {}
    assert "PLANTED" not in revealed, "the earlier file was followed out of the store"
    assert outside.exists()


def test_a_fifo_at_the_earlier_path_does_not_hang_the_team(tmp_path, box):
    """The move reads ``<team>.json`` with ``read_text()`` under the team's lock: a FIFO there blocks it — and every
    change of every team in the process, behind the store's one thread lock — until someone writes to it."""
    folder = tmp_path / "secrets"
    folder.mkdir()
    os.mkfifo(folder / "team-a.json")
    store = FileSecretStore(folder, box)
    thread, outcome = in_a_thread(store.reveal_all, "team-a")
    thread.join(1.0)
    hung = thread.is_alive()
    os.close(os.open(folder / "team-a.json", os.O_RDWR))  # let it go
    thread.join(10)
    assert not hung, "reveal_all blocked on a FIFO at secrets/team-a.json"
    assert isinstance(outcome.get("raised"), SecretError)


def test_an_earlier_path_that_is_a_folder_is_a_secret_error_and_other_teams_work(tmp_path, box):
    folder = tmp_path / "secrets"
    (folder / "team-a.json").mkdir(parents=True)
    store = FileSecretStore(folder, box)
    with pytest.raises(SecretError, match=r"team-a\.json cannot be read"):
        store.list("team-a")
    store.set("team-b", "GH_TOKEN", "team-b-own-value")
    assert store.reveal("team-b", ["GH_TOKEN"]) == {"GH_TOKEN": "team-b-own-value"}


def test_an_earlier_file_written_again_during_a_change_does_not_deadlock_it(tmp_path, box):
    """``set`` holds the team's lock and then calls ``_entries``, which takes that lock again whenever it sees
    ``<team>.json`` — a file an API process of the earlier version still writes during a rolling upgrade. The thread
    lock is not re-entrant: the change hangs for ever, holding the store's lock for every team."""
    folder = tmp_path / "secrets"
    store = FileSecretStore(folder, box)
    store.set("team-a", "GH_TOKEN", "a-good-value-1")
    move = store._move_earlier_file

    def moved_then_written_again(team: str) -> None:
        move(team)
        earlier_file(folder, team, {"OLD_TOKEN": entry(box, team, "OLD_TOKEN", "an-old-value-1")})

    store._move_earlier_file = moved_then_written_again
    thread, _ = in_a_thread(store.set, "team-a", "NPM_TOKEN", "npm-value-12345")
    thread.join(1.0)
    assert not thread.is_alive(), "set() deadlocked: _entries re-took the team's lock that set() already held"


@pytest.fixture(params=["file", "redis"])
def secret_store(request, tmp_path, box):
    if request.param == "file":
        return FileSecretStore(tmp_path / "secrets", box)
    return RedisSecretStore(request.getfixturevalue("client"), box)


@pytest.mark.parametrize("shape", ["sealed not text", "no dates", "dates not numbers", "bytes not a number"])
def test_a_secret_document_of_the_wrong_shape_is_a_secret_error_not_a_crash(secret_store, box, shape):
    """``_entries`` checks only that each entry holds ``sealed``: one without dates fails ``list`` with a
    ``KeyError``, a ``sealed`` that is no text fails every run's ``reveal_all`` with an ``AttributeError`` — 500s
    where the store answers every other bad document with a ``SecretError`` (a 400 that says what to do)."""
    good = entry(box, "team-a", "GH_TOKEN", "a-good-value-1")
    doc = {"sealed not text": {**good, "sealed": 12345},
           "no dates": {"sealed": good["sealed"]},
           "dates not numbers": {**good, "created_at": "yesterday"},
           "bytes not a number": {**good, "bytes": "lots"}}[shape]
    secret_store.documents.put("team-a", "GH_TOKEN", doc)
    crashes = []
    for what, call in (("list", lambda: secret_store.list("team-a")),
                       ("reveal_all", lambda: secret_store.reveal_all("team-a")),
                       ("set", lambda: secret_store.set("team-a", "OTHER_TOKEN", "another-value-1"))):
        try:
            call()
        except SecretError:
            pass
        except Exception as exc:  # noqa: BLE001 - the weakness shown
            crashes.append(f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    assert crashes == [], f"a {shape!r} secret document is no SecretError but a crash (a 500): {crashes}"


def test_any_stored_counts_only_teams_secrets_not_junk(tmp_path, client, box):
    folder = tmp_path / "secrets"
    store = FileSecretStore(folder, None)
    folder.mkdir()
    (folder / "README.json").write_text("{}")  # no team's name
    (folder / "Team-A").mkdir()
    (folder / "Team-A" / "GH_TOKEN.json").write_text("{}")
    (folder / "team-a").mkdir()
    (folder / "team-a" / ".GH_TOKEN.abcdefgh.partial").write_text("{")  # a write cut short
    (folder / "notes.txt").write_text("x")
    assert not store.any_stored()
    client.hset(f"{REDIS_PREFIX}:Team-A", "GH_TOKEN", "{}")
    client.hset(f"{REDIS_PREFIX}:team-x:lock", "x", "y")  # a kind's lock, or like one
    assert not RedisSecretStore(client, None).any_stored()
    RedisSecretStore(client, box).set("team-a", "GH_TOKEN", "a-good-value-1")
    assert RedisSecretStore(client, None).any_stored()
