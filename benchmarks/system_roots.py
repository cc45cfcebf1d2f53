"""The local runtime's root filesystems for skills' Debian packages: what building one and running in it cost, each
against a baseline measured in the same run.

* build      `skillrun skills prepare`'s work for a skill declaring Debian packages on the default local runtime
             (the root filesystem built, its downloads cache empty), against the same build by hand into a fresh
             folder with an empty cache: `debootstrap` of the same release, variant and base, then `apt-get
             install` of the packages in it (the way that works for every set: debootstrap's own --include cannot
             configure large ones such as Chromium's): what the build's isolation, measuring and publishing cost.
             Target: at most 1.2x.
* again      a second skill declaring the same packages: its preparation (no build).
* warm       a warm run of the skill in its root filesystem, against the same run of a skill without Debian
             packages on the host's /usr, interleaved, each in a workspace of its own. Target: at most 1.2x.

Needs root and debootstrap; the packages come from the Debian archive (SKILLRUN_ENV_DEBIAN_MIRROR), so the build
figures include the network.

Usage: .venv/bin/python benchmarks/system_roots.py [--runs N] [--builds N] [--packages figlet,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.figures import Recording, preformatted, publish, scratch_dir, summary_ms  # noqa: E402
from benchmarks.skill_envs import warm_series  # noqa: E402
from worker.environments import EnvironmentStore, build_settings  # noqa: E402
from worker.environments.systems import BASE_PACKAGES, SystemRoots, why_not_buildable  # noqa: E402
from worker.roots.folders import remove_tree  # noqa: E402
from worker.runtimes.local.runtime import LocalWorkspaceRuntime  # noqa: E402

COMMAND = "python3 scripts/go.py"


def write_library(root: Path, packages: list[str]) -> None:
    for name in ("with-root", "same-root", "on-host"):
        folder = root / name
        (folder / "scripts").mkdir(parents=True)
        (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: benchmark skill {name}\n---\nRun it.\n")
        (folder / "scripts" / "go.py").write_text("print('ok')\n")
    declared = json.dumps(packages)
    (root / "skillrun.toml").write_text(f"[skills.with-root]\ndebian = {declared}\n"
                                        f"[skills.same-root]\ndebian = {declared}\n")


def by_hand(folder: Path, suite: str, mirror: str, packages: list[str]) -> float:
    """`debootstrap` of the base, then `apt-get install` of the packages in it, into a fresh folder with an empty
    cache; seconds."""
    (folder / "debs").mkdir(parents=True)
    root = folder / "root"
    started = time.perf_counter()
    subprocess.run(["debootstrap", "--variant=minbase", f"--cache-dir={folder / 'debs'}",
                    f"--include={','.join(BASE_PACKAGES)}", suite, str(root), mirror],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    'mount -t proc proc "$0/proc" && chroot "$0" apt-get -q update && chroot "$0" env '
                    'DEBIAN_FRONTEND=noninteractive apt-get -q install -y --no-install-recommends -- "$@"',
                    str(root), *packages], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


async def prepared(work: Path, library: Path, name: str) -> tuple[float, LocalWorkspaceRuntime]:
    """A default local runtime on ``work`` and the seconds it took to prepare ``name``."""
    runtime = LocalWorkspaceRuntime(work)
    started = time.perf_counter()
    status = await runtime.prepare_environment(library / name, library, name)
    elapsed = time.perf_counter() - started
    if status.state != "ready":
        raise SystemExit(f"the preparation of {name} failed: {status.message}")
    return elapsed, runtime



def row(name: str, median: float, p95: float, ratio: float) -> str:
    return f"{name:<10}  {median:10.2f}  {p95:10.2f}  {ratio:8.3g}x"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--builds", type=int, default=1)
    parser.add_argument("--packages", default="figlet")
    args = parser.parse_args()
    problem = why_not_buildable()
    if problem:
        raise SystemExit(problem)
    packages = args.packages.split(",")
    scratch = scratch_dir("skillrun-bench-systems-")
    release = SystemRoots(EnvironmentStore(scratch / "unused"), build_settings(sandboxed=True))  # what builds use
    try:
        library = scratch / "library"
        write_library(library, packages)
        cold: dict[str, list[float]] = {"build": [], "hand": []}
        runtime: LocalWorkspaceRuntime | None = None
        for attempt in range(args.builds):
            for kind in ("build", "hand") if attempt % 2 == 0 else ("hand", "build"):
                where = scratch / f"{kind}-{attempt}"
                if kind == "hand":
                    cold[kind].append(by_hand(where, release.suite, release.mirror, packages))
                    remove_tree(where)
                    continue
                if runtime is not None:
                    await runtime.close()
                    remove_tree(scratch / "work")
                elapsed, runtime = await prepared(scratch / "work", library, "with-root")
                cold[kind].append(elapsed)
        assert runtime is not None
        started = time.perf_counter()
        again = await runtime.prepare_environment(library / "same-root", library, "same-root")
        again_s = time.perf_counter() - started
        same = again.image.tag == runtime.environment_status(library / "with-root", library, "with-root").image.tag
        [built] = runtime.environments.systems.list()
        series = await warm_series(runtime, library, (("with-root", "with-root"), ("on-host", "on-host")), COMMAND,
                                   args.runs)
        await runtime.close()
    finally:
        remove_tree(scratch)

    build_ms, hand_ms = summary_ms(cold["build"]), summary_ms(cold["hand"])
    host_ms, root_ms = summary_ms(series["on-host"]), summary_ms(series["with-root"])
    printed = Recording()
    print(f"{'series':<10}  {'median ms':>10}  {'p95 ms':>10}  {'ratio':>9}")
    print(row("by hand", *hand_ms, 1.0))
    print(row("build", *build_ms, build_ms[0] / hand_ms[0]))
    print(row("again", again_s * 1000, again_s * 1000, again_s * 1000 / build_ms[0]))
    print(row("host warm", *host_ms, 1.0))
    print(row("root warm", *root_ms, root_ms[0] / host_ms[0]))
    print(f"\nbuild: {args.builds} cold build(s) of a root filesystem with {', '.join(packages)} (and the base: "
          f"{', '.join(BASE_PACKAGES)}), {built.size_bytes / 1024**2:.0f} MiB, against as many builds (debootstrap, apt-get) by "
          f"hand, empty caches; again: a second skill with the same packages, same root: {same}.")
    print(f"warm: {args.runs} runs of each, `{COMMAND}`, in the root filesystem and on the host's /usr.")
    publish("system_roots", "Root filesystems for Debian packages (local runtime)",
            "Packages from the Debian archive.\n\n" + preformatted(printed.text()))


if __name__ == "__main__":
    asyncio.run(main())
