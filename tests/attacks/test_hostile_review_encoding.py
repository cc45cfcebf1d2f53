"""Review of issue 30's "every string that reaches a store is checked for encodability" (orchestrator.text): the
edges where requests arrive are checked, but a *run* makes text too. A file name on Linux is bytes; Python reads one
that is not UTF-8 with ``surrogateescape`` (``b'\\xff'`` becomes ``'\\udcff'``), which no store and no JSON answer
can hold, so output collection (``worker.collect``) names such a file with the byte escaped (``out/\\xff.txt``), and
the worker fails a run whose result still holds text no store can keep (with why) instead of leaving it started.
Contained edges (a URL's path and query, headers, stdout bytes) are plain tests.
"""

from __future__ import annotations

import json
import urllib.parse

import pytest
import redis

from orchestrator.skills import create_default_skill_repository
from tests.attacks.test_secret_attacks import (  # noqa: F401 - the fixtures
    WAIT,
    key,
    raw_client,
    secret_library,
    services,
    store,
)
from tests.integration.conftest import worker_env  # noqa: F401 - the queue's worker settings
from tests.orchestrator.api_helpers import new_team
from tests.orchestrator.conftest import model_server  # noqa: F401 - the scripted model
from worker.jobs import execute as jobs
from worker.collect import collect_outputs
from worker.contract import OutputFile, RunLimits, RunRequest, RunResult
from worker.run_store import RedisRunStore, RunStatus


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def test_collected_names_are_text_every_store_can_keep(tmp_path):
    workspace = tmp_path / "ws"
    (workspace / "out").mkdir(parents=True)
    (workspace / "skill").mkdir()
    (workspace / "out" / b"\xff.txt".decode("utf-8", "surrogateescape")).write_text("x")
    (workspace / "out" / b"\xfdl".decode("utf-8", "surrogateescape")).symlink_to("/etc")
    collected = collect_outputs([f"{workspace}/out/*"], workspace_root=workspace, skill_dir=workspace / "skill",
                                limits=RunLimits())
    names = [f.name for f in collected.files] + [s.name for s in collected.skipped]
    assert names and all(_encodable(name) for name in names), [ascii(name) for name in names]
    assert names == ["out/\\xff.txt", "out/\\xfdl"]  # the bytes written as Python writes them
    RunResult(run_id="r", workspace_id="w", runtime="local", exit_code=0, output_files=collected.files,
              skipped_files=collected.skipped).model_dump_json()


async def test_a_run_whose_output_file_name_is_not_utf8_is_served_and_the_runs_list_too(services):  # noqa: F811
    async with raw_client(services, new_team(services, "team-a")) as api:
        submitted = await api.post("/v1/runs", json={"skill": "plain", "command": "printf x > \"out/$(printf '\\377').txt\"",
                                                     "output_files": ["out/*"]})
        assert submitted.status_code == 202, submitted.text
        answer = await api.get(f"/v1/runs/{submitted.json()['id']}", params={"wait": WAIT})
        listed = await api.get("/v1/runs")
        assert (answer.status_code, listed.status_code) == (200, 200), (answer.text[:100], listed.text[:100])
        (output,) = answer.json()["result"]["output_files"]
        fetched = await api.get(f"/v1/runs/{submitted.json()['id']}/files/{urllib.parse.quote(output['name'])}")
    assert (output["name"], fetched.status_code, fetched.content) == ("out/\\xff.txt", 200, b"x")


def test_a_file_whose_escaped_name_is_another_files_is_skipped_saying_so(tmp_path):
    workspace = tmp_path / "ws"
    (workspace / "out").mkdir(parents=True)
    (workspace / "skill").mkdir()
    (workspace / "out" / "\\xff.txt").write_text("a real backslash")
    (workspace / "out" / b"\xff.txt".decode("utf-8", "surrogateescape")).write_text("a byte")
    collected = collect_outputs([f"{workspace}/out/*"], workspace_root=workspace, skill_dir=workspace / "skill",
                                limits=RunLimits())
    (kept,), (skipped,) = collected.files, collected.skipped
    assert kept.name == skipped.name == "out/\\xff.txt" and "another output's" in skipped.reason


async def test_stdout_that_is_not_utf8_comes_back_as_text(services):  # noqa: F811
    async with raw_client(services, new_team(services, "team-a")) as api:
        submitted = await api.post("/v1/runs", json={"skill": "plain", "command": "printf 'a\\377\\355\\240\\200b'; "
                                                     "printf '\\377' > out/f.txt", "output_files": ["out/*"]})
        answer = await api.get(f"/v1/runs/{submitted.json()['id']}", params={"wait": WAIT})
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert result["stdout"].startswith("a") and result["stdout"].endswith("b")


@pytest.mark.parametrize(("method", "path", "kwargs"), [
    ("GET", "/v1/skills", {"params": {"q": "\udc80x".encode("utf-8", "surrogatepass").decode("latin-1")}}),
    ("GET", "/v1/runs/%ED%A0%80", {}),                               # a surrogate's UTF-8 bytes, percent-encoded
    ("GET", "/v1/skills?q=%ED%A0%80", {}),
    ("GET", "/v1/libraries/%ED%A0%80", {}),
    ("POST", "/v1/sessions", {"content": b'{"state": {"k": "\\ud800"}}', "headers": {"content-type": "application/json"}}),
    ("POST", "/v1/runs", {"content": b'{"skill": "plain", "command": "true", "env": {"A": "\\udfff"}}',
                          "headers": {"content-type": "application/json"}}),
    ("PUT", "/v1/secrets/TOKEN", {"content": b'{"value": "abcdefgh\\ud800"}',
                                  "headers": {"content-type": "application/json"}}),
])
async def test_surrogates_at_the_apis_other_edges_are_never_a_500(services, method, path, kwargs):  # noqa: F811
    async with raw_client(services, new_team(services, "team-a")) as api:
        answer = await api.request(method, path, **kwargs)
        listed = await api.get("/v1/runs")
    assert answer.status_code < 500, (answer.status_code, answer.text[:200])
    assert listed.status_code == 200
    json.loads(listed.text)


def test_a_cli_command_that_is_not_utf8_is_a_clear_error(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    skillrun = Path(sys.executable).with_name("skillrun")
    done = subprocess.run([os.fsencode(skillrun), b"run", b"--skills-root", os.fsencode(root / "skills"),
                           b"--work-root", os.fsencode(tmp_path), b"python-math", b"echo hi \xff"],
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 2 and b"command" in done.stderr and b"Traceback" not in done.stderr, done.stderr


def test_a_result_no_store_can_keep_fails_its_run_saying_why(redis_url, worker_env, secret_library,  # noqa: F811
                                                             monkeypatch):
    """Were text with a lone surrogate to reach a result past collection, the store could not write it (a
    PydanticSerializationError, no Redis error): the run ends failed with the reason, not left started."""
    resolve = jobs.resolve_runtime

    def tainting(*args, **kwargs):
        runtime = resolve(*args, **kwargs)
        run = runtime.run

        async def tainted(request: RunRequest, **options) -> RunResult:
            result = await run(request, **options)
            result.output_files.append(OutputFile(name="out/\udcff.txt", content="x", mime_type="text/plain", size=1))
            return result

        runtime.run = tainted
        return runtime

    monkeypatch.setattr(jobs, "resolve_runtime", tainting)
    runs = RedisRunStore(redis.Redis.from_url(redis_url))
    ref = create_default_skill_repository(str(secret_library)).skill_ref("plain")
    record = runs.create(RunRequest(skill=ref, command="true"), owner="team-a")
    try:
        jobs.execute_stored_run(runs, record.id, "encoding-test")
    finally:
        jobs.close_runtimes()
    ended = runs.get(record.id)
    assert ended.status == RunStatus.FAILED and "holds text no store can keep" in ended.error, ended.error
    assert "\\udcff" in ended.error
