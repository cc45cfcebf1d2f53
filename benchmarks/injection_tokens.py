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

The agent round at scale is ``benchmarks/agent_loop.py``'s; the command line's start ``benchmarks/cli_start.py``'s.

Tokens are estimated as UTF-8 bytes / 4 (no tokenizer download is possible here; the ratios do not depend on the
divisor). Everything is produced by the real code paths: ``skill_instructions`` for the system text,
``DynamicSkillToolSet.get_tools`` for the selection, each tool's ``declaration()`` as sent to the model,
``SkillToolSet.skill_search`` for the search.

Usage: .venv/bin/python benchmarks/injection_tokens.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.figures import markdown_table, publish, summary_ms  # noqa: E402
from orchestrator.context import InvocationContext  # noqa: E402
from orchestrator.sessions import Session  # noqa: E402
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
from tests.synthetic_skills import labelled_requests, write_library  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
LIBRARY = REPO / "skills"
BYTES_PER_TOKEN = 4
SKILL_TOOLS = {"skill_load", "skill_select_docs", "skill_run"}
SCALE_TOOLS = SKILL_TOOLS | {"skill_search"}
SIZES = (50, 500, 2000)
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


PROMPT_ROWS: list[list[object]] = []
"""What :func:`row` printed, for the results page."""
SCALE_ROWS: list[list[object]] = []
"""What :func:`scale_row` printed, for the results page."""


def row(label: str, full: int, reduced: int) -> str:
    PROMPT_ROWS.append([label, full, reduced, f"{full / max(reduced, 1):.1f}x"])
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
    SCALE_ROWS.append([f"{size:,}", len(requests), sorted(sizes)[len(sizes) // 2], max(sizes), f"{index_ms:.1f}",
                       f"{build_median:.3f} / {build_p95:.3f}", f"{rank_median:.3f} / {rank_p95:.3f}",
                       f"{100 * found_overview / len(requests):.1f}%", f"{100 * found / len(requests):.1f}%"])
    return (f"{size:>6} {len(requests):>5} {sorted(sizes)[len(sizes) // 2]:>8} {max(sizes):>6} {index_ms:>9.1f} "
            f"{build_median:>7.3f} {build_p95:>7.3f} {rank_median:>7.3f} {rank_p95:>7.3f} "
            f"{100 * found_overview / len(requests):>7.1f}% {100 * found / len(requests):>7.1f}%")


def scale() -> None:
    print()
    print(f"{'skills':>6} {'reqs':>5} {'tok/req':>8} {'max':>6} {'index ms':>9} {'build':>7} {'p95':>7} "
          f"{'rank':>7} {'p95':>7} {'in ovw':>8} {'+search':>8}")
    roots = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in SIZES:
            roots[size] = Path(tmp) / f"lib{size}"
            roots[size].mkdir()
            write_library(roots[size], size)
        for size in SIZES:
            print(scale_row(size, roots[size]))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
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
    scale()
    publish("injection_tokens", "Skill injection: prompt tokens",
            "Estimated tokens (UTF-8 bytes / 4); the baseline is everything inlined.\n\n"
            + markdown_table(["prompt part", "everything", "tiered", "ratio"], PROMPT_ROWS)
            + "\n\nThe bounded overview at team scale (default `SkillOptions`; times in ms):\n\n"
            + markdown_table(["skills", "requests", "overview tokens per request (median)", "max", "index ms",
                              "build (median / p95)", "ranking (median / p95)", "right skill in the overview",
                              "… or in one `skill_search`"], SCALE_ROWS))


if __name__ == "__main__":
    asyncio.run(main())
