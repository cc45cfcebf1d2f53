"""Skill dependency environments: what a warm run, a cold build and disk cost, each against a baseline measured in
the same run.

* warm       a warm local run of a skill whose script imports two real packages from its environment, against
             the same run of a skill without dependencies whose script imports nothing, plus what the two imports
             cost bare (the environment's python importing them directly, minus python starting): the run's own
             overhead for having an environment. Target: at most 1.2x.
* build      building the environment cold (resolve to a lock while the install's folder is readied, then install
             the lock; each step in the build sandbox, through the egress proxy), against `uv venv` + `uv pip
             install --compile-bytecode` of the same requirements by hand into a fresh folder: the issue's
             baseline, which makes no lock. Target: at most 1.1x. `locked` is the same work as the build's done by
             hand, one command after the other and unsandboxed (`uv pip compile --generate-hashes`, `uv venv`,
             `uv pip sync --require-hashes --compile-bytecode`): the build's ratio to it is what isolation costs.
             All with an empty uv cache, in turn, the same index.
* again      a second library version with the same requirements: its preparation, and the installs it made.
* disk       ten skills with the same requirements: environments in the store and their size.

The packages come from the real index (PyPI, or SKILLRUN_ENV_INDEX_URL), so the build figures include the network.

Usage: .venv/bin/python benchmarks/skill_envs.py [--runs N] [--builds N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.figures import Recording, preformatted, publish, scratch_dir, summary_ms  # noqa: E402
from worker.contract import RunRequest, SkillRef  # noqa: E402
from worker.environments import (  # noqa: E402
    EnvironmentBuilder,
    EnvironmentStore,
    SkillEnvironments,
    build_settings,
    local_target,
)
from worker.roots.folders import remove_tree  # noqa: E402
from worker.runtimes.local.runtime import LocalWorkspaceRuntime  # noqa: E402

REQUIREMENTS = ["tabulate>=0.9", "wcwidth>=0.2"]
IMPORTS = "import tabulate, wcwidth"


def write_skill(root: Path, name: str, script: str, requirements: list[str] | None) -> None:
    folder = root / name
    (folder / "scripts").mkdir(parents=True)
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: benchmark skill {name}\n---\nRun it.\n")
    (folder / "scripts" / "go.py").write_text(script)
    if requirements:
        (folder / "requirements.txt").write_text("\n".join(requirements) + "\n")


def environments(store: Path) -> SkillEnvironments:
    sandboxed = os.geteuid() == 0
    return SkillEnvironments(EnvironmentBuilder(EnvironmentStore(store), build_settings(sandboxed=sandboxed)),
                             local_target)


def uv_binary() -> str:
    import uv

    return uv.find_uv_bin()


def by_hand(folder: Path, settings_env: dict[str, str], *, locked: bool) -> float:
    """`uv venv` + `uv pip install` of the requirements into a fresh folder with an empty cache, or (``locked``)
    the build's work: a hash-pinned lock, the environment, the lock installed; seconds."""
    env = {**os.environ, **settings_env, "UV_CACHE_DIR": str(folder / "cache"), "UV_NO_PROGRESS": "1"}
    python, uv = local_target().python, uv_binary()
    folder.mkdir(parents=True)
    (folder / "requirements.in").write_text("\n".join(REQUIREMENTS) + "\n")
    started = time.perf_counter()
    if locked:
        subprocess.run([uv, "pip", "compile", "--quiet", "--python", python, "--generate-hashes", "--output-file",
                        "lock.txt", "requirements.in"], check=True, env=env, cwd=folder)
    subprocess.run([uv, "venv", "--quiet", "--python", python, "env"], check=True, env=env, cwd=folder)
    install = ["sync", "--require-hashes", "lock.txt"] if locked else ["install", *REQUIREMENTS]
    subprocess.run([uv, "pip", install[0], "--quiet", "--compile-bytecode", "--python", "env/bin/python",
                    *install[1:]], check=True, env=env, cwd=folder)
    return time.perf_counter() - started


async def cold_build(store: Path, skill_dir: Path) -> float:
    envs = environments(store)
    started = time.perf_counter()
    status = await envs.prepare(skill_dir, skill_dir.parent, skill_dir.name)
    elapsed = time.perf_counter() - started
    envs.close()
    if status.state != "ready":
        raise SystemExit(f"the build failed: {status.message}")
    return elapsed


def bare_imports(python: str, runs: int) -> tuple[float, float]:
    """Median seconds of `python -c IMPORTS` and of `python -c pass`, interleaved."""
    imports, empty = [], []
    for _ in range(runs):
        for command, samples in ((IMPORTS, imports), ("pass", empty)):
            started = time.perf_counter()
            subprocess.run([python, "-c", command], check=True)
            samples.append(time.perf_counter() - started)
    return summary_ms(imports)[0] / 1000, summary_ms(empty)[0] / 1000


def row(name: str, median: float, p95: float, ratio: float) -> str:
    return f"{name:<10}  {median:10.2f}  {p95:10.2f}  {ratio:8.3g}x"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--builds", type=int, default=3)
    args = parser.parse_args()
    scratch = scratch_dir("skillrun-bench-envs-")
    try:
        library = scratch / "library"
        write_skill(library, "with-deps", f"{IMPORTS}\nprint('ok')\n", REQUIREMENTS)
        write_skill(library, "without", "print('ok')\n", None)
        settings = build_settings(sandboxed=os.geteuid() == 0)
        hand_env = {"UV_DEFAULT_INDEX": settings.index_url} if settings.index_url else {}
        if settings.ca_bundle:
            hand_env["SSL_CERT_FILE"] = settings.ca_bundle

        cold: dict[str, list[float]] = {"build": [], "hand": [], "locked": []}
        for attempt in range(args.builds):
            kinds = list(cold)
            for kind in kinds[attempt % 3:] + kinds[:attempt % 3]:  # each first in turn
                where = scratch / f"{kind}-{attempt}"
                if kind == "build":
                    cold[kind].append(await cold_build(where, library / "with-deps"))
                else:
                    cold[kind].append(by_hand(where, hand_env, locked=kind == "locked"))
                remove_tree(where)

        store = scratch / "store"
        envs = environments(store)
        ready = await envs.prepare(library / "with-deps", library, "with-deps")
        second = scratch / "library-v2"
        write_skill(second, "with-deps", f"{IMPORTS}\nprint('ok, version 2')\n", REQUIREMENTS)
        started = time.perf_counter()
        again = await envs.prepare(second / "with-deps", second, "with-deps")
        again_s = time.perf_counter() - started
        installs = len(EnvironmentStore(store).list()) - 1

        ten = scratch / "ten"
        for number in range(10):
            write_skill(ten, f"skill-{number}", f"{IMPORTS}\n", REQUIREMENTS)
            await envs.prepare(ten / f"skill-{number}", ten, f"skill-{number}")
        held = EnvironmentStore(store).list()

        runtime = LocalWorkspaceRuntime(scratch / "work", environments=envs)
        with_deps = SkillRef(name="with-deps", root=str(library), path="with-deps")
        without = SkillRef(name="without", root=str(library), path="without")
        series: dict[str, list[float]] = {"with": [], "without": []}
        for skill, name in ((with_deps, "with"), (without, "without")):
            await runtime.run(RunRequest(skill=skill, workspace_id=name, command="python3 scripts/go.py"))
        for attempt in range(args.runs):
            pairs = [(with_deps, "with"), (without, "without")]
            for skill, name in pairs if attempt % 2 == 0 else reversed(pairs):
                await runtime.idle()
                started = time.perf_counter()
                result = await runtime.run(RunRequest(skill=skill, workspace_id=name, command="python3 scripts/go.py"))
                series[name].append(time.perf_counter() - started)
                if result.exit_code != 0:
                    raise SystemExit(result.stderr)
        await runtime.close()
        imports_s, empty_s = bare_imports(str(ready.info.path / "bin" / "python"), args.runs)
    finally:
        remove_tree(scratch)

    warm_ms = summary_ms(series["with"])
    base_ms = summary_ms(series["without"])
    import_ms = max(imports_s - empty_s, 0.0) * 1000
    build_ms, hand_ms, locked_ms = (summary_ms(cold[kind]) for kind in ("build", "hand", "locked"))
    printed = Recording()
    print(f"{'series':<10}  {'median ms':>10}  {'p95 ms':>10}  {'ratio':>9}")
    print(row("without", *base_ms, 1.0))
    print(row("imports", import_ms, import_ms, 1.0))
    print(row("warm", *warm_ms, warm_ms[0] / (base_ms[0] + import_ms)))
    print(row("by hand", *hand_ms, 1.0))
    print(row("locked", *locked_ms, locked_ms[0] / hand_ms[0]))
    print(row("build", *build_ms, build_ms[0] / hand_ms[0]))
    print(row("again", again_s * 1000, again_s * 1000, again_s * 1000 / build_ms[0]))
    print(f"\nwarm: {args.runs} runs of each; `imports` is `{IMPORTS}` bare in the environment's python "
          f"({imports_s * 1000:.1f} ms, minus {empty_s * 1000:.1f} ms for python alone); warm's ratio is to "
          "without + imports.")
    print(f"build: {args.builds} cold builds of {', '.join(REQUIREMENTS)} against as many by hand, empty caches; "
          f"`by hand` makes no lock, `locked` does the build's work unsandboxed: build/locked "
          f"{build_ms[0] / locked_ms[0]:.3g}x.")
    print(f"again: a second library version with the same requirements: {installs} install(s), same environment: "
          f"{again.info.key == ready.info.key}.")
    total = sum(info.size_bytes for info in held)
    print(f"disk: ten skills with the same requirements use {len(held)} environment(s), {total / 1024**2:.1f} MiB "
          f"(one environment: {ready.info.size_bytes / 1024**2:.1f} MiB).")
    publish("skill_envs", "Skill environments", "Packages from the real index.\n\n" + preformatted(printed.text()))


if __name__ == "__main__":
    asyncio.run(main())
