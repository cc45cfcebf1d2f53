"""Attacks on the Docker runtime's in-container executor: from a run (trace it, read its memory or token, signal
it, reach its socket, see another workspace's), and from outside (a wrong token, malformed frames, a second client
during a run, a link planted in place of its socket). Each runs for real and asserts the executor held."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

from worker.runtimes import executor_inside as inside
from worker.runtimes.container_executor import ExecutorLink, ExecutorUnavailable

pytestmark = pytest.mark.docker

PTRACE = (
    "python3 -c \"import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
    "print('ptrace', libc.ptrace(16, 1, 0, 0), os.strerror(ctypes.get_errno()))\""
)


def _box(runtime, workspace_id: str):
    (box,) = [box for key, box in runtime.boxes._boxes.items() if key[0] == workspace_id]
    return box


@pytest.mark.root
async def test_docker_executor_cannot_be_traced_read_signalled_or_reached_by_its_runs(docker_runtime_factory, run_in):
    runtime = docker_runtime_factory()
    result = await runtime.run(run_in(
        f"{PTRACE}; head -c 1 /proc/1/mem 2>&1 | tail -1; cat /proc/1/environ 2>&1 | tail -1; "
        "ls /.skillrun/control 2>&1 | tail -1; "
        "python3 -c \"import socket; socket.socket(socket.AF_UNIX).connect('/.skillrun/control/sock')\" 2>&1 | tail -1; "
        "stat -c '%U %a' /.skillrun/control; kill -STOP 1; kill -TERM 1; kill -KILL 1; sleep 0.2; echo signalled"))
    lines = result.stdout.splitlines()
    assert lines[0] == "ptrace -1 Operation not permitted"
    assert all("Permission denied" in line for line in lines[1:5]), result.stdout
    assert lines[5] == "root 700" and lines[6] == "signalled"
    container = runtime.container_id("attacked")
    after = await runtime.run(run_in("echo served"))
    assert (after.stdout, after.timings.exec_via) == ("served\n", "executor") and runtime.container_id("attacked") == container


async def test_docker_executor_of_another_workspace_is_out_of_sight(docker_runtime_factory, run_in):
    runtime = docker_runtime_factory()
    await runtime.run(run_in("true", workspace_id="victim"))
    victim_control = _box(runtime, "victim").control
    result = await runtime.run(run_in(
        f"ls -A /.skillrun; ls {victim_control} 2>&1 | tail -1; ls {victim_control.parent} 2>&1 | tail -1"))
    lines = result.stdout.splitlines()
    assert lines[:2] == ["control", "executor.py"]
    assert all("No such file or directory" in line for line in lines[2:4]), result.stdout


@pytest.mark.root
async def test_docker_executor_refuses_a_wrong_token_and_malformed_frames_and_keeps_serving(docker_runtime_factory, run_in):
    runtime = docker_runtime_factory()
    await runtime.run(run_in("true"))
    box = _box(runtime, "attacked")
    with pytest.raises(ExecutorUnavailable, match="did not answer|refused"):
        ExecutorLink.connect(box.control, b"not-the-token", timeout=2)
    for garbage in (inside.HEADER.pack(inside.RUN, 2) + b"{}",  # a run before the token
                    inside.HEADER.pack(inside.AUTH, 2**31) + b"x",  # a frame far past the limit
                    b"\x00" * 3):  # not even a header, then nothing
        with socket.socket(socket.AF_UNIX) as raw:
            raw.settimeout(5)
            raw.connect(str(box.control / "sock"))
            raw.sendall(garbage)
            raw.shutdown(socket.SHUT_WR)
            while raw.recv(4096):  # the executor answers with an error, or nothing, and closes
                pass
    link = ExecutorLink.connect(box.control, box.token)
    link.send(inside.RUN, b"not json")
    kind, payload = link.next_frame(time.monotonic() + 5)
    assert kind == inside.ERROR and b"bad frame" in payload
    link.close()
    after = await runtime.run(run_in("echo still serving"))
    assert (after.stdout, after.timings.exec_via) == ("still serving\n", "executor")


@pytest.mark.root
async def test_docker_executor_takes_no_second_run_while_one_is_under_way(docker_runtime_factory, run_in):
    runtime = docker_runtime_factory()
    await runtime.run(run_in("true"))
    box = _box(runtime, "attacked")
    task = asyncio.create_task(runtime.run(run_in("sleep 2; echo first")))
    await asyncio.sleep(0.5)
    intruder = ExecutorLink.connect(box.control, box.token)
    intruder.send(inside.RUN, json.dumps({"argv": ["/bin/true"], "env": {}, "cwd": "/", "caps": [10, 10],
                                          "scrub": "true"}).encode())
    kind, payload = intruder.next_frame(time.monotonic() + 5)
    intruder.close()
    assert (kind, payload) == (inside.ERROR, b"a run is under way")
    assert (await task).stdout == "first\n"


def test_docker_a_link_planted_in_place_of_the_executor_socket_is_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    accepted = []
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(elsewhere / "sock"))
        server.listen(1)
        server.settimeout(2)
        waiter = threading.Thread(target=lambda: accepted.append(_accept(server)))
        waiter.start()
        control = tmp_path / "control"
        control.mkdir()
        (control / "sock").symlink_to(elsewhere / "sock")
        with pytest.raises(ExecutorUnavailable, match="not a socket"):
            ExecutorLink.connect(control, b"token", timeout=1)
        (control / "sock").unlink()
        (control / "sock").write_text("not a socket")
        with pytest.raises(ExecutorUnavailable, match="not a socket"):
            ExecutorLink.connect(control, b"token", timeout=1)
        waiter.join()
    assert accepted == [None]  # nothing ever connected to the socket the link pointed at


def _accept(server: socket.socket):  # noqa: ANN202
    try:
        connection, _ = server.accept()
    except TimeoutError:
        return None
    connection.close()
    return "connected"
