"""Team secrets through the queue (Redis and a worker process) and on the Docker runtime: the value reaches the
command and nothing stored or returned holds it."""

from __future__ import annotations

import pytest
import redis
from cryptography.fernet import Fernet

from orchestrator.dispatch import InlineDispatcher, QueueDispatcher
from orchestrator.skills import create_default_skill_repository
from tests.orchestrator.test_secrets import LEAK, SECRET, leaked
from worker.contract import RunRequest, RuntimeName
from worker.run_store import RunRecord, RunStatus
from worker.secrets.store import FileSecretStore, RedisSecretStore, SecretBox


@pytest.fixture
def secret_skill(shared_dir):
    root = shared_dir / "secret-library"
    (root / "github").mkdir(parents=True)
    (root / "github" / "SKILL.md").write_text(
        "---\nname: github\ndescription: Talks to GitHub.\nmetadata:\n  secrets: [GH_TOKEN]\n---\nUse it.\n")
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return create_default_skill_repository(str(root)).skill_ref("github")


@pytest.fixture
def key() -> str:
    return Fernet.generate_key().decode()


def _request(skill, **fields) -> RunRequest:
    return RunRequest(skill=skill, command=LEAK, secrets=["GH_TOKEN"], output_files=["out/leak.txt"], **fields)


async def _queued_run(redis_url: str, workers, skill, *, stored_with: str, worker_key: str) -> RunRecord:
    """The secret stored under ``stored_with``, a worker process holding ``worker_key``, and a run of team-a naming
    it, through the queue, once it ended."""
    RedisSecretStore(redis.Redis.from_url(redis_url), SecretBox(stored_with)).set("team-a", "GH_TOKEN", SECRET)
    workers.env["SKILLRUN_SECRETS_KEY"] = worker_key
    workers.start()
    dispatcher = QueueDispatcher(redis_url)
    try:
        record = await dispatcher.submit(_request(skill), owner="team-a")
        return await dispatcher.wait(record.id, 120)
    finally:
        await dispatcher.close()


async def test_a_queued_run_gets_its_secret_from_redis_and_nothing_in_redis_holds_it(
    redis_url, workers, secret_skill, key
):
    record = await _queued_run(redis_url, workers, secret_skill, stored_with=key, worker_key=key)
    assert record.status == RunStatus.FINISHED, record.error
    assert f"length {len(SECRET)}" in record.result.stdout
    assert record.result.stdout.count("[redacted:GH_TOKEN]") == 7
    assert record.result.output_files[0].content == "saved [redacted:GH_TOKEN]\n"
    client = redis.Redis.from_url(redis_url)
    everything = b"".join(
        value for key_name in client.scan_iter(count=1000)
        for value in _values(client, key_name)
    ).decode("utf-8", "replace")
    assert leaked(everything) == []  # the records, the RQ job, the events: no form of the value anywhere


def _values(client: redis.Redis, key_name: bytes) -> list[bytes]:
    kind = client.type(key_name)
    if kind == b"string":
        return [client.get(key_name) or b""]
    if kind == b"hash":
        return [k + v for k, v in client.hgetall(key_name).items()]
    if kind == b"list":
        return client.lrange(key_name, 0, -1)
    if kind == b"zset":
        return [member for member, _ in client.zrange(key_name, 0, -1, withscores=True)]
    if kind == b"set":
        return list(client.smembers(key_name))
    if kind == b"stream":
        return [b"".join(k + v for k, v in fields.items()) for _, fields in client.xrange(key_name)]
    return []


async def test_a_worker_with_the_wrong_key_fails_the_run_clearly_and_decrypts_nothing(
    redis_url, workers, secret_skill, key
):
    record = await _queued_run(redis_url, workers, secret_skill, stored_with=key,
                               worker_key=Fernet.generate_key().decode())
    assert record.status == RunStatus.FAILED
    assert "SKILLRUN_SECRETS_KEY is not the key it was stored with" in record.error
    assert record.result is None


@pytest.mark.docker
async def test_a_docker_run_gets_its_secret_and_gives_back_none_of_it(docker_runtime_factory, secret_skill, key,
                                                                      shared_dir):
    store = FileSecretStore(shared_dir / "secrets", SecretBox(key))
    store.set("team-a", "GH_TOKEN", SECRET)
    dispatcher = InlineDispatcher({"docker": docker_runtime_factory()}, secrets=store)
    try:
        result = await dispatcher.run(_request(secret_skill, runtime=RuntimeName.DOCKER), owner="team-a")
    finally:
        await dispatcher.close()
    assert result.exit_code == 0, result.stderr
    assert f"length {len(SECRET)}" in result.stdout and result.stdout.count("[redacted:GH_TOKEN]") == 7
    assert leaked(result.model_dump_json()) == []
