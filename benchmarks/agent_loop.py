"""An agent built the guide's way, on libraries of 1, 500 and 2,000 skills: what a round costs as the library grows.

The agent is what the skills guide shows: ``create_default_skill_repository(root, workspace_runtime=...)`` (and
again with ``use_cached_repository=True``), a ``SkillToolSet(repository=...)``, an ``LlmAgent`` with
``skill_repository`` on ``OpenAIModel``, driven by a ``Runner`` over an in-memory session, against the scripted
model server (``tests/model_server.py``) on loopback. A session's first message loads a skill (``skill_load``, then
an answer); each later round is one user message, a ``skill_run`` of ``echo hi``, and a final answer.

Printed per library size and repository: the median milliseconds of a round, the median of the agent's own
time between the round's two model requests (from the end of the reply asking for ``skill_run`` to the arrival of
the next request: the tool call, its run and the next request's preparation), and the round's ratio to the round
on the first size with the same repository. Each configuration runs in a fresh process.

Usage: .venv/bin/python benchmarks/agent_loop.py [--rounds N] [--sizes 1,500,2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.figures import markdown_table, publish  # noqa: E402
from orchestrator.agents import LlmAgent  # noqa: E402
from orchestrator.code_executors import create_local_workspace_runtime  # noqa: E402
from orchestrator.models import OpenAIModel  # noqa: E402
from orchestrator.runners import Runner  # noqa: E402
from orchestrator.sessions import InMemorySessionService  # noqa: E402
from orchestrator.skills import SkillToolSet, create_default_skill_repository  # noqa: E402
from orchestrator.types import Content, Part  # noqa: E402
from tests.model_server import ScriptedModelServer  # noqa: E402
from tests.synthetic_skills import write_library  # noqa: E402

REPOSITORIES = ("default", "cached")
WARM_ROUNDS = 1  # rounds after the load that are not counted (the workspace is made in the first)


def reply(body: dict) -> dict:
    """The scripted model: load the skill a user message names, run ``echo hi`` for a round, answer after a tool."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return {"text": "done"}
    text = last["content"] if isinstance(last["content"], str) else last["content"][0]["text"]
    verb, skill = text.split()[:2]
    if verb == "load":
        return {"tool_calls": [{"name": "skill_load", "arguments": {"skill_name": skill}}]}
    return {"tool_calls": [{"name": "skill_run", "arguments": {"skill": skill, "command": "echo hi"}}]}


async def child(root: str, repository: str, base_url: str, skill: str, rounds: int) -> list[float]:
    """In a process of its own: the load, then ``rounds`` timed rounds; seconds per round."""
    runtime = create_local_workspace_runtime()
    repo = create_default_skill_repository(root, workspace_runtime=runtime, use_cached_repository=repository == "cached")
    model = OpenAIModel(model_name="bench", api_key="bench", base_url=base_url)
    agent = LlmAgent(name="bench", model=model, instruction="Use the skills.",
                     tools=[SkillToolSet(repository=repo)], skill_repository=repo)
    sessions = InMemorySessionService()
    await sessions.create_session(app_name="bench", user_id="u", session_id="bench")
    runner = Runner(app_name="bench", agent=agent, session_service=sessions)
    samples = []
    for n in range(rounds + 1):
        message = Content(role="user", parts=[Part.from_text(text=f"{'load' if n == 0 else 'run'} {skill} please")])
        started = time.perf_counter()
        async for event in runner.run_async(user_id="u", session_id="bench", new_message=message):
            if event.error_code:
                raise RuntimeError(f"{event.error_code}: {event.error_message}")
        samples.append(time.perf_counter() - started)
    await runner.close()
    await runtime.close()
    return samples[1:]


def measure(root: Path, skill: str, repository: str, rounds: int) -> tuple[float, float]:
    """Median ms per round and of the agent's own time inside a round, for one configuration in a fresh process."""
    server = ScriptedModelServer().start()
    server.add(*[reply] * (2 * (rounds + 2)))
    try:
        with tempfile.TemporaryDirectory() as data_dir:
            env = {**os.environ, "SKILLRUN_DATA_DIR": data_dir}
            done = subprocess.run(
                [sys.executable, __file__, "--child", str(root), repository, server.base_url, skill, str(rounds)],
                env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{repository} repository on {root.name} failed:\n{done.stderr[-3000:]}")
        samples = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        server.stop()
    timings = server.timings[2:]  # the load's two requests
    gaps = [timings[i + 1][0] - timings[i][1] for i in range(0, len(timings) - 1, 2)]
    return statistics.median(samples[WARM_ROUNDS:]) * 1000, statistics.median(gaps[WARM_ROUNDS:]) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds per process (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="processes per configuration, interleaved (default 3)")
    parser.add_argument("--sizes", default="1,500,2000", help="library sizes, the first the baseline (default 1,500,2000)")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    samples: dict[tuple[int, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        libraries = {}
        for size in sizes:
            root = Path(tmp) / f"lib{size}"
            root.mkdir()
            libraries[size] = root, write_library(root, size)[0]
        for repeat in range(args.repeats):  # every configuration once per pass: a noisy spell slows them alike
            for size in sizes:
                for repository in REPOSITORIES:
                    samples.setdefault((size, repository), []).append(measure(*libraries[size], repository, args.rounds))
            print(f"pass {repeat + 1} of {args.repeats} done", file=sys.stderr, flush=True)
    print(f"{'skills':>6} {'repository':<10} {'round ms':>9} {'agent ms':>9} {'vs first':>9}")
    rows = []
    for (size, repository), runs in samples.items():
        round_ms, agent_ms = (statistics.median(values) for values in zip(*runs))
        base = statistics.median(r for r, _ in samples[sizes[0], repository])
        print(f"{size:>6} {repository:<10} {round_ms:>9.1f} {agent_ms:>9.1f} {round_ms / base:>8.2f}x")
        rows.append([f"{size:,}", repository, f"{round_ms:.1f}", f"{agent_ms:.1f}", f"{round_ms / base:.2f}x"])
    print(f"medians of {args.repeats} processes of {args.rounds} rounds; vs first: the round against the round on "
          f"{sizes[0]} skill(s) with the same repository; agent ms: the agent's own time between a round's two model "
          "requests (the skill_run call included)")
    publish("agent_loop", "An agent at scale",
            f"Medians of {args.repeats} processes of {args.rounds} rounds. *vs first*: the round against the round on "
            f"{sizes[0]} skill(s) with the same repository; *agent ms*: the agent's own time between a round's two "
            "model requests (the `skill_run` call included).\n\n"
            + markdown_table(["skills", "repository", "round ms", "agent ms", "vs first"], rows))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        root, repository, base_url, skill, rounds = sys.argv[2:]
        print(json.dumps(asyncio.run(child(root, repository, base_url, skill, int(rounds)))))
    else:
        main()
