"""Teams' egress allow-lists: checked when set (a bad entry stores nothing), managed with ``skillrun egress``, shown
to a team by ``GET /v1/egress``, and given to a run as the entries both its skill declares and its team allows —
never by the caller. A run through the API (local runtime, as root) then reaches its host and nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.assistant import create_assistant
from orchestrator.config import Settings
from orchestrator.dispatch import InlineDispatcher
from orchestrator.documents import FileDocuments
from orchestrator.egress import EgressListError, EgressStore
from orchestrator.errors import SkillValidationError
from orchestrator.skills import create_default_skill_repository
from orchestrator.teams import TeamStore
from tests.egress_hosts import ALLOWED, allowed_server  # noqa: F401 - the allowed host's server
from tests.orchestrator.api_helpers import client, make_services, new_team
from tests.orchestrator.test_api_sessions import parse_sse
from worker.egress import effective
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

BAD_ENTRIES = {
    "10.0.0.0/8": "is an address range",
    "192.168.1.10": "is an IP address",
    "[::1]:443": "is an IP address",
    "2130706433.example.com.1": "ends in a number",
    "*": "is a wildcard for everything",
    "*.*": "is a wildcard for everything",
    "*.com": "allows a whole top-level domain",
    "*.co.uk": "allows every site under the public suffix 'co.uk'",
    "*.github.io": "allows every site under the public suffix 'github.io'",
    "*.s3.amazonaws.com:443": "allows every site under the public suffix 's3.amazonaws.com'",
    "*.XN--P1AI.": "allows a whole top-level domain",
    "*.com.au": "allows every site under the public suffix 'com.au'",
    "api.*.example.com": "is a wildcard for everything",
    "localhost": "is a private or local name",
    "metadata.google.internal": "is a private or local name",
    "printer.local:631": "is a private or local name",
    "intranet": "is a private or local name",
    "api.example.com:0": "has a bad port",
    "api.example.com:70000": "has a bad port",
    "api.example.com:https": "has a bad port",
    "user@api.example.com": "is not a host name",
}


@pytest.fixture
def store(tmp_path) -> EgressStore:
    return EgressStore(FileDocuments(tmp_path / "registry"))


# --- the store and the entries --------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry", sorted(BAD_ENTRIES))
def test_a_bad_entry_is_refused_with_the_reason_and_nothing_is_stored(store, entry):
    store.set("team-a", ["api.github.com"])
    with pytest.raises(EgressListError, match=f"{BAD_ENTRIES[entry]}.*; nothing was changed"):
        store.set("team-a", ["pypi.org", entry])
    assert store.get("team-a").entries == ["api.github.com:443"]  # the list as it was


def test_a_wildcard_under_a_registered_domain_of_a_public_suffix_is_kept(store):
    listed = store.set("team-a", ["*.example.co.uk", "*.skillrun.github.io", "bucket.s3.amazonaws.com", "github.io"])
    assert listed.entries == ["*.example.co.uk:443", "*.skillrun.github.io:443", "bucket.s3.amazonaws.com:443",
                              "github.io:443"]


def test_entries_are_normalised_and_shown_back_and_cleared(store):
    listed = store.set("team-a", ["API.GitHub.com.", "*.example.org:8443", "api.github.com:443"])
    assert listed.entries == ["*.example.org:8443", "api.github.com:443"]
    assert store.get("team-a").entries == listed.entries and store.get("team-b").entries == []
    assert store.clear("team-a").entries == [] and store.get("team-a").entries == []
    with pytest.raises(EgressListError, match="name at least one entry"):
        store.set("team-a", [])
    with pytest.raises(EgressListError, match="team name"):
        store.get("../etc")


def test_a_run_gets_what_both_its_skill_declares_and_its_team_allows():
    team = ["*.example.com", "api.github.com", "pypi.org:8443"]
    assert effective(["api.example.com", "*.github.com", "pypi.org", "other.org"], team) == [
        "api.example.com:443", "api.github.com:443"]
    assert effective([], team) == []  # a skill that declares nothing gets nothing
    assert effective(["api.example.com"], []) == []  # a team with no list allows nothing


def test_a_skill_declaring_a_bad_egress_entry_is_a_validation_error(tmp_path):
    folder = tmp_path / "lib" / "wide"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: wide\ndescription: Too wide.\nmetadata:\n  egress: ['*']\n---\nx\n")
    repository = create_default_skill_repository(str(tmp_path / "lib"))
    with pytest.raises(SkillValidationError, match="metadata.egress.*wildcard for everything"):
        repository.get("wide")


# --- the CLI --------------------------------------------------------------------------------------------------------

def _cli(data_dir, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLRUN_")}
    env["SKILLRUN_DATA_DIR"] = str(data_dir)
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "egress", *args], capture_output=True,
                          text=True, env=env, timeout=60)


def test_the_cli_sets_shows_and_clears_a_team_list_and_refuses_bad_input(tmp_path):
    data = tmp_path / "data"
    TeamStore(FileDocuments(data / "registry")).create_team("team-a")
    stored = _cli(data, "set", "team-a", "api.github.com", "*.example.org:8443")
    assert stored.returncode == 0, stored.stderr
    assert stored.stdout.split()[:2] == ["ENTRY", "SET"] and "*.example.org:8443" in stored.stdout
    shown = json.loads(_cli(data, "show", "team-a", "--json").stdout)
    assert shown["team"] == "team-a" and shown["entries"] == ["*.example.org:8443", "api.github.com:443"]
    refused = _cli(data, "set", "team-a", "api.github.com", "169.254.169.254")
    assert refused.returncode == 2
    assert "egress entry '169.254.169.254' is an IP address" in refused.stderr and "nothing was changed" in refused.stderr
    assert json.loads(_cli(data, "show", "team-a", "--json").stdout)["entries"] == shown["entries"]
    unknown = _cli(data, "show", "team-z")
    assert unknown.returncode == 2 and "no team 'team-z'" in unknown.stderr
    cleared = _cli(data, "clear", "team-a")
    assert cleared.returncode == 0 and "allows no egress" in cleared.stdout
    assert "allows no egress" in _cli(data, "show", "team-a").stdout


# --- the API --------------------------------------------------------------------------------------------------------

@pytest.fixture
async def services(work_root, allowed_server, model_server):
    library = work_root.parent / "egress-library"
    for name, declared in (("fetcher", f"['{ALLOWED}:{allowed_server}', 'api.elsewhere.org']"), ("offline", "[]")):
        (library / name).mkdir(parents=True)
        (library / name / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: The {name} skill.\nmetadata:\n  egress: {declared}\n---\nx\n")
    for path in [library, *library.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    runtime = LocalWorkspaceRuntime(work_root)
    built = make_services(InlineDispatcher({"local": runtime}), runtime.artifact_store, work_root.parent / "data",
                          model_url=model_server.base_url)
    built.repository = create_default_skill_repository(str(library), use_cached_repository=True)
    settings = Settings(model="m", openai_api_key="k", openai_base_url=model_server.base_url)
    built.agent_factory = lambda repo: create_assistant(  # as build_services makes it
        settings, repo, built.dispatcher, egress=lambda team: EgressStore(built.teams.docs).get(team).entries)
    yield built
    await built.close()


FETCH = ("python3 -c \"import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read()"
         ".decode())\" http://{host}:{port}/x; curl -sS -o /dev/null -w '%{{http_connect}}\\n' "
         "https://api.elsewhere.org/ || true")


async def test_a_team_sees_its_own_list_and_cannot_set_one_for_a_run(services):
    alpha, beta = new_team(services, "team-a"), new_team(services, "team-b")
    EgressStore(services.teams.docs).set("team-a", ["api.github.com"])
    async with client(services, alpha) as api:
        own = await api.get("/v1/egress")
        forged = await api.post("/v1/runs", json={"skill": "offline", "command": "true", "egress": ["evil.example"]})
        runs = (await api.get("/v1/runs")).json()
    async with client(services, beta) as api:
        other = await api.get("/v1/egress")
    async with client(services, None) as api:
        anonymous = await api.get("/v1/egress")
    assert own.status_code == 200 and own.json()["entries"] == ["api.github.com:443"]
    assert other.json() == {"team": "team-b", "entries": [], "updated_at": None}
    assert anonymous.status_code == 401
    assert forged.status_code == 422 and runs["count"] == 0  # egress is the control plane's, not the caller's


@pytest.mark.root
async def test_an_api_run_reaches_the_host_its_skill_and_team_both_allow_and_the_refusals_are_listed(
    services, allowed_server
):
    key = new_team(services, "team-a")
    EgressStore(services.teams.docs).set("team-a", [f"*.allowed-egress.net:{allowed_server}"])
    async with client(services, key) as api:
        submitted = await api.post("/v1/runs", json={
            "skill": "fetcher", "command": FETCH.format(host=ALLOWED, port=allowed_server)})
        record = (await api.get(f"/v1/runs/{submitted.json()['id']}", params={"wait": 60})).json()
        offline = await api.post("/v1/runs", json={
            "skill": "offline", "command": FETCH.format(host=ALLOWED, port=allowed_server)})
        offline_record = (await api.get(f"/v1/runs/{offline.json()['id']}", params={"wait": 60})).json()
    result = record["result"]
    assert submitted.status_code == 202 and record["status"] == "finished", record
    assert result["stdout"].splitlines() == ["reached /x", "403"]  # api.elsewhere.org: declared, not the team's
    assert result["egress_refused"] == 1
    assert result["egress_refusals"] == [{"destination": "api.elsewhere.org:443",
                                          "reason": "api.elsewhere.org:443 is not on the allow-list"}]
    assert "reached" not in offline_record["result"]["stdout"]  # a skill declaring nothing has no network
    assert offline_record["result"]["egress_refused"] == 0


@pytest.mark.root
async def test_an_agent_sessions_skill_run_gets_the_same_allow_list(services, model_server, allowed_server):
    model_server.add(
        {"tool_calls": [{"name": "skill_run", "arguments": {
            "skill": "fetcher", "command": FETCH.format(host=ALLOWED, port=allowed_server)}}]},
        {"tool_calls": [{"name": "skill_run", "arguments": {
            "skill": "offline", "command": FETCH.format(host=ALLOWED, port=allowed_server)}}]},
        {"text": "Done."},
    )
    key = new_team(services, "team-a")
    EgressStore(services.teams.docs).set("team-a", [f"{ALLOWED}:{allowed_server}"])
    async with client(services, key) as api:
        await api.post("/v1/sessions", json={"session_id": "s1"})
        streamed = await api.post("/v1/sessions/s1/messages", json={"text": "fetch it"})
    fetched, offline = [data["response"] for kind, data in parse_sse(streamed.text) if kind == "tool_result"]
    assert fetched["stdout"].splitlines() == ["reached /x", "403"], fetched
    assert fetched["egress_refused"] == 1 and fetched["egress_refusals"] == [
        {"destination": "api.elsewhere.org:443", "reason": "api.elsewhere.org:443 is not on the allow-list"}]
    assert "reached" not in offline["stdout"]  # a skill declaring nothing has no network


async def test_a_list_stored_before_a_rule_refused_its_entry_fails_the_run_clearly_and_keeps_the_list(services,
                                                                                                      model_server):
    """A team's list kept from before wildcards on public suffixes were refused: a run of a skill that declares
    egress is refused saying which entry and what to do (through the API and an agent's ``skill_run``), not a
    server error; the list is left as it was."""
    model_server.add({"tool_calls": [{"name": "skill_run", "arguments": {"skill": "fetcher", "command": "true"}}]},
                     {"text": "Done."})
    key = new_team(services, "team-a")
    services.teams.docs.put("egress", "team-a", {"team": "team-a", "entries": ["*.github.io:443"], "updated_at": 1.0})
    async with client(services, key) as api:
        submitted = await api.post("/v1/runs", json={"skill": "fetcher", "command": "true"})
        offline = await api.post("/v1/runs", json={"skill": "offline", "command": "true"})
        await api.post("/v1/sessions", json={"session_id": "s1"})
        streamed = await api.post("/v1/sessions/s1/messages", json={"text": "run it"})
    [answer] = [data["response"] for kind, data in parse_sse(streamed.text) if kind == "tool_result"]
    assert "public suffix" in answer["error"] and "skillrun egress set TEAM" in answer["error"], answer
    assert submitted.status_code == 400, submitted.text
    assert "*.github.io:443" in submitted.text and "public suffix" in submitted.text, submitted.text
    assert "skillrun egress set TEAM" in submitted.text
    assert offline.status_code == 202  # a skill declaring nothing is not given the list, nor refused for it
    assert EgressStore(services.teams.docs).get("team-a").entries == ["*.github.io:443"]
