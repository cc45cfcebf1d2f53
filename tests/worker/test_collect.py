"""Output collection: globs, refusals, caps and MIME types."""

from __future__ import annotations

import base64
import os
import struct
import zlib

import pytest

from tests.conftest import workspace_dirs
from worker.collect import mime
from worker.artifacts import FileArtifactStore
from worker.collect import expand_braces
from worker.contract import InputFile, RunLimits
from worker.errors import InvalidRunRequestError
from worker.runtimes.local.runtime import LocalWorkspaceRuntime
from worker.workspaces.staging import LinkSkillStager


def _png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"\x00\xff\x00\x00"
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)) + chunk(
        b"IDAT", zlib.compress(raw)
    ) + chunk(b"IEND", b"")


@pytest.mark.parametrize("pattern", ["../../etc/passwd", "/etc/*", "out/../../../etc/passwd", "$WORKSPACE_DIR/../x"])
async def test_globs_that_leave_the_workspace_are_refused_before_the_run(runtime, make_request, work_root, pattern):
    with pytest.raises(InvalidRunRequestError) as info:
        await runtime.run(make_request("touch ran", output_files=[pattern]))
    assert info.value.field == "output_files"
    assert "workspace" in str(info.value)
    assert not any(work_root.iterdir())


async def test_unknown_variable_in_a_glob_is_refused(runtime, make_request):
    with pytest.raises(InvalidRunRequestError, match=r"uses \$HOME"):
        await runtime.run(make_request("true", output_files=["$HOME/x"]))


async def test_symlink_out_of_the_workspace_is_skipped_with_its_reason(runtime, make_request):
    result = await runtime.run(make_request("ln -s /etc/passwd out/x; echo ok > out/y", output_files=["out/*"]))
    assert [f.name for f in result.output_files] == ["out/y"]
    assert result.skipped_files[0].name == "out/x"
    assert "outside the workspace" in result.skipped_files[0].reason
    assert "root:" not in result.model_dump_json()


async def test_fifo_in_out_is_skipped_and_does_not_hang(runtime, make_request):
    result = await runtime.run(make_request("mkfifo out/pipe; echo a > out/a.txt", output_files=["out/*"]))
    assert [f.name for f in result.output_files] == ["out/a.txt"]
    assert result.skipped_files[0].name == "out/pipe"
    assert "FIFO" in result.skipped_files[0].reason


async def test_a_1_gib_output_file_is_read_only_up_to_the_cap(runtime, make_request):
    limits = RunLimits(output_file_bytes=4096)
    result = await runtime.run(make_request("truncate -s 1G out/huge.bin", output_files=["out/huge.bin"], limits=limits))
    (huge,) = result.output_files
    assert huge.size == 1024**3
    assert huge.truncated is True
    assert len(base64.b64decode(huge.content)) == 4096 if huge.encoding == "base64" else len(huge.content) == 4096


async def test_total_cap_is_shared_by_all_files(runtime, make_request):
    limits = RunLimits(output_file_bytes=600, output_total_bytes=1000)
    command = "for i in 1 2 3; do head -c 500 /dev/zero | tr '\\0' a > out/f$i.txt; done"
    result = await runtime.run(make_request(command, output_files=["out/*.txt"], limits=limits))
    lengths = [len(f.content) for f in result.output_files]
    assert lengths == [500, 500, 0]
    assert [f.truncated for f in result.output_files] == [False, False, True]


async def test_what_comes_back_is_never_more_bytes_than_the_caps_let_a_file_have(runtime, make_request):
    # Text that is not UTF-8 (NUL-free bytes libmagic calls text, Latin-1 here) would grow three times over as
    # replacement characters: it comes back whole as base64. UTF-8 cut inside a character drops the split one.
    limits = RunLimits(output_file_bytes=1000, output_total_bytes=5000)
    command = ("printf 'caf\\351 ' > out/latin.txt; head -c 2000 /dev/zero | tr '\\0' '\\351' >> out/latin.txt; "
               "(printf x; for i in $(seq 800); do printf '\\303\\251'; done) > out/utf8.txt")
    result = await runtime.run(make_request(command, output_files=["out/*.txt"], limits=limits))
    files = {f.name: f for f in result.output_files}
    latin, utf8 = files["out/latin.txt"], files["out/utf8.txt"]
    assert latin.encoding == "base64" and base64.b64decode(latin.content) == b"caf\xe9 " + b"\xe9" * 995
    assert latin.truncated and latin.mime_type.startswith("text/")
    assert utf8.encoding == "utf-8" and utf8.content == "x" + "\u00e9" * 499 and utf8.truncated
    for found in result.output_files:
        inline = base64.b64decode(found.content) if found.encoding == "base64" else found.content.encode("utf-8")
        assert len(inline) <= limits.output_file_bytes


async def test_double_star_and_braces_match_nested_files(runtime, make_request):
    command = "mkdir -p out/a/b; echo 1 > out/a/b/x.csv; echo 2 > out/top.txt; echo 3 > out/a/skip.log"
    result = await runtime.run(make_request(command, output_files=["$OUTPUT_DIR/**/*.{csv,txt}"]))
    assert sorted(f.name for f in result.output_files) == ["out/a/b/x.csv", "out/top.txt"]


def test_braces_expand_in_order_and_nest():
    assert expand_braces("a/{b,c}/*.{png,csv}") == ["a/b/*.png", "a/b/*.csv", "a/c/*.png", "a/c/*.csv"]
    assert expand_braces("x{1,{2,3}}") == ["x1", "x2", "x3"]
    assert expand_braces("lone{brace") == ["lone{brace"]


async def test_output_dir_variable_and_relative_patterns_name_the_same_file(runtime, make_request):
    result = await runtime.run(make_request("echo hi > $OUTPUT_DIR/r.txt", output_files=["$OUTPUT_DIR/r.txt", "out/r.txt"]))
    assert [(f.name, f.content, f.mime_type) for f in result.output_files] == [("out/r.txt", "hi\n", "text/plain")]


async def test_binary_png_and_csv_get_their_mime_types(runtime, make_request):
    command = "cp inputs/chart.png out/chart.png; printf 'label,value\\na,1\\nb,2\\n' > out/data.csv"
    inputs = [InputFile(name="chart.png", content=_png())]
    result = await runtime.run(make_request(command, output_files=["out/*"], inputs=inputs))
    files = {f.name: f for f in result.output_files}
    assert files["out/chart.png"].mime_type == "image/png"
    assert files["out/chart.png"].encoding == "base64"
    assert base64.b64decode(files["out/chart.png"].content) == _png()
    assert files["out/data.csv"].mime_type == "text/csv"
    assert files["out/data.csv"].content == "label,value\na,1\nb,2\n"


def test_libmagic_is_used_when_installed():
    assert mime.libmagic_available(), "install libmagic1 (apt-get install libmagic1); .ci/test does this"
    # content wins over a misleading extension
    assert mime.detect_mime("picture.txt", _png()) == "image/png"


def test_mime_falls_back_to_the_extension_without_libmagic(monkeypatch):
    monkeypatch.setattr(mime, "_DETECTOR", None)
    assert mime.detect_mime("chart.png", _png()) == "image/png"
    assert mime.detect_mime("data.csv", b"a,b\n") == "text/csv"
    assert mime.detect_mime("noext", b"plain words") == "text/plain"
    assert mime.detect_mime("noext", b"\x00\x01\x02") == "application/octet-stream"


async def test_omit_inline_content_leaves_content_out(runtime, make_request):
    result = await runtime.run(make_request("echo hi > out/a.txt", output_files=["out/a.txt"], omit_inline_content=True))
    (f,) = result.output_files
    assert (f.content, f.size, f.encoding) == ("", 3, "none")


async def test_directories_matched_by_a_glob_are_not_files(runtime, make_request):
    result = await runtime.run(make_request("mkdir -p out/d; echo x > out/d/f", output_files=["out/*"]))
    assert result.output_files == []
    assert [(s.name, s.reason) for s in result.skipped_files] == [("out/d", "is a directory")]


async def test_library_files_reached_through_links_are_not_collected(work_root, make_request):
    runtime = LocalWorkspaceRuntime(work_root, stager=LinkSkillStager())
    try:
        result = await runtime.run(make_request("true", output_files=["scripts/*.sh"]))
    finally:
        await runtime.close()
    assert result.output_files == []
    (ws,) = workspace_dirs(runtime.work_root)
    if os.path.islink(ws / "skills" / "demo" / "scripts"):  # the library folder: one refusal, never listed
        assert [(s.name, s.reason) for s in result.skipped_files] == [("scripts", "resolves outside the workspace")]


async def test_a_tree_staged_skills_own_files_are_the_workspaces_and_collected(runtime, make_request):
    result = await runtime.run(make_request("echo made > scripts/made.sh", output_files=["scripts/*.sh"]))
    assert sorted(f.name for f in result.output_files) == ["skills/demo/scripts/hello.sh",
                                                            "skills/demo/scripts/made.sh"], result.skipped_files


async def test_a_link_in_a_literal_part_of_a_glob_is_not_followed_out_of_the_workspace(runtime, make_request):
    result = await runtime.run(make_request("ln -s /etc $OUTPUT_DIR/l", output_files=["$OUTPUT_DIR/l/*", "out/l/passwd"]))
    assert result.output_files == []
    names = [s.name for s in result.skipped_files]
    assert not any(n.endswith(("hostname", "hosts", "shadow", "passwd")) for n in names)


async def test_a_dangling_symlink_or_an_artifact_too_large_is_skipped_and_the_run_kept(work_root, make_request):
    runtime = LocalWorkspaceRuntime(work_root, artifact_store=FileArtifactStore(work_root / "a", max_bytes=10))
    result = await runtime.run(make_request(
        "ln -s nowhere $OUTPUT_DIR/gone.txt; head -c 100 /dev/zero > out/big.bin; echo kept",
        output_files=["$OUTPUT_DIR/*"], save_as_artifacts=True))
    assert result.stdout == "kept\n"
    reasons = {s.name: s.reason for s in result.skipped_files}
    assert "could not be stored as an artifact" in reasons["out/big.bin"]
    assert "cannot be read" in reasons["out/nowhere"]  # the dangling link, named by where it points
