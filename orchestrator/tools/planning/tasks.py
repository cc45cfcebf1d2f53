"""``TaskToolSet``: a task board the model edits by id — ``task_create``, ``task_update``, ``task_get``, ``task_list``.

The board (a ``TaskStore``: the tasks by id and the highest id ever given, so ids are never reused) is one JSON blob
under ``tasks:<branch>`` in session state (``session_blob``), changed under a lock per session and board so calls
of one model answer may run in parallel. Dependencies are two-way edges, ``blockedBy`` (upstream) and ``blocks``
(downstream); completing (or deleting) a task removes it from its dependants' ``blockedBy`` and reports the pending
tasks that became free as ``unblocked``. Refused with the board unchanged, as ``{"error": "<CODE>: ..."}``:
``INVALID_ARGS`` (a missing or wrong argument), ``NOT_FOUND`` (an unknown ``taskId``), ``INVALID_DEPENDENCY``
(an unknown or deleted task named as a dependency, a task depending on itself, a cycle), ``INVALID_STATUS``
(starting or completing a task whose upstream tasks are unfinished; a second task ``in_progress`` when
``enforce_single_in_progress``).
"""

from __future__ import annotations

import logging
from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.context import InvocationContext
from orchestrator.errors import ToolCallRefusedError
from orchestrator.tools.base import BaseTool
from orchestrator.tools.planning.state import blob_lock, branch_of, load_blob, save_blob, state_key
from orchestrator.tools.toolset import BaseToolSet

if TYPE_CHECKING:  # annotations only: importing the models package would load the model SDK
    from orchestrator.models.base import LlmRequest

logger = logging.getLogger(__name__)

DEFAULT_STATE_KEY_PREFIX = "tasks"
DEFAULT_TASK_PROMPT = """\
You have task tools to keep a task board for work of several steps: task_create, task_update, task_get, task_list.
- Plan first: create the tasks (task_create returns each id), then link them with task_update addBlockedBy
  (upstream tasks that must finish first) or addBlocks (downstream tasks this one holds up).
- Then work one task at a time: task_update status in_progress, do the work, task_update status completed. A task
  whose upstream tasks are unfinished cannot start; completing a task reports the tasks it unblocked.
- Use only ids returned by task_create; never invent one. task_list gives summaries, task_get one task in full.
- Set status deleted for a task that is no longer needed."""


class TaskStatus(str, Enum):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    DELETED = "deleted"


_FINISHED = (TaskStatus.COMPLETED, TaskStatus.DELETED)


class TaskRecord(BaseModel):
    """One task; camelCase names (``activeForm``, ``blockedBy``) on the wire and in state."""

    model_config = ConfigDict(populate_by_name=True)

    id: str
    subject: str
    description: str = ""
    active_form: str | None = Field(default=None, alias="activeForm")
    owner: str | None = None
    status: TaskStatus = TaskStatus.PENDING
    blocks: list[str] = Field(default_factory=list)
    blocked_by: list[str] = Field(default_factory=list, alias="blockedBy")
    metadata: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        """What ``task_list`` shows: everything but ``description``, ``blocks`` and ``metadata``."""
        return self.model_dump(mode="json", by_alias=True, include={"id", "subject", "status", "owner",
                                                                    "active_form", "blocked_by"})


class TaskStore(BaseModel):
    """A whole board."""

    highwatermark: int = 0
    tasks: dict[str, TaskRecord] = Field(default_factory=dict)

    def ordered(self) -> list[TaskRecord]:
        return sorted(self.tasks.values(), key=lambda t: (0, int(t.id), "") if t.id.isdigit() else (1, 0, t.id))

    def stats(self) -> dict[str, int]:
        counts = {s.value: 0 for s in TaskStatus if s is not TaskStatus.DELETED}
        for task in self.tasks.values():
            if task.status.value in counts:
                counts[task.status.value] += 1
        return counts

    def cycle(self) -> list[str] | None:
        """A dependency cycle as the ids along it, the first repeated last (``None`` when there is none)."""
        done: set[str] = set()

        def visit(tid: str, path: list[str]) -> list[str] | None:
            if tid in path:
                return path[path.index(tid):] + [tid]
            if tid in done:
                return None
            for upstream in self.tasks[tid].blocked_by:
                if upstream in self.tasks and (found := visit(upstream, path + [tid])):
                    return found
            done.add(tid)
            return None

        for task in self.ordered():
            if found := visit(task.id, []):
                return found
        return None

    def release(self, done_id: str) -> list[str]:
        """Remove ``done_id`` from its dependants' ``blockedBy``; the pending ones now free, in id order."""
        unblocked = []
        for task in self.ordered():
            if done_id in task.blocked_by:
                task.blocked_by.remove(done_id)
                if not self.open_blockers(task) and task.status is TaskStatus.PENDING:
                    unblocked.append(task.id)
        self.tasks[done_id].blocks = []
        return unblocked

    def open_blockers(self, task: TaskRecord) -> list[str]:
        """The ids of ``task``'s upstream tasks that are neither completed nor deleted."""
        return [u for u in task.blocked_by if u in self.tasks and self.tasks[u].status not in _FINISHED]

    def link(self, upstream: str, downstream: str) -> None:
        if downstream not in self.tasks[upstream].blocks:
            self.tasks[upstream].blocks.append(downstream)
        if upstream not in self.tasks[downstream].blocked_by:
            self.tasks[downstream].blocked_by.append(upstream)

    def unlink(self, upstream: str, downstream: str) -> None:
        for tid, edges, other in ((upstream, "blocks", downstream), (downstream, "blocked_by", upstream)):
            if tid in self.tasks and other in getattr(self.tasks[tid], edges):
                getattr(self.tasks[tid], edges).remove(other)


def _decode(raw: Any) -> TaskStore:
    if not raw:
        return TaskStore()
    try:
        return TaskStore.model_validate_json(raw) if isinstance(raw, str) else TaskStore.model_validate(raw)
    except (ValueError, TypeError, ValidationError) as exc:
        logger.warning("stored task board is unreadable, taken as empty: %s", exc)
        return TaskStore()


def get_task_store(session: Any, branch: str = "", prefix: str = DEFAULT_STATE_KEY_PREFIX) -> TaskStore:
    """The stored board of ``branch`` (an agent's name) in ``session`` (anything with a ``state`` mapping)."""
    state = getattr(session, "state", None) or {}
    return _decode(state.get(state_key(prefix, branch)))


def render_task_list(store: TaskStore) -> str:
    """One line per task that is not deleted: ``✅ #1 subject``, ``🔄``, ``⬜ ... (blocked by: 2)``."""
    glyphs = {TaskStatus.COMPLETED: "✅", TaskStatus.IN_PROGRESS: "🔄", TaskStatus.PENDING: "⬜"}
    lines = []
    for task in store.ordered():
        if task.status is TaskStatus.DELETED:
            continue
        blocked = f" (blocked by: {', '.join(task.blocked_by)})" if task.blocked_by else ""
        lines.append(f"{glyphs[task.status]} #{task.id} {task.subject}{blocked}")
    return "\n".join(lines)


def _ids(args: dict[str, Any], name: str) -> list[str]:
    value = args.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
        raise ToolCallRefusedError(f"INVALID_ARGS: `{name}` must be an array of task ids")
    return [str(v) for v in value]


def _text(args: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = args.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value.strip()):
        raise ToolCallRefusedError(f"INVALID_ARGS: `{name}` must be a{' non-empty' if required else ''} string")
    return value


def _task_id(args: dict[str, Any]) -> str:
    value = args.get("taskId")
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise ToolCallRefusedError("INVALID_ARGS: `taskId` is required and must be a task id string")
    return str(value)


class _TaskTool(BaseTool):
    """A task tool: loads the board, lets ``_apply`` change it, saves it only when ``_apply`` did not refuse."""

    writes = True

    def __init__(self, name: str, description: str, schema: dict[str, Any], toolset: TaskToolSet) -> None:
        super().__init__(name, description)
        self._schema = schema
        self.toolset = toolset

    def parameters_schema(self) -> dict[str, Any]:
        return self._schema

    async def process_request(self, *, tool_context: InvocationContext, llm_request: "LlmRequest") -> None:
        if self.toolset.inject_prompt and DEFAULT_TASK_PROMPT not in llm_request.system_instruction:
            llm_request.append_instructions([DEFAULT_TASK_PROMPT])

    async def _run_async_impl(self, *, tool_context: InvocationContext, args: dict[str, Any]) -> Any:
        key = state_key(self.toolset.state_key_prefix, branch_of(tool_context))
        async with blob_lock(tool_context, key):
            store = _decode(load_blob(tool_context, key))
            try:
                result = self._apply(store, args)
            except ToolCallRefusedError as exc:
                return {"error": str(exc)}
            if self.writes:
                save_blob(tool_context, key, store.model_dump_json(by_alias=True))
            return result

    def _apply(self, store: TaskStore, args: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


class TaskCreateTool(_TaskTool):
    def _apply(self, store: TaskStore, args: dict[str, Any]) -> dict[str, Any]:
        subject = _text(args, "subject", required=True)
        description = _text(args, "description") or ""
        active_form = _text(args, "activeForm")
        metadata = args.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise ToolCallRefusedError("INVALID_ARGS: `metadata` must be an object")
        store.highwatermark += 1
        task = TaskRecord(id=str(store.highwatermark), subject=subject, description=description,
                          active_form=active_form, metadata=metadata)
        store.tasks[task.id] = task
        return {"task": {"id": task.id, "subject": task.subject},
                "message": f"Task {task.id} created. Use task_update to set its status or dependencies."}


class TaskUpdateTool(_TaskTool):
    def _apply(self, store: TaskStore, args: dict[str, Any]) -> dict[str, Any]:
        task_id = _task_id(args)
        task = store.tasks.get(task_id)
        if task is None:
            raise ToolCallRefusedError(f"NOT_FOUND: task {task_id!r} does not exist")
        status = args.get("status")
        if status is not None and status not in {s.value for s in TaskStatus}:
            raise ToolCallRefusedError(f"INVALID_ARGS: `status` must be one of {', '.join(s.value for s in TaskStatus)}")
        if task.status is TaskStatus.DELETED and status not in (None, TaskStatus.DELETED.value):
            raise ToolCallRefusedError(f"INVALID_STATUS: task {task_id!r} is deleted and cannot change")
        edits = {name: _ids(args, name) for name in ("addBlockedBy", "removeBlockedBy", "addBlocks", "removeBlocks")}
        for other in edits["addBlockedBy"] + edits["addBlocks"]:
            if other == task_id:
                raise ToolCallRefusedError(f"INVALID_DEPENDENCY: task {task_id!r} cannot depend on itself")
            if other not in store.tasks:
                raise ToolCallRefusedError(f"INVALID_DEPENDENCY: task {other!r} does not exist")
            if store.tasks[other].status is TaskStatus.DELETED:
                raise ToolCallRefusedError(f"INVALID_DEPENDENCY: task {other!r} is deleted")
        fields = {name: _text(args, name, required=name == "subject" and args.get(name) is not None)
                  for name in ("subject", "description", "activeForm", "owner")}
        metadata = args.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise ToolCallRefusedError("INVALID_ARGS: `metadata` must be an object")

        for upstream in edits["addBlockedBy"]:
            store.link(upstream, task_id)
        for upstream in edits["removeBlockedBy"]:
            store.unlink(upstream, task_id)
        for downstream in edits["addBlocks"]:
            store.link(task_id, downstream)
        for downstream in edits["removeBlocks"]:
            store.unlink(task_id, downstream)
        if cycle := store.cycle():
            raise ToolCallRefusedError(f"INVALID_DEPENDENCY: dependency cycle (each blocked by the next): {' -> '.join(cycle)}")
        for name, attr in (("subject", "subject"), ("description", "description"), ("activeForm", "active_form"),
                           ("owner", "owner")):
            if fields[name] is not None:
                setattr(task, attr, fields[name])
        if metadata is not None:
            task.metadata = metadata

        unblocked: list[str] = []
        if status is not None and status != task.status.value:
            new = TaskStatus(status)
            if new in (TaskStatus.IN_PROGRESS, TaskStatus.COMPLETED) and (waiting := store.open_blockers(task)):
                raise ToolCallRefusedError(f"INVALID_STATUS: task {task_id!r} is blocked by unfinished task(s) "
                               f"{', '.join(waiting)}; finish those first")
            if new is TaskStatus.IN_PROGRESS and self.toolset.enforce_single_in_progress:
                busy = [t.id for t in store.ordered() if t.status is TaskStatus.IN_PROGRESS and t.id != task_id]
                if busy:
                    raise ToolCallRefusedError(f"INVALID_STATUS: task {busy[0]!r} is already in_progress; complete it first")
            task.status = new
            if new in _FINISHED:
                unblocked = store.release(task_id)
        message = f"Task {task_id} updated (status={task.status.value})."
        if unblocked:
            message += f" Unblocked: {', '.join(unblocked)}."
        return {"task": task.model_dump(mode="json", by_alias=True), "unblocked": unblocked, "message": message}


class TaskGetTool(_TaskTool):
    writes = False

    def _apply(self, store: TaskStore, args: dict[str, Any]) -> dict[str, Any]:
        task_id = _task_id(args)
        task = store.tasks.get(task_id)
        if task is None:
            raise ToolCallRefusedError(f"NOT_FOUND: task {task_id!r} does not exist")
        return {"task": task.model_dump(mode="json", by_alias=True)}


class TaskListTool(_TaskTool):
    writes = False

    def _apply(self, store: TaskStore, args: dict[str, Any]) -> dict[str, Any]:
        include_deleted = args.get("includeDeleted", False)
        if not isinstance(include_deleted, bool):
            raise ToolCallRefusedError("INVALID_ARGS: `includeDeleted` must be a boolean")
        tasks = [t.summary() for t in store.ordered() if include_deleted or t.status is not TaskStatus.DELETED]
        return {"tasks": tasks, "stats": store.stats()}


_ID_ARRAY = {"type": "array", "items": {"type": "string"}}
_STRING = {"type": "string"}


class TaskToolSet(BaseToolSet):
    """The four task tools over one board per agent branch."""

    def __init__(
        self,
        *,
        state_key_prefix: str = DEFAULT_STATE_KEY_PREFIX,
        enforce_single_in_progress: bool = True,
        inject_prompt: bool = True,
        filters_name: list[str] | None = None,
    ) -> None:
        super().__init__(name="TaskToolSet", filters_name=filters_name)
        self.state_key_prefix = state_key_prefix or DEFAULT_STATE_KEY_PREFIX
        self.enforce_single_in_progress = enforce_single_in_progress
        self.inject_prompt = inject_prompt
        statuses = [s.value for s in TaskStatus]
        self._tools: list[BaseTool] = [
            TaskCreateTool("task_create", "Create a task on the board; returns its id (status pending).", {
                "type": "object",
                "properties": {"subject": {"type": "string", "description": "Short imperative title."},
                               "description": {"type": "string", "description": "Details."},
                               "activeForm": {"type": "string", "description": "Shown while in progress."},
                               "metadata": {"type": "object", "description": "Extra key-value data."}},
                "required": ["subject"],
            }, self),
            TaskUpdateTool("task_update", "Change one task by id: status, fields or dependencies.", {
                "type": "object",
                "properties": {"taskId": {"type": "string", "description": "Id returned by task_create."},
                               "status": {"type": "string", "enum": statuses},
                               "subject": _STRING, "description": _STRING, "activeForm": _STRING, "owner": _STRING,
                               "metadata": {"type": "object"},
                               "addBlockedBy": {**_ID_ARRAY, "description": "Upstream tasks that must finish first."},
                               "removeBlockedBy": _ID_ARRAY,
                               "addBlocks": {**_ID_ARRAY, "description": "Downstream tasks this one holds up."},
                               "removeBlocks": _ID_ARRAY},
                "required": ["taskId"],
            }, self),
            TaskGetTool("task_get", "One task in full, with its description.", {
                "type": "object", "properties": {"taskId": {"type": "string"}}, "required": ["taskId"],
            }, self),
            TaskListTool("task_list", "Summaries of the board's tasks (no descriptions) and counts by status.", {
                "type": "object", "properties": {"includeDeleted": {"type": "boolean"}},
            }, self),
        ]

    async def get_tools(self, invocation_context: InvocationContext | None = None) -> list[BaseTool]:
        return list(self._tools)

