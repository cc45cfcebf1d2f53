"""One behaviour, every runtime: the same skill and commands give the same layout, variables, outputs, timeouts
and refusals on the local runtime, in Docker containers (runc and gVisor, through the container's executor, with
and without the warm pool) and in Cube sandboxes (against the E2B stand-in)."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from tests.services import GVISOR
from worker.contract import InputFile, RunLimits, RunRequest, SkillRef
from worker.errors import InvalidRunRequestError
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

LIBRARY = Path(__file__).resolve().parents[2] / "skills"
SKILL = SkillRef(name="python-math", root=str(LIBRARY), path="python-math")


def _on_gvisor(runtime) -> bool:  # noqa: ANN001
    boxes = getattr(runtime, "boxes", None)
    return boxes is not None and boxes.settings.oci_runtime == GVISOR


PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker),
                        pytest.param("docker-pool", marks=pytest.mark.docker),
                        pytest.param("docker-gvisor", marks=pytest.mark.docker), "cube"])
async def any_runtime(request, work_root):
    if request.param == "local":
        runtime = LocalWorkspaceRuntime(work_root / "local")
    elif request.param == "docker-pool":  # every workspace but the first starts in a warm container
        runtime = request.getfixturevalue("docker_runtime_factory")(pool_size=2)
        await runtime.run(RunRequest(skill=SKILL, workspace_id="warming", command="true"))
        await runtime.idle()
    elif request.param == "docker-gvisor":
        request.getfixturevalue("docker_engine").require_runtime(GVISOR)
        runtime = request.getfixturevalue("docker_runtime_factory")(oci_runtime=GVISOR, pool_size=1)
    else:
        runtime = request.getfixturevalue(f"{request.param}_runtime_factory")()
    yield runtime
    await runtime.close()


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


async def test_environment_is_built_from_scratch(any_runtime, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "host-secret")
    result = await any_runtime.run(RunRequest(skill=SKILL, workspace_id="conf", env={"GREETING": "hi"},
                                              command='env; echo "home=$HOME"'))
    assert "host-secret" not in result.stdout and "AWS_SECRET_ACCESS_KEY" not in result.stdout
    assert "GREETING=hi" in result.stdout
    values = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert values["home"] == values["RUN_DIR"]


async def test_a_background_child_holding_stdout_does_not_hold_the_run(any_runtime):
    result = await any_runtime.run(RunRequest(skill=SKILL, workspace_id="conf", command="sleep 60 & echo started",
                                              timeout=30))
    assert (result.timed_out, result.exit_code, result.stdout) == (False, 0, "started\n")


async def test_fifos_are_refused_and_big_outputs_are_capped(any_runtime):
    result = await any_runtime.run(RunRequest(
        skill=SKILL, workspace_id="caps", command="mkfifo out/pipe; head -c 300000 /dev/zero | tr '\\0' a > out/big.txt",
        output_files=["out/*"], limits=RunLimits(output_file_bytes=1000)))
    assert result.exit_code == 0, result.stderr
    (big,) = result.output_files
    assert (big.name, big.size, big.truncated, big.content) == ("out/big.txt", 300000, True, "a" * 1000)
    skipped = [(s.name, s.reason) for s in result.skipped_files]
    if _on_gvisor(any_runtime):  # gVisor keeps a FIFO made in a mounted folder inside its sandbox: none on the host
        assert skipped == []
    else:
        assert skipped == [("out/pipe", "is not a regular file (a FIFO)")]


async def test_output_that_is_not_utf8_is_kept_with_replacements(any_runtime):
    result = await any_runtime.run(RunRequest(skill=SKILL, workspace_id="conf", command="printf 'ok \\377\\376 done'; exit 3"))
    assert result.exit_code == 3
    assert result.stdout.startswith("ok ") and result.stdout.endswith(" done") and "\ufffd" in result.stdout


async def test_binary_outputs_and_artifacts_are_byte_for_byte(any_runtime):
    result = await any_runtime.run(RunRequest(
        skill=SKILL, workspace_id="bin", command="base64 -d inputs/chart.b64 > out/chart.png",
        inputs=[InputFile(name="chart.b64", content=base64.b64encode(PNG))],
        output_files=["$OUTPUT_DIR/*.png"], save_as_artifacts=True))
    assert result.exit_code == 0, result.stderr
    (chart,) = result.output_files
    assert (chart.mime_type, chart.encoding, chart.size) == ("image/png", "base64", len(PNG))
    assert base64.b64decode(chart.content) == PNG
    (artifact,) = result.artifact_files
    assert any_runtime.artifact_store.load("bin", artifact.name, artifact.version) == PNG


@pytest.mark.root
async def test_the_staged_skill_cannot_be_changed_or_swapped(any_runtime):
    attacks = ["echo x >> SKILL.md", "chmod u+w SKILL.md && echo x >> SKILL.md",
               "mv ../python-math ../old && mkdir ../python-math", "rm -rf ../python-math",
               "mv $SKILLS_DIR $WORKSPACE_DIR/old-skills",
               "mv $WORKSPACE_DIR $WORKSPACE_DIR.old && mkdir -p $WORKSPACE_DIR/skills"]
    for attack in attacks:
        result = await any_runtime.run(RunRequest(skill=SKILL, workspace_id="conf", command=attack))
        assert result.exit_code != 0, attack
    again = await any_runtime.run(RunRequest(skill=SKILL, workspace_id="conf", command="tail -c 2 SKILL.md; ls"))
    assert not again.stdout.startswith("x\n") and "scripts" in again.stdout


async def test_globs_match_name_by_name_and_links_inside_are_followed(any_runtime):
    result = await any_runtime.run(RunRequest(
        skill=SKILL, workspace_id="globs", output_files=["$OUTPUT_DIR/*.txt"], limits=RunLimits(output_max_files=3),
        command="mkdir -p out/sub; for i in $(seq 1 20); do echo $i > out/sub/$i.txt; done; "
                "echo a > out/a.txt; echo b > out/.hidden.txt; echo data > $WORK_DIR/d.txt; ln -s ../work/d.txt out/l.txt"))
    assert result.exit_code == 0, result.stderr
    assert [(f.name, f.content) for f in result.output_files] == [("out/a.txt", "a\n"), ("work/d.txt", "data\n")]
    assert result.skipped_files == []


async def test_a_host_path_input_that_is_a_fifo_is_refused_without_blocking(any_runtime, work_root):
    fifo = work_root / "pipe"
    os.mkfifo(fifo)
    request = RunRequest(skill=SKILL, workspace_id="conf", command="true", inputs=[InputFile(name="p", host_path=str(fifo))])
    with pytest.raises(InvalidRunRequestError, match="not a regular file"):
        await any_runtime.run(request, allow_host_paths=True)
