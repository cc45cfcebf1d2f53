"""Console sign-ins: a random token in an HTTP-only cookie, the session it names kept on the server.

A session holds the team, the id of the API key it was opened with (the session ends when the key is revoked) and its
CSRF token; it expires ``ttl_seconds`` after sign-in, and signing out deletes it. The store keeps only the token's
SHA-256, so what it holds opens nothing. Each team keeps at most ``per_team`` sessions: a sign-in past that ends the
team's oldest. Without Redis (the embedded default: one API process) sessions live in memory and end with the
process; with Redis they are keys ``skillrun:console:session:<sha256>`` with their own expiry, and each team's index
``skillrun:console:team:<team>`` (a sorted set, expiring with its newest session).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from abc import ABC, abstractmethod
from collections import OrderedDict

import redis.asyncio as aioredis
from pydantic import BaseModel

DEFAULT_TTL_SECONDS = 8 * 3600
DEFAULT_PER_TEAM = 50


class ConsoleSession(BaseModel):
    team_id: str
    key_id: str
    csrf: str
    expires_at: float


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class BaseConsoleSessions(ABC):
    def __init__(self, ttl_seconds: int = DEFAULT_TTL_SECONDS, per_team: int = DEFAULT_PER_TEAM) -> None:
        self.ttl_seconds = ttl_seconds
        self.per_team = per_team

    async def open(self, team_id: str, key_id: str) -> tuple[str, ConsoleSession]:
        """A new session: the cookie's token (given once) and the session."""
        token = secrets.token_urlsafe(32)
        session = ConsoleSession(team_id=team_id, key_id=key_id, csrf=secrets.token_urlsafe(32),
                                 expires_at=time.time() + self.ttl_seconds)
        await self._put(_digest(token), session)
        return token, session

    async def get(self, token: str) -> ConsoleSession | None:
        """The unexpired session of ``token``, else ``None``."""
        if not token or len(token) > 128:
            return None
        session = await self._get(_digest(token))
        return session if session is not None and session.expires_at > time.time() else None

    async def close(self, token: str) -> None:
        """Forget the session of ``token`` (signing out)."""
        if token and len(token) <= 128:
            await self._delete(_digest(token))

    async def aclose(self) -> None:
        """Release connections."""

    @abstractmethod
    async def _put(self, digest: str, session: ConsoleSession) -> None: ...

    @abstractmethod
    async def _get(self, digest: str) -> ConsoleSession | None: ...

    @abstractmethod
    async def _delete(self, digest: str) -> None: ...


class MemoryConsoleSessions(BaseConsoleSessions):
    """Sessions of one API process (the embedded default)."""

    def __init__(self, ttl_seconds: int = DEFAULT_TTL_SECONDS, per_team: int = DEFAULT_PER_TEAM) -> None:
        super().__init__(ttl_seconds, per_team)
        self._sessions: OrderedDict[str, ConsoleSession] = OrderedDict()  # oldest first

    async def _put(self, digest: str, session: ConsoleSession) -> None:
        now = time.time()
        for old in [d for d, s in self._sessions.items() if s.expires_at <= now]:
            del self._sessions[old]
        team = [d for d, s in self._sessions.items() if s.team_id == session.team_id]
        for old in team[:max(0, len(team) - self.per_team + 1)]:
            del self._sessions[old]
        self._sessions[digest] = session

    async def _get(self, digest: str) -> ConsoleSession | None:
        return self._sessions.get(digest)

    async def _delete(self, digest: str) -> None:
        self._sessions.pop(digest, None)


class RedisConsoleSessions(BaseConsoleSessions):
    """Sessions every API process behind one Redis shares."""

    PREFIX = "skillrun:console"

    def __init__(self, url: str, ttl_seconds: int = DEFAULT_TTL_SECONDS, per_team: int = DEFAULT_PER_TEAM) -> None:
        super().__init__(ttl_seconds, per_team)
        self.redis = aioredis.Redis.from_url(url)

    def _key(self, digest: str) -> str:
        return f"{self.PREFIX}:session:{digest}"

    async def _put(self, digest: str, session: ConsoleSession) -> None:
        index = f"{self.PREFIX}:team:{session.team_id}"
        now = time.time()
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._key(digest), session.model_dump_json(), ex=self.ttl_seconds)
            pipe.zremrangebyscore(index, "-inf", now)
            pipe.zadd(index, {digest: session.expires_at})
            pipe.expire(index, self.ttl_seconds)
            pipe.zrange(index, 0, -(self.per_team + 1))
            *_, surplus = await pipe.execute()
        if surplus:
            await self.redis.delete(*[self._key(old.decode()) for old in surplus])
            await self.redis.zrem(index, *surplus)

    async def _get(self, digest: str) -> ConsoleSession | None:
        raw = await self.redis.get(self._key(digest))
        return ConsoleSession.model_validate_json(raw) if raw else None

    async def _delete(self, digest: str) -> None:
        raw = await self.redis.getdel(self._key(digest))
        if raw:
            await self.redis.zrem(f"{self.PREFIX}:team:{ConsoleSession.model_validate_json(raw).team_id}", digest)

    async def aclose(self) -> None:
        await self.redis.aclose()
