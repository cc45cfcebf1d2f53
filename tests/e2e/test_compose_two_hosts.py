"""compose.yaml's two-hosts profile end to end: two workers with volumes of their own, as on two machines, sharing
nothing but Redis, the API and an S3-protocol blob store. A session's runs stay on its worker's node, a library
uploaded to the API runs on a worker without the libraries volume, and output files and artifacts download through
the API after every worker is stopped."""

from __future__ import annotations

import secrets

import httpx
import pytest

from tests.e2e.conftest import team_key
from tests.e2e.test_compose import hello_library

pytestmark = pytest.mark.docker

BUCKET = "skillrun-e2e"
MAKE_BUCKET = f"import boto3; boto3.client('s3', endpoint_url='http://s3:5000').create_bucket(Bucket='{BUCKET}')"


def test_two_hosts_share_nothing_but_redis_the_api_and_the_blob_store(compose):
    env = {"SKILLRUN_WORKER_TOKEN": secrets.token_hex(32), "SKILLRUN_BLOB_URL": f"s3://{BUCKET}/a?endpoint=http://s3:5000",
           "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    run, url = compose("--scale", "far-worker=2", "redis", "api", "s3", "far-worker", profiles=("two-hosts",), env=env)
    run("exec", "-T", "api", "python", "-c", MAKE_BUCKET)
    headers = {"Authorization": f"Bearer {team_key(run)}"}
    with httpx.Client(base_url=url, headers=headers, timeout=90) as client:
        done = []
        for i in range(6):  # a session: every run on the node its workspace was placed on
            command = f"echo {i} >> $WORK_DIR/log; wc -l < $WORK_DIR/log"
            run_id = client.post("/v1/runs", json={"skill": "python-math", "command": command,
                                                   "workspace_id": "session"}).json()["id"]
            done.append(client.get(f"/v1/runs/{run_id}", params={"wait": 60}).json())
        assert [d["status"] for d in done] == ["finished"] * 6, done
        assert [d["result"]["stdout"].strip() for d in done] == ["1", "2", "3", "4", "5", "6"]
        assert len({d["worker_id"].split(":")[0] for d in done}) == 1  # one container

        uploaded = client.post("/v1/libraries/team/upload", params={"filename": "lib.tar.gz"}, content=hello_library())
        assert uploaded.status_code == 201, uploaded.text
        hellos = [client.post("/v1/runs", json={"skill": "hello", "command": "bash hi.sh"}).json()["id"]
                  for _ in range(4)]  # one-off runs: both workers take some, each fetching the version by digest
        for run_id in hellos:
            hello = client.get(f"/v1/runs/{run_id}", params={"wait": 60}).json()
            assert hello["status"] == "finished" and hello["result"]["stdout"] == "hello from the team library\n", hello

        report = {"skill": "hello", "command": "mkdir -p out && seq 1 50000 > out/report.txt",
                  "output_files": ["out/report.txt"], "save_as_artifacts": True}
        made = client.get(f"/v1/runs/{client.post('/v1/runs', json=report).json()['id']}", params={"wait": 60}).json()
        assert made["status"] == "finished", made
        run("stop", "far-worker")  # the files outlive every worker
        expected = "".join(f"{n}\n" for n in range(1, 50001))
        output = client.get(f"/v1/runs/{made['id']}/files/out/report.txt")
        artifact = client.get(f"/v1/runs/{made['id']}/artifacts/out/report.txt")
        assert output.status_code == 200 and output.text == expected
        assert artifact.status_code == 200 and artifact.text == expected
