"""``skillrun chat``: the skill assistant in the terminal, streaming its answer and its tool calls."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid

from orchestrator.assistant import create_assistant, create_session_service
from orchestrator.cli import UsageError
from orchestrator.cli.common import repository
from orchestrator.cli.output import clip, json_text, write
from orchestrator.code_executors import create_local_workspace_runtime
from orchestrator.config import get_settings
from orchestrator.dispatch import InlineDispatcher
from orchestrator.events import Event
from orchestrator.runners import Runner
from orchestrator.types import Content, Part


def chat(args: argparse.Namespace) -> int:
    settings = get_settings()
    if not (settings.openai_api_key or settings.openai_base_url):
        raise UsageError(
            "no model configured: set OPENAI_API_KEY (and OPENAI_BASE_URL for another endpoint) and SKILLRUN_MODEL, "
            "in the environment or in a .env file"
        )
    repo = repository(args)
    dispatcher = InlineDispatcher({"local": create_local_workspace_runtime(args.work_root or settings.work_root)})
    agent = create_assistant(settings, repo, dispatcher)
    runner = Runner(app_name=settings.app_name, agent=agent, session_service=create_session_service(settings))
    session_id = args.session or uuid.uuid4().hex[:12]
    failed = asyncio.run(_converse(runner, dispatcher, session_id, args.message, as_json=args.json))
    if not args.json:
        print(f"\n── session {session_id} (continue with --session {session_id})", file=sys.stderr)
    return 1 if failed else 0


async def _converse(runner: Runner, dispatcher: InlineDispatcher, session_id: str, text: str, *, as_json: bool) -> bool:
    failed = False
    try:
        async for event in runner.run_async(
            user_id="cli", session_id=session_id, new_message=Content(parts=[Part.from_text(text)])
        ):
            if as_json:
                print(json_text(event.model_dump_json()), flush=True)
            elif event.error_message:
                write(sys.stderr, f"\nerror: {event.error_message}\n")
            elif event.partial and event.content is not None:
                for part in event.content.parts:
                    if part.text and not part.thought:
                        write(sys.stdout, part.text)
                        sys.stdout.flush()
            elif event.content is not None:
                _print_tool_parts(event)
            failed = failed or bool(event.error_message)
    finally:
        await runner.close()
        await runner.session_service.close()
        await dispatcher.close()
    return failed


def _print_tool_parts(event: Event) -> None:
    """Each tool call and result on a line (a run's output in them escaped on a terminal, as everywhere)."""
    for part in event.content.parts:
        if part.function_call:
            args = json.dumps(part.function_call.args, ensure_ascii=False)
            write(sys.stdout, f"\n→ {part.function_call.name}({clip(args)})\n")
        elif part.function_response:
            result = json.dumps(part.function_response.response, ensure_ascii=False)
            write(sys.stdout, f"← {part.function_response.name}: {clip(result)}\n")
        sys.stdout.flush()
