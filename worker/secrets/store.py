"""Team secrets: values a skill's commands get in their environment, stored encrypted, never shown back.

* ``SecretBox`` encrypts with Fernet (``cryptography``) under the operator's key, ``SKILLRUN_SECRETS_KEY`` (a
  Fernet key; several, comma-separated, to rotate: the first encrypts, any decrypts). The team and the name are
  sealed in with the value, so a ciphertext copied to another team's or name's entry does not decrypt there.
* ``SecretStore`` keeps them per team in the record store (``worker.run_store``'s documents, a kind per team): in
  Redis (``skillrun:secrets:<team>``, a hash of name → sealed entry) with a queue, else in files
  (``<dir>/<team>/<name>.json``, mode 0600; a team's file of the earlier layout, ``<dir>/<team>.json``, is moved
  there when the team is next read). Values are written, listed by name and date, removed, and read back
  (``reveal``) only by whoever runs a team's run: a worker, or the process running it inline.

A name is a shell variable name that the workspace and the loader do not claim (``worker.names``);
a value is 8 bytes to ``MAX_VALUE_BYTES`` (shorter ones would be redacted wherever their characters occur).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ContextManager

import redis
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from pydantic import BaseModel

from worker.contract import TEAM_NAME, RunRequest
from worker.names import env_name_problem
from worker.errors import DocumentError, SecretError
from worker.run_store.documents import BaseDocuments, FileDocuments, RedisDocuments, is_name
from worker.secrets import Redactor, forms_of
from worker.secrets.matching import SELF_OVERLAP_CHARS, repeats_near_its_start

MAX_VALUE_BYTES = 64 * 1024
MIN_VALUE_BYTES = 8
MAX_SECRETS_PER_TEAM = 100
MAX_TEAM_SECRET_BYTES = 1024 * 1024
"""All of a team's values together: what every run of the team is redacted of, so what building its redactor costs
(``worker.secrets``)."""
REDIS_PREFIX = "skillrun:secrets"
"""Each team's secrets are the hash ``skillrun:secrets:<team>``."""


class SecretInfo(BaseModel):
    """What is shown of a secret: its name and dates, never its value."""

    name: str
    created_at: float
    updated_at: float


def check_name(name: str) -> None:
    problem = env_name_problem(name)
    if problem is not None:
        raise SecretError(f"secret name: {problem}")


def check_value(name: str, value: str) -> None:
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise SecretError(f"the value of {name} is not valid Unicode text (it holds a lone surrogate)") from None
    if size < MIN_VALUE_BYTES:
        raise SecretError(f"the value of {name} is {size} bytes; a secret is at least {MIN_VALUE_BYTES} (shorter ones "
                          f"would be redacted wherever their characters occur)")
    if size > MAX_VALUE_BYTES:
        raise SecretError(f"the value of {name} is {size} bytes; a secret is at most {MAX_VALUE_BYTES}")
    if "\0" in value:
        raise SecretError(f"the value of {name} holds a NUL character, which an environment variable cannot")
    if any(repeats_near_its_start(form) for form in forms_of(value)):
        raise SecretError(f"the value of {name} starts with a short piece repeated (its first "
                          f"{SELF_OVERLAP_CHARS} characters, or those of an encoding of it, come again right after): "
                          "a secret is a random value, and looking for one like this in every run's output would cost "
                          "each run many times its size")


class SecretBox:
    """Seals and opens secret values under the operator's key(s)."""

    def __init__(self, keys: str) -> None:
        parts = [part.strip() for part in keys.split(",") if part.strip()]
        try:
            self._fernet = MultiFernet([Fernet(part.encode()) for part in parts])
        except (ValueError, TypeError):
            raise SecretError("SKILLRUN_SECRETS_KEY must be one or more Fernet keys (32 url-safe base64 bytes, "
                              "comma-separated); make one with: python3 -c 'from cryptography.fernet import "
                              "Fernet; print(Fernet.generate_key().decode())'") from None

    def seal(self, team: str, name: str, value: str) -> str:
        return self._fernet.encrypt(json.dumps({"team": team, "name": name, "value": value}).encode()).decode()

    def open(self, team: str, name: str, sealed: str) -> str:
        try:
            content = json.loads(self._fernet.decrypt(sealed.encode()))
        except InvalidToken:
            raise SecretError(f"secret {name} of team {team} cannot be decrypted: SKILLRUN_SECRETS_KEY is not the key "
                              "it was stored with (add that key after the new one to rotate)") from None
        if content.get("team") != team or content.get("name") != name:
            raise SecretError(f"secret {name} of team {team} holds another secret's value: refused")
        return content["value"]


class SecretStore:
    """A team's secrets (see the module docstring), in ``documents``."""

    def __init__(self, documents: BaseDocuments, box: SecretBox | None) -> None:
        self.documents = documents
        self.box = box

    @staticmethod
    def _team(team: str | None) -> str:
        if team is None or not TEAM_NAME.fullmatch(team):
            raise SecretError(f"secrets belong to a team; {team!r} is none (runs with secrets go through the API)")
        return team

    def _sealer(self) -> SecretBox:
        if self.box is None:
            raise SecretError("secrets need the operator's key: set SKILLRUN_SECRETS_KEY on the API and its workers")
        return self.box

    def set(self, team: str, name: str, value: str) -> SecretInfo:
        team = self._team(team)
        check_name(name)
        check_value(name, value)
        sealed = self._sealer().seal(team, name, value)
        with self._locked(team):
            entries = self._entries(team)
            if name not in entries and len(entries) >= MAX_SECRETS_PER_TEAM:
                raise SecretError(f"team {team} has {len(entries)} secrets, the most it may have: remove one first")
            size = len(value.encode())
            others = sum(_size(entry) for other, entry in entries.items() if other != name)
            if others + size > MAX_TEAM_SECRET_BYTES:
                raise SecretError(f"team {team}'s secrets would hold {others + size} bytes; a team's secrets hold at "
                                  f"most {MAX_TEAM_SECRET_BYTES} together (every run of the team is redacted of all "
                                  "of them): remove one first")
            now = time.time()
            created = entries.get(name, {}).get("created_at", now)
            self.documents.put(team, name, {"sealed": sealed, "bytes": size, "created_at": created, "updated_at": now})
        return SecretInfo(name=name, created_at=created, updated_at=now)

    def list(self, team: str) -> list[SecretInfo]:
        team = self._team(team)
        return [SecretInfo(name=name, created_at=entry["created_at"], updated_at=entry["updated_at"])
                for name, entry in sorted(self._entries(team).items())]

    def remove(self, team: str, name: str) -> bool:
        """``False`` when the team has no secret of that name."""
        team = self._team(team)
        check_name(name)
        with self._locked(team):
            return self.documents.delete(team, name)

    def reveal(self, team: str | None, names: list[str]) -> dict[str, str]:
        """The values of ``names`` (each must exist) for a run of ``team``."""
        if not names:
            return {}
        return _named(self._team(team), self.reveal_all(team), names)

    def reveal_all(self, team: str | None) -> dict[str, str]:
        """Every secret of ``team`` (none for an owner that is not a team): what any run of it is redacted of."""
        if team is None or not TEAM_NAME.fullmatch(team):
            return {}
        entries = self._entries(team)
        if not entries:
            return {}
        sealer = self._sealer()
        return {name: sealer.open(team, name, entry["sealed"]) for name, entry in entries.items()}

    def any_stored(self) -> bool:
        """Whether any team has a secret (the API refuses to start without a key then)."""
        try:
            return any(TEAM_NAME.fullmatch(kind) for kind in self.documents.kinds())
        except DocumentError as exc:
            raise SecretError(str(exc)) from None

    def _entries(self, team: str) -> dict[str, dict]:
        try:
            entries = self.documents.items(team)
        except DocumentError as exc:
            raise SecretError(f"a secret of team {team} cannot be read: {exc}") from None
        for name, entry in entries.items():
            problem = _entry_problem(entry)
            if problem is not None:
                raise SecretError(f"secret {name} of team {team} {problem}: restore it from a backup")
        return entries

    def _locked(self, team: str) -> ContextManager[None]:
        return self.documents.locked(team)


class RedisSecretStore(SecretStore):
    def __init__(self, client: redis.Redis, box: SecretBox | None) -> None:
        super().__init__(RedisDocuments(client, REDIS_PREFIX), box)
        self.redis = client


class FileSecretStore(SecretStore):
    def __init__(self, folder: Path, box: SecretBox | None) -> None:
        super().__init__(FileDocuments(folder), box)
        self.folder = folder
        self._held = threading.local()
        """The teams whose lock this thread holds (a change reads the team's entries under it)."""

    def any_stored(self) -> bool:
        return bool(self._earlier_files()) or super().any_stored()

    def _entries(self, team: str) -> dict[str, dict]:
        if os.path.lexists(self.folder / f"{team}.json"):  # the earlier layout: moved first, under the team's lock
            if team in getattr(self._held, "teams", ()):
                self._move_earlier_file(team)
            else:
                with self.documents.locked(team):
                    self._move_earlier_file(team)
        return super()._entries(team)

    @contextlib.contextmanager
    def _locked(self, team: str) -> Iterator[None]:
        held = self._held.__dict__.setdefault("teams", set())
        with self.documents.locked(team):
            held.add(team)
            try:
                self._move_earlier_file(team)
                yield
            finally:
                held.discard(team)

    def _earlier_files(self) -> list[Path]:
        """Teams' files of the earlier layout, one file of all a team's secrets (``<dir>/<team>.json``)."""
        if not self.folder.is_dir():
            return []
        return [path for path in self.folder.glob("*.json") if TEAM_NAME.fullmatch(path.stem)]

    def _move_earlier_file(self, team: str) -> None:
        """A team's secrets in the earlier layout written as its documents, then the earlier file removed (under
        the team's lock: whoever reads next finds them moved, and nothing of them is lost on the way). A file that
        is not a regular one, or not a mapping of well-formed secrets, is refused whole: nothing of it moved."""
        earlier = self.folder / f"{team}.json"
        entries = _earlier_entries(earlier)
        if entries is None:
            return
        for name, entry in entries.items():
            if self.documents.get(team, name) is None:  # one set since is newer
                self.documents.put(team, name, entry)
        earlier.unlink()


def _earlier_entries(earlier: Path) -> dict[str, dict] | None:
    """The entries of a team's file of the earlier layout (``None`` when there is none), each checked."""
    try:
        descriptor = os.open(earlier, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SecretError(f"the secrets file {earlier} cannot be read ({exc.strerror}): restore it from a "
                          f"backup") from None
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise SecretError(f"the secrets file {earlier} cannot be read (not a regular file): restore it from a backup")
    with os.fdopen(descriptor, "rb") as opened:
        try:
            entries = json.loads(opened.read())
        except (ValueError, RecursionError) as exc:
            raise SecretError(f"the secrets file {earlier} cannot be read ({type(exc).__name__}): restore it from a "
                              f"backup") from None
    if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
        raise SecretError(f"the secrets file {earlier} is not a mapping of secrets: restore it from a backup")
    for name, entry in entries.items():
        problem = "is no secret's name" if env_name_problem(name) or not is_name(name) else _entry_problem(entry)
        if problem is not None:
            raise SecretError(f"the secrets file {earlier} holds an entry {name!r} that {problem}: restore it from "
                              f"a backup")
    return entries


def _entry_problem(entry: dict) -> str | None:
    """What is wrong with a stored secret's entry, or ``None``."""
    def number(value: object) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    if not isinstance(entry.get("sealed"), str):
        return "holds no sealed value"
    if not (number(entry.get("created_at")) and number(entry.get("updated_at"))):
        return "holds no dates"
    if "bytes" in entry and not (isinstance(entry["bytes"], int) and not isinstance(entry["bytes"], bool)):
        return "holds no size"
    return None


def _size(entry: dict) -> int:
    """A stored value's size: as recorded, or (entries from before sizes were) its sealed length, which is more."""
    return int(entry.get("bytes", len(entry["sealed"])))


def box_from(key: object) -> SecretBox | None:
    """The box for a ``secrets_key`` setting (a ``SecretStr``), or ``None`` when it is unset."""
    if key is None:
        return None
    return SecretBox(key.get_secret_value())  # type: ignore[attr-defined]


def attach_secrets(request: RunRequest, store: SecretStore | None, owner: str | None) -> Redactor:
    """Put the values of the secrets ``request`` names (``owner``'s) where its runtime reads them, just before it
    runs; and return the redactor that takes every secret of the team out of what comes back — not only the
    named ones: a file an earlier run left in the workspace may hold a secret this run was not given."""
    if store is None:
        if request.secrets:
            raise SecretError("this run names secrets, but secrets are not set up here: set SKILLRUN_SECRETS_KEY on "
                              "the API and its workers")
        return Redactor({})
    every = store.reveal_all(owner)
    if request.secrets:
        request.secret_values.update(_named(SecretStore._team(owner), every, request.secrets))
    request.redacted_values.update(every)
    return Redactor(every)


def forget_secrets(request: RunRequest) -> None:
    """Drop the values ``attach_secrets`` put on ``request``, once its run ended."""
    request.secret_values.clear()
    request.redacted_values.clear()


def _named(team: str, every: dict[str, str], names: list[str]) -> dict[str, str]:
    missing = [name for name in names if name not in every]
    if missing:
        raise SecretError(f"team {team} has no secret {', '.join(missing)}: set it with skillrun secrets set")
    return {name: every[name] for name in names}
