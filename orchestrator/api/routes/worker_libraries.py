"""What workers on other hosts fetch from the API: a library version's archive by its sha256 (``worker.roots.library_fetch``),
with the workers' token (``orchestrator.api.auth.current_worker``), streamed from the kept file."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, status
from fastapi import Path as PathParam
from fastapi.responses import FileResponse

from orchestrator.api.auth import current_worker
from orchestrator.api.deps import get_services
from orchestrator.api.responses import error_responses
from orchestrator.services import Services

router = APIRouter(prefix="/v1/worker/libraries", tags=["workers"], dependencies=[Depends(current_worker)],
                   responses=error_responses(401, 403, 404, 422))

Digest = PathParam(pattern=r"^[0-9a-f]{64}$", description="The sha256 of the version's archive (64 lowercase hex digits).")


@router.get("/{sha256}", response_class=FileResponse,
            responses={200: {"content": {"application/octet-stream": {}}, "description": "The archive's bytes."}})
def library_archive(sha256: str = Digest, services: Services = Depends(get_services)) -> FileResponse:
    """The archive of the library version whose archive has digest ``sha256`` (any team's: workers serve every
    team)."""
    path = services.libraries.archive(sha256)
    if path is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no kept archive of a library version with sha256 {sha256} "
                                                       "(a version registered before archives were kept: register it "
                                                       "again)")
    return FileResponse(path, media_type="application/octet-stream", headers={"ETag": f'"{sha256}"'})
