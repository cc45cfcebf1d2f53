"""``skillrun workspaces list|rm`` as a real process, against the real API on loopback (embedded default)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import workspace_dirs
from tests.orchestrator.api_helpers import api_in_a_thread, new_team
from tests.services import free_port


@pytest.fixture
def api(services):
    keys = {team: new_team(services, team) for team in ("team-a", "team-b")}
    with api_in_a_thread(services) as url:
        yield url, keys


def cli(*args: str, url: str, key: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLRUN_")}
    env["SKILLRUN_API_URL"] = url
    if key is not None:
        env["SKILLRUN_API_KEY"] = key
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "workspaces", *args], capture_output=True,
                          text=True, env=env, timeout=60)


def run(url: str, key: str, workspace_id: str, command: str = "true", wait: bool = True) -> str:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        body = {"skill": "python-math", "command": command, "workspace_id": workspace_id, "timeout": 60}
        run_id = client.post("/v1/runs", json=body).json()["id"]
        if wait:
            assert client.get(f"/v1/runs/{run_id}", params={"wait": 30}).json()["status"] == "finished"
        else:
            while client.get(f"/v1/runs/{run_id}").json()["status"] != "started":
                time.sleep(0.02)
        return run_id


def test_a_team_lists_and_removes_its_workspaces(api, work_root):
    url, keys = api
    run(url, keys["team-a"], "w1")
    run(url, keys["team-b"], "w1")
    listing = cli("list", url=url, key=keys["team-a"])
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].split()[:3] == ["WORKSPACE", "RUNTIME", "STATE"]
    assert [line.split()[:3] for line in lines[1:]] == [["team-a.w1", "local", "kept"]]
    data = json.loads(cli("list", "--json", url=url, key=keys["team-a"]).stdout)
    assert [(w["id"], w["runtime"], w["runs"]) for w in data] == [("team-a.w1", "local", [])]

    foreign = cli("rm", "team-b.w1", url=url, key=keys["team-a"])
    assert foreign.returncode == 2
    assert "no workspace 'team-b.w1'" in foreign.stderr and "skillrun workspaces list" in foreign.stderr
    removed = cli("rm", "team-a.w1", url=url, key=keys["team-a"])
    assert removed.returncode == 0 and removed.stdout.strip() == "removed workspace team-a.w1"
    assert "no kept workspaces" in cli("list", url=url, key=keys["team-a"]).stdout
    assert [p.name.split("_")[1] for p in workspace_dirs(work_root)] == ["team-b.w1"]
    assert json.loads(cli("list", "--json", url=url, key=keys["team-b"]).stdout)[0]["id"] == "team-b.w1"


def test_a_workspace_in_use_is_not_removed_and_says_why(api, services):
    url, keys = api
    run_id = run(url, keys["team-a"], "busy", "sleep 60", wait=False)
    refused = cli("rm", "team-a.busy", "--json", url=url, key=keys["team-a"])
    assert refused.returncode == 2 and run_id in refused.stderr and "cancel" in refused.stderr
    assert json.loads(cli("list", "--json", url=url, key=keys["team-a"]).stdout)[0]["runs"] == [run_id]
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['team-a']}"}) as client:
        client.post(f"/v1/runs/{run_id}/cancel")
        assert client.get(f"/v1/runs/{run_id}", params={"wait": 30}).json()["status"] == "cancelled"
    removed = cli("rm", "team-a.busy", "--json", url=url, key=keys["team-a"])
    assert removed.returncode == 0 and json.loads(removed.stdout) == {"id": "team-a.busy", "state": "removed"}


def test_errors_say_what_to_do_next(api):
    url, keys = api
    no_key = cli("list", url=url, key=None)
    assert no_key.returncode == 2 and "SKILLRUN_API_KEY" in no_key.stderr and "skillrun keys create" in no_key.stderr
    wrong_key = cli("list", url=url, key="sr_000000000000_" + "x" * 30)
    assert wrong_key.returncode == 2 and "refused the key" in wrong_key.stderr
    nowhere = cli("list", url=f"http://127.0.0.1:{free_port()}", key=keys["team-a"])
    assert nowhere.returncode == 2 and "cannot be reached" in nowhere.stderr and "skillrun serve" in nowhere.stderr
    bad_id = cli("rm", "-x", "--api", url, url=url, key=keys["team-a"])
    assert bad_id.returncode == 2  # argparse: not an id
    invalid = cli("rm", "a;b", url=url, key=keys["team-a"])
    assert invalid.returncode == 2 and "workspace_id" in invalid.stderr
