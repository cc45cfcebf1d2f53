"""The skillrun command line, run as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import workspace_dirs, write_skill
from tests.model_server import ScriptedModelServer


@pytest.fixture
def cli(library, work_root):
    def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        # The host's own model and skillrun settings must not reach the command under test.
        full_env = {k: v for k, v in os.environ.items()
                    if k not in {"SKILLS_ROOT", "SKILLS_CACHE_DIR"} and not k.startswith(("SKILLRUN_", "OPENAI_"))}
        full_env.update(env or {})
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", *args],
            capture_output=True, text=True, env=full_env, timeout=60, cwd=str(work_root),
        )

    return run


def test_skills_list_prints_a_table_and_json(cli, library):
    table = cli("skills", "list", "--skills-root", str(library))
    assert table.returncode == 0
    assert table.stdout.splitlines()[0].split() == ["NAME", "DESCRIPTION"]
    assert "demo" in table.stdout and "The demo skill." in table.stdout
    data = json.loads(cli("skills", "list", "--skills-root", str(library), "--json").stdout)
    assert data == {"skills": [{"name": "demo", "description": "The demo skill."}], "problems": []}


def test_skills_list_reads_skills_root_from_the_environment(cli, library):
    result = cli("skills", "list", "--json", env={"SKILLS_ROOT": str(library)})
    assert [s["name"] for s in json.loads(result.stdout)["skills"]] == ["demo"]


def test_skills_list_reports_broken_skills_on_stderr(cli, library):
    (library / "broken").mkdir()
    (library / "broken" / "SKILL.md").write_text("---\ndescription: no name\n---\n")
    result = cli("skills", "list", "--skills-root", str(library))
    assert result.returncode == 0
    assert "demo" in result.stdout
    assert "broken/SKILL.md: name: is required" in result.stderr


def test_skills_show_prints_body_docs_and_tools(cli, library):
    write_skill(library, "weather", body="Tools:\n- get_weather\n\nOverview text.\n", files={"API.md": "x"})
    data = json.loads(cli("skills", "show", "weather", "--skills-root", str(library), "--json").stdout)
    assert data["tools"] == ["get_weather"]
    assert [d["name"] for d in data["docs"]] == ["API.md"]
    assert "Overview text." in data["body"]
    human = cli("skills", "show", "weather", "--skills-root", str(library))
    assert "get_weather" in human.stdout and "Overview text." in human.stdout


def test_unknown_skill_exits_2_and_lists_the_known_ones(cli, library):
    result = cli("skills", "show", "nope", "--skills-root", str(library))
    assert result.returncode == 2
    assert "unknown skill 'nope' (available: demo)" in result.stderr


def test_missing_skills_root_exits_2_with_the_path(cli, tmp_path):
    result = cli("skills", "list", "--skills-root", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert "nowhere" in result.stderr and "does not exist" in result.stderr


def test_run_prints_output_and_a_table_of_files_and_exits_with_the_command_status(cli, library, work_root):
    result = cli(
        "run", "demo", "bash scripts/hello.sh; echo data > out/r.txt; exit 7", "-o", "out/*.txt",
        "--skills-root", str(library), "--work-root", str(work_root),
    )
    assert result.returncode == 7
    assert result.stdout == "hello from demo\n"
    assert "out/r.txt" in result.stderr and "text/plain" in result.stderr and "5 B" in result.stderr


def test_run_json_prints_the_run_result(cli, library, work_root):
    result = cli(
        "run", "demo", "echo $GREETING", "--env", "GREETING=hi", "--json",
        "--skills-root", str(library), "--work-root", str(work_root),
    )
    data = json.loads(result.stdout)
    assert data["stdout"] == "hi\n"
    assert data["exit_code"] == 0
    assert set(data["timings"]) == {"queue_ms", "stage_ms", "exec_ms", "collect_ms", "redact_ms", "total_ms", "exec_via"}


def test_run_timeout_exits_124(cli, library, work_root):
    result = cli("run", "demo", "sleep 30", "--timeout", "0.3", "--skills-root", str(library), "--work-root", str(work_root))
    assert result.returncode == 124
    assert "timed out" in result.stderr


def test_run_input_and_workspace_reuse(cli, library, work_root, shared_dir):
    notes = shared_dir / "notes.txt"
    notes.write_text("hello notes\n")
    notes.chmod(0o644)
    common = ["--skills-root", str(library), "--work-root", str(work_root), "--workspace", "w1"]
    first = cli("run", "demo", "cp inputs/n.txt out/copy.txt", "--input", f"{notes}=n.txt", *common)
    assert first.returncode == 0, first.stderr
    second = cli("run", "demo", "cat out/copy.txt", *common)
    assert second.stdout == "hello notes\n"
    assert len(workspace_dirs(work_root)) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "NOEQUALS"], "expected KEY=VALUE"),
        (["--env", "LD_PRELOAD=/x.so"], "LD_PRELOAD may not be set"),
        (["--timeout", "-1"], "timeout"),
        (["--input", "/definitely/missing"], "is not a file"),
        (["-o", "/etc/*"], "outside the workspace"),
    ],
)
def test_run_bad_input_exits_2_and_creates_no_workspace(cli, library, work_root, args, message):
    result = cli("run", "demo", "true", *args, "--skills-root", str(library), "--work-root", str(work_root))
    assert result.returncode == 2
    assert message in result.stderr
    assert workspace_dirs(work_root) == []


def test_chat_streams_the_answer_and_tool_calls_and_continues_a_session(cli, work_root, shared_dir):
    server = ScriptedModelServer().start()
    try:
        server.add(
            {"tool_calls": [{"name": "skill_list", "arguments": {}}]},
            {"text": "You have the demo skill."},
            {"text": "Still here."},
        )
        env = {
            "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "k", "SKILLRUN_MODEL": "m",
            "SKILLRUN_DATA_DIR": str(shared_dir / "data"), "SKILLS_ROOT": str(work_root.parent / "library"),
            "SKILLRUN_WORK_ROOT": str(work_root),
        }
        first = cli("chat", "what skills?", "--session", "c1", env=env)
        assert first.returncode == 0, first.stderr
        assert "→ skill_list({})" in first.stdout
        assert '← skill_list: {"result": ["demo"]}' in first.stdout
        assert "You have the demo skill." in first.stdout
        assert "--session c1" in first.stderr
        second = cli("chat", "again", "--session", "c1", env=env)
        assert "Still here." in second.stdout
        history = [m["role"] for m in server.requests[-1]["messages"]]
        assert history == ["system", "user", "assistant", "tool", "assistant", "user"]
    finally:
        server.stop()


def test_chat_without_a_model_configured_says_what_to_set(cli):
    result = cli("chat", "hi", env={"OPENAI_API_KEY": "", "OPENAI_BASE_URL": ""})
    assert result.returncode == 2
    assert "set OPENAI_API_KEY" in result.stderr


def test_chat_reads_the_model_from_a_dot_env_file(cli, work_root, shared_dir):
    server = ScriptedModelServer().start()
    try:
        server.add({"text": "configured by .env"})
        (work_root / ".env").write_text(
            f"OPENAI_BASE_URL={server.base_url}\nOPENAI_API_KEY=from-dotenv\nSKILLRUN_MODEL=dotenv-model\n"
            f"SKILLRUN_DATA_DIR={shared_dir / 'data'}\nSKILLS_ROOT={work_root.parent / 'library'}\n"
        )
        result = cli("chat", "hello")
        assert result.returncode == 0, result.stderr
        assert "configured by .env" in result.stdout
        assert server.requests[0]["model"] == "dotenv-model"
    finally:
        server.stop()
