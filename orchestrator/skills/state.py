"""The skill state keys: which skills are loaded, their selected docs and tools, and how recently each was used.

The guide's keys live for one invocation (``temp:``); the ``session`` load mode keeps the same keys without the
``temp:`` prefix, so they persist in the session until cleared. Readers look at both.

* ``temp:skill:loaded:<name>`` / ``skill:loaded:<name>`` — ``"1"`` when the skill is loaded
* ``temp:skill:docs:<name>``   / ``skill:docs:<name>``   — ``"*"`` for every doc, or a JSON list of doc names
* ``temp:skill:tools:<name>``  / ``skill:tools:<name>``  — a JSON list of the selected tool names
* ``temp:skill:recent``        / ``skill:recent``        — a JSON list of loaded skills, least recently used first

All writes go through a tool call's ``state_delta``; a key set to ``None`` is removed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, MutableMapping
from typing import Any

from orchestrator.skills.options import SkillLoadMode

TEMP = "temp:"
LOADED_PREFIX = "temp:skill:loaded:"
DOCS_PREFIX = "temp:skill:docs:"
TOOLS_PREFIX = "temp:skill:tools:"
RECENT_KEY = "temp:skill:recent"
ALL_DOCS = "*"
_KINDS = ("loaded", "docs", "tools")


def key(kind: str, name: str, mode: SkillLoadMode) -> str:
    """The state key of ``kind`` (``loaded``, ``docs``, ``tools``) for a skill loaded in ``mode``."""
    scope = "" if mode is SkillLoadMode.SESSION else TEMP
    return f"{scope}skill:{kind}:{name}"


def recent_key(mode: SkillLoadMode) -> str:
    return RECENT_KEY.removeprefix(TEMP) if mode is SkillLoadMode.SESSION else RECENT_KEY


def loaded_skills(state: Mapping[str, Any]) -> list[str]:
    """The loaded skills (in either scope), sorted by name."""
    found = set()
    for state_key, value in state.items():
        if value and state_key.startswith((LOADED_PREFIX, "skill:loaded:")):
            found.add(state_key.rsplit(":", 1)[1])
    return sorted(found)


def _value(state: Mapping[str, Any], kind: str, name: str) -> Any:
    value = state.get(f"{TEMP}skill:{kind}:{name}")
    return state.get(f"skill:{kind}:{name}") if value is None else value


def selected_docs(state: Mapping[str, Any], name: str) -> str | list[str]:
    """``"*"`` or the selected doc names of a skill."""
    value = _value(state, "docs", name)
    if value == ALL_DOCS:
        return ALL_DOCS
    return _json_list(value)


def selected_tools(state: Mapping[str, Any], name: str) -> list[str] | None:
    """The selected tool names of a skill, or ``None`` when nothing was selected yet."""
    value = _value(state, "tools", name)
    return None if value is None else _json_list(value)


def recent(state: Mapping[str, Any], mode: SkillLoadMode) -> list[str]:
    """The loaded skills of ``mode``'s scope, least recently used first."""
    listed = [n for n in _json_list(state.get(recent_key(mode))) if state.get(key("loaded", n, mode))]
    others = [n for n in loaded_skills(state) if n not in listed and state.get(key("loaded", n, mode))]
    return others + listed


def touch(state: Mapping[str, Any], delta: MutableMapping[str, Any], name: str, mode: SkillLoadMode,
          cap: int | None) -> list[str]:
    """Record ``name`` as the most recently used loaded skill; unload the least recently used ones past ``cap``.
    Returns the unloaded names."""
    order = [n for n in recent(state, mode) if n != name] + [name]
    evicted = order[: len(order) - cap] if cap is not None and len(order) > cap else []
    for other in evicted:
        unload(delta, other, mode)
    delta[recent_key(mode)] = json.dumps(order[len(evicted):])
    return evicted


def unload(delta: MutableMapping[str, Any], name: str, mode: SkillLoadMode) -> None:
    """Remove a skill's loaded, docs and tools keys of ``mode``'s scope."""
    for kind in _KINDS:
        delta[key(kind, name, mode)] = None


def consume_once(temp_state: MutableMapping[str, Any]) -> None:
    """``once`` mode: after a request carried them, the loaded skills of this invocation are unloaded."""
    for state_key in [k for k in temp_state if k.startswith(f"{TEMP}skill:")]:
        del temp_state[state_key]


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
