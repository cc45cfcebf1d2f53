"""``skillrun egress set|show|clear``: a team's egress allow-list (``orchestrator.egress``), on the documents the
API uses. A run reaches the hosts both its skill declares (``metadata.egress``) and this list allows."""

from __future__ import annotations

import argparse

from orchestrator.documents import create_documents
from orchestrator.cli import UsageError
from orchestrator.cli.output import print_json, table
from orchestrator.cli.teams import team_store, when
from orchestrator.config import get_settings
from orchestrator.egress import EgressList, EgressStore


def _store(team: str) -> EgressStore:
    if team_store().get_team(team) is None:
        raise UsageError(f"no team {team!r}: create it with skillrun teams create {team}")
    return EgressStore(create_documents(get_settings()))


def _show(listed: EgressList, args: argparse.Namespace, done: str) -> int:
    if args.json:
        print_json(listed.model_dump())
    elif not listed.entries:
        print(f"team {listed.team} allows no egress: its runs have no network{done}")
    else:
        rows = [[entry, when(listed.updated_at)] for entry in listed.entries]
        print(table(["ENTRY", "SET"], rows))
    return 0


def set_egress(args: argparse.Namespace) -> int:
    return _show(_store(args.team).set(args.team, args.entries), args, "")


def show_egress(args: argparse.Namespace) -> int:
    return _show(_store(args.team).get(args.team), args, "")


def clear_egress(args: argparse.Namespace) -> int:
    return _show(_store(args.team).clear(args.team), args, " (cleared)")
