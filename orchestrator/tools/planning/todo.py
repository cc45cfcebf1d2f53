"""``TodoWriteTool``: a checklist the model replaces whole on every ``todo_write`` call.

The list is JSON under ``todos:<branch>`` in session state (``session_blob``), so it lasts across turns and
restarts. Hard rules are checked in code — ``content`` and ``activeForm`` not empty, at most one item
``in_progress``, ``content`` unique — and a bad list is refused with ``{"error": "INVALID_ARGS: ..."}`` or
``{"error": "INVALID_TODOS: ..."}``, leaving the stored list as it was. How to use the tool is the model's
instruction (``DEFAULT_TODO_PROMPT``), added to every request the tool is declared in.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.context import InvocationContext
from orchestrator.tools.base import BaseTool
from orchestrator.tools.planning.state import blob_lock, branch_of, load_blob, save_blob, state_key

if TYPE_CHECKING:  # annotations only: importing the models package would load the model SDK
    from orchestrator.models.base import LlmRequest

logger = logging.getLogger(__name__)

TOOL_NAME = "todo_write"
DEFAULT_STATE_KEY_PREFIX = "todos"
DEFAULT_NUDGE_MESSAGE = (
    "Todo list updated. Keep exactly one item in_progress, mark each item completed as soon as it is done, and "
    "call todo_write again whenever the plan changes."
)
DEFAULT_TODO_DESCRIPTION = (
    "Write the todo list for the current task. Send the COMPLETE updated list every time: it replaces the "
    "previous one. At most one item may be in_progress; send an empty array to clear the list. Use it for tasks "
    "of three or more steps, not for a single trivial step or a plain question."
)
DEFAULT_TODO_PROMPT = """\
You have the `todo_write` tool to plan and track work of several steps.
- Use it when a task has three or more steps or the user asks for several things; skip it for one trivial step.
- Every call sends the COMPLETE list; it replaces the previous one. `todos: []` clears it.
- Each item has `content` (imperative: "Run tests"), `activeForm` (continuous: "Running tests") and `status`
  (`pending`, `in_progress` or `completed`).
- Keep exactly one item `in_progress` while you work on it, and mark it `completed` as soon as it is done; to
  move on, complete one item and start the next in the same call.
- Do not repeat the whole list to the user after a call; carry on with the work."""


class TodoStatus(str, Enum):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


class TodoItem(BaseModel):
    """One item; ``active_form`` is ``activeForm`` on the wire and in state."""

    model_config = ConfigDict(populate_by_name=True)

    content: str
    active_form: str = Field(alias="activeForm")
    status: TodoStatus


NudgeHook = Callable[[list[TodoItem], list[TodoItem]], "str | None"]
"""Called with (old list, new list) after a successful write; a non-empty string is appended to the message."""


def validate_todos(todos: list[TodoItem]) -> str | None:
    """What is wrong with ``todos`` (``None`` when nothing)."""
    seen: dict[str, int] = {}
    in_progress: int | None = None
    for i, item in enumerate(todos):
        if not item.content.strip():
            return f"todos[{i}].content must not be empty"
        if not item.active_form.strip():
            return f"todos[{i}].activeForm must not be empty"
        if item.status is TodoStatus.IN_PROGRESS:
            if in_progress is not None:
                return f"at most one item may be in_progress (todos[{in_progress}] and todos[{i}] are)"
            in_progress = i
        if item.content in seen:
            return f"todos[{i}].content {item.content!r} repeats todos[{seen[item.content]}]"
        seen[item.content] = i
    return None


def _decode(raw: Any) -> list[TodoItem]:
    if not raw:
        return []
    try:
        data = json.loads(raw) if isinstance(raw, str) else raw
        return [TodoItem.model_validate(x) for x in data] if isinstance(data, list) else []
    except (ValueError, TypeError, ValidationError) as exc:
        logger.warning("stored todo list is unreadable, taken as empty: %s", exc)
        return []


def _dump(todos: list[TodoItem]) -> list[dict[str, Any]]:
    return [t.model_dump(mode="json", by_alias=True) for t in todos]


def get_todos(session: Any, branch: str = "", prefix: str = DEFAULT_STATE_KEY_PREFIX) -> list[TodoItem]:
    """The stored list of ``branch`` (an agent's name) in ``session`` (anything with a ``state`` mapping)."""
    state = getattr(session, "state", None) or {}
    return _decode(state.get(state_key(prefix, branch)))


def render_todos(todos: list[TodoItem]) -> str:
    """A plain-text checklist: ✅ completed, 🔄 in progress (its ``activeForm``), ⬜ pending."""
    glyphs = {TodoStatus.COMPLETED: "✅", TodoStatus.IN_PROGRESS: "🔄", TodoStatus.PENDING: "⬜"}
    return "\n".join(
        f"{glyphs[t.status]} {t.active_form if t.status is TodoStatus.IN_PROGRESS else t.content}" for t in todos
    )


class TodoWriteTool(BaseTool):
    """The ``todo_write`` tool."""

    def __init__(
        self,
        *,
        state_key_prefix: str = DEFAULT_STATE_KEY_PREFIX,
        clear_on_all_done: bool = True,
        default_nudge: str = DEFAULT_NUDGE_MESSAGE,
        nudge_hooks: list[NudgeHook] | None = None,
        filters_name: list[str] | None = None,
        filters: list | None = None,
    ) -> None:
        super().__init__(TOOL_NAME, DEFAULT_TODO_DESCRIPTION, filters_name=filters_name, filters=filters)
        self.state_key_prefix = state_key_prefix or DEFAULT_STATE_KEY_PREFIX
        self.clear_on_all_done = clear_on_all_done
        self.default_nudge = default_nudge
        self.nudge_hooks = list(nudge_hooks or [])

    def parameters_schema(self) -> dict[str, Any]:
        item = {
            "type": "object",
            "properties": {
                "content": {"type": "string", "description": "What to do, imperative, e.g. 'Run tests'."},
                "activeForm": {"type": "string", "description": "Shown while in progress, e.g. 'Running tests'."},
                "status": {"type": "string", "enum": [s.value for s in TodoStatus]},
            },
            "required": ["content", "activeForm", "status"],
        }
        return {
            "type": "object",
            "properties": {"todos": {
                "type": "array", "items": item,
                "description": "The complete updated list; it replaces the previous one. [] clears it.",
            }},
            "required": ["todos"],
        }

    async def process_request(self, *, tool_context: InvocationContext, llm_request: "LlmRequest") -> None:
        if DEFAULT_TODO_PROMPT not in llm_request.system_instruction:
            llm_request.append_instructions([DEFAULT_TODO_PROMPT])

    async def _run_async_impl(self, *, tool_context: InvocationContext, args: dict[str, Any]) -> Any:
        raw = args.get("todos")
        if not isinstance(raw, list):
            got = "missing" if "todos" not in args else f"a {type(raw).__name__}" if raw is not None else "null"
            return {"error": f"INVALID_ARGS: `todos` must be an array (got {got}); send [] to clear the list"}
        try:
            todos = [TodoItem.model_validate(x) for x in raw]
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return {"error": f"INVALID_ARGS: each todo needs content, activeForm and status: {where}: {first['msg']}"}
        problem = validate_todos(todos)
        if problem is not None:
            return {"error": f"INVALID_TODOS: {problem}"}
        key = state_key(self.state_key_prefix, branch_of(tool_context))
        async with blob_lock(tool_context, key):
            old = _decode(load_blob(tool_context, key))
            kept = [] if self.clear_on_all_done and todos and all(
                t.status is TodoStatus.COMPLETED for t in todos) else todos
            save_blob(tool_context, key, json.dumps(_dump(kept), ensure_ascii=False))
        message = self.default_nudge
        for hook in self.nudge_hooks:
            try:
                extra = hook(old, todos)
            except Exception:  # a policy hook's failure must not lose the write
                logger.exception("todo nudge hook failed")
                continue
            if extra:
                message = f"{message}\n\n{extra}"
        return {"message": message, "todos": _dump(kept), "oldTodos": _dump(old) if old else None}
