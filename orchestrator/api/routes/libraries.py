"""A team's skill libraries: register by URL or upload, list, versions (pinned by sha256), set the current one."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status

from orchestrator.api.auth import current_team
from orchestrator.api.schemas import CurrentVersion, LibraryCreate, LibraryPublic
from orchestrator.api.services import Services, get_services
from orchestrator.libraries import LibraryError
from orchestrator.teams import Team

router = APIRouter(prefix="/v1/libraries", tags=["libraries"])

MAX_UPLOAD_BYTES = 256 * 1024 * 1024


def _public(library) -> LibraryPublic:  # noqa: ANN001 - a Library
    return LibraryPublic(name=library.name, current=library.current, versions=[v.model_dump() for v in library.versions])


@router.post("", response_model=LibraryPublic, status_code=status.HTTP_201_CREATED)
async def register_library(body: LibraryCreate, team: Team = Depends(current_team), services: Services = Depends(get_services)) -> LibraryPublic:
    """Fetch the archive at ``url`` (safely, within limits) as the newest version of library ``name``."""
    try:
        library = await asyncio.to_thread(services.libraries.add_from_url, team.id, body.name, body.url)
    except LibraryError as exc:
        raise HTTPException(422, str(exc)) from exc
    return _public(library)


@router.post("/{name}/upload", response_model=LibraryPublic, status_code=status.HTTP_201_CREATED,
             openapi_extra={"requestBody": {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                                            "required": True}})
async def upload_library(
    name: str, request: Request, filename: str = Query(default="upload.tar.gz", description="Tells the format"),
    team: Team = Depends(current_team), services: Services = Depends(get_services),
) -> LibraryPublic:
    """Upload an archive (``.tar.gz``, ``.tgz`` or ``.zip``; the body is the archive) as a new version of ``name``."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "upload"
        size = 0
        with open(archive, "wb") as out:
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_UPLOAD_BYTES:
                    raise HTTPException(413, f"an upload may be at most {MAX_UPLOAD_BYTES} bytes")
                out.write(chunk)
        try:
            library = await asyncio.to_thread(services.libraries.add_from_file, team.id, name, archive, filename)
        except LibraryError as exc:
            raise HTTPException(422, str(exc)) from exc
    return _public(library)


@router.get("", response_model=list[LibraryPublic])
def list_libraries(team: Team = Depends(current_team), services: Services = Depends(get_services)) -> list[LibraryPublic]:
    """The team's libraries with their versions."""
    return [_public(lib) for lib in services.libraries.list(team.id)]


@router.get("/{name}", response_model=LibraryPublic)
def get_library(name: str, team: Team = Depends(current_team), services: Services = Depends(get_services)) -> LibraryPublic:
    try:
        library = services.libraries.get(team.id, name)
    except LibraryError as exc:
        raise HTTPException(422, str(exc)) from exc
    if library is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no library {name!r}")
    return _public(library)


@router.put("/{name}/current", response_model=LibraryPublic)
def set_current_version(
    name: str, body: CurrentVersion, team: Team = Depends(current_team), services: Services = Depends(get_services)
) -> LibraryPublic:
    """Choose the version the team's runs and agents see."""
    try:
        if services.libraries.get(team.id, name) is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no library {name!r}")
        return _public(services.libraries.set_current(team.id, name, body.version))
    except LibraryError as exc:
        raise HTTPException(422, str(exc)) from exc
