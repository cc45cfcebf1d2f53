"""The Docker runtime's hardening, each shown by a hostile command."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.file_server import FileServer
from tests.test_example_skills import (
    DOC_TO_PDF,
    PAGE_SCREENSHOT,
    WEBAPP_CHECK,
    assert_converted,
    assert_memo,
    assert_screenshot,
)
from tests.worker.test_local_runtime import RESERVE, SOCKET_IN_TMPDIR
from worker import defaults
from worker.contract import RunLimits, RunRequest, SkillRef
from worker.errors import InvalidRunRequestError, RuntimeUnavailableError
from worker.roots.cache import evict
from worker.runtimes.docker.runtime import ContainerWorkspaceRuntime
from worker.runtimes.docker.launch import container_limits

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "skills"
SKILL = SkillRef(name="python-math", root=str(LIBRARY), path="python-math")
UNLIMITED = RunLimits(memory_bytes=16 * 1024**3, processes=4096)


def _request(command: str, **fields) -> RunRequest:
    fields.setdefault("workspace_id", "hostile")
    return RunRequest(skill=SKILL, command=command, **fields)


async def test_one_container_per_workspace_reused_and_hardened(docker_runtime_factory, docker_engine):
    runtime = docker_runtime_factory()
    await runtime.run(_request("true", workspace_id="a"))
    first = runtime.container_id("a")
    await runtime.run(_request("true", workspace_id="a"))
    await runtime.run(_request("true", workspace_id="b"))
    assert runtime.container_id("a") == first != runtime.container_id("b")
    config = docker_engine.client.api.inspect_container(first)["HostConfig"]
    assert config["NetworkMode"] == "none" and config["ReadonlyRootfs"] is True
    assert config["CapDrop"] == ["ALL"] and "no-new-privileges" in config["SecurityOpt"][0]
    assert sorted(config["CapAdd"]) == ["KILL", "SETGID", "SETPCAP", "SETUID"]  # the executor's (SETPCAP until set)
    limits = container_limits((runtime.memory_bytes, runtime.pids), executor=True)
    assert (config["Memory"], config["PidsLimit"]) == limits
    assert "/tmp" in config["Tmpfs"] and config["ShmSize"] == runtime.shm_bytes
    result = await runtime.run(_request("id -u; cat /proc/self/status | grep CapEff", workspace_id="a"))
    uid, caps = result.stdout.splitlines()
    assert 30000 <= int(uid) < 60000 and caps == "CapEff:\t0000000000000000"


async def test_network_is_off_and_a_request_for_it_is_refused_unless_allowed(docker_runtime_factory):
    runtime = docker_runtime_factory()
    result = await runtime.run(_request(
        "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 9), timeout=2)\" 2>&1; "
        "python3 -c \"import socket; print(socket.if_nameindex())\""))
    assert result.stdout.strip().splitlines()[-1] == "[(1, 'lo')]"
    with pytest.raises(InvalidRunRequestError, match="network access is not allowed"):
        await runtime.run(_request("true", network=True))


async def test_a_fork_bomb_is_stopped_by_the_pids_limit(docker_runtime_factory):
    runtime = docker_runtime_factory(pids=64)
    result = await runtime.run(_request("bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", timeout=20, limits=UNLIMITED))
    assert "fork" in result.stderr and "retry" in result.stderr.lower() or "Resource temporarily unavailable" in result.stderr
    after = await runtime.run(_request("echo still usable", limits=UNLIMITED))
    assert after.stdout == "still usable\n"


async def test_allocating_past_the_memory_limit_is_reported_as_oom(docker_runtime_factory):
    runtime = docker_runtime_factory(memory_bytes=256 * 1024**2)
    result = await runtime.run(_request("python3 -c 'x = bytearray(600 * 1024 * 1024)'", limits=UNLIMITED))
    assert result.oom_killed is True
    assert result.exit_code == 137
    assert "memory limit" in result.stderr


@pytest.mark.parametrize("oci_runtime", ["runc", "runsc"])
async def test_a_program_may_reserve_more_address_space_than_its_memory(docker_runtime_factory, docker_engine,
                                                                        oci_runtime):
    if oci_runtime != "runc":
        docker_engine.require_runtime(oci_runtime)
    runtime = docker_runtime_factory(oci_runtime=oci_runtime)  # the container bounds memory: no ulimit -v
    result = await runtime.run(_request(RESERVE, limits=RunLimits(memory_bytes=300 * 1024**2)))
    assert (result.exit_code, result.stdout) == (0, "reserved\n"), result.stderr


async def test_a_socket_made_in_tmpdir_fits_and_lands_in_the_run_folder(docker_runtime_factory):
    result = await docker_runtime_factory().run(_request(SOCKET_IN_TMPDIR))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("bound") and result.stdout.endswith("same-folder\n"), result.stdout


@pytest.mark.parametrize("oci_runtime", ["runc", "runsc"])
async def test_the_runs_user_is_a_user_and_python_is_on_its_path(docker_runtime_factory, docker_engine, oci_runtime):
    if oci_runtime != "runc":
        docker_engine.require_runtime(oci_runtime)
    runtime = docker_runtime_factory(oci_runtime=oci_runtime)
    result = await runtime.run(_request("id -un; id -gn; getent passwd $(id -u) | cut -d: -f1,3; "
                                        "python -c 'import getpass; print(getpass.getuser())'"))
    assert result.exit_code == 0, result.stderr
    uid = runtime.workspaces.find("hostile").uid
    name = f"skillrun-{uid}"
    assert result.stdout.splitlines() == [name, name, f"{name}:{uid}", name], result.stdout


async def test_an_example_skill_starts_a_server_and_tests_it_in_one_run(docker_runtime_factory):
    runtime = docker_runtime_factory()
    skill = SkillRef(name="webapp-check", root=str(LIBRARY), path="webapp-check")
    result = await runtime.run(RunRequest(skill=skill, command=WEBAPP_CHECK, output_files=["out/report.json"]))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert json.loads(result.output_files[0].content)["passed"] is True


@pytest.mark.parametrize(("name", "command", "outputs", "check"), [
    ("docx-memo", "node scripts/memo.js memo.example.json out/memo.docx", "out/memo.docx", assert_memo),  # npm
    ("doc-to-pdf", DOC_TO_PDF, "out/*.pdf", assert_converted),                # LibreOffice from Debian packages
    ("page-screenshot", PAGE_SCREENSHOT, "out/page.png", assert_screenshot),  # Playwright with Debian's Chromium
], ids=["docx-memo", "doc-to-pdf", "page-screenshot"])
async def test_an_example_skill_runs_with_the_packages_it_declares(docker_runtime_factory, name, command, outputs,
                                                                    check):
    runtime = docker_runtime_factory()
    skill = SkillRef(name=name, root=str(LIBRARY), path=name)
    result = await runtime.run(RunRequest(skill=skill, command=command, output_files=[outputs]))
    assert result.exit_code == 0, result.stdout + result.stderr
    check(result)


def test_the_sandbox_image_names_every_workspace_id_of_the_range():
    dockerfile = (REPO / "images" / "sandbox" / "Dockerfile").read_text()
    first, last = defaults.SANDBOX_UID_BASE, defaults.SANDBOX_UID_BASE + defaults.SANDBOX_UID_COUNT - 1
    assert dockerfile.count(f"seq {first} {last} ") == 2 and defaults.SANDBOX_TOOLS_DIR in dockerfile


async def test_the_skill_folder_takes_new_files_but_the_library_and_root_file_system_do_not(docker_runtime_factory):
    runtime = docker_runtime_factory()
    before = (LIBRARY / "python-math" / "SKILL.md").read_bytes()
    result = await runtime.run(_request(
        "echo x >> SKILL.md; echo y > planted; echo z > $(readlink -f scripts)/evil.py; touch /etc/evil; "
        f"touch {LIBRARY}/python-math/direct; cat planted"))
    assert result.stdout == "y\n"
    assert result.stderr.count("Read-only file system") >= 2 and "Permission denied" in result.stderr
    assert (LIBRARY / "python-math" / "SKILL.md").read_bytes() == before
    assert not (LIBRARY / "python-math" / "scripts" / "evil.py").exists()
    assert not (LIBRARY / "python-math" / "planted").exists() and not (LIBRARY / "python-math" / "direct").exists()


async def test_another_workspace_cannot_be_read(docker_runtime_factory):
    runtime = docker_runtime_factory()
    victim = await runtime.run(_request("echo secret > $WORK_DIR/s; echo $WORK_DIR", workspace_id="victim"))
    path = victim.stdout.strip()
    result = await runtime.run(_request(f"cat {path}/s; ls $(dirname $WORKSPACE_DIR)", workspace_id="attacker"))
    assert "secret" not in result.stdout
    assert "No such file or directory" in result.stderr


async def test_a_timed_out_run_has_its_processes_killed_in_the_container(docker_runtime_factory, docker_engine):
    runtime = docker_runtime_factory()
    result = await runtime.run(_request("sleep 100 & sleep 100", timeout=1))
    assert result.timed_out
    top = docker_engine.client.api.top(runtime.container_id("hostile"))
    assert not [p for p in top["Processes"] if "sleep 100" in " ".join(p)]


async def test_a_container_that_cannot_start_fails_with_the_engines_reason(docker_runtime_factory):
    runtime = docker_runtime_factory(image="skillrun/no-such-image:latest")
    with pytest.raises(RuntimeUnavailableError, match="workspace 'hostile'.*image not found.*no-such-image.*images/build.sh"):
        await runtime.run(_request("true"))


async def test_cancel_stops_the_command_in_the_container(docker_runtime_factory, docker_engine):
    """Cancelling kills the command's processes, the background one included; the container stays for reuse."""
    runtime = docker_runtime_factory()
    request = _request("sleep 60 & sleep 60", timeout=120)
    task = asyncio.create_task(runtime.run(request))
    for _ in range(400):  # cancel once the command runs
        container = runtime.container_id("hostile")
        if container and [p for p in docker_engine.client.api.top(container)["Processes"] if "sleep 60" in " ".join(p)]:
            break
        await asyncio.sleep(0.025)
    assert runtime.cancel(request.run_id)
    result = await task
    assert "cancelled" in result.stderr
    top = docker_engine.client.api.top(runtime.container_id("hostile"))
    assert not [p for p in top["Processes"] if "sleep 60" in " ".join(p)]


async def test_an_awaiting_caller_that_gives_up_ends_the_command_in_the_container(docker_runtime_factory, docker_engine):
    runtime = docker_runtime_factory()
    task = asyncio.create_task(runtime.run(_request("sleep 61", timeout=120)))
    for _ in range(400):
        container = runtime.container_id("hostile")
        if container and [p for p in docker_engine.client.api.top(container)["Processes"] if "sleep 61" in " ".join(p)]:
            break
        await asyncio.sleep(0.025)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):  # the thread following the command sees the cancel at its next poll
        top = docker_engine.client.api.top(runtime.container_id("hostile"))
        if not [p for p in top["Processes"] if "sleep 61" in " ".join(p)]:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the command outlived its cancelled caller")


def test_skillrun_run_in_docker_from_the_command_line(docker_engine, work_root):
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", "python-math", "id -u; python3 scripts/fib.py 7 | tail -1",
         "--runtime", "docker", "--work-root", str(work_root / "cli"), "--skills-root", str(LIBRARY), "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    uid, fib = data["stdout"].splitlines()
    assert (data["runtime"], fib) == ("docker", "8") and 30000 <= int(uid) < 60000
    assert not docker_engine.client.containers.list(all=True, filters={"label": f"skillrun.work_root={work_root / 'cli'}"})


async def test_a_cancel_before_the_command_starts_still_ends_the_run_cleanly(docker_runtime_factory):
    runtime = docker_runtime_factory()
    request = _request("sleep 60", timeout=120)
    task = asyncio.create_task(runtime.run(request))
    while not runtime.cancel(request.run_id):
        await asyncio.sleep(0.001)
    result = await task
    assert "cancelled" in result.stderr and result.exit_code != 0
    again = await runtime.run(_request("echo next"))
    assert again.stdout == "next\n"


async def test_filling_the_workspace_past_its_cap_stops_at_the_cap(docker_runtime_factory):
    runtime = docker_runtime_factory(disk_bytes=16 * 1024 * 1024)
    result = await runtime.run(_request("head -c 64M /dev/zero > $WORK_DIR/fill; echo status=$?",
                                        limits=RunLimits(file_size_bytes=1024**3)))
    assert "No space left on device" in result.stderr and "status=1" in result.stdout


async def test_idle_containers_are_removed_and_their_workspace_kept(docker_runtime_factory, docker_engine):
    runtime = docker_runtime_factory(idle_seconds=0)
    await runtime.run(_request("echo kept > $WORK_DIR/k", workspace_id="idle"))
    idle_container = runtime.container_id("idle")
    await runtime.run(_request("true", workspace_id="busy"))
    assert runtime.container_id("idle") is None
    assert not docker_engine.client.containers.list(all=True, filters={"id": idle_container})
    again = await runtime.run(_request("cat $WORK_DIR/k", workspace_id="idle"))
    assert again.stdout == "kept\n"


async def test_two_workers_running_one_workspace_at_once_share_its_container(docker_runtime_factory, docker_engine):
    """Two runtimes of one work root (two workers) take turns in the workspace's one container: neither removes it
    under the other's run, and it is made once."""
    first = docker_runtime_factory()
    second = ContainerWorkspaceRuntime(first.work_root, client=docker_engine.client)
    await first.run(_request("true", workspace_id="shared"))  # the skill staged (two stagers of one process would
    first.remove_containers()  # share their temporary folder's name), and no container: the runs below ask at once
    command = "echo $$ > $WORK_DIR/last; sleep 0.3; test $(cat $WORK_DIR/last) = $$ && cat /etc/hostname"
    results = await asyncio.gather(*(runtime.run(_request(command, workspace_id="shared"))
                                     for runtime in (first, second, first, second)))
    assert [result.exit_code for result in results] == [0] * 4, [result.stderr for result in results]
    assert len({result.stdout for result in results}) == 1  # one container, and no run saw another's in between
    folder = first.workspaces.find("shared").path.name  # containers are labelled with their workspace's folder
    labelled = docker_engine.client.containers.list(all=True, filters={"label": [
        f"skillrun.workspace={folder}", f"skillrun.work_root={first.work_root}"]})
    assert [c.id for c in labelled] == [first.container_id("shared")] == [second.container_id("shared")]
    assert labelled[0].id.startswith(results[0].stdout.strip())


WORKER_IN_A_PID_NAMESPACE = """
import asyncio, json, sys
from worker.contract import RunRequest, SkillRef
from worker.runtimes.docker.runtime import ContainerWorkspaceRuntime

async def main():
    runtime = ContainerWorkspaceRuntime(sys.argv[1])
    result = await runtime.run(RunRequest(
        skill=SkillRef(name="python-math", root=sys.argv[2], path="python-math"), workspace_id="unseen", timeout=1,
        command="setsid sleep 1003 >/dev/null 2>&1 < /dev/null & sleep 1004"))
    box = runtime.boxes.find((runtime.workspaces.find("unseen").path.name, runtime.image))
    print(json.dumps({"timed_out": result.timed_out, "container": box.id, "sees_container": box.host is not None}))

asyncio.run(main())
"""


def test_a_worker_that_cannot_see_the_containers_processes_still_ends_its_runs(docker_runtime_factory, docker_engine):
    """A worker in a PID namespace of its own (as in a container) sees none of the container's processes: a
    timed-out run's processes, a detached one included, are still killed, through the engine."""
    work_root = docker_runtime_factory().work_root
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", WORKER_IN_A_PID_NAMESPACE,
                           str(work_root), str(LIBRARY)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["timed_out"] and not seen["sees_container"]
    top = docker_engine.client.api.top(seen["container"])["Processes"]
    assert not [p for p in top if "sleep 100" in " ".join(p)], top


async def test_a_worker_reaping_idle_containers_spares_one_another_workers_run_is_in(docker_runtime_factory, docker_engine):
    busy_worker = docker_runtime_factory(idle_seconds=0)
    other_worker = ContainerWorkspaceRuntime(busy_worker.work_root, client=docker_engine.client, idle_seconds=0)
    long_run = asyncio.create_task(busy_worker.run(_request("touch $WORK_DIR/started; sleep 2; echo survived",
                                                            workspace_id="busy")))
    for _ in range(400):
        workspace = busy_worker.workspaces.find("busy")
        if workspace is not None and (workspace.work_dir / "started").exists():
            break
        await asyncio.sleep(0.025)
    await other_worker.run(_request("true", workspace_id="other"))  # looks for idle containers of the work root
    assert (await long_run).stdout == "survived\n"
    assert busy_worker.container_id("busy") is not None
    await other_worker.run(_request("true", workspace_id="other"))  # now the busy one is idle: reaped
    assert not docker_engine.client.containers.list(all=True, filters={"id": busy_worker.container_id("busy")})


async def test_a_url_library_a_run_uses_stays_in_the_cache_until_the_run_ends(docker_runtime_factory, shared_dir,
                                                                              monkeypatch):
    cache = shared_dir / "roots"
    monkeypatch.setenv("SKILLS_CACHE_DIR", str(cache))
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        tar.add(LIBRARY / "python-math", arcname="lib/python-math")
    digest = hashlib.sha256(archive.getvalue()).hexdigest()
    server = FileServer().start()
    try:
        skill = SkillRef(name="python-math", root=server.add("/lib.tgz", archive.getvalue()), path="lib/python-math",
                         digest=digest)
        runtime = docker_runtime_factory()
        run = asyncio.create_task(runtime.run(RunRequest(
            skill=skill, workspace_id="url", command="touch $WORK_DIR/started; sleep 1; head -1 SKILL.md")))
        for _ in range(400):
            workspace = runtime.workspaces.find("url")
            if workspace is not None and (workspace.work_dir / "started").exists():
                break
            await asyncio.sleep(0.025)
        assert evict(cache, 1) == []  # past any bound, the entry the run holds stays
        assert (await run).stdout == "---\n"
        assert evict(cache, 1) == [digest]  # once the run has ended, it can go
    finally:
        server.stop()


async def test_the_name_held_by_an_earlier_versions_container_is_taken_over_and_a_strangers_is_refused(
        docker_runtime_factory, docker_engine):
    runtime = docker_runtime_factory()
    root = str(runtime.work_root.resolve())
    for workspace_id in ("old", "taken"):  # the workspaces exist; their containers do not
        await runtime.run(_request("true", workspace_id=workspace_id))
    runtime.remove_containers()
    old, taken = (runtime.workspaces.find(w).path.name for w in ("old", "taken"))
    earlier = docker_engine.client.containers.run(  # as made before containers had the image's label
        runtime.image, ["sleep", "infinity"], name=runtime.boxes.name(old, runtime.image), detach=True,
        labels={"skillrun.workspace": old, "skillrun.work_root": root})
    assert (await runtime.run(_request("true", workspace_id="old"))).exit_code == 0
    assert runtime.container_id("old") != earlier.id
    assert not docker_engine.client.containers.list(all=True, filters={"id": earlier.id})
    docker_engine.client.containers.run(runtime.image, ["sleep", "infinity"], detach=True,
                                        name=runtime.boxes.name(taken, runtime.image),
                                        labels={"skillrun.work_root": root})
    with pytest.raises(RuntimeUnavailableError, match="taken by a container that is not this workspace's"):
        await runtime.run(_request("true", workspace_id="taken"))
