"""The Docker runtime's other way into a container, for one without an executor (``container_launch``): a run
as one ``docker exec``, followed until it ends, times out or is cancelled; and the end of a run through the
engine (``CLEAN_INSIDE`` as the run's user), which also ends what a run left in a container with an executor.
"""

from __future__ import annotations

import contextlib
import select
import time
from collections.abc import Callable

import docker
import docker.errors

from worker import defaults
from worker.cancellation import Cancellation
from worker.contract import RunRequest
from worker.outcome import TIMEOUT_EXIT_CODE, ProcessOutcome
from worker.runtimes.docker.executor import CappedOutput, Frames
from worker.runtimes.docker.host import CLEAN_INSIDE, CLEANED
from worker.runtimes.docker.engine import ENGINE_ERRORS, map_docker_errors

POLL_SECONDS = 0.05


def docker_exec_run(api: docker.APIClient, container_id: str, user: str, script: str, env: dict[str, str], cwd: str,
                    request: RunRequest, cancel: Cancellation, *, end_run: Callable[[], None]) -> ProcessOutcome:
    """Run ``bash -c script`` in the container as ``user`` with one ``docker exec``, following it (blocking);
    ``end_run`` ends everything the run left once its command is over, however it ended."""
    started = time.monotonic()
    with map_docker_errors("starting the command"):
        exec_id = api.exec_create(container_id, ["/bin/bash", "-c", script], environment=env, workdir=cwd, user=user,
                                  stdout=True, stderr=True)["Id"]
        sock = api.exec_start(exec_id, socket=True)
    raw = getattr(sock, "_sock", sock)
    output, frames = CappedOutput(request), Frames()
    deadline = started + request.timeout
    timed_out = cancelled = closed = False
    code = None
    next_check = started + POLL_SECONDS

    def read(seconds: float) -> bool:
        """Take what arrives within ``seconds``; ``False`` once the output is closed."""
        if not select.select([raw], [], [], seconds)[0]:
            return True
        try:
            chunk = raw.recv(65536)
        except BlockingIOError:
            return True
        for stream, payload in frames.feed(chunk):
            output.add(stream, payload)
        return bool(chunk)

    raw.setblocking(False)
    try:
        while True:
            now = time.monotonic()
            if cancel.is_set():
                cancelled = True
                break
            if now >= deadline:
                timed_out = True
                break
            if now >= next_check:
                with map_docker_errors("following the command"):
                    info = api.exec_inspect(exec_id)
                if not info["Running"]:
                    code = info.get("ExitCode")
                    break
                next_check = now + (POLL_SECONDS / 10 if closed else POLL_SECONDS)
            if closed:
                time.sleep(POLL_SECONDS / 10)
            elif not read(POLL_SECONDS):
                closed, next_check = True, now  # output closed: the exit is a moment away
        # The run is over, however it ended: everything it started goes, detached or not.
        end_run()
        drain_until = time.monotonic() + defaults.KILL_GRACE_SECONDS
        while not closed and time.monotonic() < drain_until:
            closed = not read(POLL_SECONDS)
    finally:
        raw.close()
    for _ in range(100):  # a killed command's exit is recorded a moment after the kill
        if code is not None:
            break
        with contextlib.suppress(*ENGINE_ERRORS):
            info = api.exec_inspect(exec_id)
            if not info["Running"]:
                code = info.get("ExitCode")
                break
        time.sleep(POLL_SECONDS)
    exit_code = TIMEOUT_EXIT_CODE if timed_out else (code if code is not None else 128 + 9)
    return output.outcome(exit_code=exit_code, timed_out=timed_out, cancelled=cancelled, started=started)


def scrub_through_engine(api: docker.APIClient, container_id: str, user: str) -> bool:
    """Kill every process of ``user`` in the container and empty its scratch folders, through the engine (one
    ``docker exec`` as that user); whether it said all is gone (an exec that cannot start — a fork bomb holds every
    process slot — or leaves something behind does not)."""
    try:
        said = api.exec_start(api.exec_create(container_id, ["/bin/bash", "-c", CLEAN_INSIDE], user=user)["Id"])
    except ENGINE_ERRORS:
        said = b""
    return CLEANED.encode() in said


__all__ = ["docker_exec_run", "scrub_through_engine"]
