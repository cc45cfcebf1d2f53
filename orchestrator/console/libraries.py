"""The console's libraries: each library's versions (digest, size, skills, date), making one current, uploading an
archive and registering a URL — the service layer's registration, as the API's, with its refusals shown on the
page."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response
from starlette.datastructures import UploadFile

from orchestrator.api.deps import get_services
from orchestrator.api.responses import refusal
from orchestrator.console.auth import PREFIX, checked, signed_in
from orchestrator.console.render import page
from orchestrator.libraries import LibraryError, Unpacked
from orchestrator.quotas import QuotaExceededError
from orchestrator.schemas import MAX_URL_CHARS
from orchestrator.services import Services, register_version
from orchestrator.teams import Team

router = APIRouter(prefix=f"{PREFIX}/libraries", include_in_schema=False)

MAX_NAME_CHARS = 64


async def _libraries_page(request: Request, services: Services, team: Team, *, error: str | None = None,
                          notice: str | None = None, status_code: int = 200) -> HTMLResponse:
    libraries = await asyncio.to_thread(services.libraries.list, team.id)
    return page(request, "libraries.html", status_code, libraries=libraries, error=error, notice=notice)


@router.get("", response_class=HTMLResponse)
async def libraries_page(request: Request, team: Team = Depends(signed_in),
                         services: Services = Depends(get_services)) -> HTMLResponse:
    return await _libraries_page(request, services, team)


def _field(form: dict, name: str, limit: int) -> str:
    value = form.get(name)
    if not isinstance(value, str) or not value.strip():
        raise LibraryError(f"{name}: required")
    if len(value) > limit:
        raise LibraryError(f"{name}: at most {limit} characters")
    return value.strip()


async def _done(request: Request, services: Services, team: Team, unpacked: Unpacked, how: str) -> HTMLResponse:
    version = (await register_version(services, team, unpacked)).version
    return await _libraries_page(request, services, team,
                                 notice=f"library {unpacked.name!r}: version {version} {how}, now current")


async def _refusal(request: Request, services: Services, team: Team,
                   exc: LibraryError | QuotaExceededError) -> HTMLResponse:
    """The libraries page with the API's refusal (its status: 429 past the team's quota of builds, 409 at its
    library limit, else 422)."""
    refused = refusal(exc)
    answer = await _libraries_page(request, services, team, error=str(exc), status_code=refused.status_code)
    answer.headers.update(refused.headers or {})
    return answer


def _save(upload: UploadFile, folder: str) -> Path:
    path = Path(folder) / "archive"
    with open(path, "wb") as out:
        shutil.copyfileobj(upload.file, out, 1024 * 1024)
    return path


@router.post("/upload", response_class=HTMLResponse)
async def upload(request: Request, team: Team = Depends(checked),
                 services: Services = Depends(get_services)) -> Response:
    """A new version from an uploaded archive (.tar.gz, .tgz, .zip); its body bound is the API upload's."""
    form = await request.form()
    archive = form.get("archive")
    try:
        name = _field(form, "name", MAX_NAME_CHARS)
        if not isinstance(archive, UploadFile) or not archive.filename:
            raise LibraryError("archive: choose a .tar.gz, .tgz or .zip file")
        with tempfile.TemporaryDirectory() as tmp:
            path = await asyncio.to_thread(_save, archive, tmp)
            unpacked = await asyncio.to_thread(services.libraries.unpack, team.id, name, path,
                                               Path(archive.filename).name[:255])
        return await _done(request, services, team, unpacked, "uploaded")
    except (LibraryError, QuotaExceededError) as exc:
        return await _refusal(request, services, team, exc)


@router.post("/register", response_class=HTMLResponse)
async def register(request: Request, team: Team = Depends(checked),
                   services: Services = Depends(get_services)) -> Response:
    """A new version fetched from a URL, with the API's fetch limits and address checks."""
    form = await request.form()
    try:
        name, url = _field(form, "name", MAX_NAME_CHARS), _field(form, "url", MAX_URL_CHARS)
        unpacked = await asyncio.to_thread(services.libraries.fetch, team.id, name, url)
        return await _done(request, services, team, unpacked, "fetched")
    except (LibraryError, QuotaExceededError) as exc:
        return await _refusal(request, services, team, exc)


@router.post("/{name}/current", response_class=HTMLResponse)
async def make_current(request: Request, name: str, team: Team = Depends(checked),
                       services: Services = Depends(get_services)) -> Response:
    form = await request.form()
    try:
        version = int(_field(form, "version", 12))
        if await asyncio.to_thread(services.libraries.get, team.id, name) is None:
            return await _libraries_page(request, services, team, error=f"no library {name!r}", status_code=404)
        await asyncio.to_thread(services.libraries.set_current, team.id, name, version)
    except ValueError:
        return await _libraries_page(request, services, team, error="version: a whole number", status_code=422)
    except LibraryError as exc:
        return await _libraries_page(request, services, team, error=str(exc), status_code=422)
    return await _libraries_page(request, services, team, notice=f"library {name!r}: version {version} is current")
