"""Registering a team's library version for every front end (the API, the console): its skills' dependency
environments set building as the team's builds, then the version made current."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from orchestrator.builds import EnvironmentsReport
from orchestrator.libraries import Library, Unpacked
from orchestrator.quotas import QuotaExceededError
from orchestrator.services.container import Services
from orchestrator.teams import Team


@dataclass(frozen=True)
class Registered:
    """A registered version: its library (with it current) and its skills' environments as they started."""

    library: Library
    version: int
    environments: EnvironmentsReport


async def register_version(services: Services, team: Team, unpacked: Unpacked) -> Registered:
    """``unpacked`` registered as its library's current version once its skills' environments are set building (in
    the background) as builds of ``team``; past the team's quota of builds (``QuotaExceededError``) nothing is
    registered, started or kept."""
    try:
        report = await services.environments.prepare(services.libraries.root(unpacked), team.id)
    except QuotaExceededError:
        await asyncio.to_thread(services.libraries.discard, unpacked)
        raise
    library = await asyncio.to_thread(services.libraries.register, unpacked)
    return Registered(library, library.version().version, report)
