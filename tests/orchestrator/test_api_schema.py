"""The OpenAPI document tells the truth: schemathesis (``st run --checks all``) against the real API on loopback.

The API runs under uvicorn with a real Redis (the run queue, teams and libraries), a team and its key. Every
operation gets a bounded number of generated cases; the run fails on any 5xx, undeclared status, body that is not
the declared shape, schema-valid data refused (but the content checks ``schemathesis.toml`` names) and more.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from orchestrator.dispatch import QueueDispatcher
from orchestrator.documents import RedisDocuments
from orchestrator.libraries import LibraryRegistry
from tests.orchestrator.api_helpers import api_in_a_thread, make_services, new_team
from worker.artifacts import FileArtifactStore

CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES_PER_OPERATION = 10


@pytest.fixture
def api_url(redis_url, shared_dir):
    services = make_services(QueueDispatcher(redis_url), FileArtifactStore(shared_dir / "artifacts"),
                             shared_dir / "data", documents=RedisDocuments(redis_url))
    services.libraries = LibraryRegistry(services.teams.docs, shared_dir / "libraries")  # private URLs refused
    key = new_team(services, "team-a")
    with api_in_a_thread(services) as url:
        yield url, key


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_openapi_document_matches_what_the_api_answers(api_url, tmp_path):
    url, key = api_url
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    assert st, "schemathesis is not installed: pip install '.[test]'"
    done = subprocess.run(
        [st, "--config-file", str(CONFIG), "run", f"{url}/openapi.json", "--checks", "all",
         "--max-examples", str(EXAMPLES_PER_OPERATION), "--request-timeout", "30", "--no-color",
         "--header", f"Authorization: Bearer {key}"],
        capture_output=True, text=True, timeout=280, cwd=tmp_path,
    )
    summary = done.stdout[done.stdout.rfind("SUMMARY"):]
    print(summary)
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-2000:]
    operations = sum(len(methods) for methods in httpx.get(f"{url}/openapi.json").json()["paths"].values())
    assert f"Tested: {operations}" in summary and "generated" in summary, summary  # every operation was reached
