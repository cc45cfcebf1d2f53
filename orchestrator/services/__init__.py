"""What every front end does below its transport (the API's routes, the console, the MCP server): the app's
services, accepting and following a team's runs, reading their files, registering its libraries, removing its
workspaces."""

from orchestrator.services.container import TEAM_LIBRARIES_KEPT, AgentFactory, Services
from orchestrator.services.libraries import Registered, register_version
from orchestrator.services.runs import (
    BUILT_AHEAD,
    Followed,
    accept_run,
    follow_run,
    missing_run,
    open_artifact,
    output_file,
    team_run,
)
from orchestrator.services.workspaces import remove_workspace, team_workspace

__all__ = ["BUILT_AHEAD", "TEAM_LIBRARIES_KEPT", "AgentFactory", "Followed", "Registered", "Services", "accept_run",
           "follow_run", "missing_run", "open_artifact", "output_file", "register_version", "remove_workspace",
           "team_run", "team_workspace"]
