"""``skillrun skills prepare`` and ``skillrun envs list | rm | prune``: skills' dependency environments.

Environments live in ``SKILLRUN_ENVS_DIR`` or the work root's ``.skillrun/environments``: the local runtime's,
built for the host's ``python3``, and the Docker runtime's, built for the sandbox image's (their targets say which).
``skillrun skills prepare --runtime local|docker`` builds one runtime's (default local: the orchestrator's settings
name no default runtime, and a run's is local unless it says otherwise) through the runtime itself
(``prepare_environment``: for Docker, the environment and the derived image of the skill's Debian packages), as
library registration and the workers' preparation job do. ``envs list`` and ``envs prune`` also show and remove the
Docker runtime's derived images (the sandbox image plus a skill's Debian packages) where a Docker engine answers,
and the local runtime's root filesystems for skills' Debian packages (``worker.environments.systems``); ``envs rm``
takes an environment's key or a root's digest; ``envs prune`` also removes the store's records no environment needs any more (``EnvironmentStore.prune_records``,
``sweep``) and empties the Debian packages root filesystem builds downloaded.
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
from worker.config import get_worker_settings
from worker.environments import (
    Declaration,
    EnvironmentStatus,
    SkillEnvironments,
    read_manifest,
)
from worker.errors import DependencyError, WorkerError
from worker.runtimes import HostWorkspaceRuntime, LocalWorkspaceRuntime, resolve_runtime
from worker.workspaces import resolve_skill_paths

FAILED_STATES = ("failed", "invalid")
DAY_SECONDS = 24 * 3600


def local_runtime(args: argparse.Namespace) -> LocalWorkspaceRuntime:
    """The local runtime the CLI's runs use, whose environments these commands look after."""
    return LocalWorkspaceRuntime(getattr(args, "work_root", None) or get_settings().work_root)


def host_runtime(args: argparse.Namespace) -> HostWorkspaceRuntime:
    """The runtime ``--runtime`` names, with the CLI's work root: its environments, built as its runs need them."""
    return resolve_runtime(args.runtime, work_root=args.work_root or get_settings().work_root)


def skill_paths(repo: BaseSkillRepository, name: str) -> tuple[Path, Path]:
    """The library root and folder of the skill ``name``."""
    return resolve_skill_paths(repo.skill_ref(name))


def prepare_skills(args: argparse.Namespace) -> int:
    repo = repository(args)
    names = args.names or [summary.name for summary in repo.summaries()]
    every = not args.names
    runtime = host_runtime(args)
    try:
        reports, problems = asyncio.run(_prepare(repo, runtime, names, quiet=args.json, every=every))
    finally:
        asyncio.run(runtime.close())
    if args.json:
        print_json({"runtime": runtime.name.value, "skills": reports, "problems": problems})
    else:
        rows = [[r["skill"], r["state"], str(len(r["packages"])) if r["packages"] else "-",
                 size(r["size_bytes"]) if r["size_bytes"] else "-", _image(r["image"]), f"{r['seconds']:.1f} s",
                 clip(r["message"].splitlines()[0] if r["message"] else "", 200)] for r in reports]
        print(table(["SKILL", "STATE", "PACKAGES", "SIZE", "DEBIAN IMAGE", "TIME", "MESSAGE"], rows))
        for problem in problems:
            print(f"problem: {problem}", file=sys.stderr)
        for report in reports:
            if report["state"] in FAILED_STATES:
                print(f"\n{report['skill']}: {report['message']}", file=sys.stderr)
    failed = problems or any(report["state"] in FAILED_STATES for report in reports)
    return 1 if failed else 0


async def _prepare(
    repo: BaseSkillRepository, runtime: HostWorkspaceRuntime, names: list[str], *, quiet: bool, every: bool
) -> tuple[list[dict], list[str]]:
    """Prepare ``names`` (``every``: the whole library, whose refused skills the manifest names are problems too)."""
    reports: list[dict] = []
    problems: list[str] = []
    by_root: dict[Path, set[str]] = {}
    located = {name: skill_paths(repo, name) for name in names}
    for name, (root, _) in located.items():
        by_root.setdefault(root, set()).add(name)
    refused = repo.refused()
    all_names = {summary.name for summary in repo.summaries()} | set(refused)
    for root in by_root:
        try:
            manifest = read_manifest(root)
        except DependencyError as exc:
            problems.append(f"{root}: {exc}")
            continue
        if manifest is not None and (ghosts := manifest.unknown_skills(all_names)):
            problems.append(f"{root}/skillrun.toml names skills that do not exist: {', '.join(ghosts)}")
        for name in sorted(set(manifest.skills if manifest is not None and every else ()) & set(refused)):
            problems.append(f"{root}/skillrun.toml names {name!r}, which cannot be used: {refused[name]}")
    for number, (name, (root, source)) in enumerate(located.items(), start=1):
        def progress(message: str, name: str = name, number: int = number) -> None:
            if not quiet:
                print(f"[{number}/{len(located)}] {name}: {message}", file=sys.stderr, flush=True)

        started = time.monotonic()
        try:
            status = await asyncio.to_thread(runtime.environment_status, source, root, name)
            if status.state not in ("ready", "none", "invalid"):
                status = await runtime.prepare_environment(source, root, name, progress)
        except WorkerError as exc:  # the runtime cannot be used (no engine, no python3 in its image): say so
            status = EnvironmentStatus("failed", _declaration(runtime, source, root, name),
                                       message=f"the {runtime.name.value} runtime cannot prepare it: {exc}")
        reports.append({"skill": name, **status.as_json(), "seconds": round(time.monotonic() - started, 3)})
    return reports, problems


def _declaration(runtime: HostWorkspaceRuntime, source: Path, root: Path, name: str) -> Declaration:
    """What the skill declares (nothing, if that cannot be read either)."""
    try:
        return runtime.environments.declaration(source, root, name)
    except DependencyError:
        return Declaration()


def environment_status(args: argparse.Namespace, repo: BaseSkillRepository, name: str) -> EnvironmentStatus:
    """What ``skills show`` says of a skill's environment on ``--runtime`` (no build); ``WorkerError`` when that
    runtime cannot be asked (no Docker SDK or engine)."""
    runtime = host_runtime(args)
    try:
        root, source = skill_paths(repo, name)
        return runtime.environment_status(source, root, name)
    finally:
        asyncio.run(runtime.close())


def derived_images(environments: SkillEnvironments):  # noqa: ANN201 - DerivedImages, an optional dependency's
    """The Docker runtime's derived images, whose last use is kept in ``environments``' store; ``None`` without
    the Docker SDK or an engine that answers."""
    try:
        import docker

        from worker.runtimes import DerivedImages
    except ImportError:
        return None
    try:
        client = docker.from_env(timeout=10)
    except docker.errors.DockerException:
        return None
    return DerivedImages(lambda: client, environments.store, environments.builder.settings)


def list_environments(args: argparse.Namespace) -> int:
    runtime = local_runtime(args)
    store = runtime.environments.store
    infos = store.list()
    roots = runtime.environments.systems.list() if runtime.environments.systems is not None else []
    images = derived_images(runtime.environments)
    images_found = images.list() if images is not None else None
    asyncio.run(runtime.close())
    if args.json:
        print_json({"store": str(store.root), "environments": [i.as_json() for i in infos],
                    "root_filesystems": [r.as_json() for r in roots],
                    "images": [i.as_json() for i in images_found] if images_found is not None else None})
        return 0
    now = time.time()
    if not infos:
        print(f"no environments in {store.root}")
    else:
        rows = [[info.key[:12], size(info.size_bytes), str(len(info.packages)), _age(now - info.last_used),
                 clip(info.target.split(":")[0], 10), clip(", ".join(info.requirements), 80)] for info in infos]
        print(table(["KEY", "SIZE", "PACKAGES", "LAST USED", "RUNTIME", "REQUIREMENTS"], rows))
        print(f"{len(infos)} environment(s), {size(sum(i.size_bytes for i in infos))} in {store.root}")
    if roots:
        rows = [[root.digest[:12], size(root.size_bytes), root.suite, _age(now - root.last_used),
                 clip(", ".join(root.packages), 80)] for root in roots]
        print()
        print(table(["ROOT", "SIZE", "RELEASE", "LAST USED", "DEBIAN PACKAGES"], rows))
        print(f"{len(roots)} root filesystem(s) of the local runtime, {size(sum(r.size_bytes for r in roots))}")
    if images_found is None:
        print("derived Docker images: not listed (no Docker engine answers)")
    elif images_found:
        rows = [[image.tag.rsplit(":", 1)[1][:12], size(image.size_bytes), str(image.containers),
                 _image_use(image, now), clip(", ".join(image.packages), 80)] for image in images_found]
        print()
        print(table(["IMAGE", "SIZE", "CONTAINERS", "LAST USED", "DEBIAN PACKAGES"], rows))
        print(f"{len(images_found)} derived Docker image(s), {size(sum(i.size_bytes for i in images_found))}")
    return 0


def remove_environment(args: argparse.Namespace) -> int:
    runtime = local_runtime(args)
    store, systems = runtime.environments.store, runtime.environments.systems
    asyncio.run(runtime.close())
    matches = [(info.key, info.size_bytes, store.remove) for info in store.list() if info.key.startswith(args.key)]
    matches += [(root.digest, root.size_bytes, systems.remove) for root in (systems.list() if systems else ())
                if root.digest.startswith(args.key)]
    if len(matches) != 1:
        found = "no environment or root filesystem" if not matches else f"{len(matches)} environments or roots"
        print(f"skillrun: error: {found} with a key starting {args.key!r} (see `skillrun envs list`)", file=sys.stderr)
        return 2
    key, size_bytes, remove = matches[0]
    remove(key)
    print(f"removed {key} ({size(size_bytes)})")
    return 0


def prune_environments(args: argparse.Namespace) -> int:
    if args.unused_days < 0:
        print("skillrun: error: --unused-days must be 0 or more", file=sys.stderr)
        return 2
    runtime = local_runtime(args)
    store, systems = runtime.environments.store, runtime.environments.systems
    images = derived_images(runtime.environments)
    asyncio.run(runtime.close())
    now = time.time()
    cutoff = now - args.unused_days * DAY_SECONDS
    stale = [info for info in store.list() if info.last_used < cutoff]
    stale_roots = [root for root in systems.list() if root.last_used < cutoff] if systems else []
    stale_images = [i for i in images.list() if not i.containers and (i.last_used or now) < cutoff] if images else []
    records: list[str] = []
    downloads = systems.downloads_bytes() if systems else 0
    if not args.dry_run:
        for info in stale:
            store.remove(info.key)
        for image in stale_images:
            images.remove(image)
        for root in stale_roots:
            systems.remove(root.digest)
        if systems:
            downloads = asyncio.run(systems.empty_downloads())
        records = store.prune_records(cutoff)
        store.sweep(get_worker_settings().env_build_timeout_seconds)
    verb = "would remove" if args.dry_run else "removed"
    freed = sum(item.size_bytes for item in (*stale, *stale_roots, *stale_images)) + downloads
    if args.json:
        print_json({verb.replace(" ", "_"): [info.key for info in stale],
                    f"{verb.replace(' ', '_')}_images": [image.tag for image in stale_images],
                    f"{verb.replace(' ', '_')}_root_filesystems": [root.digest for root in stale_roots],
                    "removed_records": records, "downloads_bytes": downloads, "bytes": freed})
    else:
        print(f"{verb} {len(stale)} environment(s), {len(stale_roots)} root filesystem(s) and {len(stale_images)} "
              "derived Docker image(s) unused for "
              f"{args.unused_days:g} day(s), {size(freed)}" + (f" with {size(downloads)} of downloaded Debian packages"
                                                                 if downloads else "")
              + (f"; {len(records)} old lock or failure record(s)" if records else ""))
    return 0


def _image(image: dict | None) -> str:
    return "-" if image is None else f"{image['state']} ({', '.join(image['packages'])})"


def _image_use(image, now: float) -> str:  # noqa: ANN001 - a DerivedImage
    if image.containers:
        return "in use"
    return _age(now - image.last_used) if image.last_used is not None else "not recorded here"


def _age(seconds: float) -> str:
    for unit, length in (("d", DAY_SECONDS), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{seconds / length:.0f} {unit} ago"
    return "just now"
