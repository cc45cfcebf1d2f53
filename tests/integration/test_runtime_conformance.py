"""One behaviour, every runtime: the same skill and commands give the same layout, variables, outputs, timeouts
and refusals on the local runtime and in Docker containers."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.contract import InputFile, RunRequest, SkillRef
from worker.errors import InvalidRunRequestError
from worker.runtimes.local import LocalWorkspaceRuntime

LIBRARY = Path(__file__).resolve().parents[2] / "skills"
SKILL = SkillRef(name="python-math", root=str(LIBRARY), path="python-math")


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
async def any_runtime(request, work_root):
    if request.param == "local":
        runtime = LocalWorkspaceRuntime(work_root / "local")
        yield runtime
        await runtime.close()
    else:
        yield request.getfixturevalue("docker_runtime_factory")()


async def test_layout_variables_and_cwd_are_the_guides(any_runtime):
    result = await any_runtime.run(RunRequest(skill=SKILL, workspace_id="conf", command=(
        'pwd; for v in WORKSPACE_DIR SKILLS_DIR WORK_DIR OUTPUT_DIR RUN_DIR SKILL_NAME; do echo "$v=${!v}"; done; '
        "readlink out work inputs; ls $WORKSPACE_DIR")))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    values = dict(line.split("=", 1) for line in lines[1:7])
    ws = values["WORKSPACE_DIR"]
    assert lines[0] == f"{ws}/skills/python-math"
    assert values["OUTPUT_DIR"] == f"{ws}/out" and values["WORK_DIR"] == f"{ws}/work"
    assert values["RUN_DIR"].startswith(f"{ws}/runs/run_") and values["SKILL_NAME"] == "python-math"
    assert lines[7:10] == ["../../out", "../../work", "../../work/inputs"]
    assert lines[10:] == ["metadata.json", "out", "runs", "skills", "work"]


async def test_outputs_inputs_and_persistence_between_runs(any_runtime):
    first = await any_runtime.run(RunRequest(
        skill=SKILL, workspace_id="conf", command="python3 scripts/stats.py inputs/n.txt > out/stats.txt; echo kept > $WORK_DIR/k",
        inputs=[InputFile(name="n.txt", content=b"1\n2\n3\n")], output_files=["$OUTPUT_DIR/*.txt"]))
    assert first.exit_code == 0, first.stderr
    (stats,) = first.output_files
    assert stats.name == "out/stats.txt" and stats.mime_type == "text/plain" and "count" in stats.content.lower()
    second = await any_runtime.run(RunRequest(skill=SKILL, workspace_id="conf", command="cat $WORK_DIR/k out/stats.txt | head -1"))
    assert second.stdout.startswith("kept\n")


async def test_timeout_nonzero_exit_and_output_caps(any_runtime):
    timed = await any_runtime.run(RunRequest(skill=SKILL, workspace_id="conf", command="sleep 30", timeout=1))
    assert (timed.timed_out, timed.exit_code) == (True, 124)
    failed = await any_runtime.run(RunRequest(skill=SKILL, workspace_id="conf", command="echo out; echo err >&2; exit 5"))
    assert (failed.exit_code, failed.stdout, failed.stderr) == (5, "out\n", "err\n")


async def test_refusals_are_the_same(any_runtime, work_root):
    for request in (
        RunRequest(skill=SKILL, command="true", cwd="/etc"),
        RunRequest(skill=SKILL, command="true", output_files=["../../etc/passwd"]),
        RunRequest(skill=SKILL, command="true", env={"LD_PRELOAD": "/x.so"}),
        RunRequest(skill=SKILL, command="true", inputs=[InputFile(name="../../x", content=b"x")]),
    ):
        with pytest.raises(InvalidRunRequestError):
            await any_runtime.run(request)


async def test_symlink_out_of_the_workspace_is_not_collected(any_runtime):
    result = await any_runtime.run(RunRequest(skill=SKILL, workspace_id="conf", command="ln -sf /etc/passwd out/x",
                                              output_files=["out/*"]))
    assert result.output_files == []
    assert result.skipped_files[0].reason == "resolves outside the workspace"
