"""``GET /v1/skills`` and ``GET /v1/skills/{name}``: the library's overview and one skill.

The listing is paged (``limit``, ``offset``; the number of skills listed or matched in ``X-Total-Count``) and
searchable (``q``: the skills matching it, best first, ranked by the same index as the agent's overview). The body
stays a JSON array, so clients of the unpaged listing keep working while a library fits in a page.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response, status

from orchestrator.api.auth import current_team
from orchestrator.api.deps import get_services
from orchestrator.api.responses import error_responses
from orchestrator.errors import SkillNotFoundError, SkillValidationError
from orchestrator.schemas import (
    MAX_QUERY_CHARS,
    SkillName,
    SkillPublic,
    SkillSummaryPublic,
    SkillWarningPublic,
)
from orchestrator.services import Services
from orchestrator.teams import Team

router = APIRouter(prefix="/v1/skills", tags=["skills"], responses=error_responses(401))

DEFAULT_PAGE_SIZE = 100  # skills per page of the listing
MAX_PAGE_SIZE = 1000
TOTAL_HEADER = "X-Total-Count"
_TOTAL = {"description": "How many skills the listing has (or match q), over all pages.", "schema": {"type": "integer"}}


@router.get(
    "", response_model=list[SkillSummaryPublic],
    responses={**error_responses(422), 200: {"description": "One page of skills.", "headers": {TOTAL_HEADER: _TOTAL}}},
)
def list_skills(
    response: Response,
    q: str | None = Query(default=None, min_length=1, max_length=MAX_QUERY_CHARS,
                          description="Only the skills matching these words, best match first."),
    limit: int = Query(default=DEFAULT_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE, description="Skills per page."),
    offset: int = Query(default=0, ge=0, description="Skills to skip (by name, or by rank with q)."),
    team: Team = Depends(current_team),
    services: Services = Depends(get_services),
) -> list[SkillSummaryPublic]:
    """Name and description of the skills the team sees (the overview tier), a page at a time."""
    index = services.repository_for(team).index()
    if q is None:
        total, page = len(index), index.summaries[offset:offset + limit]
    else:
        total, page = index.count(q), [hit.summary for hit in index.search(q, limit, offset)]
    response.headers[TOTAL_HEADER] = str(total)
    return [SkillSummaryPublic(name=s.name, description=s.description) for s in page]


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
                       docs=skill.doc_names, environment=environments[0], environments=environments,
                       warnings=[SkillWarningPublic(field=at, message=text) for at, text in skill.summary.warnings])
