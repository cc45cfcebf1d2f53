"""Three-tier injection: what the system message says about skills.

1. Overview, in every request: the name and description of each skill.
2. Body, once ``skill_load`` marked the skill loaded (``temp:skill:loaded:<name>``): under ``[Loaded] <name>``.
3. Docs, once selected (``temp:skill:docs:<name>`` is ``"*"`` or a JSON list): under ``[Doc] <name>/<doc>``.

State keys (``temp:`` keys live for one invocation):

* ``temp:skill:loaded:<name>`` — ``"1"`` when the skill is loaded
* ``temp:skill:docs:<name>``   — ``"*"`` for every doc, or a JSON list of doc names
* ``temp:skill:tools:<name>``  — a JSON list of the selected tool names
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from orchestrator.errors import SkillError
from orchestrator.skills.repository import BaseSkillRepository

LOADED_PREFIX = "temp:skill:loaded:"
DOCS_PREFIX = "temp:skill:docs:"
TOOLS_PREFIX = "temp:skill:tools:"
ALL_DOCS = "*"


def loaded_skills(state: Mapping[str, Any]) -> list[str]:
    return sorted(key[len(LOADED_PREFIX):] for key, value in state.items() if key.startswith(LOADED_PREFIX) and value)


def selected_docs(state: Mapping[str, Any], name: str) -> str | list[str]:
    """``"*"`` or the selected doc names of a skill."""
    value = state.get(DOCS_PREFIX + name)
    if value == ALL_DOCS:
        return ALL_DOCS
    return _json_list(value)


def selected_tools(state: Mapping[str, Any], name: str) -> list[str] | None:
    """The selected tool names of a skill, or ``None`` when nothing was selected yet."""
    value = state.get(TOOLS_PREFIX + name)
    return None if value is None else _json_list(value)


def _json_list(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, str) and value:
        try:
            parsed = json.loads(value)
        except ValueError:
            return []
        return [str(v) for v in parsed] if isinstance(parsed, list) else []
    return []


def skill_instructions(repository: BaseSkillRepository, state: Mapping[str, Any], tool_names: set[str]) -> str:
    """The skills part of the system message for the current state; hints name only tools that exist."""
    summaries = repository.summaries()
    lines = ["Available skills:"]
    lines += [f"- {s.name}: {s.description}" for s in summaries] or ["- (none)"]
    if "skill_load" in tool_names:
        lines.append("\nLoad a skill with skill_load(skill_name=...) to see its instructions before using it.")
    if "skill_select_docs" in tool_names:
        lines.append("Add a loaded skill's docs with skill_select_docs(skill_name=..., docs=[...]).")
    if "skill_run" in tool_names:
        lines.append(
            "Run a skill's commands with skill_run(skill=..., command=..., output_files=[...]); commands run in the "
            "skill folder and can use $WORKSPACE_DIR, $SKILLS_DIR, $WORK_DIR, $OUTPUT_DIR, $RUN_DIR and $SKILL_NAME."
        )
    parts = ["\n".join(lines)]
    for name in loaded_skills(state):
        try:
            skill = repository.get(name)
        except SkillError as exc:
            parts.append(f"[Loaded] {name}\n\n(this skill cannot be used: {exc})")
            continue
        parts.append(f"[Loaded] {name}\n\n{skill.body}")
        chosen = selected_docs(state, name)
        for doc in skill.docs:
            if chosen == ALL_DOCS or doc.name in chosen:
                parts.append(f"[Doc] {name}/{doc.name}\n\n{doc.content}")
    return "\n\n".join(parts)
