"""The run ids the API hands out, which say by themselves who they were made for and when.

An id is ``r`` + its creation time (milliseconds, 11 hex digits) + 16 random hex digits + an 8-digit check: a
BLAKE2b digest of the rest and the team's id. No record is needed to tell whether this API made an id for a team,
so when a run's record is missing the API can tell *lost* from *no such run*: a well-made id of the asking team,
younger than the run store's retention, with no record is a run that was lost (Redis restarted without its data,
or the embedded API restarted); anything else is no such run. The check is not a secret: forging one only makes
the API call a run that never existed lost, and reveals nothing.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time

_SHAPE = re.compile(r"^r([0-9a-f]{11})([0-9a-f]{16})([0-9a-f]{8})$")
_PERSON = b"skillrun-run-id"


def _check(stamp: str, nonce: str, team_id: str) -> str:
    return hashlib.blake2b(f"{stamp}{nonce}{team_id}".encode(), digest_size=4, person=_PERSON).hexdigest()


def mint(team_id: str) -> str:
    """A new run id for ``team_id``."""
    stamp, nonce = f"{int(time.time() * 1000):011x}", secrets.token_hex(8)
    return f"r{stamp}{nonce}{_check(stamp, nonce, team_id)}"


def made_at(run_id: str, team_id: str) -> float | None:
    """When the API made ``run_id`` for ``team_id`` (seconds since the epoch), or ``None`` if it did not."""
    found = _SHAPE.match(run_id)
    if found is None or not secrets.compare_digest(found[3], _check(found[1], found[2], team_id)):
        return None
    return int(found[1], 16) / 1000


def lost(run_id: str, team_id: str, retention_seconds: float | None) -> bool:
    """Whether a missing record of ``run_id`` means the run was lost (see the module): an id made for the team, within
    ``retention_seconds`` (``None``: records are kept as long as their store lives)."""
    made = made_at(run_id, team_id)
    return made is not None and (retention_seconds is None or time.time() - made <= retention_seconds)
