"""The ``skillrun`` command line.

Every command prints a readable table by default and JSON with ``--json``. Bad input exits with status 2 and a
message that says what was wrong; ``skillrun run`` exits with the command's own exit status (124 on timeout).
Each command's module is imported only when that command runs, so ``skillrun skills list`` does not pay for the
model SDK that ``skillrun chat`` needs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from orchestrator.errors import OrchestratorError
from orchestrator.quotas import TeamQuota
from worker.cli import add_arguments as add_worker_arguments
from worker.cli import error_lines
from worker.errors import WorkerError

USAGE_ERROR = 2
PREPARED_RUNTIMES = ("local", "docker")
"""Runtimes whose environments are built on this host before runs (a Cube sandbox installs its own)."""

WORK_ROOT_HELP = ("where workspaces live (default $SKILLRUN_WORK_ROOT, else /tmp as root and "
                  "~/.cache/skillrun for any other account)")


class UsageError(OrchestratorError):
    """Bad command-line input."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return USAGE_ERROR
    module_name, function = args.handler.split(":")
    handler = getattr(importlib.import_module(module_name), function)
    try:
        return handler(args)
    except (OrchestratorError, WorkerError) as exc:
        print(f"skillrun: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except ValidationError as exc:
        for line in error_lines(exc, "request"):
            print(f"skillrun: error: {line}", file=sys.stderr)
        return USAGE_ERROR


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--skills-root", action="append", metavar="ROOT",
        help="a skills root (repeatable); default $SKILLS_ROOT, else ./skills",
    )
    common.add_argument("--json", action="store_true", help="print JSON for machines")

    parser = argparse.ArgumentParser(prog="skillrun", description="Run Agent Skills safely.")
    commands = parser.add_subparsers(title="commands")

    skills = commands.add_parser("skills", help="list and inspect skills")
    skill_commands = skills.add_subparsers(title="skills commands")
    listing = skill_commands.add_parser("list", parents=[common], help="name and description of each skill")
    listing.add_argument("--search", metavar="QUERY", help="only the skills matching QUERY, best match first")
    listing.set_defaults(handler="orchestrator.cli.skills:list_skills")
    show = skill_commands.add_parser(
        "show", parents=[common], help="one skill: body, docs, tools, dependency environment, problems"
    )
    show.add_argument("name")
    show.add_argument("--work-root", metavar="DIR", help=WORK_ROOT_HELP)
    show.add_argument("--runtime", choices=PREPARED_RUNTIMES, default="local",
                      help="whose environment to show: the local runtime's (default) or the Docker runtime's")
    show.set_defaults(handler="orchestrator.cli.skills:show_skill")
    prepare = skill_commands.add_parser(
        "prepare", parents=[common],
        help="resolve and build the skills' dependency environments (all skills, or the ones named)",
    )
    prepare.add_argument("names", nargs="*", metavar="NAME")
    prepare.add_argument("--work-root", metavar="DIR", help=WORK_ROOT_HELP)
    prepare.add_argument("--runtime", choices=PREPARED_RUNTIMES, default="local",
                         help="whose environments to build: the local runtime's (default, for the host's python3) or "
                              "the Docker runtime's (for the sandbox image's, plus a derived image of each skill's "
                              "Debian packages)")
    prepare.set_defaults(handler="orchestrator.cli.environments:prepare_skills")

    envs_common = argparse.ArgumentParser(add_help=False)
    envs_common.add_argument("--json", action="store_true", help="print JSON for machines")
    envs_common.add_argument(
        "--work-root", metavar="DIR", help=WORK_ROOT_HELP
    )
    envs = commands.add_parser("envs", help="built dependency environments: sizes, last use, removal")
    env_commands = envs.add_subparsers(title="envs commands")
    env_commands.add_parser("list", parents=[envs_common], help="each environment with its size and last use") \
        .set_defaults(handler="orchestrator.cli.environments:list_environments")
    env_remove = env_commands.add_parser("rm", parents=[envs_common], help="remove one environment by its key")
    env_remove.add_argument("key", help="the key, or a unique start of it")
    env_remove.set_defaults(handler="orchestrator.cli.environments:remove_environment")
    env_prune = env_commands.add_parser("prune", parents=[envs_common], help="remove environments unused for a while")
    env_prune.add_argument("--unused-days", type=float, default=30.0, metavar="N",
                           help="remove those no run has used for N days (default 30)")
    env_prune.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    env_prune.set_defaults(handler="orchestrator.cli.environments:prune_environments")

    run = commands.add_parser("run", parents=[common], help="run a command of a skill in a workspace")
    run.add_argument("skill")
    run.add_argument("command")
    run.add_argument("-o", "--output", action="append", default=[], metavar="GLOB", help="collect matching files")
    run.add_argument("--env", action="append", default=[], metavar="K=V", help="set a variable for the command")
    run.add_argument("--timeout", type=float, default=None, metavar="S", help="seconds before the command is killed")
    run.add_argument(
        "--input", action="append", default=[], metavar="PATH[=NAME]", help="copy a file into work/inputs/NAME"
    )
    run.add_argument("--workspace", metavar="ID", help="reuse the workspace of this id (work/ and out/ persist)")
    run.add_argument("--work-root", metavar="DIR", help=WORK_ROOT_HELP)
    run.add_argument("--artifacts", action="store_true", help="also store the output files as artifacts")
    run.add_argument("--egress", action="append", default=[], metavar="HOST[:PORT]",
                     help="let the command reach this host (or *.domain) through the worker's egress proxy, and "
                          "nothing else (local runtime as root, docker); port 443 unless given")
    run.add_argument("--runtime", choices=["local", "docker", "cube"], default="local",
                     help="where the command runs: a local process (default), a Docker container, or a Cube (E2B) "
                          "sandbox configured by E2B_API_URL, E2B_API_KEY and CUBE_TEMPLATE_ID")
    run.set_defaults(handler="orchestrator.cli.run:run_skill")

    chat = commands.add_parser("chat", parents=[common], help="talk to the skill assistant (streams its answer)")
    chat.add_argument("message")
    chat.add_argument("--session", metavar="ID", help="continue this session (default: a new one)")
    chat.add_argument("--work-root", metavar="DIR", help=WORK_ROOT_HELP)
    chat.set_defaults(handler="orchestrator.cli.chat:chat")

    plain = argparse.ArgumentParser(add_help=False)
    plain.add_argument("--json", action="store_true", help="print JSON for machines")
    teams = commands.add_parser("teams", help="teams that may use the API")
    team_commands = teams.add_subparsers(title="teams commands")
    team_create = team_commands.add_parser("create", parents=[plain], help="create a team")
    team_create.add_argument("name")
    team_create.set_defaults(handler="orchestrator.cli.teams:create_team")
    team_commands.add_parser("list", parents=[plain], help="list teams").set_defaults(handler="orchestrator.cli.teams:list_teams")
    set_quota = team_commands.add_parser(
        "set-quota", parents=[plain], help="change a team's quota (runs queued and running, ceilings, workspaces)",
        description="Change fields of a team's quota; VALUE 'default' gives a field back to the operator's default "
                    "(SKILLRUN_TEAM_MAX_*). Counts of 0 mean no limit.")
    set_quota.add_argument("team")
    for name, quota_field in TeamQuota.model_fields.items():
        set_quota.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar="VALUE", help=quota_field.description)
    set_quota.set_defaults(handler="orchestrator.cli.teams:set_quota")
    show_quota = team_commands.add_parser("quota", parents=[plain], help="a team's quota, field by field")
    show_quota.add_argument("team")
    show_quota.set_defaults(handler="orchestrator.cli.teams:show_quota")
    keys = commands.add_parser("keys", help="API keys of teams")
    key_commands = keys.add_subparsers(title="keys commands")
    key_create = key_commands.add_parser("create", parents=[plain], help="create a key for a team (shown once)")
    key_create.add_argument("team")
    key_create.set_defaults(handler="orchestrator.cli.teams:create_key")
    key_list = key_commands.add_parser("list", parents=[plain], help="a team's keys")
    key_list.add_argument("team")
    key_list.set_defaults(handler="orchestrator.cli.teams:list_keys")
    key_revoke = key_commands.add_parser("revoke", parents=[plain], help="revoke a key by its id")
    key_revoke.add_argument("key_id")
    key_revoke.set_defaults(handler="orchestrator.cli.teams:revoke_key")
    secrets = commands.add_parser("secrets", help="a team's secrets: values runs get, never shown back")
    secret_commands = secrets.add_subparsers(title="secrets commands")
    secret_set = secret_commands.add_parser("set", parents=[plain], help="store a secret (the value from stdin)")
    secret_set.add_argument("team")
    secret_set.add_argument("name")
    secret_set.set_defaults(handler="orchestrator.cli.secrets:set_secret")
    secret_list = secret_commands.add_parser("list", parents=[plain], help="a team's secrets: names and dates")
    secret_list.add_argument("team")
    secret_list.set_defaults(handler="orchestrator.cli.secrets:list_secrets")
    secret_rm = secret_commands.add_parser("rm", parents=[plain], help="remove a secret")
    secret_rm.add_argument("team")
    secret_rm.add_argument("name")
    secret_rm.set_defaults(handler="orchestrator.cli.secrets:remove_secret")
    egress = commands.add_parser("egress", help="a team's egress allow-list: the hosts its runs may reach")
    egress_commands = egress.add_subparsers(title="egress commands")
    egress_set = egress_commands.add_parser("set", parents=[plain], help="replace a team's allow-list")
    egress_set.add_argument("team")
    egress_set.add_argument("entries", nargs="+", metavar="ENTRY", help="host[:port] or *.domain[:port] (port 443)")
    egress_set.set_defaults(handler="orchestrator.cli.egress:set_egress")
    egress_show = egress_commands.add_parser("show", parents=[plain], help="a team's allow-list")
    egress_show.add_argument("team")
    egress_show.set_defaults(handler="orchestrator.cli.egress:show_egress")
    egress_clear = egress_commands.add_parser("clear", parents=[plain], help="allow a team's runs no host again")
    egress_clear.add_argument("team")
    egress_clear.set_defaults(handler="orchestrator.cli.egress:clear_egress")

    api = argparse.ArgumentParser(add_help=False, parents=[plain])
    api.add_argument("--api", metavar="URL", help="the API (default $SKILLRUN_API_URL, else http://127.0.0.1:8000)")
    api.add_argument("--key", metavar="KEY", help="the team's API key (default $SKILLRUN_API_KEY)")
    workspaces = commands.add_parser("workspaces", help="a team's kept workspaces (through the API)")
    workspace_commands = workspaces.add_subparsers(title="workspaces commands")
    workspace_commands.add_parser("list", parents=[api], help="the team's kept workspaces: runtime, last use, runs") \
        .set_defaults(handler="orchestrator.cli.workspaces:list_workspaces")
    workspace_remove = workspace_commands.add_parser("rm", parents=[api], help="remove a kept workspace and its files")
    workspace_remove.add_argument("id", help="the workspace's id as listed (<team>.<workspace_id>)")
    workspace_remove.set_defaults(handler="orchestrator.cli.workspaces:remove_workspace")

    worker = commands.add_parser("worker", help="execute queued runs (needs Redis)")
    add_worker_arguments(worker)
    worker.set_defaults(handler="worker.jobs.consumer:serve_worker")

    mcp = commands.add_parser(
        "mcp", help="serve the skill library to an MCP client over stdio (add it to Claude, Cursor, ...)",
        description="Serve the skill library over MCP on stdin/stdout: the skill tools, each skill's SKILL.md and "
                    "docs as resources; runs in Skillrun's sandboxes (on the queue's workers with SKILLRUN_REDIS_URL).",
    )
    mcp.add_argument("--skills-root", action="append", metavar="ROOT",
                     help="a skills root (repeatable); default $SKILLS_ROOT, else ./skills")
    mcp.set_defaults(handler="orchestrator.cli.mcp:serve_mcp")

    serve = commands.add_parser("serve", help="serve the HTTP API")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    serve.set_defaults(handler="orchestrator.cli.serve:serve")
    return parser
