"""LangChain tools through the guide's pattern: a ``langchain_core`` tool called from a function that a
``FunctionTool`` wraps, run by an agent against the scripted model (the ``langchain`` extra)."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.tools import ToolException, tool

from orchestrator.agents import LlmAgent
from orchestrator.context import InvocationContext
from orchestrator.runners import Runner
from orchestrator.sessions import InMemorySessionService
from orchestrator.tools import FunctionTool
from orchestrator.types import Content, Part
from tests.orchestrator.conftest import tool_messages


@tool
def word_stats(text: str, top: int = 1) -> dict:
    """Count the words of a text and name the most frequent ones.

    Args:
        text: The text.
        top: How many frequent words to name.
    """
    words = text.lower().split()
    if not words:
        raise ToolException("the text has no words")
    ranked = sorted(set(words), key=lambda w: (-words.count(w), w))
    return {"words": len(words), "top": ranked[:top]}


async def text_stats(text: str, tool_context: InvocationContext, top: int = 1) -> dict[str, Any]:
    """Word statistics of a text (LangChain's word_stats tool).

    Args:
        text: The text to analyse.
        top: How many frequent words to name.
    """
    try:
        res = await word_stats.ainvoke({"text": text, "top": top})
        tool_context.state["last_stats"] = res
        return {"status": "success", **res}
    except Exception as e:  # the guide's pattern: an error result, not an exception
        return {"status": "error", "error_message": str(e)}


def text_stats_sync(text: str) -> dict[str, Any]:
    """Word statistics through the tool's blocking ``invoke`` (FunctionTool runs it in a thread).

    Args:
        text: The text to analyse.
    """
    return {"status": "success", **word_stats.invoke({"text": text})}


async def test_a_langchain_core_tool_runs_through_the_agent(model_server, model):
    model_server.add(
        {"tool_calls": [{"name": "text_stats", "arguments": {"text": "to be or not to be", "top": 2}},
                        {"name": "text_stats", "arguments": {"text": "   "}},
                        {"name": "text_stats_sync", "arguments": {"text": "a b a"}}]},
        {"text": "Six words; 'be' and 'to' lead."},
    )
    agent = LlmAgent(name="lc_agent", model=model, tools=[FunctionTool(text_stats), FunctionTool(text_stats_sync)])
    service = InMemorySessionService()
    runner = Runner(app_name="lc", agent=agent, session_service=service)
    answers = [e.content.parts[0].text async for e in runner.run_async(
        user_id="u", session_id="s", new_message=Content(parts=[Part.from_text("stats?")])) if e.is_final_response()]
    await runner.close()

    declared = {t["function"]["name"]: t["function"] for t in model_server.requests[0]["tools"]}
    schema = declared["text_stats"]["parameters"]
    assert set(schema["properties"]) == {"text", "top"} and schema["required"] == ["text"]
    assert schema["properties"]["top"]["description"] == "How many frequent words to name."
    results = [json.loads(m["content"]) for m in tool_messages(model_server.requests[1])]
    assert results[0] == {"status": "success", "words": 6, "top": ["be", "to"]}
    assert results[1] == {"status": "error", "error_message": "the text has no words"}
    assert results[2] == {"status": "success", "words": 3, "top": ["a"]}
    assert answers == ["Six words; 'be' and 'to' lead."]
    session = await service.get_session(app_name="lc", user_id="u", session_id="s")
    assert session.state["last_stats"] == {"words": 6, "top": ["be", "to"]}
