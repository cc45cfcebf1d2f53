"""``GET /v1/skills`` and ``GET /v1/skills/{name}``: the library's overview and one skill."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Path, status

from orchestrator.api.auth import current_team
from orchestrator.api.responses import error_responses
from orchestrator.api.schemas import SkillName, SkillPublic, SkillSummaryPublic
from orchestrator.api.services import Services, get_services
from orchestrator.errors import SkillNotFoundError, SkillValidationError
from orchestrator.teams import Team

router = APIRouter(prefix="/v1/skills", tags=["skills"], responses=error_responses(401))


@router.get("", response_model=list[SkillSummaryPublic])
def list_skills(team: Team = Depends(current_team), services: Services = Depends(get_services)) -> list[SkillSummaryPublic]:
    """Name and description of each skill the team sees (the overview tier)."""
    return [SkillSummaryPublic(name=s.name, description=s.description) for s in services.repository_for(team).summaries()]


@router.get("/{name}", response_model=SkillPublic, responses=error_responses(404, 422))
def get_skill(name: SkillName = Path(description="The skill's name."), team: Team = Depends(current_team), services: Services = Depends(get_services)) -> SkillPublic:
    """One skill: body, declared tools, doc names, and its dependency environment on each runtime the server
    prepares for (what it declares, whether it is built, what it holds; on docker also its Debian packages' image)."""
    repository = services.repository_for(team)
    try:
        skill = repository.get(name)
        ref = repository.skill_ref(name)
    except SkillNotFoundError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    except SkillValidationError as exc:
        raise HTTPException(422, str(exc)) from exc
    environments = services.environments.skill_statuses(ref)
    return SkillPublic(name=skill.name, description=skill.description, body=skill.body, tools=skill.tools,
                       docs=skill.doc_names, environment=environments[0], environments=environments)
