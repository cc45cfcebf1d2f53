"""``DynamicSkillToolSet``: offer the model only the tools that loaded skills select.

``available_tools`` is the pool: registered tool names (``@register_tool``), tool objects, or plain functions.
For each loaded skill, the tools in ``temp:skill:tools:<name>`` (set by ``skill_load`` to the skill's
``Tools:`` list and changed by ``skill_select_tools``) are looked up in the pool; a name found nowhere is logged
once and skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from orchestrator.context import InvocationContext
from orchestrator.errors import SkillError
from orchestrator.skills.repository import BaseSkillRepository
from orchestrator.skills.state import loaded_skills, selected_tools
from orchestrator.tools.base import BaseTool
from orchestrator.tools.function_tool import FunctionTool
from orchestrator.tools.registry import get_tool
from orchestrator.tools.toolset import BaseToolSet

logger = logging.getLogger(__name__)


class DynamicSkillToolSet(BaseToolSet):
    """Tools chosen by the loaded skills."""

    def __init__(
        self,
        skill_repository: BaseSkillRepository,
        available_tools: Iterable[str | BaseTool | Callable[..., Any]],
        name: str = "dynamic_skill_tools",
    ) -> None:
        super().__init__(name=name)
        self.skill_repository = skill_repository
        self._objects: dict[str, BaseTool] = {}
        self._names: set[str] = set()
        for item in available_tools:
            if isinstance(item, str):
                self._names.add(item)
            else:
                tool = item if isinstance(item, BaseTool) else FunctionTool(item)
                self._objects[tool.name] = tool
        self.unresolved: set[str] = set()

    def _resolve(self, name: str) -> BaseTool | None:
        if name in self._objects:
            return self._objects[name]
        tool = get_tool(name) if name in self._names else None
        if tool is None and name not in self.unresolved:
            self.unresolved.add(name)
            logger.warning("tool %r is selected by a skill but is neither in available_tools nor registered", name)
        return tool

    async def get_tools(self, invocation_context: InvocationContext | None = None) -> list[BaseTool]:
        if invocation_context is None:
            return []
        state = invocation_context.state
        chosen: dict[str, BaseTool] = {}
        for skill_name in loaded_skills(state):
            names = selected_tools(state, skill_name)
            if names is None:
                try:
                    names = self.skill_repository.get(skill_name).tools
                except SkillError:
                    continue
            for name in names:
                tool = self._resolve(name)
                if tool is not None:
                    chosen.setdefault(tool.name, tool)
        return list(chosen.values())
