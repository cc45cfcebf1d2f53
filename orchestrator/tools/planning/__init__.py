"""The planning tool family: a todo list (``TodoWriteTool``), a task board (``TaskToolSet``) and a session goal
(``GoalToolSet``, also at the guides' ``orchestrator.tools.goal_tools``), each kept in the session's state
(``state``). Exports are imported on first use (``worker.lazy``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "orchestrator.tools.planning.goal": ["GoalOptions", "GoalToolSet", "RetryEvent", "get_goal_record", "render_goal",
                                         "setup_goal", "start_goal"],
    "orchestrator.tools.planning.tasks": ["TaskToolSet", "get_task_store", "render_task_list"],
    "orchestrator.tools.planning.todo": ["TodoWriteTool", "get_todos", "render_todos"],
})

if TYPE_CHECKING:
    from orchestrator.tools.planning.goal import (GoalOptions, GoalToolSet, RetryEvent, get_goal_record, render_goal,
                                                  setup_goal, start_goal)
    from orchestrator.tools.planning.tasks import TaskToolSet, get_task_store, render_task_list
    from orchestrator.tools.planning.todo import TodoWriteTool, get_todos, render_todos
