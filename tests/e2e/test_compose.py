"""compose.yaml end to end: Redis, the API and two workers from the images images/build.sh builds."""

from __future__ import annotations

import io
import json
import os
import tarfile
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.services import ensure_installed, free_port

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.docker


@pytest.fixture
def compose(docker_engine):
    binary = shutil.which("docker-compose") or ensure_installed("docker-compose", "docker-compose")
    project = f"skillrun-e2e-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = {**os.environ, "SKILLRUN_PORT": str(port)}
    base = [binary, "-f", str(REPO / "compose.yaml"), "-p", project]
    # The worker and API images carry this checkout's code: build them again (cached layers make it quick).
    bundle = "/etc/ssl/certs/ca-certificates.crt"
    subprocess.run(["bash", str(REPO / "images" / "build.sh"), *(["--ca-bundle", bundle] if os.path.exists(bundle) else [])],
                   cwd=REPO, check=True, timeout=1200)

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([*base, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=check)

    try:
        run("up", "-d", "--scale", "worker=2")
        yield run, f"http://127.0.0.1:{port}"
    finally:
        logs = run("logs", "--no-color", check=False).stdout
        run("down", "-v", "--remove-orphans", check=False)
        print(logs[-4000:])


PROCESS_STATES = """
import pathlib
for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
    try:
        text = stat.read_text()
    except OSError:
        continue
    print(text.split(" ", 1)[0], text.rsplit(")", 1)[1].split()[0], text[text.index("(") + 1:text.rindex(")")])
"""
"""Prints each process of a container: pid, state, name."""


def _wait_healthy(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError("the API did not come up within 60 s")


def test_compose_runs_a_sessions_runs_on_scaled_workers_sharing_its_workspace(compose):
    run, url = compose
    _wait_healthy(url)
    assert len([line for line in run("ps", "-q", "worker").stdout.splitlines() if line.strip()]) == 2
    run("exec", "-T", "api", "skillrun", "teams", "create", "e2e")
    key = json.loads(run("exec", "-T", "api", "skillrun", "keys", "create", "e2e", "--json").stdout)["key"]
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
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        for name, data in {"lib/hello/SKILL.md": b"---\nname: hello\ndescription: Says hello.\n---\nRun it.\n",
                           "lib/hello/hi.sh": b"echo hello from the team library\n"}.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        uploaded = client.post("/v1/libraries/team/upload", params={"filename": "lib.tar.gz"}, content=archive.getvalue())
        assert uploaded.status_code == 201, uploaded.text
        run_id = client.post("/v1/runs", json={"skill": "hello", "command": "bash hi.sh"}).json()["id"]
        done = client.get(f"/v1/runs/{run_id}", params={"wait": 60}).json()
        assert done["status"] == "finished", done
        assert done["result"]["stdout"] == "hello from the team library\n"

    # Nothing the runs started is left behind in a worker's container, not even as a zombie.
    for index in (1, 2):
        states = run("exec", "-T", "--index", str(index), "worker", "python", "-c", PROCESS_STATES).stdout
        assert [line for line in states.splitlines() if line.split()[1] == "Z"] == [], states
