"""Prompt tokens saved by three-tier injection and by dynamic tool selection, and the overview at team scale.

For the example library and for a synthetic library of 50 skills with 10 tools each, prints the prompt size of

* everything inlined (every SKILL.md body and doc) vs the overview tier (name + description per skill), and
* every tool declared vs the declarations DynamicSkillToolSet offers after one skill is loaded,

each as tokens and as a ratio. Then, for synthetic libraries of 50, 500 and 2,000 skills (``tests/synthetic_skills``)
and their labelled requests (each names a task one skill serves, mostly in other words than the skill's name), the
bounded overview with the default ``SkillOptions``:

* overview tokens per request (the whole skills block of the system message: overview and tool hints), median
  and largest;
* per-request time to build that block (ranking included; the index is built once per library version, timed
  apart as "index ms") and to rank and lay out the overview alone, median and p95 over the requests (each
  request's time is the median of five calls);
* recall: the labelled skill is in the overview (described or named), or on the first page of one
  ``skill_search`` whose query is the request's text.

Then ``skillrun skills list`` on the 2,000-skill library as a real process: the first listing (every ``SKILL.md``
parsed), a later one (the summaries kept between runs), one with ``--search``, and the bare import of the command's
module as the floor every command pays, median milliseconds of ``--rounds`` runs each.

Last, an agent round (one user message → ``skill_run`` of a skill's script → final answer) through ``LlmAgent``,
the real ``openai`` client and the scripted model server (``tests/model_server.py``), on a 4-skill and on a
2,000-skill library, side by side: median milliseconds per round and their ratio.

Tokens are estimated as UTF-8 bytes / 4 (no tokenizer download is possible here; the ratios do not depend on the
divisor). Everything is produced by the real code paths: ``skill_instructions`` for the system text,
``DynamicSkillToolSet.get_tools`` for the selection, each tool's ``declaration()`` as sent to the model,
``SkillToolSet.skill_search`` for the search.

Usage: .venv/bin/python benchmarks/injection_tokens.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.figures import scratch_dir, summary_ms  # noqa: E402
from orchestrator.agents import LlmAgent  # noqa: E402
from orchestrator.context import InvocationContext  # noqa: E402
from orchestrator.models import OpenAIModel  # noqa: E402
from orchestrator.runners import Runner  # noqa: E402
from orchestrator.sessions import InMemorySessionService, Session  # noqa: E402
from orchestrator.skills import (  # noqa: E402
    CachedSkillRepository,
    DynamicSkillToolSet,
    FsSkillRepository,
    SkillOptions,
    SkillToolSet,
    build_overview,
)
from orchestrator.skills.injection import skill_instructions  # noqa: E402
from orchestrator.skills.state import LOADED_PREFIX, TOOLS_PREFIX  # noqa: E402
from orchestrator.tools import BaseTool  # noqa: E402
from orchestrator.types import Content, Part  # noqa: E402
from tests.model_server import ScriptedModelServer  # noqa: E402
from tests.synthetic_skills import labelled_requests, write_library  # noqa: E402
from worker.runtimes.local import LocalWorkspaceRuntime  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
LIBRARY = REPO / "skills"
BYTES_PER_TOKEN = 4
SKILL_TOOLS = {"skill_load", "skill_select_docs", "skill_run"}
SCALE_TOOLS = SKILL_TOOLS | {"skill_search"}
SIZES = (50, 500, 2000)
ROUND_SIZES = (4, 2000)
REPEATS = 5  # timings per request; its median is the request's cost


def tokens(text: str) -> int:
    return -(-len(text.encode()) // BYTES_PER_TOKEN)


class SyntheticTool(BaseTool):
    def __init__(self, name: str) -> None:
        super().__init__(name=name, description=f"{name.replace('_', ' ')}: looks up records in the {name.split('_')[1]} service "
                                               "and returns them with their metadata, paging and error details.")

    def parameters_schema(self) -> dict:
        return {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for, in plain words."},
                "limit": {"type": "integer", "description": "How many records to return, 1-100."},
                "region": {"type": "string", "enum": ["eu", "us", "asia"], "description": "Where to look."},
            },
            "required": ["query"],
        }

    async def _run_async_impl(self, *, tool_context, args):
        return {}


def synthetic_library(root: Path, skills: int = 50, tools_per_skill: int = 10) -> list[SyntheticTool]:
    pool = []
    paragraph = ("This skill covers one business area end to end: when to use it, which commands to run, what each "
                 "output file means and how to recover from the usual failures. ") * 8
    for s in range(skills):
        names = [f"tool_s{s:02d}_{t}" for t in range(tools_per_skill)]
        pool += [SyntheticTool(n) for n in names]
        folder = root / f"skill-{s:02d}"
        folder.mkdir()
        tools = "\n".join(f"- {n}" for n in names)
        (folder / "SKILL.md").write_text(
            f"---\nname: skill-{s:02d}\ndescription: Tools and procedures for business area number {s}.\n---\n"
            f"Tools:\n{tools}\n\nOverview\n\n{paragraph}\n"
        )
        (folder / "REFERENCE.md").write_text(paragraph * 2)
    return pool


def inlined(repo: FsSkillRepository) -> str:
    parts = []
    for summary in repo.summaries():
        skill = repo.get(summary.name)
        parts.append(f"[Skill] {skill.name}: {skill.description}\n\n{skill.body}")
        parts += [f"[Doc] {skill.name}/{d.name}\n\n{d.content}" for d in skill.docs]
    return "\n\n".join(parts)


async def dynamic_selection(repo: FsSkillRepository, pool: list[BaseTool], skill: str) -> list[BaseTool]:
    toolset = DynamicSkillToolSet(skill_repository=repo, available_tools=pool)
    state = {LOADED_PREFIX + skill: "1", TOOLS_PREFIX + skill: json.dumps(repo.get(skill).tools)}
    ctx = InvocationContext(session=Session(app_name="bench", user_id="u"), agent=None, temp_state=state)
    return await toolset.get_tools(ctx)


def declarations(tools: list[BaseTool]) -> str:
    return json.dumps([{"type": "function", "function": t.declaration()} for t in tools])


def row(label: str, full: int, reduced: int) -> str:
    return f"{label:<46} {full:>10} {reduced:>10} {full / max(reduced, 1):>8.1f}x"


def timed(call, repeats: int = REPEATS) -> float:
    """Seconds one call takes: the median of ``repeats`` calls, so a preempted call on a busy machine does not
    count as the request's cost."""
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return sorted(samples)[len(samples) // 2]


def scale_row(size: int, root: Path) -> str:
    """Overview tokens, build and rank times, and recall for the ``size``-skill library under ``root``."""
    repo = CachedSkillRepository(root)
    options = SkillOptions()
    repo.summaries()  # the scan (parsing every SKILL.md) is the repository's, once per version
    started = time.perf_counter()
    repo.index()
    index_ms = (time.perf_counter() - started) * 1000
    toolset = SkillToolSet(repo)
    ctx = InvocationContext(session=Session(app_name="bench", user_id="u"), agent=None)
    requests = labelled_requests(size)
    sizes, builds, ranks, found_overview, found = [], [], [], 0, 0
    for request in requests:
        text = skill_instructions(repo, {}, SCALE_TOOLS, request.text, options)
        builds.append(timed(lambda: skill_instructions(repo, {}, SCALE_TOOLS, request.text, options)))
        overview = build_overview(repo.index(), options, request.text)
        ranks.append(timed(lambda: build_overview(repo.index(), options, request.text)))
        sizes.append(tokens(text))
        in_overview = request.skill in overview.described or request.skill in overview.named
        found_overview += in_overview
        if not in_overview and overview.cut:
            page = toolset.skill_search(request.text, ctx)["skills"]
            in_overview = any(hit["name"] == request.skill for hit in page)
        found += in_overview
    build_median, build_p95 = summary_ms(builds)
    rank_median, rank_p95 = summary_ms(ranks)
    return (f"{size:>6} {len(requests):>5} {sorted(sizes)[len(sizes) // 2]:>8} {max(sizes):>6} {index_ms:>9.1f} "
            f"{build_median:>7.3f} {build_p95:>7.3f} {rank_median:>7.3f} {rank_p95:>7.3f} "
            f"{100 * found_overview / len(requests):>7.1f}% {100 * found / len(requests):>7.1f}%")


async def agent_round_ms(root: Path, server: ScriptedModelServer, work_root: Path, rounds: int) -> float:
    """Median milliseconds of a round: user message → skill_run of the first skill's script → final answer."""
    runtime = LocalWorkspaceRuntime(work_root)
    repo = CachedSkillRepository(root, workspace_runtime=runtime)
    skill = repo.skill_list()[0]
    model = OpenAIModel(model_name="bench", api_key="bench", base_url=server.base_url)
    agent = LlmAgent(name="bench", model=model, tools=[SkillToolSet(repo)], skill_repository=repo)
    runner = Runner(app_name="bench", agent=agent, session_service=InMemorySessionService())
    samples = []
    for _ in range(rounds + 1):  # the first round builds the index and starts the workspace: not counted
        server.add(
            {"tool_calls": [{"name": "skill_run", "arguments": {"skill": skill, "command": "bash scripts/run.sh"}}]},
            {"text": "done"},
        )
        started = time.perf_counter()
        message = Content(parts=[Part.from_text(f"Please run {skill} on our files.")])
        async for event in runner.run_async(user_id="u", session_id="bench", new_message=message):
            if event.error_code:
                raise RuntimeError(event.error_message)
        samples.append(time.perf_counter() - started)
    await runner.close()
    await runtime.close()
    return summary_ms(samples[1:])[0]


def command_ms(args: list[str], env: dict[str, str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, *args], env=env, check=True, capture_output=True, cwd=REPO)
        samples.append(time.perf_counter() - started)
    return summary_ms(samples)[0]


def listing(root: Path, runs: int) -> None:
    """``skillrun skills list`` on ``root``: first, later, with --search; the bare import as the floor."""
    with tempfile.TemporaryDirectory() as data_dir:
        # Bytecode is cached (in the scratch folder), as for an installed package, even where the environment
        # turns it off: otherwise every process compiles the whole package and that is all one measures.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(SKILLRUN_DATA_DIR=data_dir, PYTHONPYCACHEPREFIX=os.path.join(data_dir, "pycache"))
        command_ms(["-c", "import orchestrator.cli.skills"], env, 1)  # compiles once
        command = ["-m", "orchestrator.cli", "skills", "list", "--json", "--skills-root", str(root)]
        first = command_ms(command, env, 1)
        later = command_ms(command, env, runs)
        search = command_ms([*command, "--search", "balance our invoices"], env, runs)
        floor = command_ms(["-c", "import orchestrator.cli.skills"], env, runs)
    print(f"skills list, 2,000 skills (median ms): first {first:.0f}, later {later:.0f}, --search {search:.0f}; "
          f"import alone {floor:.0f}, so the listing's own work is {later - floor:.0f} (--search {search - floor:.0f})")


async def scale(rounds: int) -> None:
    print()
    print(f"{'skills':>6} {'reqs':>5} {'tok/req':>8} {'max':>6} {'index ms':>9} {'build':>7} {'p95':>7} "
          f"{'rank':>7} {'p95':>7} {'in ovw':>8} {'+search':>8}")
    roots = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sorted(set(SIZES) | set(ROUND_SIZES)):
            roots[size] = Path(tmp) / f"lib{size}"
            roots[size].mkdir()
            write_library(roots[size], size)
        for size in SIZES:
            print(scale_row(size, roots[size]))
        print()
        listing(roots[2000], max(3, rounds // 3))
        server = ScriptedModelServer().start()
        work_root = scratch_dir("bench-rounds-")
        try:
            small, large = [await agent_round_ms(roots[n], server, work_root, rounds) for n in ROUND_SIZES]
        finally:
            server.stop()
            shutil.rmtree(work_root, ignore_errors=True)
        print()
        print(f"agent round (median ms): {ROUND_SIZES[0]} skills {small:.1f}, {ROUND_SIZES[1]:,} skills {large:.1f}, "
              f"ratio {large / small:.2f}x")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="agent rounds per library (default 15)")
    args = parser.parse_args()
    print(f"{'prompt part (estimated tokens)':<46} {'all':>10} {'tiered':>10} {'ratio':>9}")
    example = FsSkillRepository(LIBRARY)
    print(row(f"example library ({len(example.summaries())} skills): bodies+docs vs overview",
              tokens(inlined(example)), tokens(skill_instructions(example, {}, SKILL_TOOLS))))
    with tempfile.TemporaryDirectory() as tmp:
        pool = synthetic_library(Path(tmp))
        synthetic = FsSkillRepository(tmp)
        print(row("synthetic 50x10: bodies+docs vs overview",
                  tokens(inlined(synthetic)), tokens(skill_instructions(synthetic, {}, SKILL_TOOLS))))
        chosen = await dynamic_selection(synthetic, pool, "skill-07")
        print(row(f"synthetic 50x10: {len(pool)} tools vs {len(chosen)} after one load",
                  tokens(declarations(pool)), tokens(declarations(chosen))))
    await scale(args.rounds)


if __name__ == "__main__":
    asyncio.run(main())
