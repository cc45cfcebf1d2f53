"""``LlmAgent``: a model in a loop with tools.

Each step builds a request (instruction, the skill tiers when a skill repository is set — ranked against the
latest user message and shaped by ``skill_options`` —, the session's history, the declarations of the tools
available now), streams the model's answer as partial events, and runs
the tool calls it makes (concurrently when ``parallel_tool_calls``), feeding their results back, until the model
answers without a tool call, a tool result ends the turn (``skip_summarization``), or ``max_steps`` model calls
were made (then an error event says so).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from orchestrator.agents.base import BaseAgent
from orchestrator.context import InvocationContext
from orchestrator.errors import McpConnectionError, ModelError, ToolError
from orchestrator.events import Event, EventActions
from orchestrator.models.base import LLMModel, LlmRequest, LlmResponse
from orchestrator.models.openai_model import OpenAIModel
from orchestrator.skills.injection import skill_instructions
from orchestrator.skills.options import SkillLoadMode, SkillOptions
from orchestrator.skills.repository import BaseSkillRepository
from orchestrator.skills.state import consume_once
from orchestrator.tools.base import BaseTool
from orchestrator.tools.function_tool import FunctionTool, wrap_result
from orchestrator.tools.toolset import BaseToolSet
from orchestrator.types import Content, FunctionCall, Part

logger = logging.getLogger(__name__)

DEFAULT_MAX_STEPS = 25

# Callbacks may be plain or async functions; a non-None return replaces the request's answer or the tool's result.
BeforeModel = Callable[[InvocationContext, LlmRequest], Any]
AfterModel = Callable[[InvocationContext, LlmResponse], Any]
BeforeTool = Callable[[BaseTool, dict, InvocationContext], Any]
AfterTool = Callable[[BaseTool, dict, InvocationContext, dict], Any]

RETRY_MODEL_CALL = object()
"""An after-model callback returns this to drop the answer (it is neither yielded nor stored) and call the model
again in the same invocation; the retry counts toward ``max_steps`` (the goal tools' enforcement uses it)."""


class LlmAgent(BaseAgent):
    """An agent driven by a chat model."""

    def __init__(
        self,
        name: str,
        model: LLMModel | str,
        description: str = "",
        instruction: str | Callable[[InvocationContext], str] = "",
        tools: list[BaseTool | BaseToolSet | Callable[..., Any]] | None = None,
        skill_repository: BaseSkillRepository | None = None,
        *,
        skill_options: SkillOptions | None = None,
        parallel_tool_calls: bool = True,
        stream: bool = True,
        max_steps: int = DEFAULT_MAX_STEPS,
        before_model_callback: BeforeModel | None = None,
        after_model_callback: AfterModel | None = None,
        before_tool_callback: BeforeTool | None = None,
        after_tool_callback: AfterTool | None = None,
    ) -> None:
        super().__init__(name=name, description=description)
        self.model = OpenAIModel(model_name=model) if isinstance(model, str) else model
        self.instruction = instruction
        self.tools: list[BaseTool | BaseToolSet] = [
            t if isinstance(t, (BaseTool, BaseToolSet)) else FunctionTool(t) for t in (tools or [])
        ]
        named = [t.name for t in self.tools if isinstance(t, BaseTool)]
        twice = sorted({n for n in named if named.count(n) > 1})
        if twice:
            raise ToolError(f"agent {name}: more than one tool is named {', '.join(map(repr, twice))}")
        self.skill_repository = skill_repository
        self.skill_options = skill_options or SkillOptions()
        self.parallel_tool_calls = parallel_tool_calls
        self.stream = stream
        self.max_steps = max_steps
        self.before_model_callback = before_model_callback
        self.after_model_callback = after_model_callback
        self.before_tool_callback = before_tool_callback
        self.after_tool_callback = after_tool_callback
        self._initialized: set[int] = set()

    async def run_async(self, ctx: InvocationContext) -> AsyncIterator[Event]:
        ctx = ctx.for_agent(self) if ctx.agent is not self else ctx
        for _ in range(self.max_steps):
            try:
                tools = await self.resolve_tools(ctx)
            except (ToolError, McpConnectionError) as exc:
                yield Event(author=self.name, error_code="tools_unavailable", error_message=str(exc))
                return
            request = LlmRequest(
                system_instruction=self._system_instruction(ctx, tools),
                contents=_history(ctx),
                tools=[tool.declaration() for tool in tools.values()],
                streaming_tools={name for name, tool in tools.items() if tool.is_streaming},
                parallel_tool_calls=self.parallel_tool_calls,
                stream=self.stream,
            )
            for tool in tools.values():
                await tool.process_request(tool_context=ctx, llm_request=request)
            if self.skill_options.load_mode is SkillLoadMode.ONCE:
                consume_once(ctx.temp_state)
            response = await _call(self.before_model_callback, ctx, request)
            if response is None:
                try:
                    async for piece in self.model.generate_content_async(request):
                        if piece.partial:
                            yield Event(
                                author=self.name, content=piece.content, partial=True,
                                streaming_tool_call=piece.streaming_tool_call,
                            )
                        else:
                            response = piece
                except ModelError as exc:
                    yield Event(author=self.name, error_code="model_error", error_message=str(exc))
                    return
                if response is None:
                    yield Event(author=self.name, error_code="model_error", error_message="the model sent no answer")
                    return
            replaced = await _call(self.after_model_callback, ctx, response)
            if replaced is RETRY_MODEL_CALL:
                continue
            response = replaced if replaced is not None else response
            content = response.content or Content(role="model", parts=[])
            yield Event(author=self.name, content=content, usage=response.usage)
            calls = [p.function_call for p in content.parts if p.function_call]
            if not calls:
                return
            results = await self._run_tools(ctx, calls, tools, response.malformed_calls)
            actions = EventActions()
            for _, call_actions in results:
                actions.state_delta.update(call_actions.state_delta)
            actions.skip_summarization = all(a.skip_summarization for _, a in results)
            yield Event(author=self.name, content=Content(role="tool", parts=[p for p, _ in results]), actions=actions)
            if actions.skip_summarization:
                return
        yield Event(
            author=self.name, error_code="max_steps",
            error_message=f"stopped after {self.max_steps} model calls without a final answer (max_steps)",
        )

    async def resolve_tools(self, ctx: InvocationContext | None) -> dict[str, BaseTool]:
        """The tools available in this invocation, by name (tool sets expanded)."""
        found: dict[str, BaseTool] = {}
        for entry in self.tools:
            members: list[BaseTool]
            if isinstance(entry, BaseToolSet):
                if id(entry) not in self._initialized:
                    entry.initialize()
                    self._initialized.add(id(entry))
                members = list(await entry.get_tools(ctx))
            else:
                members = [entry]
            for tool in members:
                if tool.name in found and found[tool.name] is not tool:
                    raise ToolError(
                        f"agent {self.name}: two tools are named {tool.name!r} ({_origin(found[tool.name])} and "
                        f"{_origin(tool, entry)}); rename one, or leave one out with the tool set's filter"
                    )
                found[tool.name] = tool
        return found

    def _system_instruction(self, ctx: InvocationContext, tools: dict[str, BaseTool]) -> str:
        text = self.instruction(ctx) if callable(self.instruction) else self.instruction
        if self.skill_repository is not None:
            block = skill_instructions(self.skill_repository, ctx.state, set(tools), _latest_user_text(ctx),
                                       self.skill_options)
            text = f"{text}\n\n{block}" if text else block
        return text

    async def _run_tools(
        self, ctx: InvocationContext, calls: list[FunctionCall], tools: dict[str, BaseTool], malformed: dict[str, str]
    ) -> list[tuple[Part, EventActions]]:
        runs = [self._run_tool(ctx, call, tools, malformed) for call in calls]
        if self.parallel_tool_calls:
            return list(await asyncio.gather(*runs))
        return [await run for run in runs]

    async def _run_tool(
        self, ctx: InvocationContext, call: FunctionCall, tools: dict[str, BaseTool], malformed: dict[str, str]
    ) -> tuple[Part, EventActions]:
        tool_ctx = ctx.for_tool_call(call.id)
        tool = tools.get(call.name)
        if call.id in malformed:
            result = {"error": f"the arguments for {call.name} were not a JSON object: {malformed[call.id][:200]!r}"}
        elif tool is None:
            result = {"error": f"unknown tool {call.name!r}; available tools: {', '.join(sorted(tools)) or 'none'}"}
        else:
            result = await _call(self.before_tool_callback, tool, call.args, tool_ctx)
            if result is None:
                try:
                    result = wrap_result(await tool.run_async(tool_context=tool_ctx, args=call.args))
                except Exception as exc:  # a tool's failure is the model's to handle, not the loop's
                    logger.exception("tool %s failed", call.name)
                    result = {"error": f"tool {call.name} failed: {type(exc).__name__}: {exc}"}
            replaced = await _call(self.after_tool_callback, tool, call.args, tool_ctx, result)
            result = replaced if replaced is not None else result
            if getattr(tool, "skip_summarization", False):
                tool_ctx.actions.skip_summarization = True
        return Part.from_function_response(name=call.name, response=result, id=call.id), tool_ctx.actions

    async def close(self) -> None:
        for entry in self.tools:
            if isinstance(entry, BaseToolSet):
                await entry.close()
            else:
                inner = getattr(entry, "agent", None)
                if isinstance(inner, BaseAgent):
                    await inner.close()
        await self.model.close()


def _origin(tool: BaseTool, entry: BaseTool | BaseToolSet | None = None) -> str:
    owner = f" of {entry.name}" if isinstance(entry, BaseToolSet) else ""
    return f"{type(tool).__name__}{owner}"


def _latest_user_text(ctx: InvocationContext) -> str:
    for event in reversed(ctx.session.events):
        if event.author == "user" and event.content is not None:
            return " ".join(p.text for p in event.content.parts if p.text)
    return ""


def _history(ctx: InvocationContext) -> list[Content]:
    return [e.content for e in ctx.session.events if e.content is not None and not e.partial]


async def _call(callback: Callable[..., Any] | None, *args: Any) -> Any:
    if callback is None:
        return None
    result = callback(*args)
    if inspect.isawaitable(result):
        result = await result
    return result
