"""Attacks on workers on many machines (issue #15): the worker-token route that serves library archives by digest,
the worker's fetch of them, the node ids and placement of kept workspaces, and the artifact stores.

A team (an API key holder) is hostile: it submits any run request and any skill command (untrusted code running as
its workspace's sandbox user). Another team's data, the worker token, S3 credentials and the host must stay out of
its reach; its runs must not send another team's workspace to the wrong node, lose it, or serve it to the wrong team;
nothing it creates may grow without bound; a bad request gets a clear 4xx.

Each attack runs against the real code (the FastAPI app, the worker's fetcher and extraction, the local runtime's
sandbox as root, a real Redis). Attacks that are blocked are asserted blocked; the ones that get through are written
as the safe behaviour and marked ``xfail(strict=True)`` with what gets through, so fixing a hole turns its test into
a failure to be unmarked.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import logging
import os
import tarfile
import time
import zipfile
from pathlib import Path

import httpx
import pytest
import redis
from pydantic import SecretStr
from rq import Queue

from orchestrator.api import auth
from orchestrator.dispatch import QueueDispatcher
from tests.file_server import FileServer
from tests.orchestrator.api_helpers import client, make_services, new_team
from tests.orchestrator.test_api_teams import V1, skill_md, tar_gz
from tests.orchestrator.test_worker_libraries import TOKEN, elsewhere, server  # noqa: F401 - fixtures
from tests.services import ensure_installed
from worker.jobs import nodes
from worker.artifacts import FileArtifactStore
from worker.config import get_worker_settings
from worker.contract import RunRequest, SkillRef
from worker.errors import ArtifactError
from worker.roots.library_fetch import LIBRARY_ROUTE, locate, skill_root_in_use
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

SHA_V1 = hashlib.sha256(V1).hexdigest()
AWS_SECRET = "aws-secret-" + "q" * 30
AWS_KEY_ID = "AKIA" + "Z" * 16


def _far_ref(digest: str = SHA_V1, name: str = "team-skill") -> SkillRef:
    """A skill as the API names it, seen from a host where the API's libraries folder does not exist."""
    return SkillRef(name=name, root=f"/srv/api-host/libraries/{digest}", path=name, digest=digest)


def _cache_entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name != "urls") if cache.exists() else []


async def _register_v1(services) -> str:
    key = new_team(services, "team-a")
    async with client(services, key) as c:
        response = await c.post("/v1/libraries/main/upload", params={"filename": "v1.tgz"}, content=V1)
        assert response.status_code == 201, response.text
    return key


# ---- 1. the worker route: odd digests, credentials, constant-time compare ---------------------------------------

ODD_DIGESTS = [
    SHA_V1.upper(),                                   # uppercase hex: not the digest's spelling
    SHA_V1[:63],                                      # one short
    SHA_V1 + "0",                                     # one long
    SHA_V1 + "%0A",                                   # a trailing newline ('$' in a Python regex lets one through)
    SHA_V1 + "%00",                                   # a NUL
    "..%2F" + SHA_V1[5:],                             # an encoded climb
    "..%2F..%2F..%2F..%2F..%2Fetc%2Fpasswd",
    "%2E%2E/%2E%2E/registry",                         # dots, encoded
    SHA_V1[:60] + "%2F..",
    "\u0661" * 64,                                    # Arabic-Indic digits: \d would take them
    " " + SHA_V1[1:],
]


async def test_odd_digests_on_the_worker_route_get_a_4xx_and_never_a_file(services):
    services.worker_token = SecretStr(TOKEN)
    await _register_v1(services)
    # Something worth stealing beside the archives: the registry's files and an extracted version's folder.
    assert (services.libraries.dir / SHA_V1).is_dir()
    async with client(services, TOKEN) as worker:
        assert (await worker.get(LIBRARY_ROUTE.format(SHA_V1))).status_code == 200
        for odd in ODD_DIGESTS:
            response = await worker.get(f"/v1/worker/libraries/{odd}")
            assert response.status_code in (404, 422), f"{odd!r}: {response.status_code} {response.text[:200]}"
            assert response.headers["content-type"].startswith("application/json"), f"{odd!r} served a file"
            assert b"team-skill" not in response.content


async def test_a_folder_where_an_archive_would_be_is_not_served(services):
    """The route serves kept archive files only: a folder named by a digest in the archives folder answers 404."""
    services.worker_token = SecretStr(TOKEN)
    await _register_v1(services)
    archives = services.libraries.dir / "archives"
    (archives / ("1" * 64)).mkdir()
    async with client(services, TOKEN) as worker:
        response = await worker.get(LIBRARY_ROUTE.format("1" * 64))
    assert response.status_code == 404, response.text


async def test_only_the_worker_token_opens_the_worker_route_and_it_opens_nothing_else(services):
    services.worker_token = SecretStr(TOKEN)
    key = await _register_v1(services)
    route = LIBRARY_ROUTE.format(SHA_V1)
    near_misses = [TOKEN[:-1], TOKEN + "s", TOKEN.upper(), TOKEN[1:], key, TOKEN[:-1] + "\u00e9"]
    transport = httpx.ASGITransport(app=services_app(services))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as raw:
        for wrong in near_misses:
            response = await raw.get(route, headers={"Authorization": f"Bearer {wrong}".encode()})
            assert response.status_code == 401, f"{wrong!r}: {response.status_code}"
            assert TOKEN not in response.text and wrong.strip() not in response.text
        for header in ({"Authorization": b"Bearer \xff\xfe" + TOKEN.encode()}, {"Authorization": f"Basic {TOKEN}"},
                       {"Authorization": "Bearer"}, {"Authorization": "Bearer "}, {"X-Worker-Token": TOKEN}, {}):
            response = await raw.get(route, headers=header)
            assert response.status_code == 401, f"{header!r}: {response.status_code} {response.text[:200]}"
        # The worker token is not a team key: no team route opens with it.
        for path in ("/v1/runs", "/v1/libraries", "/v1/workspaces", "/v1/skills"):
            response = await raw.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert response.status_code == 401, f"{path} opened with the worker token: {response.status_code}"


def services_app(services):
    from orchestrator.api import create_app

    return create_app(services=services)


async def test_the_worker_token_is_compared_in_constant_time(services, monkeypatch):
    services.worker_token = SecretStr(TOKEN)
    compared = []
    real = auth.hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    async with client(services, "x" * len(TOKEN)) as wrong, client(services, TOKEN) as right:
        assert (await wrong.get(LIBRARY_ROUTE.format("0" * 64))).status_code == 401
        assert (await right.get(LIBRARY_ROUTE.format("0" * 64))).status_code == 404
    assert len(compared) == 2, "the token was not compared with hmac.compare_digest (a timing oracle)"
    assert all(isinstance(a, bytes) and isinstance(b, bytes) for a, b in compared)


# ---- 2. the worker's fetch: the token stays with the API ------------------------------------------------------


@pytest.mark.parametrize("answer", ["401", "500", "wrong-bytes", "html", "stall-refused"])
async def test_the_token_is_in_no_error_or_log_of_a_failed_fetch(server, elsewhere, caplog, answer):
    route = LIBRARY_ROUTE.format(SHA_V1)
    if answer == "401":
        server.add(route, b'{"detail": "wrong worker token"}', status=401)
    elif answer == "500":
        server.add(route, b"Internal Server Error", status=500)
    elif answer == "wrong-bytes":
        server.add(route, tar_gz({"x/SKILL.md": skill_md("x")}))
    elif answer == "html":
        server.add(route, b"<html>login</html>", headers={"Content-Type": "text/html"})
    cache = elsewhere(server.url("") if answer != "stall-refused" else "http://127.0.0.1:9")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(RuntimeError) as failure:
        with skill_root_in_use(_far_ref()):
            pass
    assert TOKEN not in str(failure.value), f"the worker token is in the run's error: {failure.value}"
    assert TOKEN not in caplog.text, "the worker token is in the worker's logs"
    assert _cache_entries(cache) == []


async def test_a_malformed_worker_token_does_not_leak_into_the_run_s_error(server, elsewhere):
    route = LIBRARY_ROUTE.format(SHA_V1)
    server.add(route, V1)
    for token in (TOKEN + "\n", " " + TOKEN):
        elsewhere(server.url(""), token=token)
        with pytest.raises((RuntimeError, ValueError)) as failure:  # refused at the settings, or the fetch failing
            with skill_root_in_use(_far_ref()):
                pass
        assert TOKEN not in str(failure.value), f"the worker token is in the run's error: {failure.value}"


async def test_a_malformed_worker_token_does_not_reach_the_run_record(server, elsewhere):
    """A worker whose token has a line end (a secret made with echo or --from-file) does not start at all: its
    settings are refused, without the token in the message, before any run could carry it."""
    from worker.config import get_worker_settings

    elsewhere(server.url(""), token=TOKEN + "\n")
    with pytest.raises(ValueError) as refused:
        get_worker_settings()
    assert "visible ASCII" in str(refused.value) and TOKEN not in str(refused.value), str(refused.value)


def test_the_located_root_of_a_fetched_library_does_not_show_the_token(elsewhere):
    elsewhere("http://api.internal:8000")
    located = locate(_far_ref())
    assert located.remote and located.headers, "the library is fetched with the token"
    assert TOKEN not in repr(located), repr(located)


@pytest.mark.parametrize("where", ["other-port", "other-name"])
async def test_the_token_does_not_follow_a_redirect_off_the_api_s_origin(server, elsewhere, where):
    other = FileServer().start()
    try:
        target = {"other-port": other.url("/v1.tgz"),
                  "other-name": f"http://localhost:{server.port}/v1.tgz"}[where]
        other.add("/v1.tgz", V1)
        server.add("/v1.tgz", V1)
        route = LIBRARY_ROUTE.format(SHA_V1)
        server.add(route, b"", status=307, headers={"Location": target})
        cache = elsewhere(server.url(""))
        with skill_root_in_use(_far_ref()) as folder:
            assert (folder / "team-skill" / "SKILL.md").is_file()
        assert server.headers[route][0]["Authorization"] == f"Bearer {TOKEN}"
        seen = (other.headers.get("/v1.tgz") or []) + (server.headers.get("/v1.tgz") or [])
        assert seen and all("Authorization" not in h for h in seen), f"the token followed the redirect: {seen}"
        assert _cache_entries(cache) == [SHA_V1]
    finally:
        other.stop()


async def test_a_skill_ref_with_an_odd_digest_never_sends_the_token_off_the_library_route(server, elsewhere):
    server.add("/v1/runs", b"{}")
    elsewhere(server.url(""))
    try:
        with skill_root_in_use(_far_ref("../../../v1/runs")):
            pass
    except (RuntimeError, ValueError):
        pass
    assert "/v1/runs" not in server.headers, "the worker token was sent to another route of the API"


@pytest.mark.slow
async def test_a_team_cannot_grow_the_api_s_library_store_without_bound(services):
    key = new_team(services, "team-a")
    uploads = 150
    refused = 0
    async with client(services, key) as c:
        for i in range(uploads):
            archive = tar_gz({"team-skill/SKILL.md": skill_md("team-skill"), "team-skill/n.txt": f"{i}\n".encode()})
            response = await c.post(f"/v1/libraries/lib{i % 3}/upload", params={"filename": "v.tgz"}, content=archive)
            assert response.status_code in (201, 409, 413, 429), response.text
            refused += response.status_code != 201
    kept = len(list((services.libraries.dir / "archives").iterdir()))
    folders = sum(1 for p in services.libraries.dir.iterdir() if len(p.name) == 64)
    assert refused or kept < uploads or folders < uploads, f"{kept} archives and {folders} versions kept, none refused"


# ---- 3. hostile archives served under their own digest ----------------------------------------------------------


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def _hostile(kind: str, outside: Path) -> bytes:
    good = _file("team-skill/SKILL.md", skill_md("team-skill"))
    if kind == "symlink-out":
        return _tar([good, _link("team-skill/scripts", str(outside.parent))])
    if kind == "hardlink-out":
        return _tar([good, _link("team-skill/passwd", "/etc/passwd", tarfile.LNKTYPE)])
    if kind == "dotdot":
        return _tar([good, _file(f"team-skill/../../../../../../{outside.relative_to('/')}", b"planted")])
    if kind == "absolute":
        return _tar([good, _file(str(outside), b"planted")])
    if kind == "setuid":
        info, data = _file("team-skill/run", b"#!/bin/sh\n")
        info.mode = 0o4777
        return _tar([good, (info, data)])
    if kind == "gzip-bomb":
        body = io.BytesIO()
        with tarfile.open(fileobj=body, mode="w") as tar:
            info, data = _file("team-skill/SKILL.md", skill_md("team-skill"))
            tar.addfile(info, io.BytesIO(data))
            info = tarfile.TarInfo("team-skill/zeros")
            info.size = 600 * 1024 * 1024
            tar.addfile(info, io.BytesIO(bytes(info.size)))
        return gzip.compress(body.getvalue(), compresslevel=9)
    if kind == "zip-symlink":
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as z:
            z.writestr("team-skill/SKILL.md", skill_md("team-skill"))
            link = zipfile.ZipInfo("team-skill/etc")
            link.external_attr = (0o120777 << 16)
            z.writestr(link, "/etc")
        return out.getvalue()
    if kind == "zip-bomb":
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("team-skill/SKILL.md", skill_md("team-skill"))
            z.writestr("team-skill/zeros", bytes(300 * 1024 * 1024))
        return out.getvalue()
    raise AssertionError(kind)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["symlink-out", "hardlink-out", "dotdot", "absolute", "gzip-bomb", "zip-symlink",
                                  "zip-bomb"])
async def test_a_hostile_archive_under_its_own_digest_is_refused_by_the_worker(server, elsewhere, shared_dir, kind):
    """Were the API's archives folder tampered with (or its limits looser than a worker's), the worker checks the
    archive it fetched as any URL root: the digest matches, yet nothing unsafe is extracted or cached."""
    outside = shared_dir / "outside" / "planted.txt"
    outside.parent.mkdir()
    data = _hostile(kind, outside)
    digest = hashlib.sha256(data).hexdigest()
    server.add(LIBRARY_ROUTE.format(digest), data)
    cache = elsewhere(server.url(""))
    with pytest.raises(RuntimeError) as refused:
        with skill_root_in_use(_far_ref(digest)):
            pass
    assert "sha256" not in str(refused.value), f"refused for its digest, not its content: {refused.value}"
    assert _cache_entries(cache) == [], f"{kind}: something was cached"
    assert not outside.exists(), f"{kind}: a file was written outside the cache"
    assert not list(cache.rglob("tmp-*")), "a temporary folder was left behind"


async def test_a_setuid_entry_is_extracted_without_its_setuid_bit(server, elsewhere, shared_dir):
    data = _hostile("setuid", shared_dir / "x")
    digest = hashlib.sha256(data).hexdigest()
    server.add(LIBRARY_ROUTE.format(digest), data)
    elsewhere(server.url(""))
    with skill_root_in_use(_far_ref(digest)) as folder:
        mode = (folder / "team-skill" / "run").stat().st_mode
    assert not mode & 0o7000 and not mode & 0o002, oct(mode)


async def test_a_version_the_api_registered_is_readable_on_a_remote_worker(services, server, elsewhere):
    services.worker_token = SecretStr(TOKEN)
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("team-skill/SKILL.md", skill_md("team-skill"))
        z.writestr("team-skill/scripts/go.sh", "echo zipped\n")
    data = b"#!/bin/sh\nexec unzip \"$0\"\n" + inner.getvalue()
    key = new_team(services, "team-a")
    async with client(services, key) as c:
        response = await c.post("/v1/libraries/sfx/upload", params={"filename": "lib.zip"}, content=data)
    assert response.status_code == 201, response.text  # the API extracted it
    digest = hashlib.sha256(data).hexdigest()
    server.add(LIBRARY_ROUTE.format(digest), services.libraries.archive(digest).read_bytes())
    elsewhere(server.url(""))
    with skill_root_in_use(_far_ref(digest)) as folder:
        assert (folder / "team-skill" / "scripts" / "go.sh").is_file()


# ---- 4. the sandbox: the worker's secrets, its node id and the other teams' data --------------------------------

SECRETS = {"SKILLRUN_WORKER_TOKEN": TOKEN, "AWS_SECRET_ACCESS_KEY": AWS_SECRET, "AWS_ACCESS_KEY_ID": AWS_KEY_ID,
           "SKILLRUN_REDIS_URL": "redis://:redis-password-" + "r" * 20 + "@10.0.0.5:6379/0"}
SNOOP = r"""
env
tr '\0' '\n' < /proc/self/environ
for f in /proc/[0-9]*/environ /proc/[0-9]*/task/*/environ; do echo "== $f"; tr '\0' '\n' < "$f"; done 2>&1
for f in /proc/[0-9]*/cmdline; do echo "== $f"; tr '\0' ' ' < "$f"; echo; done 2>&1
ls -la /proc /run /var/run /var/lib /root /home 2>&1
cat /run/secrets/* /var/run/secrets/kubernetes.io/serviceaccount/* ~/.aws/credentials /root/.aws/credentials 2>&1
grep -r -l -s -e "$(printf 'worker-token-')" /etc /tmp /dev/shm 2>&1 | head
true
"""


@pytest.mark.root
@pytest.mark.parametrize("mode", ["direct", "spawner", "network"])
async def test_a_command_finds_no_worker_secret_in_its_environment_or_proc(
        monkeypatch, work_root, library, mode):
    if mode == "network":
        ensure_installed("slirp4netns", "slirp4netns")
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    runtime = LocalWorkspaceRuntime(work_root, spawners="off" if mode == "direct" else "eager",
                                    allow_network=mode == "network")
    try:
        outputs = []
        for _ in range(3):  # the first run in a sandbox of its own, then the held sandbox and its ready shell
            result = await runtime.run(RunRequest(
                skill=SkillRef(name="demo", root=str(library), path="demo"), command=SNOOP, workspace_id="team-a.snoop",
                keep_workspace=True, network=mode == "network"))
            assert result.exit_code == 0, result.stderr
            outputs.append(result.stdout + result.stderr)
    finally:
        await runtime.close()
    seen = "\n".join(outputs)
    assert "/proc/1/environ" in seen, "the snoop did not run"
    for name, value in SECRETS.items():
        assert value not in seen, f"{name} of the worker reached the command ({mode})"
        assert f"{name}=" not in seen, f"{name} is set in the command's environment ({mode})"


@pytest.mark.root
async def test_a_command_can_neither_read_nor_change_the_node_id_nor_see_other_teams_artifacts(work_root, library):
    node = nodes.node_id(work_root)
    node_file = work_root / ".skillrun" / nodes.NODE_FILE
    assert not node_file.stat().st_mode & 0o022, "the node id is writable by others"
    runtime = LocalWorkspaceRuntime(work_root)
    theirs = runtime.artifact_store.save_bytes("team-b.private", "out/secret.txt", b"team-b-secret-bytes", "text/plain")
    assert theirs.version == 1
    command = f"""
W={work_root}
cat $W/.skillrun/node-id
echo ffffffffffffffff > $W/.skillrun/node-id
rm -f $W/.skillrun/node-id; ln -s /tmp/x $W/.skillrun/node-id
mkdir -p $W/.skillrun && echo ffffffffffffffff > $W/.skillrun/node-id
ls -la $W $W/.skillrun $W/.skillrun/artifacts 2>&1
cat $W/.skillrun/artifacts/team-b.private/*/1/data
find / -xdev -name node-id 2>/dev/null
true
"""
    try:
        result = await runtime.run(RunRequest(
            skill=SkillRef(name="demo", root=str(library), path="demo"), command=command, workspace_id="team-a.nodes",
            keep_workspace=False))
    finally:
        await runtime.close()
    seen = result.stdout + result.stderr
    assert node not in seen, "the command read the node id"
    assert "team-b-secret-bytes" not in seen, "another team's artifact was read"
    # What the command made of "<work root>/.skillrun" lives in its sandbox's own view of the work root only.
    assert "ws_team-a.nodes" in seen and "artifacts" not in seen.replace(".skillrun/artifacts", ""), seen[-800:]
    assert node_file.read_text().strip() == node and nodes.node_id(work_root) == node, "the node id was changed"
    assert not node_file.is_symlink()


@pytest.mark.root
async def test_a_fetched_library_shows_a_command_its_own_skill_and_not_the_cache_s_other_versions(
        server, elsewhere, shared_dir):
    """Two teams' versions sit side by side in a worker's URL-root cache; a run of team-a's sees neither team-b's
    version nor the cache's listing."""
    theirs = tar_gz({"team-b-skill/SKILL.md": skill_md("team-b-skill"),
                     "team-b-skill/secret.txt": b"team-b-library-secret\n"})
    their_sha = hashlib.sha256(theirs).hexdigest()
    server.add(LIBRARY_ROUTE.format(SHA_V1), V1)
    server.add(LIBRARY_ROUTE.format(their_sha), theirs)
    cache = elsewhere(server.url(""))
    with skill_root_in_use(_far_ref(their_sha, "team-b-skill")):
        pass
    assert _cache_entries(cache) == sorted([their_sha])
    runtime = LocalWorkspaceRuntime(shared_dir / "other-host-work")
    command = f"""
ls -la {cache} {cache}/{their_sha} 2>&1
cat {cache}/{their_sha}/team-b-skill/secret.txt 2>&1
cat $(dirname $(readlink -f skills/team-skill/SKILL.md 2>/dev/null || readlink -f $SKILL_DIR/SKILL.md))/../*/secret.txt 2>&1
find / -name secret.txt -xdev 2>/dev/null
bash skills/team-skill/scripts/go.sh 2>&1 || bash scripts/go.sh
true
"""
    try:
        result = await runtime.run(RunRequest(skill=_far_ref(), command=command, workspace_id="team-a.lib"))
    finally:
        await runtime.close()
    seen = result.stdout + result.stderr
    assert "version one" in seen, f"the run did not use its own library: {seen[-500:]}"
    assert "team-b-library-secret" not in seen, "team-b's library version was read from team-a's run"
    assert their_sha not in seen.replace(f"{cache}/{their_sha}", ""), "the cache's listing was seen"


@pytest.mark.root
async def test_a_worker_s_command_reaches_neither_redis_nor_the_api_and_cannot_ask_for_network(
        redis_url, server, library, shared_dir, monkeypatch):
    """With workers on many machines Redis and the API listen on the network, not on loopback: a command that
    reached them could forge jobs (RQ calls any importable function a job names) or fetch any library with a
    stolen token. A worker's runtime (built as ``skillrun worker`` builds it) gives commands no network at all and
    refuses runs that ask for one."""
    from worker.jobs import execute as jobs
    from worker.errors import InvalidRunRequestError

    monkeypatch.setenv("SKILLRUN_WORK_ROOT", str(shared_dir / "worker-work"))
    get_worker_settings.cache_clear()
    monkeypatch.setattr(jobs, "_runtimes", {})
    redis_port = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs["port"]
    probe = f"""
for target in 127.0.0.1/{redis_port} 127.0.0.1/{server.port}; do
  if (exec 3<>/dev/tcp/${{target%/*}}/${{target#*/}}) 2>/dev/null; then echo "REACHED $target"; else echo "no $target"; fi
done
cat /proc/net/tcp 2>&1 | wc -l; ip -o addr 2>&1 || true
"""
    runtime = jobs.runtime_for("local")
    try:
        result = await runtime.run(RunRequest(skill=SkillRef(name="demo", root=str(library), path="demo"),
                                              command=probe))
        with pytest.raises(InvalidRunRequestError, match="network"):
            await runtime.run(RunRequest(skill=SkillRef(name="demo", root=str(library), path="demo"), command="true",
                                         network=True))
    finally:
        await runtime.close()
        get_worker_settings.cache_clear()
    assert "no 127.0.0.1" in result.stdout, result.stdout + result.stderr
    assert "REACHED" not in result.stdout, f"a worker's command reached Redis or the API: {result.stdout}"


# ---- 5. placement: namespacing, lost workspaces, what a run leaves in Redis -------------------------------------


@pytest.fixture
async def queue_services(redis_url, shared_dir):
    dispatcher = QueueDispatcher(redis_url)
    built = make_services(dispatcher, FileArtifactStore(shared_dir / "artifacts"), shared_dir / "data")
    yield built
    await built.close()


def _beat(connection: redis.Redis, node: str, ago: float = 0.0) -> None:
    connection.zadd(nodes.nodes_key("local"), {node: time.time() - ago})


async def test_two_teams_naming_one_workspace_never_share_it_nor_its_node(queue_services):
    services = queue_services
    connection = services.dispatcher.redis
    for node in ("a" * 16, "b" * 16):
        _beat(connection, node)
    keys = {team: new_team(services, team) for team in ("team-a", "team-b", "team-a-b")}
    placed = {}
    for team, workspace in (("team-a", "shared"), ("team-b", "shared"), ("team-b", "team-a.shared"),
                            ("team-a-b", "shared"), ("team-a", "b.shared")):
        async with client(services, keys[team]) as c:
            response = await c.post("/v1/runs", json={"skill": "python-math", "command": "true",
                                                      "workspace_id": workspace})
        assert response.status_code == 202, response.text
        workspace_id = response.json()["workspace_id"]
        assert workspace_id == f"{team}.{workspace}"
        entry = services.dispatcher.store.workspaces.get(workspace_id)
        assert entry.owner == team and entry.node in ("a" * 16, "b" * 16)
        placed[workspace_id] = entry
    assert len(placed) == 5, "two teams' workspaces share an id"
    async with client(services, keys["team-b"]) as c:
        listed = (await c.get("/v1/workspaces")).json()
    assert {w["id"] for w in listed["data"]} == {"team-b.shared", "team-b.team-a.shared"}


async def test_odd_and_long_workspace_ids_get_a_4xx_and_never_a_500(queue_services):
    services = queue_services
    long_team = "t" * 32
    key = new_team(services, long_team)
    async with client(services, key) as c:
        for workspace in ("w" * 31, "a" * 32, ".hidden", "..", "a/b", "a b", "x\n", "-x", "\u0430" * 3, "a" * 200):
            response = await c.post("/v1/runs", json={"skill": "python-math", "command": "true",
                                                      "workspace_id": workspace})
            assert response.status_code in (202, 409, 422), f"{workspace!r}: {response.status_code} {response.text}"
            if response.status_code == 202:
                assert response.json()["workspace_id"] == f"{long_team}.{workspace}"


async def test_a_one_off_run_of_a_lost_workspace_is_refused_at_once(queue_services):
    services = queue_services
    connection = services.dispatcher.redis
    node = "c" * 16
    _beat(connection, node)
    key = new_team(services, "team-a")
    async with client(services, key) as c:
        first = await c.post("/v1/runs", json={"skill": "python-math", "command": "true", "workspace_id": "w"})
        assert first.status_code == 202 and services.dispatcher.store.workspaces.node("team-a.w") == node
        _beat(connection, node, ago=nodes.NODE_GONE_SECONDS + 5)
        kept = await c.post("/v1/runs", json={"skill": "python-math", "command": "true", "workspace_id": "w"})
        assert kept.status_code == 409 and "workspace_lost" in kept.text
        one_off = await c.post("/v1/runs", json={"skill": "python-math", "command": "true", "workspace_id": "w",
                                                 "keep_workspace": False})
    assert one_off.status_code == 409 and "workspace_lost" in one_off.text, one_off.text


async def test_what_runs_queued_on_a_gone_node_leave_in_redis_goes_with_the_node(queue_services, monkeypatch):
    from orchestrator.dispatch import stranded

    monkeypatch.setattr(stranded, "STRANDED_SECONDS", 0.0)
    services = queue_services
    dispatcher = services.dispatcher
    connection = dispatcher.redis
    node = "d" * 16
    _beat(connection, node)
    key = new_team(services, "team-a")
    async with client(services, key) as c:
        for _ in range(5):
            response = await c.post("/v1/runs", json={"skill": "python-math", "command": "true", "workspace_id": "w"})
            assert response.status_code == 202
    queue_key = Queue.redis_queue_namespace_prefix + nodes.node_queue_name("local", node)
    queued = connection.llen(queue_key) + dispatcher.gate.depth(nodes.node_queue_name("local", node))
    assert queued == 5  # on the node's queue, and in the team's line beside it
    _beat(connection, node, ago=nodes.NODE_GONE_SECONDS + 5)
    dispatcher.requeue_stranded()  # the runs fail: workspace_lost
    _beat(connection, node, ago=nodes.NODE_FORGET_SECONDS + 5)
    assert dispatcher.placement.forget_gone("local") == 1
    left = [k.decode() for k in connection.scan_iter("rq:job:*")]
    assert left == [], f"{len(left)} job hashes of a forgotten node's queue stay for good (TTL {connection.ttl(left[0])})"


async def test_a_run_cannot_name_another_team_s_run_or_artifact(services, library):
    """Downloads go by the run's record, whose team is checked: team-b cannot read team-a's artifact, whatever
    name or id it tries (traversal in the name included)."""
    key_a, key_b = new_team(services, "team-a"), new_team(services, "team-b")
    async with client(services, key_a) as a:
        made = await a.post("/v1/runs", json={
            "skill": "python-math", "command": "echo team-a-private > out/r.txt",
            "output_files": ["out/*"], "save_as_artifacts": True, "workspace_id": "arts"})
        assert made.status_code == 202, made.text
        run_id = made.json()["id"]
        deadline = time.monotonic() + 60
        while (record := (await a.get(f"/v1/runs/{run_id}")).json())["status"] in ("queued", "started"):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert record["status"] == "finished", record
        assert (await a.get(f"/v1/runs/{run_id}/artifacts/out/r.txt")).content == b"team-a-private\n"
    async with client(services, key_b) as b:
        mine = await b.post("/v1/runs", json={"skill": "python-math", "command": "true", "workspace_id": "arts"})
        my_run = mine.json()["id"]
        for path in (f"/v1/runs/{run_id}/artifacts/out/r.txt", f"/v1/runs/{run_id}/files/out/r.txt",
                     f"/v1/runs/{my_run}/artifacts/out/r.txt", f"/v1/runs/{my_run}/artifacts/../{run_id}/out/r.txt",
                     f"/v1/runs/{my_run}/artifacts/..%2F..%2Fteam-a.arts%2Fout%252Fr.txt%2F1%2Fdata"):
            response = await b.get(path)
            assert response.status_code in (404, 410, 422), f"{path}: {response.status_code}"
            assert b"team-a-private" not in response.content


# ---- 6. artifact stores: keys from scopes and names --------------------------------------------------------------


@pytest.mark.parametrize("scope", ["../team-b.x", "team-b.x/..", "/abs", ".", "..", "a/b", "", "x" * 65, "a\0b"])
def test_an_artifact_scope_that_is_no_workspace_id_is_refused(artifact_store, scope):
    with pytest.raises(ArtifactError):
        artifact_store.save_bytes(scope, "out/x.txt", b"x", "text/plain")
    assert artifact_store.list(scope) == []


@pytest.mark.parametrize("name", ["../../team-b.x/out%2Fs.txt", "out/../../team-b.x", "/etc/passwd", "a/../../b"])
def test_an_artifact_name_with_slashes_stays_one_key_in_its_scope(artifact_store, name):
    saved = artifact_store.save_bytes("team-a.x", name, b"mine", "text/plain")
    assert artifact_store.load("team-a.x", name, saved.version) == b"mine"
    assert [a.name for a in artifact_store.list("team-a.x")] == [name]
    assert artifact_store.list("team-b.x") == []


def test_an_artifact_named_dot_dot_is_refused_or_kept_in_its_scope(shared_dir):
    store = FileArtifactStore(shared_dir / "artifacts")
    for name in ("..", "."):
        try:
            store.save_bytes("team-a.x", name, b"dots", "text/plain")
        except ArtifactError:
            continue
    stray = [p for p in (shared_dir / "artifacts").glob("*") if p.name != "team-a.x"]
    assert stray == [], f"an artifact was written outside its scope: {stray}"
    assert not (shared_dir / "artifacts" / "team-a.x" / "1").exists(), "'.' wrote a version folder as a name"


def test_a_blob_url_with_credentials_is_refused_without_echoing_them():
    from worker.artifacts.location import check_blob_url

    for url in (f"s3://{AWS_KEY_ID}:{AWS_SECRET}@bucket/prefix", f"file://u:{AWS_SECRET}@localhost/srv/artifacts"):
        with pytest.raises(ValueError) as refused:
            check_blob_url(url)
        assert AWS_SECRET not in str(refused.value), str(refused.value)


def test_credentials_in_the_blob_url_s_endpoint_are_refused_and_never_reach_an_error(monkeypatch):
    from worker.artifacts.location import check_blob_url, create_artifact_store
    from worker.errors import BlobStoreError

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "other-" + AWS_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    url = f"s3://bucket/prefix?endpoint=http://minio:{AWS_SECRET}@127.0.0.1:9"
    try:
        check_blob_url(url)
    except ValueError as refused:
        assert AWS_SECRET not in str(refused), str(refused)
        return
    store = create_artifact_store(url, None)
    with pytest.raises(BlobStoreError) as away:
        store.open("team-a.x", "out/report.pdf")
    assert AWS_SECRET not in str(away.value), f"the credentials reach the 503 a team reads: {away.value}"


def test_the_s3_store_s_credentials_come_from_the_environment_and_not_into_its_url_or_errors(s3_server, monkeypatch):
    store = s3_server.store()
    try:
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in store.url
        with pytest.raises(ArtifactError) as missing:
            store.open("team-a.x", "out/none.txt")
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in str(missing.value)
    finally:
        s3_server.empty(store)
