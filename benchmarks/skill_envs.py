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
* node warm  a warm local run of a skill whose script requires two npm packages from its Node environment, against
             the same run of a skill without them plus what the two requires cost bare (`node -e` with NODE_PATH,
             minus node starting). Target: at most 1.2x.
* node build building the Node environment cold (`npm install` in the build sandbox, through the egress proxy),
             against `npm install --omit=dev` of the same package.json by hand into a fresh folder, both with an
             empty npm cache, in turn, the same registry. Target: at most 1.2x.

The packages come from the real index and registry (PyPI and npm, or SKILLRUN_ENV_INDEX_URL and
SKILLRUN_ENV_NPM_REGISTRY), so the build figures include the network.

Usage: .venv/bin/python benchmarks/skill_envs.py [--runs N] [--builds N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
NODE_PACKAGES = {"docx": "^9.5.0", "fflate": "^0.8.2"}
REQUIRES = "require('docx'); require('fflate')"


def write_skill(root: Path, name: str, script: str, requirements: list[str] | None) -> None:
    folder = root / name
    (folder / "scripts").mkdir(parents=True)
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: benchmark skill {name}\n---\nRun it.\n")
    (folder / "scripts" / "go.py").write_text(script)
    if requirements:
        (folder / "requirements.txt").write_text("\n".join(requirements) + "\n")


def write_node_skill(root: Path, name: str, script: str, packages: dict[str, str] | None) -> None:
    folder = root / name
    (folder / "scripts").mkdir(parents=True)
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: benchmark skill {name}\n---\nRun it.\n")
    (folder / "scripts" / "go.js").write_text(script)
    if packages:
        (folder / "package.json").write_text(json.dumps({"name": name, "private": True, "dependencies": packages}))


def npm_by_hand(folder: Path, settings_env: dict[str, str]) -> float:
    """`npm install --omit=dev` of the package.json into a fresh folder with an empty cache; seconds."""
    folder.mkdir(parents=True)
    (folder / "package.json").write_text(json.dumps({"name": "by-hand", "private": True,
                                                     "dependencies": NODE_PACKAGES}))
    env = {**os.environ, **settings_env, "npm_config_cache": str(folder / "cache")}
    started = time.perf_counter()
    subprocess.run(["npm", "install", "--omit=dev", "--no-audit", "--no-fund", "--loglevel=error"], check=True,
                   env=env, cwd=folder, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def bare_requires(node_modules: Path, runs: int) -> tuple[float, float]:
    """Median seconds of `node -e REQUIRES` (NODE_PATH set) and of `node -e 0`, interleaved."""
    env = {**os.environ, "NODE_PATH": str(node_modules)}
    requires, empty = [], []
    for _ in range(runs):
        for command, samples in ((REQUIRES, requires), ("0", empty)):
            started = time.perf_counter()
            subprocess.run(["node", "-e", command], check=True, env=env)
            samples.append(time.perf_counter() - started)
    return summary_ms(requires)[0] / 1000, summary_ms(empty)[0] / 1000


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


async def warm_series(runtime: LocalWorkspaceRuntime, library: Path, skills: tuple[tuple[str, str], ...],
                      command: str, runs: int) -> dict[str, list[float]]:
    """Seconds of ``runs`` warm runs of each skill (each in a workspace of its own, one run first), interleaved."""
    refs = [(SkillRef(name=name, root=str(library), path=name), label) for name, label in skills]
    series: dict[str, list[float]] = {label: [] for _, label in refs}
    for skill, label in refs:
        await runtime.run(RunRequest(skill=skill, workspace_id=label, command=command))
    for attempt in range(runs):
        for skill, label in refs if attempt % 2 == 0 else reversed(refs):
            await runtime.idle()
            started = time.perf_counter()
            result = await runtime.run(RunRequest(skill=skill, workspace_id=label, command=command))
            series[label].append(time.perf_counter() - started)
            if result.exit_code != 0:
                raise SystemExit(result.stderr)
    return series


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

        write_node_skill(library, "node-deps", f"{REQUIRES};\nconsole.log('ok')\n", NODE_PACKAGES)
        write_node_skill(library, "node-without", "console.log('ok')\n", None)
        npm_env = {"npm_config_registry": settings.npm_registry}
        if settings.ca_bundle:
            npm_env["NODE_EXTRA_CA_CERTS"] = settings.ca_bundle
        node_cold: dict[str, list[float]] = {"build": [], "hand": []}
        for attempt in range(args.builds):
            for kind in ("build", "hand") if attempt % 2 == 0 else ("hand", "build"):
                where = scratch / f"node-{kind}-{attempt}"
                if kind == "build":
                    node_cold[kind].append(await cold_build(where, library / "node-deps"))
                else:
                    node_cold[kind].append(npm_by_hand(where, npm_env))
                remove_tree(where)

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

        node_ready = await envs.prepare(library / "node-deps", library, "node-deps")
        runtime = LocalWorkspaceRuntime(scratch / "work", environments=envs)
        series = await warm_series(runtime, library, (("with-deps", "with"), ("without", "without")),
                                   "python3 scripts/go.py", args.runs)
        node_series = await warm_series(runtime, library, (("node-deps", "node"), ("node-without", "node-without")),
                                        "node scripts/go.js", args.runs)
        await runtime.close()
        imports_s, empty_s = bare_imports(str(ready.info.path / "bin" / "python"), args.runs)
        requires_s, node_empty_s = bare_requires(node_ready.node.info.path / "node_modules", args.runs)
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
    node_base_ms, node_warm_ms = summary_ms(node_series["node-without"]), summary_ms(node_series["node"])
    require_ms = max(requires_s - node_empty_s, 0.0) * 1000
    node_build_ms, npm_hand_ms = summary_ms(node_cold["build"]), summary_ms(node_cold["hand"])
    print(row("node bare", *node_base_ms, 1.0))
    print(row("requires", require_ms, require_ms, 1.0))
    print(row("node warm", *node_warm_ms, node_warm_ms[0] / (node_base_ms[0] + require_ms)))
    print(row("npm hand", *npm_hand_ms, 1.0))
    print(row("node build", *node_build_ms, node_build_ms[0] / npm_hand_ms[0]))
    print(f"\nwarm: {args.runs} runs of each; `imports` is `{IMPORTS}` bare in the environment's python "
          f"({imports_s * 1000:.1f} ms, minus {empty_s * 1000:.1f} ms for python alone); warm's ratio is to "
          "without + imports.")
    print(f"build: {args.builds} cold builds of {', '.join(REQUIREMENTS)} against as many by hand, empty caches; "
          f"`by hand` makes no lock, `locked` does the build's work unsandboxed: build/locked "
          f"{build_ms[0] / locked_ms[0]:.3g}x.")
    print(f"again: a second library version with the same requirements: {installs} install(s), same environment: "
          f"{again.info.key == ready.info.key}.")
    print(f"node: {args.runs} warm runs of each, `{REQUIRES}` bare {requires_s * 1000:.1f} ms (minus "
          f"{node_empty_s * 1000:.1f} ms for node alone); {args.builds} cold builds of "
          f"{', '.join(f'{k}@{v}' for k, v in NODE_PACKAGES.items())} ({len(node_ready.node.info.packages)} packages) "
          "against as many `npm install --omit=dev` by hand, empty caches.")
    total = sum(info.size_bytes for info in held if info.kind == "python")
    print(f"disk: ten skills with the same requirements use {len([i for i in held if i.kind == 'python'])} environment(s), {total / 1024**2:.1f} MiB "
          f"(one environment: {ready.info.size_bytes / 1024**2:.1f} MiB).")
    publish("skill_envs", "Skill environments", "Packages from the real index and npm registry.\n\n"
            + preformatted(printed.text()))


if __name__ == "__main__":
    asyncio.run(main())
