"""``skillrun skills list`` and ``skillrun skills show``."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.cli import UsageError
from orchestrator.cli.common import repository
from orchestrator.cli.output import print_json, size, table
from orchestrator.config import get_settings
from orchestrator.skills import CachedSkillRepository
from worker.errors import WorkerError
from worker.roots import is_url

if TYPE_CHECKING:
    from worker.environments import EnvironmentStatus


def list_skills(args: argparse.Namespace) -> int:
    """Every skill, or with ``--search`` the matching ones best first. Parsed summaries are kept between runs
    (``<data_dir>/skill-summaries/``), so only the SKILL.md files changed since the last listing are parsed."""
    if args.search is not None and not args.search.strip():
        raise UsageError("--search needs a query: describe the task in a few words")
    summaries, problems = _listing_repository(args).listing(args.search)
    if args.json:
        print_json(
            {
                "skills": [{"name": s.name, "description": s.description} for s in summaries],
                "problems": [p.__dict__ for p in problems],
            }
        )
        return 0
    if summaries:
        print(table(["NAME", "DESCRIPTION"], [[s.name, s.description] for s in summaries]))
    else:
        print("no skills found" if args.search is None else f"no skill matches {args.search!r}")
    for problem in problems:
        print(f"{problem.kind}: {problem}", file=sys.stderr)
    return 0


def _listing_repository(args: argparse.Namespace) -> CachedSkillRepository:
    settings = get_settings()
    roots = args.skills_root or settings.skills_roots()
    key = "\0".join(root if is_url(root) else os.path.abspath(root) for root in roots)
    cache = settings.data_dir / "skill-summaries" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
    return CachedSkillRepository(roots, summary_cache=cache)


def show_skill(args: argparse.Namespace) -> int:
    # Imported here: it loads the runtimes, which only `show` needs
    from orchestrator.cli.environments import environment_status

    repo = repository(args)
    skill = repo.get(args.name)
    problems = [p for p in repo.problems() if Path(p.path).parent == skill.path or str(skill.path) in p.message]
    try:
        environment, unknown = environment_status(args, repo, skill.name), ""
    except WorkerError as exc:  # the Docker runtime without its SDK or an engine: the rest is still shown
        environment, unknown = None, f"not known: the {args.runtime} runtime cannot be asked ({exc})"
    if args.json:
        print_json(
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
                "runtime": args.runtime,
                "environment": environment.as_json() if environment is not None else None,
                **({"environment_error": unknown} if unknown else {}),
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
    rows.append([f"environment ({args.runtime})", _describe(environment, skill.name, args.runtime) or unknown])
    print(table(["FIELD", "VALUE"], rows))
    for problem in problems:
        print(f"{problem.kind}: {problem}")
    print()
    print(skill.body)
    return 0


def _describe(status: EnvironmentStatus | None, name: str, runtime: str) -> str:
    """One line on a skill's dependency environment (and, on Docker, its derived image); empty when unknown."""
    if status is None:
        return ""
    image = ""
    if status.image is not None and status.image.root_filesystem:
        image = f"; Debian packages: root filesystem {status.image.state}"
    elif status.image is not None and not status.image.on_host:
        image = f"; Debian packages: image {status.image.state}"
    elif status.image is not None:
        image = f"; Debian packages: {'on' if status.image.state == 'ready' else 'missing on'} this host"
    if status.state == "none":
        return "none (the skill declares no Python or Node packages)"
    declared = ", ".join(status.declaration.python + status.declaration.node + status.declaration.debian)
    if status.state == "ready":
        node = status.node.info if status.node is not None else None
        if node is not None:
            python = f"; Python: {len(status.info.packages)} packages, key {status.info.key[:12]}" if status.info else ""
            return (f"ready: {len(node.packages)} Node packages, {size(node.size_bytes)}, key {node.key[:12]} "
                    f"({', '.join(node.packages)}){python}{image}")
        if status.info is None:
            return f"ready{image} ({status.image.tag})"
        return (f"ready: {len(status.info.packages)} packages, {size(status.info.size_bytes)}{image}; key "
                f"{status.info.key[:12]} ({', '.join(status.info.packages)})")
    if status.state == "invalid" or (status.image is not None and status.image.on_host
                                     and status.image.state != "ready"):
        return f"{status.state}: {status.message}"  # preparing again would not help
    detail = f": {status.message.splitlines()[-1]}" if status.message else ""
    return f"{status.state} ({declared}){detail}; build it with `skillrun skills prepare --runtime {runtime} {name}`"
