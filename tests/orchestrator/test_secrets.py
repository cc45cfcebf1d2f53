"""Team secrets on the embedded default: stored encrypted, given only to runs whose skill declares them, and never
shown back — not to the model, the API, the run's record or its output."""

from __future__ import annotations

import base64
import json
import os
import stat
import urllib.parse
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from orchestrator.api import build_services
from orchestrator.config import Settings
from orchestrator.dispatch import InlineDispatcher
from orchestrator.skills import create_default_skill_repository
from tests.orchestrator.api_helpers import client, make_services, new_team
from tests.orchestrator.test_api_sessions import parse_sse
from worker.errors import SecretError
from worker.secrets import Redactor
from worker.runtimes.local.runtime import LocalWorkspaceRuntime
from worker.secrets.store import FileSecretStore, SecretBox

SECRET = "ghp_Sup3rS3cretT0ken_42xyz"
FORMS = {
    "raw": SECRET,
    "base64": base64.b64encode(SECRET.encode()).decode(),
    "base64, shifted": base64.b64encode(b"k=" + SECRET.encode()).decode()[4:-4],
    "urlsafe base64": base64.urlsafe_b64encode(SECRET.encode()).decode().rstrip("="),
    "hex": SECRET.encode().hex(),
    "HEX": SECRET.encode().hex().upper(),
    "url-encoded": urllib.parse.quote(SECRET, safe=""),
}
LEAK = "; ".join([
    'echo "token: $GH_TOKEN"',
    'echo "err $GH_TOKEN" >&2',
    'printf %s "$GH_TOKEN" | base64',
    'printf %s "k=$GH_TOKEN" | base64',
    'printf %s "$GH_TOKEN" | base64 | tr "+/" "-_" | tr -d =',
    'printf %s "$GH_TOKEN" | od -An -tx1 | tr -d " \\n"; echo',
    'printf %s "$GH_TOKEN" | od -An -tx1 | tr -d " \\n" | tr a-f A-F; echo',
    """python3 -c 'import os, urllib.parse; print(urllib.parse.quote(os.environ["GH_TOKEN"], safe=""))'""",
    'echo "saved $GH_TOKEN" > $OUTPUT_DIR/leak.txt',
    'echo "length ${#GH_TOKEN}"',
])
"""A command that prints its secret in every form the redactor knows, to stderr and to a file too."""


def leaked(text: str) -> list[str]:
    return [name for name, form in FORMS.items() if form in text]


@pytest.fixture
def key() -> str:
    return Fernet.generate_key().decode()


@pytest.fixture
def secret_library(shared_dir: Path) -> Path:
    root = shared_dir / "secret-library"
    for name, declared in (("github", ["GH_TOKEN"]), ("plain", [])):
        folder = root / name
        folder.mkdir(parents=True)
        metadata = f"metadata:\n  secrets: [{', '.join(declared)}]\n" if declared else ""
        (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: The {name} skill.\n{metadata}---\nUse it.\n")
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


@pytest.fixture
async def services(work_root, secret_library, key, model_server):
    store = FileSecretStore(work_root.parent / "secrets", SecretBox(key))
    runtime = LocalWorkspaceRuntime(work_root)
    built = make_services(InlineDispatcher({"local": runtime}, secrets=store), runtime.artifact_store,
                          work_root.parent / "data", model_url=model_server.base_url)
    built.repository = create_default_skill_repository(str(secret_library), use_cached_repository=True)
    yield built
    await built.close()


# --- the store ------------------------------------------------------------------------------------------------------

def test_values_are_stored_encrypted_in_a_private_file_and_listed_by_name_only(tmp_path, key):
    store = FileSecretStore(tmp_path / "secrets", SecretBox(key))
    info = store.set("team-a", "GH_TOKEN", SECRET)
    assert info.name == "GH_TOKEN" and info.created_at == info.updated_at
    file = tmp_path / "secrets" / "team-a" / "GH_TOKEN.json"
    assert SECRET not in file.read_text() and stat.S_IMODE(file.stat().st_mode) == 0o600
    assert stat.S_IMODE(file.parent.stat().st_mode) == 0o700
    assert [s.name for s in store.list("team-a")] == ["GH_TOKEN"]
    assert "value" not in store.list("team-a")[0].model_dump()
    assert store.reveal("team-a", ["GH_TOKEN"]) == {"GH_TOKEN": SECRET}
    assert store.list("team-b") == []
    assert store.remove("team-a", "GH_TOKEN") and not store.remove("team-a", "GH_TOKEN")


@pytest.mark.parametrize(("name", "value", "says"), [
    ("1TOKEN", SECRET, "not a valid environment variable name"),
    ("MY-TOKEN", SECRET, "not a valid environment variable name"),
    ("LD_PRELOAD", SECRET, "changes how programs load"),
    ("WORK_DIR", SECRET, "set by the workspace"),
    ("TOKEN", "short", "at least 8"),
    ("TOKEN", "x" * (64 * 1024 + 1), "at most 65536"),
    ("TOKEN", "abc\0defghij", "NUL"),
])
def test_a_bad_name_or_value_is_refused_and_nothing_is_stored(tmp_path, key, name, value, says):
    store = FileSecretStore(tmp_path / "secrets", SecretBox(key))
    with pytest.raises(SecretError, match=says):
        store.set("team-a", name, value)
    assert store.list("team-a") == []


def test_a_wrong_operator_key_decrypts_nothing_and_says_so(tmp_path, key):
    FileSecretStore(tmp_path / "secrets", SecretBox(key)).set("team-a", "GH_TOKEN", SECRET)
    other = FileSecretStore(tmp_path / "secrets", SecretBox(Fernet.generate_key().decode()))
    with pytest.raises(SecretError, match="SKILLRUN_SECRETS_KEY is not the key it was stored with"):
        other.reveal("team-a", ["GH_TOKEN"])
    rotated = FileSecretStore(tmp_path / "secrets", SecretBox(f"{Fernet.generate_key().decode()},{key}"))
    assert rotated.reveal("team-a", ["GH_TOKEN"]) == {"GH_TOKEN": SECRET}  # the old key after the new one
    with pytest.raises(SecretError, match="Fernet keys"):
        SecretBox("not-a-key")


def test_a_ciphertext_moved_to_another_team_does_not_open_there(tmp_path, key):
    store = FileSecretStore(tmp_path / "secrets", SecretBox(key))
    store.set("team-a", "GH_TOKEN", SECRET)
    store.set("team-b", "GH_TOKEN", "team-b's own value")
    stolen = (tmp_path / "secrets" / "team-a" / "GH_TOKEN.json").read_text()
    (tmp_path / "secrets" / "team-b" / "GH_TOKEN.json").write_text(stolen)
    with pytest.raises(SecretError, match="holds another secret's value"):
        store.reveal("team-b", ["GH_TOKEN"])


def test_without_the_key_nothing_is_stored_and_the_api_refuses_to_start_over_stored_secrets(tmp_path, key):
    keyless = FileSecretStore(tmp_path / "data" / "secrets", None)
    with pytest.raises(SecretError, match="set SKILLRUN_SECRETS_KEY"):
        keyless.set("team-a", "GH_TOKEN", SECRET)
    FileSecretStore(tmp_path / "data" / "secrets", SecretBox(key)).set("team-a", "GH_TOKEN", SECRET)
    with pytest.raises(SecretError, match="SKILLRUN_SECRETS_KEY is not set"):
        build_services(Settings(data_dir=tmp_path / "data", work_root=tmp_path))


def test_the_redactor_takes_out_the_value_and_its_encodings():
    redactor = Redactor({"GH_TOKEN": SECRET})
    for name, form in FORMS.items():
        assert redactor.text(f"a {form} b") == "a [redacted:GH_TOKEN] b", name
    assert redactor.text("nothing secret") == "nothing secret"


# --- through the API ------------------------------------------------------------------------------------------------

async def test_the_routes_store_list_and_remove_and_never_show_a_value(services):
    key = new_team(services, "team-a")
    async with client(services, key) as api:
        stored = await api.put("/v1/secrets/GH_TOKEN", json={"value": SECRET})
        listed = await api.get("/v1/secrets")
        refused = await api.put("/v1/secrets/LD_PRELOAD", json={"value": SECRET})
        short = await api.put("/v1/secrets/SHORT", json={"value": "abc"})
        gone = await api.delete("/v1/secrets/GH_TOKEN")
        again = await api.delete("/v1/secrets/GH_TOKEN")
    assert stored.status_code == 200 and stored.json()["name"] == "GH_TOKEN"
    assert listed.json()["count"] == 1 and leaked(stored.text + listed.text) == []
    assert refused.status_code == 400 and "changes how programs load" in refused.json()["detail"]
    assert short.status_code == 422
    assert gone.status_code == 204 and again.status_code == 404


async def test_a_run_may_name_only_secrets_its_skill_declares_and_its_team_stored(services):
    alpha, beta = new_team(services, "team-a"), new_team(services, "team-b")
    async with client(services, alpha) as api:
        await api.put("/v1/secrets/GH_TOKEN", json={"value": SECRET})
        await api.put("/v1/secrets/OTHER_TOKEN", json={"value": SECRET + "2"})
        undeclared = await api.post("/v1/runs", json={"skill": "plain", "command": "env", "secrets": ["GH_TOKEN"]})
        not_declared_by_it = await api.post("/v1/runs", json={"skill": "github", "command": "env",
                                                              "secrets": ["OTHER_TOKEN"]})
        bad_name = await api.post("/v1/runs", json={"skill": "github", "command": "env", "secrets": ["LD_PRELOAD"]})
    async with client(services, beta) as api:
        others = await api.post("/v1/runs", json={"skill": "github", "command": "env", "secrets": ["GH_TOKEN"]})
        runs = (await api.get("/v1/runs")).json()
    assert undeclared.status_code == 400 and "does not declare the secret GH_TOKEN" in undeclared.json()["detail"]
    assert not_declared_by_it.status_code == 400 and "it declares: GH_TOKEN" in not_declared_by_it.json()["detail"]
    assert bad_name.status_code == 422
    assert others.status_code == 400 and "the team has no secret GH_TOKEN" in others.json()["detail"]
    assert runs["count"] == 0  # nothing queued for a refused run


async def test_a_run_gets_its_secret_and_nothing_it_gives_back_holds_it(services):
    key = new_team(services, "team-a")
    async with client(services, key) as api:
        await api.put("/v1/secrets/GH_TOKEN", json={"value": SECRET})
        submitted = await api.post("/v1/runs", json={
            "skill": "github", "command": LEAK, "secrets": ["GH_TOKEN"], "output_files": ["out/*"],
            "save_as_artifacts": True, "workspace_id": "leaky",
        })
        run_id = submitted.json()["id"]
        record = await api.get(f"/v1/runs/{run_id}", params={"wait": 60})
        events = await api.get(f"/v1/runs/{run_id}/events")
        artifact = await api.get(f"/v1/runs/{run_id}/artifacts/out/leak.txt")
    result = record.json()["result"]
    assert f"length {len(SECRET)}" in result["stdout"]  # the command had the value
    assert result["stdout"].startswith("token: [redacted:GH_TOKEN]\n")
    # each form it printed (raw, base64 at two alignments, URL-safe base64, hex, HEX, percent-encoded) was caught
    assert result["stdout"].count("[redacted:GH_TOKEN]") == 7, result["stdout"]
    assert "err [redacted:GH_TOKEN]" in result["stderr"]
    assert result["output_files"][0]["content"] == "saved [redacted:GH_TOKEN]\n"
    assert artifact.status_code == 200 and artifact.text == "saved [redacted:GH_TOKEN]\n"
    assert leaked(record.text + events.text + artifact.text) == []
    stored_record = (await services.dispatcher.get(run_id)).model_dump_json()
    assert leaked(stored_record) == [] and (await services.dispatcher.get(run_id)).request.secrets == ["GH_TOKEN"]


async def test_the_model_never_receives_the_secret_in_any_form(services, model_server):
    model_server.add(
        {"tool_calls": [{"name": "skill_run", "arguments": {
            "skill": "github", "command": LEAK, "secrets": ["GH_TOKEN"], "output_files": ["out/leak.txt"]}}]},
        {"text": "All done."},
    )
    key = new_team(services, "team-a")
    async with client(services, key) as api:
        await api.put("/v1/secrets/GH_TOKEN", json={"value": SECRET})
        await api.post("/v1/sessions", json={"session_id": "s1"})
        streamed = await api.post("/v1/sessions/s1/messages", json={"text": "leak it"})
        session = await api.get("/v1/sessions/s1")
    result = next(data for kind, data in parse_sse(streamed.text) if kind == "tool_result")["response"]
    assert f"length {len(SECRET)}" in result["stdout"] and "[redacted:GH_TOKEN]" in result["stdout"]
    assert len(model_server.requests) == 2
    assert leaked(json.dumps(model_server.requests)) == []
    assert leaked(streamed.text + session.text) == []
    assert os.environ.get("GH_TOKEN") is None


async def test_a_later_run_not_given_the_secret_cannot_show_what_an_earlier_one_left_in_the_workspace(services):
    key = new_team(services, "team-a")
    async with client(services, key) as api:
        await api.put("/v1/secrets/GH_TOKEN", json={"value": SECRET})
        first = await api.post("/v1/runs", json={"skill": "github", "command": 'echo "$GH_TOKEN" > $WORK_DIR/kept',
                                                 "secrets": ["GH_TOKEN"], "workspace_id": "shared"})
        await api.get(f"/v1/runs/{first.json()['id']}", params={"wait": 60})
        second = await api.post("/v1/runs", json={"skill": "plain", "workspace_id": "shared",
                                                  "command": "cat $WORK_DIR/kept; echo ${GH_TOKEN:-unset}"})
        record = await api.get(f"/v1/runs/{second.json()['id']}", params={"wait": 60})
    assert record.json()["result"]["stdout"] == "[redacted:GH_TOKEN]\nunset\n"


def test_a_teams_secrets_in_the_earlier_one_file_layout_are_moved_and_kept(tmp_path, key):
    """Secrets stored before the record store (``<dir>/<team>.json``, all of a team's in one file) are moved to one
    document each when the team is next read, none lost, and a value set since is not overwritten."""
    folder = tmp_path / "secrets"
    store = FileSecretStore(folder, SecretBox(key))
    store.set("team-a", "GH_TOKEN", SECRET)
    store.set("team-a", "NPM_TOKEN", "npm-token-value")
    earlier = {path.stem: json.loads(path.read_text()) for path in (folder / "team-a").glob("*.json")}
    for path in (folder / "team-a").glob("*.json"):
        path.unlink()
    (folder / "team-a").rmdir()
    (folder / "team-a.json").write_text(json.dumps(earlier))
    moved = FileSecretStore(folder, SecretBox(key))
    assert moved.any_stored()
    assert moved.reveal("team-a", ["GH_TOKEN", "NPM_TOKEN"]) == {"GH_TOKEN": SECRET, "NPM_TOKEN": "npm-token-value"}
    assert not (folder / "team-a.json").exists()
    assert sorted(p.name for p in (folder / "team-a").iterdir()) == ["GH_TOKEN.json", "NPM_TOKEN.json"]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in (folder / "team-a").iterdir())


def test_an_unreadable_secret_says_where_it_lies_and_what_to_do(tmp_path, key):
    store = FileSecretStore(tmp_path / "secrets", SecretBox(key))
    store.set("team-a", "GH_TOKEN", SECRET)
    (tmp_path / "secrets" / "team-a" / "GH_TOKEN.json").write_text("{not json")
    with pytest.raises(SecretError, match=r"team-a/GH_TOKEN\.json cannot be read .*restore it from a backup"):
        store.list("team-a")
