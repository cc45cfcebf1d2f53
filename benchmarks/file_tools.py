"""File tools: ``Read``, ``Write`` and ``Bash`` in workspace mode (``WorkspaceFileToolSet``: one run each in the
session's workspace, through ``skill_run``'s dispatcher) against the same call in host mode (``FileToolSet(cwd=...)``),
in one process, interleaved, each series going first in turn and background housekeeping awaited between calls (not
timed). The figure that matters is each workspace series' ratio to the host series of the same tool.

Each call goes through the tool's ``run_async``, as an agent's call does: a 4 KiB file read, 4 KiB written, and
``echo hello``. Host mode's Read and Write are in-process file operations (a thread hop), its Bash a subprocess.
In workspace mode Read and Write of a plain path are file operations too, made by the dispatcher as the workspace's
user (its fast path: no run, ``worker.runtimes.host_files``), and Bash is a run (a sandboxed process, in the
workspace's ready shell).

With ``--all``, also Edit, Grep and Glob (in the workspace they run the operations module: ``python3`` in the sandbox).

Usage: .venv/bin/python benchmarks/file_tools.py [--runs N] [--docker] [--all]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.figures import markdown_table, publish, scratch_dir, summary_ms  # noqa: E402
from orchestrator.context import InvocationContext  # noqa: E402
from orchestrator.sessions import Session  # noqa: E402
from orchestrator.skills import SkillToolSet, create_default_skill_repository  # noqa: E402
from orchestrator.tools.file_tools import FileToolSet, WorkspaceFileToolSet  # noqa: E402
from worker.runtimes.local.runtime import LocalWorkspaceRuntime  # noqa: E402

LIBRARY = Path(__file__).resolve().parent.parent / "skills"
CONTENT = ("0123456789abcdef" * 4 + "\n") * 63  # 4 KiB less a little
CALLS = {
    "Read": {"path": "work/data.txt"},
    "Write": {"path": "work/written.txt", "content": CONTENT},
    "Bash": {"command": "echo hello"},
}
MORE_CALLS = {  # with --all: the tools that run the operations module in the workspace
    "Edit": {"path": "work/edited.txt", "old_string": "0123", "new_string": "3210"},
    "Grep": {"pattern": "abcdef$", "path": "work/data.txt", "max_results": 5},
    "Glob": {"pattern": "**/*.{txt,md}"},
}


async def tools_of(tool_set) -> dict:
    return {t.name: t for t in await tool_set.get_tools()}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--docker", action="store_true", help="also the Docker runtime (needs an engine and the image)")
    parser.add_argument("--all", action="store_true", help="also Edit, Grep and Glob")
    args = parser.parse_args()
    calls = {**CALLS, **(MORE_CALLS if args.all else {})}

    scratch = scratch_dir("skillrun-bench-files-")
    (scratch / "host" / "work").mkdir(parents=True)
    (scratch / "host" / "work" / "data.txt").write_text(CONTENT)
    ctx = InvocationContext(session=Session(app_name="bench", user_id="bench", id="files"), agent=None)
    modes: dict[str, tuple[dict, object | None]] = {"host": (await tools_of(FileToolSet(cwd=scratch / "host")), None)}
    runtimes = {"local": LocalWorkspaceRuntime(scratch / "local")}
    if args.docker:
        from worker.runtimes.docker.runtime import ContainerWorkspaceRuntime
        runtimes["docker"] = ContainerWorkspaceRuntime(scratch / "docker")
    skill_sets = []
    for name, runtime in runtimes.items():
        skill_tools = SkillToolSet(create_default_skill_repository(str(LIBRARY), workspace_runtime=runtime))
        skill_sets.append(skill_tools)
        tools = await tools_of(WorkspaceFileToolSet(skill_tools))
        modes[f"workspace ({name})"] = (tools, runtime)
        await tools["Write"].run_async(tool_context=ctx, args={"path": "work/data.txt", "content": CONTENT})
    samples = {(tool, mode): [] for tool in calls for mode in modes}
    try:
        for _ in range(3):  # warm-up: spare run folders, spawners, ready shells
            for tool, call in calls.items():
                for tools, _runtime in modes.values():
                    await tools[tool].run_async(tool_context=ctx, args=call)
        order = list(modes)
        for i in range(args.runs):
            turn = order[i % len(order):] + order[:i % len(order)]
            for tool, call in calls.items():
                for mode in turn:
                    if tool == "Edit":  # one match each time: the file is put back first (not timed)
                        await modes[mode][0]["Write"].run_async(
                            tool_context=ctx, args={"path": "work/edited.txt", "content": "0123 once\n"})
                    tools, runtime = modes[mode]
                    if runtime is not None:
                        await runtime.idle()
                    started = time.perf_counter()
                    answer = await tools[tool].run_async(tool_context=ctx, args=call)
                    samples[(tool, mode)].append(time.perf_counter() - started)
                    if not answer.get("success"):
                        raise SystemExit(f"{tool} in {mode} failed: {answer}")
    finally:
        for skill_tools in skill_sets:
            await skill_tools.close()
        for runtime in runtimes.values():
            await runtime.close()

    print(f"{'series':<28}  {'median ms':>9}  {'p95 ms':>9}  {'vs host':>8}")
    rows = []
    for tool in calls:
        host_median, _ = summary_ms(samples[(tool, "host")])
        for mode in modes:
            median, p95 = summary_ms(samples[(tool, mode)])
            print(f"{tool + ' ' + mode:<28}  {median:9.2f}  {p95:9.2f}  {median / host_median:7.2f}x")
            rows.append([f"{tool} {mode}", f"{median:.2f}", f"{p95:.2f}", f"{median / host_median:.2f}x"])
    publish("file_tools", "File tools",
            f"{args.runs} calls of each series through the tool's `run_async`, interleaved; each workspace series "
            "against host mode's call of the same tool.\n\n"
            + markdown_table(["series", "median ms", "p95 ms", "vs host"], rows))


if __name__ == "__main__":
    asyncio.run(main())
