"""A team's kept workspaces for every front end: find one, remove one (now, or handed to a worker of its runtime)."""

from __future__ import annotations

from orchestrator.errors import UnavailableError, WorkspaceNotFoundError
from orchestrator.services.container import Services
from orchestrator.teams import Team
from worker.errors import WorkerError
from worker.run_store import WorkspaceEntry

RUNTIME_AWAY_RETRY_AFTER_SECONDS = 60


async def team_workspace(services: Services, workspace_id: str, team: Team) -> WorkspaceEntry:
    """The team's workspace ``workspace_id``; another team's is not found, as if it did not exist."""
    entry = await services.dispatcher.get_workspace(workspace_id)
    if entry is None or entry.owner != team.id:
        raise WorkspaceNotFoundError(f"no workspace {workspace_id!r}: ids are as GET /v1/workspaces lists them, "
                                     f"{team.id}.<the workspace_id runs were given>")
    return entry


async def remove_workspace(services: Services, entry: WorkspaceEntry) -> WorkspaceEntry | None:
    """Remove ``entry``'s workspace: ``None`` once it is gone, or its entry marked ``removing`` when a worker of its
    runtime removes it. ``WorkspaceConflictError`` while runs are in it; ``UnavailableError`` when its runtime
    cannot remove it now (it stays marked removing and is tried again later)."""
    try:
        removal = await services.dispatcher.remove_workspace(entry.id)
    except WorkerError as exc:  # a Cube service away
        raise UnavailableError(f"the {entry.runtime.value} runtime could not remove workspace {entry.id!r} now "
                               f"({exc}); it stays marked removing and is tried again later",
                               RUNTIME_AWAY_RETRY_AFTER_SECONDS) from exc
    return await services.dispatcher.get_workspace(entry.id) if removal == "removing" else None
