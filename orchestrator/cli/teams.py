"""``skillrun teams create|list|set-quota|quota`` and ``skillrun keys create|list|revoke``: who may use the API, and
how much."""

from __future__ import annotations

import argparse
import datetime

from orchestrator.documents import create_documents
from orchestrator.cli.output import print_json, table
from orchestrator.config import get_settings
from orchestrator.quotas import Quotas, TeamQuota, shown
from orchestrator.teams import TeamError, TeamStore


def team_store() -> TeamStore:
    return TeamStore(create_documents(get_settings()))


def when(ts: float | None) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts else "-"


def create_team(args: argparse.Namespace) -> int:
    team = team_store().create_team(args.name)
    if args.json:
        print_json(team.model_dump())
    else:
        print(f"created team {team.id}; give it a key with: skillrun keys create {team.id}")
    return 0


def list_teams(args: argparse.Namespace) -> int:
    teams = team_store().teams()
    if args.json:
        print_json([t.model_dump() for t in teams])
    else:
        print(table(["TEAM", "CREATED"], [[t.id, when(t.created_at)] for t in teams]) if teams else "no teams")
    return 0


def create_key(args: argparse.Namespace) -> int:
    record, key = team_store().create_key(args.team)
    if args.json:
        print_json({"id": record.id, "team": record.team_id, "key": key})
    else:
        print(key)
        print(f"key {record.id} for team {record.team_id}: store it now, it is not shown again", flush=True)
    return 0


def list_keys(args: argparse.Namespace) -> int:
    keys = team_store().keys(args.team)
    if args.json:
        print_json([k.model_dump(exclude={"secret_sha256"}) for k in keys])
    else:
        rows = [[k.id, when(k.created_at), "revoked " + when(k.revoked_at) if k.revoked_at else "active"] for k in keys]
        print(table(["KEY", "CREATED", "STATE"], rows) if rows else "no keys")
    return 0


def revoke_key(args: argparse.Namespace) -> int:
    record = team_store().revoke_key(args.key_id)
    print_json(record.model_dump(exclude={"secret_sha256"})) if args.json else print(f"revoked key {record.id}")
    return 0


def quotas() -> Quotas:
    settings = get_settings()
    return Quotas(create_documents(settings), settings.default_quota())


def set_quota(args: argparse.Namespace) -> int:
    if team_store().get_team(args.team) is None:
        raise TeamError(f"no team {args.team!r}; create it with: skillrun teams create {args.team}")
    changes = {name: None if value == "default" else value
               for name in TeamQuota.model_fields if (value := getattr(args, name)) is not None}
    if not changes:
        raise TeamError("nothing to change: give at least one field, such as --max-running 4 "
                        "(see skillrun teams set-quota --help)")
    quotas().set(args.team, changes)
    return show_quota(args)


def show_quota(args: argparse.Namespace) -> int:
    if team_store().get_team(args.team) is None:
        raise TeamError(f"no team {args.team!r}; create it with: skillrun teams create {args.team}")
    book = quotas()
    own, holds = book.stored(args.team), book.of(args.team)
    if args.json:
        print_json({"team": args.team, "quota": holds.model_dump(), "own": own.model_dump(exclude_none=True)})
        return 0
    rows = [[name, "-" if getattr(holds, name) is None else shown(getattr(holds, name)),
             "team" if getattr(own, name) is not None else "default"] for name in TeamQuota.model_fields]
    print(table(["FIELD", "VALUE", "FROM"], rows))
    return 0
