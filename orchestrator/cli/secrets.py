"""``skillrun secrets set|list|rm``: a team's secrets, on the store the API and its workers use.

``set`` reads the value from standard input (a prompt that does not echo when it is a terminal; else the whole
input, one trailing newline dropped), so it never appears in a command line or the shell's history. Nothing shows a
value back.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from orchestrator.cli import UsageError
from orchestrator.cli.output import print_json, table
from orchestrator.cli.teams import team_store, when
from orchestrator.config import get_settings
from orchestrator.dispatch import secret_store_for
from worker.secrets import SecretStore


def _secrets(team: str) -> SecretStore:
    if team_store().get_team(team) is None:
        raise UsageError(f"no team {team!r}: create it with skillrun teams create {team}")
    return secret_store_for(get_settings())


def set_secret(args: argparse.Namespace) -> int:
    store = _secrets(args.team)
    if sys.stdin.isatty():
        value = getpass.getpass(f"value of {args.name} (not shown): ")
    else:
        value = sys.stdin.read()
        value = value[:-1] if value.endswith("\n") else value
    info = store.set(args.team, args.name, value)
    if args.json:
        print_json(info.model_dump())
    else:
        print(f"stored secret {info.name} for team {args.team}; a run names it with secrets=[{info.name!r}] and its "
              f"skill declares it (metadata.secrets)")
    return 0


def list_secrets(args: argparse.Namespace) -> int:
    found = _secrets(args.team).list(args.team)
    if args.json:
        print_json([info.model_dump() for info in found])
    else:
        rows = [[info.name, when(info.created_at), when(info.updated_at)] for info in found]
        print(table(["SECRET", "CREATED", "UPDATED"], rows) if rows else f"team {args.team} has no secrets")
    return 0


def remove_secret(args: argparse.Namespace) -> int:
    if not _secrets(args.team).remove(args.team, args.name):
        raise UsageError(f"team {args.team} has no secret {args.name}")
    if args.json:
        print_json({"removed": args.name})
    else:
        print(f"removed secret {args.name} of team {args.team}")
    return 0
