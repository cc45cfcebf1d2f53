"""compose.yaml end to end: Redis, the API and two workers from the images images/build.sh builds."""

from __future__ import annotations

import io
import tarfile
import time

import httpx
import pytest

from tests.e2e.conftest import team_key

pytestmark = pytest.mark.docker


def hello_library() -> bytes:
    """A team library of one skill, ``hello``, as a .tar.gz."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        for name, data in {"lib/hello/SKILL.md": b"---\nname: hello\ndescription: Says hello.\n---\nRun it.\n",
                           "lib/hello/hi.sh": b"echo hello from the team library\n"}.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return archive.getvalue()


PROCESS_STATES = """
import pathlib
for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
    try:
        text = stat.read_text()
    except OSError:
        continue
    state, parent = text.rsplit(")", 1)[1].split()[:2]
    print(text.split(" ", 1)[0], state, text[text.index("(") + 1:text.rindex(")")], "parent", parent)
"""
"""Prints each process of a container: pid, state, name, parent pid."""


def test_compose_runs_a_sessions_runs_on_scaled_workers_sharing_its_workspace(compose):
    run, url = compose("--scale", "worker=2")
    assert len([line for line in run("ps", "-q", "worker").stdout.splitlines() if line.strip()]) == 2
    key = team_key(run)
    headers = {"Authorization": f"Bearer {key}"}
    results = []
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        for i in range(6):
            command = f"echo {i} >> $WORK_DIR/log; cat $WORK_DIR/log | wc -l"
            run_id = client.post("/v1/runs", json={"skill": "python-math", "command": command, "workspace_id": "e2e"}).json()["id"]
            done = client.get(f"/v1/runs/{run_id}", params={"wait": 60}).json()
            assert done["status"] == "finished", done
            results.append(done)
    assert [r["result"]["stdout"].strip() for r in results] == ["1", "2", "3", "4", "5", "6"]
    assert len({r["worker_id"] for r in results}) >= 1

    # A team library uploaded to the API is seen by the workers (the shared libraries volume).
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        uploaded = client.post("/v1/libraries/team/upload", params={"filename": "lib.tar.gz"}, content=hello_library())
        assert uploaded.status_code == 201, uploaded.text
        run_id = client.post("/v1/runs", json={"skill": "hello", "command": "bash hi.sh"}).json()["id"]
        done = client.get(f"/v1/runs/{run_id}", params={"wait": 60}).json()
        assert done["status"] == "finished", done
        assert done["result"]["stdout"] == "hello from the team library\n"

    # Nothing the runs started is left behind in a worker's container, not even as a zombie (a run's sandbox that
    # just ended may be one for the moment its worker takes to reap it, after the run's answer: so within 10 s).
    for index in (1, 2):
        deadline = time.monotonic() + 10
        while True:
            states = run("exec", "-T", "--index", str(index), "worker", "python", "-c", PROCESS_STATES).stdout
            zombies = [line for line in states.splitlines() if line.split()[1] == "Z"]
            if not zombies or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert zombies == [], states
