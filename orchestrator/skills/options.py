"""``SkillOptions``: how an agent injects skills — overview size, search paging, load mode, loaded cap, placement.

Given to ``LlmAgent(skill_options=...)``; the skill tools read them from the agent of the invocation, so the
system message and the tools always agree. ``SkillOptions.from_settings`` maps the ``SKILLRUN_SKILL_*`` settings.

Load modes (how long a ``skill_load`` lasts):

* ``once``    — the body (and the skill's tools and docs) reach the next model request only;
* ``turn``    — the rest of the invocation (one user message and its tool rounds); the default, as before;
* ``session`` — until cleared: kept in the session's state across messages.

``max_loaded_skills`` caps how many skills are loaded at once; loading one more unloads the least recently used
(loaded, or given docs). ``None`` means no cap; 0 is refused, since an agent that can load nothing cannot use a
skill.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from orchestrator.config import (
    DEFAULT_OVERVIEW_MAX_CHARS,
    DEFAULT_OVERVIEW_NAMES,
    DEFAULT_OVERVIEW_SKILLS,
    DEFAULT_SEARCH_PAGE_SIZE,
    Settings,
)


class SkillLoadMode(str, Enum):
    ONCE = "once"
    TURN = "turn"
    SESSION = "session"


@dataclass(frozen=True)
class SkillOptions:
    """See the module docstring."""

    load_mode: SkillLoadMode | str = SkillLoadMode.TURN
    max_loaded_skills: int | None = None
    content_in_tool_results: bool = False
    overview_max_chars: int = DEFAULT_OVERVIEW_MAX_CHARS
    overview_skills: int = DEFAULT_OVERVIEW_SKILLS
    overview_names: int = DEFAULT_OVERVIEW_NAMES
    search_page_size: int = DEFAULT_SEARCH_PAGE_SIZE

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "load_mode", SkillLoadMode(self.load_mode))
        except ValueError:
            known = ", ".join(m.value for m in SkillLoadMode)
            raise ValueError(f"unknown skill load mode {self.load_mode!r} (known: {known})") from None
        if self.max_loaded_skills is not None and self.max_loaded_skills < 1:
            raise ValueError(
                f"max_loaded_skills must be at least 1 (got {self.max_loaded_skills}); use None for no cap"
            )
        for name in ("overview_max_chars", "overview_skills", "overview_names"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.search_page_size < 1:
            raise ValueError("search_page_size must be at least 1")

    @classmethod
    def from_settings(cls, settings: Settings) -> SkillOptions:
        return cls(
            load_mode=settings.skill_load_mode,
            max_loaded_skills=settings.max_loaded_skills,
            content_in_tool_results=settings.skill_content_in_tool_results,
            overview_max_chars=settings.skill_overview_max_chars,
            overview_skills=settings.skill_overview_skills,
            overview_names=settings.skill_overview_names,
            search_page_size=settings.skill_search_page_size,
        )


DEFAULT_OPTIONS = SkillOptions()


def options_of(agent: Any) -> SkillOptions:
    """The skill options of ``agent`` (an ``LlmAgent``'s ``skill_options``), else the defaults."""
    options = getattr(agent, "skill_options", None)
    return options if isinstance(options, SkillOptions) else DEFAULT_OPTIONS
