"""Teams, API keys and team libraries over HTTP: authentication on every route, library versions, isolation."""

from __future__ import annotations

import io
import json
import tarfile
import time
import zipfile

import pytest

from orchestrator.libraries import LibraryRegistry
from tests.file_server import FileServer
from tests.orchestrator.api_helpers import client, new_team
from worker.roots.archives import FetchLimits


def skill_md(name: str, body: str = "Run scripts/go.sh.\n", description: str | None = None) -> bytes:
    description = json.dumps(description or f"The {name} skill.")  # a YAML string too, escapes and all
    return f"---\nname: {name}\ndescription: {description}\n---\n{body}".encode()


def tar_gz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def zipped(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


V1 = tar_gz({"team-skill/SKILL.md": skill_md("team-skill"), "team-skill/scripts/go.sh": b"echo version one\n"})
V2 = zipped({"team-skill/SKILL.md": skill_md("team-skill"), "team-skill/scripts/go.sh": b"echo version two\n",
             "other-skill/SKILL.md": skill_md("other-skill")})


@pytest.fixture
def server():
    srv = FileServer().start()
    yield srv
    srv.stop()


async def test_every_v1_route_needs_a_valid_unrevoked_key(services):
    key = new_team(services, "team-a")
    async with client(services, None) as anonymous, client(services, "sr_000000000000_" + "x" * 43) as wrong:
        paths = (await anonymous.get("/openapi.json")).json()["paths"]
        routes = [(method.upper(), path) for path, ops in paths.items() if path.startswith("/v1") for method in ops]
        assert len(routes) >= 15
        for method, path in routes:
            url = path.replace("{name}", "n").replace("{run_id}", "r").replace("{session_id}", "s")
            worker_route = path.startswith("/v1/worker/")  # the workers' token opens these; no token set: off
            for c in (anonymous, wrong):
                response = await c.request(method, url.replace("{sha256}", "0" * 64))
                expected = 403 if worker_route and c is wrong else 401
                assert response.status_code == expected, (method, url, response.status_code)
        assert (await anonymous.get("/healthz")).status_code == 200
    async with client(services, key) as ok:
        assert (await ok.get("/v1/skills")).status_code == 200
        services.teams.revoke_key(key.split("_")[1])
        revoked = await ok.get("/v1/skills")
        assert revoked.status_code == 401 and "revoked" in revoked.json()["detail"]


async def test_openapi_declares_the_bearer_scheme(services):
    async with client(services, None) as c:
        doc = (await c.get("/openapi.json")).json()
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert doc["paths"]["/v1/runs"]["post"]["security"] == [{"HTTPBearer": []}]
    assert "security" not in doc["paths"]["/healthz"]["get"]


async def test_a_team_goes_from_an_archive_url_to_runs_on_its_pinned_library(services, server):
    url = server.add("/team.tar.gz", V1)
    async with client(services, new_team(services, "team-a")) as c:
        created = await c.post("/v1/libraries", json={"name": "main", "url": url})
        assert created.status_code == 201, created.text
        body = created.json()
        assert body["current"] == 1 and body["versions"][0]["skill_count"] == 1 and len(body["versions"][0]["sha256"]) == 64
        assert [s["name"] for s in (await c.get("/v1/skills")).json()] == ["team-skill"]
        run = (await c.post("/v1/runs", json={"skill": "team-skill", "command": "bash scripts/go.sh"})).json()
        assert (await c.get(f"/v1/runs/{run['id']}", params={"wait": 30})).json()["result"]["stdout"] == "version one\n"

        upload = await c.post("/v1/libraries/main/upload", params={"filename": "v2.zip"}, content=V2)
        assert upload.status_code == 201, upload.text
        assert upload.json()["current"] == 2
        assert [s["name"] for s in (await c.get("/v1/skills")).json()] == ["other-skill", "team-skill"]
        run = (await c.post("/v1/runs", json={"skill": "team-skill", "command": "bash scripts/go.sh"})).json()
        assert (await c.get(f"/v1/runs/{run['id']}", params={"wait": 30})).json()["result"]["stdout"] == "version two\n"

        pinned = await c.put("/v1/libraries/main/current", json={"version": 1})
        assert pinned.json()["current"] == 1
        run = (await c.post("/v1/runs", json={"skill": "team-skill", "command": "bash scripts/go.sh"})).json()
        assert (await c.get(f"/v1/runs/{run['id']}", params={"wait": 30})).json()["result"]["stdout"] == "version one\n"
        assert (await c.put("/v1/libraries/main/current", json={"version": 9})).status_code == 422
        again = await c.post("/v1/libraries", json={"name": "main", "url": url})
        assert [v["version"] for v in again.json()["versions"]] == [1, 2]  # same bytes, same version
        assert server.hits["/team.tar.gz"] == 2


@pytest.mark.parametrize(
    ("path", "body", "status", "headers", "message"),
    [
        ("/none.tar.gz", tar_gz({"readme.txt": b"hi"}), 200, {}, "no SKILL.md"),
        ("/SKILL.md", b"<html><body>sign in</body></html>", 200, {"Content-Type": "text/html"}, "HTML page"),
        ("/gone.tar.gz", b"", 404, {}, "HTTP 404"),
        ("/broken.tar.gz", b"", 500, {}, "HTTP 500"),
        ("/evil.zip", zipped({"x/SKILL.md": skill_md("x"), "x/../../evil": b"!"}), 200, {}, "climbs out"),
    ],
)
async def test_bad_library_urls_are_refused_with_the_reason(services, server, path, body, status, headers, message):
    url = server.add(path, body, status=status, headers=headers)
    async with client(services, new_team(services, "team-a")) as c:
        response = await c.post("/v1/libraries", json={"name": "lib", "url": url})
        assert response.status_code == 422 and message in response.json()["detail"]
        assert (await c.get("/v1/libraries")).json() == []


@pytest.mark.parametrize("name", ["a/b", "..", "../x", "UPPER", ""])
async def test_library_names_with_slashes_or_dots_are_refused(services, server, name):
    url = server.add("/ok.tar.gz", V1)
    async with client(services, new_team(services, "team-a")) as c:
        response = await c.post("/v1/libraries", json={"name": name, "url": url})
        assert response.status_code == 422 and "body.name" in response.json()["detail"]


async def test_an_upload_that_is_not_an_archive_is_refused(services):
    async with client(services, new_team(services, "team-a")) as c:
        response = await c.post("/v1/libraries/lib/upload", params={"filename": "x.zip"}, content=b"definitely not a zip")
        assert response.status_code == 422 and "not a readable zip" in response.json()["detail"]


async def test_a_url_that_never_finishes_is_refused(services, server):
    def trickle(out):
        for _ in range(60):
            out.write(b"\x1f")
            out.flush()
            time.sleep(0.1)

    services.libraries.limits = FetchLimits(download_seconds=0.5, allow_private_addresses=True)
    async with client(services, new_team(services, "team-a")) as c:
        response = await c.post("/v1/libraries", json={"name": "slow", "url": server.add("/slow.tar.gz", trickle)})
        assert response.status_code == 422 and ("longer than" in response.json()["detail"] or "timed out" in response.json()["detail"])


async def test_team_b_sees_none_of_team_a_s_objects(services, server, model_server):
    a, b = new_team(services, "team-a"), new_team(services, "team-b")
    async with client(services, a) as ca, client(services, b) as cb:
        await ca.post("/v1/libraries", json={"name": "main", "url": server.add("/a.tar.gz", V1)})
        run = (await ca.post("/v1/runs", json={"skill": "team-skill", "command": "bash scripts/go.sh > out/o.txt",
                                               "output_files": ["out/o.txt"], "save_as_artifacts": True,
                                               "workspace_id": "shared-name"})).json()
        await ca.get(f"/v1/runs/{run['id']}", params={"wait": 30})
        await ca.post("/v1/sessions", json={"session_id": "sess"})
        rid = run["id"]
        for method, url in [
            ("GET", f"/v1/runs/{rid}"), ("GET", f"/v1/runs/{rid}?wait=30"), ("GET", f"/v1/runs/{rid}/events"),
            ("POST", f"/v1/runs/{rid}/cancel"),
            ("GET", f"/v1/runs/{rid}/files/out/o.txt"), ("GET", f"/v1/runs/{rid}/artifacts/out/o.txt"),
            ("GET", "/v1/libraries/main"), ("GET", "/v1/sessions/sess"),
        ]:
            response = await cb.request(method, url)
            assert response.status_code == 404, (method, url, response.status_code)
        assert (await cb.put("/v1/libraries/main/current", json={"version": 1})).status_code == 404
        assert (await cb.post("/v1/sessions/sess/messages", json={"text": "hi"})).status_code == 404
        assert (await cb.get("/v1/runs")).json()["count"] == 0
        assert (await cb.get("/v1/libraries")).json() == []
        assert "team-skill" not in [s["name"] for s in (await cb.get("/v1/skills")).json()]
        # the same workspace name in team B is another workspace
        theirs = (await cb.post("/v1/runs", json={"skill": "python-math", "command": "ls out", "workspace_id": "shared-name"})).json()
        done = (await cb.get(f"/v1/runs/{theirs['id']}", params={"wait": 30})).json()
        assert done["result"]["stdout"] == "" and done["workspace_id"] == "team-b.shared-name"
        # team A still sees all of it
        assert (await ca.get(f"/v1/runs/{rid}/artifacts/out/o.txt")).text == "version one\n"


async def test_library_urls_on_private_or_local_addresses_are_refused_by_default(services, server, tmp_path):
    services.libraries = LibraryRegistry(services.teams.docs, tmp_path / "libraries")
    url = server.add("/team.tar.gz", V1)
    async with client(services, new_team(services, "team-a")) as c:
        response = await c.post("/v1/libraries", json={"name": "main", "url": url})
        assert response.status_code == 422 and "private or local address" in response.json()["detail"]
        assert server.hits.get("/team.tar.gz") is None  # refused before any request was sent
