"""``skillrun skills list`` and ``skillrun skills show``."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

from orchestrator.cli import UsageError
from orchestrator.cli.common import repository
from orchestrator.cli.environments import environment_status
from orchestrator.cli.output import print_json, size, table
from orchestrator.config import get_settings
from orchestrator.skills import CachedSkillRepository
from worker.environments import EnvironmentStatus
from worker.roots import is_url


def list_skills(args: argparse.Namespace) -> int:
    """Every skill, or with ``--search`` the matching ones best first. Parsed summaries are kept between runs
    (``<data_dir>/skill-summaries/``), so only the SKILL.md files changed since the last listing are parsed."""
    repo = _listing_repository(args)
    if args.search is not None:
        if not args.search.strip():
            raise UsageError("--search needs a query: describe the task in a few words")
        index = repo.index()
        summaries = [hit.summary for hit in index.search(args.search, len(index))]
    else:
        summaries = repo.summaries()
    problems = repo.problems()
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
        print(f"problem: {problem}", file=sys.stderr)
    return 0


def _listing_repository(args: argparse.Namespace) -> CachedSkillRepository:
    settings = get_settings()
    roots = args.skills_root or settings.skills_roots()
    key = "\0".join(root if is_url(root) else os.path.abspath(root) for root in roots)
    cache = settings.data_dir / "skill-summaries" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
    return CachedSkillRepository(roots, summary_cache=cache)


def show_skill(args: argparse.Namespace) -> int:
    repo = repository(args)
    skill = repo.get(args.name)
    problems = [p for p in repo.problems() if Path(p.path).parent == skill.path or str(skill.path) in p.message]
    environment = environment_status(args, repo, skill.name)
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
                "environment": environment.as_json(),
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
    rows.append(["environment", _describe(environment, skill.name)])
    print(table(["FIELD", "VALUE"], rows))
    for problem in problems:
        print(f"problem: {problem}")
    print()
    print(skill.body)
    return 0


def _describe(status: EnvironmentStatus, name: str) -> str:
    """One line on a skill's dependency environment."""
    if status.state == "none":
        return "none (the skill declares no Python packages)"
    declared = ", ".join(status.declaration.python)
    if status.state == "ready":
        return (f"ready: {len(status.info.packages)} packages, {size(status.info.size_bytes)} "
                f"({', '.join(status.info.packages)}); key {status.info.key[:12]}")
    if status.state == "invalid":
        return f"invalid: {status.message}"
    detail = f": {status.message.splitlines()[-1]}" if status.message else ""
    return f"{status.state} ({declared}){detail}; build it with `skillrun skills prepare {name}`"
