"""What a run of a team's skill may be given, one rule for every caller that starts one: the API's and the console's
run submissions (``orchestrator.services``) and ``skill_run`` of agents and MCP clients (``SkillToolSet``)."""

from __future__ import annotations

from orchestrator.errors import RunRefusedError
from orchestrator.skills.repository import BaseSkillRepository
from worker.egress import effective
from worker.errors import EgressError


def undeclared_secrets(repository: BaseSkillRepository, skill: str, names: list[str]) -> str | None:
    """Why a run of ``skill`` may not be given the secrets ``names`` (some it does not declare), or ``None``."""
    declared = repository.get(skill).secrets
    undeclared = [name for name in names if name not in declared]
    if not undeclared:
        return None
    return (f"skill {skill!r} does not declare the secret {', '.join(undeclared)} (it declares: "
            f"{', '.join(declared) or 'none'}; metadata.secrets in its SKILL.md)")


def run_egress(repository: BaseSkillRepository, skill: str, allowed: list[str]) -> list[str]:
    """The hosts a run of ``skill`` may reach: those it declares (``metadata.egress``) that its team's allow-list
    (``allowed``, from ``orchestrator.egress``) also allows; the caller cannot set them. The skill is not read when
    the team allows nothing (most teams). ``RunRefusedError`` when the team's list holds an entry the rules refuse
    now (one kept from before a rule was added): the run is refused saying which, and the list is left as it is."""
    if not allowed:
        return []
    declared = repository.get(skill).egress  # a skill's own bad entry is a problem of the library, reported there
    if not declared:
        return []
    try:
        return effective(declared, allowed)
    except EgressError as exc:
        raise RunRefusedError(
            f"the team's egress allow-list holds an entry that is refused now ({exc}); its operator sets the list "
            "again with: skillrun egress set TEAM ENTRY..."
        ) from None
