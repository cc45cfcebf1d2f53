"""``AgentTool``: another agent as a tool. The tool's answer is that agent's final text."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.context import InvocationContext
from orchestrator.runners.runner import Runner
from orchestrator.sessions.in_memory import InMemorySessionService
from orchestrator.tools.base import BaseTool
from orchestrator.types import Content, Part

if TYPE_CHECKING:  # annotations only: importing the agents package would load the model SDK
    from orchestrator.agents.base import BaseAgent


class AgentTool(BaseTool):
    """Wraps ``agent``; each call runs it on a fresh session with the ``request`` argument as the user message.

    With ``skip_summarization`` the wrapped agent's answer ends the calling agent's turn as is, instead of being
    handed back to the calling model to summarize.
    """

    def __init__(self, agent: "BaseAgent", skip_summarization: bool = False, filters_name: list[str] | None = None) -> None:
        super().__init__(name=agent.name, description=agent.description, filters_name=filters_name)
        self.agent = agent
        self.skip_summarization = skip_summarization

    def parameters_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"request": {"type": "string", "description": f"What to ask {self.agent.name}."}},
            "required": ["request"],
        }

    async def _run_async_impl(self, *, tool_context: InvocationContext, args: dict[str, Any]) -> Any:
        request = args.get("request")
        if not isinstance(request, str) or not request:
            return {"error": f"{self.name} needs a non-empty 'request' string"}
        runner = Runner(app_name=tool_context.app_name, agent=self.agent, session_service=InMemorySessionService())
        answer, errors = "", []
        async for event in runner.run_async(
            user_id=tool_context.user_id, session_id=f"{tool_context.session.id}:{self.name}:{tool_context.function_call_id}",
            new_message=Content(parts=[Part.from_text(request)]),
        ):
            if event.error_message:
                errors.append(event.error_message)
            elif event.is_final_response() and event.content is not None:
                answer = event.content.text
        if errors and not answer:
            return {"error": f"{self.name} failed: {'; '.join(errors)}"}
        return {"result": answer}
