"""Library versions are bounded: a library keeps its newest versions and its current one, a team its limit of
libraries; a removed version's folder and archive go unless another library holds the same bytes."""

from __future__ import annotations

from tests.orchestrator.api_helpers import client, new_team
from tests.orchestrator.test_api_teams import skill_md, tar_gz


def _version(n: int) -> bytes:
    return tar_gz({"team-skill/SKILL.md": skill_md("team-skill"), "team-skill/n.txt": f"{n}\n".encode()})


async def test_a_library_keeps_its_newest_versions_and_its_current_one(services):
    services.libraries.versions_kept = 2
    store = services.libraries.dir
    async with client(services, new_team(services, "team-a")) as c:
        shas = []
        for n in range(3):
            answer = await c.post("/v1/libraries/main/upload", params={"filename": "v.tgz"}, content=_version(n))
            assert answer.status_code == 201, answer.text
            shas.append(answer.json()["versions"][-1]["sha256"])
        assert [v["version"] for v in (await c.get("/v1/libraries/main")).json()["versions"]] == [2, 3]
        assert not (store / shas[0]).exists() and not (store / "archives" / shas[0]).exists()
        assert all((store / sha).is_dir() and (store / "archives" / sha).is_file() for sha in shas[1:])

        assert (await c.put("/v1/libraries/main/current", json={"version": 2})).status_code == 200
        await c.post("/v1/libraries/main/upload", params={"filename": "v.tgz"}, content=_version(3))
        kept = (await c.get("/v1/libraries/main")).json()
        assert [v["version"] for v in kept["versions"]] == [3, 4] and kept["current"] == 4  # the new one is current

        other = await c.post("/v1/libraries/other/upload", params={"filename": "v.tgz"}, content=_version(3))
        assert other.status_code == 201  # the same bytes in another library
        for n in (5, 6):
            await c.post("/v1/libraries/main/upload", params={"filename": "v.tgz"}, content=_version(n))
        held = other.json()["versions"][0]["sha256"]
        assert (store / held).is_dir() and (store / "archives" / held).is_file()  # another library still holds it


async def test_a_team_past_its_library_limit_is_refused_with_what_to_do(services):
    services.libraries.max_libraries = 2
    async with client(services, new_team(services, "team-a")) as c:
        for name in ("one", "two"):
            assert (await c.post(f"/v1/libraries/{name}/upload", content=_version(0))).status_code == 201
        refused = await c.post("/v1/libraries/three/upload", content=_version(1))
        assert refused.status_code == 409 and "its limit" in refused.json()["detail"]
        assert [lib["name"] for lib in (await c.get("/v1/libraries")).json()] == ["one", "two"]
        assert (await c.post("/v1/libraries/one/upload", content=_version(2))).status_code == 201  # a new version: fine
