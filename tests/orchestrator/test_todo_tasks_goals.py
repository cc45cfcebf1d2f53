"""TodoWriteTool, TaskToolSet and the goal tools: their shapes, their refusals (state unchanged), their state keys,
the instructions they add, and state that outlives the process with the file and Redis session services."""

from __future__ import annotations

import json

import pytest

from orchestrator.agents import LlmAgent
from orchestrator.context import InvocationContext
from orchestrator.models import OpenAIModel
from orchestrator.runners import Runner
from orchestrator.sessions import FileSessionService, InMemorySessionService, RedisSessionService, Session
from orchestrator.tools import GoalToolSet, TaskToolSet, TodoWriteTool, get_task_store, get_todos, render_todos
from orchestrator.tools.planning.goal import GoalOptions, RetryEvent, get_goal_record, setup_goal, start_goal
from orchestrator.tools.planning.tasks import DEFAULT_TASK_PROMPT
from orchestrator.tools.planning.todo import DEFAULT_TODO_PROMPT
from orchestrator.types import Content, Part
from tests.orchestrator.conftest import system_message, tool_messages

AGENT = "planner"


class _Agent:
    name = AGENT


def context(session: Session | None = None) -> InvocationContext:
    return InvocationContext(session=session or Session(app_name="app", user_id="u"), agent=_Agent())


async def call(tool, ctx: InvocationContext, **args) -> dict:
    """Run one tool call and apply its state delta to the session, as the runner does."""
    call_ctx = ctx.for_tool_call("call")
    result = await tool.run_async(tool_context=call_ctx, args=args)
    ctx.session.state.update(call_ctx.actions.state_delta)
    return result


def item(content: str, status: str = "pending") -> dict:
    return {"content": content, "activeForm": f"{content}ing", "status": status}


async def tasks_of(toolset: TaskToolSet) -> dict:
    return {t.name: t for t in await toolset.get_tools()}


# --- todo_write -------------------------------------------------------------------------------------------------

async def test_todo_write_replaces_the_whole_list_and_returns_old_and_new():
    tool, ctx = TodoWriteTool(), context()
    first = await call(tool, ctx, todos=[item("Plan", "in_progress"), item("Build")])
    assert first["oldTodos"] is None and [t["content"] for t in first["todos"]] == ["Plan", "Build"]
    second = await call(tool, ctx, todos=[item("Build", "in_progress")])
    assert [t["content"] for t in second["oldTodos"]] == ["Plan", "Build"]
    assert json.loads(ctx.session.state[f"todos:{AGENT}"]) == [item("Build", "in_progress")]
    assert second["message"].startswith("Todo list updated")
    assert render_todos(get_todos(ctx.session, branch=AGENT)) == "🔄 Building"


async def test_todo_list_all_completed_is_cleared_and_empty_list_clears():
    tool, ctx = TodoWriteTool(), context()
    await call(tool, ctx, todos=[item("Plan")])
    done = await call(tool, ctx, todos=[item("Plan", "completed")])
    assert done["todos"] == [] and json.loads(ctx.session.state[f"todos:{AGENT}"]) == []
    kept = await call(TodoWriteTool(clear_on_all_done=False), ctx, todos=[item("Plan", "completed")])
    assert kept["todos"] == [item("Plan", "completed")]
    assert (await call(tool, ctx, todos=[]))["todos"] == []


@pytest.mark.parametrize(("todos", "code", "words"), [
    (None, "INVALID_ARGS", "got null"),
    ("Plan", "INVALID_ARGS", "got a str"),
    ([{"content": "Plan", "status": "pending"}], "INVALID_ARGS", "activeForm"),
    ([{**item("Plan"), "status": "done"}], "INVALID_ARGS", "status"),
    ([item("Plan", "in_progress"), item("Build", "in_progress")], "INVALID_TODOS", "at most one item"),
    ([item("Plan"), item("Plan")], "INVALID_TODOS", "repeats todos[0]"),
    ([{**item("Plan"), "content": "  "}], "INVALID_TODOS", "content must not be empty"),
    ([{**item("Plan"), "activeForm": ""}], "INVALID_TODOS", "activeForm must not be empty"),
])
async def test_malformed_todo_list_is_refused_and_the_stored_list_kept(todos, code, words):
    tool, ctx = TodoWriteTool(), context()
    await call(tool, ctx, todos=[item("Keep me")])
    before = dict(ctx.session.state)
    result = await call(tool, ctx, todos=todos)
    assert list(result) == ["error"] and result["error"].startswith(f"{code}: ") and words in result["error"]
    assert ctx.session.state == before


async def test_todo_missing_argument_and_nudge_hooks():
    seen = []
    tool = TodoWriteTool(nudge_hooks=[lambda old, new: seen.append((old, new)) or "Mind the tests.",
                                      lambda old, new: 1 / 0])
    ctx = context()
    assert (await call(tool, ctx))["error"].startswith("INVALID_ARGS: `todos` must be an array (got missing)")
    result = await call(tool, ctx, todos=[item("Plan")])
    assert result["message"].endswith("\n\nMind the tests.") and seen[0][0] == []


# --- tasks ------------------------------------------------------------------------------------------------------

async def board() -> tuple[dict, InvocationContext]:
    """The guide's board: #1 blocks #2 and #4, #2 blocks #3."""
    tools, ctx = await tasks_of(TaskToolSet()), context()
    for subject in ("Design tables", "Build API", "Unit tests", "Write docs"):
        await call(tools["task_create"], ctx, subject=subject)
    await call(tools["task_update"], ctx, taskId="2", addBlockedBy=["1"])
    await call(tools["task_update"], ctx, taskId="4", addBlockedBy=["1"])
    await call(tools["task_update"], ctx, taskId="2", addBlocks=["3"])
    return tools, ctx


async def test_task_dependencies_unblock_in_order():
    tools, ctx = await board()
    store = get_task_store(ctx.session, branch=AGENT)
    assert store.tasks["1"].blocks == ["2", "4"] and store.tasks["3"].blocked_by == ["2"]
    await call(tools["task_update"], ctx, taskId="1", status="in_progress")
    done = await call(tools["task_update"], ctx, taskId="1", status="completed")
    assert done["unblocked"] == ["2", "4"] and done["task"]["status"] == "completed"
    await call(tools["task_update"], ctx, taskId="2", status="in_progress")
    assert (await call(tools["task_update"], ctx, taskId="2", status="completed"))["unblocked"] == ["3"]
    listed = await call(tools["task_list"], ctx)
    assert listed["stats"] == {"pending": 2, "in_progress": 0, "completed": 2}
    assert all("description" not in t for t in listed["tasks"])


async def test_task_create_get_list_shapes_and_soft_delete():
    tools, ctx = await tasks_of(TaskToolSet()), context()
    created = await call(tools["task_create"], ctx, subject="Write docs", description="All of them", activeForm="Writing")
    assert created["task"] == {"id": "1", "subject": "Write docs"} and "message" in created
    got = await call(tools["task_get"], ctx, taskId="1")
    assert got["task"]["description"] == "All of them" and got["task"]["activeForm"] == "Writing"
    await call(tools["task_update"], ctx, taskId="1", status="deleted")
    assert (await call(tools["task_list"], ctx))["tasks"] == []
    assert len((await call(tools["task_list"], ctx, includeDeleted=True))["tasks"]) == 1
    assert (await call(tools["task_create"], ctx, subject="Again"))["task"]["id"] == "2"


@pytest.mark.parametrize(("args", "code", "words"), [
    ({"taskId": "9", "status": "completed"}, "NOT_FOUND", "task '9' does not exist"),
    ({"taskId": "3", "addBlockedBy": ["9"]}, "INVALID_DEPENDENCY", "task '9' does not exist"),
    ({"taskId": "1", "addBlockedBy": ["3"]}, "INVALID_DEPENDENCY", "cycle (each blocked by the next): 1 -> 3 -> 2 -> 1"),
    ({"taskId": "3", "addBlocks": ["1"]}, "INVALID_DEPENDENCY", "cycle"),
    ({"taskId": "2", "addBlockedBy": ["2"]}, "INVALID_DEPENDENCY", "itself"),
    ({"taskId": "3", "status": "in_progress"}, "INVALID_STATUS", "blocked by unfinished task(s) 2"),
    ({"taskId": "2", "status": "completed"}, "INVALID_STATUS", "blocked by unfinished task(s) 1"),
    ({"taskId": "3", "status": "started"}, "INVALID_ARGS", "`status` must be one of"),
    ({"status": "completed"}, "INVALID_ARGS", "`taskId` is required"),
    ({"taskId": "1", "addBlockedBy": "2"}, "INVALID_ARGS", "array of task ids"),
    ({"taskId": "1", "subject": ""}, "INVALID_ARGS", "non-empty string"),
])
async def test_bad_task_update_is_refused_and_the_board_kept(args, code, words):
    tools, ctx = await board()
    before = dict(ctx.session.state)
    result = await call(tools["task_update"], ctx, **args)
    assert list(result) == ["error"] and result["error"].startswith(f"{code}: ") and words in result["error"]
    assert ctx.session.state == before


async def test_only_one_task_in_progress_unless_allowed():
    ctx = context()
    for enforce, expected in ((True, "INVALID_STATUS: task '1' is already in_progress"), (False, None)):
        tools = await tasks_of(TaskToolSet(enforce_single_in_progress=enforce, state_key_prefix=f"t{enforce}"))
        for subject in ("A", "B"):
            await call(tools["task_create"], ctx, subject=subject)
        await call(tools["task_update"], ctx, taskId="1", status="in_progress")
        result = await call(tools["task_update"], ctx, taskId="2", status="in_progress")
        assert result.get("error", "").startswith(expected) if expected else result["task"]["status"] == "in_progress"


async def test_task_get_unknown_id_is_not_found():
    tools, ctx = await board()
    assert (await call(tools["task_get"], ctx, taskId="42")) == {"error": "NOT_FOUND: task '42' does not exist"}


async def test_parallel_task_creates_in_one_answer_get_distinct_ids(model_server, model):
    model_server.add(
        {"tool_calls": [{"name": "task_create", "arguments": {"subject": f"Step {i}"}} for i in range(5)]},
        {"text": "Planned."},
    )
    agent = LlmAgent(name=AGENT, model=model, tools=[TaskToolSet()], parallel_tool_calls=True)
    runner = Runner(app_name="app", agent=agent, session_service=InMemorySessionService())
    async for _ in runner.run_async(user_id="u", session_id="s", new_message=Content(parts=[Part.from_text("plan")])):
        pass
    session = await runner.session_service.get_session(app_name="app", user_id="u", session_id="s")
    store = get_task_store(session, branch=AGENT)
    assert sorted(store.tasks, key=int) == ["1", "2", "3", "4", "5"] and store.highwatermark == 5
    assert system_message(model_server.requests[0]).count(DEFAULT_TASK_PROMPT) == 1
    await runner.close()


# --- goals ------------------------------------------------------------------------------------------------------

async def goal_tools() -> dict:
    return {t.name: t for t in await GoalToolSet().get_tools()}


async def test_goal_tools_create_get_update_and_refusals():
    tools, ctx = await goal_tools(), context()
    assert await call(tools["get_goal"], ctx) == {"message": "No session goal is set."}
    assert (await call(tools["update_goal"], ctx, status="complete"))["error"].startswith("INVALID_STATE: ")
    created = await call(tools["create_goal"], ctx, objective="Ship the report")
    assert created["goal"]["status"] == "active" and created["goal"]["objective"] == "Ship the report"
    assert {"id", "createdAtUnix", "updatedAtUnix"} <= set(created["goal"])
    before = dict(ctx.session.state)
    for tool, args, code in (("create_goal", {"objective": "Another"}, "INVALID_STATE"),
                             ("create_goal", {"objective": " "}, "INVALID_ARGS"),
                             ("update_goal", {"status": "active"}, "INVALID_ARGS")):
        assert (await call(tools[tool], ctx, **args))["error"].startswith(f"{code}: ")
        assert ctx.session.state == before
    done = await call(tools["update_goal"], ctx, status="complete")
    assert done["goal"]["status"] == "complete" and done["goal"]["terminalAtUnix"] is not None
    assert (await call(tools["update_goal"], ctx, status="blocked"))["error"].startswith("INVALID_STATE: ")
    assert get_goal_record(ctx.session, branch=AGENT).status.value == "complete"
    assert (await call(tools["create_goal"], ctx, objective="Next one"))["goal"]["status"] == "active"


async def test_goal_enforcement_refuses_early_answers_then_fails_open(model_server, model):
    events: list[RetryEvent] = []
    model_server.add({"tool_calls": [{"name": "create_goal", "arguments": {"objective": "Write two files"}}]},
                     {"text": "Done, I think."}, {"text": "Really done."}, {"text": "Trust me."})
    agent = LlmAgent(name=AGENT, model=model, instruction="Work.")
    setup_goal(agent, GoalOptions(max_retries=2, on_retry=events.append))
    runner = Runner(app_name="app", agent=agent, session_service=InMemorySessionService())
    answers = [e.content.parts[0].text async for e in runner.run_async(
        user_id="u", session_id="s", new_message=Content(parts=[Part.from_text("go")]))
        if e.is_final_response()]
    assert answers == ["Trust me."]
    assert [(e.reason, e.attempt_number) for e in events] == [("blocked", 1), ("blocked", 2), ("exhausted", 2)]
    first, retried = model_server.requests[0], model_server.requests[2]
    assert "session goal tools" not in system_message(first)
    assert "session goal tools" in system_message(retried)
    nudge = retried["messages"][-1]
    assert nudge["role"] == "user" and "(attempt 1 of 2)" in nudge["content"] and "Write two files" in nudge["content"]
    assert "Done, I think." not in json.dumps(model_server.requests[-1]["messages"])
    await runner.close()


async def test_goal_completed_lets_the_answer_through_and_keeps_existing_callbacks(model_server, model):
    calls = []
    model_server.add({"tool_calls": [{"name": "update_goal", "arguments": {"status": "complete"}}]}, {"text": "Done."})
    agent = LlmAgent(name=AGENT, model=model, before_model_callback=lambda ctx, req: calls.append("mine"))
    setup_goal(agent)
    service = InMemorySessionService()
    await start_goal(service, app_name="app", user_id="u", session_id="s", objective="Finish", agent_name=AGENT)
    runner = Runner(app_name="app", agent=agent, session_service=service)
    answers = [e async for e in runner.run_async(user_id="u", session_id="s",
                                                 new_message=Content(parts=[Part.from_text("go")]))
               if e.is_final_response()]
    assert [a.content.parts[0].text for a in answers] == ["Done."] and calls == ["mine", "mine"]
    assert tool_messages(model_server.requests[1])[0]["content"].count('"complete"') == 1
    session = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert get_goal_record(session, branch=AGENT).status.value == "complete"
    await runner.close()


# --- state across a restart: file and Redis session services ----------------------------------------------------

@pytest.fixture(params=["file", "redis"])
def service_factory(request, tmp_path):
    if request.param == "file":
        return lambda: FileSessionService(tmp_path / "sessions")
    url = request.getfixturevalue("redis_url")
    return lambda: RedisSessionService(url)


async def run_turn(service, model_server, text: str, goal: bool = False) -> None:
    model = OpenAIModel(model_name="test-model", api_key="test-key", base_url=model_server.base_url)
    agent = LlmAgent(name=AGENT, model=model, tools=[TodoWriteTool(), TaskToolSet()])
    if goal:
        setup_goal(agent)
    runner = Runner(app_name="app", agent=agent, session_service=service)
    async for _ in runner.run_async(user_id="u", session_id="s", new_message=Content(parts=[Part.from_text(text)])):
        pass
    await runner.close()
    await service.close()


async def test_todos_tasks_and_goal_survive_a_restart(service_factory, model_server):
    model_server.add(
        {"tool_calls": [{"name": "todo_write", "arguments": {"todos": [item("Plan", "in_progress"), item("Ship")]}},
                        {"name": "task_create", "arguments": {"subject": "Plan"}},
                        {"name": "task_create", "arguments": {"subject": "Ship"}},
                        {"name": "create_goal", "arguments": {"objective": "Ship it"}}]},
        {"tool_calls": [{"name": "task_update", "arguments": {"taskId": "2", "addBlockedBy": ["1"]}}]},
        {"tool_calls": [{"name": "update_goal", "arguments": {"status": "blocked"}}]},
        {"text": "Planned."},
    )
    await run_turn(service_factory(), model_server, "plan", goal=True)
    model_server.add(
        {"tool_calls": [{"name": "task_update", "arguments": {"taskId": "2", "status": "in_progress"}}]},
        {"tool_calls": [{"name": "todo_write", "arguments": {"todos": [item("Plan", "completed"),
                                                                        item("Ship", "in_progress")]}}]},
        {"text": "Still blocked."},
    )
    await run_turn(service_factory(), model_server, "go on")  # a new service object: what it sees was stored
    refusal = json.loads(tool_messages(model_server.requests[-2])[-1]["content"])
    assert refusal["error"].startswith("INVALID_STATUS: task '2' is blocked by unfinished task(s) 1")
    update = json.loads(tool_messages(model_server.requests[-1])[-1]["content"])
    assert [t["content"] for t in update["oldTodos"]] == ["Plan", "Ship"]
    service = service_factory()
    session = await service.get_session(app_name="app", user_id="u", session_id="s")
    assert [t.content for t in get_todos(session, branch=AGENT)] == ["Plan", "Ship"]
    assert get_task_store(session, branch=AGENT).tasks["2"].blocked_by == ["1"]
    assert get_goal_record(session, branch=AGENT).status.value == "blocked"
    assert DEFAULT_TODO_PROMPT in system_message(model_server.requests[-1])
    await service.close()


async def test_each_agent_branch_keeps_its_own_list_board_and_goal():
    session = Session(app_name="app", user_id="u")
    parent, child = context(session), context(session)
    child.agent = type("Child", (), {"name": "helper"})()
    for ctx, word in ((parent, "Plan"), (child, "Fetch")):
        await call(TodoWriteTool(), ctx, todos=[item(word)])
        await call((await tasks_of(TaskToolSet()))["task_create"], ctx, subject=word)
        await call((await goal_tools())["create_goal"], ctx, objective=word)
    assert [t.content for t in get_todos(session, branch=AGENT)] == ["Plan"]
    assert [t.content for t in get_todos(session, branch="helper")] == ["Fetch"]
    assert get_task_store(session, branch="helper").tasks["1"].subject == "Fetch"
    assert get_goal_record(session, branch=AGENT).objective == "Plan"
    assert {"todos:planner", "todos:helper", "tasks:planner", "tasks:helper", "goal:planner", "goal:helper"} == set(
        session.state)


async def test_goal_tool_set_alone_does_not_hold_the_answer_back(model_server, model):
    # The guide: tools=[GoalToolSet()] gives the tools without "no final answer while the goal is active".
    model_server.add({"tool_calls": [{"name": "create_goal", "arguments": {"objective": "Two files"}}]},
                     {"text": "Done, I think."})
    agent = LlmAgent(name=AGENT, model=model, tools=[GoalToolSet()])
    runner = Runner(app_name="app", agent=agent, session_service=InMemorySessionService())
    answers = [e.content.parts[0].text async for e in runner.run_async(
        user_id="u", session_id="s", new_message=Content(parts=[Part.from_text("go")])) if e.is_final_response()]
    assert answers == ["Done, I think."] and len(model_server.requests) == 2
    session = await runner.session_service.get_session(app_name="app", user_id="u", session_id="s")
    assert get_goal_record(session, branch=AGENT).status.value == "active"
    await runner.close()
