"""Teams and their API keys. Keys are shown once, stored as SHA-256 hashes, and can be revoked.

A key reads ``sr_<key id>_<secret>``: the id finds the stored hash, the secret is compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time

from pydantic import BaseModel

from orchestrator.documents import BaseDocuments
from orchestrator.errors import OrchestratorError
from worker.contract import TEAM_NAME

_KEY = re.compile(r"^sr_([0-9a-f]{12})_([A-Za-z0-9_-]{20,})$")


class TeamError(OrchestratorError):
    """A team or key operation that cannot be done (unknown team, bad name, unknown key)."""


class Team(BaseModel):
    id: str
    created_at: float


class ApiKey(BaseModel):
    id: str
    team_id: str
    secret_sha256: str
    created_at: float
    revoked_at: float | None = None


class TeamStore:
    def __init__(self, documents: BaseDocuments) -> None:
        self.docs = documents

    def create_team(self, name: str) -> Team:
        if not TEAM_NAME.fullmatch(name):
            raise TeamError(f"team name {name!r}: use 1-32 lowercase letters, digits and hyphens")
        if self.docs.get("teams", name) is not None:
            raise TeamError(f"team {name!r} already exists")
        team = Team(id=name, created_at=time.time())
        self.docs.put("teams", name, team.model_dump())
        return team

    def get_team(self, team_id: str) -> Team | None:
        doc = self.docs.get("teams", team_id) if TEAM_NAME.fullmatch(team_id) else None
        return Team(**doc) if doc else None

    def teams(self) -> list[Team]:
        return [Team(**d) for d in self.docs.all("teams")]

    def create_key(self, team_id: str) -> tuple[ApiKey, str]:
        """A new key for ``team_id``: the stored record and the key itself (shown this once)."""
        if self.get_team(team_id) is None:
            raise TeamError(f"no team {team_id!r}; create it with: skillrun teams create {team_id}")
        key_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        record = ApiKey(id=key_id, team_id=team_id, secret_sha256=_hash(secret), created_at=time.time())
        self.docs.put("keys", key_id, record.model_dump())
        return record, f"sr_{key_id}_{secret}"

    def keys(self, team_id: str) -> list[ApiKey]:
        return [ApiKey(**d) for d in self.docs.all("keys") if d["team_id"] == team_id]

    def revoke_key(self, key_id: str) -> ApiKey:
        doc = self.docs.get("keys", key_id) if re.fullmatch(r"[0-9a-f]{12}", key_id) else None
        if doc is None:
            raise TeamError(f"no key {key_id!r}")
        record = ApiKey(**doc)
        if record.revoked_at is None:
            record.revoked_at = time.time()
            self.docs.put("keys", key_id, record.model_dump())
        return record

    def authenticate(self, key: str) -> Team | None:
        """The team of a valid, unrevoked key, else ``None``."""
        found = self.authenticate_key(key)
        return found[0] if found else None

    def authenticate_key(self, key: str) -> tuple[Team, str] | None:
        """The team of a valid, unrevoked key and the key's id (what a console session keeps), else ``None``."""
        match = _KEY.match(key or "")
        if match is None:
            return None
        doc = self.docs.get("keys", match.group(1))
        if doc is None:
            return None
        record = ApiKey(**doc)
        if record.revoked_at is not None or not hmac.compare_digest(record.secret_sha256, _hash(match.group(2))):
            return None
        team = self.get_team(record.team_id)
        return (team, record.id) if team else None

    def team_of_key(self, key_id: str) -> Team | None:
        """The team of the unrevoked key ``key_id`` (a session signed in with it lasts only as long as the key)."""
        doc = self.docs.get("keys", key_id) if re.fullmatch(r"[0-9a-f]{12}", key_id) else None
        if doc is None or doc.get("revoked_at") is not None:
            return None
        return self.get_team(doc["team_id"])


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()
