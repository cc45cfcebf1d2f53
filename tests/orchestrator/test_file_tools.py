"""File tools in host mode (the guide's ``cwd``): parameters, answers, confinement, caps, and the bad input of issue 19
— each refusal in the guide's ``{"success": False, "error": ...}`` shape, with nothing else touched."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from orchestrator import tools as tools_package
from orchestrator.context import InvocationContext
from orchestrator.sessions import Session
from orchestrator.tools import file_tools
from orchestrator.tools.file_tools import (
    BashTool,
    EditTool,
    FileToolSet,
    GlobTool,
    GrepTool,
    ReadTool,
    WriteTool,
)
from orchestrator.tools.file_tools.workspace_skill import ops as _ops
from worker.defaults import TRUNCATION_MARKER


@pytest.fixture
def ctx() -> InvocationContext:
    return InvocationContext(session=Session(app_name="app", user_id="u"), agent=None)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    return folder


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("top secret\n")
    return folder


async def call(tool, ctx, **args):
    return await tool.run_async(tool_context=ctx, args=args)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_refused(answer: dict, *words: str) -> None:
    assert set(answer) == {"success", "error"}, answer
    assert answer["success"] is False
    for word in words:
        assert word in answer["error"], answer["error"]


def test_exported_from_tools_and_file_tools():
    for name in ("FileToolSet", "ReadTool", "WriteTool", "EditTool", "GrepTool", "BashTool", "GlobTool"):
        assert getattr(tools_package, name) is getattr(file_tools, name)
        assert name in tools_package.__all__
    assert tools_package.WorkspaceFileToolSet is file_tools.WorkspaceFileToolSet


async def test_tool_set_has_the_six_tools_sharing_cwd(root):
    tool_set = FileToolSet(cwd=str(root))
    tools = await tool_set.get_tools()
    assert [t.name for t in tools] == ["Read", "Write", "Edit", "Grep", "Bash", "Glob"]
    assert {t.cwd for t in tools} == {str(root.resolve())}
    assert tools[0].declaration()["parameters"]["required"] == ["path"]


async def test_cwd_defaults_to_the_current_directory(root, monkeypatch, ctx):
    monkeypatch.chdir(root)
    (root / "config.ini").write_text("host=localhost\n")
    answer = await call(ReadTool(), ctx, path="config.ini")
    assert answer["content"] == "host=localhost\n"


async def test_read_whole_file_and_line_range(root, ctx):
    (root / "app.py").write_text("".join(f"line {i}\n" for i in range(1, 101)))
    tool = ReadTool(cwd=root)
    assert await call(tool, ctx, path="app.py") == {
        "success": True, "content": "".join(f"line {i}\n" for i in range(1, 101)), "total_lines": 100,
        "read_range": "1-100"}
    ranged = await call(tool, ctx, path="app.py", start_line=10, end_line=20)
    assert ranged["read_range"] == "10-20" and ranged["content"].splitlines()[0] == "line 10"
    assert len(ranged["content"].splitlines()) == 11
    assert (await call(tool, ctx, path=str(root / "app.py"), start_line=99))["content"] == "line 99\nline 100\n"


async def test_read_refuses_bad_ranges_and_missing_files(root, ctx):
    (root / "a.txt").write_text("one\ntwo\n")
    tool = ReadTool(cwd=root)
    assert_refused(await call(tool, ctx, path="a.txt", start_line=5, end_line=3), "line range")
    assert_refused(await call(tool, ctx, path="a.txt", start_line=9), "past the end")
    assert_refused(await call(tool, ctx, path="nope.txt"), "not found")
    assert_refused(await call(tool, ctx, path="."), "not a regular file")
    assert_refused(await call(tool, ctx), "missing required argument: path")
    assert_refused(await call(tool, ctx, path="a.txt", start_line="x"), "start_line must be an integer")


async def test_read_decodes_gb18030_and_stops_at_the_line_cap(root, ctx, monkeypatch):
    (root / "zh.txt").write_bytes("你好，世界\n".encode("gb18030"))
    assert (await call(ReadTool(cwd=root), ctx, path="zh.txt"))["content"] == "你好，世界\n"
    monkeypatch.setattr(_ops, "MAX_READ_LINES", 5)
    (root / "long.txt").write_text("x\n" * 12)
    answer = await call(ReadTool(cwd=root), ctx, path="long.txt", start_line=3)
    assert answer["read_range"] == "3-7" and answer["truncated"] is True and answer["total_lines"] == 12


async def test_read_refuses_a_file_over_the_cap(root, ctx, monkeypatch):
    monkeypatch.setattr(_ops, "MAX_READ_BYTES", 1000)
    (root / "big.log").write_bytes(b"a" * 1001)
    assert_refused(await call(ReadTool(cwd=root), ctx, path="big.log"), "1001 bytes", "up to 1000 bytes")


async def test_read_refuses_binary_content(root, ctx):
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    assert_refused(await call(ReadTool(cwd=root), ctx, path="image.png"), "binary")
    (root / "junk.bin").write_bytes(bytes([0xff, 0xfe, 0xfd, 0x80]) * 10)
    assert_refused(await call(ReadTool(cwd=root), ctx, path="junk.bin"), "not text")


@pytest.mark.parametrize("path", ["../outside/secret.txt", "{outside}/secret.txt", "sub/../../outside/secret.txt",
                                  "link/secret.txt", "secret-link.txt", "/etc/passwd"])
async def test_paths_leaving_cwd_are_refused_by_every_tool(root, outside, ctx, path):
    (root / "link").symlink_to(outside, target_is_directory=True)  # a symlinked parent pointing out
    (root / "secret-link.txt").symlink_to(outside / "secret.txt")  # a symlinked file pointing out
    path = path.format(outside=outside)
    before, before_out = snapshot(root), snapshot(outside)
    assert_refused(await call(ReadTool(cwd=root), ctx, path=path), "outside the working directory")
    assert_refused(await call(WriteTool(cwd=root), ctx, path=path, content="pwned"), "outside")
    assert_refused(await call(WriteTool(cwd=root), ctx, path=path, content="pwned", append=True), "outside")
    assert_refused(await call(EditTool(cwd=root), ctx, path=path, old_string="top", new_string="x"), "outside")
    assert_refused(await call(GrepTool(cwd=root), ctx, pattern="secret", path=path), "outside")
    assert snapshot(root) == before and snapshot(outside) == before_out


async def test_write_into_a_new_file_under_a_symlinked_folder_out_is_refused(root, outside, ctx):
    (root / "link").symlink_to(outside, target_is_directory=True)
    assert_refused(await call(WriteTool(cwd=root), ctx, path="link/new/planted.txt", content="x"), "outside")
    assert not (outside / "new").exists()


async def test_glob_and_grep_do_not_list_what_links_point_out_to(root, outside, ctx):
    (root / "link").symlink_to(outside, target_is_directory=True)
    (root / "mine.txt").write_text("secret of mine\n")
    globbed = await call(GlobTool(cwd=root), ctx, pattern="**/*.txt")
    assert globbed["matches"] == [str(root / "mine.txt")]
    grepped = await call(GrepTool(cwd=root), ctx, pattern="secret")
    assert [m["file"] for m in grepped["matches"]] == ["mine.txt"]
    assert_refused(await call(GlobTool(cwd=root), ctx, pattern="../outside/*"), "may not contain '..'")
    assert_refused(await call(GlobTool(cwd=root), ctx, pattern=f"{outside}/*"), "must be relative")
    assert_refused(await call(GlobTool(cwd=root), ctx, pattern="*", path=".."), "outside")


async def test_write_creates_folders_overwrites_and_appends(root, ctx):
    tool = WriteTool(cwd=root)
    answer = await call(tool, ctx, path="output.txt", content="Hello, World!\n")
    assert answer == {"success": True, "message": "SUCCESS: file output.txt written to successfully (14 bytes)",
                      "path": str(root.resolve() / "output.txt")}
    await call(tool, ctx, path="logs/log.txt", content="first\n")
    appended = await call(tool, ctx, path="logs/log.txt", content="New log entry\n", append=True)
    assert appended["success"] and "appended" in appended["message"]
    assert (root / "logs" / "log.txt").read_text() == "first\nNew log entry\n"
    await call(tool, ctx, path="output.txt", content="replaced")
    assert (root / "output.txt").read_text() == "replaced"
    assert_refused(await call(tool, ctx, path="logs", content="x"), "is a directory")


async def test_edit_replaces_exactly_one_block(root, ctx):
    (root / "config.ini").write_text("[db]\nport=5432\n\n\nhost=localhost\n")
    answer = await call(EditTool(cwd=root), ctx, path="config.ini", old_string="host=localhost",
                        new_string="host=production-server")
    assert answer == {"success": True, "message": "SUCCESS: file config.ini modified successfully",
                      "line_range": "5-5", "changed_line_ranges": [(5, 5)]}
    assert (root / "config.ini").read_text() == "[db]\nport=5432\n\n\nhost=production-server\n"


async def test_edit_multiline_and_whitespace_tolerance(root, ctx):
    (root / "a.py").write_text("def f():\n\treturn  1\n")
    answer = await call(EditTool(cwd=root), ctx, path="a.py", old_string="def f():\n    return 1",
                        new_string="def f():\n    return 2\n    # done")
    assert answer["success"] and answer["line_range"] == "1-3"
    assert (root / "a.py").read_text() == "def f():\n    return 2\n    # done\n"


async def test_edit_absent_or_ambiguous_old_string_changes_nothing(root, ctx):
    (root / "c.ini").write_text("host=localhost\nport=1\nhost=localhost\n")
    before = snapshot(root)
    ambiguous = await call(EditTool(cwd=root), ctx, path="c.ini", old_string="host=localhost", new_string="x")
    assert_refused(ambiguous, "matches 2 places", "lines 1, 3")
    absent = await call(EditTool(cwd=root), ctx, path="c.ini", old_string="port=2", new_string="x")
    assert_refused(absent, "not found", "most similar", "port=1")
    assert_refused(await call(EditTool(cwd=root), ctx, path="c.ini", old_string="", new_string="x"), "empty")
    assert snapshot(root) == before


async def test_grep_case_insensitive_in_a_folder_with_max_results(root, ctx):
    (root / "src").mkdir()
    (root / "src" / "main.py").write_text("import os\n\ndef my_function():\n    pass\n")
    (root / "src" / "blob.bin").write_bytes(b"def function\x00")
    (root / "notes.md").write_text("TODO one\nFIXME two\ntodo three\n")
    answer = await call(GrepTool(cwd=root), ctx, pattern="DEF.*FUNCTION", path="src/", case_sensitive=False)
    assert answer == {"success": True, "matches": [{"file": "src/main.py", "line": 3, "content": "def my_function():"}],
                      "total_matches": 1}
    assert (await call(GrepTool(cwd=root), ctx, pattern="DEF.*FUNCTION", path="src/"))["total_matches"] == 0
    capped = await call(GrepTool(cwd=root), ctx, pattern="TODO|FIXME", path=".", max_results=1)
    assert capped["total_matches"] == 2 and len(capped["matches"]) == 1 and capped["truncated"] is True
    assert_refused(await call(GrepTool(cwd=root), ctx, pattern="("), "invalid regular expression")
    assert_refused(await call(GrepTool(cwd=root), ctx, pattern="x", max_results=0), "max_results")


async def test_glob_recursive_and_braces_with_a_cap(root, ctx):
    for name in ("a.txt", "b.py", "pkg/c.py", "pkg/deep/d.js", "pkg/deep/e.go"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x")
    tool = GlobTool(cwd=root)
    real = root.resolve()
    assert await call(tool, ctx, pattern="*.txt") == {"success": True, "matches": [str(real / "a.txt")], "count": 1,
                                                      "truncated": False, "pattern": "*.txt"}
    assert (await call(tool, ctx, pattern="**/*.py"))["matches"] == [str(real / "b.py"), str(real / "pkg/c.py")]
    both = await call(tool, ctx, pattern="**/*.{py,js}")
    assert both["count"] == 3 and str(real / "pkg/deep/d.js") in both["matches"]
    capped = await call(tool, ctx, pattern="**/*.{py,js,go,txt}", max_results=2)
    assert capped["count"] == 2 and capped["truncated"] is True
    assert _ops.expand_braces("a{b,c{d,e}}f") == ["abf", "acdf", "acef"]


async def test_bash_runs_in_cwd_with_pipes_and_a_subfolder(root, ctx):
    (root / "src").mkdir()
    (root / "src" / "x.py").write_text("")
    tool = BashTool(cwd=root)
    answer = await call(tool, ctx, command="ls -la | grep -c x.py; pwd", cwd="src/")
    assert answer == {"success": True, "stdout": f"1\n{root.resolve() / 'src'}\n", "stderr": "", "return_code": 0,
                      "command": "ls -la | grep -c x.py; pwd", "cwd": str(root.resolve() / "src")}
    failed = await call(tool, ctx, command="echo oops >&2; exit 3")
    assert failed["success"] is False and failed["return_code"] == 3 and failed["stderr"] == "oops\n"
    assert "exited with code 3" in failed["error"]


async def test_bash_environment_is_built_from_scratch(root, ctx, monkeypatch):
    monkeypatch.setenv("SKILLRUN_TEST_SECRET", "hunter2")
    answer = await call(BashTool(cwd=root), ctx, command="env")
    assert "hunter2" not in answer["stdout"] and "PATH=" in answer["stdout"]


async def test_bash_cwd_outside_and_bad_timeouts_are_refused(root, outside, ctx):
    (root / "link").symlink_to(outside, target_is_directory=True)
    tool = BashTool(cwd=root)
    for cwd in ("..", str(outside), "link"):
        assert_refused(await call(tool, ctx, command="touch planted", cwd=cwd), "outside")
    for timeout in (0, -1, 10**9):
        assert_refused(await call(tool, ctx, command="touch planted", timeout=timeout), "timeout")
    assert_refused(await call(tool, ctx, command="true", cwd="missing"), "not a directory")
    assert not list(root.rglob("planted")) and not (outside / "planted").exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its parent counts as gone
        return stat.read().split(") ")[1][0] != "Z"


def assert_gone(pid_file: Path) -> None:
    """The process whose id the command wrote is gone within a few seconds."""
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


async def test_bash_past_its_timeout_kills_the_whole_process_group(root, ctx):
    started = time.monotonic()
    answer = await call(BashTool(cwd=root), ctx, command="sleep 60 & echo $! > bg.pid; echo started; sleep 60",
                        timeout=1)
    assert time.monotonic() - started < 10
    assert answer["success"] is False and "timed out after 1 seconds" in answer["error"]
    assert answer["stdout"] == "started\n"
    assert_gone(root / "bg.pid")


async def test_bash_leaves_no_background_child_after_it_ends(root, ctx):
    answer = await call(BashTool(cwd=root), ctx, command="sleep 60 & echo $! > bg.pid")
    assert answer["success"] is True
    assert_gone(root / "bg.pid")


async def test_bash_output_is_capped(root, ctx):
    tool_set = FileToolSet(backend=file_tools.HostFileBackend(root, output_bytes=1000))
    bash = next(t for t in await tool_set.get_tools() if t.name == "Bash")
    answer = await call(bash, ctx, command="head -c 500000 /dev/zero | tr '\\0' a; echo done >&2")
    assert answer["success"] is True and answer["stdout"].startswith("a" * 1000)
    assert TRUNCATION_MARKER.format(omitted=499000) in answer["stdout"] and answer["stderr"] == "done\n"


async def test_unknown_and_wrongly_typed_arguments_are_refused(root, ctx):
    assert_refused(await call(WriteTool(cwd=root), ctx, path="a", content="x", mode="w"), "unexpected argument")
    assert_refused(await call(WriteTool(cwd=root), ctx, path="a", content=3), "content must be a string")
    assert_refused(await call(GrepTool(cwd=root), ctx, pattern="x", max_results=True), "max_results")
    assert not list(root.iterdir())


def test_cwd_and_backend_together_are_a_mistake(root):
    with pytest.raises(ValueError):
        ReadTool(cwd=root, backend=file_tools.HostFileBackend(root))


async def test_glob_does_not_follow_link_loops_and_stops_at_its_visit_cap(root, ctx, monkeypatch):
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "x.py").write_text("")
    (root / ".hidden.py").write_text("")
    for name in ("loop1", "loop2"):
        (root / "a" / name).symlink_to(root, target_is_directory=True)
    started = time.monotonic()
    answer = await call(GlobTool(cwd=root), ctx, pattern="**/*.py")
    assert time.monotonic() - started < 5
    assert answer["matches"] == [str(root.resolve() / "a/b/x.py")] and answer["truncated"] is False
    assert (await call(GlobTool(cwd=root), ctx, pattern=".*.py"))["count"] == 1
    monkeypatch.setattr(_ops, "MAX_GLOB_VISITS", 2)
    assert (await call(GlobTool(cwd=root), ctx, pattern="**/*.py"))["truncated"] is True
