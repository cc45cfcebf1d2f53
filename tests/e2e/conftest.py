"""Compose projects from this checkout's compose.yaml and images (built again first: cached layers make it quick)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import docker_engine  # noqa: F401 - the same session-wide engine
from tests.services import ensure_installed, free_port

REPO = Path(__file__).resolve().parents[2]
Run = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def compose(docker_engine):  # noqa: F811
    """``up(*arguments, env=...)`` starts a project (``docker-compose [--profile …] up -d …``) and returns its
    ``run(*arguments)`` and the API's URL; the project is taken down (volumes too) at the end, its logs printed."""
    binary = shutil.which("docker-compose") or ensure_installed("docker-compose", "docker-compose")
    bundle = "/etc/ssl/certs/ca-certificates.crt"
    subprocess.run(["bash", str(REPO / "images" / "build.sh"), *(["--ca-bundle", bundle] if os.path.exists(bundle) else [])],
                   cwd=REPO, check=True, timeout=1200)
    projects: list[Run] = []

    def up(*arguments: str, profiles: tuple[str, ...] = (), env: dict[str, str] | None = None) -> tuple[Run, str]:
        port = free_port()
        environment = {**os.environ, "SKILLRUN_PORT": str(port), **(env or {})}
        base = [binary, "-f", str(REPO / "compose.yaml"), "-p", f"skillrun-e2e-{uuid.uuid4().hex[:8]}",
                *(f"--profile={profile}" for profile in profiles)]

        def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
            return subprocess.run([*base, *args], env=environment, cwd=REPO, capture_output=True, text=True,
                                  timeout=300, check=check)

        projects.append(run)
        run("up", "-d", *arguments)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        return run, url

    yield up
    for run in projects:
        logs = run("logs", "--no-color", check=False).stdout
        run("down", "-v", "--remove-orphans", check=False)
        print(logs[-4000:])


def wait_healthy(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError("the API did not come up within 60 s")


def team_key(run: Run, team: str = "e2e") -> str:
    """A new team and its API key, made with the CLI in the API's container."""
    run("exec", "-T", "api", "skillrun", "teams", "create", team)
    return json.loads(run("exec", "-T", "api", "skillrun", "keys", "create", team, "--json").stdout)["key"]
