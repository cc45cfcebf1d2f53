"""Sessions kept as JSON files, so a conversation survives the process (the embedded default of the CLI).

``<root>/<app>/<user>/<session>.json``; writes go to a temporary file that replaces the old one, under an
exclusive ``flock`` per session, so two processes appending to one session do not lose each other's events.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import time
import urllib.parse
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.errors import SessionError
from orchestrator.events import Event
from orchestrator.sessions.base import BaseSessionService
from orchestrator.sessions.session import Session, already_exists, apply_delta, kept_event, new_session

_SAFE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def _part(value: str) -> str:
    """A path component for an id: kept when plain, percent-encoded otherwise (never '.', '..' or a '/')."""
    if _SAFE.match(value) and value not in {".", ".."}:
        return value
    return urllib.parse.quote(value, safe="")[:200] or "_"


class FileSessionService(BaseSessionService):
    """Sessions as JSON files under ``root``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _path(self, app_name: str, user_id: str, session_id: str) -> Path:
        return self.root / _part(app_name) / _part(user_id) / f"{_part(session_id)}.json"

    @contextmanager
    def _locked(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    @staticmethod
    def _read(path: Path) -> Session | None:
        try:
            return Session.model_validate_json(path.read_text())
        except FileNotFoundError:
            return None

    @staticmethod
    def _write(path: Path, session: Session) -> None:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(session.model_dump_json())
        os.replace(tmp, path)

    async def create_session(
        self, *, app_name: str, user_id: str, session_id: str | None = None, state: dict[str, Any] | None = None
    ) -> Session:
        session = new_session(app_name, user_id, session_id, state)
        path = self._path(app_name, user_id, session.id)

        def create() -> Session:
            with self._locked(path):
                if path.exists():
                    raise already_exists(session)
                self._write(path, session)
            return session

        return await asyncio.to_thread(create)

    async def get_session(self, *, app_name: str, user_id: str, session_id: str) -> Session | None:
        return await asyncio.to_thread(self._read, self._path(app_name, user_id, session_id))

    async def list_sessions(self, *, app_name: str, user_id: str) -> list[Session]:
        folder = self.root / _part(app_name) / _part(user_id)

        def scan() -> list[Session]:
            found = [self._read(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
            return [s for s in found if s is not None]

        return await asyncio.to_thread(scan)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        path = self._path(app_name, user_id, session_id)

        def delete() -> None:
            with self._locked(path):
                path.unlink(missing_ok=True)
            path.with_suffix(".lock").unlink(missing_ok=True)

        await asyncio.to_thread(delete)

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        kept = kept_event(event)
        path = self._path(session.app_name, session.user_id, session.id)

        def append() -> None:
            with self._locked(path):
                stored = self._read(path)
                if stored is None:
                    raise SessionError(f"session {session.id!r} does not exist")
                apply_delta(stored.state, kept.actions.state_delta)
                stored.events.append(kept)
                stored.last_update_time = time.time()
                self._write(path, stored)

        await asyncio.to_thread(append)
        apply_delta(session.state, kept.actions.state_delta)
        session.events.append(kept)
        session.last_update_time = time.time()
        return event
