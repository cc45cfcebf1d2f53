"""The filesystem artifact store and save_as_artifacts."""

from __future__ import annotations

import os

import pytest

from worker.artifacts import FileArtifactStore
from worker.errors import ArtifactError
from worker.contract import RunLimits


def test_binary_content_is_stored_byte_for_byte_and_versioned(tmp_path):
    store = FileArtifactStore(tmp_path)
    data = bytes(range(256)) * 10
    first = store.save_bytes("s1", "out/blob.bin", data, "application/octet-stream")
    second = store.save_bytes("s1", "out/blob.bin", b"v2", "application/octet-stream")
    assert (first.version, second.version) == (1, 2)
    assert store.load("s1", "out/blob.bin", 1) == data
    assert store.load("s1", "out/blob.bin") == b"v2"
    assert store.versions("s1", "out/blob.bin") == [1, 2]
    assert [a.name for a in store.list("s1")] == ["out/blob.bin"]


def test_missing_version_is_a_clear_error(tmp_path):
    store = FileArtifactStore(tmp_path)
    store.save_bytes("s1", "a", b"x", "text/plain")
    with pytest.raises(ArtifactError, match="has no version 7"):
        store.load("s1", "a", 7)
    with pytest.raises(ArtifactError, match="no artifact 'b'"):
        store.load("s1", "b")


def test_artifact_over_the_cap_leaves_no_partial_version(tmp_path):
    store = FileArtifactStore(tmp_path, max_bytes=10)
    with pytest.raises(ArtifactError, match="larger than 10 bytes"):
        store.save_bytes("s1", "big", b"x" * 11, "text/plain")
    assert store.versions("s1", "big") == []
    assert os.listdir(tmp_path / "s1" / "big") == []


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
