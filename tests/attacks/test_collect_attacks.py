"""Attacks on output collection, run for real on every runtime whose workspaces are on this host (local and
Docker share ``worker.collect``): links that lead the host-side collector out of the workspace, and trees built
to crash or stall it. Each must end with the run's result intact and the problem listed in ``skipped_files``."""

from __future__ import annotations

import os

import pytest

from tests.conftest import IS_ROOT
from worker.collect import MAX_DEPTH, MAX_LISTED_ENTRIES
from worker.runtimes.local.runtime import LocalWorkspaceRuntime


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
async def runtime(request, work_root):
    if request.param == "docker":
        yield request.getfixturevalue("docker_runtime_factory")()
        return
    local = LocalWorkspaceRuntime(work_root / "local")
    yield local
    await local.close()


@pytest.fixture
def host_canary():
    """A file in the host's /tmp whose name must never appear in a result."""
    path = f"/tmp/skillrun-collect-canary-{os.getpid()}"
    open(path, "w").close()
    yield os.path.basename(path)
    os.unlink(path)


async def test_collect_a_link_to_a_host_folder_is_one_skipped_entry_and_never_listed(runtime, run_in, host_canary):
    result = await runtime.run(run_in(
        "ln -s /tmp out/t; ln -s / out/root; echo kept > out/k.txt; echo done",
        output_files=["out/t/*", "$OUTPUT_DIR/t/*", "out/root/tmp/*", "out/**/*", "out/*/*"]))
    assert result.stdout == "done\n" and [f.name for f in result.output_files] == ["out/k.txt"]
    assert {(s.name, s.reason) for s in result.skipped_files} == {
        ("out/t", "resolves outside the workspace"), ("out/root", "resolves outside the workspace")}
    assert host_canary not in result.model_dump_json()


@pytest.mark.parametrize("target", ["/proc/1/root/etc", "/proc/self/root", "/proc/self/cwd", "/proc/1/root", "../../..", "."])
async def test_collect_survives_links_into_proc_roots_and_climbing_or_looping_links(runtime, run_in, target):
    result = await runtime.run(run_in(
        f"ln -s {target} out/x; ln -s loop out/loop; ln -s b out/a; ln -s a out/b; echo ok > out/f.txt; echo done",
        output_files=["out/**", "out/**/*", "out/*/*", "out/x/passwd", "out/x/etc/passwd"]))
    assert result.stdout == "done\n" and result.exit_code == 0
    assert "out/f.txt" in [f.name for f in result.output_files]
    reasons = {s.name: s.reason for s in result.skipped_files}
    assert "more than 40 links" in reasons["out/loop"] and "more than 40 links" in reasons["out/a"]
    if target != ".":
        assert reasons["out/x"] == "resolves outside the workspace"
    assert "root:" not in result.model_dump_json() and "passwd" not in result.model_dump_json()


async def test_collect_survives_fifos_sockets_devices_and_unreadable_files(runtime, run_in):
    first = await runtime.run(run_in("true"))
    assert first.exit_code == 0
    out = runtime.workspaces.find("attacked").path / "out"
    if IS_ROOT:  # a device the command could not make itself (making one needs root)
        os.mknod(out / "null", 0o666 | 0o020000, os.makedev(1, 3))
    result = await runtime.run(run_in(
        "mkfifo out/pipe; python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('out/sock')\"; "
        "echo secret > out/locked; chmod 000 out/locked; echo done", output_files=["out/*"]))
    assert result.stdout == "done\n"
    reasons = {s.name: s.reason for s in result.skipped_files}
    assert reasons["out/pipe"] == "is not a regular file (a FIFO)"
    assert reasons["out/sock"] == "is not a regular file (a socket)"
    if IS_ROOT:
        assert reasons["out/null"] == "is not a regular file (a device)"
    # The collector runs on the host (as root it may read a file its owner made unreadable; otherwise it is listed).
    assert "out/locked" in reasons or [f.name for f in result.output_files] == ["out/locked"]


async def test_collect_survives_deep_nesting(runtime, run_in):
    deep = "/".join(["d"] * (MAX_DEPTH + 40))
    result = await runtime.run(run_in(
        f"mkdir -p out/{deep} && echo bottom > out/{deep}/f.txt && echo top > out/t.txt && echo done",
        output_files=["out/**/*.txt"]))
    assert result.stdout == "done\n"
    assert [f.name for f in result.output_files] == ["out/t.txt"]
    assert [s.reason for s in result.skipped_files] == [f"is more than {MAX_DEPTH} folders deep; not searched further"]


async def test_collect_stops_listing_a_huge_folder_and_keeps_the_result(runtime, run_in):
    result = await runtime.run(run_in(
        f"mkdir out/huge && cd out/huge && seq {MAX_LISTED_ENTRIES + 10} | xargs touch && cd - >/dev/null "
        "&& echo done", output_files=["out/huge/*.txt", "out/**/*"], timeout=120))
    assert result.stdout == "done\n"
    assert any("collection stopped" in s.reason for s in result.skipped_files)
    assert len(result.output_files) <= 1000 and len(result.model_dump_json()) < 4 * 1024 * 1024
