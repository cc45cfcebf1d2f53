"""Three-tier injection: what the system message says about skills.

1. Overview, in every request: the name and description of each skill — or, past a size, of the most relevant
   ones (see ``overview``).
2. Body, once ``skill_load`` marked the skill loaded: under ``[Loaded] <name>``.
3. Docs, once selected: under ``[Doc] <name>/<doc>``.

With ``SkillOptions.content_in_tool_results`` the bodies and docs come back as the results of ``skill_load`` and
``skill_select_docs`` instead, and the system message only names the loaded skills: it then stays the same from
one request to the next, which prompt caches reward. The state keys are described in ``state``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.errors import SkillError, SkillNotFoundError
from orchestrator.skills.options import SkillOptions
from orchestrator.skills.overview import build_overview
from orchestrator.skills.repository import BaseSkillRepository
from orchestrator.skills.state import ALL_DOCS, loaded_skills, selected_docs

REMOVED = "(this skill is no longer in the library: it was removed or renamed; load another one)"


def skill_instructions(
    repository: BaseSkillRepository,
    state: Mapping[str, Any],
    tool_names: set[str],
    query: str = "",
    options: SkillOptions | None = None,
) -> str:
    """The skills part of the system message for the current state; ``query`` is the latest user message (it
    ranks a cut overview); hints name only tools that exist."""
    options = options or SkillOptions()
    index = repository.index()
    loaded = loaded_skills(state)
    loaded_summaries = [s for s in map(index.summary, loaded) if s is not None]
    overview = build_overview(index, options, query, loaded_summaries, search_tool="skill_search" in tool_names)
    lines = [overview.text]
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
    if options.content_in_tool_results:
        if loaded:
            parts.append(f"Loaded skills: {', '.join(loaded)} (their instructions are in the skill_load results).")
        return "\n\n".join(parts)
    for name in loaded:
        try:
            skill = repository.get(name)
        except SkillNotFoundError:
            parts.append(f"[Loaded] {name}\n\n{REMOVED}")
            continue
        except SkillError as exc:
            parts.append(f"[Loaded] {name}\n\n(this skill cannot be used: {exc})")
            continue
        parts.append(f"[Loaded] {name}\n\n{skill.body}")
        chosen = selected_docs(state, name)
        for doc in skill.docs:
            if chosen == ALL_DOCS or doc.name in chosen:
                parts.append(f"[Doc] {name}/{doc.name}\n\n{doc.content}")
    return "\n\n".join(parts)
