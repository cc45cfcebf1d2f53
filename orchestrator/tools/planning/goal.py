"""Goal tools: one lasting goal per agent branch, and an agent that may not stop while it is open.

``GoalToolSet`` gives the model ``create_goal``, ``get_goal`` and ``update_goal``; the goal (a ``GoalRecord``:
objective and status ``active`` → ``complete`` | ``blocked``, both final) is JSON under ``goal:<branch>`` in
session state (``session_blob``), so it lasts across turns and restarts. ``setup_goal(agent, GoalOptions(...))``
adds the tool set and two model callbacks: while the goal is active, *before* each model call the guidance joins
the system instruction (``inject_guidance``) and, after a refused answer, a user-role reminder (``nudge_template``)
joins the history; *after* each model call an answer with visible text and no tool call is refused (dropped, and
the model asked again in the same invocation, ``RETRY_MODEL_CALL``) up to ``max_retries`` times per invocation,
after which it passes (fail-open). ``on_retry`` hears each refusal (``reason="blocked"``) and the give-up
(``reason="exhausted"``). ``start_goal`` sets a goal from the host before the first turn.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.agents.llm_agent import RETRY_MODEL_CALL
from orchestrator.context import InvocationContext
from orchestrator.events import Event, EventActions
from orchestrator.models.base import LlmRequest, LlmResponse
from orchestrator.tools.base import BaseTool
from orchestrator.tools.planning.state import blob_lock, branch_of, load_blob, save_blob, state_key
from orchestrator.tools.toolset import BaseToolSet
from orchestrator.types import Content, Part

if TYPE_CHECKING:
    from orchestrator.agents.llm_agent import LlmAgent
    from orchestrator.sessions.base import BaseSessionService

logger = logging.getLogger(__name__)

DEFAULT_STATE_KEY_PREFIX = "goal"
DEFAULT_MAX_RETRIES = 3
DEFAULT_GUIDANCE = """\
You have session goal tools. A goal is the lasting objective of this conversation, not a todo list.
- Call at most one goal tool per response: never create_goal and update_goal in the same response; create the goal,
  then mark it complete or blocked in a later turn.
- create_goal only when the user asks you to keep working toward an objective of several steps, or the request
  clearly needs one; not for ordinary one-turn questions. get_goal shows the current goal.
- update_goal complete only when the objective has really been achieved. update_goal blocked only when the same
  blocking condition has come back across attempts and you cannot progress without the user's input or a change
  outside; not because the work is hard, slow, uncertain or unfinished.
- While the goal is active a final answer is not enough: keep working, or call update_goal with complete or
  blocked."""
DEFAULT_NUDGE = """\
[goal reminder] You gave a final answer, but the session goal is still active (attempt {attempt} of {max_retries}).

Active goal:
{objective}

Continue working toward it, or call update_goal with status complete or blocked (blocked only when the same \
blocking condition keeps coming back and you cannot progress without the user). Do not give a final answer while \
the goal is active."""


class GoalStatus(str, Enum):
    ACTIVE = "active"
    COMPLETE = "complete"
    BLOCKED = "blocked"


class GoalRecord(BaseModel):
    """The goal; camelCase names (``createdAtUnix``, ...) on the wire and in state."""

    model_config = ConfigDict(populate_by_name=True)

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    objective: str
    status: GoalStatus = GoalStatus.ACTIVE
    created_at_unix: int = Field(alias="createdAtUnix")
    updated_at_unix: int = Field(alias="updatedAtUnix")
    terminal_at_unix: int | None = Field(default=None, alias="terminalAtUnix")

    @classmethod
    def new(cls, objective: str) -> GoalRecord:
        now = int(time.time())
        return cls(objective=objective, created_at_unix=now, updated_at_unix=now)

    def public(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def _decode(raw: Any) -> GoalRecord | None:
    if not raw:
        return None
    try:
        return GoalRecord.model_validate_json(raw) if isinstance(raw, str) else GoalRecord.model_validate(raw)
    except (ValueError, TypeError, ValidationError) as exc:
        logger.warning("stored goal is unreadable, taken as none: %s", exc)
        return None


def get_goal_record(session: Any, branch: str = "", prefix: str = DEFAULT_STATE_KEY_PREFIX) -> GoalRecord | None:
    """The stored goal of ``branch`` (an agent's name) in ``session`` (anything with a ``state`` mapping)."""
    state = getattr(session, "state", None) or {}
    return _decode(state.get(state_key(prefix, branch)))


def render_goal(goal: GoalRecord | None) -> str:
    """A few lines for a log or a terminal: ``✅ Goal [complete]``, the objective, the times."""
    if goal is None:
        return "(no goal)"
    glyph = {GoalStatus.ACTIVE: "🎯", GoalStatus.COMPLETE: "✅", GoalStatus.BLOCKED: "⛔"}[goal.status]
    lines = [f"{glyph} Goal [{goal.status.value}]", f"   objective: {goal.objective}",
             f"   created:   {goal.created_at_unix}"]
    if goal.terminal_at_unix is not None:
        lines.append(f"   terminal:  {goal.terminal_at_unix}")
    return "\n".join(lines)


async def start_goal(
    session_service: "BaseSessionService",
    *,
    app_name: str,
    user_id: str,
    session_id: str,
    objective: str,
    state_key_prefix: str = DEFAULT_STATE_KEY_PREFIX,
    agent_name: str = "",
) -> GoalRecord:
    """Set (or replace) the session's active goal from the host; the session is created when missing.

    ``agent_name`` is the ``LlmAgent.name`` the goal belongs to. An existing session gets the goal through an
    event carrying only the state change, as any other change of a stored session does.
    """
    objective = objective.strip()
    if not objective:
        raise ValueError("start_goal: objective must not be empty")
    goal = GoalRecord.new(objective)
    key = state_key(state_key_prefix or DEFAULT_STATE_KEY_PREFIX, agent_name)
    value = goal.model_dump_json(by_alias=True)
    session = await session_service.get_session(app_name=app_name, user_id=user_id, session_id=session_id)
    if session is None:
        await session_service.create_session(app_name=app_name, user_id=user_id, session_id=session_id,
                                             state={key: value})
    else:
        await session_service.append_event(session, Event(author="goal", actions=EventActions(state_delta={key: value})))
    return goal


class _GoalTool(BaseTool):
    def __init__(self, name: str, description: str, schema: dict[str, Any], prefix: str) -> None:
        super().__init__(name, description)
        self._schema = schema
        self.state_key_prefix = prefix

    def parameters_schema(self) -> dict[str, Any]:
        return self._schema

    async def _run_async_impl(self, *, tool_context: InvocationContext, args: dict[str, Any]) -> Any:
        key = state_key(self.state_key_prefix, branch_of(tool_context))
        async with blob_lock(tool_context, key):
            goal = _decode(load_blob(tool_context, key))
            result, changed = self._apply(goal, args)
            if changed is not None:
                save_blob(tool_context, key, changed.model_dump_json(by_alias=True))
            return result

    def _apply(self, goal: GoalRecord | None, args: dict[str, Any]) -> tuple[dict[str, Any], GoalRecord | None]:
        raise NotImplementedError


class CreateGoalTool(_GoalTool):
    def _apply(self, goal: GoalRecord | None, args: dict[str, Any]) -> tuple[dict[str, Any], GoalRecord | None]:
        objective = args.get("objective")
        if not isinstance(objective, str) or not objective.strip():
            return {"error": "INVALID_ARGS: `objective` is required and must be a non-empty string"}, None
        if goal is not None and goal.status is GoalStatus.ACTIVE:
            return {"error": "INVALID_STATE: an active goal already exists; complete or block it first"}, None
        new = GoalRecord.new(objective.strip())
        return {"message": "Goal created. Keep working until it is achieved, then call update_goal.",
                "goal": new.public()}, new


class GetGoalTool(_GoalTool):
    def _apply(self, goal: GoalRecord | None, args: dict[str, Any]) -> tuple[dict[str, Any], GoalRecord | None]:
        if goal is None:
            return {"message": "No session goal is set."}, None
        return {"message": f"The session goal is {goal.status.value}.", "goal": goal.public()}, None


class UpdateGoalTool(_GoalTool):
    def _apply(self, goal: GoalRecord | None, args: dict[str, Any]) -> tuple[dict[str, Any], GoalRecord | None]:
        status = args.get("status")
        if status not in (GoalStatus.COMPLETE.value, GoalStatus.BLOCKED.value):
            return {"error": "INVALID_ARGS: `status` must be 'complete' or 'blocked'"}, None
        if goal is None:
            return {"error": "INVALID_STATE: no goal exists to update"}, None
        if goal.status is not GoalStatus.ACTIVE:
            return {"error": f"INVALID_STATE: the goal is already {goal.status.value} and cannot change"}, None
        now = int(time.time())
        done = goal.model_copy(update={"status": GoalStatus(status), "updated_at_unix": now, "terminal_at_unix": now})
        return {"message": f"Goal marked {status}.", "goal": done.public()}, done


class GoalToolSet(BaseToolSet):
    """``create_goal``, ``get_goal``, ``update_goal`` (without ``setup_goal`` nothing stops an early answer)."""

    def __init__(self, *, state_key_prefix: str = DEFAULT_STATE_KEY_PREFIX, filters_name: list[str] | None = None):
        super().__init__(name="GoalToolSet", filters_name=filters_name)
        self.state_key_prefix = prefix = state_key_prefix or DEFAULT_STATE_KEY_PREFIX
        self._tools: list[BaseTool] = [
            CreateGoalTool("create_goal", "Create the session goal for an objective of several steps that the user "
                           "wants pursued until it is complete or blocked; not for ordinary one-turn requests.", {
                               "type": "object",
                               "properties": {"objective": {"type": "string",
                                                            "description": "What 'done' concretely means."}},
                               "required": ["objective"]}, prefix),
            GetGoalTool("get_goal", "Read the current session goal, if any.",
                        {"type": "object", "properties": {}}, prefix),
            UpdateGoalTool("update_goal", "Mark the active session goal complete (really achieved) or blocked (the "
                           "same obstacle keeps coming back and only the user can remove it).", {
                               "type": "object",
                               "properties": {"status": {"type": "string", "enum": ["complete", "blocked"]}},
                               "required": ["status"]}, prefix),
        ]

    async def get_tools(self, invocation_context: InvocationContext | None = None) -> list[BaseTool]:
        return list(self._tools)


class RetryEvent(BaseModel):
    """What ``on_retry`` hears: an answer refused (``blocked``) or let through after the budget (``exhausted``)."""

    reason: Literal["blocked", "exhausted"]
    agent_name: str
    goal: GoalRecord
    attempt_number: int
    max_retries: int


@dataclass
class GoalOptions:
    state_key_prefix: str = DEFAULT_STATE_KEY_PREFIX
    inject_guidance: bool = True
    guidance: str = DEFAULT_GUIDANCE
    max_retries: int = DEFAULT_MAX_RETRIES
    nudge_template: str = DEFAULT_NUDGE
    on_retry: Callable[[RetryEvent], None] | None = None

    def toolset(self) -> GoalToolSet:
        return GoalToolSet(state_key_prefix=self.state_key_prefix)


def _is_premature_final(response: LlmResponse) -> bool:
    """A complete answer with visible text and no tool call or tool result."""
    if response.partial or response.content is None:
        return False
    parts = response.content.parts
    if any(p.function_call or p.function_response for p in parts):
        return False
    return any(p.text and p.text.strip() and not p.thought for p in parts)


class _Enforcement:
    """The before/after-model callbacks; the invocation's counters live in its ``temp:`` state."""

    def __init__(self, options: GoalOptions) -> None:
        self.options = options

    def _key(self, ctx: InvocationContext) -> str:
        return state_key(self.options.state_key_prefix or DEFAULT_STATE_KEY_PREFIX, branch_of(ctx))

    def _counters(self, ctx: InvocationContext) -> dict[str, Any]:
        return ctx.temp_state.setdefault(f"temp:goal_enforcement:{self._key(ctx)}", {"retries": 0, "nudge": False})

    def _active(self, ctx: InvocationContext) -> GoalRecord | None:
        goal = _decode(load_blob(ctx, self._key(ctx)))
        return goal if goal is not None and goal.status is GoalStatus.ACTIVE else None

    def _emit(self, ctx: InvocationContext, goal: GoalRecord, reason: str, attempt: int) -> None:
        if self.options.on_retry is None:
            return
        try:
            self.options.on_retry(RetryEvent(reason=reason, agent_name=branch_of(ctx), goal=goal,
                                             attempt_number=attempt, max_retries=self.options.max_retries))
        except Exception:  # an observer's failure must not change the run
            logger.exception("goal on_retry callback failed")

    def before_model(self, ctx: InvocationContext, request: LlmRequest) -> None:
        goal = self._active(ctx)
        if goal is None:
            return None
        if self.options.inject_guidance and self.options.guidance not in request.system_instruction:
            request.append_instructions([self.options.guidance])
        counters = self._counters(ctx)
        if counters["nudge"]:
            counters["nudge"] = False
            text = self.options.nudge_template.format(attempt=counters["retries"],
                                                      max_retries=self.options.max_retries, objective=goal.objective)
            request.contents.append(Content(role="user", parts=[Part.from_text(text=text)]))
        return None

    def after_model(self, ctx: InvocationContext, response: LlmResponse) -> Any:
        if not _is_premature_final(response):
            return None
        goal = self._active(ctx)
        if goal is None:
            return None
        counters = self._counters(ctx)
        if counters["retries"] >= self.options.max_retries:
            self._emit(ctx, goal, "exhausted", counters["retries"])
            counters.update(retries=0, nudge=False)
            return None
        counters["retries"] += 1
        counters["nudge"] = True
        self._emit(ctx, goal, "blocked", counters["retries"])
        return RETRY_MODEL_CALL


def _chain(first: Callable[..., Any] | None, second: Callable[..., Any]) -> Callable[..., Any]:
    """``first`` then ``second``; a result of ``first`` (an answer, a replacement) wins and is passed on."""
    if first is None:
        return second

    async def chained(ctx: InvocationContext, value: Any) -> Any:
        result = first(ctx, value)
        if hasattr(result, "__await__"):
            result = await result
        if result is not None:
            if isinstance(value, LlmResponse) and isinstance(result, LlmResponse):
                return second(ctx, result) or result
            return result
        return second(ctx, value)

    return chained


def setup_goal(agent: "LlmAgent", opts: GoalOptions | None = None) -> "LlmAgent":
    """Give ``agent`` the goal tools and the enforcement callbacks (after any it already has); returns it."""
    opts = opts or GoalOptions()
    enforcement = _Enforcement(opts)
    agent.tools.append(opts.toolset())
    agent.before_model_callback = _chain(agent.before_model_callback, enforcement.before_model)
    agent.after_model_callback = _chain(agent.after_model_callback, enforcement.after_model)
    return agent
