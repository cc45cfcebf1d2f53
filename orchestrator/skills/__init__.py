"""Agent Skills on the control plane: parsing, repositories, search, three-tier injection, the skill tool sets, and
what a run of a skill may be given (``admission``).

Exports are imported on first use (``worker.lazy``): listing a library does not load the tool sets, and with them
the sessions, the dispatcher and the runtimes.
"""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "orchestrator.skills.admission": ["run_egress", "undeclared_secrets"],
    "orchestrator.skills.filtered": ["FilteredSkillRepository"],
    "orchestrator.skills.options": ["SkillLoadMode", "SkillOptions"],
    "orchestrator.skills.overview": ["Overview", "build_overview"],
    "orchestrator.skills.repository": ["BaseSkillRepository", "CachedSkillRepository", "FsSkillRepository",
                                       "SkillProblem", "create_default_skill_repository"],
    "orchestrator.skills.search": ["SkillHit", "SkillIndex"],
    "orchestrator.skills.skill": ["Skill", "SkillDoc", "SkillSummary", "load_skill", "parse_tools"],
    "orchestrator.skills.tools": ["DynamicSkillToolSet", "SkillToolSet"],
})
