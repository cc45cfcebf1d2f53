"""Sessions in Redis, so several API processes share them.

Per session: ``<prefix>:<app>:<user>:<id>:meta`` (a hash: id, created and update times),
``...:state`` (a hash of JSON values, one field per key) and ``...:events`` (a list of JSON events).
An append is one ``MULTI`` transaction (state fields, the event, the update time), so concurrent appends from
different processes neither lose events nor state keys. ``temp:`` keys are never written.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from typing import Any

import redis.asyncio as aioredis

from orchestrator.errors import SessionError
from orchestrator.events import Event
from orchestrator.sessions.base import BaseSessionService
from orchestrator.sessions.session import Session, already_exists, apply_delta, kept_event, new_session

DEFAULT_PREFIX = "skillrun:session"


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


class RedisSessionService(BaseSessionService):
    """Sessions in the Redis at ``url`` (or the given client)."""

    def __init__(self, url: str | None = None, *, client: aioredis.Redis | None = None, prefix: str = DEFAULT_PREFIX) -> None:
        if client is None and url is None:
            raise ValueError("RedisSessionService needs a url or a client")
        self._client = client or aioredis.from_url(url, decode_responses=True)
        self.prefix = prefix

    def _key(self, app_name: str, user_id: str, session_id: str, part: str) -> str:
        return f"{self.prefix}:{_q(app_name)}:{_q(user_id)}:{_q(session_id)}:{part}"

    async def create_session(
        self, *, app_name: str, user_id: str, session_id: str | None = None, state: dict[str, Any] | None = None
    ) -> Session:
        session = new_session(app_name, user_id, session_id, state)
        meta = self._key(app_name, user_id, session.id, "meta")
        created = await self._client.hsetnx(meta, "id", session.id)
        if not created:
            raise already_exists(session)
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.hset(meta, mapping={"last_update_time": session.last_update_time})
            if session.state:
                pipe.hset(self._key(app_name, user_id, session.id, "state"),
                          mapping={k: json.dumps(v) for k, v in session.state.items()})
            await pipe.execute()
        return session

    async def get_session(self, *, app_name: str, user_id: str, session_id: str) -> Session | None:
        async with self._client.pipeline(transaction=True) as pipe:
            pipe.hgetall(self._key(app_name, user_id, session_id, "meta"))
            pipe.hgetall(self._key(app_name, user_id, session_id, "state"))
            pipe.lrange(self._key(app_name, user_id, session_id, "events"), 0, -1)
            meta, state, events = await pipe.execute()
        if not meta:
            return None
        return Session(
            id=session_id, app_name=app_name, user_id=user_id,
            state={k: json.loads(v) for k, v in state.items()},
            events=[Event.model_validate_json(e) for e in events],
            last_update_time=float(meta.get("last_update_time", 0)),
        )

    async def list_sessions(self, *, app_name: str, user_id: str) -> list[Session]:
        pattern = f"{self.prefix}:{_q(app_name)}:{_q(user_id)}:*:meta"
        sessions = []
        async for key in self._client.scan_iter(match=pattern, count=500):
            session_id = urllib.parse.unquote(key[: -len(":meta")].rsplit(":", 1)[1])
            found = await self.get_session(app_name=app_name, user_id=user_id, session_id=session_id)
            if found is not None:
                sessions.append(found)
        return sorted(sessions, key=lambda s: s.last_update_time)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        await self._client.delete(*(self._key(app_name, user_id, session_id, p) for p in ("meta", "state", "events")))

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        kept = kept_event(event)
        meta = self._key(session.app_name, session.user_id, session.id, "meta")
        if not await self._client.exists(meta):
            raise SessionError(f"session {session.id!r} does not exist")
        now = time.time()
        async with self._client.pipeline(transaction=True) as pipe:
            delta = kept.actions.state_delta
            removed = [k for k, v in delta.items() if v is None]
            kept_fields = {k: json.dumps(v) for k, v in delta.items() if v is not None}
            if kept_fields:
                pipe.hset(self._key(session.app_name, session.user_id, session.id, "state"), mapping=kept_fields)
            if removed:
                pipe.hdel(self._key(session.app_name, session.user_id, session.id, "state"), *removed)
            pipe.rpush(self._key(session.app_name, session.user_id, session.id, "events"), kept.model_dump_json())
            pipe.hset(meta, "last_update_time", now)
            await pipe.execute()
        apply_delta(session.state, kept.actions.state_delta)
        session.events.append(kept)
        session.last_update_time = now
        return event

    async def close(self) -> None:
        await self._client.aclose()
