"""Attacks on team secrets (``worker.secrets.store``, ``worker.secrets``, ``/v1/secrets``, a run's ``secrets``): who can
name, list, change or use a team's secret, and whether any part of a value comes back — in a run's answer, its record
(memory or Redis), the RQ job, its events, its files and artifacts, the model's requests, MCP results, errors or logs.

Each test runs the attack for real (the API on the embedded default or the queue, the local runtime, a scripted model,
the API's ``/mcp``) and asserts it is contained and that nothing else was touched. An attack that gets through today
is written as the safe behaviour and marked ``xfail(strict=True)`` with what gets through as its reason, so closing
the hole turns its test into a failure (drop the mark then).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import stat
import threading
import urllib.parse
import uuid
from pathlib import Path

import httpx
import pytest
import redis
from cryptography.fernet import Fernet

from orchestrator.api import build_services, create_app
from orchestrator.config import Settings, get_settings
from orchestrator.dispatch import InlineDispatcher, QueueDispatcher
from orchestrator.errors import SkillValidationError
from orchestrator.mcp_server.conversation import Conversation, Scope
from orchestrator.mcp_server.stdio import STDIO_OWNER
from orchestrator.skills import create_default_skill_repository
from orchestrator.skills.tools.skill_toolset import SkillToolSet
from orchestrator.teams import TeamError
from tests.attacks.held import py
from tests.integration.conftest import worker_env  # noqa: F401 - the queue's worker settings
from tests.integration.test_secrets_runtimes import _values
from tests.orchestrator.api_helpers import api_in_a_thread, client, make_services, new_team
from tests.orchestrator.conftest import model_server  # noqa: F401 - the scripted model
from tests.orchestrator.test_api_sessions import parse_sse
from worker.jobs import execute as jobs
from worker.contract import RunRequest, SkillRef
from worker.errors import SecretError
from worker.run_store import RedisRunStore, RunStatus
from worker.runtimes.local.runtime import LocalWorkspaceRuntime
from worker.secrets.store import MAX_SECRETS_PER_TEAM, FileSecretStore, RedisSecretStore, SecretBox

pytestmark = pytest.mark.root

README = Path(__file__).resolve().parents[2] / "docs" / "security" / "secrets.md"  # the redaction text
SECRET = "ghp_Att4ckT0kenValue_9f3c2e"
"""team-a's GH_TOKEN."""
OTHER = "team-b-own-value-5d1e0a71"
"""team-b's GH_TOKEN (the same name, another team)."""
AWS = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYzEXAMPLEKEY"
"""An AWS-style secret key: standard base64 characters, '/' and '+' among them."""
QUOTED = 'pa"ss\\w0rd-\u00dcn\u00ef-2024'
"""A password with a quote, a backslash and non-ASCII letters."""
LONG = "-----BEGIN KEY-----" + "Zq7pW3xK9vLm2Rt8Yb4Nc6Hd1Jf5Gs0A" * 3 + "-----END KEY-----"
"""A value longer than 57 bytes: its base64 takes more than one 76-character line."""
GUESSABLE = "Summer2024!x"
"""A weak but valid (12 bytes) password."""
DECLARED = ["GH_TOKEN", "AWS_SECRET", "QUOTED", "LONG_KEY", "DB_PASS"]
"""What the ``github`` skill declares; ``plain`` declares nothing."""
WAIT = 60
"""Seconds an API wait may take (a guard against hangs, not a measure)."""


def forms(value: str) -> dict[str, str]:
    """The value and every encoding the README says is never given back: base64 in both alphabets at each alignment
    in a longer base64 text (the characters that depend on the value alone), hex in either case, percent-encoded."""
    raw = value.encode()
    found = {"raw": value, "hex": raw.hex(), "HEX": raw.hex().upper(),
             "percent": urllib.parse.quote(value, safe=""), "percent+": urllib.parse.quote_plus(value, safe="")}
    for alphabet, encode in (("base64", base64.b64encode), ("base64url", base64.urlsafe_b64encode)):
        for lead in range(3):
            encoded = encode(b"\0" * lead + raw).decode()
            found[f"{alphabet}@{lead}"] = encoded[4 if lead else 0:(lead + len(raw)) // 3 * 4]
    return {name: form for name, form in found.items() if len(form) >= 6}


def leaked(text: str, *values: str) -> list[str]:
    """Which forms of ``values`` (``SECRET`` by default) are in ``text``."""
    return [f"{value[:6]}…:{name}" for value in values or (SECRET,) for name, form in forms(value).items()
            if form in text]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


PROC_SCAN = py("""
    import hashlib, os
    seen = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for part in ("environ", "cmdline"):
            try:
                data = open(f"/proc/{pid}/{part}", "rb").read()
            except OSError:
                continue
            seen.update(hashlib.sha256(item).hexdigest() for item in data.split(b"\\0") if item)
    seen.update(hashlib.sha256(f"{k}={v}".encode()).hexdigest() for k, v in os.environ.items())
    print(" ".join(sorted(seen)))
    """)
"""Prints the sha256 of every environment entry and argument of every process it can read (itself included): a
secret's value found there shows as its hash, which redaction cannot hide."""


def _chmod_readable(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def write_secret_skill(root: Path, name: str, declared: list[str] | str | None, body: str = "Use it.\n") -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    metadata = "" if declared is None else f"metadata:\n  secrets: {json.dumps(declared)}\n"
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: The {name} skill.\n{metadata}---\n{body}")
    return folder


@pytest.fixture
def secret_library(shared_dir: Path) -> Path:
    root = shared_dir / "secret-library"
    write_secret_skill(root, "github", DECLARED)
    write_secret_skill(root, "plain", None)
    _chmod_readable(root)
    return root


@pytest.fixture
def key() -> str:
    return Fernet.generate_key().decode()


@pytest.fixture
def store(work_root: Path, key: str) -> FileSecretStore:
    return FileSecretStore(work_root.parent / "data" / "secrets", SecretBox(key))


def _services(work_root: Path, library: Path, store, model_url: str, **runtime_options):
    runtime = LocalWorkspaceRuntime(work_root, **runtime_options)
    built = make_services(InlineDispatcher({"local": runtime}, secrets=store), runtime.artifact_store,
                          work_root.parent / "data", model_url=model_url)
    built.repository = create_default_skill_repository(str(library), use_cached_repository=True)
    return built


@pytest.fixture
async def services(work_root, secret_library, store, model_server):  # noqa: F811
    built = _services(work_root, secret_library, store, model_server.base_url)
    yield built
    await built.close()


@pytest.fixture
async def held_services(work_root, secret_library, store, model_server):  # noqa: F811
    """As ``services``, with spawners started at once: every run of a workspace but its first goes into its held
    sandbox, to a ready shell started with the environment of the workspace's previous run."""
    built = _services(work_root, secret_library, store, model_server.base_url, spawners="eager")
    yield built
    await built.close()


def raw_client(services, key: str) -> httpx.AsyncClient:
    """``client``, but an exception the app lets out is a 500 answer (as under uvicorn), not raised in the test."""
    transport = httpx.ASGITransport(app=create_app(services=services), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://t", headers={"Authorization": f"Bearer {key}"})


async def run(api: httpx.AsyncClient, **body) -> httpx.Response:
    """Submit a run and wait for it to end; the run's answer."""
    submitted = await api.post("/v1/runs", json=body)
    assert submitted.status_code == 202, submitted.text
    answer = await api.get(f"/v1/runs/{submitted.json()['id']}", params={"wait": WAIT})
    assert answer.status_code == 200 and answer.json()["status"] in ("finished", "failed", "cancelled"), answer.text
    return answer


async def put_secret(api: httpx.AsyncClient, name: str, value: str) -> None:
    answer = await api.put(f"/v1/secrets/{name}", json={"value": value})
    assert answer.status_code == 200, answer.text


async def everything_of(api: httpx.AsyncClient, run_id: str) -> str:
    """All the API shows of a run: its answer, its events, every output file and artifact."""
    record = (await api.get(f"/v1/runs/{run_id}")).json()
    texts = [json.dumps(record), (await api.get(f"/v1/runs/{run_id}/events")).text,
             json.dumps((await api.get("/v1/runs")).json())]
    result = record.get("result") or {}
    for output in result.get("output_files", []):
        texts.append((await api.get(f"/v1/runs/{run_id}/files/{urllib.parse.quote(output['name'])}")).text)
    for artifact in result.get("artifact_files", []):
        texts.append((await api.get(f"/v1/runs/{run_id}/artifacts/{urllib.parse.quote(artifact['name'])}")).text)
    return "\n".join(texts)


def readme_secrets_section() -> str:
    text = f"### Team secrets\n{README.read_text()}\n## "  # the whole page: one section, its bullets
    start = text.index("### Team secrets")
    return text[start:text.index("\n## ", start)]


# ---- 1. names, values and bodies -----------------------------------------------------------------------------------

ODD_NAMES = [
    "LD_PRELOAD", "LD_AUDIT", "BASH_ENV", "ENV", "SHELLOPTS", "PS4", "PROMPT_COMMAND", "GCONV_PATH",
    "BASH_FUNC_x%25%25",
    "__skillrun_command", "WORK_DIR", "OUTPUT_DIR", "SKILL_NAME", "1TOKEN", "GH-TOKEN", "GH.TOKEN", "GH%20TOKEN",
    "GH_TOKEN%0A", "GH_TOKEN%00", "%0AGH_TOKEN", "..", "..%2F..%2Fetc%2Fpasswd", "%2E%2E", "GH_TOKEN%2F..", "A" * 129,
    "%C3%89TOKEN", "GH_TOKEN;id", "$(id)", "%24HOME",
]


async def test_secret_routes_refuse_odd_names_with_a_4xx_and_store_nothing(services):
    async with raw_client(services, new_team(services, "team-a")) as api:
        answers = {}
        for name in ODD_NAMES:
            answers[name] = ((await api.put(f"/v1/secrets/{name}", json={"value": SECRET})).status_code,
                             (await api.delete(f"/v1/secrets/{name}")).status_code)
        listed = (await api.get("/v1/secrets")).json()
    assert {name: codes for name, codes in answers.items() if not all(400 <= code < 500 for code in codes)} == {}
    assert listed == {"data": [], "count": 0}
    assert not (services.dispatcher.secrets.folder / "team-a.json").exists()


EDGE = base64.b64encode(hashlib.shake_256(b"edge").digest(48 * 1024)).decode()
"""A value of exactly 64 KiB (random-looking: a short piece repeated is refused)."""


async def test_secret_bodies_of_wrong_types_nan_nul_or_past_64_kib_are_refused_and_store_nothing(services, store):
    bodies = [
        b'{"value": NaN}', b'{"value": Infinity}', b'{"value": 123456789}', b'{"value": ["abcdefghij"]}',
        b'{"value": {"v": "abcdefghij"}}', b'{"value": null}', b'{"value": true}', b"{}", b"[]", b'"abcdefghij"',
        b'{"value": "abcdefghij", "team": "team-b"}', b'{"value": "abcdefghij", "name": "OTHER"}', b"{",
        b'{"value": "abc\\u0000defghij"}', b'{"value": "short"}', b'{"value": "1234567"}',
        json.dumps({"value": "x" * (64 * 1024 + 1)}).encode(),
        json.dumps({"value": "\u00e9" * 40_000}).encode(),  # 40,000 characters, 80,000 bytes
        json.dumps({"value": "x" * (64 * 1024)}).encode() + b" " * (5 * 1024 * 1024),  # past the 4 MiB JSON limit
        b"value=abcdefghij",
    ]
    async with raw_client(services, new_team(services, "team-a")) as api:
        codes = [(await api.put("/v1/secrets/GH_TOKEN", content=body, headers={"content-type": "application/json"}))
                 .status_code for body in bodies]
        exactly = await api.put("/v1/secrets/EDGE", json={"value": EDGE})
        shortest = await api.put("/v1/secrets/SHORTEST", json={"value": "8bytes!!"})
        listed = (await api.get("/v1/secrets")).json()
    assert [(body[:40], code) for body, code in zip(bodies, codes) if not 400 <= code < 500] == []
    assert exactly.status_code == 200 and shortest.status_code == 200
    assert [s["name"] for s in listed["data"]] == ["EDGE", "SHORTEST"]
    assert store.reveal("team-a", ["EDGE"]) == {"EDGE": EDGE}


async def test_a_value_holding_a_lone_surrogate_is_a_4xx_not_a_500(services):
    async with raw_client(services, new_team(services, "team-a")) as api:
        answer = await api.put("/v1/secrets/GH_TOKEN", content=b'{"value": "abcdefgh\\ud800ijk"}',
                               headers={"content-type": "application/json"})
        listed = (await api.get("/v1/secrets")).json()
    assert listed["count"] == 0
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text)


def test_a_name_or_team_with_a_trailing_newline_is_refused_everywhere(tmp_path, key, secret_library):
    store = FileSecretStore(tmp_path / "secrets", SecretBox(key))
    accepted = []
    for team, name in (("team-a", "GH_TOKEN\n"), ("team-a\n", "GH_TOKEN")):
        try:
            store.set(team, name, SECRET)
            accepted.append(f"store {team!r} {name!r}")
        except SecretError:
            pass
    try:
        RunRequest(skill=SkillRef(name="github", root=str(secret_library), path="github"), command="true",
                   secrets=["GH_TOKEN\n"])
        accepted.append("run request")
    except ValueError:
        pass
    (secret_library / "github" / "SKILL.md").write_text(
        '---\nname: github\ndescription: d.\nmetadata:\n  secrets: ["GH_TOKEN\\n"]\n---\nx\n')
    try:
        create_default_skill_repository(str(secret_library)).get("github")
        accepted.append("SKILL.md")
    except SkillValidationError:
        pass
    assert accepted == []


@pytest.mark.parametrize(("declared", "says"), [
    (["LD_PRELOAD"], "changes how programs load"),
    (["BASH_ENV"], "changes how programs load"),
    (["WORK_DIR"], "set by the workspace"),
    (["1TOKEN"], "not a valid environment variable name"),
    (["GH-TOKEN"], "not a valid environment variable name"),
    (["A" * 129], "longer than 128"),
    ("GH_TOKEN", "must be a list of secret names"),
    ([123], "must be a list of secret names"),
    ([None], "must be a list of secret names"),
    ({"GH_TOKEN": 1}, "must be a list of secret names"),
])
def test_a_skill_declaring_a_bad_secret_name_fails_to_load_saying_where_and_why(shared_dir, declared, says):
    root = shared_dir / "bad-library"
    write_secret_skill(root, "bad", declared)
    write_secret_skill(root, "good", ["GH_TOKEN"])
    _chmod_readable(root)
    repository = create_default_skill_repository(str(root))
    with pytest.raises(SkillValidationError) as refused:
        repository.get("bad")
    assert "metadata.secrets" in str(refused.value) and says in str(refused.value)
    assert repository.get("good").secrets == ["GH_TOKEN"]  # the library's other skills load as before


async def test_a_run_naming_secrets_badly_is_refused_before_anything_is_queued(services):
    async with raw_client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        bad = [["LD_PRELOAD"], ["BASH_ENV"], ["WORK_DIR"], ["GH_TOKEN", "GH_TOKEN"], [f"S{i}" for i in range(33)],
               "GH_TOKEN", [123], [None], [["GH_TOKEN"]], {"GH_TOKEN": True}, ["GH_TOKEN\n"], ["gh_token"],
               ["AWS_SECRET"]]  # the last two: declared by no skill / declared but never stored
        codes = [(await api.post("/v1/runs", json={"skill": "github", "command": "env", "secrets": names}))
                 .status_code for names in bad]
        runs = (await api.get("/v1/runs")).json()
    assert [(names, code) for names, code in zip(bad, codes) if code not in (400, 422)] == []
    assert runs["count"] == 0


# ---- 2. the store --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("team", ["../../etc/passwd", "../team-b", "team-a/../team-b", "/tmp/x", "TEAM-A", "", ".",
                                  "-team", "team a", "team-a.json", "a" * 33, "team\0a", None])
def test_the_file_store_refuses_team_ids_that_are_not_team_names_and_writes_nothing(tmp_path, key, team):
    folder = tmp_path / "data" / "secrets"
    store = FileSecretStore(folder, SecretBox(key))
    with pytest.raises(SecretError, match="secrets belong to a team"):
        store.set(team, "GH_TOKEN", SECRET)
    assert store.reveal_all(team) == {}
    assert not folder.exists() and list(tmp_path.iterdir()) == []


def test_the_file_store_folder_and_files_are_private_and_hold_no_value(tmp_path, key):
    folder = tmp_path / "data" / "secrets"
    store = FileSecretStore(folder, SecretBox(key))
    store.set("team-a", "GH_TOKEN", SECRET)
    store.set("team-a", "GH_TOKEN", SECRET + "-2")  # replaced: written again
    store.set("team-b", "GH_TOKEN", OTHER)
    for kept in [folder, *folder.rglob("*")]:
        if kept.is_dir():
            assert stat.S_IMODE(kept.stat().st_mode) == 0o700, kept
        else:
            assert stat.S_IMODE(kept.stat().st_mode) == 0o600, kept
            assert leaked(kept.read_text(), SECRET, OTHER) == []
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert files == ["team-a/GH_TOKEN.json", "team-b/GH_TOKEN.json"]  # no partial file left


@pytest.mark.parametrize("content", ["{not json", "[]"])
@pytest.mark.parametrize("layout", ["document", "earlier team file"])
async def test_a_malformed_store_file_is_a_clear_error_not_a_500_and_other_teams_are_untouched(services, store,
                                                                                              content, layout):
    """A secret's document that cannot be read, or a team's file of the earlier layout that cannot be moved."""
    alpha, beta = new_team(services, "team-a"), new_team(services, "team-b")
    async with raw_client(services, beta) as api:
        await put_secret(api, "GH_TOKEN", OTHER)
    if layout == "document":
        async with raw_client(services, alpha) as api:
            await put_secret(api, "NPM_TOKEN", SECRET)
        malformed = store.folder / "team-a" / "NPM_TOKEN.json"
    else:
        malformed = store.folder / "team-a.json"
    malformed.write_text(content)
    async with raw_client(services, alpha) as api:
        listed = await api.get("/v1/secrets")
        stored = await api.put("/v1/secrets/GH_TOKEN", json={"value": SECRET})
        failed = (await run(api, skill="plain", command="echo hi")).json()
    async with raw_client(services, beta) as api:
        theirs = (await api.get("/v1/secrets")).json()
        ran = (await run(api, skill="github", command='echo "$GH_TOKEN"', secrets=["GH_TOKEN"])).json()
    assert [s["name"] for s in theirs["data"]] == ["GH_TOKEN"] and ran["result"]["stdout"] == "[redacted:GH_TOKEN]\n"
    if content != "[]":  # an unreadable store fails team-a's runs closed (they could not be redacted)
        assert failed["status"] == "failed" and failed["result"] is None, failed
    assert malformed.read_text() == content  # nothing overwrote it
    for answer in (listed, stored):
        assert answer.status_code != 500 and "team-a" in answer.json()["detail"], (answer.status_code, answer.text)


@pytest.fixture(params=["file", "redis"])
def any_store(request, tmp_path, key):
    if request.param == "file":
        return FileSecretStore(tmp_path / "secrets", SecretBox(key))
    url = request.getfixturevalue("redis_url")
    return RedisSecretStore(redis.Redis.from_url(url), SecretBox(key))


def test_a_team_at_100_secrets_may_replace_one_but_not_add_another_and_other_teams_are_not_counted(any_store):
    for i in range(MAX_SECRETS_PER_TEAM):
        any_store.set("team-a", f"S{i}", f"value-{i:04d}")
    with pytest.raises(SecretError, match="100 secrets"):
        any_store.set("team-a", "ONE_MORE", SECRET)
    any_store.set("team-a", "S7", SECRET)  # replacing is not adding
    any_store.set("team-b", "ONE_MORE", OTHER)  # another team's count is its own
    assert len(any_store.list("team-a")) == MAX_SECRETS_PER_TEAM and "ONE_MORE" not in {
        s.name for s in any_store.list("team-a")}
    assert any_store.reveal("team-a", ["S7", "S8"]) == {"S7": SECRET, "S8": "value-0008"}


def test_concurrent_sets_at_the_limit_never_pass_100(any_store):
    for i in range(MAX_SECRETS_PER_TEAM - 1):
        any_store.set("team-a", f"S{i}", f"value-{i:04d}")
    outcomes: list[str] = []

    def add(i: int) -> None:
        try:
            any_store.set("team-a", f"NEW{i}", f"new-value-{i}")
            outcomes.append("stored")
        except SecretError:
            outcomes.append("refused")

    threads = [threading.Thread(target=add, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["refused"] * 11 + ["stored"]
    assert len(any_store.list("team-a")) == MAX_SECRETS_PER_TEAM


def test_concurrent_sets_of_one_name_leave_one_whole_value_that_decrypts(any_store):
    values = [f"value-{i:02d}-{uuid.uuid4().hex}" for i in range(16)]
    first = any_store.set("team-a", "GH_TOKEN", SECRET)
    threads = [threading.Thread(target=any_store.set, args=("team-a", "GH_TOKEN", value)) for value in values]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    [info] = any_store.list("team-a")
    assert info.name == "GH_TOKEN" and info.created_at == first.created_at
    assert any_store.reveal("team-a", ["GH_TOKEN"])["GH_TOKEN"] in values


def test_two_processes_sharing_the_file_store_lose_no_secret(tmp_path, key):
    folder = tmp_path / "secrets"
    api_process, cli_process = FileSecretStore(folder, SecretBox(key)), FileSecretStore(folder, SecretBox(key))
    cli_done = threading.Event()
    put = api_process.documents.put

    def interleaved(team: str, name: str, entry: dict) -> None:
        """The API process has read the team's entries (and checked its count and size) and is about to write: the
        CLI process stores a secret of its own now."""
        if not cli_done.is_set():
            threading.Thread(target=lambda: (cli_process.set("team-a", "FROM_CLI", OTHER), cli_done.set())).start()
            cli_done.wait(10)  # a cross-process lock would hold the CLI until the API's write is done
        put(team, name, entry)

    api_process.documents.put = interleaved
    api_process.set("team-a", "FROM_API", SECRET)
    assert cli_done.wait(30)
    assert {s.name for s in FileSecretStore(folder, SecretBox(key)).list("team-a")} == {"FROM_API", "FROM_CLI"}


def test_the_api_refuses_to_start_over_redis_secrets_without_a_key_and_a_wrong_key_opens_nothing(redis_url, tmp_path,
                                                                                                  key):
    RedisSecretStore(redis.Redis.from_url(redis_url), SecretBox(key)).set("team-a", "GH_TOKEN", SECRET)
    with pytest.raises(SecretError, match="SKILLRUN_SECRETS_KEY is not set"):
        build_services(Settings(redis_url=redis_url, data_dir=tmp_path / "data", work_root=tmp_path / "work"))
    wrong = RedisSecretStore(redis.Redis.from_url(redis_url), SecretBox(Fernet.generate_key().decode()))
    with pytest.raises(SecretError, match="not the key it was stored with") as refused:
        wrong.reveal_all("team-a")
    assert leaked(str(refused.value)) == []
    for bad in ("", " , ", "not-a-key", key[:-2]):
        with pytest.raises(SecretError, match="Fernet keys"):
            SecretBox(bad)


# ---- 3. who gets a value -------------------------------------------------------------------------------------------

async def _until(predicate, what: str) -> None:
    for _ in range(600):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


async def test_no_other_run_reads_a_secret_from_proc_concurrently_in_its_workspace_or_another_or_after_it(
    held_services, work_root
):
    services = held_services
    alpha, beta = new_team(services, "team-a"), new_team(services, "team-b")
    hashes = {sha(f"GH_TOKEN={SECRET}"), sha(SECRET)}
    async with client(services, alpha) as a, client(services, beta) as b:
        await put_secret(a, "GH_TOKEN", SECRET)
        await run(a, skill="github", command="true", workspace_id="w")  # the workspace's held sandbox exists
        holder = await a.post("/v1/runs", json={"skill": "github", "secrets": ["GH_TOKEN"], "workspace_id": "w",
                                                "command": "touch $WORK_DIR/holding; sleep 120"})
        await _until(lambda: list(work_root.glob("*/work/holding")), "the run holding the secret started")
        scans = {
            "same workspace, concurrent": await run(a, skill="github", command=PROC_SCAN, workspace_id="w"),
            "same team, another workspace": await run(a, skill="plain", command=PROC_SCAN, workspace_id="v"),
            "another team, same workspace id": await run(b, skill="github", command=PROC_SCAN, workspace_id="w"),
        }
        await a.post(f"/v1/runs/{holder.json()['id']}/cancel")
        ended = (await a.get(f"/v1/runs/{holder.json()['id']}", params={"wait": WAIT})).json()
        # the workspace's next runs: a ready shell was started with the previous run's environment
        scans["next run of the workspace"] = await run(a, skill="github", command=PROC_SCAN, workspace_id="w")
        scans["the run after, another skill"] = await run(a, skill="plain", command=PROC_SCAN, workspace_id="w")
        named = await run(a, skill="github", command=PROC_SCAN, workspace_id="w", secrets=["GH_TOKEN"])
    assert ended["status"] == "cancelled", json.dumps(ended)
    for where, answer in scans.items():
        result = answer.json()["result"]
        seen = set(result["stdout"].split())
        skill = answer.json()["skill"]
        assert sha(f"SKILL_NAME={skill}") in seen, (where, result)  # the scan works: it saw its own environment
        assert seen & hashes == set(), where
    assert sha(f"GH_TOKEN={SECRET}") in named.json()["result"]["stdout"].split()  # the run naming it has it


async def test_a_concurrent_run_of_another_skill_does_not_kill_a_running_run_of_the_workspace(held_services,
                                                                                               work_root):
    async with client(held_services, new_team(held_services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        await run(api, skill="plain", command="true", workspace_id="w")  # the held sandbox is plain's
        holder = await api.post("/v1/runs", json={
            "skill": "github", "secrets": ["GH_TOKEN"], "workspace_id": "w", "timeout": 60,
            "command": "touch $WORK_DIR/holding; until [ -e $WORK_DIR/go ]; do sleep 0.05; done; echo done"})
        await _until(lambda: list(work_root.glob("*/work/holding")), "the first run started")
        other = await run(api, skill="plain", command="echo other", workspace_id="w")
        for folder in work_root.glob("*/work"):
            (folder / "go").touch()
        ended = (await api.get(f"/v1/runs/{holder.json()['id']}", params={"wait": WAIT})).json()
    assert other.json()["result"]["stdout"] == "other\n"
    assert ended["result"]["stdout"] == "done\n" and ended["result"]["exit_code"] == 0, ended["result"]


async def test_a_secret_wins_over_an_env_variable_of_its_name_and_env_alone_never_gets_it(services):
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        show = 'printf %s "$GH_TOKEN" | sha256sum; echo "$GH_TOKEN"'
        both = (await run(api, skill="github", command=show, env={"GH_TOKEN": "decoy-value-1"},
                          secrets=["GH_TOKEN"])).json()["result"]
        env_only = (await run(api, skill="github", command=show, env={"GH_TOKEN": "decoy-value-1"})).json()["result"]
    assert both["stdout"].split()[0] == sha(SECRET) and both["stdout"].endswith("[redacted:GH_TOKEN]\n")
    assert env_only["stdout"].split()[0] == sha("decoy-value-1") and env_only["stdout"].endswith("decoy-value-1\n")


async def test_another_team_cannot_list_overwrite_delete_or_use_a_teams_secret_through_the_api_or_the_agent(
    services, store, model_server  # noqa: F811
):
    alpha, beta = new_team(services, "team-a"), new_team(services, "team-b")
    async with client(services, alpha) as a:
        await put_secret(a, "GH_TOKEN", SECRET)
        created = store.list("team-a")[0]
    model_server.add(
        {"tool_calls": [{"name": "skill_run", "arguments": {
            "skill": "github", "command": 'echo "got:$GH_TOKEN"', "secrets": ["GH_TOKEN"]}}]},
        {"text": "Done."},
    )
    async with client(services, beta) as b:
        listed = (await b.get("/v1/secrets")).json()
        deleted = await b.delete("/v1/secrets/GH_TOKEN")
        refused = await b.post("/v1/runs", json={"skill": "github", "command": "env", "secrets": ["GH_TOKEN"]})
        await b.post("/v1/sessions", json={"session_id": "s1"})
        streamed = await b.post("/v1/sessions/s1/messages", json={"text": "use team-a's token"})
        own = await b.put("/v1/secrets/GH_TOKEN", json={"value": OTHER})  # its own, under the same name
        mine = (await run(b, skill="github", command='echo "got:$GH_TOKEN"', secrets=["GH_TOKEN"])).json()
        gone = await b.delete("/v1/secrets/GH_TOKEN")
        runs = (await b.get("/v1/runs")).json()
    tool_result = next(data for kind, data in parse_sse(streamed.text) if kind == "tool_result")["response"]
    assert listed == {"data": [], "count": 0} and deleted.status_code == 404
    assert refused.status_code == 400 and "the team has no secret GH_TOKEN" in refused.json()["detail"]
    assert "team team-b has no secret GH_TOKEN" in json.dumps(tool_result) and "got:" not in json.dumps(tool_result)
    assert own.status_code == 200 and gone.status_code == 204
    assert mine["result"]["stdout"] == "got:[redacted:GH_TOKEN]\n"
    assert leaked(streamed.text + json.dumps(model_server.requests) + json.dumps(runs)) == []
    # team-a's secret is as it was: same value, same dates
    assert store.reveal("team-a", ["GH_TOKEN"]) == {"GH_TOKEN": SECRET}
    assert store.list("team-a") == [created] and store.list("team-b") == []


async def test_the_stdio_mcp_server_which_is_no_team_cannot_use_the_secrets_of_a_team_named_mcp(services, store):
    with pytest.raises(TeamError):  # its owner cannot be a team's name
        services.teams.create_team(STDIO_OWNER)
    async with client(services, new_team(services, "mcp")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
    scope = Scope(repository=services.repository, dispatcher=services.dispatcher, owner=STDIO_OWNER)
    conversation = Conversation()
    conversation.claim(scope)
    conversation.will_run(scope)
    tools = {tool.name: tool for tool in await SkillToolSet(services.repository,
                                                            dispatcher=services.dispatcher).get_tools(None)}
    try:
        answer = await tools["skill_run"].run_async(tool_context=conversation.context(scope), args={
            "skill": "github", "command": 'printf %s "$GH_TOKEN" | sha256sum', "secrets": ["GH_TOKEN"]})
    finally:
        await conversation.end()
    assert sha(SECRET) not in json.dumps(answer) and "secrets belong to a team" in answer["error"], answer


# ---- 4. what comes back --------------------------------------------------------------------------------------------

async def test_a_queued_run_given_a_replaced_or_removed_secret_leaves_no_value_in_redis_the_job_or_the_logs(
    redis_url, worker_env, secret_library, key, monkeypatch, caplog  # noqa: F811
):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("SKILLRUN_SECRETS_KEY", key)
    jobs.get_worker_settings.cache_clear()
    secrets = RedisSecretStore(redis.Redis.from_url(redis_url), SecretBox(key))
    secrets.set("team-a", "GH_TOKEN", SECRET)
    ref = create_default_skill_repository(str(secret_library)).skill_ref("github")
    command = ('echo "t:$GH_TOKEN"; printf %s "$GH_TOKEN" | base64; printf %s "$GH_TOKEN" | sha256sum; '
               'echo "$GH_TOKEN" > $OUTPUT_DIR/t.txt; echo "e:$GH_TOKEN" >&2')
    dispatcher = QueueDispatcher(redis_url)
    store = RedisRunStore(redis.Redis.from_url(redis_url))
    rotated = SECRET + "-rotated"
    try:
        ids = []
        for _ in range(3):
            request = RunRequest(skill=ref, command=command, secrets=["GH_TOKEN"], output_files=["out/t.txt"])
            ids.append((await dispatcher.submit(request, owner="team-a")).id)
        await asyncio.to_thread(jobs.execute_stored_run, store, ids[0], "attacker-test")
        secrets.set("team-a", "GH_TOKEN", rotated)  # replaced after the run was accepted
        await asyncio.to_thread(jobs.execute_stored_run, store, ids[1], "attacker-test")
        assert secrets.remove("team-a", "GH_TOKEN")  # removed after the run was accepted
        await asyncio.to_thread(jobs.execute_stored_run, store, ids[2], "attacker-test")
        first, second, third = [await dispatcher.get(run_id) for run_id in ids]
    finally:
        await dispatcher.close()
        await asyncio.to_thread(jobs.close_runtimes)
    assert first.status == RunStatus.FINISHED and first.result.stdout.startswith("t:[redacted:GH_TOKEN]\n")
    assert sha(SECRET) in first.result.stdout and first.result.output_files[0].content == "[redacted:GH_TOKEN]\n"
    assert second.status == RunStatus.FINISHED and sha(rotated) in second.result.stdout  # the value at its start
    assert third.status == RunStatus.FAILED and "team team-a has no secret GH_TOKEN" in third.error
    connection = redis.Redis.from_url(redis_url)
    everything = b"".join(v for name in connection.scan_iter(count=1000) for v in _values(connection, name))
    assert leaked(everything.decode("utf-8", "replace"), SECRET, rotated) == []
    assert leaked(caplog.text, SECRET, rotated) == []


async def test_a_cancelled_or_timed_out_run_gives_back_no_secret_in_what_it_had_written(services, work_root, caplog):
    caplog.set_level(logging.DEBUG)
    leak = 'echo "o:$GH_TOKEN"; echo "e:$GH_TOKEN" >&2; echo "$GH_TOKEN" > $OUTPUT_DIR/partial.txt; '
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        timed_out = await run(api, skill="github", secrets=["GH_TOKEN"], output_files=["out/*"], timeout=2,
                              command=leak + "sleep 60")
        submitted = await api.post("/v1/runs", json={
            "skill": "github", "secrets": ["GH_TOKEN"], "output_files": ["out/*"], "save_as_artifacts": True,
            "command": leak + "touch $WORK_DIR/cancel-me; sleep 60", "workspace_id": "c"})
        await _until(lambda: list(work_root.glob("*/work/cancel-me")), "the run wrote its secret")
        await api.post(f"/v1/runs/{submitted.json()['id']}/cancel")
        cancelled = (await api.get(f"/v1/runs/{submitted.json()['id']}", params={"wait": WAIT})).json()
        shown = await everything_of(api, timed_out.json()["id"]) + await everything_of(api, cancelled["id"])
    assert timed_out.json()["result"]["timed_out"] and "o:[redacted:GH_TOKEN]" in timed_out.json()["result"]["stdout"]
    assert cancelled["status"] == "cancelled"
    assert leaked(shown) == [] and leaked(caplog.text) == []


async def test_the_in_memory_record_keeps_no_revealed_value_once_the_run_is_over(services):
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        answer = await run(api, skill="github", secrets=["GH_TOKEN"], command="true")
    record = await services.dispatcher.get(answer.json()["id"])
    assert record.request.secrets == ["GH_TOKEN"] and record.request.secret_values == {}
    assert leaked(repr(services.dispatcher.store.__dict__)) == []


async def test_a_file_named_after_the_secret_does_not_show_its_value_in_names_or_skipped_files(services, caplog):
    caplog.set_level(logging.DEBUG)
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        answer = await run(api, skill="github", secrets=["GH_TOKEN"], output_files=["out/*"], save_as_artifacts=True,
                           command='echo report > "$OUTPUT_DIR/$GH_TOKEN.txt"; mkfifo "$OUTPUT_DIR/fifo-$GH_TOKEN"')
        shown = await everything_of(api, answer.json()["id"])
    result = answer.json()["result"]
    assert result["exit_code"] == 0 and len(result["output_files"]) == 1 and len(result["skipped_files"]) == 1
    assert leaked(shown) == [] and leaked(caplog.text) == []


async def test_the_model_and_the_session_stream_never_see_a_file_named_after_the_secret(services, model_server):  # noqa: F811
    model_server.add(
        {"tool_calls": [{"name": "skill_run", "arguments": {
            "skill": "github", "secrets": ["GH_TOKEN"], "output_files": ["out/*"],
            "command": 'echo done > "$OUTPUT_DIR/cfg-$GH_TOKEN.txt"; mkfifo "$OUTPUT_DIR/p-$GH_TOKEN"'}}]},
        {"text": "All done."},
    )
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        await api.post("/v1/sessions", json={"session_id": "s1"})
        streamed = await api.post("/v1/sessions/s1/messages", json={"text": "make the report"})
        session = await api.get("/v1/sessions/s1")
    tool_result = next(data for kind, data in parse_sse(streamed.text) if kind == "tool_result")["response"]
    assert len(tool_result["output_files"]) == 1 and len(model_server.requests) == 2
    assert leaked(json.dumps(model_server.requests) + streamed.text + session.text) == []


async def test_an_artifact_of_a_run_not_naming_the_secret_holds_no_value_an_earlier_run_left(services):
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        await run(api, skill="github", secrets=["GH_TOKEN"], workspace_id="shared",
                  command='echo "token=$GH_TOKEN" > $WORK_DIR/config.ini')
        later = await run(api, skill="plain", workspace_id="shared", save_as_artifacts=True,
                          output_files=["out/config.txt"], command="cp $WORK_DIR/config.ini $OUTPUT_DIR/config.txt")
        artifact = await api.get(f"/v1/runs/{later.json()['id']}/artifacts/out/config.txt")
    assert later.json()["result"]["output_files"][0]["content"] == "token=[redacted:GH_TOKEN]\n"
    assert artifact.status_code == 200 and leaked(artifact.text) == [], artifact.text


async def test_stdout_cut_at_its_cap_keeps_no_prefix_of_the_secret(services):
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        answer = await run(api, skill="github", secrets=["GH_TOKEN"], limits={"stdout_bytes": 4 + 20},
                           command='printf "tok=%s\\n" "$GH_TOKEN"; printf "tok=%s\\n" "$GH_TOKEN" >&2')
    result = answer.json()["result"]
    assert result["stdout_truncated"] and result["stderr"] == "tok=[redacted:GH_TOKEN]\n"
    assert SECRET[:20] not in result["stdout"], result["stdout"]


async def test_an_output_file_cut_at_its_cap_keeps_no_prefix_of_the_secret(services):
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        answer = await run(api, skill="github", secrets=["GH_TOKEN"], output_files=["out/*"],
                           limits={"output_file_bytes": 6 + 20},
                           command='printf "token=%s\\n" "$GH_TOKEN" > $OUTPUT_DIR/cfg.txt')
        shown = await everything_of(api, answer.json()["id"])
    [output] = answer.json()["result"]["output_files"]
    assert output["truncated"]
    assert SECRET[:20] not in shown, output


async def test_a_json_or_repr_dump_of_a_value_with_quotes_or_backslashes_is_redacted(services):
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "QUOTED", QUOTED)
        answer = await run(api, skill="github", secrets=["QUOTED"], command=py("""
            import json, os
            print("raw:", os.environ["QUOTED"])
            print(json.dumps({"password": os.environ["QUOTED"]}))
            print({"password": os.environ["QUOTED"]})
            """))
    stdout = answer.json()["result"]["stdout"]
    assert stdout.startswith("raw: [redacted:QUOTED]\n"), stdout  # the raw value is caught
    assert json.dumps(QUOTED) not in stdout and repr(QUOTED) not in stdout, stdout


async def test_the_default_percent_encoding_of_a_value_with_a_slash_is_redacted(services):
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "AWS_SECRET", AWS)
        answer = await run(api, skill="github", secrets=["AWS_SECRET"], command=py("""
            import os, urllib.parse
            value = os.environ["AWS_SECRET"]
            print(urllib.parse.quote(value, safe=""))
            print("https://s3.example/?key=" + urllib.parse.quote(value))
            """))
    stdout = answer.json()["result"]["stdout"]
    assert stdout.startswith("[redacted:AWS_SECRET]\n"), stdout
    assert urllib.parse.quote(AWS) not in stdout, stdout


async def test_line_wrapped_base64_of_a_long_secret_is_redacted(services):
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "LONG_KEY", LONG)
        answer = await run(api, skill="github", secrets=["LONG_KEY"],
                           command='printf %s "$LONG_KEY" | base64; printf %s "$LONG_KEY" | base64 -w0; echo')
    stdout = answer.json()["result"]["stdout"]
    assert stdout.endswith("\n[redacted:LONG_KEY]\n"), stdout  # unwrapped, it is caught
    first_line = base64.b64encode(LONG.encode()).decode()[:76]
    assert first_line not in stdout, stdout


async def test_a_binary_output_file_holding_the_secret_is_redacted_or_the_readme_says_it_is_not(services):
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        answer = await run(api, skill="github", secrets=["GH_TOKEN"], output_files=["out/*"], save_as_artifacts=True,
                           command="printf '\\000\\001\\002%s' \"$GH_TOKEN\" > $OUTPUT_DIR/cache.bin")
        shown = await everything_of(api, answer.json()["id"])
    [output] = answer.json()["result"]["output_files"]
    assert output["encoding"] == "base64"
    section = readme_secrets_section().lower()
    assert leaked(shown) == [] or ("binary" in section and "not" in section), leaked(shown)


async def test_a_secret_written_as_text_to_a_key_or_pem_file_is_redacted(services):
    names = ["deploy.key", "key.pem", "cert.crt", "token.asc", "mail.eml"]
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        answer = await run(api, skill="github", secrets=["GH_TOKEN"], output_files=["out/*"], save_as_artifacts=True,
                           command="; ".join(f'printf "token: %s\\n" "$GH_TOKEN" > $OUTPUT_DIR/{name}'
                                             for name in names))
        shown = await everything_of(api, answer.json()["id"])
    outputs = {Path(output["name"]).name: output for output in answer.json()["result"]["output_files"]}
    assert sorted(outputs) == sorted(names)
    assert {name: leaked(json.dumps(output)) for name, output in outputs.items() if leaked(json.dumps(output))} == {}
    assert leaked(shown) == []


async def test_a_process_without_the_key_refuses_every_run_of_a_team_that_has_secrets(tmp_path, work_root, key,
                                                                                      secret_library):
    folder = tmp_path / "secrets"
    FileSecretStore(folder, SecretBox(key)).set("team-a", "GH_TOKEN", SECRET)
    runtime = LocalWorkspaceRuntime(work_root)
    dispatcher = InlineDispatcher({"local": runtime}, secrets=FileSecretStore(folder, None))
    ref = create_default_skill_repository(str(secret_library)).skill_ref("plain")
    try:
        with pytest.raises(SecretError, match="SKILLRUN_SECRETS_KEY"):  # it could not redact them: it runs nothing
            await dispatcher.run(RunRequest(skill=ref, command="cat $WORK_DIR/* 2>/dev/null; echo ran"),
                                 owner="team-a")
        other = await dispatcher.run(RunRequest(skill=ref, command="echo ran"), owner="team-b")
        [refused] = await dispatcher.list(None, 10, owner="team-a")
    finally:
        await dispatcher.close()
    assert refused.status == RunStatus.FAILED and refused.result is None and leaked(refused.error) == []
    assert other.stdout == "ran\n"  # a team without secrets runs as before


@pytest.mark.xfail(strict=True, reason="every run of the team is redacted of every secret of the team, so any run "
                   "— of a skill that declares no secret, or a model's command — can print guesses and see which one "
                   "comes back as [redacted:NAME]: redaction confirms a guessable value (8 bytes is the only bar)")
async def test_redaction_is_no_oracle_a_run_not_given_the_secret_can_test_guesses_against(services):
    guesses = [f"{season}{year}{mark}" for season in ("Spring", "Summer", "Autumn", "Winter")
               for year in range(2019, 2026) for mark in ("!", "!x", "?", "#1")]
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "DB_PASS", GUESSABLE)
        answer = await run(api, skill="plain", command=f"printf '%s\\n' {' '.join(guesses)}")
    lines = answer.json()["result"]["stdout"].splitlines()
    assert len(lines) == len(guesses)
    confirmed = [guess for guess, line in zip(guesses, lines) if line != guess]
    assert confirmed == [], f"the run learnt DB_PASS = {confirmed}"


@pytest.mark.xfail(strict=True, reason="a value replaced (rotated) or removed is no longer redacted: what an earlier "
                   "run left in the workspace (config files, caches) shows the old value — still valid at the service "
                   "until revoked — to every later run, the model and the API (attach_secrets redacts the team's "
                   "current secrets only)")
async def test_a_rotated_or_removed_value_an_earlier_run_left_in_the_workspace_is_still_not_shown(services):
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        await run(api, skill="github", secrets=["GH_TOKEN"], workspace_id="kept",
                  command='echo "$GH_TOKEN" > $WORK_DIR/token.cache')
        await put_secret(api, "GH_TOKEN", OTHER)  # rotated
        after_rotation = await run(api, skill="plain", workspace_id="kept", command="cat $WORK_DIR/token.cache")
        assert (await api.delete("/v1/secrets/GH_TOKEN")).status_code == 204
        after_removal = await run(api, skill="plain", workspace_id="kept", command="cat $WORK_DIR/token.cache")
    assert leaked(after_rotation.text) == [] and leaked(after_removal.text) == [], (after_rotation.json()["result"],
                                                                                     after_removal.json()["result"])


async def test_a_value_found_in_ordinary_output_is_redacted_there_and_nothing_else_is_touched(services):
    """A short value that is an ordinary word: every occurrence is redacted, as the 8-byte floor warns, and the rest of
    the output (and of other runs) is as it was."""
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "DB_PASS", "password")
        answer = await run(api, skill="plain", command="echo 'the password field: passwords differ'; echo 'Password'")
    assert answer.json()["result"]["stdout"] == ("the [redacted:DB_PASS] field: [redacted:DB_PASS]s differ\n"
                                                 "Password\n")


async def test_a_case_changed_value_is_outside_redaction_as_the_readme_says(services):
    """Documented: redaction does not contain a command that transforms its secret (here: upper case)."""
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        answer = await run(api, skill="github", secrets=["GH_TOKEN"], command='echo "$GH_TOKEN"; echo "${GH_TOKEN^^}"')
    assert answer.json()["result"]["stdout"] == f"[redacted:GH_TOKEN]\n{SECRET.upper()}\n"
    assert "transform it otherwise" in readme_secrets_section()


# ---- 5. MCP (the API's /mcp) ---------------------------------------------------------------------------------------

MCP_FILE_CAP = 4096
PROTOCOL = "2025-06-18"


class Mcp:
    def __init__(self, url: str) -> None:
        self.url = f"{url}/mcp"

    def _headers(self, key: str, session: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
                   "Authorization": f"Bearer {key}"}
        if session:
            headers |= {"mcp-session-id": session, "mcp-protocol-version": PROTOCOL}
        return headers

    async def open(self, http: httpx.AsyncClient, key: str) -> str:
        answer = await http.post(self.url, headers=self._headers(key), json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "attacker", "version": "1"}}})
        assert answer.status_code == 200, answer.text
        session = answer.headers["mcp-session-id"]
        await http.post(self.url, headers=self._headers(key, session),
                        json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        return session

    async def skill_run(self, http: httpx.AsyncClient, key: str, session: str, **arguments) -> tuple[dict, str]:
        answer = await http.post(self.url, headers=self._headers(key, session), json={
            "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "skill_run", "arguments": arguments}})
        assert answer.status_code == 200, answer.text
        return answer.json()["result"], answer.text


@pytest.fixture
async def mcp_api(work_root, secret_library, store, monkeypatch):
    monkeypatch.setenv("SKILLRUN_MCP_OUTPUT_FILE_BYTES", str(MCP_FILE_CAP))
    get_settings.cache_clear()
    services = _services(work_root, secret_library, store, "http://127.0.0.1:9/v1")
    with api_in_a_thread(services) as url:
        yield services, Mcp(url), url
    await services.close()
    get_settings.cache_clear()


async def test_mcp_another_team_cannot_use_a_teams_secret_and_the_teams_own_results_hold_none(mcp_api, caplog):
    caplog.set_level(logging.DEBUG)
    services, mcp, url = mcp_api
    alpha, beta = new_team(services, "team-a"), new_team(services, "team-b")
    async with httpx.AsyncClient(timeout=WAIT) as http:
        answer = await http.put(f"{url}/v1/secrets/GH_TOKEN", json={"value": SECRET},
                                headers={"Authorization": f"Bearer {alpha}"})
        assert answer.status_code == 200
        theirs, their_text = await mcp.skill_run(http, beta, await mcp.open(http, beta), skill="github",
                                                 command='echo "got:$GH_TOKEN"', secrets=["GH_TOKEN"])
        ours, our_text = await mcp.skill_run(
            http, alpha, await mcp.open(http, alpha), skill="github", secrets=["GH_TOKEN"], output_files=["out/*"],
            command='echo "got:$GH_TOKEN"; printf %s "$GH_TOKEN" | base64; printf %s "$GH_TOKEN" | od -An -tx1 | '
                    'tr -d " \\n"; echo; echo "cfg=$GH_TOKEN" > $OUTPUT_DIR/cfg.txt')
    assert theirs["isError"] and "team team-b has no secret GH_TOKEN" in their_text and "got:" not in their_text
    assert not ours.get("isError") and ours["structuredContent"]["stdout"].startswith("got:[redacted:GH_TOKEN]\n")
    assert ours["structuredContent"]["stdout"].count("[redacted:GH_TOKEN]") == 3
    assert any(block.get("text") == "cfg=[redacted:GH_TOKEN]\n" for block in ours["content"])
    assert leaked(their_text + our_text + caplog.text) == []


async def test_mcp_an_output_file_cut_at_the_mcp_cap_keeps_no_prefix_of_the_secret(mcp_api):
    services, mcp, url = mcp_api
    alpha = new_team(services, "team-a")
    async with httpx.AsyncClient(timeout=WAIT) as http:
        await http.put(f"{url}/v1/secrets/GH_TOKEN", json={"value": SECRET},
                       headers={"Authorization": f"Bearer {alpha}"})
        result, text = await mcp.skill_run(
            http, alpha, await mcp.open(http, alpha), skill="github", secrets=["GH_TOKEN"], output_files=["out/*"],
            command=f'head -c {MCP_FILE_CAP - 20} /dev/zero | tr "\\0" x > $OUTPUT_DIR/log.txt; '
                    'echo "$GH_TOKEN" >> $OUTPUT_DIR/log.txt')
    assert result["structuredContent"]["output_files"][0]["truncated"]
    assert SECRET[:20] not in text
