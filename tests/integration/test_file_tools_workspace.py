"""Workspace mode: the file tools act in the session's workspace through ``skill_run``'s dispatcher and runtime, on
the local runtime, Docker and Cube — what ``Write`` writes the next ``skill_run`` reads, and nothing leaves the
workspace (the Cube runtime against its local stand-in)."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

import pytest

from orchestrator.agents import LlmAgent
from orchestrator.context import InvocationContext
from orchestrator.models import OpenAIModel
from orchestrator.runners import Runner
from orchestrator.sessions import InMemorySessionService, Session
from orchestrator.skills import SkillToolSet, create_default_skill_repository
from orchestrator.tools import WorkspaceFileToolSet
from orchestrator.tools.file_tools import workspace as workspace_mode
from orchestrator.tools.file_tools.workspace_skill import ops as file_ops
from orchestrator.types import Content, Part
from tests.model_server import ScriptedModelServer
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

LIBRARY = Path(__file__).resolve().parents[2] / "skills"
SKILL = "python-math"


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker), "cube"])
async def skill_tools(request, work_root):
    if request.param == "local":
        runtime = LocalWorkspaceRuntime(work_root / "local")
    else:
        runtime = request.getfixturevalue(f"{request.param}_runtime_factory")()
    tool_set = SkillToolSet(create_default_skill_repository(str(LIBRARY), workspace_runtime=runtime))
    yield tool_set
    await tool_set.close()
    await runtime.close()


def context(session_id: str | None = None, user_id: str = "alice") -> InvocationContext:
    """A session of its own (a runtime's workspaces may outlive a test: each test has new ones)."""
    session = Session(app_name="app", user_id=user_id, id=session_id or uuid.uuid4().hex[:12])
    return InvocationContext(session=session, agent=None)


class Tools:
    def __init__(self, skill_tools: SkillToolSet, ctx: InvocationContext) -> None:
        self.tool_set = WorkspaceFileToolSet(skill_tools)
        self.ctx = ctx

    async def __call__(self, name: str, **args):
        tools = {t.name: t for t in await self.tool_set.get_tools()}
        return await tools[name].run_async(tool_context=self.ctx, args=args)


def refused(answer: dict, *words: str) -> None:
    assert set(answer) == {"success", "error"} and answer["success"] is False, answer
    for word in words:
        assert word in answer["error"], answer["error"]


async def test_a_file_written_with_write_is_read_by_the_next_skill_run(skill_tools):
    ctx = context()
    call = Tools(skill_tools, ctx)
    written = await call("Write", path="work/notes.txt", content="alpha\nbeta\n")
    assert written == {"success": True, "message": "SUCCESS: file work/notes.txt written to successfully (11 bytes)",
                       "path": "work/notes.txt"}
    assert (await call("Write", path="work/notes.txt", content="gamma\n", append=True))["success"]
    run = await skill_tools.skill_run(skill=SKILL, command="cat $WORK_DIR/notes.txt; echo made > $OUTPUT_DIR/r.txt",
                                      tool_context=ctx)
    assert run["stdout"] == "alpha\nbeta\ngamma\n" and run["exit_code"] == 0
    # and what skill_run leaves, the tools see
    assert await call("Read", path="out/r.txt") == {"success": True, "content": "made\n", "total_lines": 1,
                                                    "read_range": "1-1"}
    # another session has a workspace of its own
    refused(await Tools(skill_tools, context())("Read", path="work/notes.txt"), "not found")


async def test_edit_grep_glob_and_bash_act_in_the_workspace(skill_tools):
    call = Tools(skill_tools, context())
    await call("Write", path="work/src/app.py", content="def My_Function():\n    return 1\n# TODO\n")
    edited = await call("Edit", path="work/src/app.py", old_string="return 1", new_string="return 2")
    assert edited == {"success": True, "message": "SUCCESS: file work/src/app.py modified successfully",
                      "line_range": "2-2", "changed_line_ranges": [[2, 2]]}
    refused(await call("Edit", path="work/src/app.py", old_string="nothing like it", new_string="x"), "not found")
    grep = await call("Grep", pattern="def.*function", path="work", case_sensitive=False)
    assert grep["matches"] == [{"file": "work/src/app.py", "line": 1, "content": "def My_Function():"}]
    glob = await call("Glob", pattern="**/*.{py,txt}", path="work")
    assert glob["matches"] == ["work/src/app.py"] and glob["count"] == 1
    staged = await call("Glob", pattern="skills/*/SKILL.md")  # the staged skill's files are the workspace's too
    assert staged["count"] == 1 and staged["matches"][0].endswith("/SKILL.md")
    bash = await call("Bash", command="grep -c return app.py && pwd", cwd="work/src")
    assert bash["success"] and bash["stdout"].startswith("1\n") and bash["cwd"] == "work/src"
    assert bash["stdout"].rstrip().endswith("/work/src")


async def test_a_large_write_travels_as_an_input_and_leaves_nothing_behind(skill_tools):
    call = Tools(skill_tools, context())
    content = "x" * (workspace_mode.INLINE_ARGS_CHARS * 3) + "\n"
    assert (await call("Write", path="work/big.txt", content=content))["success"]
    assert (await call("Read", path="work/big.txt"))["content"] == content
    leftovers = await call("Bash", command="ls -A $WORK_DIR/inputs/.file-tools 2>/dev/null | wc -l")
    assert leftovers["stdout"].strip() == "0"


async def test_paths_outside_the_workspace_are_refused(skill_tools):
    ctx = context()
    call = Tools(skill_tools, ctx)
    # a link the skill planted, pointing out of the workspace (at the host's /etc, or the sandbox's)
    await skill_tools.skill_run(skill=SKILL, command="ln -s /etc $WORK_DIR/etc-link; ln -s /etc/hostname $WORK_DIR/h",
                                tool_context=ctx)
    for path in ("../x.txt", "/etc/hostname", "work/../../x.txt", "work/etc-link/hostname", "work/h"):
        refused(await call("Read", path=path), "outside the workspace")
        refused(await call("Write", path=path, content="planted"), "outside the workspace")
        refused(await call("Edit", path=path, old_string="a", new_string="b"), "outside the workspace")
    refused(await call("Write", path="work", content="x"), "is a directory")
    refused(await call("Glob", pattern="../*"), "may not contain '..'")
    refused(await call("Grep", pattern="root", path="work/etc-link"), "outside the workspace")
    for cwd in ("..", "/etc", "work/../.."):
        refused(await call("Bash", command="touch planted", cwd=cwd), "outside the workspace")
    refused(await call("Bash", command="touch planted", cwd="work/etc-link"), "outside the workspace")


async def test_bash_past_its_timeout_is_killed_in_the_workspace(skill_tools):
    call = Tools(skill_tools, context())
    answer = await call("Bash", command="sleep 30 & echo started; sleep 30", timeout=1)
    assert answer["success"] is False and "timed out after 1 seconds" in answer["error"]
    assert answer["stdout"] == "started\n"


async def test_without_a_session_the_tools_refuse(skill_tools):
    tool = next(t for t in await WorkspaceFileToolSet(skill_tools).get_tools() if t.name == "Read")
    refused(await tool.run_async(tool_context=None, args={"path": "work/x"}), "need a session")


async def test_read_refuses_binary_and_over_the_cap_and_reads_other_encodings(skill_tools, monkeypatch):
    ctx = context()
    call = Tools(skill_tools, ctx)
    await skill_tools.skill_run(skill=SKILL, tool_context=ctx, command=(
        "printf '\\211PNG\\r\\n\\032\\n\\000\\000' > $WORK_DIR/image.png; head -c 3000 /dev/zero | tr '\\0' a > "
        "$WORK_DIR/big.txt; printf '\\304\\343\\272\\303\\n' > $WORK_DIR/zh.txt; mkdir $WORK_DIR/folder"))
    refused(await call("Read", path="work/image.png"), "binary")
    assert (await call("Read", path="work/zh.txt"))["content"] == "你好\n"  # GB18030
    refused(await call("Read", path="work/folder"), "work/folder")
    monkeypatch.setattr(file_ops, "MAX_READ_BYTES", 2000)
    refused(await call("Read", path="work/big.txt"), "3000 bytes", "up to 2000 bytes")
    refused(await call("Read", path="work/missing.txt"), "not found")


async def test_writes_of_awkward_content_arrive_byte_for_byte(skill_tools):
    call = Tools(skill_tools, context())
    for content in ("it's {a} %s $HOME `id` \\n -x\n", "'" * (workspace_mode.INLINE_ARGS_CHARS // 2), "nul\0inside"):
        assert (await call("Write", path="work/odd.txt", content=content))["success"]
        run = await call("Bash", command="base64 -w0 odd.txt", cwd="work")
        assert base64.b64decode(run["stdout"]) == content.encode()


async def test_with_a_library_skill_staged_the_operations_travel_in_the_command(skill_tools):
    ctx = context()
    tool_set = WorkspaceFileToolSet(skill_tools, skill=SKILL)
    tools = {t.name: t for t in await tool_set.get_tools()}
    assert (await tools["Write"].run_async(tool_context=ctx, args={"path": "work/a.md", "content": "x = 1\n"}))["success"]
    edited = await tools["Edit"].run_async(tool_context=ctx, args={"path": "work/a.md", "old_string": "1",
                                                                    "new_string": "2"})
    assert edited["success"], edited
    globbed = await tools["Glob"].run_async(tool_context=ctx, args={"pattern": "work/*.md"})
    assert globbed["matches"] == ["work/a.md"]
    refused(await tools["Edit"].run_async(tool_context=ctx, args={"path": "../a.md", "old_string": "1",
                                                                   "new_string": "2"}), "outside the workspace")


async def test_an_agent_writes_runs_and_reads_back_in_its_sessions_workspace(skill_tools):
    # An agent on the platform: the skill tools and the workspace file tools side by side, driven by the real openai
    # client against the scripted model; the file the model writes is what its skill_run reads, and the reverse.
    server = ScriptedModelServer().start()
    try:
        server.add(
            {"tool_calls": [{"name": "Write", "arguments": {"path": "work/in.txt", "content": "3 4\n"}}]},
            {"tool_calls": [{"name": "skill_run", "arguments": {
                "skill": SKILL, "command": "awk '{print $1*$2}' $WORK_DIR/in.txt > $OUTPUT_DIR/product.txt"}}]},
            {"tool_calls": [{"name": "Read", "arguments": {"path": "out/product.txt"}}]},
            {"text": "12"},
        )
        model = OpenAIModel(model_name="test-model", api_key="k", base_url=server.base_url)
        agent = LlmAgent(name="builder", model=model, instruction="",
                         tools=[skill_tools, WorkspaceFileToolSet(skill_tools)])
        runner = Runner(app_name="files", agent=agent, session_service=InMemorySessionService())
        await runner.session_service.create_session(app_name="files", user_id="alice", session_id="chat-1")
        results = []
        async for event in runner.run_async(user_id="alice", session_id="chat-1",
                                            new_message=Content(parts=[Part.from_text(text="multiply")])):
            for part in (event.content.parts if event.content else []):
                if part.function_response:
                    results.append(part.function_response.response)
        await runner.close()
    finally:
        server.stop()
    written, ran, read = results
    assert written["success"] and ran["exit_code"] == 0, (written, ran)
    assert read == {"success": True, "content": "12\n", "total_lines": 1, "read_range": "1-1"}


async def test_an_answer_over_the_runs_output_limit_says_so(work_root):
    runtime = LocalWorkspaceRuntime(work_root / "small")
    tool_set = SkillToolSet(create_default_skill_repository(str(LIBRARY), workspace_runtime=runtime),
                            run_tool_kwargs={"limits": {"stdout_bytes": 2000}})
    try:
        call = Tools(tool_set, context())
        await call("Write", path="work/many.txt", content="match\n" * 1000)
        refused(await call("Grep", pattern="match", max_results=1000), "larger than the run's output limit (2000")
        assert (await call("Grep", pattern="match", path="work", max_results=5))["total_matches"] == 1000
    finally:
        await tool_set.close()
        await runtime.close()
