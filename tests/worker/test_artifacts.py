"""The artifact stores (a folder, an S3 bucket: each test runs against both) and save_as_artifacts."""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading

import pytest

from tests.artifact_stores import leftovers
from worker.contract import RunLimits
from worker.errors import ArtifactError

MIB = 1024 * 1024


def test_binary_content_is_stored_byte_for_byte_and_versioned(artifact_store):
    store = artifact_store
    data = bytes(range(256)) * 10
    first = store.save_bytes("s1", "out/blob.bin", data, "application/octet-stream")
    second = store.save_bytes("s1", "out/blob.bin", b"v2", "application/octet-stream")
    assert (first.version, second.version) == (1, 2)
    assert first.sha256 == hashlib.sha256(data).hexdigest() and first.size == len(data)
    assert store.load("s1", "out/blob.bin", 1) == data
    assert store.load("s1", "out/blob.bin") == b"v2"
    assert store.versions("s1", "out/blob.bin") == [1, 2]
    assert [a.name for a in store.list("s1")] == ["out/blob.bin"]
    assert store.info("s1", "out/blob.bin") == second


def test_missing_version_is_a_clear_error(artifact_store):
    store = artifact_store
    store.save_bytes("s1", "a", b"x", "text/plain")
    with pytest.raises(ArtifactError, match="has no version 7"):
        store.load("s1", "a", 7)
    with pytest.raises(ArtifactError, match="no artifact 'b'"):
        store.load("s1", "b")
    with pytest.raises(ArtifactError, match="invalid artifact scope"):
        store.load("../s1", "a")


def test_artifact_over_the_cap_leaves_no_partial_version(artifact_store):
    store = artifact_store
    store.max_bytes = 10
    with pytest.raises(ArtifactError, match="larger than 10 bytes"):
        store.save_bytes("s1", "big", b"x" * 11, "text/plain")
    assert store.versions("s1", "big") == []
    assert leftovers(store, "s1", "big") == []


def test_a_large_file_streams_from_its_descriptor_and_back_in_chunks(artifact_store):
    # 20 MiB: past the S3 store's multipart threshold (three parts), read back in 1 MiB chunks.
    data = os.urandom(20 * MIB + 3)
    with tempfile.TemporaryFile() as f:
        f.write(data)
        saved = artifact_store.save_fd("s1", "out/big.bin", f.fileno(), "application/octet-stream")
    assert saved.size == len(data) and saved.sha256 == hashlib.sha256(data).hexdigest()
    opened = artifact_store.open("s1", "out/big.bin")
    assert opened.size == len(data)
    chunks = list(opened.chunks())
    assert len(chunks) == 21 and max(len(c) for c in chunks) == MIB
    assert b"".join(chunks) == data


def test_a_large_file_over_the_cap_is_refused_while_streaming_and_leaves_nothing(artifact_store):
    artifact_store.max_bytes = 12 * MIB
    with tempfile.TemporaryFile() as f:
        f.truncate(20 * MIB)
        with pytest.raises(ArtifactError, match=f"larger than {12 * MIB} bytes"):
            artifact_store.save_fd("s1", "out/big.bin", f.fileno(), "application/octet-stream")
    assert artifact_store.versions("s1", "out/big.bin") == []
    assert leftovers(artifact_store, "s1", "out/big.bin") == []


def test_concurrent_writers_never_share_a_version(artifact_store):
    versions: list[int] = []

    def write() -> None:
        for _ in range(5):
            versions.append(artifact_store.save_bytes("s1", "out/n.txt", b"n", "text/plain").version)

    writers = [threading.Thread(target=write) for _ in range(8)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert sorted(versions) == list(range(1, 41))
    assert artifact_store.versions("s1", "out/n.txt") == list(range(1, 41))


async def test_save_as_artifacts_stores_whole_files_beyond_the_inline_cap(runtime, make_request):
    request = make_request(
        "head -c 300000 /dev/urandom > out/noise.bin; echo text > out/t.txt",
        output_files=["out/*"], save_as_artifacts=True, limits=RunLimits(output_file_bytes=1000),
    )
    result = await runtime.run(request)
    by_name = {a.name: a for a in result.artifact_files}
    assert by_name["out/noise.bin"].size == 300000
    stored = runtime.artifact_store.load(request.workspace_id, "out/noise.bin")
    ws_file = next(runtime.work_root.glob("ws_*")) / "out" / "noise.bin"
    assert stored == ws_file.read_bytes()
    assert runtime.artifact_store.load(request.workspace_id, "out/t.txt") == b"text\n"
    again = await runtime.run(request)
    assert {a.version for a in again.artifact_files} == {2}
