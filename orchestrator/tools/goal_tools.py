"""The session goal tools at the guides' import path (``trpc_agent_sdk.tools.goal_tools``); they live in
``orchestrator.tools.planning.goal``."""

from orchestrator.tools.planning.goal import (
    CreateGoalTool,
    GetGoalTool,
    GoalOptions,
    GoalRecord,
    GoalStatus,
    GoalToolSet,
    RetryEvent,
    UpdateGoalTool,
    get_goal_record,
    render_goal,
    setup_goal,
    start_goal,
)

__all__ = ["CreateGoalTool", "GetGoalTool", "GoalOptions", "GoalRecord", "GoalStatus", "GoalToolSet", "RetryEvent",
           "UpdateGoalTool", "get_goal_record", "render_goal", "setup_goal", "start_goal"]
