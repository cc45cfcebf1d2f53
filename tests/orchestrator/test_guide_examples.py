"""The user guides' examples, written against ``orchestrator`` instead of ``trpc_agent_sdk``, run end to end.

Each test uses the imports, constructors and event-handling loop the guides show, against the scripted
OpenAI-compatible server (``OPENAI_BASE_URL`` points the string model names at it).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest
from typing_extensions import override

from orchestrator.agents import LlmAgent
from orchestrator.code_executors import create_local_workspace_runtime
from orchestrator.context import InvocationContext
from orchestrator.models import LLMModel, OpenAIModel
from orchestrator.models import constants as const
from orchestrator.runners import Runner
from orchestrator.sessions import InMemorySessionService
from orchestrator.skills import DynamicSkillToolSet, SkillToolSet, create_default_skill_repository
from orchestrator.skills.tools import LinkSkillStager
from orchestrator.tools import (
    BaseTool,
    BaseToolSet,
    FunctionTool,
    StreamingFunctionTool,
    WebFetchTool,
    WebSearchTool,
    get_tool,
    register_tool,
)
from orchestrator.types import Content, Part
from tests.orchestrator.weather_tools import ask_name_information
from tests.web_server import WebServer

LIBRARY = Path(__file__).resolve().parents[2] / "skills"


@pytest.fixture(autouse=True)
def endpoint(model_server, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", model_server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")


async def consume(runner: Runner, query: str) -> dict:
    """The guides' event loop: stream text, count streaming-tool deltas, note calls and results."""
    seen = {"text": "", "streamed_args": "", "calls": [], "results": [], "answers": []}
    session_id = str(uuid.uuid4())
    await runner.session_service.create_session(app_name=runner.app_name, user_id="demo_user", session_id=session_id)
    user_content = Content(parts=[Part.from_text(text=query)])
    async for event in runner.run_async(user_id="demo_user", session_id=session_id, new_message=user_content):
        if not event.content or not event.content.parts:
            continue
        if event.is_streaming_tool_call():
            for part in event.content.parts:
                if part.function_call:
                    seen["streamed_args"] += part.function_call.args.get(const.TOOL_STREAMING_ARGS, "")
            continue
        if event.partial:
            for part in event.content.parts:
                if part.text:
                    seen["text"] += part.text
            continue
        for part in event.content.parts:
            if part.thought:
                continue
            if part.function_call:
                seen["calls"].append(part.function_call.name)
            elif part.function_response:
                seen["results"].append(part.function_response.response)
            elif part.text:
                seen["answers"].append(part.text)
    await runner.close()
    return seen


async def get_weather(city: str) -> dict:
    """Get the weather of a city.

    Args:
        city: City name, such as "Beijing".
    """
    data = {"Beijing": {"temperature": "15°C", "condition": "Sunny"}}
    if city in data:
        return {"status": "success", "city": city, **data[city]}
    return {"status": "error", "error_message": f"no data for {city}", "supported_cities": list(data)}


async def test_function_tool_example(model_server):
    model_server.add({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Beijing"}}]}, {"text": "Sunny, 15°C."})
    weather_tool = FunctionTool(get_weather)
    agent = LlmAgent(
        name="function_tool_demo_agent", model="deepseek-chat",
        description="An assistant demonstrating FunctionTool usage", instruction="You answer weather questions.",
        tools=[weather_tool],
    )
    seen = await consume(Runner(app_name="function_tools", agent=agent, session_service=InMemorySessionService()), "Beijing?")
    assert model_server.requests[0]["model"] == "deepseek-chat"
    assert seen["calls"] == ["get_weather"]
    assert seen["results"][0]["condition"] == "Sunny"
    assert seen["answers"] == ["Sunny, 15°C."]


@register_tool("get_session_info")
async def get_session_info(tool_context: InvocationContext) -> dict:
    """Get the current session's information."""
    session = tool_context.session
    return {"status": "success", "session_id": session.id, "user_id": session.user_id, "app_name": session.app_name}


async def test_registered_tool_with_injected_context_example(model_server):
    model_server.add({"tool_calls": [{"name": "get_session_info", "arguments": {}}]}, {"text": "ok"})
    session_tool = get_tool("get_session_info")
    agent = LlmAgent(name="session_agent", model="deepseek-chat", tools=[session_tool])
    seen = await consume(Runner(app_name="registry_demo", agent=agent, session_service=InMemorySessionService()), "who am I?")
    assert seen["results"][0]["user_id"] == "demo_user"
    assert seen["results"][0]["app_name"] == "registry_demo"


def write_file(path: str, content: str) -> dict:
    """Write content to a file (streamed).

    Args:
        path: The file's path.
        content: What to write.
    """
    return {"success": True, "path": path, "size": len(content)}


def get_file_info(path: str) -> dict:
    """Get information about a file."""
    return {"path": path, "exists": True}


class CustomStreamingWriteTool(BaseTool):
    def __init__(self):
        super().__init__(name="custom_write", description="A custom streaming write tool")

    @property
    @override
    def is_streaming(self) -> bool:
        return True

    @override
    async def _run_async_impl(self, *, tool_context, args):
        return {"success": True}


class FileToolSet(BaseToolSet):
    def __init__(self):
        super().__init__(name="file_tools")
        self._tools = [StreamingFunctionTool(self._write_file), FunctionTool(self._get_file_info)]

    def _write_file(self, path: str, content: str) -> dict:
        """Write a file (streamed)."""
        return {"success": True, "path": path, "size": len(content)}

    def _get_file_info(self, path: str) -> dict:
        """File information (not streamed)."""
        return {"path": path, "exists": True}

    async def get_tools(self, invocation_context=None):
        return self._tools


async def test_streaming_tools_example(model_server):
    code = "def add(a, b):\n    return a + b\n"
    model_server.add(
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "hello.py", "content": code}}]},
        {"text": "Created hello.py."},
    )

    def _create_model() -> LLMModel:
        return OpenAIModel(model_name="demo-model", api_key="test-key", base_url=model_server.base_url)

    agent = LlmAgent(
        name="streaming_tool_demo_agent", description="An assistant demonstrating streaming tool usage",
        model=_create_model(), instruction="Write files when asked.",
        tools=[StreamingFunctionTool(write_file), FunctionTool(get_file_info)],
    )
    seen = await consume(Runner(app_name="streaming_tool_demo", agent=agent, session_service=InMemorySessionService()), "calc")
    assert '"content": "def add' in seen["streamed_args"]
    assert seen["results"] == [{"success": True, "path": "hello.py", "size": len(code)}]
    assert seen["text"] == "Created hello.py."
    assert StreamingFunctionTool(write_file).is_streaming and not FunctionTool(get_file_info).is_streaming
    assert StreamingFunctionTool(FunctionTool(write_file)).is_streaming
    assert CustomStreamingWriteTool().is_streaming


async def test_streaming_tools_inside_a_toolset_are_detected(model_server):
    model_server.add(
        {"tool_calls": [{"name": "_write_file", "arguments": {"path": "a.txt", "content": "hello"}},
                        {"name": "_get_file_info", "arguments": {"path": "a.txt"}}]},
        {"text": "done"},
    )
    agent = LlmAgent(name="toolset_streaming", model="demo-model", tools=[FileToolSet(), CustomStreamingWriteTool()])
    seen = await consume(Runner(app_name="t", agent=agent, session_service=InMemorySessionService()), "write")
    assert seen["streamed_args"] == '{"path": "a.txt", "content": "hello"}'
    assert len(seen["results"]) == 2


async def test_skills_example(model_server, work_root):
    model_server.add(
        {"tool_calls": [{"name": "skill_load", "arguments": {"skill_name": "user-file-ops"}}]},
        {"tool_calls": [{"name": "skill_run", "arguments": {
            "skill": "user-file-ops",
            "command": "printf 'hello from skillrun\\nthis is another line\\n' > work/inputs/user-notes.txt && "
                       "bash scripts/summarize_file.sh work/inputs/user-notes.txt out/user-notes-summary.txt",
            "output_files": ["out/user-notes-summary.txt"]}}]},
        {"text": "Summarized: 2 lines, 7 words."},
    )
    workspace_runtime = create_local_workspace_runtime(work_root=str(work_root))
    repository = create_default_skill_repository(str(LIBRARY), workspace_runtime=workspace_runtime, use_cached_repository=True)
    skill_tool_set = SkillToolSet(
        repository=repository, skill_stager=LinkSkillStager(),
        run_tool_kwargs={"save_as_artifacts": True, "omit_inline_content": False},
    )
    agent = LlmAgent(
        name="skill_run_agent", description="A professional skill run assistant that can use Agent Skills.",
        model="demo-model", instruction="Use skills.", tools=[skill_tool_set], skill_repository=repository,
    )
    seen = await consume(Runner(app_name="skills_demo", agent=agent, session_service=InMemorySessionService()), "summarize")
    assert seen["results"][0] == {"result": "skill 'user-file-ops' loaded"}
    run = seen["results"][1]
    assert run["exit_code"] == 0
    assert run["output_files"][0]["name"] == "out/user-notes-summary.txt"
    assert "Lines: 2" in run["output_files"][0]["content"]
    assert run["output_files"][0]["mime_type"] == "text/plain"
    assert run["artifact_files"][0]["name"] == "out/user-notes-summary.txt"
    await workspace_runtime.close()


async def test_dynamic_skills_example(model_server, work_root):
    model_server.add(
        {"tool_calls": [{"name": "skill_load", "arguments": {"skill_name": "weather-tools"}}]},
        {"tool_calls": [{"name": "get_current_weather", "arguments": {"city": "Beijing"}}]},
        {"text": "22°C and partly cloudy."},
    )
    skill_repository = create_default_skill_repository(str(LIBRARY), workspace_runtime=create_local_workspace_runtime(str(work_root)))
    available_tools = {"get_current_weather", "get_weather_forecast", "search_city_by_name", FunctionTool(ask_name_information)}
    dynamic_toolset = DynamicSkillToolSet(skill_repository=skill_repository, available_tools=available_tools)
    agent = LlmAgent(
        name="dynamic_skill_agent", model="demo-model", instruction="Use skills.",
        tools=[SkillToolSet(repository=skill_repository), dynamic_toolset], skill_repository=skill_repository,
    )
    seen = await consume(Runner(app_name="dynamic", agent=agent, session_service=InMemorySessionService()), "Beijing weather")
    before, after, _ = ({t["function"]["name"] for t in body.get("tools", [])} for body in model_server.requests)
    assert after - before == {"get_current_weather", "get_weather_forecast", "search_city_by_name"}
    assert "ask_name_information" not in after
    assert seen["results"][1]["condition"] == "Partly Cloudy"
    assert seen["answers"] == ["22°C and partly cloudy."]


# -- MCP tools: the tools guide's MCPToolset examples --------------------------------------------------------------

import os  # noqa: E402
import sys  # noqa: E402

from orchestrator.tools import (
    McpStdioServerParameters,  # noqa: E402
    MCPToolset,  # noqa: E402
    SseConnectionParams,  # noqa: E402
    StdioConnectionParams,  # noqa: E402
    StreamableHTTPConnectionParams,  # noqa: E402
)
from tests.mcp_servers import McpHttpServer  # noqa: E402
from tests.processes import running_with, wait_none_with  # noqa: E402

# The guide's MCP server (``mcp_server.py`` beside the example's ``agent/`` folder), verbatim.
GUIDE_MCP_SERVER = '''\
from mcp.server import FastMCP

app = FastMCP("simple-tools")


@app.tool()
async def get_weather(location: str) -> str:
    """获取指定地点的天气信息

    Args:
        location: 地点名称

    Returns:
        天气信息字符串
    """
    weather_info = {
        "Beijing": "Sunny, 15°C, humidity 45%",
        "Shanghai": "Cloudy, 18°C, humidity 65%",
        "Shenzhen": "Light rain, 25°C, humidity 80%",
    }
    return weather_info.get(location, f"Weather data for {location} is not available")


@app.tool()
async def calculate(operation: str, a: float, b: float) -> float:
    """执行基本数学运算

    Args:
        operation: 运算类型 (add, subtract, multiply, divide)
        a: 第一个数字
        b: 第二个数字

    Returns:
        计算结果
    """
    operations = {
        "add": lambda x, y: x + y,
        "subtract": lambda x, y: x - y,
        "multiply": lambda x, y: x * y,
        "divide": lambda x, y: x / y if y != 0 else float("inf"),
    }
    if operation not in operations:
        raise ValueError(f"Unsupported operation: {operation}")
    return operations[operation](a, b)


if __name__ == "__main__":
    # 取消注释以下其中一行以选择传输模式：
    app.run(transport="stdio")
    # app.run(transport="sse")
    # app.run(transport="streamable-http")

'''

INSTRUCTION = "You answer weather questions and do arithmetic with your tools."


def _guide_mcp_script(model_server) -> list[dict]:
    model_server.add(
        {"tool_calls": [{"name": "get_weather", "arguments": {"location": "Beijing"}},
                        {"name": "calculate", "arguments": {"operation": "add", "a": 1.5, "b": 2}}]},
        {"text": "Sunny in Beijing; 1.5 + 2 = 3.5."},
    )


def _assert_guide_mcp_run(seen: dict, model_server) -> None:
    assert [t["function"]["name"] for t in model_server.requests[0]["tools"]][:2] == ["get_weather", "calculate"]
    assert seen["calls"] == ["get_weather", "calculate"]
    assert seen["results"][0]["result"] == "Sunny, 15°C, humidity 45%"
    assert seen["results"][1]["result"] == "3.5"
    assert seen["answers"] == ["Sunny in Beijing; 1.5 + 2 = 3.5."]


async def test_mcp_stdio_toolset_example(model_server, monkeypatch, tmp_path):
    (tmp_path / "mcp_server.py").write_text(GUIDE_MCP_SERVER)
    (tmp_path / "agent").mkdir()
    # The guide's toolset is defined in agent/tools.py and starts ../mcp_server.py with ``python3.X`` from PATH:
    # here that module path is this test's, and the PATH finds the interpreter that has the ``mcp`` package first.
    __file__ = str(tmp_path / "agent" / "tools.py")  # noqa: F841 - read by the guide's __init__ below
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}")

    class StdioMCPToolset(MCPToolset):
        """基于 stdio 的 MCP 工具集，自动启动 MCP 服务器子进程。"""

        def __init__(self):
            super().__init__()
            env = os.environ.copy()
            env["LD_LIBRARY_PATH"] = (
                f"/usr/local/Python{sys.version_info.major}{sys.version_info.minor}/lib/:"
                + env.get("LD_LIBRARY_PATH", "")
            )
            svr_file = os.path.abspath(
                os.path.join(os.path.dirname(__file__), "..", "mcp_server.py")
            )
            # 配置 stdio 传输：以子进程方式启动 MCP 服务器
            stdio_server_params = McpStdioServerParameters(
                command=f"python{sys.version_info.major}.{sys.version_info.minor}",  # 启动命令
                args=[svr_file],  # 命令参数
                env=env,  # 环境变量（可选）
            )
            self._connection_params = StdioConnectionParams(
                server_params=stdio_server_params,
                timeout=5,  # 可选的超时时间，默认是 5s
            )
            # 取消注释以仅暴露指定工具，而非全部工具：
            # self._tool_filter = ["get_weather", "calculate"]

    def _create_model() -> LLMModel:
        return OpenAIModel(model_name="demo-model", api_key="test-key", base_url=model_server.base_url)

    def create_agent() -> LlmAgent:
        """创建一个使用 MCP 工具的 Agent"""
        mcp_toolset = StdioMCPToolset()
        # mcp_toolset = SseMCPToolset()
        # mcp_toolset = StreamableHttpMCPToolset()

        agent = LlmAgent(
            name="mcp_assistant",
            description="An assistant that uses MCP tools for weather and calculation",
            model=_create_model(),
            instruction=INSTRUCTION,
            tools=[mcp_toolset],
        )
        return agent

    root_agent = create_agent()
    _guide_mcp_script(model_server)
    seen = await consume(Runner(app_name="mcp_tools", agent=root_agent, session_service=InMemorySessionService()), "q")
    _assert_guide_mcp_run(seen, model_server)
    server_file = str(tmp_path / "mcp_server.py")
    assert wait_none_with(server_file), f"the guide's stdio server is still running: {running_with(server_file)}"


@pytest.mark.parametrize("transport", ["sse", "streamable-http"])
async def test_mcp_http_toolset_examples(model_server, transport):
    # The guide's HTTP toolsets reach a server started beforehand (its mcp_server.py run with
    # app.run(transport="sse") or "streamable-http"): tests/mcp_servers.py has the same two tools, on a free port
    # instead of the guide's 8000.
    with McpHttpServer(transport) as server:
        port = server.port

        class SseMCPToolset(MCPToolset):
            """基于 SSE 的 MCP 工具集，通过 Server-Sent Events 连接远程 MCP 服务器。"""

            def __init__(self):
                super().__init__()
                self._connection_params = SseConnectionParams(
                    # 必填，用户根据实际地址替换url
                    url=f"http://localhost:{port}/sse",
                    # 可选的 HTTP 头
                    headers={"Authorization": "Bearer token"},
                    # 可选的超时时间，单位秒
                    timeout=5,
                    # 可选的 SSE 读取超时时间，单位秒
                    sse_read_timeout=60 * 5,
                )

        class StreamableHttpMCPToolset(MCPToolset):
            """基于 Streamable-HTTP 的 MCP 工具集，支持 HTTP 双向流式通信。"""

            def __init__(self):
                super().__init__()
                self._connection_params = StreamableHTTPConnectionParams(
                    # 必填，用户根据实际地址替换url
                    url=f"http://localhost:{port}/mcp",
                    # 可选的 HTTP 头
                    headers={"Authorization": "Bearer token"},
                    # 可选的超时时间，单位秒
                    timeout=5,
                    # 可选的 SSE 读取超时时间，单位秒
                    sse_read_timeout=60 * 5,
                    # 可选的关闭客户端会话，默认是 True
                    terminate_on_close=True,
                )

        def create_agent() -> LlmAgent:
            """创建一个使用 MCP 工具的 Agent"""
            mcp_toolset = SseMCPToolset() if transport == "sse" else StreamableHttpMCPToolset()

            agent = LlmAgent(
                name="mcp_assistant",
                description="An assistant that uses MCP tools for weather and calculation",
                model="deepseek-chat",
                instruction=INSTRUCTION,
                tools=[mcp_toolset],
            )
            return agent

        _guide_mcp_script(model_server)
        seen = await consume(Runner(app_name="mcp_tools", agent=create_agent(), session_service=InMemorySessionService()), "q")
    _assert_guide_mcp_run(seen, model_server)
    assert model_server.requests[0]["model"] == "deepseek-chat"


# --- TodoWriteTool, the Task tools, the Goal tools, LangChain tools ----------------------------------------------

import json  # noqa: E402
from typing import Any  # noqa: E402

from orchestrator.tools import (  # noqa: E402
    TaskToolSet,
    TodoWriteTool,
    get_task_store,
    get_todos,
    render_task_list,
    render_todos,
)
from orchestrator.tools.goal_tools import (  # noqa: E402
    GoalOptions,
    RetryEvent,
    get_goal_record,
    render_goal,
    setup_goal,
    start_goal,
)
from tests.orchestrator import tavily_standin  # noqa: E402
from tests.orchestrator.conftest import system_message, tool_messages  # noqa: E402


class Conversation:
    """One session of the guide's multi-turn examples (their run_agent.py): say something, read the session back."""

    def __init__(self, agent: LlmAgent, app_name: str) -> None:
        self.service = InMemorySessionService()
        self.runner = Runner(app_name=app_name, agent=agent, session_service=self.service)
        self.app_name = app_name

    async def say(self, query: str) -> list[str]:
        """One user message (the runner creates the session on the first); the final answers."""
        answers = []
        async for event in self.runner.run_async(user_id="demo_user", session_id="s1",
                                                 new_message=Content(parts=[Part.from_text(text=query)])):
            if event.is_final_response():
                answers.extend(p.text for p in event.content.parts if p.text)
        return answers

    async def session(self):
        return await self.service.get_session(app_name=self.app_name, user_id="demo_user", session_id="s1")


def guide_model(model_server) -> OpenAIModel:
    # The guide's OpenAIModel(model_name="...", api_key="...", base_url="..."), pointed at the scripted server.
    return OpenAIModel(model_name="deepseek-chat", api_key="test-key", base_url=model_server.base_url)


def todo(content: str, active: str, status: str) -> dict:
    return {"content": content, "activeForm": active, "status": status}


async def test_todo_write_tool_example(model_server):
    # examples/todo_tool: one session, several turns of "plan, then finish item by item", the list read back each time.
    model_server.add(
        {"tool_calls": [{"name": "todo_write", "arguments": {"todos": [
            todo("设计接口", "设计接口中", "in_progress"), todo("编写实现", "编写实现中", "pending")]}}]},
        {"text": "计划已建立。"},
        {"tool_calls": [{"name": "todo_write", "arguments": {"todos": [
            todo("设计接口", "设计接口中", "completed"), todo("编写实现", "编写实现中", "in_progress")]}}]},
        {"text": "接口已完成。"},
    )
    agent = LlmAgent(
        name="todo_planner",
        model=guide_model(model_server),
        instruction="你是规划型助手，多步任务请用 todo_write 维护清单。",
        tools=[TodoWriteTool()],
    )
    chat = Conversation(agent, "todo_demo")
    assert await chat.say("做一个两步的小项目") == ["计划已建立。"]
    todos = get_todos(await chat.session(), branch=agent.name)
    assert render_todos(todos) == "🔄 设计接口中\n⬜ 编写实现"
    assert await chat.say("继续") == ["接口已完成。"]
    assert render_todos(get_todos(await chat.session(), branch=agent.name)) == "✅ 设计接口\n🔄 编写实现中"
    assert "todo_write" in system_message(model_server.requests[0])
    second = json.loads(tool_messages(model_server.requests[3])[-1]["content"])
    assert [t["status"] for t in second["oldTodos"]] == ["in_progress", "pending"]
    await chat.runner.close()


async def test_task_tool_set_example(model_server):
    # The guide's board: #1 blocks #2 and #4, #2 blocks #3; completing #1 unblocks ['2', '4'], then #2 unblocks ['3'].
    creates = [{"name": "task_create", "arguments": {"subject": s}} for s in ("设计表结构", "实现 API", "单元测试", "编写文档")]
    model_server.add(
        {"tool_calls": creates},
        {"tool_calls": [{"name": "task_update", "arguments": {"taskId": "1", "addBlocks": ["2", "4"]}},
                        {"name": "task_update", "arguments": {"taskId": "3", "addBlockedBy": ["2"]}}]},
        {"tool_calls": [{"name": "task_update", "arguments": {"taskId": "1", "status": "in_progress"}}]},
        {"tool_calls": [{"name": "task_update", "arguments": {"taskId": "1", "status": "completed"}}]},
        {"tool_calls": [{"name": "task_update", "arguments": {"taskId": "2", "status": "in_progress"}}]},
        {"text": "#1 完成，#2 进行中。"},
        {"tool_calls": [{"name": "task_update", "arguments": {"taskId": "2", "status": "completed"}},
                        {"name": "task_list", "arguments": {}}]},
        {"text": "#2 完成。"},
    )
    agent = LlmAgent(
        name="task_planner",
        model=guide_model(model_server),
        instruction="多步项目请用 task_create / task_update 维护看板。",
        tools=[TaskToolSet()],
        # parallel_tool_calls=True 时，同批多个 task 工具由 task_store_lock 保护 store 一致性
    )
    chat = Conversation(agent, "task_demo")
    assert await chat.say("规划并开始") == ["#1 完成，#2 进行中。"]
    store = get_task_store(await chat.session(), branch=agent.name)
    assert render_task_list(store).splitlines()[:3] == ["✅ #1 设计表结构", "🔄 #2 实现 API", "⬜ #3 单元测试 (blocked by: 2)"]
    assert json.loads(tool_messages(model_server.requests[4])[-1]["content"])["unblocked"] == ["2", "4"]
    assert await chat.say("继续") == ["#2 完成。"]
    completed_2, listed = (json.loads(m["content"]) for m in tool_messages(model_server.requests[-1])[-2:])
    assert completed_2["unblocked"] == ["3"]
    assert listed["stats"] == {"pending": 2, "in_progress": 0, "completed": 2}
    assert all("description" not in t for t in listed["tasks"])
    assert system_message(model_server.requests[0]).count("task_create, task_update, task_get, task_list") == 1
    await chat.runner.close()


async def test_goal_tools_example(model_server, capsys):
    def on_retry(event: RetryEvent) -> None:
        if event.reason == "blocked":
            print(f"拦截过早收尾 (attempt {event.attempt_number}/{event.max_retries})")

    agent = LlmAgent(
        name="goal_agent",
        model=guide_model(model_server),
        instruction="多步工程任务请用 goal 工具跟踪完成状态。",
        tools=[FunctionTool(write_file)],  # 业务工具，如 BashTool / WriteTool
    )
    setup_goal(agent, GoalOptions(max_retries=3, on_retry=on_retry))

    service = InMemorySessionService()
    session_service = service
    session_id = "s1"
    goal = await start_goal(
        session_service,
        app_name="my_app",
        user_id="user_1",
        session_id=session_id,
        objective="在当前目录创建 notes/ 并写入 summary.txt 与 example.py",
        agent_name=agent.name,  # 与 LlmAgent.name 一致，用于 branch 隔离
    )
    assert goal.status.value == "active"
    model_server.add(
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "notes/summary.txt", "content": "s"}}]},
        {"text": "写好了 summary.txt。"},  # premature: the goal is open, example.py is missing
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "notes/example.py", "content": "e"}}]},
        {"tool_calls": [{"name": "update_goal", "arguments": {"status": "complete"}}]},
        {"text": "两个文件都已写好。"},
    )
    runner = Runner(app_name="my_app", agent=agent, session_service=session_service)
    answers = []
    async for event in runner.run_async(user_id="user_1", session_id=session_id,
                                        new_message=Content(parts=[Part.from_text(text="开始")])):
        if event.is_final_response():
            answers.append(event.content.parts[0].text)
    assert answers == ["两个文件都已写好。"]
    assert capsys.readouterr().out == "拦截过早收尾 (attempt 1/3)\n"
    nudged = model_server.requests[2]["messages"][-1]
    assert nudged["role"] == "user" and nudged["content"].startswith("[goal reminder]")
    assert "session goal tools" in system_message(model_server.requests[0])

    session = await service.get_session(app_name="my_app", user_id="user_1", session_id=session_id)
    goal = get_goal_record(session, branch=agent.name)
    lines = render_goal(goal).splitlines()
    assert lines[0] == "✅ Goal [complete]"
    assert lines[1] == "   objective: 在当前目录创建 notes/ 并写入 summary.txt 与 example.py"
    assert lines[2].startswith("   created:   ") and lines[3].startswith("   terminal:  ")
    await runner.close()


async def test_langchain_tavily_tool_example(model_server, monkeypatch):
    # langchain_tavily calls Tavily's service; a stand-in on langchain_core answers here (tests/orchestrator/tavily_standin.py).
    monkeypatch.setitem(sys.modules, "langchain_tavily", tavily_standin)
    from langchain_tavily import TavilySearch

    async def tavily_search(query: str, max_results: int = 5) -> dict[str, Any]:
        """基于 Tavily 的联网搜索

        Args:
            query: 搜索查询
            max_results: 返回结果条数上限

        Returns:
            结构化的搜索结果，包含命中列表与计数
        """
        try:
            # 实例化 TavilySearch，传入最大结果数
            tool = TavilySearch(max_results=max_results)
            # 异步调用搜索，非阻塞
            res = await tool.ainvoke(query)

            # 兼容不同版本的返回格式：dict 带 "results" 键 / 直接返回 list / 其他
            if isinstance(res, dict) and "results" in res:
                items = res["results"]
            elif isinstance(res, list):
                items = res
            else:
                items = []

            # 统一返回结构化结果
            return {
                "status": "success",
                "query": query,
                "result_count": len(items),
                "results": items,
            }
        except Exception as e:  # pylint: disable=broad-except
            # 捕获所有异常，返回错误信息而非抛出，避免中断对话流程
            return {"status": "error", "error_message": str(e)}

    def create_agent() -> LlmAgent:
        """创建集成 LangChain Tavily 搜索工具的 Agent"""
        agent = LlmAgent(
            name="langchain_tavily_agent",
            description="An assistant integrated with LangChain Tavily search tool",
            model=guide_model(model_server),
            instruction="You search the web with tavily_search and cite the results.",
            tools=[FunctionTool(tavily_search)],
        )
        return agent

    model_server.add(
        {"tool_calls": [{"name": "tavily_search", "arguments": {"query": "trpc agent", "max_results": 2}},
                        {"name": "tavily_search", "arguments": {"query": " "}}]},
        {"text": "Found two pages."},
    )
    seen = await consume(Runner(app_name="langchain_tools", agent=create_agent(), session_service=InMemorySessionService()), "q")
    declared = model_server.requests[0]["tools"][0]["function"]
    assert declared["name"] == "tavily_search" and declared["parameters"]["required"] == ["query"]
    assert seen["results"][0]["status"] == "success" and seen["results"][0]["result_count"] == 2
    assert seen["results"][0]["results"][0]["url"] == "https://example.org/trpc-agent"
    assert seen["results"][1] == {"status": "error", "error_message": "query must not be empty"}
    assert seen["answers"] == ["Found two pages."]


# -- WebFetchTool and WebSearchTool ----------------------------------------------------------------------------------
# The guide's agent/agent.py and run_agent.py for each tool, as written. There is no internet here: the pages and the
# search APIs are local servers, reached through the options the tools have for that (``private_hosts`` and
# ``resolver`` for the fetch tool, which refuses loopback by default; ``base_url`` for the search tool).

WEB_INSTRUCTION = "When a tool returns an error field, repeat its code to the user and explain it; do not invent content."
EXAMPLE_PAGE = b"""<html><head><title>Example Domain</title><script>var t = 1;</script></head><body>
<h1>Example Domain</h1><p>This domain is for use in illustrative examples in documents.</p></body></html>"""


@pytest.fixture
def web():
    server = WebServer().start()
    server.routes["/"] = (200, {"Content-Type": "text/html; charset=UTF-8"}, EXAMPLE_PAGE)
    yield server
    server.stop()


def get_model_config() -> tuple[str, str, str]:
    """The guide's ``.config.get_model_config``: (api_key, url, model_name)."""
    return os.environ["OPENAI_API_KEY"], os.environ["OPENAI_BASE_URL"], "deepseek-chat"


def _create_model() -> LLMModel:
    """创建 LLM 模型"""
    api_key, url, model_name = get_model_config()
    return OpenAIModel(model_name=model_name, api_key=api_key, base_url=url)


def create_default_fetch_agent(**test_options) -> LlmAgent:
    """创建 WebFetchTool Agent"""
    web_fetch = WebFetchTool(
        timeout=10.0, # 超时时间配置
        user_agent="trpc-agent-python-webfetch-example/1.0", # User-Agent 头
        max_content_length=4000, # 返回文本字符上限
        max_response_bytes=1 * 1024 * 1024, # 读取的原始字节上限
        follow_redirects=True, # 手动重定向循环
        max_redirects=3, # 重定向最大跳数上限
        block_private_network=True, # SSRF 防护开关
        **test_options,
    )
    return LlmAgent(
        name="default_webfetch_assistant",
        description="Web-reading assistant that fetches a single URL and summarises its textual content.",
        model=_create_model(),
        instruction=WEB_INSTRUCTION,
        tools=[web_fetch],
    )


async def _run_one_query(runner: Runner, *, label: str, query: str) -> None:
    """Drive a single user query through ``runner`` and pretty-print events."""
    session_id = str(uuid.uuid4())
    await runner.session_service.create_session(
        app_name=runner.app_name,
        user_id="demo_user",
        session_id=session_id,
        state={"user_name": "demo_user"},
    )

    print(f"\n========== {label} ==========")
    print(f"📝 User: {query}")
    print("🤖 Assistant: ", end="", flush=True)

    user_content = Content(parts=[Part.from_text(text=query)])
    async for event in runner.run_async(
            user_id="demo_user",
            session_id=session_id,
            new_message=user_content,
    ):
        if not event.content or not event.content.parts:
            continue

        if event.partial:
            for part in event.content.parts:
                if part.text:
                    print(part.text, end="", flush=True)
            continue

        for part in event.content.parts:
            # 跳过思考部分
            if part.thought:
                continue
            # 打印工具调用
            if part.function_call:
                print(f"\n🔧 [Invoke Tool: {part.function_call.name}({part.function_call.args})]")
            # 打印工具响应
            elif part.function_response:
                resp = part.function_response.response
                print(f"📊 [Tool Result: {resp}]")

    print("\n" + "-" * 40)


async def _drive_agent(agent: LlmAgent, *, app_name: str, scenarios: list[tuple[str, str]]) -> None:
    """驱动 Agent 执行场景"""
    runner = Runner(
        app_name=app_name,
        agent=agent,
        session_service=InMemorySessionService(),
    )
    for label, query in scenarios:
        await _run_one_query(runner, label=label, query=query)
    await runner.close()


def _tool_results(model_server) -> list[dict]:
    """What each tool call returned, as the model was sent it."""
    return [json.loads(m["content"]) for body in model_server.requests for m in body["messages"] if m["role"] == "tool"]


async def test_webfetch_tool_example_refuses_loopback_by_default(model_server, web, capsys):
    url = f"http://localhost:{web.port}"
    model_server.add({"tool_calls": [{"name": "webfetch", "arguments": {"url": url}}]},
                     {"text": "The fetch was refused (SSRF_BLOCKED_URL)."})
    await _drive_agent(create_default_fetch_agent(), app_name="webfetch_agent_demo", scenarios=[
        ("Default · plain fetch", f"Fetch {url} and summarise the page in one short paragraph."),
    ])
    out = capsys.readouterr().out
    assert f"🔧 [Invoke Tool: webfetch({{'url': '{url}'}})]" in out
    assert "SSRF_BLOCKED_URL: localhost resolves to private/reserved address 127.0.0.1" in out
    assert web.requests == []


async def test_webfetch_tool_example_scenarios(model_server, web, capsys):
    """The guide's full example: plain fetch, per-call max_length, a cache hit, allow- and block-list refusals."""
    page = f"http://example.com:{web.port}/"
    test_options = {"private_hosts": ["example.com"], "resolver": lambda host, port: ["127.0.0.1"]}
    model_server.add(
        {"tool_calls": [{"name": "webfetch", "arguments": {"url": page}}]}, {"text": "An example page."},
        {"tool_calls": [{"name": "webfetch", "arguments": {"url": page, "max_length": 14}}]}, {"text": "Short."},
    )
    await _drive_agent(create_default_fetch_agent(**test_options), app_name="webfetch_agent_demo", scenarios=[
        ("Default · plain fetch", f"Fetch {page} and summarise the page in one short paragraph."),
        ("max_length override", f"Fetch {page} with max_length=14."),
    ])
    cached = create_default_fetch_agent(enable_cache=True, cache_ttl_seconds=120.0, cache_max_bytes=1024 * 1024, **test_options)
    model_server.add(
        {"tool_calls": [{"name": "webfetch", "arguments": {"url": page}}]}, {"text": "Fetched."},
        {"tool_calls": [{"name": "webfetch", "arguments": {"url": f"http://www.example.com:{web.port}"}}]}, {"text": "Again."},
    )
    await _drive_agent(cached, app_name="webfetch_agent_demo", scenarios=[("LRU cache", "Fetch it"), ("LRU cache", "Again")])
    allow = create_default_fetch_agent(allowed_domains=["python.org"], **test_options)
    block = create_default_fetch_agent(blocked_domains=["example.com"], **test_options)
    for agent in (allow, block):
        model_server.add({"tool_calls": [{"name": "webfetch", "arguments": {"url": page}}]}, {"text": "Refused."})
        await _drive_agent(agent, app_name="webfetch_agent_demo", scenarios=[("Domain policy", f"Fetch {page}")])

    plain, short, first, again, allowed, blocked = _tool_results(model_server)
    assert plain["url"] == page and plain["status_code"] == 200 and plain["status_text"] == "OK"
    assert plain["content_type"] == "text/html" and plain["error"] == "" and plain["cached"] is False
    assert plain["content"].startswith("Example Domain\n\n# Example Domain\n\nThis domain is for use in")
    assert "var t" not in plain["content"] and plain["bytes"] == len(plain["content"].encode())
    assert short["content"] == plain["content"][:14] and short["bytes"] == 14
    assert first["cached"] is False and again["cached"] is True and again["content"] == first["content"]
    for refused in (allowed, blocked):
        assert refused["error"] == "BLOCKED_URL: 'example.com' is not permitted by the tool's domain policy"
    assert len(web.requests) == 3  # plain, max_length, the first cached fetch
    assert {r.headers["User-Agent"] for r in web.requests} == {"trpc-agent-python-webfetch-example/1.0"}
    assert "📊 [Tool Result: {'url': " in capsys.readouterr().out


DDG_LOOKUP = {
    "Heading": "Python (programming language)", "AbstractSource": "Wikipedia",
    "AbstractText": "Python is a high-level, general-purpose programming language.",
    "AbstractURL": "https://en.wikipedia.org/wiki/Python_(programming_language)",
    "RelatedTopics": [
        {"FirstURL": "https://duckduckgo.com/Guido_van_Rossum", "Text": "Guido van Rossum - Creator of Python."},
        {"FirstURL": "https://www.python.org/", "Text": "Python.org - Official site."},
    ],
}
CSE_ANSWER = {"items": [
    {"title": "What's New In Python 3.13", "link": "https://docs.python.org/3/whatsnew/3.13.html",
     "snippet": "This article explains the new features in Python 3.13, compared to 3.12 ..."},
    {"title": "Python 3.13.0 Release Notes", "link": "https://www.python.org/downloads/release/python-3130/",
     "snippet": "Python 3.13 is the newest major release ..."},
]}


def create_ddg_agent(base_url: str) -> LlmAgent:
    """创建基于 DuckDuckGo 的 WebSearchTool Agent"""
    web_search = WebSearchTool(
        provider="duckduckgo",     # keyless，适合定义/百科/事实类查询
        results_num=3,             # 默认返回最多 3 条
        snippet_len=300,           # 每条摘要最多 300 字符
        title_len=80,              # 每条标题最多 80 字符
        timeout=10.0,
        base_url=base_url,         # 测试：本地的 DuckDuckGo 替身
    )
    return LlmAgent(
        name="ddg_research_assistant",
        description="Web research assistant powered by DuckDuckGo Instant Answers.",
        model=_create_model(),
        instruction=WEB_INSTRUCTION,
        tools=[web_search],
    )


async def test_websearch_tool_ddg_example(model_server, web, capsys):
    web.routes["/ddg"] = (200, {"Content-Type": "application/x-javascript"}, json.dumps(DDG_LOOKUP).encode())
    model_server.add(
        {"tool_calls": [{"name": "websearch", "arguments": {
            "query": "Python (programming language)", "count": 3, "allowed_domains": ["wikipedia.org"]}}]},
        {"text": "Python is a programming language.\n\nSources:\n- [Python](https://en.wikipedia.org/wiki/Python_(programming_language))"},
        {"tool_calls": [{"name": "websearch", "arguments": {"query": "p"}}]}, {"text": "Too short."},
    )
    await _drive_agent(create_ddg_agent(web.url("/ddg")), app_name="websearch_agent_demo", scenarios=[
        ("DuckDuckGo · plain lookup", "Look up the entity 'Python (programming language)' and summarise it in "
                                      "one paragraph. Use count=1."),
        ("DuckDuckGo · too short", "Search for 'p'."),
    ])
    found, too_short = _tool_results(model_server)
    assert found == {
        "query": "Python (programming language)", "provider": "duckduckgo",
        "results": [{"title": "Python (programming language)", "url": "https://en.wikipedia.org/wiki/Python_(programming_language)",
                     "snippet": "Python is a high-level, general-purpose programming language."}],
        "summary": "Python is a high-level, general-purpose programming language. (source: Wikipedia)",
    }
    assert too_short == {"error": "INVALID_QUERY: query must be at least 2 characters"}
    system = model_server.requests[0]["messages"][0]
    assert system["role"] == "system" and system["content"].startswith(WEB_INSTRUCTION)
    assert 'End your answer with a "Sources:" section' in system["content"]
    declared = model_server.requests[0]["tools"][0]["function"]
    assert declared["name"] == "websearch" and declared["parameters"]["required"] == ["query"]
    assert "Sources:" in capsys.readouterr().out


async def test_websearch_tool_google_example(model_server, web, monkeypatch):
    web.routes["/customsearch/v1"] = (200, {"Content-Type": "application/json"}, json.dumps(CSE_ANSWER).encode())
    monkeypatch.setenv("GOOGLE_CSE_API_KEY", "cse-key")
    monkeypatch.setenv("GOOGLE_CSE_ENGINE_ID", "cse-cx")

    def get_google_cse_config() -> tuple[str, str]:
        return os.environ["GOOGLE_CSE_API_KEY"], os.environ["GOOGLE_CSE_ENGINE_ID"]

    def get_http_proxy() -> str | None:
        return None

    # 业务侧创建并负责生命周期：程序退出前调用 await shared_client.aclose()
    shared_client = httpx.AsyncClient(
        timeout=15.0,
        limits=httpx.Limits(max_connections=16, max_keepalive_connections=8),
    )

    def create_google_agent() -> LlmAgent:
        """创建基于 Google Custom Search 的 WebSearchTool Agent"""
        api_key, engine_id = get_google_cse_config()
        web_search = WebSearchTool(
            provider="google", # 使用 Google Custom Search
            api_key=api_key, # Google CSE API Key
            engine_id=engine_id, # Google CSE Engine ID
            user_agent="trpc-agent-python-websearch-demo/1.0 (+google-cse)", # User-Agent 头
            proxy=get_http_proxy(),                # 可选：出口代理
            lang="en", # 语言设定
            http_client=shared_client,             # 复用连接池，需要调用方显式关闭
            results_num=3, # 返回条数
            snippet_len=240, # 单条摘要字符上限
            title_len=80, # 单条标题字符上限
            timeout=15.0, # 超时时间
            dedup_urls=True, # 开启 URL 归一化去重
            google_extra_params={"safe": "active"},       # 打开 Google SafeSearch
            base_url=web.url("/customsearch/v1"),  # 测试：本地的 Custom Search 替身
        )
        return LlmAgent(
            name="google_research_assistant",
            description="Web research assistant powered by Google Custom Search (SafeSearch on).",
            model=_create_model(),
            instruction=WEB_INSTRUCTION,
            tools=[web_search],
        )

    model_server.add(
        {"tool_calls": [{"name": "websearch", "arguments": {"query": "Python 3.13 release highlights"}}]}, {"text": "Done."},
        {"tool_calls": [{"name": "websearch", "arguments": {
            "query": "Python 3.13", "allowed_domains": ["a.org"], "blocked_domains": ["b.org"]}}]}, {"text": "Oops."},
    )
    await _drive_agent(create_google_agent(), app_name="websearch_agent_demo", scenarios=[
        ("Google · baseline", "What's new in Python 3.13?"), ("Google · both lists", "Search only a.org but not b.org"),
    ])
    assert not shared_client.is_closed
    await shared_client.aclose()
    found, both = _tool_results(model_server)
    assert found == {"query": "Python 3.13 release highlights", "provider": "google", "summary": "", "results": [
        {"title": "What's New In Python 3.13", "url": "https://docs.python.org/3/whatsnew/3.13.html",
         "snippet": "This article explains the new features in Python 3.13, compared to 3.12 ..."},
        {"title": "Python 3.13.0 Release Notes", "url": "https://www.python.org/downloads/release/python-3130/",
         "snippet": "Python 3.13 is the newest major release ..."},
    ]}
    assert both == {"error": "INVALID_ARGS: cannot specify both allowed_domains and blocked_domains in the same request"}
    asked = web.requests[0]
    assert asked.query["safe"] == ["active"] and asked.query["hl"] == ["en"] and asked.query["key"] == ["cse-key"]
    assert asked.headers["User-Agent"] == "trpc-agent-python-websearch-demo/1.0 (+google-cse)"


async def test_langchain_tool_with_tool_context_example(model_server, monkeypatch):
    # The guide's variant with the framework's context beside the business parameters.
    monkeypatch.setitem(sys.modules, "langchain_tavily", tavily_standin)
    from langchain_tavily import TavilySearch

    async def tavily_search(query: str, tool_context: InvocationContext, max_results: int = 5) -> dict[str, Any]:
        # 可使用 tool_context.session / tool_context.state 等
        tool = TavilySearch(max_results=max_results)
        res = await tool.ainvoke(query)
        # 兼容不同版本返回格式
        if isinstance(res, dict) and "results" in res:
            items = res["results"]
        elif isinstance(res, list):
            items = res
        else:
            items = []
        tool_context.state["last_query"] = query
        return {
            "status": "success",
            "query": query,
            "result_count": len(items),
            "results": items,
        }

    model_server.add({"tool_calls": [{"name": "tavily_search", "arguments": {"query": "runtimes"}}]}, {"text": "ok"})
    agent = LlmAgent(name="langchain_tavily_agent", model=guide_model(model_server), tools=[FunctionTool(tavily_search)])
    seen = await consume(Runner(app_name="langchain_tools", agent=agent, session_service=InMemorySessionService()), "q")
    parameters = model_server.requests[0]["tools"][0]["function"]["parameters"]
    assert set(parameters["properties"]) == {"query", "max_results"}
    assert seen["results"][0]["result_count"] == 3 and seen["results"][0]["query"] == "runtimes"


# The guide's file tools: every argument example of its six tools, in the order it shows them.
FILE_TOOL_CALLS = [
    ("Read", {"path": "config.ini"}),
    ("Read", {"path": "app.py", "start_line": 10, "end_line": 20}),
    ("Write", {"path": "output.txt", "content": "Hello, World!\n"}),
    ("Write", {"path": "log.txt", "content": "New log entry\n", "append": True}),
    ("Edit", {"path": "config.ini", "old_string": "host=localhost", "new_string": "host=production-server"}),
    ("Grep", {"pattern": "def.*function", "path": "src/", "case_sensitive": False}),
    ("Grep", {"pattern": "TODO|FIXME", "path": ".", "max_results": 50}),
    ("Bash", {"command": "ls -la", "cwd": "src/"}),
    ("Bash", {"command": "git status", "timeout": 60}),
    ("Bash", {"command": "find . -name '*.py' | head -10"}),
    ("Glob", {"pattern": "*.txt"}),
    ("Glob", {"pattern": "**/*.py"}),
    ("Glob", {"pattern": "**/*.{py,js}"}),
]


def _project(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.ini").write_text("[server]\nport=8080\nhost=localhost\n")
    (folder / "app.py").write_text("".join(f"x{i} = {i}\n" for i in range(1, 31)))
    (folder / "log.txt").write_text("first entry\n")
    (folder / "src").mkdir(exist_ok=True)
    (folder / "src" / "main.py").write_text("# TODO: tidy\ndef My_Function():\n    pass\n")
    (folder / "web").mkdir(exist_ok=True)
    (folder / "web" / "ui.js").write_text("// FIXME\n")
    return folder


def _assert_guide_file_results(results: list[dict], folder: Path) -> None:
    real = folder.resolve()
    read, ranged, written, appended, edited, grep1, grep2, ls, git, find, txt, py, pyjs = results
    assert read == {"success": True, "content": "[server]\nport=8080\nhost=localhost\n", "total_lines": 3,
                    "read_range": "1-3"}
    assert ranged["read_range"] == "10-20" and ranged["content"].startswith("x10 = 10\n") and ranged["total_lines"] == 30
    assert written == {"success": True, "message": "SUCCESS: file output.txt written to successfully (14 bytes)",
                       "path": str(real / "output.txt")}
    assert appended["success"] and (folder / "log.txt").read_text() == "first entry\nNew log entry\n"
    assert edited == {"success": True, "message": "SUCCESS: file config.ini modified successfully",
                      "line_range": "3-3", "changed_line_ranges": [[3, 3]]}
    assert grep1 == {"success": True, "matches": [{"file": "src/main.py", "line": 2, "content": "def My_Function():"}],
                     "total_matches": 1}
    assert grep2["total_matches"] == 2 and {m["file"] for m in grep2["matches"]} == {"src/main.py", "web/ui.js"}
    assert ls["success"] and "main.py" in ls["stdout"] and ls["cwd"] == str(real / "src") and ls["return_code"] == 0
    assert git["command"] == "git status" and set(git) >= {"success", "stdout", "stderr", "return_code", "cwd"}
    assert find["success"] and sorted(find["stdout"].split()) == ["./app.py", "./src/main.py"]
    assert txt == {"success": True, "matches": [str(real / "log.txt"), str(real / "output.txt")], "count": 2,
                   "truncated": False, "pattern": "*.txt"}
    assert py["matches"] == [str(real / "app.py"), str(real / "src/main.py")]
    assert pyjs["count"] == 3 and str(real / "web/ui.js") in pyjs["matches"]


async def test_file_tool_set_example(model_server, tmp_path):
    from orchestrator.tools.file_tools import FileToolSet  # the guide's import (this module has its own FileToolSet)

    workspace = _project(tmp_path / "workspace")
    model_server.add(*({"tool_calls": [{"name": n, "arguments": a}]} for n, a in FILE_TOOL_CALLS), {"text": "完成"})
    # 创建工具集，指定工作目录（可选）
    file_tools = FileToolSet(cwd=str(workspace))

    # 在 Agent 中使用
    agent = LlmAgent(
        name="file_assistant",
        model=OpenAIModel(model_name="deepseek-v3-local-II"),
        instruction="你是一个文件操作助手，可以帮助用户读写、编辑文件。",
        tools=[file_tools],  # 添加文件工具集
    )
    seen = await consume(Runner(app_name="file_tools", agent=agent, session_service=InMemorySessionService()), "整理项目")
    assert seen["calls"] == [name for name, _ in FILE_TOOL_CALLS] and seen["answers"] == ["完成"]
    assert sorted(declared := [t["function"]["name"] for t in model_server.requests[0]["tools"]]) == sorted(
        ["Read", "Write", "Edit", "Grep", "Bash", "Glob"]), declared
    _assert_guide_file_results([json.loads(m["content"]) for m in tool_messages(model_server.requests[-1])], workspace)


async def test_single_file_tools_example(model_server, tmp_path):
    from orchestrator.tools.file_tools import BashTool, EditTool, GlobTool, GrepTool, ReadTool, WriteTool

    INSTRUCTION = "你是一个文件操作助手。"
    # 创建工作目录
    work_dir = str(_project(tmp_path / "workspace"))

    # 创建工具实例，每个工具都可以独立配置
    read_tool = ReadTool(cwd=work_dir)      # Read file contents
    write_tool = WriteTool(cwd=work_dir)     # Write or append to files
    edit_tool = EditTool(cwd=work_dir)       # Replace text blocks in files
    grep_tool = GrepTool(cwd=work_dir)       # Search for patterns using regex
    bash_tool = BashTool(cwd=work_dir)       # Execute shell commands
    glob_tool = GlobTool(cwd=work_dir)       # Find files matching glob patterns

    # 在 Agent 中逐个添加工具
    agent = LlmAgent(
        name="file_assistant",
        description="File operations assistant with file operation tools",  # Agent 描述信息
        model=_create_model(),
        instruction=INSTRUCTION,
        tools=[read_tool, write_tool, edit_tool, grep_tool, bash_tool, glob_tool],
    )
    model_server.add(*({"tool_calls": [{"name": n, "arguments": a}]} for n, a in FILE_TOOL_CALLS), {"text": "完成"})
    seen = await consume(Runner(app_name="file_tools", agent=agent, session_service=InMemorySessionService()), "整理项目")
    assert seen["calls"] == [name for name, _ in FILE_TOOL_CALLS]
    _assert_guide_file_results([json.loads(m["content"]) for m in tool_messages(model_server.requests[-1])],
                               Path(work_dir))


async def test_file_tools_best_practice_separate_projects_and_failure_shape(model_server, tmp_path):
    from orchestrator.tools.file_tools import FileToolSet

    # 为不同项目使用不同目录
    project_a_tools = FileToolSet(cwd=str(_project(tmp_path / "project_a")))
    project_b_tools = FileToolSet(cwd=str(tmp_path / "project_b"))
    assert project_a_tools.cwd != project_b_tools.cwd
    model_server.add({"tool_calls": [{"name": "Read", "arguments": {"path": "../project_a/config.ini"}}]},
                     {"text": "不能读取"})
    agent = LlmAgent(name="b", model=_create_model(), instruction="", tools=[project_b_tools])
    seen = await consume(Runner(app_name="file_tools", agent=agent, session_service=InMemorySessionService()), "读")
    # 失败时 {"success": False, "error": "错误信息..."}
    assert seen["results"][0]["success"] is False and set(seen["results"][0]) == {"success", "error"}
    assert "outside the working directory" in seen["results"][0]["error"]
