"""``skillrun skills prepare`` and ``skillrun envs list | rm | prune``: skills' dependency environments.

Environments are the local runtime's (``worker.environments``): built for the host's ``python3`` into
``SKILLRUN_ENVS_DIR`` or the work root's ``.skillrun/environments``, each build sandboxed as a run is.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from orchestrator.cli.common import repository
from orchestrator.cli.output import clip, print_json, size, table
from orchestrator.config import get_settings
from orchestrator.skills import BaseSkillRepository
from worker.environments import EnvironmentStatus, SkillEnvironments, read_manifest
from worker.errors import DependencyError
from worker.runtimes.local import LocalWorkspaceRuntime
from worker.staging import resolve_skill_paths

FAILED_STATES = ("failed", "invalid")
DAY_SECONDS = 24 * 3600


def local_runtime(args: argparse.Namespace) -> LocalWorkspaceRuntime:
    """The local runtime the CLI's runs use, whose environments these commands look after."""
    return LocalWorkspaceRuntime(getattr(args, "work_root", None) or get_settings().work_root)


def skill_paths(repo: BaseSkillRepository, name: str) -> tuple[Path, Path]:
    """The library root and folder of the skill ``name``."""
    return resolve_skill_paths(repo.skill_ref(name))


def prepare_skills(args: argparse.Namespace) -> int:
    repo = repository(args)
    names = args.names or [summary.name for summary in repo.summaries()]
    runtime = local_runtime(args)
    try:
        reports, problems = asyncio.run(_prepare(repo, runtime.environments, names, quiet=args.json))
    finally:
        asyncio.run(runtime.close())
    if args.json:
        print_json({"skills": reports, "problems": problems})
    else:
        rows = [[r["skill"], r["state"], str(len(r["packages"])) if r["packages"] else "-",
                 size(r["size_bytes"]) if r["size_bytes"] else "-", f"{r['seconds']:.1f} s",
                 clip(r["message"].splitlines()[0] if r["message"] else "", 200)] for r in reports]
        print(table(["SKILL", "STATE", "PACKAGES", "SIZE", "TIME", "MESSAGE"], rows))
        for problem in problems:
            print(f"problem: {problem}", file=sys.stderr)
        for report in reports:
            if report["state"] in FAILED_STATES:
                print(f"\n{report['skill']}: {report['message']}", file=sys.stderr)
    failed = problems or any(report["state"] in FAILED_STATES for report in reports)
    return 1 if failed else 0


async def _prepare(
    repo: BaseSkillRepository, environments: SkillEnvironments, names: list[str], *, quiet: bool
) -> tuple[list[dict], list[str]]:
    reports: list[dict] = []
    problems: list[str] = []
    by_root: dict[Path, set[str]] = {}
    located = {name: skill_paths(repo, name) for name in names}
    for name, (root, _) in located.items():
        by_root.setdefault(root, set()).add(name)
    all_names = {summary.name for summary in repo.summaries()}
    for root in by_root:
        try:
            manifest = read_manifest(root)
        except DependencyError as exc:
            problems.append(f"{root}: {exc}")
            continue
        if manifest is not None and (ghosts := manifest.unknown_skills(all_names)):
            problems.append(f"{root}/skillrun.toml names skills that do not exist: {', '.join(ghosts)}")
    for number, (name, (root, source)) in enumerate(located.items(), start=1):
        def progress(message: str, name: str = name, number: int = number) -> None:
            if not quiet:
                print(f"[{number}/{len(located)}] {name}: {message}", file=sys.stderr, flush=True)

        started = time.monotonic()
        status = environments.status(source, root, name)
        if status.state not in ("ready", "none", "invalid"):
            status = await environments.prepare(source, root, name, progress)
        reports.append({"skill": name, **status.as_json(), "seconds": round(time.monotonic() - started, 3)})
    return reports, problems


def environment_status(args: argparse.Namespace, repo: BaseSkillRepository, name: str) -> EnvironmentStatus:
    """What ``skills show`` says of a skill's environment (no build)."""
    runtime = local_runtime(args)
    try:
        root, source = skill_paths(repo, name)
        return runtime.environments.status(source, root, name)
    finally:
        asyncio.run(runtime.close())


def list_environments(args: argparse.Namespace) -> int:
    runtime = local_runtime(args)
    infos = runtime.environments.store.list()
    asyncio.run(runtime.close())
    if args.json:
        print_json({"store": str(runtime.environments.store.root), "environments": [i.as_json() for i in infos]})
        return 0
    if not infos:
        print(f"no environments in {runtime.environments.store.root}")
        return 0
    now = time.time()
    rows = [[info.key[:12], size(info.size_bytes), str(len(info.packages)), _age(now - info.last_used),
             clip(", ".join(info.requirements), 80)] for info in infos]
    print(table(["KEY", "SIZE", "PACKAGES", "LAST USED", "REQUIREMENTS"], rows))
    print(f"{len(infos)} environment(s), {size(sum(i.size_bytes for i in infos))} in {runtime.environments.store.root}")
    return 0


def remove_environment(args: argparse.Namespace) -> int:
    runtime = local_runtime(args)
    store = runtime.environments.store
    asyncio.run(runtime.close())
    matches = [info for info in store.list() if info.key.startswith(args.key)]
    if len(matches) != 1:
        found = "no environment" if not matches else f"{len(matches)} environments"
        print(f"skillrun: error: {found} with a key starting {args.key!r} (see `skillrun envs list`)", file=sys.stderr)
        return 2
    store.remove(matches[0].key)
    print(f"removed {matches[0].key} ({size(matches[0].size_bytes)})")
    return 0


def prune_environments(args: argparse.Namespace) -> int:
    if args.unused_days < 0:
        print("skillrun: error: --unused-days must be 0 or more", file=sys.stderr)
        return 2
    runtime = local_runtime(args)
    store = runtime.environments.store
    asyncio.run(runtime.close())
    cutoff = time.time() - args.unused_days * DAY_SECONDS
    stale = [info for info in store.list() if info.last_used < cutoff]
    for info in stale:
        if not args.dry_run:
            store.remove(info.key)
    verb = "would remove" if args.dry_run else "removed"
    if args.json:
        print_json({verb.replace(" ", "_"): [info.key for info in stale],
                    "bytes": sum(info.size_bytes for info in stale)})
    else:
        print(f"{verb} {len(stale)} environment(s) unused for {args.unused_days:g} day(s), "
              f"{size(sum(info.size_bytes for info in stale))}")
    return 0


def _age(seconds: float) -> str:
    for unit, length in (("d", DAY_SECONDS), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{seconds / length:.0f} {unit} ago"
    return "just now"
