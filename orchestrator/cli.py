"""The ``skillrun`` command line: list and show skills, run a skill command.

Every command prints a readable table by default and JSON with ``--json``. Bad input exits with status 2 and a
message that says what was wrong; ``skillrun run`` exits with the command's own exit status (124 on timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from orchestrator.code_executors import create_local_workspace_runtime
from orchestrator.config import get_settings
from orchestrator.dispatch import InlineDispatcher
from orchestrator.errors import OrchestratorError
from orchestrator.skills import BaseSkillRepository, create_default_skill_repository
from worker.artifacts import FileArtifactStore
from worker.contract import InputFile, RunRequest, RunResult
from worker.errors import WorkerError
from worker.process import TIMEOUT_EXIT_CODE

USAGE_ERROR = 2


class UsageError(Exception):
    """Bad command-line input."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return USAGE_ERROR
    try:
        return args.handler(args)
    except (UsageError, OrchestratorError, WorkerError) as exc:
        print(f"skillrun: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "request"
            print(f"skillrun: error: {where}: {err['msg']}", file=sys.stderr)
        return USAGE_ERROR


def _parser() -> argparse.ArgumentParser:
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
    listing.set_defaults(handler=_skills_list)
    show = skill_commands.add_parser("show", parents=[common], help="one skill: body, docs, tools, problems")
    show.add_argument("name")
    show.set_defaults(handler=_skills_show)

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
    run.add_argument("--work-root", metavar="DIR", help="where workspaces live (default $SKILLRUN_WORK_ROOT or /tmp)")
    run.add_argument("--artifacts", action="store_true", help="also store the output files as artifacts")
    run.set_defaults(handler=_run)
    return parser


def _repository(args: argparse.Namespace) -> BaseSkillRepository:
    roots = args.skills_root or get_settings().skills_roots()
    return create_default_skill_repository(roots)


def _skills_list(args: argparse.Namespace) -> int:
    repo = _repository(args)
    summaries = repo.summaries()
    problems = repo.problems()
    if args.json:
        _print_json(
            {
                "skills": [{"name": s.name, "description": s.description} for s in summaries],
                "problems": [p.__dict__ for p in problems],
            }
        )
        return 0
    if summaries:
        print(_table(["NAME", "DESCRIPTION"], [[s.name, s.description] for s in summaries]))
    else:
        print("no skills found")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 0


def _skills_show(args: argparse.Namespace) -> int:
    repo = _repository(args)
    skill = repo.get(args.name)
    problems = [p for p in repo.problems() if Path(p.path).parent == skill.path or str(skill.path) in p.message]
    if args.json:
        _print_json(
            {
                "name": skill.name,
                "description": skill.description,
                "path": str(skill.path),
                "license": skill.license,
                "allowed_tools": skill.allowed_tools,
                "metadata": skill.metadata,
                "tools": skill.tools,
                "docs": [{"name": d.name, "size": len(d.content.encode())} for d in skill.docs],
                "body": skill.body,
                "problems": [p.__dict__ for p in problems],
            }
        )
        return 0
    rows = [
        ["name", skill.name],
        ["description", skill.description],
        ["path", str(skill.path)],
        ["tools", ", ".join(skill.tools) or "-"],
        ["docs", ", ".join(skill.doc_names) or "-"],
    ]
    if skill.license:
        rows.append(["license", skill.license])
    print(_table(["FIELD", "VALUE"], rows))
    for problem in problems:
        print(f"problem: {problem}")
    print()
    print(skill.body)
    return 0


def _run(args: argparse.Namespace) -> int:
    repo = _repository(args)
    ref = repo.skill_ref(args.skill)
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--env {item!r}: expected KEY=VALUE")
        env[key] = value
    inputs = []
    for item in args.input:
        path, sep, name = item.rpartition("=")
        if not sep:
            path, name = item, os.path.basename(item)
        if not os.path.isfile(path):
            raise UsageError(f"--input {item!r}: {path!r} is not a file")
        inputs.append(InputFile(name=name, host_path=os.path.abspath(path)))
    fields: dict = {
        "skill": ref, "command": args.command, "env": env, "output_files": args.output, "inputs": inputs,
        "workspace_id": args.workspace or uuid.uuid4().hex[:12], "save_as_artifacts": args.artifacts,
    }
    if args.timeout is not None:
        fields["timeout"] = args.timeout
    request = RunRequest(**fields)
    settings = get_settings()
    work_root = args.work_root or settings.work_root
    runtime = create_local_workspace_runtime(
        work_root, artifact_store=FileArtifactStore(settings.artifacts_dir) if settings.artifacts_dir else None
    )
    result = asyncio.run(_dispatch(InlineDispatcher({"local": runtime}), request))
    if args.json:
        _print_json(result.model_dump(mode="json"))
    else:
        _print_result(result)
    return TIMEOUT_EXIT_CODE if result.timed_out else result.exit_code


async def _dispatch(dispatcher: InlineDispatcher, request: RunRequest) -> RunResult:
    async with dispatcher:
        return await dispatcher.run(request, trusted=True)


def _print_result(result: RunResult) -> None:
    sys.stdout.write(result.stdout)
    sys.stdout.flush()
    sys.stderr.write(result.stderr)
    status = f"timed out (killed, exit {TIMEOUT_EXIT_CODE})" if result.timed_out else f"exit {result.exit_code}"
    lines = [f"── {status} · {result.duration_ms} ms · workspace {result.workspace_id} (reuse: --workspace {result.workspace_id})"]
    if result.output_files:
        rows = [[f.name, _size(f.size) + (" (truncated)" if f.truncated else ""), f.mime_type] for f in result.output_files]
        lines.append(_table(["OUTPUT FILE", "SIZE", "MIME TYPE"], rows))
    for artifact in result.artifact_files:
        lines.append(f"artifact {artifact.name} v{artifact.version} ({_size(artifact.size)})")
    for skipped in result.skipped_files:
        lines.append(f"skipped {skipped.name}: {skipped.reason}")
    print("\n".join(lines), file=sys.stderr)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    width = shutil.get_terminal_size((120, 24)).columns
    cols = len(headers)
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(cols)]
    fixed = sum(widths[:-1]) + 2 * (cols - 1)
    widths[-1] = max(min(widths[-1], width - fixed), 10)

    def fmt(row: list[str]) -> str:
        cells = [str(c) for c in row]
        last = cells[-1] if len(cells[-1]) <= widths[-1] else cells[-1][: widths[-1] - 1] + "…"
        return "  ".join([c.ljust(w) for c, w in zip(cells[:-1], widths)] + [last]).rstrip()

    return "\n".join([fmt(headers), *(fmt(r) for r in rows)])


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    sys.exit(main())
