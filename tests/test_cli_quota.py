"""``skillrun teams set-quota`` and ``skillrun teams quota``, run as real processes against a real Redis: bad values
exit 2 with a clear message and store nothing; ``default`` gives a field back to the operator's default; table and
JSON output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cli(redis_url, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKILLRUN_", "OPENAI_"))}
    env.update({"SKILLRUN_DATA_DIR": str(tmp_path / "data"), "SKILLRUN_REDIS_URL": redis_url,
                "SKILLRUN_TEAM_MAX_QUEUED": "500", "SKILLRUN_TEAM_MAX_RUNNING": "4"})

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                              env=env, timeout=60, cwd=REPO)

    assert run("teams", "create", "team-a").returncode == 0
    return run


def shown(cli, team: str = "team-a") -> dict:
    answer = cli("teams", "quota", team, "--json")
    assert answer.returncode == 0, answer.stderr
    return json.loads(answer.stdout)


def test_set_quota_stores_fields_shows_them_and_default_gives_one_back(cli):
    before = shown(cli)
    assert before["own"] == {}
    assert before["quota"]["max_queued"] == 500 and before["quota"]["max_running"] == 4  # the operator's defaults
    assert before["quota"]["max_timeout_seconds"] is None

    answer = cli("teams", "set-quota", "team-a", "--max-running", "2", "--max-timeout-seconds", "90.5",
                 "--max-memory-bytes", str(256 * 1024**2), "--max-queued", "0")
    assert answer.returncode == 0, answer.stderr
    rows = {line.split()[0]: line.split()[1:] for line in answer.stdout.splitlines()[1:]}
    assert answer.stdout.splitlines()[0].split() == ["FIELD", "VALUE", "FROM"]
    assert rows["max_running"] == ["2", "team"] and rows["max_timeout_seconds"] == ["90.5", "team"]
    assert rows["max_memory_bytes"] == [str(256 * 1024**2), "team"]  # in full, not 2.68435e+08
    assert rows["max_queued"] == ["0", "team"]  # 0: no limit, set by the team's own quota
    assert rows["max_cpu_seconds"] == ["-", "default"] and rows["max_workspaces"][1] == "default"
    data = shown(cli)
    assert data["own"] == {"max_running": 2, "max_timeout_seconds": 90.5, "max_memory_bytes": 256 * 1024**2,
                           "max_queued": 0}
    assert data["quota"]["max_running"] == 2 and data["quota"]["max_cpu_seconds"] is None

    assert cli("teams", "set-quota", "team-a", "--max-running", "default").returncode == 0
    data = shown(cli)
    assert "max_running" not in data["own"] and data["quota"]["max_running"] == 4  # back to the default
    assert data["own"]["max_timeout_seconds"] == 90.5  # the other fields stay
    table = cli("teams", "quota", "team-a")
    assert table.returncode == 0
    assert {line.split()[0]: line.split()[1:] for line in table.stdout.splitlines()[1:]}["max_running"] == [
        "4", "default"]


BAD = [
    (("--max-running", "-1"), "max_running"),
    (("--max-queued=-5",), "max_queued"),
    (("--max-timeout-seconds", "nan"), "max_timeout_seconds"),
    (("--max-timeout-seconds", "inf"), "max_timeout_seconds"),
    (("--max-timeout-seconds=-inf",), "max_timeout_seconds"),
    (("--max-timeout-seconds", "1e400"), "max_timeout_seconds"),
    (("--max-timeout-seconds", "0"), "max_timeout_seconds"),
    (("--max-running", "nan"), "max_running"),
    (("--max-running", "inf"), "max_running"),
    (("--max-running", "many"), "max_running"),
    (("--max-running", "1.5"), "max_running"),
    (("--max-memory-bytes", "0"), "max_memory_bytes"),
    (("--max-cpu-seconds", "99999999999"), "max_cpu_seconds"),
    (("--max-output-bytes", ""), "max_output_bytes"),
    (("--max-workspaces", "0"), "max_workspaces"),
    (("--max-running", "2", "--max-disk-bytes", "-1"), "max_disk_bytes"),  # one bad field: none stored
    ((), "nothing to change"),
]


def test_set_quota_with_a_bad_value_exits_2_naming_it_and_stores_nothing(cli, redis_url):
    assert cli("teams", "set-quota", "team-a", "--max-queued", "7").returncode == 0
    before = shown(cli)
    connection = redis.Redis.from_url(redis_url)
    stored = connection.hgetall("skillrun:doc:quotas")
    for args, says in BAD:
        answer = cli("teams", "set-quota", "team-a", *args)
        assert answer.returncode == 2, (args, answer.stdout + answer.stderr)
        said = answer.stderr.strip().splitlines()[-1]
        assert said.startswith("skillrun: error:") and says in said and "Traceback" not in answer.stderr, (args, said)
        assert connection.hgetall("skillrun:doc:quotas") == stored, args
    connection.close()
    assert shown(cli) == before


def test_set_quota_of_an_unknown_team_exits_2_and_stores_nothing(cli, redis_url):
    connection = redis.Redis.from_url(redis_url)
    keys_before = sorted(connection.keys("*"))
    for args in (("teams", "set-quota", "team-x", "--max-running", "1"), ("teams", "quota", "team-x"),
                 ("teams", "quota", "team-x", "--json")):
        answer = cli(*args)
        assert answer.returncode == 2 and "no team 'team-x'" in answer.stderr, answer.stderr
    assert sorted(connection.keys("*")) == keys_before
    connection.close()
