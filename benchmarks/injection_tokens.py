"""Prompt tokens saved by three-tier injection and by dynamic tool selection.

For the example library and for a synthetic library of 50 skills with 10 tools each, prints the prompt size of

* everything inlined (every SKILL.md body and doc) vs the overview tier (name + description per skill), and
* every tool declared vs the declarations DynamicSkillToolSet offers after one skill is loaded,

each as tokens and as a ratio. Tokens are estimated as UTF-8 bytes / 4 (no tokenizer download is possible
here; the ratios do not depend on the divisor). Everything is produced by the real code paths:
``skill_instructions`` for the system text, ``DynamicSkillToolSet.get_tools`` for the selection, and each
tool's ``declaration()`` as sent to the model.

Usage: .venv/bin/python benchmarks/injection_tokens.py
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.context import InvocationContext  # noqa: E402
from orchestrator.sessions import Session  # noqa: E402
from orchestrator.skills import DynamicSkillToolSet, FsSkillRepository  # noqa: E402
from orchestrator.skills.injection import LOADED_PREFIX, TOOLS_PREFIX, skill_instructions  # noqa: E402
from orchestrator.tools import BaseTool  # noqa: E402

LIBRARY = Path(__file__).resolve().parent.parent / "skills"
BYTES_PER_TOKEN = 4
SKILL_TOOLS = {"skill_load", "skill_select_docs", "skill_run"}


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


async def main() -> None:
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


if __name__ == "__main__":
    asyncio.run(main())
