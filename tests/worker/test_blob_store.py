"""The S3 artifact store's own ways (moto's S3 server): where the settings point, the store going away or filling up
while a run's outputs are collected, and what an abandoned save leaves. Semantics both stores share are tested
against both in test_artifacts.py and test_artifact_retention.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from botocore.awsrequest import AWSResponse
from pydantic import ValidationError

from tests.artifact_stores import age, leftovers
from worker.artifacts import FileArtifactStore, S3ArtifactStore, create_artifact_store
from worker.config import WorkerSettings
from worker.errors import ArtifactError
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

DAY = 24 * 3600
STORAGE_FULL = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>XMinioStorageFull</Code><Message>Storage '
                b"backend has reached its minimum free drive threshold. Please delete a few objects to proceed."
                b"</Message></Error>")
"""What MinIO answers (507) to a write when its drives are full."""


def test_the_blob_url_names_the_store_and_wins_over_the_artifacts_dir(tmp_path):
    folder = create_artifact_store(f"file://{tmp_path}/blobs", tmp_path / "other")
    assert isinstance(folder, FileArtifactStore) and folder.root == tmp_path / "blobs"
    assert create_artifact_store(None, tmp_path / "other").root == tmp_path / "other"
    assert create_artifact_store(None, None) is None  # each runtime keeps its own folder
    s3 = create_artifact_store("s3://skillrun-blobs/team/a?endpoint=http://minio:9000", tmp_path / "other")
    assert isinstance(s3, S3ArtifactStore)
    assert (s3.bucket, s3.prefix, s3.client.meta.endpoint_url) == ("skillrun-blobs", "team/a/", "http://minio:9000")
    aws = create_artifact_store("s3://skillrun-blobs", None)
    assert aws.prefix == "" and "amazonaws.com" in aws.client.meta.endpoint_url


@pytest.mark.parametrize(("url", "message"), [
    ("s3://AKIA:secret@skillrun-blobs/p", "credentials do not go in the blob URL"),
    ("s3://skillrun-blobs?region=eu-west-1", "the only query an s3 blob URL takes is one endpoint"),
    ("s3://skillrun-blobs?endpoint=minio:9000", "the only query an s3 blob URL takes is one endpoint"),
    ("s3://Not_A_Bucket/p", "is not an S3 bucket name"),
    ("file://host/var/artifacts", "is not a local folder"),
    ("gs://bucket/p", "unknown blob store 'gs'"),
])
def test_a_malformed_blob_url_is_refused_with_the_reason_and_never_echoed(url, message):
    with pytest.raises(ValidationError, match=message) as refused:
        WorkerSettings(blob_url=url)
    assert "secret" not in str(refused.value)


@pytest.fixture
async def s3_runtime(s3_server, work_root):
    """The local runtime saving artifacts to a new bucket."""
    runtime = LocalWorkspaceRuntime(work_root, artifact_store=s3_server.store())
    yield runtime
    await runtime.close()


async def test_a_store_that_is_down_when_a_run_ends_refuses_its_artifacts_with_the_reason(
        s3_server, s3_runtime, make_request):
    store = s3_runtime.artifact_store
    request = make_request("echo one > out/a.txt", output_files=["out/*.txt"], save_as_artifacts=True)
    s3_server.stop()
    try:
        result = await s3_runtime.run(request)
    finally:
        s3_server.start()
    assert result.exit_code == 0 and result.artifact_files == []  # the run ends as it did, its file refused
    [skipped] = result.skipped_files
    assert skipped.name == "out/a.txt"
    assert skipped.reason.startswith(f"could not be stored as an artifact: the blob store {store.url} could not store "
                                     "artifact 'out/a.txt': Could not connect")
    assert store.list(request.workspace_id) == []


async def test_a_full_store_refuses_an_artifact_mid_upload_and_keeps_nothing_of_it(s3_runtime, make_request):
    store = s3_runtime.artifact_store

    def full_at_the_second_part(request, **kwargs) -> AWSResponse | None:
        if "partNumber=2" in request.url:
            return AWSResponse(request.url, 507, {}, _Raw(STORAGE_FULL))
        return None

    store.client.meta.events.register("before-send.s3.UploadPart", full_at_the_second_part)
    request = make_request("head -c 20000000 /dev/zero > out/big.bin; echo small > out/small.txt",
                           output_files=["out/*"], save_as_artifacts=True)
    result = await s3_runtime.run(request)
    assert [a.name for a in result.artifact_files] == ["out/small.txt"]
    [skipped] = result.skipped_files
    assert skipped.name == "out/big.bin"
    assert "refused to store artifact 'out/big.bin': XMinioStorageFull: Storage backend has reached" in skipped.reason
    assert store.versions(request.workspace_id, "out/big.bin") == []
    assert leftovers(store, request.workspace_id, "out/big.bin") == []  # claim deleted, multipart upload aborted


def test_a_save_cut_off_by_the_store_going_away_is_never_listed_and_prune_takes_what_stays(s3_server, tmp_path):
    store = s3_server.store()
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 20_000_000)

    def away_at_the_second_part(request, **kwargs) -> None:
        if "partNumber=2" in request.url:
            s3_server.stop()

    store.client.meta.events.register("before-send.s3.UploadPart", away_at_the_second_part)
    try:
        with big.open("rb") as f, pytest.raises(ArtifactError, match="the blob store .* could not store artifact"):
            store.save_fd("s1", "out/big.bin", f.fileno(), "application/octet-stream")
    finally:
        s3_server.start()
    assert store.versions("s1", "out/big.bin") == [] and store.list("s1") == []
    with pytest.raises(ArtifactError, match="no artifact 'out/big.bin'"):
        store.load("s1", "out/big.bin")
    assert leftovers(store, "s1", "out/big.bin") == ["1/claim", "upload of 1/data"]
    assert store.prune(time.time() + 1) == 0  # a writer may still be at it
    age(store, "s1", "out/big.bin", 1, 2 * DAY)
    assert store.prune(time.time() - DAY) == 1
    # An upload its writer could not abort is the bucket's to end (an AbortIncompleteMultipartUpload lifecycle rule).
    assert leftovers(store, "s1", "out/big.bin") == ["upload of 1/data"]
    assert store.save_bytes("s1", "out/big.bin", b"again", "text/plain").version == 1


def test_objects_under_the_prefix_that_are_not_artifacts_are_left_alone(s3_server):
    store = s3_server.store()
    store.client.put_object(Bucket=store.bucket, Key=f"{store.prefix}README", Body=b"keep")
    store.client.put_object(Bucket=store.bucket, Key=f"{store.prefix}s1/notes/latest", Body=b"keep")
    store.save_bytes("s1", "a", b"x", "text/plain")
    age(store, "s1", "a", 1, 2 * DAY)
    assert store.prune(time.time() - DAY) == 1
    keys = [o["Key"] for o in store.client.list_objects_v2(Bucket=store.bucket)["Contents"]]
    assert keys == [f"{store.prefix}README", f"{store.prefix}s1/notes/latest"]


def test_a_folder_blob_url_keeps_the_filesystem_layout(tmp_path: Path):
    store = create_artifact_store(f"file://{tmp_path}", None)
    store.save_bytes("s1", "out/a b.txt", b"x", "text/plain")
    assert sorted(p.name for p in (tmp_path / "s1" / "out%2Fa%20b.txt" / "1").iterdir()) == ["data", "meta.json"]


class _Raw:
    """A response body botocore reads with ``stream()``."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self):
        yield self.body
