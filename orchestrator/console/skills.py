"""The console's skills: the overview (searchable), a skill's page with its body, docs, tools, environments and
problems, and the form that runs it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from orchestrator.api.deps import get_services
from orchestrator.api.responses import REFUSALS, refusal
from orchestrator.console.auth import PREFIX, ConsoleError, checked, signed_in
from orchestrator.console.render import page
from orchestrator.errors import SkillNotFoundError, SkillValidationError
from orchestrator.schemas import MAX_QUERY_CHARS, RunCreate
from orchestrator.services import Services, accept_run
from orchestrator.skills import Skill
from orchestrator.teams import Team
from worker.contract import RuntimeName

router = APIRouter(prefix=f"{PREFIX}/skills", include_in_schema=False)

PAGE_SIZE = 200


@router.get("", response_class=HTMLResponse)
async def skills_page(
    request: Request, q: str = Query(default="", max_length=MAX_QUERY_CHARS), team: Team = Depends(signed_in),
    services: Services = Depends(get_services),
) -> HTMLResponse:
    index = await asyncio.to_thread(lambda: services.repository_for(team).index())
    query = q.strip()
    if query:
        total, found = index.count(query), [hit.summary for hit in index.search(query, PAGE_SIZE, 0)]
    else:
        total, found = len(index), index.summaries[:PAGE_SIZE]
    return page(request, "skills.html", skills=found, total=total, q=query)


def _skill(services: Services, team: Team, name: str) -> tuple[Skill, list, list[str]]:
    """The skill, its environments (one per runtime the server prepares for) and its problems."""
    repository = services.repository_for(team)
    try:
        skill = repository.get(name)
        ref = repository.skill_ref(name)
    except SkillNotFoundError as exc:
        raise ConsoleError(404, str(exc)) from exc
    except SkillValidationError as exc:
        raise ConsoleError(422, str(exc)) from exc
    problems = [f"{p.kind}: {p}" for p in repository.problems()
                if Path(p.path).parent == skill.path or str(skill.path) in p.message]
    return skill, services.environments.skill_statuses(ref), problems


async def _skill_page(request: Request, services: Services, team: Team, name: str, *,
                      form: dict[str, str] | None = None, error: str | None = None,
                      status_code: int = 200) -> HTMLResponse:
    skill, environments, problems = await asyncio.to_thread(_skill, services, team, name)
    return page(request, "skill.html", status_code, skill=skill, environments=environments, problems=problems,
                runtimes=[r.value for r in RuntimeName], form=form or {}, error=error)


@router.get("/{name}", response_class=HTMLResponse)
async def skill_page(request: Request, name: str, team: Team = Depends(signed_in),
                     services: Services = Depends(get_services)) -> HTMLResponse:
    return await _skill_page(request, services, team, name)


@router.get("/{name}/docs/{doc:path}", response_class=HTMLResponse)
async def doc_page(request: Request, name: str, doc: str, team: Team = Depends(signed_in),
                   services: Services = Depends(get_services)) -> HTMLResponse:
    skill, _, _ = await asyncio.to_thread(_skill, services, team, name)
    found = skill.doc(doc)
    if found is None:
        raise ConsoleError(404, f"skill {name!r} has no doc {doc!r} (docs: {', '.join(skill.doc_names) or 'none'})")
    return page(request, "doc.html", skill=skill, doc=found)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def run_create(name: str, form: dict[str, str]) -> RunCreate:
    """The run the form asks for; ``ValueError`` saying which field is wrong."""
    env: dict[str, str] = {}
    for line in _lines(form.get("env", "")):
        variable, sep, value = line.partition("=")
        if not sep or not variable.strip():
            raise ValueError(f"env: {line!r} is not NAME=value")
        env[variable.strip()] = value
    fields: dict[str, object] = {"skill": name, "command": form.get("command", "").strip(), "env": env,
                                 "output_files": _lines(form.get("output_files", "")),
                                 "runtime": form.get("runtime") or RuntimeName.LOCAL.value}
    if form.get("timeout", "").strip():
        fields["timeout"] = form["timeout"].strip()
    try:
        return RunCreate.model_validate(fields)
    except ValidationError as exc:
        raise ValueError("; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'run'}: {e['msg']}"
                                   for e in exc.errors(include_input=False))) from exc


@router.post("/{name}/run", response_class=RedirectResponse)
async def run_skill(request: Request, name: str, team: Team = Depends(checked),
                    services: Services = Depends(get_services)) -> Response:
    """Submit the run form; the run's page opens at once (303), or the skill's page again with what was wrong."""
    submitted = await request.form()
    form = {k: v for k, v in submitted.items() if isinstance(v, str) and k != "csrf"}
    try:
        record = await accept_run(services, team, run_create(name, form))
    except tuple(REFUSALS) as exc:
        answer = refusal(exc)
        page_again = await _skill_page(request, services, team, name, form=form, error=str(exc),
                                       status_code=answer.status_code)
        page_again.headers.update(answer.headers or {})
        return page_again
    except ValueError as exc:
        return await _skill_page(request, services, team, name, form=form, error=str(exc), status_code=422)
    return RedirectResponse(f"{PREFIX}/runs/{record.id}", status_code=303)
