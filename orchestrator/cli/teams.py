"""``skillrun teams create|list`` and ``skillrun keys create|list|revoke``: who may use the API."""

from __future__ import annotations

import argparse
import datetime

from orchestrator.api.app import create_documents
from orchestrator.cli.output import print_json, table
from orchestrator.config import get_settings
from orchestrator.teams import TeamStore


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
