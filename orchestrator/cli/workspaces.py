"""``skillrun workspaces list|rm``: a team's kept workspaces, through the API it runs on (``SKILLRUN_API_URL``,
``--api``) with the team's key (``SKILLRUN_API_KEY``, ``--key``): the API knows which workspaces exist and where,
and removes them on a worker of their runtime."""

from __future__ import annotations

import argparse
import datetime
import urllib.parse

import httpx

from orchestrator.cli import UsageError
from orchestrator.cli.output import print_json, table
from orchestrator.config import get_settings
from worker.contract import WORKSPACE_ID_PATTERN

PAGE = 1000
DEFAULT_API_URL = "http://127.0.0.1:8000"
"""The API the commands talk to when neither ``--api`` nor ``SKILLRUN_API_URL`` names one."""
REQUEST_TIMEOUT_SECONDS = 60.0


def _client(args: argparse.Namespace) -> httpx.Client:
    settings = get_settings()
    key = args.key or settings.api_key
    if not key:
        raise UsageError("no API key: set SKILLRUN_API_KEY or pass --key with the team's key "
                         "(an operator makes one with: skillrun keys create TEAM)")
    return httpx.Client(base_url=args.api or settings.api_url or DEFAULT_API_URL, headers={"Authorization": f"Bearer {key}"},
                        timeout=REQUEST_TIMEOUT_SECONDS)


def _call(client: httpx.Client, method: str, path: str, **options: object) -> httpx.Response:
    """The API's answer; what to do next when it cannot be had or refuses the key."""
    try:
        response = client.request(method, path, **options)
    except httpx.TransportError as exc:
        raise UsageError(f"the API at {client.base_url} cannot be reached ({exc}); start it (skillrun serve) or point "
                         "SKILLRUN_API_URL or --api at it") from exc
    if response.status_code == 401:
        raise UsageError(f"the API at {client.base_url} refused the key ({_detail(response)}); check SKILLRUN_API_KEY "
                         "or --key")
    return response


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json()["detail"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:200]}"


def _when(ts: float | None) -> str:
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def list_workspaces(args: argparse.Namespace) -> int:
    entries: list[dict] = []
    offset: int | None = 0
    with _client(args) as client:
        while offset is not None:
            response = _call(client, "GET", "/v1/workspaces", params={"offset": offset, "limit": PAGE})
            if response.status_code != 200:
                raise UsageError(f"listing workspaces failed: {_detail(response)}")
            page = response.json()
            entries += page["data"]
            offset = page["next_offset"]
    if args.json:
        print_json(entries)
    elif not entries:
        print("no kept workspaces (a run keeps one when given a workspace_id)")
    else:
        rows = [[e["id"], e["runtime"], e["state"], _when(e["created_at"]), _when(e["last_used_at"]),
                 _when(e["removed_when_idle_at"]), ", ".join(e["runs"]) or "-"] for e in entries]
        print(table(["WORKSPACE", "RUNTIME", "STATE", "CREATED", "LAST USED", "REMOVED IF IDLE UNTIL", "RUNS"], rows))
    return 0


def remove_workspace(args: argparse.Namespace) -> int:
    if not WORKSPACE_ID_PATTERN.fullmatch(args.id):
        raise UsageError(f"{args.id!r} is not a workspace id (as listed: <team>.<workspace_id>; see: skillrun "
                         "workspaces list)")
    with _client(args) as client:
        response = _call(client, "DELETE", f"/v1/workspaces/{urllib.parse.quote(args.id, safe='')}")
    if response.status_code == 404:
        raise UsageError(f"{_detail(response)} (see: skillrun workspaces list)")
    if response.status_code not in (202, 204):
        raise UsageError(f"workspace {args.id} was not removed: {_detail(response)}")
    handed = response.status_code == 202
    if args.json:
        print_json({"id": args.id, "state": "removing" if handed else "removed"})
    elif handed:
        print(f"workspace {args.id}: a worker of its runtime removes it ('skillrun workspaces list' shows it as "
              "removing until it is gone)")
    else:
        print(f"removed workspace {args.id}")
    return 0
