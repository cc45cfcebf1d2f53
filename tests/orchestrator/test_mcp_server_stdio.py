"""``skillrun mcp``: the skill library served over stdio, driven by the ``mcp`` SDK's own client.

The server is the real command (``python -m orchestrator.cli mcp``) on the embedded default: runs execute in its
process on the local runtime, in a workspace of the MCP session's own.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import struct
import sys
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import ClientSession, McpError, StdioServerParameters, types
from mcp.client.stdio import stdio_client

from orchestrator.agents import LlmAgent
from orchestrator.runners import Runner
from orchestrator.sessions import InMemorySessionService
from orchestrator.skills import SkillToolSet, create_default_skill_repository
from orchestrator.tools import McpStdioServerParameters, MCPToolset, StdioConnectionParams
from orchestrator.types import Content, Part
from tests.conftest import workspace_dirs, write_skill
from tests.processes import _within, running_with, sleeper, wait_none_with

REPO = Path(__file__).resolve().parents[2]
GUIDE_TOOLS = ["skill_list", "skill_list_tools", "skill_load", "skill_select_tools", "skill_list_docs",
               "skill_select_docs", "skill_run"]


def png(width: int = 2, height: int = 2) -> bytes:
    """A small valid PNG, so the server's MIME detection calls it an image."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\0" + b"\xff\x00\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


@pytest.fixture
def library(shared_dir: Path) -> Path:
    root = shared_dir / "library"
    write_skill(root, "files", "Write files.\n", {
        "docs/usage.md": "# Usage\nCall make.sh.\n",
        "pixel.b64": base64.b64encode(png()).decode() + "\n",
    })
    write_skill(root, "notes", "Take notes.\n")
    root.chmod(0o755)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


@pytest.fixture
def server_env(work_root: Path, shared_dir: Path) -> dict[str, str]:
    return {
        **os.environ, "SKILLRUN_WORK_ROOT": str(work_root), "SKILLRUN_ARTIFACTS_DIR": str(shared_dir / "artifacts"),
        "SKILLRUN_DATA_DIR": str(shared_dir / "data"), "SKILLRUN_MCP_OUTPUT_FILE_BYTES": "4096",
        "PYTHONPATH": str(REPO),
    }


@contextlib.asynccontextmanager
async def connected(library: Path, env: dict[str, str]) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "orchestrator.cli", "mcp", "--skills-root",
                                                                 str(library)], env=env, cwd=str(REPO))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def summary(result: types.CallToolResult) -> dict:
    return json.loads(result.content[0].text)


async def test_the_tools_are_the_skill_tools_with_the_guides_names_and_schemas(library, server_env):
    async with connected(library, server_env) as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
    expected = await SkillToolSet(create_default_skill_repository(str(library))).get_tools(None)
    assert list(listed) == GUIDE_TOOLS
    for tool in expected:
        assert listed[tool.name].inputSchema == tool.parameters_schema()
    assert "4,096 bytes each" in listed["skill_run"].description  # the client is told the output caps


async def test_resources_list_every_skill_md_and_doc_and_read_back_their_text(library, server_env):
    async with connected(library, server_env) as session:
        resources = {str(r.uri): r for r in (await session.list_resources()).resources}
        skill_md = (await session.read_resource("skill://files/SKILL.md")).contents[0]
        doc = (await session.read_resource("skill://files/docs/usage.md")).contents[0]
        overview = (await session.read_resource("skill://overview")).contents[0]
        with pytest.raises(McpError, match="unknown skill 'ghost'"):
            await session.read_resource("skill://ghost/SKILL.md")
        with pytest.raises(McpError, match="has no doc 'docs/missing.md'"):
            await session.read_resource("skill://files/docs/missing.md")
        with pytest.raises(McpError, match="not a skill resource"):
            await session.read_resource("file:///etc/passwd")
    assert {"skill://overview", "skill://files/SKILL.md", "skill://files/docs/usage.md",
            "skill://notes/SKILL.md"} <= set(resources)
    assert resources["skill://files/SKILL.md"].description == "The files skill."
    assert skill_md.mimeType == "text/markdown" and skill_md.text.startswith("---\nname: files\n")
    assert doc.text == "# Usage\nCall make.sh.\n"
    assert "- notes: The notes skill." in overview.text


async def test_loading_a_skill_returns_its_instructions_and_chosen_docs(library, server_env):
    async with connected(library, server_env) as session:
        loaded = await session.call_tool("skill_load", {"skill_name": "files", "docs": ["docs/usage.md"]})
        missing = await session.call_tool("skill_load", {"skill_name": "ghost"})
    assert not loaded.isError
    assert loaded.structuredContent["instructions"] == "Write files."
    assert loaded.structuredContent["docs"] == {"docs/usage.md": "# Usage\nCall make.sh.\n"}
    assert missing.isError and "unknown skill 'ghost'" in missing.content[0].text


async def test_a_run_returns_its_files_as_content_of_their_kind_and_the_workspace_lasts_the_session(
    library, server_env, work_root
):
    async with connected(library, server_env) as session:
        first = await session.call_tool("skill_run", {
            "skill": "files",
            "command": "echo kept > $WORK_DIR/state.txt; printf 'hello' > $OUTPUT_DIR/a.txt; "
                       "base64 -d pixel.b64 > $OUTPUT_DIR/p.png; "
                       "printf '\\000\\377%.0s' $(seq 150) > $OUTPUT_DIR/blob.bin; "
                       "head -c 10000 /dev/zero | tr '\\0' x > $OUTPUT_DIR/big.txt",
            "output_files": ["out/*"],
        })
        second = await session.call_tool("skill_run", {"skill": "notes", "command": "cat $WORK_DIR/state.txt"})
        assert len(workspace_dirs(work_root)) == 1
    assert not first.isError, first.content[0].text
    files = {f["name"]: f for f in summary(first)["output_files"]}
    assert set(files) == {"out/a.txt", "out/p.png", "out/blob.bin", "out/big.txt"}
    blocks = {block.meta["skillrun/file"]["name"]: block for block in first.content[1:]}
    assert blocks["out/a.txt"].type == "text" and blocks["out/a.txt"].text == "hello"
    assert blocks["out/p.png"].type == "image" and blocks["out/p.png"].mimeType == "image/png"
    assert base64.b64decode(blocks["out/p.png"].data) == png()
    blob = blocks["out/blob.bin"]
    assert blob.type == "resource" and blob.resource.mimeType == "application/octet-stream"
    assert len(base64.b64decode(blob.resource.blob)) == 300
    assert files["out/big.txt"]["truncated"] and files["out/big.txt"]["size"] == 10000
    assert blocks["out/big.txt"].text == "x" * 4096  # cut at the cap the client was told
    assert summary(second)["stdout"] == "kept\n"  # the same workspace for the session's runs
    assert _within(10, lambda: workspace_dirs(work_root) == [])  # removed with the session


async def test_a_run_that_times_out_is_an_error_result_with_its_partial_output(library, server_env):
    async with connected(library, server_env) as session:
        result = await session.call_tool("skill_run", {"skill": "notes", "command": "echo started; sleep 30",
                                                        "timeout": 1})
    assert result.isError
    assert summary(result)["timed_out"] is True and summary(result)["stdout"] == "started\n"


async def test_bad_calls_get_error_results_that_say_what_was_wrong(library, server_env):
    async with connected(library, server_env) as session:
        unknown_skill = await session.call_tool("skill_run", {"skill": "ghost", "command": "true"})
        bad_arguments = await session.call_tool("skill_run", {"skill": 5, "timeout": "soon"})
        unknown_tool = await session.call_tool("rm_rf", {})
        bad_limit = await session.call_tool("skill_run", {"skill": "notes", "command": "true", "timeout": 10**9})
    assert unknown_skill.isError and "unknown skill 'ghost'" in unknown_skill.content[0].text
    assert bad_arguments.isError
    assert "skill: Input should be a valid string" in bad_arguments.content[0].text
    assert "missing required argument: command" in bad_arguments.content[0].text
    assert unknown_tool.isError and "unknown tool 'rm_rf'" in unknown_tool.content[0].text
    assert bad_limit.isError and "timeout" in bad_limit.content[0].text


async def test_a_client_that_goes_away_mid_run_leaves_nothing_running(library, server_env, work_root):
    command, argument = sleeper()
    async with connected(library, server_env) as session:
        call = asyncio.create_task(session.call_tool("skill_run", {"skill": "notes", "command": command}))
        assert await asyncio.to_thread(_within, 30, lambda: bool(running_with(argument))), "the run never started"
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
    # stdin closed: the session ended; its run is cancelled and its workspace removed
    assert await asyncio.to_thread(wait_none_with, argument, 15)
    assert await asyncio.to_thread(_within, 15, lambda: workspace_dirs(work_root) == [])


async def test_a_skillrun_agent_uses_another_skillrun_over_mcp(library, server_env, model_server, model):
    toolset = MCPToolset(StdioConnectionParams(server_params=McpStdioServerParameters(
        command=sys.executable, args=["-m", "orchestrator.cli", "mcp", "--skills-root", str(library)], env=server_env,
        cwd=str(REPO)), timeout=30), tool_filter=["skill_run"])
    model_server.add(
        {"tool_calls": [{"name": "skill_run", "arguments": {"skill": "notes", "command": "echo from afar"}}]},
        {"text": "done"},
    )
    agent = LlmAgent(name="remote", model=model, tools=[toolset])
    runner = Runner(app_name="t", agent=agent, session_service=InMemorySessionService())
    try:
        events = [e async for e in runner.run_async(user_id="u", session_id="s", new_message=Content(
            parts=[Part.from_text("run it")]))]
    finally:
        await runner.close()
    first, second = model_server.requests
    assert [t["function"]["name"] for t in first["tools"]] == ["skill_run"]
    tool_message = next(m for m in second["messages"] if m["role"] == "tool")
    answer = json.loads(tool_message["content"])
    assert answer["structured_content"]["stdout"] == "from afar\n"
    assert events[-1].content.text == "done"
