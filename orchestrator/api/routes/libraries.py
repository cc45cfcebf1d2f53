"""A team's skill libraries: register by URL or upload, list, versions (pinned by sha256), set the current one, and
the dependency environments of a version's skills (registration starts building them). Refusals (a bad archive
422, the team's library limit 409, its quota of builds 429) are the API's answers to ``LibraryError`` and
``QuotaExceededError``."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi import Path as PathParam

from orchestrator.api.auth import current_team
from orchestrator.api.deps import get_services
from orchestrator.api.responses import error_responses
from orchestrator.builds import EnvironmentsReport
from orchestrator.libraries import LIBRARY_NAME, Library, Unpacked
from orchestrator.schemas import (
    CurrentVersion,
    LibraryCreate,
    LibraryEnvironmentsPublic,
    LibraryPublic,
    LibraryRegistered,
)
from orchestrator.services import Services, register_version
from orchestrator.teams import Team

router = APIRouter(prefix="/v1/libraries", tags=["libraries"], responses=error_responses(401, 422))

LibraryName = PathParam(pattern=LIBRARY_NAME.pattern, description="1-64 lowercase letters, digits, '-' and '_'.")


def _public(library: Library) -> LibraryPublic:
    return LibraryPublic(name=library.name, current=library.current, versions=[v.model_dump() for v in library.versions])


def _environments(library: Library, version: int, report: EnvironmentsReport) -> LibraryEnvironmentsPublic:
    return LibraryEnvironmentsPublic(library=library.name, version=version, skills=report.skills,
                                     problems=report.problems, done=all(s.state != "building" for s in report.skills))


async def _registered(services: Services, team: Team, unpacked: Unpacked) -> LibraryRegistered:
    done = await register_version(services, team, unpacked)
    return LibraryRegistered(**_public(done.library).model_dump(),
                             environments=_environments(done.library, done.version, done.environments))


@router.post("", response_model=LibraryRegistered, status_code=status.HTTP_201_CREATED,
             responses=error_responses(400, 409, 413, 429))
async def register_library(body: LibraryCreate, team: Team = Depends(current_team), services: Services = Depends(get_services)) -> LibraryRegistered:
    """Fetch the archive at ``url`` (safely, within limits) as the newest version of library ``name``; its skills'
    dependency environments start building (follow them at ``GET /v1/libraries/{name}/environments``). One that
    would start more builds than the team's quota allows (``max_builds``) is refused (429), nothing of it kept."""
    unpacked = await asyncio.to_thread(services.libraries.fetch, team.id, body.name, body.url)
    return await _registered(services, team, unpacked)


@router.post("/{name}/upload", response_model=LibraryRegistered, status_code=status.HTTP_201_CREATED,
             responses=error_responses(409, 413, 429), openapi_extra={"requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                                            "required": True}})
async def upload_library(
    request: Request, name: str = LibraryName,
    filename: str = Query(default="upload.tar.gz", max_length=255, description="Tells the format"),
    team: Team = Depends(current_team), services: Services = Depends(get_services),
) -> LibraryRegistered:
    """Upload an archive (``.tar.gz``, ``.tgz`` or ``.zip``; the body is the archive) as a new version of ``name``;
    its skills' dependency environments start building (429 past the team's quota of builds, as for a URL). The
    body's size is bounded by ``orchestrator.api.limits`` while it streams in."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "upload"
        with open(archive, "wb") as out:
            async for chunk in request.stream():
                out.write(chunk)
        unpacked = await asyncio.to_thread(services.libraries.unpack, team.id, name, archive, filename)
        return await _registered(services, team, unpacked)


@router.get("", response_model=list[LibraryPublic])
def list_libraries(team: Team = Depends(current_team), services: Services = Depends(get_services)) -> list[LibraryPublic]:
    """The team's libraries with their versions."""
    return [_public(lib) for lib in services.libraries.list(team.id)]


@router.get("/{name}", response_model=LibraryPublic, responses=error_responses(404))
def get_library(name: str = LibraryName, team: Team = Depends(current_team), services: Services = Depends(get_services)) -> LibraryPublic:
    library = services.libraries.get(team.id, name)
    if library is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no library {name!r}")
    return _public(library)


@router.get("/{name}/environments", response_model=LibraryEnvironmentsPublic, responses=error_responses(404))
def get_environments(
    name: str = LibraryName, version: int | None = Query(default=None, ge=1, description="Default: the current one."),
    team: Team = Depends(current_team), services: Services = Depends(get_services),
) -> LibraryEnvironmentsPublic:
    """The dependency environment of each skill of a version: ready, building (with its step), failed (with the
    resolver's or installer's message), not built, none or invalid; and the version's manifest problems."""
    library = services.libraries.get(team.id, name)
    if library is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no library {name!r}")
    found = library.version(version)
    if found is None:
        which = f"version {version}" if version else "current version"
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"library {name!r} has no {which} "
                                                       f"(versions: {[v.version for v in library.versions]})")
    return _environments(library, found.version, services.environments.report(services.libraries.root(found)))


@router.put("/{name}/current", response_model=LibraryPublic, responses=error_responses(400, 404, 413))
def set_current_version(
    body: CurrentVersion, name: str = LibraryName, team: Team = Depends(current_team),
    services: Services = Depends(get_services),
) -> LibraryPublic:
    """Choose the version the team's runs and agents see."""
    if services.libraries.get(team.id, name) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no library {name!r}")
    return _public(services.libraries.set_current(team.id, name, body.version))
