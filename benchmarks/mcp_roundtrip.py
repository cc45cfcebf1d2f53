"""What Skillrun's MCP server adds to a run: ``skill_run`` of ``echo hi`` through MCP against the same run through the
Python API, in a warm workspace each.

* direct       ``dispatcher.run(RunRequest(...))`` in this process (the embedded default's dispatcher and local
               runtime, as ``skillrun mcp`` builds them)
* mcp stdio    ``call_tool("skill_run")`` with the ``mcp`` SDK's client to ``skillrun mcp`` (a child process)
* mcp http     the same to ``skillrun serve``'s ``/mcp`` (a child process; streamable HTTP on loopback, a team key)

and, to show where the time goes, the floors under them: an MCP ``ping`` over each transport (the SDK's client and
server, no tool), and a bare ``GET /healthz`` of the same API server (its HTTP stack alone).

The three are interleaved, each going first in turn, so a noisy machine slows them alike, with a pause after each
call for the housekeeping a run leaves (in this process and the servers'). Both servers run the
command on the same local runtime, sandbox included, as the direct call does; what differs is the transport, the
protocol and the server's tool layer. Target: at most 3 ms over the direct call.

Usage: .venv/bin/python benchmarks/mcp_roundtrip.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.figures import markdown_table, publish, scratch_dir, summary_ms  # noqa: E402
from orchestrator.config import Settings  # noqa: E402
from orchestrator.dispatch import dispatcher_for  # noqa: E402
from tests.services import free_port  # noqa: E402
from worker.contract import RunRequest, SkillRef  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
LIBRARY = REPO / "skills"
SKILL = "python-math"
COMMAND = "echo hi"
TARGET_MS = 3.0
PAUSE_SECONDS = 0.01


def skillrun(*args: str, env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], env=env, cwd=REPO, check=True,
                          capture_output=True, text=True).stdout


@contextlib.asynccontextmanager
async def stdio_session(env: dict[str, str]) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "orchestrator.cli", "mcp"], env=env, cwd=str(REPO))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def http_session(env: dict[str, str]) -> AsyncIterator[tuple[ClientSession, Callable[[], Awaitable[None]]]]:
    skillrun("teams", "create", "bench", env=env)
    key = json.loads(skillrun("keys", "create", "bench", "--json", env=env))["key"]
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "serve", "--port", str(port)], env=env,
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"skillrun serve did not start on port {port}")
            await asyncio.sleep(0.1)
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as client, \
                streamable_http_client(f"{url}/mcp", http_client=client) as (read, write, _), \
                ClientSession(read, write) as session:
            await session.initialize()

            async def healthz() -> None:
                (await client.get(f"{url}/healthz")).raise_for_status()

            yield session, healthz
    finally:
        server.terminate()
        server.wait(timeout=30)


def mcp_ping(session: ClientSession) -> Callable[[], Awaitable[None]]:
    async def ping() -> None:
        await session.send_ping()
    return ping


def mcp_run(session: ClientSession) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        result = await session.call_tool("skill_run", {"skill": SKILL, "command": COMMAND})
        if result.isError or result.structuredContent["stdout"] != "hi\n":
            raise SystemExit(f"an MCP run failed: {result.content[0].text[:300]}")
    return run


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()

    scratch = scratch_dir("skillrun-bench-mcp-")
    env = {**os.environ, "SKILLRUN_WORK_ROOT": str(scratch / "work"), "SKILLRUN_DATA_DIR": str(scratch / "data"),
           "SKILLS_ROOT": str(LIBRARY), "PYTHONPATH": str(REPO)}
    (scratch / "work").mkdir(mode=0o755)
    dispatcher, _ = dispatcher_for(Settings(work_root=scratch / "work", data_dir=scratch / "data"))
    ref = SkillRef(name=SKILL, root=str(LIBRARY), path=SKILL)
    local = dispatcher.runtime("local")

    async def direct() -> None:
        result = await dispatcher.run(RunRequest(skill=ref, command=COMMAND, workspace_id="bench-direct"), owner="bench")
        if result.stdout != "hi\n":
            raise SystemExit(f"a direct run failed: {result.stderr[:300]}")

    try:
        async with stdio_session(env) as over_stdio, http_session(env) as (over_http, healthz):
            series: dict[str, Callable[[], Awaitable[None]]] = {
                "direct": direct, "mcp stdio": mcp_run(over_stdio), "mcp http": mcp_run(over_http),
                "stdio ping": mcp_ping(over_stdio), "http ping": mcp_ping(over_http), "GET /healthz": healthz,
            }
            samples: dict[str, list[float]] = {name: [] for name in series}
            for run in series.values():  # warm each workspace (staging, the ready shell)
                await run()
            names = list(series)
            for i in range(args.runs):
                for name in names[i % len(names):] + names[:i % len(names)]:
                    began = time.perf_counter()
                    await series[name]()
                    samples[name].append(time.perf_counter() - began)
                    # Between two calls a model is thinking: housekeeping after a run (the next ready shell, the
                    # next spare run folder) ends before the next measurement, in this process and the servers'.
                    await local.idle()
                    await asyncio.sleep(PAUSE_SECONDS)
                if (i + 1) % 50 == 0:
                    print(f"  {i + 1}/{args.runs} rounds", file=sys.stderr)
    finally:
        await dispatcher.close()

    base, _ = summary_ms(samples["direct"])
    print(f"skill_run of {COMMAND!r} in a warm workspace, {args.runs} runs each (interleaved), local runtime")
    print(f"{'series':<12} {'median ms':>10} {'p95 ms':>8} {'ratio':>7} {'added ms':>9}  target: <= {TARGET_MS:g} ms added")
    rows = []
    for name, values in samples.items():
        median, p95 = summary_ms(values)
        added = f"{median - base:>9.2f}" if name.startswith("mcp ") else f"{'':>9}"
        print(f"{name:<12} {median:>10.2f} {p95:>8.2f} {median / base:>7.2f} {added}")
        rows.append([name, f"{median:.2f}", f"{p95:.2f}", f"{median / base:.2f}", added.strip()])
    publish("mcp_roundtrip", "MCP round trip",
            f"`skill_run` of `{COMMAND}` in a warm workspace, {args.runs} runs of each series (interleaved), local "
            f"runtime. Target: at most {TARGET_MS:g} ms added to the direct call.\n\n"
            + markdown_table(["series", "median ms", "p95 ms", "ratio", "added ms"], rows))


if __name__ == "__main__":
    asyncio.run(main())
