"""Teams' egress allow-lists: the hosts a team's runs may reach, set by the operator, kept in the control plane's
documents (kind ``egress``, one document per team).

A run gets the entries both its skill declares (``metadata.egress``) and its team's list allows
(``worker.egress.policy.effective``); a skill that declares none, or a team with no list, gets no network. Entries
are checked when set (``worker.names.parse_entry``: no addresses or ranges, no wildcard for everything or
a whole top-level domain, no private names, ports 1-65535); a list with a bad entry is refused whole and nothing is
stored.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, Field

from orchestrator.documents import BaseDocuments
from orchestrator.errors import OrchestratorError
from worker.contract import TEAM_NAME
from worker.names import parse_entries
from worker.errors import EgressError

KIND = "egress"


class EgressListError(OrchestratorError):
    """An allow-list that cannot be set: a bad entry (the worker's check says which), or a bad team name."""


class EgressList(BaseModel):
    """A team's egress allow-list, as shown: its entries (``host:port`` or ``*.domain:port``) and when it was set."""

    team: str
    entries: list[str] = Field(default_factory=list)
    updated_at: float | None = None


class EgressStore:
    """The teams' allow-lists, on the control plane's documents."""

    def __init__(self, documents: BaseDocuments) -> None:
        self.docs = documents

    def get(self, team: str) -> EgressList:
        """The team's list (empty when none was set)."""
        doc = self.docs.get(KIND, _team(team))
        return EgressList(**doc) if doc else EgressList(team=team)

    def set(self, team: str, entries: list[str]) -> EgressList:
        """Replace the team's list with ``entries`` (normalised: lowercase, ``:443`` added, sorted, once each)."""
        team = _team(team)
        if not entries:
            raise EgressListError("name at least one entry (to allow nothing, clear the list)")
        try:
            checked = [str(entry) for entry in parse_entries(entries, f"team {team}'s egress allow-list")]
        except EgressError as exc:
            raise EgressListError(f"{exc}; nothing was changed") from None
        listed = EgressList(team=team, entries=checked, updated_at=time.time())
        self.docs.put(KIND, team, listed.model_dump())
        return listed

    def clear(self, team: str) -> EgressList:
        """Allow the team's runs nothing again."""
        listed = EgressList(team=_team(team), entries=[], updated_at=time.time())
        self.docs.put(KIND, team, listed.model_dump())
        return listed


def _team(team: str) -> str:
    if not TEAM_NAME.fullmatch(team or ""):
        raise EgressListError(f"team name {team!r}: use 1-32 lowercase letters, digits and hyphens")
    return team


__all__ = ["EgressList", "EgressListError", "EgressStore"]
